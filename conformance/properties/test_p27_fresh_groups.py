"""P27 fresh groups: a buffer built on a process group made just before it, with no collective run on it yet (as
vLLM, SGLang and Megatron build theirs: ``dist.new_group(...)`` right before the buffer), dispatches exactly the
oracle's rows, or is refused on every rank with one clear message; never a crash, a hang, or a refusal on some
ranks only.

Per backend (the built-in adapters of both APIs) and per way of making the group: ``new_group`` (the world's
default backend: gloo on CPU and where ranks share a GPU, NCCL with one GPU per rank), and on a GPU also
``new_group_nccl`` (a NCCL group, initialised lazily: its communicator does not exist until a collective runs) and
``new_group_gloo`` (a CPU group handed to the GPU library by mistake).  The buffer and the group are destroyed after
the dispatch.  What each way gave (works, or the refusal's message) is the report's artifact ``fresh groups``, per
backend: an integrator reads there which groups a DeepEP version accepts.  A crash of a rank (the process dies) is a
failure with its cause, as everywhere.  A refusal counts only when the backend raised it for a call the API allows,
and the same dispatch on the world's own group works (it is made first): a backend whose every dispatch raises fails
with what it raised, and an exception of the suite's own code is a suite error, never "one clear refusal".
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import assert_view_matches_oracle, per_supported_backend, refused_on_every_rank
from conformance.core.example import Example
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.fresh_groups import fresh_groups_examples
from conformance.tasks.fresh_groups import fresh_group_views

#: The report's artifact: backend -> way -> what it gave over the examples.
KEY = "fresh groups"


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """Per backend and way: every rank's dispatch holds the oracle's receipts, or every rank raised with a message."""
    __tracebackhide__ = True
    for backend, results in per_supported_backend(ctx, per_rank, example):
        for way in results[0]:
            got = [ranks[way] for ranks in results]
            call = f"{backend}: a buffer on a fresh dist.new_group ({way}), then dispatch"
            if refused_on_every_rank(got, call=call):
                ctx.record_seen(KEY, backend, way, f"refused: {got[0]}")
                continue
            for rank, view in enumerate(got):
                assert_view_matches_oracle(ctx, example, rank, view, after=f"building the buffer on a fresh {way}")
            ctx.record_seen(KEY, backend, way, "works: the oracle's rows")


PROPERTY = register(Property(
    id="P27-fresh-groups",
    title="a buffer built on a process group made just before (no collective run on it yet) dispatches the "
          "oracle's rows, or is refused on every rank with one clear message",
    strategy=sized(fresh_groups_examples), task=fresh_group_views, check=check,
    needs=("fresh_groups",),
))
test_fresh_groups = PROPERTY.test
