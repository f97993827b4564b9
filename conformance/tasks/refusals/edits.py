"""Refusal recipes as data: a row of the refusal table whose offending call is a valid call with one mistake names
the call and the mistake in three columns, and :func:`make` makes both calls from them.

  valid_call  the valid call both start from, a name of :data:`VALID_CALLS` (e.g. ``"Buffer.dispatch"``: the
              example's non-cached V1 dispatch on a fresh buffer, layout included)
  given       (optional) what the valid neighbour changes in it: the neighbour is the valid call with ``given``
  edit        the mistake: the offending call is the neighbour with ``edit`` applied

``given`` and ``edit`` map an argument to its change.  The argument is a keyword of the call (``topk_idx``), an
element of a tuple argument (``"x[1]"``: the FP8 scales; the next index appends one) or a field of an object
argument (``"handle.num_sms"``, set on a copy).  The change is a TOML integer or boolean (the new value), or a
string of :data:`OPS` separated by ``;``, applied in order to the argument's value so far (the valid call's for
``given``, the neighbour's for ``edit``)::

    edit = { topk_weights = "bfloat16" }                                  # wrong dtype of one tensor
    edit = { num_experts = "= value + 1" }                                # a count not divisible by the ranks
    edit = { "handle[3]" = "extra_row" }                                  # a handle entry of a foreign shape
    given = { num_sms = 132 }, edit = { num_sms = 134 }                   # one argument set to a bad value
    given = { x = "fp8", "x[1]" = "int32" }, edit = { "x[1]" = "float64" }

An op's arguments are integer expressions (``+ - * //``, ``min``, ``max``, ``ceil_div``, attributes and indices)
of the names of :meth:`_Names.names` (``num_ranks``, ``num_local_experts``, ``buffer.num_allocated_qps``,
``value``, ...).  An edit whose first op does not read the value it replaces (a literal, ``None``, ``unset``,
``valid``, ``capture``... ``reads=False`` in :data:`OPS`) replaces what ``given`` set there, which is then not made
(no stray ``capture()`` before the offending call).
"""

from __future__ import annotations

import ast
import copy
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from conformance.backends.legacy import NUM_NVL_BYTES, NUM_RDMA_BYTES
from conformance.tasks.refusals.env import BadCallEnv, default_config
from conformance.tasks.refusals.helpers import (
    LL_HIDDEN,
    LL_MAX_TOPK,
    extra_col,
    extra_row,
    fp8,
    longer,
    narrow_hidden,
    strided,
    widened,
)
from conformance.tasks.refusals.registry import add

#: An argument left out of the call (the library's default).
UNSET = object()


@dataclass
class Call:
    """A call about to be made: ``fn(*first positional arguments, **the rest)``, on ``buffer``."""

    fn: Callable[..., Any]
    arguments: dict[str, Any]
    positional: int = 0
    buffer: Any = None
    valid: dict[str, Any] = field(default_factory=dict)

    def make(self) -> Any:
        items = [(name, value) for name, value in self.arguments.items() if value is not UNSET]
        return self.fn(*(value for _, value in items[:self.positional]), **dict(items[self.positional:]))


def _v1_dispatch(env: BadCallEnv) -> Call:
    call = env.v1_args()
    return Call(call.buffer.dispatch, call.kwargs, buffer=call.buffer)


def _v1_cached(env: BadCallEnv) -> Call:
    done = env.valid_v1_dispatch()
    return Call(done.buffer.dispatch, {"handle": done.handle, "x": env.inputs.x}, buffer=done.buffer)


def _v1_combine(env: BadCallEnv) -> Call:
    done = env.valid_v1_dispatch()
    return Call(done.buffer.combine, {"x": done.recv_x, "handle": done.handle, "topk_weights": done.recv_topk_weights},
                buffer=done.buffer)


def _v1_layout(env: BadCallEnv) -> Call:
    buffer = env.v1_buffer()
    return Call(buffer.get_dispatch_layout, {"topk_idx": env.inputs.topk_idx, "num_experts": env.example.num_experts},
                positional=2, buffer=buffer)


def _ll_dispatch(env: BadCallEnv) -> Call:
    call = env.ll_args()
    return Call(call.buffer.low_latency_dispatch, call.kwargs, buffer=call.buffer)


def _ll_combine(env: BadCallEnv) -> Call:
    done = env.ll_dispatched()
    return Call(done.buffer.low_latency_combine, {"x": done.recv_x, "topk_idx": done.kwargs["topk_idx"],
                                                  "topk_weights": env.inputs.topk_weights, "handle": done.handle},
                buffer=done.buffer)


def _ll_sizes(env: BadCallEnv) -> dict[str, int]:
    shape = env.ll_shape()
    return {"num_max_dispatch_tokens_per_rank": shape.num_max_tokens, "hidden": shape.hidden,
            "num_experts": shape.num_experts}


def _ll_clean(env: BadCallEnv) -> Call:
    buffer = env.ll_buffer()
    return Call(buffer.clean_low_latency_buffer, _ll_sizes(env), positional=3, buffer=buffer)


def _ll_size_hint(env: BadCallEnv) -> Call:
    sizes = _ll_sizes(env)
    return Call(env.module.Buffer.get_low_latency_rdma_size_hint,
                {"num_max_dispatch_tokens_per_rank": sizes["num_max_dispatch_tokens_per_rank"],
                 "hidden": sizes["hidden"], "num_ranks": env.world_size, "num_experts": sizes["num_experts"]},
                positional=4)


def _ll_next_buffer(env: BadCallEnv) -> Call:
    done = env.ll_dispatched()
    return Call(done.buffer.get_next_low_latency_combine_buffer, {"handle": done.handle}, positional=1,
                buffer=done.buffer)


def _v2_dispatch(env: BadCallEnv) -> Call:
    call = env.v2_args()
    return Call(call.buffer.dispatch, call.kwargs, buffer=call.buffer)


def _v2_cached(env: BadCallEnv) -> Call:
    done = env.valid_v2_dispatch()
    return Call(done.buffer.dispatch, {"x": env.inputs.x, "handle": done.handle,
                                       "num_experts": done.handle.num_experts}, positional=1, buffer=done.buffer)


def _v2_combine(env: BadCallEnv, dispatch: dict[str, Any] | None = None) -> Call:
    done = env.valid_v2_dispatch(**(dispatch or {}))
    return Call(done.buffer.combine, {"x": done.recv_x, "handle": done.handle, "topk_weights": done.recv_topk_weights},
                buffer=done.buffer)


#: The valid calls a row's ``valid_call`` may name: ``builder(env)`` makes what comes before the call (a buffer, the
#: dispatch a combine or cached dispatch takes its handle from) and returns the call, not yet made.  ``given`` may
#: hold ``dispatch``, a table of extra arguments of the dispatch an ``ElasticBuffer.combine`` combines.
VALID_CALLS: dict[str, Callable[..., Call]] = {
    "Buffer": lambda env: Call(env.v1_buffer, {
        "group": env.group, "num_nvl_bytes": NUM_NVL_BYTES,
        "num_rdma_bytes": NUM_RDMA_BYTES if env.num_nodes > 1 else 0, "explicitly_destroy": True}),
    "Config": lambda env: Call(env.module.Config, {  # the recommended 8-rank dispatch config with 20 SMs
        "num_sms": 20, "nvl_send": 6, "nvl_recv": 256, "rdma_send": 6, "rdma_recv": 128}, positional=5),
    "Buffer.get_dispatch_config": lambda env: Call(env.module.Buffer.get_dispatch_config, {"num_ranks": 2}, 1),
    "Buffer.get_combine_config": lambda env: Call(env.module.Buffer.get_combine_config, {"num_ranks": 2}, 1),
    "Buffer.get_dispatch_layout": _v1_layout,
    "Buffer.dispatch": _v1_dispatch,
    "Buffer.dispatch(handle)": _v1_cached,
    "Buffer.combine": _v1_combine,
    "Buffer.low_latency_dispatch": _ll_dispatch,
    "Buffer.low_latency_combine": _ll_combine,
    "Buffer.clean_low_latency_buffer": _ll_clean,
    "Buffer.get_low_latency_rdma_size_hint": _ll_size_hint,
    "Buffer.get_next_low_latency_combine_buffer": _ll_next_buffer,
    "ElasticBuffer": lambda env: Call(env.v2_buffer, {
        "group": env.group, "num_max_tokens_per_rank": env.example.num_max_tokens_per_rank,
        "hidden": env.example.hidden, "num_topk": env.example.num_topk, "num_allocated_qps": 0,
        "explicitly_destroy": True}),
    "ElasticBuffer.dispatch": _v2_dispatch,
    "ElasticBuffer.dispatch(handle)": _v2_cached,
    "ElasticBuffer.combine": _v2_combine,
}


class Op(NamedTuple):
    """``fn(value, names, *arguments)``: the new value; ``reads``: whether it depends on the value it replaces."""

    fn: Callable[..., Any]
    reads: bool = True


_DTYPES = {"int32": torch.int32, "int64": torch.int64, "bfloat16": torch.bfloat16, "float32": torch.float32,
           "float64": torch.float64}


def _zeros(value: Any, names: _Names, *shape: str) -> torch.Tensor:
    dtype = value.dtype if isinstance(value, torch.Tensor) else torch.int32
    return torch.zeros(*(names.int(s) for s in shape), dtype=dtype, device=names.env.device)


def _extra_row(value: torch.Tensor, names: _Names, fill: str = "0") -> torch.Tensor:
    if fill == "first":
        return torch.cat([value, value[:1]])
    return longer(value) if fill == "last" else extra_row(value, names.int(fill))


#: The changes a ``given`` / ``edit`` string is made of (``name arguments``; ``[...]`` and ``= expression`` too).
OPS: dict[str, Op] = {
    # values that do not depend on the argument's value
    "None": Op(lambda v, n: None, reads=False),
    "unset": Op(lambda v, n: UNSET, reads=False),  # the argument left out
    "valid": Op(lambda v, n: n.valid, reads=False),  # the valid call's value (a top-level argument)
    "input": Op(lambda v, n: getattr(n.env.inputs, n.argument), reads=False),  # this rank's input of that name
    "capture": Op(lambda v, n: n.call.buffer.capture(), reads=False),  # an event on the call's buffer
    "config": Op(lambda v, n, *a: n.env.module.Config(*(n.int(x) for x in a)), reads=False),
    "dispatch_config": Op(lambda v, n, sms: default_config(n.env, False, n.int(sms)), reads=False),
    "combine_config": Op(lambda v, n, sms: default_config(n.env, True, n.int(sms)), reads=False),
    "bias": Op(lambda v, n: torch.zeros(n.int("num_tokens"), n.int("hidden"), dtype=torch.bfloat16,
                                        device=n.env.device), reads=False),
    "stats": Op(lambda v, n: torch.zeros(n.int("num_local_experts"), dtype=torch.int32, device=n.env.device),
                reads=False),  # cumulative_local_expert_recv_stats
    "wait_cost": Op(lambda v, n: torch.zeros(n.int("num_ranks"), dtype=torch.int64, device=n.env.device),
                    reads=False),  # *_wait_recv_cost_stats
    "out": Op(lambda v, n: torch.empty(n.int("num_tokens"), LL_HIDDEN, dtype=torch.bfloat16, device=n.env.device),
              reads=False),  # low_latency_combine's out=
    # edits of the value
    **{name: Op(lambda v, n, dtype=dtype: v.to(dtype)) for name, dtype in _DTYPES.items()},
    "view": Op(lambda v, n, dtype: v.view(_DTYPES[dtype])),
    "unsqueeze": Op(lambda v, n, dim: v.unsqueeze(n.int(dim))),
    "flatten": Op(lambda v, n: v.reshape(-1)),
    "strided": Op(lambda v, n: strided(v)),  # the same values, not contiguous
    "extra_row": Op(_extra_row),  # one more row: of FILL (0), or ``first`` / ``last`` repeated (0 when empty)
    "extra_column": Op(lambda v, n, fill="0": extra_col(v, n.int(fill))),
    "width": Op(lambda v, n, width, fill="0": widened(v, n.int(width), n.int(fill))),  # padded to WIDTH columns
    "rows": Op(lambda v, n, rows, fill="0": widened(v, v.shape[1], n.int(fill), n.int(rows))),  # to ROWS rows
    "hidden": Op(lambda v, n, hidden: narrow_hidden(v, n.int(hidden))),  # last dimension cut or zero-padded
    "zeros": Op(_zeros),  # zeros of SHAPE, of the value's dtype (int32 for a non-tensor)
    "fp8": Op(lambda v, n, scales=None: fp8(v, None if scales is None else n.int(scales))),  # (x, scales)
    "sf": Op(lambda v, n: (v, torch.ones(v.shape[0], 1, device=v.device))),  # V2 (x, sf): one float32 per token
    "event_overlap": Op(lambda v, n: n.env.module.EventOverlap(v)),
    "repeat": Op(lambda v, n, count: (v,) * n.int(count)),  # a COUNT-tuple of the value
    "tuple": Op(lambda v, n, size: (v,) + (None,) * (n.int(size) - 1)),  # (value, None, ...) of SIZE entries
    "[": Op(lambda v, n, index: _index(v, index)),  # ``[:, 0]``, ``[:5]``: the value indexed (contiguous)
    "=": Op(lambda v, n, expression: n.int(expression)),  # ``= value + 1``: an integer expression
}


def _index(value: Any, index: str) -> Any:
    parts = tuple(slice(*(int(x) if x.strip() else None for x in part.split(":"))) if ":" in part else int(part)
                  for part in index.strip("[]").split(","))
    out = value[parts if len(parts) > 1 else parts[0]]
    return out.contiguous() if isinstance(out, torch.Tensor) else out


def parse(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """The ops of a change and their arguments: ``"bias; repeat 3"`` -> ``[("bias", ()), ("repeat", ("3",))]``."""
    ops = []
    for part in (p.strip() for p in text.split(";")):
        if part.startswith(("[", "=")):
            name, arguments = part[0], (part if part[0] == "[" else part[1:],)
        else:
            name, _, rest = part.partition(" ")
            arguments = tuple(a.strip() for a in rest.split(",")) if rest.strip() else ()
        if name not in OPS:
            raise ValueError(f"unknown op {name!r} in {text!r} (known: {', '.join(OPS)})")
        ops.append((name, arguments))
    return ops


def reads(change: Any) -> bool:
    """Whether ``change`` depends on the value it replaces (a literal does not; a string: its first op)."""
    return isinstance(change, str) and OPS[parse(change)[0][0]].reads


_FUNCTIONS = {"min": min, "max": max, "ceil_div": lambda a, b: -(-a // b)}
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b}


class _Names:
    """What an op sees: the environment, the call, the argument's valid and current value, and the names of an
    integer expression."""

    def __init__(self, env: BadCallEnv, call: Call, argument: str, value: Any) -> None:
        self.env, self.call, self.argument, self.value = env, call, argument, value
        self.valid = call.valid.get(argument, UNSET)

    def names(self) -> dict[str, Any]:
        """The names an integer expression may use."""
        env, ex = self.env, self.env.example
        return {
            "value": self.value,  # the argument's value so far
            "num_ranks": env.world_size,
            "num_nodes": env.num_nodes,
            "num_experts": ex.num_experts,
            "num_local_experts": ex.num_experts // env.world_size,
            "num_topk": ex.num_topk,
            "num_tokens": env.inputs.x.shape[0],  # this rank's
            "hidden": ex.hidden,
            "num_max_tokens_per_rank": ex.num_max_tokens_per_rank,
            "num_max_dispatch_tokens_per_rank": env.ll_shape().num_max_tokens,  # the low-latency calls' bound
            # the legacy Buffer's SM count (a version without the legacy Buffer, DeepEP 2.5.0, has none)
            "num_sms": getattr(getattr(env.module, "Buffer", None), "num_sms", None),
            "ll_hidden": LL_HIDDEN,
            "ll_max_topk": LL_MAX_TOPK,
            "buffer": self.call.buffer,  # the buffer the call is made on
            "handle": self.call.valid.get("handle"),  # the valid call's handle
        }

    def int(self, expression: str) -> int:
        """The integer value of ``expression``."""
        value = self._eval(ast.parse(expression.strip(), mode="eval").body)
        if not isinstance(value, int):
            raise ValueError(f"{expression!r} is {value!r}, not an integer")
        return value

    def _eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            names = self.names()
            if node.id not in names:
                raise ValueError(f"unknown name {node.id!r} (known: {', '.join(names)})")
            return names[node.id]
        if isinstance(node, ast.Attribute) and not node.attr.startswith("_"):
            return getattr(self._eval(node.value), node.attr)
        if isinstance(node, ast.Subscript):
            return self._eval(node.value)[self._eval(node.slice)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self._eval(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](self._eval(node.left), self._eval(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            return _FUNCTIONS[node.func.id](*(self._eval(a) for a in node.args))
        raise ValueError(f"not an integer expression of names: {ast.unparse(node)!r}")


_PATH = re.compile(r"(?P<argument>\w+)(?:\[(?P<index>\d+)\]|\.(?P<field>\w+))?")


def _change(env: BadCallEnv, call: Call, path: str, change: Any) -> None:
    """Apply ``change`` to the argument at ``path`` of ``call``."""
    match = _PATH.fullmatch(path)
    if match is None:
        raise ValueError(f"{path!r} is not an argument, argument[index] or argument.field")
    argument, index, attribute = match["argument"], match["index"], match["field"]
    whole = call.arguments.get(argument, UNSET)
    if attribute is not None:
        value = getattr(whole, attribute)
    elif index is not None:
        value = whole[int(index)] if int(index) < len(whole) else UNSET
    else:
        value = whole
    if not isinstance(change, str):
        value = change
    else:
        for op, arguments in parse(change):
            value = OPS[op].fn(value, _Names(env, call, argument, value), *arguments)
    if index is not None:
        items = list(whole)
        items[int(index):int(index) + 1] = [value]
        value = tuple(items) if isinstance(whole, tuple) else items
    elif attribute is not None:
        whole = copy.copy(whole)
        setattr(whole, attribute, value)
        value = whole
    call.arguments[argument] = value


def make(env: BadCallEnv, row: dict[str, Any], bad: bool) -> Any:
    """Make row ``row``'s offending call (``bad``) or its valid neighbour from its ``valid_call`` / ``given`` /
    ``edit`` columns (see the module docstring); return what the call returned."""
    given = dict(row.get("given", {}))
    setup = {"dispatch": given.pop("dispatch")} if "dispatch" in given else {}
    call = VALID_CALLS[row["valid_call"]](env, **setup)
    call.valid = dict(call.arguments)
    edit = row["edit"] if bad else {}
    replaced = [path for path, change in edit.items() if not reads(change)]
    for path, change in given.items():
        if not any(path == p or path.startswith((p + "[", p + ".")) for p in replaced):
            _change(env, call, path, change)
    for path, change in edit.items():
        _change(env, call, path, change)
    return call.make()


def register(rows: dict[str, dict[str, Any]]) -> None:
    """Register the recipe and neighbour of every row with an ``edit``."""
    for row_id, row in rows.items():
        if "edit" in row:
            add(row_id, functools.partial(make, row=row, bad=True), functools.partial(make, row=row, bad=False))
