"""deepep-conformance: a property-based conformance suite for DeepEP's MoE dispatch/combine.

The pieces, each in its own module:
- :mod:`conformance.example`: the plain description of one example and the deterministic inputs built from it.
- :mod:`conformance.strategies`: Hypothesis strategies drawing examples (controller only).
- :mod:`conformance.oracle`: the independent, obviously-correct expected results.
- :mod:`conformance.world`: the persistent multi-process rank world (torchrun semantics).
- :mod:`conformance.backends`: adapters for ``deep_ep.Buffer`` / ``deep_ep.ElasticBuffer`` (real or emulated).
- :mod:`conformance.emulation`: a pure-PyTorch model of the ``deep_ep`` API.
- :mod:`conformance.checks`: one check per contract item (P1-P14), shared by tests and ``conformance.repro``.
- :mod:`conformance.plugin` / :mod:`conformance.reporting`: the pytest plugin and its reports.
"""

__version__ = "0.1.0"
