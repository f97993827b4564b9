"""Backends (rank side): one adapter per DeepEP API, given a deep_ep-like module (the real one or the emulation).

The same adapter code drives the real library on GPUs and :mod:`conformance.emulation` in CPU CI; the
contract both implement is :class:`conformance.backends.contract.Backend`.
"""
