"""Plug-in backends for downstream integrators' own code (rank side), e.g. Megatron-Core's ``fused_a2a``.

Each module here wraps code this project did not write, through its public functions only, as a
:class:`conformance.backends.plugins.PluginBackend`.  They import the integrator's package in the rank
processes only (after ``--deep-ep`` resolved ``deep_ep`` there), never in the controller.
"""

#: What Megatron-Core's ``fused_a2a`` backends declare (``conformance.integrations.megatron``), readable without
#: Megatron installed (the generated docs, the self-tests' expectations): ``fused_dispatch`` / ``fused_combine``,
#: a cached dispatch only as ``fused_combine``'s backward, their autograd, ``async_finish`` with its event.
MEGATRON_CAPABILITIES = frozenset({"combine", "cached_dispatch", "autograd", "events"})
