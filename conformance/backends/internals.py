"""The one seam through which the suite reads a library's internals: what DeepEP's public API does not say, read
from the built-in backends only (``real-*``, ``emulated-*``: the real library and its model, whose internals the
suite knows from the source).

What is read here, and what the suite does instead for every other backend (a class backend ``v1=pkg.mod:Class``,
a plug-in), from public results alone:

- V1 intranode handles: where each received row came from (``rank_prefix_matrix``, ``recv_src_idx``); elsewhere a
  cached dispatch of identity rows through the handle says it (:mod:`conformance.backends.identity`);
- V1 handles: the channel count of the dispatch (its channel prefix matrix); elsewhere not reported;
- V1's C++ runtime: the RDMA rank count (internode or not, the library's reduction tree, the config tables' rank
  count); elsewhere the world shape the suite built (nodes), and no reduction tree (the error bound only);
- V1 low-latency handles (``src_info``, ``layout_range``) and the graph step's handle tensors: built-ins only (the
  capabilities that need them are not offered to class backends, ``core.spec.CLASS_UNAVAILABLE``).

:func:`internals` hands the seam to a built-in backend and refuses every other one with a
:class:`~conformance.core.raisers.SuiteError` (the suite's own mistake: a verdict on a class backend must rest on
its public API).  ``tests/nocover/test_public_api.py`` checks that a class backend's path never gets here.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.core.raisers import SuiteError
from conformance.core.spec import IMPLS, BackendSpec


class LibraryInternals:
    """Reads of the real library's (and the emulation's) internals, for one built-in backend."""

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec

    # ------------------------------------------------------------------------------------------------ V1
    @staticmethod
    def v1_num_rdma_ranks(buffer: Any) -> int:
        """``buffer.runtime.get_num_rdma_ranks()``: V1's internode path is taken when it is above 1."""
        return int(buffer.runtime.get_num_rdma_ranks())

    @staticmethod
    def v1_is_intranode_handle(handle: Any) -> bool:
        """Whether ``handle`` is V1's intranode handle (six entries: rank_prefix_matrix, channel_prefix_matrix,
        recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head)."""
        return len(handle) == 6

    @staticmethod
    def v1_sources(handle: Any, rank: int, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src_rank, src_token)`` of every row an intranode dispatch delivered to ``rank`` (its handle's rank prefix
        matrix column and ``recv_src_idx``; ``rows``: keep that many source tokens)."""
        prefix = handle[0][:, rank].to(torch.int64).cpu()
        per_src = torch.diff(prefix, prepend=prefix.new_zeros(1))
        src_rank = torch.repeat_interleave(torch.arange(per_src.numel()), per_src)
        src_token = handle[3].to(torch.int64).cpu()
        return src_rank, src_token if rows is None else src_token[:rows]

    @staticmethod
    def v1_num_channels(handle: Any) -> int:
        """The dispatch's channel count: one column of its channel prefix matrix per channel (``config.num_sms //
        2``)."""
        return int((handle[2] if len(handle) == 6 else handle[1]).shape[1])

    @staticmethod
    def v1_ll_layout(handle: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """A low-latency handle's ``(src_info, layout_range)``."""
        return handle[0], handle[1]

    @staticmethod
    def v1_graph_fields(handle: Any) -> dict[str, torch.Tensor]:
        """An intranode handle's tensors a CUDA-graph replay rewrites (``rank_prefix_matrix``, ``recv_src_idx``)."""
        return {"rank_prefix_matrix": handle[0], "recv_src_idx": handle[3]}


def internals(spec: BackendSpec) -> LibraryInternals:
    """The seam for ``spec``: a built-in backend's; any other backend's is a :class:`SuiteError`."""
    if spec.impl not in IMPLS:
        raise SuiteError(f"the suite reached the library's internals for {spec.name}, which is judged through its "
                         f"public API only (conformance/backends/internals.py)")
    return LibraryInternals(spec)


def has_internals(spec: BackendSpec) -> bool:
    """Whether ``spec``'s internals may be read (a built-in backend)."""
    return spec.impl in IMPLS
