"""Mutants of the combine side (reduction, combined weights, cached dispatch, autograd wrappers, V1's explicit
configs) and of payload bytes (NaN canonicalisation, -0.0 flushing), each as narrow as the library or wrapper bug it
models."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from conformance.mutants.patching import rebinding, seam, through
from conformance.mutants.registry import register

#: bf16 bits of the canonical quiet NaN and of -0.0.
CANONICAL_NAN = 0x7FC0
NEGATIVE_ZERO = -0x8000  # 0x8000 as int16


def _nonempty(contributions: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    return [i for i, (tokens, _) in enumerate(contributions) if tokens.numel()]


@register("combine-drops-contributor", "harmful",
          "combine skips the last source rank that sent rows back (an off-by-one in the rank loop)")
def combine_drops_contributor() -> Iterator[None]:
    def patched(combine_reduce, num_tokens, hidden, contributions, bias, out_dtype, device):
        contributions = list(contributions)
        nonempty = _nonempty(contributions)
        if nonempty:
            del contributions[nonempty[-1]]
        return combine_reduce(num_tokens, hidden, contributions, bias, out_dtype, device)

    with seam("combine_reduce", patched):
        yield


@register("combine-counts-contributor-twice", "harmful",
          "combine adds the first source rank's rows twice (a rank index not advanced)")
def combine_counts_contributor_twice() -> Iterator[None]:
    def patched(combine_reduce, num_tokens, hidden, contributions, bias, out_dtype, device):
        contributions = list(contributions)
        nonempty = _nonempty(contributions)
        if nonempty:
            contributions.append(contributions[nonempty[0]])
        return combine_reduce(num_tokens, hidden, contributions, bias, out_dtype, device)

    with seam("combine_reduce", patched):
        yield


@register("combine-bias-twice", "harmful", "combine adds each bias tensor twice")
def combine_bias_twice() -> Iterator[None]:
    def patched(combine_reduce, num_tokens, hidden, contributions, bias, out_dtype, device):
        return combine_reduce(num_tokens, hidden, contributions, list(bias) * 2, out_dtype, device)

    with seam("combine_reduce", patched):
        yield


@register("combine-unreached-token-garbage", "harmful",
          "combine skips tokens no rank sent back, leaving their output rows uninitialised (NaN bits here)")
def combine_unreached_token_garbage() -> Iterator[None]:
    def patched(combine_reduce, num_tokens, hidden, contributions, bias, out_dtype, device):
        out = combine_reduce(num_tokens, hidden, contributions, bias, out_dtype, device)
        touched = torch.zeros(num_tokens, dtype=torch.bool, device=device)
        for tokens, _ in contributions:
            touched[tokens.to(torch.int64)] = True
        out[~touched] = float("nan")
        return out

    with seam("combine_reduce", patched):
        yield


@register("combined-weights-master-lane", "harmful",
          "V2 combine writes, for every slot, the weight of the first slot with the same owner rank "
          "(reads the master lane's slot instead of its own)")
def combined_weights_master_lane() -> Iterator[None]:
    from conformance.world.rank import context

    def patched(original, self, raw, x, topk_weights=None, bias=None, async_finish=False):
        combined_x, combined_w = original(self, raw, x, topk_weights, bias, async_finish)
        if combined_w is not None:
            handle = raw.handle
            idx = handle.topk_idx.to(torch.int64)
            owner = torch.where(idx >= 0, idx // (handle.num_experts // context().world_size), -1)
            first = torch.arange(idx.shape[1], device=idx.device).expand_as(idx).clone()
            for slot in range(idx.shape[1]):
                for earlier in reversed(range(slot)):  # the smallest matching slot is written last
                    first[owner[:, earlier] == owner[:, slot], slot] = earlier
            wrong = combined_w.gather(1, first)
            combined_w = wrong
        return combined_x, combined_w

    with seam("ElasticAdapter.combine", patched):
        yield


@register("cached-dispatch-stale", "harmful",
          "a cached dispatch returns the previous dispatch's payload instead of the new one")
def cached_dispatch_stale() -> Iterator[None]:
    def stale(original, self, raw, x):
        return raw.recv_x.clone()

    with seam("LegacyAdapter.cached_dispatch", stale), seam("ElasticAdapter.cached_dispatch", stale):
        yield


@register("gradient-sign-flipped", "harmful", "FusedDispatch.backward returns -combine(grad) for x")
def gradient_sign_flipped() -> Iterator[None]:
    def backward(original, ctx, grad_recv_x, grad_recv_weights):
        grad_x, *rest = original(ctx, grad_recv_x, grad_recv_weights)
        return (-grad_x, *rest)

    with seam("FusedDispatch.backward", backward):
        yield


@register("gradient-scale-wrong", "harmful",
          "FusedCombine.backward divides the gradient by the world size (averages over the EP group)")
def gradient_scale_wrong() -> Iterator[None]:
    from conformance.world.rank import context

    def backward(original, ctx, grad_combined):
        grad, *rest = original(ctx, grad_combined)
        return ((grad.float() / context().world_size).to(grad.dtype), *rest)

    with seam("FusedCombine.backward", backward):
        yield


def _rewrite_received_payload(rewrite) -> Iterator[None]:
    """Seam ``exchange``: received bf16 payloads pass through ``rewrite(bits)``."""

    def patched(gather_selected, *args, **kwargs):
        received = gather_selected(*args, **kwargs)
        x = received.fields.get("x")
        if x is not None and x.dtype == torch.bfloat16:
            received.fields["x"] = rewrite(x.contiguous().view(torch.int16).clone()).view(torch.bfloat16)
        return received

    with seam("exchange", patched):
        yield


@register("nan-canonicalised", "harmful",
          "dispatch moves payloads through float arithmetic: every NaN arrives as the canonical 0x7FC0")
def nan_canonicalised() -> Iterator[None]:
    def rewrite(bits: torch.Tensor) -> torch.Tensor:
        is_nan = ((bits & 0x7F80) == 0x7F80) & ((bits & 0x007F) != 0)
        return torch.where(is_nan, torch.full_like(bits, CANONICAL_NAN), bits)

    yield from _rewrite_received_payload(rewrite)


@register("negative-zero-flushed", "harmful", "dispatch adds +0.0 to the payload: -0.0 arrives as +0.0")
def negative_zero_flushed() -> Iterator[None]:
    def rewrite(bits: torch.Tensor) -> torch.Tensor:
        return torch.where(bits == NEGATIVE_ZERO, torch.zeros_like(bits), bits)

    yield from _rewrite_received_payload(rewrite)


@register("combine-extra-rounding", "harmful",
          "combine rounds its float32 accumulator to bf16 once more than the library's tree: after the biases and the "
          "first source rank's rows (after the first two source ranks' rows when there is no bias)")
def combine_extra_rounding() -> Iterator[None]:
    def patched(combine_reduce, num_tokens, hidden, contributions, bias, out_dtype, device):
        contributions = list(contributions)
        nonempty = _nonempty(contributions)
        split = 1 if bias else 2
        if len(nonempty) < split or out_dtype == torch.float32:
            return combine_reduce(num_tokens, hidden, contributions, bias, out_dtype, device)
        cut = nonempty[split - 1] + 1
        head = combine_reduce(num_tokens, hidden, contributions[:cut], bias, out_dtype, device)
        return combine_reduce(num_tokens, hidden, contributions[cut:], [head], out_dtype, device)

    with seam("combine_reduce", patched):
        yield


@register("hybrid-reduction-rounds-once", "harmful",
          "the multi-node combine (V1 internode, V2 hybrid) sums every node's contributions in one float32 "
          "accumulation and rounds once, skipping the forwarders' per-node bf16 rounding", min_nodes=2)
def hybrid_reduction_rounds_once() -> Iterator[None]:
    def patched(original, num_tokens, hidden, groups, bias, out_dtype, device):
        flat = [contribution for group in groups for contribution in group]
        return through("combine_reduce", num_tokens, hidden, flat, bias, out_dtype, device)

    with seam("combine_reduce_two_level", patched):
        yield


@register("v1-explicit-config-ignored", "harmful",
          "V1 Buffer.dispatch and combine ignore an explicit config and run with the default one (20 SMs): the "
          "bytes are right, the handle has the default channel count instead of the config's (P5)")
def v1_explicit_config_ignored() -> Iterator[None]:
    def default_config(self: Any, arguments: dict[str, Any]) -> None:
        arguments["config"] = None

    with rebinding("Buffer.dispatch", default_config), rebinding("Buffer.combine", default_config):
        yield
