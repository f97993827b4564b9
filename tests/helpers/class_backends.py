"""Classes the self-tests run as class backends (``--backends v1=tests.helpers.class_backends:CountingBuffer``):
DeepEP-shaped buffers of "someone else's" (a fork, a vendor build), one faithful and one with a planted defect."""

from __future__ import annotations

import os
import time
from typing import Any

from deep_ep import Buffer, ElasticBuffer  # the deep_ep the ranks resolve (--deep-ep emulation here)


class CountingBuffer(Buffer):
    """``deep_ep.Buffer`` that counts its dispatches: a faithful fork."""

    dispatches = 0

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        type(self).dispatches += 1
        return super().dispatch(*args, **kwargs)


class CountingElasticBuffer(ElasticBuffer):
    """``deep_ep.ElasticBuffer`` that counts its dispatches: a faithful fork."""

    dispatches = 0

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        type(self).dispatches += 1
        return super().dispatch(*args, **kwargs)


class BitFlippingElasticBuffer(ElasticBuffer):
    """A fork whose dispatch flips the lowest bit of the first received element: P1 must fail it, and it alone."""

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        recv_x, *rest = super().dispatch(*args, **kwargs)
        if kwargs.get("handle") is None and not isinstance(recv_x, tuple) and recv_x.numel():
            recv_x.view(-1).view(dtype=__import__("torch").int16)[0] ^= 1
        return (recv_x, *rest)



class TopkIdxFilledElasticBuffer(ElasticBuffer):
    """A fork with DeepEP's own fix of the uninitialised ``recv_topk_idx`` tail (PR #739): a ``do_cpu_sync=False``
    dispatch fills the rows past the valid count with -1 (P26 holds on it where the library has the known defect)."""

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        result = super().dispatch(*args, **kwargs)
        if kwargs.get("do_cpu_sync") is False and kwargs.get("handle") is None and isinstance(result, tuple):
            recv_idx, handle = result[1], result[3]
            if recv_idx is not None:
                recv_idx[int(handle.psum_num_recv_tokens_per_scaleup_rank[-1]):] = -1
        return result


not_a_class = "a string"


class SharedGpuHangingElasticBuffer(ElasticBuffer):
    """``ElasticBuffer`` whose constructor never returns with ``num_cpu_bytes > 0`` where the ranks share one GPU
    (``CONFORMANCE_RANK_SETUP=shared``), as the real V2 of DeepEP 2.1.0 did there (docs/real-runs/2026-12-04-1xH200,
    runs 16 and 18; the set-up limit shared-gpu-v2-cpu-bytes): the real library's set-up limit, on a CPU.  The
    self-tests run it flagged as the real library's own class (``BackendSpec.library``), so the set-up limits apply;
    it declares ``bad_input`` (P12's bad calls), which a class backend is held to only when it declares it."""

    conformance_capabilities = frozenset({"combine", "combine_weights", "combine_bias", "expert_alignment",
                                          "cached_dispatch", "autograd", "events", "layout", "expand", "deterministic",
                                          "qp_cap", "bad_input", "lifecycle"})

    def __init__(self, group: Any, *args: Any, **kwargs: Any) -> None:
        # (num_bytes left out: the library's Python assert comes first, deep_ep/buffers/elastic.py:286)
        if (kwargs.get("num_cpu_bytes") or 0) > 0 and kwargs.get("num_bytes") is not None and \
                os.environ.get("CONFORMANCE_RANK_SETUP") == "shared":
            while True:  # as the real constructor: it never returns (stopped by the example timeout)
                time.sleep(3600)
        super().__init__(group, *args, **kwargs)


class SharedGpuHangingFork(SharedGpuHangingElasticBuffer):
    """The same hang in a class that is not the real library's (a fork): no set-up limit applies, so its calls hang,
    and the harness must charge the hang to it alone (``harness.faults.HungBackend``)."""


class DispatchHangingFork(ElasticBuffer):
    """A fork whose ``dispatch`` never returns where the ranks share one GPU: a hang in the middle of a P30 call
    sequence, which must end that sequence, fail this backend alone and leave it out of the next sequences."""

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        while os.environ.get("CONFORMANCE_RANK_SETUP") == "shared":
            time.sleep(3600)
        return super().dispatch(*args, **kwargs)
