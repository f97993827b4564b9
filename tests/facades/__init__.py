"""V1-compatible facades over V2, written for the self-tests (issue 35): ``Buffer``-shaped classes that call
``ElasticBuffer`` inside, as integrators publish them so that old MoE code keeps working.  They are the suite's own
test input, written from DeepEP's documented API (never copied from a published shim):

- :mod:`tests.facades.faithful`: a faithful facade (``ElasticBackedBuffer``), and a wrapper of an already built
  ``ElasticBuffer`` that forwards the rest through ``__getattr__`` (``ForwardingBuffer``, constructed by the one-line
  adapter ``ForwardingBufferOnGroup``);
- :mod:`tests.facades.defective`: the faithful facade with one planted defect each (a discarded ``num_experts``,
  ``None`` per-expert counts, a second ``destroy()`` that succeeds, a use after destroy that raises the wrong
  thing, and V1's ``explicitly_destroy=False`` handed to V2 as is: V2's known exit defect passed on).

They import ``deep_ep`` as the ranks resolve it (``--deep-ep emulation`` in the self-tests: the emulated V2).
"""

#: What :class:`tests.facades.faithful.ElasticBackedBuffer` (and the defective facades, its subclasses) declare they
#: implement (``conformance_capabilities``): here, so that a self-test reads it without importing ``deep_ep``.
DECLARED = frozenset({"combine", "combine_weights", "combine_bias", "expert_alignment", "cached_dispatch", "autograd",
                      "events", "layout", "fp8", "fresh_groups", "lifecycle"})
