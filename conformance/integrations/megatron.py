"""Megatron-Core's ``megatron/core/transformer/moe/fused_a2a.py``, unchanged, as plug-in backends.

``--backends megatron-fused-a2a`` (the entry points this package registers; or
``conformance.integrations.megatron:MegatronFusedA2A``), with ``pip install megatron-core==0.16.1 --no-deps`` (plus
numpy and packaging) next to the suite, and ``--deep-ep auto`` (the real DeepEP where it is usable, else
``conformance.emulation`` under the name ``deep_ep``).

Four backends over one installed Megatron:

- ``megatron-fused-a2a``: whatever the installed Megatron does: its ``ElasticBuffer`` path where it has one and
  ``from deep_ep import ElasticBuffer`` works (``HAVE_DEEP_EP_V2``), else its ``Buffer`` path; the declared API
  follows;
- ``megatron-fused-a2a-v1``: the same Megatron with its legacy path forced (``HAVE_DEEP_EP_V2 = False`` in a private
  copy of the module): what its users get without DeepEP V2;
- ``megatron-fused-a2a-v2``: the same Megatron's V2 path (``HAVE_DEEP_EP_V2``), in its own private copy; refused with
  one line before any rank starts where the installed Megatron has no V2 path;
- ``megatron-fused-a2a-shimmed``: megatron-core 0.16.1 as released, with the one-line workaround below.

Each private copy has its own module globals, so the ``-v1`` and ``-v2`` backends of one run keep one
module-global buffer each, as two installations would.  ``--backends megatron-fused-a2a-v1,megatron-fused-a2a-v2,
emulated-v1,emulated-v2`` compares the wrapper's two paths with each other (the report's table "what changes for
the wrapper's users"), with the raw APIs and with the oracle.

Everything goes through Megatron's public functions, as its ``MoEFlexTokenDispatcher`` calls them:

- dispatch: ``fused_dispatch(x, token_indices, token_probs, num_experts, group, async_finish,
  allocate_on_comm_stream)`` -> ``(recv_x, recv_token_indices, recv_token_probs, tokens_per_expert, handle)``;
  ``async_finish`` comes with ``allocate_on_comm_stream=True`` (the flex dispatcher's defaults);
- combine: ``fused_combine(x, group, handle, async_finish, allocate_on_comm_stream)`` -> ``(combined_x, None)``;
  it takes no ``topk_weights`` and no bias (capabilities ``combine_weights`` / ``combine_bias`` not declared);
- cached dispatch: Megatron exposes it only as the backward of ``fused_combine`` (``FusedCombine.backward``), so it
  is driven exactly that way;
- autograd: ``fused_dispatch`` / ``fused_combine`` themselves (``FusedDispatch.backward`` = combine of the
  gradients with ``topk_weights=grad_token_probs``, ``FusedCombine.backward`` = cached dispatch).

Where each received row came from: on the V2 path the ``EPHandle``'s ``recv_src_metadata`` says it; on the V1 path a
cached dispatch of identity rows through ``fused_combine``'s backward finds it (``PluginBackend.sources``).

The wrapper's whole life (P25-clean-exit): Megatron builds its buffer lazily in the first call, keeps it in the
module global ``_buffer`` and offers no teardown, so the backend does not override ``PluginBackend.teardown``: the
buffer is left to the garbage collector after ``destroy_process_group()``.  (:meth:`MegatronFusedA2A.destroy` is the
suite's own clean-up of its persistent rank world, before the group goes.)

Not declared, so reported ``unsupported`` (or ``not_checked``) with the reason: ``expert_alignment`` (the wrapper
passes none: DeepEP's default 1), ``combine_weights``, ``combine_bias``, ``layout`` (the layout stays inside
``fused_dispatch``).

**Finding: megatron-core 0.16.1 does not import DeepEP 2.1.0.**  It guards its import of DeepEP with ``from
deep_ep.utils import EventHandle, EventOverlap``; DeepEP 2.1.0 exports ``EventHandle`` only from ``deep_ep.utils``
(``EventOverlap`` moved to ``deep_ep.utils.event``; recorded on the real library, docs/real-runs/), so fused_a2a sets
``HAVE_DEEP_EP = False`` and ``fused_dispatch`` is ``None``.  The plug-in ``megatron-fused-a2a`` reports exactly that;
``megatron-fused-a2a-shimmed`` applies the one-line workaround an integrator would (``deep_ep.utils.EventOverlap =
deep_ep.utils.event.EventOverlap`` while Megatron imports) and checks the rest of the wrapper, labelled as such.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import Any

import torch

from conformance.backends.plugins import Dispatched, PluginBackend, PluginEnv
from conformance.integrations import MEGATRON_CAPABILITIES

MODULE = "megatron.core.transformer.moe.fused_a2a"
#: The release the self-tests pin (the newest that installs on Python 3.11; its V1 code is the same up to 0.19.2).
TESTED_VERSION = "0.16.1"
#: The flag a Megatron with a DeepEP V2 path sets at import (the seed PR's ``fused_a2a.py``).
V2_FLAG = "HAVE_DEEP_EP_V2"

if importlib.util.find_spec("megatron") is None:
    raise ImportError(f"megatron-core is not installed: pip install megatron-core=={TESTED_VERSION} --no-deps "
                      f"(and numpy, packaging)")
try:
    _VERSION = version("megatron-core")
except PackageNotFoundError:  # a source checkout on the path
    _VERSION = "unknown version"


def _event_overlap_import_error() -> str | None:
    """Why fused_a2a's guard ``from deep_ep.utils import EventHandle, EventOverlap`` fails, if it does."""
    try:
        utils = importlib.import_module("deep_ep.utils")
    except ImportError as exc:
        return f"import deep_ep.utils: {exc}"
    missing = [name for name in ("EventHandle", "EventOverlap") if not hasattr(utils, name)]
    return f"deep_ep.utils has no {', '.join(missing)} (ImportError)" if missing else None


def _flag_reason(flag: str) -> str:
    """Why fused_a2a's import-time check behind ``flag`` fails with this deep_ep ('' when it cannot tell)."""
    try:
        deep_ep = importlib.import_module("deep_ep")
    except ImportError as exc:
        return f"import deep_ep: {exc}"
    name = "ElasticBuffer" if flag == V2_FLAG else "Buffer"
    if not hasattr(deep_ep, name):
        return f"'from deep_ep import {name}' fails: this deep_ep has no {name}"
    guard = _event_overlap_import_error() if flag == "HAVE_DEEP_EP" else None
    return f"its guard 'from deep_ep.utils import EventHandle, EventOverlap' fails: {guard}" if guard else ""


def private_copy(suffix: str) -> ModuleType:
    """A fresh copy of the installed ``fused_a2a`` (its own module globals: flags, ``_buffer``), executed under the
    name ``<MODULE>__<suffix>``, from the installed file, as it is."""
    found = importlib.util.find_spec(MODULE)
    if found is None or not found.origin:
        raise ImportError(f"{MODULE} is not importable")
    name = f"{MODULE}__{suffix}"
    spec = importlib.util.spec_from_file_location(name, found.origin)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def installed_path() -> str:
    """``"v2"`` when the installed fused_a2a takes its DeepEP V2 path here (it sets ``HAVE_DEEP_EP_V2``), else
    ``"v1"``."""
    return "v2" if getattr(importlib.import_module(MODULE), V2_FLAG, False) else "v1"


class MegatronFusedA2A(PluginBackend):
    """Megatron-Core ``fused_a2a`` exactly as installed: its V2 path where it takes one, else its ``Buffer`` path."""

    api = installed_path()
    capabilities = MEGATRON_CAPABILITIES
    description = (f"Megatron-Core {_VERSION} {MODULE} as installed "
                   f"({'its DeepEP V2 path' if api == 'v2' else 'over deep_ep.Buffer'}): fused_dispatch / "
                   f"fused_combine and their autograd")
    family = "megatron-fused-a2a"
    #: Apply the deep_ep.utils.EventOverlap workaround before Megatron imports (the ``-shimmed`` backend only).
    shim = False
    #: The flags of fused_a2a that make the path this backend drives use DeepEP (any of them).
    path_flags: tuple[str, ...] = ("HAVE_DEEP_EP", V2_FLAG)

    @classmethod
    def checked_module(cls) -> Any:
        """The fused_a2a whose import-time checks decide what this backend's path does."""
        return importlib.import_module(MODULE)

    @classmethod
    def wrapper_checks(cls) -> dict[str, Any]:
        """What fused_a2a checked at import (``HAVE_DEEP_EP``, ``HAVE_DEEP_EP_V2``, whether ``fused_dispatch`` is
        ``None``) and whether this backend's path drives DeepEP with it (``PluginBackend`` declaration: the report
        keeps it, the version gate compares it across the bump)."""
        try:
            module = cls.checked_module()
        except Exception as exc:  # noqa: BLE001 - said as the reason it does not drive DeepEP
            return {"checked": {}, "drives_deep_ep": False, "why": f"loading {MODULE} fails: {exc}"}
        flags = {name: bool(getattr(module, name)) for name in ("HAVE_DEEP_EP", V2_FLAG) if hasattr(module, name)}
        no_dispatch = getattr(module, "fused_dispatch", None) is None
        drives = not no_dispatch and any(flags.get(flag) for flag in cls.path_flags)
        reasons = [f"{flag} is False" + (f" ({why})" if (why := _flag_reason(flag)) else "")
                   for flag in cls.path_flags if flag in flags and not flags[flag]]
        why = "" if drives else "; ".join(reasons + (["fused_dispatch is None"] if no_dispatch else []))
        return {"checked": {**flags, "fused_dispatch is None": no_dispatch}, "drives_deep_ep": drives, "why": why}

    def __init__(self, env: PluginEnv) -> None:
        super().__init__(env)
        self.fa: Any = self.load()
        if not getattr(self.fa, "HAVE_DEEP_EP", False) and not getattr(self.fa, V2_FLAG, False) \
                or self.fa.fused_dispatch is None:
            reason = _event_overlap_import_error()
            if reason is not None:
                raise RuntimeError(
                    f"{MODULE} cannot use this deep_ep: its guard 'from deep_ep.utils import EventHandle, "
                    f"EventOverlap' fails ({reason}); DeepEP 2.1.0 exports EventOverlap from deep_ep.utils.event "
                    f"only, so fused_a2a sets HAVE_DEEP_EP = False. The backend megatron-fused-a2a-shimmed applies "
                    f"the one-line workaround and checks the rest of the wrapper")
            raise RuntimeError(f"{MODULE} found no deep_ep (HAVE_DEEP_EP is False): it binds fused_dispatch at import "
                               f"time; pass --deep-ep emulation (or auto), or install DeepEP")
        path = "v2" if getattr(self.fa, V2_FLAG, False) else "v1"
        if path != self.api:
            raise RuntimeError(f"{env.name}: declared the {self.api} path, but {MODULE} takes its {path} path in "
                               f"this rank")
        self.group = env.group

    @classmethod
    def load(cls) -> Any:
        """The fused_a2a module this backend drives (the installed one)."""
        return importlib.import_module(MODULE)

    # ------------------------------------------------------------------------------------ dispatch
    def dispatch_tokens(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                        *, expert_alignment: int = 1, async_finish: bool = False, previous_event: bool = False
                        ) -> Dispatched:
        """``fused_dispatch`` (no autograd).  ``previous_event``: Megatron's async path captures the current stream
        itself, so an async dispatch is what orders it after prior compute."""
        overlap = async_finish or previous_event
        with torch.no_grad():
            recv_x, recv_idx, recv_probs, tokens_per_expert, handle = self.fa.fused_dispatch(
                x, topk_idx, topk_weights, num_experts, self.group, async_finish=overlap,
                allocate_on_comm_stream=overlap)
        return Dispatched(recv_x, recv_idx, recv_probs, [int(c) for c in tokens_per_expert.tolist()], handle)

    def autograd_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int
                          ) -> tuple[torch.Tensor, torch.Tensor, Dispatched]:
        """``fused_dispatch`` with autograd: backward is Megatron's ``FusedDispatch.backward``."""
        recv_x, recv_idx, recv_probs, tokens_per_expert, handle = self.fa.fused_dispatch(
            x, topk_idx, topk_weights, num_experts, self.group)
        dispatched = Dispatched(recv_x.detach(), recv_idx, recv_probs.detach(),
                                [int(c) for c in tokens_per_expert.tolist()], handle)
        return recv_x, recv_probs, dispatched

    # ------------------------------------------------------------------------------------- combine
    def combine_tokens(self, dispatched: Dispatched, x: torch.Tensor, *, topk_weights: torch.Tensor | None = None,
                       bias: Any = None, async_finish: bool = False) -> torch.Tensor:
        """``fused_combine`` (no autograd); its second output is always ``None``."""
        with torch.no_grad():
            combined, second = self.fa.fused_combine(x, self.group, dispatched.handle, async_finish=async_finish,
                                                     allocate_on_comm_stream=async_finish)
        if second is not None:
            raise AssertionError(f"fused_combine's second output is {type(second).__name__}, expected None")
        return combined

    def autograd_combine(self, dispatched: Dispatched, x: torch.Tensor) -> torch.Tensor:
        """``fused_combine`` with autograd: backward is Megatron's ``FusedCombine.backward`` (a cached dispatch)."""
        return self.fa.fused_combine(x, self.group, dispatched.handle)[0]

    def cached_dispatch_tokens(self, dispatched: Dispatched, x: torch.Tensor) -> torch.Tensor:
        """The gradient of ``fused_combine`` for the upstream gradient ``x``: Megatron's cached dispatch."""
        rows = torch.zeros(dispatched.recv_x.shape[0], x.shape[1], dtype=x.dtype, device=x.device,
                           requires_grad=True)
        with torch.enable_grad():
            combined = self.fa.fused_combine(rows, self.group, dispatched.handle)[0]
            combined.backward(x.contiguous())
        assert rows.grad is not None
        return rows.grad

    def destroy(self) -> None:
        """The suite's clean-up of its persistent world: drop Megatron's module-global buffer while the group lives
        (it was never built with ``explicitly_destroy=True``, so ``destroy()`` would refuse)."""
        self.fa._buffer = None


class MegatronFusedA2AShimmed(MegatronFusedA2A):
    """:class:`MegatronFusedA2A` with the workaround for DeepEP 2.1.0's ``deep_ep.utils`` (see the module doc)."""

    api = "v1"
    shim = True
    path_flags = ("HAVE_DEEP_EP",)
    description = (f"Megatron-Core {_VERSION} {MODULE} with the workaround deep_ep.utils.EventOverlap = "
                   f"deep_ep.utils.event.EventOverlap (DeepEP 2.1.0 no longer exports it from deep_ep.utils): "
                   f"fused_dispatch / fused_combine and their autograd, over deep_ep.Buffer")
    family = "megatron-fused-a2a-shimmed"

    @classmethod
    def checked_module(cls) -> Any:
        return cls.load()

    @classmethod
    def load(cls) -> Any:
        """The installed module, imported (again) while ``deep_ep.utils.EventOverlap`` exists; its V2 path, if it has
        one, switched off (this backend checks the released 0.16.1's Buffer path)."""
        if _event_overlap_import_error() is None:
            module = importlib.import_module(MODULE)
        else:
            # The workaround lasts only while Megatron imports (it binds the names then): deep_ep.utils stays as the
            # library ships it for every other backend and property in this rank.
            utils, event = importlib.import_module("deep_ep.utils"), importlib.import_module("deep_ep.utils.event")
            utils.EventOverlap = event.EventOverlap
            try:
                module = private_copy("shimmed")
            finally:
                del utils.EventOverlap
        if getattr(module, V2_FLAG, False):
            module = private_copy("shimmed")
            setattr(module, V2_FLAG, False)
        return module


class MegatronFusedA2AV1(MegatronFusedA2A):
    """The installed Megatron with its legacy ``Buffer`` path forced (``HAVE_DEEP_EP_V2 = False``), in a private
    copy of ``fused_a2a``: what a user of this Megatron gets without DeepEP V2."""

    api = "v1"
    path_flags = ("HAVE_DEEP_EP",)
    description = (f"Megatron-Core {_VERSION} {MODULE}, its legacy path forced ({V2_FLAG} = False): "
                   f"fused_dispatch / fused_combine and their autograd over deep_ep.Buffer")

    @classmethod
    def load(cls) -> Any:
        module = private_copy("v1")
        setattr(module, V2_FLAG, False)  # every call site reads the flag at call time
        return module


def _no_v2_path() -> str | None:
    """Why ``megatron-fused-a2a-v2`` cannot be selected at all (read before any rank starts): the installed Megatron
    has no V2 path; or ``None``."""
    module = importlib.import_module(MODULE)
    if not hasattr(module, V2_FLAG):
        return (f"Megatron-Core {_VERSION}'s {MODULE} has no DeepEP V2 path (no {V2_FLAG}): install a Megatron with "
                f"one (e.g. megatron-core {TESTED_VERSION} with ../shared/clients/megatron-seed-pr/"
                f"fused_a2a-deepep-v2.patch applied), or select megatron-fused-a2a / megatron-fused-a2a-v1")
    return None


def _v2_path_missing() -> str | None:
    """Why the V2 path does not run here (:func:`_no_v2_path`, or its flag is False with this deep_ep), or ``None``."""
    missing = _no_v2_path()
    if missing is not None:
        return missing
    module = importlib.import_module(MODULE)
    if not getattr(module, V2_FLAG):
        return (f"{MODULE} has a DeepEP V2 path but does not take it here ({V2_FLAG} is False: 'from deep_ep import "
                f"ElasticBuffer' fails with this deep_ep)")
    return None


class MegatronFusedA2AV2(MegatronFusedA2A):
    """The installed Megatron's DeepEP V2 (``ElasticBuffer``) path, in a private copy of ``fused_a2a``."""

    api = "v2"
    path_flags = (V2_FLAG,)
    description = (f"Megatron-Core {_VERSION} {MODULE}, its DeepEP V2 path ({V2_FLAG}): fused_dispatch / "
                   f"fused_combine and their autograd over deep_ep.ElasticBuffer")

    @staticmethod
    def unavailable() -> str | None:
        """Read by the controller's probe: a reason stops the run with one line (``PluginBackend.unavailable``): a
        Megatron with no V2 path.  One whose V2 path is not taken with this deep_ep (``HAVE_DEEP_EP_V2`` False, as
        on DeepEP 2.5.0, which has no ``ElasticBuffer``) runs and fails on construction saying so: that is a finding
        about the wrapper (the gate reports it with ``wrapper_checks``), not a set-up mistake."""
        return _no_v2_path()

    @classmethod
    def load(cls) -> Any:
        reason = _v2_path_missing()
        if reason is not None:
            raise RuntimeError(reason)
        return private_copy("v2")
