"""deepep-conformance: a property-based conformance suite for DeepEP's MoE dispatch/combine.

The house (docs/architecture.md has the tour), from the controller's side down to the ranks':

- :mod:`conformance.plugin`: the pytest entry point; :mod:`conformance.harness`: a selected run (set-up checks,
  the session that owns the rank world, the property driver, the crash/hang budget).
- :mod:`conformance.properties`: one module per contract item (P1-P14), each with its registry entry;
  :mod:`conformance.strategies`: the Hypothesis draws; :mod:`conformance.oracle`: the expected results;
  :mod:`conformance.assertions` and :mod:`conformance.canonical`: comparing what ranks returned.
- :mod:`conformance.reporting`: the reports and the version gate; :mod:`conformance.mutation`: the kill matrix.
- :mod:`conformance.core`: plain data both sides share (examples, cases, views, backend names).
- Rank side: :mod:`conformance.world` (the process world), :mod:`conformance.tasks` (what ranks run),
  :mod:`conformance.backends` (adapters for ``Buffer`` / ``ElasticBuffer``), :mod:`conformance.mutants`.
- :mod:`conformance.emulation`: a pure-PyTorch model of the ``deep_ep`` API (DeepEP 2.1.0's; ``v2_5_0``: 2.5.0's).
- :mod:`conformance.versions`: DeepEP's versions as data (contract, refusal table, known defects, API snapshot,
  limits), one folder per version, read by all of the above.
"""

__version__ = "0.1.0"
#: The DeepEP version :mod:`conformance.emulation` models (its ``__version__``): here, so that the report and the
#: known-defects lookup read it without importing the emulation, which imports torch (seconds).
EMULATION_VERSION = "2.1.0+emulation"
