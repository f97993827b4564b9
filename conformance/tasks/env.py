"""What every rank task gets: :func:`rank_task` does the per-task set-up once, for every task.

A rank task is a module-level function ``task(env) -> result`` decorated with :func:`rank_task`.  The
controller sends the function itself (pickled by reference) with the run's :class:`TaskSettings` and the
case; on the rank the decorator builds the :class:`RankEnv` (where this rank is, its inputs for the case,
the selected backends' adapters), traces the library calls, switches the active mutant on, and calls the
task.  Tasks return plain data (views, tensors, :class:`~conformance.core.views.Raised`) per backend.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from conformance.backends.contract import NotSupported
from conformance.backends.factory import get_adapter, trace_library
from conformance.backends.limits import known_limit
from conformance.core.cases import example_of
from conformance.core.example import Example, RankInputs, build_rank_inputs
from conformance.core.ids import CallId
from conformance.core.outcomes import NotChecked, Why
from conformance.core.raisers import suite_frame
from conformance.core.spec import BackendSpec
from conformance.mutants import activate
from conformance.world.rank import RaisedInStep, RankContext, backend_context, context, step


@dataclass(frozen=True)
class TaskSettings:
    """What every task needs besides the case: the backends to drive (resolved specs: a plug-in's declaration
    travels with it) and the planted mutant, if any."""

    backends: tuple[BackendSpec, ...]
    mutant: str | None = None
    #: Backends whose buffer construction the preflight found broken (a property that runs anyway, like the API
    #: surface, makes no call on them).
    broken: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The backends' names."""
        return tuple(spec.name for spec in self.backends)


class RankEnv:
    """One rank's view of a task: where it is, the case, its inputs, and the backends to drive."""

    def __init__(self, settings: TaskSettings, case: Any, ctx: RankContext) -> None:
        self.settings = settings
        self.case = case
        self.ctx = ctx
        self.rank = ctx.rank
        self.world_size = ctx.world_size
        self.group = ctx.group
        self.device: torch.device = ctx.torch_device()
        self.example: Example | None = example_of(case)
        self._inputs: RankInputs | None = None

    @property
    def inputs(self) -> RankInputs:
        """This rank's inputs for the case's example, on this rank's device."""
        if self._inputs is None:
            assert self.example is not None, "this case has no example"
            self._inputs = build_rank_inputs(self.example, self.rank).to(self.device)
        return self._inputs

    def specs(self, api: str | None = None, capability: str | None = None) -> Iterator[BackendSpec]:
        """The selected backends (of ``api`` only, and declaring ``capability`` only, if given)."""
        for spec in self.settings.backends:
            if (api is None or spec.api == api) and (capability is None or spec.has(capability)):
                yield spec

    def spec(self, name: str) -> BackendSpec:
        """The selected backend called ``name``."""
        return next(spec for spec in self.settings.backends if spec.name == name)

    def adapters(self, api: str | None = None) -> Iterator[tuple[str, Any]]:
        """``(backend name, adapter)`` for every selected backend (of ``api`` only, if given)."""
        for spec in self.specs(api):
            yield spec.name, get_adapter(spec)

    def each_backend(self, operation: str, call: Callable[[Any], Any], api: str | None = None,
                     capability: str | None = None, also: tuple[str, ...] = ()) -> dict[str, Any]:
        """``{backend: call(adapter)}``; an exception that a known limit covers (``backends.limits``; of
        ``operation``, or of the ``also`` operations ``call`` makes too), or a backend's
        :class:`~conformance.backends.contract.NotSupported`, becomes that backend's :class:`NotChecked` result; any
        other propagates (a failure of the property)."""
        out: dict[str, Any] = {}
        for spec in self.specs(api, capability):
            out[spec.name] = self.call(spec, operation, call, also)
        return out

    def then_each_backend(self, first: dict[str, Any], operation: str, call: Callable[[Any, Any], Any]
                          ) -> dict[str, Any]:
        """A second stage per backend: ``call(adapter, first[backend])``; a :class:`NotChecked` first stage stays."""
        out: dict[str, Any] = {}
        for name, result in first.items():
            spec = self.spec(name)
            out[name] = result if isinstance(result, NotChecked) else self.call(
                spec, operation, lambda adapter, r=result: call(adapter, r))
        return out

    def call(self, spec: BackendSpec, operation: str, call: Callable[[Any], Any], also: tuple[str, ...] = ()) -> Any:
        """``call(adapter)`` for ``spec``, then a step every rank takes together (:func:`in_step`): no rank starts
        another backend's calls before this one's ended everywhere, so a hang is charged to the backend that hung
        and an exception that is not a known limit ends the task on every rank (``RaisedInStep``) with the world
        still usable."""
        error: BaseException | None = None
        result: Any = None
        with backend_context(spec.name, operation):
            try:
                result = call(get_adapter(spec))
            except NotSupported as exc:  # a set-up limit's (tasks.setup) names its condition
                result = NotChecked.example(spec.name, exc.why, f"{spec.name} {operation}", str(exc),
                                            getattr(exc, "condition", ""))
            except Exception as exc:  # a known limit, else a failure (the backend's, or a suite error: in_step)
                result = None if suite_frame(exc) else (declined(spec, operation, exc)
                                                        or limited(spec, (operation, *also), self.example, exc))
                if result is None:
                    error = exc
            in_step(self.device, spec.name, operation, error)
        return result


#: The mutant the previous task of this process ran with (``[name]``; the initial ``[None]``: none planted).
_last_mutant: list[str | None] = [None]


def _drop_buffers_built_under_another_mutant(settings: TaskSettings) -> None:
    """When the planted mutant changes, the built-in adapters release the buffers they keep between tasks: a buffer
    built while a mutant patched the constructor (its size, its QP cap) must not serve the next mutant's tasks, nor
    the replay without a mutant that attributes a kill.  Every rank runs the same tasks, so they do it together."""
    if settings.mutant == _last_mutant[0]:
        return
    _last_mutant[0] = settings.mutant
    for spec in settings.backends:
        if not spec.plugin:
            get_adapter(spec).destroy()


def rank_task(fn: Callable[[RankEnv], Any]) -> Callable[[TaskSettings, Any], Any]:
    """Make ``fn(env)`` a rank task: called on every rank as ``task(settings, case)``."""

    @functools.wraps(fn)
    def task(settings: TaskSettings, case: Any) -> Any:
        for spec in settings.backends:
            trace_library(spec)  # before a mutant patches the classes
        _drop_buffers_built_under_another_mutant(settings)
        env = RankEnv(settings, case, context())
        with activate(settings.mutant):
            return fn(env)

    return task


def in_step(device: torch.device, backend: str, operation: str, error: BaseException | None) -> None:
    """End ``backend``'s ``operation`` on every rank together: its device work finished (a CUDA error it left is
    *sticky*: the world cannot be reused), then one small all-gather of who raised.  If any rank raised, every rank
    raises :class:`~conformance.world.rank.RaisedInStep` (the controller keeps the world unless an error is sticky;
    it says where the suite's own code raised, a suite error, ``core.raisers.suite_frame``); a sticky error is
    re-raised as it is (the world is retired)."""
    ranks, error = settle(device, backend, operation, error)
    if not ranks:
        return
    own = None if error is None else "".join(traceback.format_exception(error))
    raise RaisedInStep(backend, operation, ranks, own, suite_frame(error)) from error


def settle(device: torch.device, backend: str, operation: str, error: BaseException | None
           ) -> tuple[list[int], BaseException | None]:
    """The common end of :func:`in_step`: ``(the ranks where backend's operation raised, this rank's error)``, every
    rank knowing them; a sticky CUDA error is raised here (the world is retired, the failure still ``backend``'s)."""
    sticky = False
    if device.type == "cuda":
        try:
            torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001 - an asynchronous CUDA error of this backend's kernels
            error, sticky = error or exc, True
    ranks, any_sticky = step(error is not None, sticky)
    if ranks and any_sticky:
        if error is None:
            error = RuntimeError(f"{backend}: {operation} left a CUDA error on rank(s) {ranks}")
        # The world is retired, yet the failure is still this backend's: the controller charges it to the call,
        # never to every backend of the world.
        error.conformance_call = str(CallId(backend, operation))  # type: ignore[attr-defined]
        raise error
    return ranks, error


def declined(spec: BackendSpec, operation: str, exc: BaseException) -> NotChecked | None:
    """A class backend that declares nothing (``conformance_capabilities``) says a call is not implemented by raising
    ``NotImplementedError``: ``unsupported`` for that backend, with its message as the reason.  (A class that declares
    its capabilities is held to them: its ``NotImplementedError`` is a failure.)"""
    if isinstance(exc, NotImplementedError) and spec.substitute and spec.declared is None:
        return NotChecked.example(spec.name, Why.DECLINED, f"{spec.class_name}.{operation}",
                                  f"NotImplementedError: {exc}",
                                  f"{spec.class_name}.{operation} not implemented by the class")
    return None


def limited(spec: BackendSpec, operations: tuple[str, ...], example: Any, exc: Exception) -> NotChecked | None:
    """``exc`` as ``spec``'s :class:`NotChecked` result where a known limit of one of ``operations`` covers
    ``example`` (``backends.limits``), else ``None`` (a failure)."""
    for operation in operations:
        limit = None if example is None else known_limit(spec.api, operation, example, spec.version)
        if limit is not None and limit.refused(exc):
            return NotChecked.example(spec.name, Why.LIMIT, f"{spec.class_name}.{operation}",
                                      f"{type(exc).__name__}: {exc}",
                                      f"{spec.class_name}.{operation} with {limit.condition}")
    return None
