"""Plug-in backends for downstream integrators' own code (rank side), e.g. Megatron-Core's ``fused_a2a``.

Each module here wraps code this project did not write, through its public functions only, as a
:class:`conformance.backends.plugins.PluginBackend`.  They import the integrator's package in the rank
processes only (after ``--deep-ep`` resolved ``deep_ep`` there), never in the controller.
"""
