"""The property catalog: one module per contract item, each holding its one registry entry.

A property module ``test_pNN_<name>.py`` defines its check and registers a :class:`Property` with
:func:`register`: id, title, the strategy that draws its cases, the rank task that runs them, the check.
:func:`register` also returns the module's pytest test, so the module is the whole property::

    PROPERTY = register(Property(id="P1-per-expert-payloads", title="...", strategy=sized(examples),
                                 task=dispatch_views, check=check))
    test_per_expert_payloads = PROPERTY.test

:func:`catalog` imports every property module and returns the entries in catalog order; the harness,
``conformance.repro`` and the kill matrix all draw from it.  Importing this package alone is cheap.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from conformance.core.example import Example
from conformance.core.ids import sort_key  # noqa: F401  (re-exported: catalog order)
from conformance.core.outcomes import NotChecked, Why
from conformance.core.spec import APIS, CAPABILITIES, BackendSpec, Capability

#: The APIs a backend can drive.
ALL_APIS = ("v1", "v2")


class CheckContext(Protocol):
    """What a check gets besides the case and the results: the world's shape and places to record what it saw
    that is not a failure (the harness' session implements it)."""

    @property
    def shape(self) -> Any: ...  # conformance.world.launcher.WorldShape: nodes, ranks_per_node, size

    #: what a backend was not checked on and why (a whole property, one example: ``case``, a part of the check)
    def not_checked(self, item: NotChecked, case: Any = None) -> None: ...

    def record_divergence(self, key: str, message: str, backends: tuple[str, ...] | None = None) -> None: ...

    def record_artifact(self, key: str, value: Any) -> None: ...

    def record_seen(self, key: str, backend: str, what: str, value: str) -> None: ...  # artifact over examples

    def checking(self, backends: tuple[str, ...] | None) -> None: ...  # the backend (or pair) now checked

    def contract(self, backend: str) -> Any: ...  # conformance.versions.Contract of the version backend is driven by


@dataclass(frozen=True)
class Stateful:
    """How the pytest run drives a stateful property (a Hypothesis state machine) instead of drawing whole cases.

    Attributes:
        machine: ``machine(world_size, run_step, end)`` -> a ``RuleBasedStateMachine`` class whose rules call
            ``run_step(case, index)`` once per step (the harness runs step ``index`` of ``case`` on the ranks with
            ``step_task`` and checks it with ``check_step``) and whose teardown calls ``end(case, failed)``.
        step_task: the ``@rank_task`` making one step; its case is ``(case, index)``.
        end_task: the ``@rank_task`` ending a sequence on the ranks (its case is the sequence).
        check_step: ``check_step(ctx, case, index, per_rank_results, failed=frozenset())``: raises
            ``AssertionError`` on a violation; :class:`BackendsFailed` where some backends failed and others held (the
            sequence goes on for the others, without checking ``failed``: the backends that failed earlier in it).
    """

    machine: Callable[..., Any]
    step_task: Callable[..., Any]
    end_task: Callable[..., Any]
    check_step: Callable[..., None]


class BackendsFailed(AssertionError):
    """A step of a stateful property failed on some backends while others held: the harness goes on with the sequence
    for the others (a backend's failure never cuts another backend's check short) and raises ``failure`` at its end.

    ``columns``: every column that failed at this step, with its own message; ``backends``: the backends whose own
    column failed (left out of the checks of the later steps)."""

    def __init__(self, failure: AssertionError, columns: dict[str, str], backends: set[str]) -> None:
        super().__init__(*failure.args)
        self.failure, self.columns, self.backends = failure, columns, backends


class NotApplicable(Exception):  # noqa: N818 - an outcome, not an error
    """The property cannot be checked with the selected backends (each was recorded as not checked, span
    ``property``: :meth:`Property.exclusions`, or none was selected); the property is reported ``unsupported`` with
    the reasons.  (Control flow: the property draws nothing.)"""


@dataclass(frozen=True)
class Property:
    """One contract item.

    Attributes:
        id: ``PNN-name``, stable across versions (reports and gates key on it).
        title: one line saying what holds.
        strategy: ``world shape -> SearchStrategy`` of cases (``strategies.sized`` adapts a strategy of the world
            size; the shape has ``nodes``, ``ranks_per_node`` and ``size``).
        task: the ``@rank_task`` the ranks run on each case (gets only the backends of ``apis``).
        check: ``check(ctx, case, per_rank_results)`` (:class:`CheckContext`; the task's result of every rank):
            raises ``AssertionError`` on a violation.
        case_type: what the strategy draws (``Example`` or a case type of :mod:`conformance.core.cases`).
        apis: the APIs the property exercises; with no selected backend of these it is not applicable.
        explicit: ``world shape -> [case, ...]`` checked first on every run, before the drawn ones (a sweep that
            must not be left to chance, such as every row of a table).
        needs: the capabilities (``conformance.core.spec.CAPABILITIES``) a backend must declare to be checked by
            the property; a selected backend without them is reported ``unsupported`` for it, with the reason.
        runs_when_broken: checked even when a backend's buffer construction is broken (the construction
            preflight fails the other properties at once): the API surface is what explains a broken build.
        stateful: a stateful property (:class:`Stateful`): the pytest run drives its state machine, one step per
            rank task; ``strategy`` / ``task`` / ``check`` still take whole cases (replays, the kill matrix).
        configured: ``configured(run config) -> [case, ...]`` (checked in the pytest run instead of drawn cases) or
            a string: why the property is skipped in this run (a mode switched on by an option, like ``--soak``).
        shapes: how its cases meet a run's shape vocabulary (``--shapes``, :mod:`conformance.strategies.vocabulary`):
            ``all`` (snapped to the vocabulary's shapes), ``small`` (to its first shape: call semantics on small
            examples), ``own`` (its strategy reads the vocabulary itself: ``vocabulary.active()``) or ``free``
            (never snapped: fixed sizes).
    """

    id: str
    title: str
    strategy: Callable[[int], Any]
    task: Callable[..., Any]
    check: Callable[..., None]
    case_type: type = Example
    apis: tuple[str, ...] = ALL_APIS
    explicit: Callable[[Any], list[Any]] | None = None
    needs: tuple[str, ...] = ()
    runs_when_broken: bool = False
    stateful: Stateful | None = None
    configured: Callable[[Any], list[Any] | str] | None = None
    shapes: str = "all"
    #: The rank task's results depend on the case alone and a case costs seconds (fresh processes): a case checked
    #: again in the same property (Hypothesis' replay of a failure) reuses the results instead of running it again.
    memo: bool = False
    test: Callable[..., None] = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    #: The module that registered it (set by :func:`register`): where its documentation lives.
    module: str = field(default="", compare=False, repr=False)

    def applies_to(self, api: str, capabilities: Iterable[str], name: str = "it",
                   class_name: str | None = None) -> str | None:
        """Why a backend (``name``) following ``api`` (``v1`` / ``v2``; ``class_name``: its class in the backend's
        DeepEP version, e.g. ``EPBuffer``) and declaring ``capabilities`` is not checked by this property, or ``None``
        when it is.  The one rule the session, the docs and the self-tests share."""
        if api not in self.apis:
            apis = " or ".join(f"{a} ({APIS[a]})" for a in self.apis)
            return f"{self.id} checks the {apis} contract and {name} follows {api} ({class_name or APIS[api]})"
        declared = set(capabilities)
        missing = [need for need in self.needs if need not in declared]
        if missing:
            return (f"{name} does not declare the capabilit{'ies' if len(missing) > 1 else 'y'} "
                    + ", ".join(f"'{m}' ({CAPABILITIES[m]})" for m in missing) + f" that {self.id} needs")
        return None

    def exclusions(self, backends: Iterable[BackendSpec]) -> dict[str, NotChecked]:
        """The ``backends`` this property does not check (span ``property``), with the reason and its kind: another
        API (``api``), a missing capability (``capability``, :meth:`applies_to`), or the backend's DeepEP version
        removed its API or a capability the property needs (``removed``, :meth:`BackendSpec.version_excludes`: the
        version's own reason, e.g. "DeepEP 2.5.0 removed the legacy Buffer")."""
        out: dict[str, NotChecked] = {}
        for b in backends:
            reason = self.applies_to(b.api, b.capabilities, b.name, b.class_name)
            kind = Why.CAPABILITY if b.api in self.apis else Why.API
            removed = b.version_excludes(self.needs) if b.api in self.apis else None
            if removed:
                reason, kind = removed, Why.REMOVED
            if reason is not None:
                lacks = [w for w in (b.why_lacks(need) for need in self.needs) if w] if b.api in self.apis else []
                out[b.name] = NotChecked.excluded(b.name, kind, reason + "".join(f" ({w})" for w in
                                                                                 dict.fromkeys(lacks)))
        return out

    @property
    def doc(self) -> str:
        """The property's documentation: its module's docstring (docs/properties.md and the README's catalog table
        are generated from the catalog: ``python -m conformance.docs``)."""
        module = sys.modules.get(self.module)
        return inspect.cleandoc(module.__doc__ or "") if module is not None else ""

    @property
    def number(self) -> int:
        """The NN of ``PNN-...`` (catalog order)."""
        digits = "".join(c for c in self.id.split("-", 1)[0] if c.isdigit())
        return int(digits) if digits else 1 << 30


_REGISTRY: dict[str, Property] = {}


def register(prop: Property) -> Property:
    """Add ``prop`` to the catalog and give it its pytest test (``prop.test``)."""
    if prop.id in _REGISTRY:
        raise ValueError(f"property {prop.id!r} registered twice")
    unknown = [need for need in prop.needs if need not in CAPABILITIES]
    if unknown or any(api not in APIS for api in prop.apis):
        raise ValueError(f"property {prop.id!r}: unknown capabilities {unknown} or APIs {prop.apis}; capabilities: "
                         f"{', '.join(CAPABILITIES)}; APIs: {', '.join(APIS)}")
    import pytest

    @pytest.mark.conformance_property(prop.id)
    def test(conformance: Any) -> None:
        conformance.run_property(prop)  # the session of this worker (``conformance`` fixture)

    test.__doc__ = prop.title
    caller = inspect.currentframe()
    module = caller.f_back.f_globals.get("__name__", "") if caller is not None and caller.f_back else ""
    entry = Property(**{**prop.__dict__, "test": test, "module": prop.module or module,
                        "needs": tuple(Capability(need) for need in prop.needs)})
    _REGISTRY[prop.id] = entry
    return entry


def catalog() -> dict[str, Property]:
    """Every property, in catalog order (imports every property module once)."""
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("test_p"):
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(sorted(_REGISTRY.items(), key=lambda item: (item[1].number, item[0])))


def module_files() -> dict[str, str]:
    """``{property id: the file of its module}`` (what a pytest run names to select it)."""
    out = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("test_p"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            prop = getattr(module, "PROPERTY", None)
            if isinstance(prop, Property) and module.__file__:
                out[prop.id] = module.__file__
    return out


@dataclass(frozen=True)
class Selection:
    """A property against the run's backends, asked once per example: the property and the backends it does not
    check (name -> why: :meth:`Property.exclusions`).  (The pairs a check compares are the check context's
    ``pairs``.)"""

    prop: Property
    excluded: dict[str, NotChecked]
    backends: tuple[BackendSpec, ...]


def select(property_id: str, backends: Iterable[BackendSpec]) -> Selection:
    """:func:`by_id`'s property against ``backends`` (see :class:`Selection`)."""
    prop = by_id(property_id)
    backends = tuple(backends)
    return Selection(prop, prop.exclusions(backends), backends)


def by_id(property_id: str) -> Property:
    """One property (``KeyError`` if none has this id); imports the catalog only when it is not loaded yet: a
    lookup per example must not walk the package (``catalog()`` costs ~6 ms)."""
    prop = _REGISTRY.get(property_id)
    return prop if prop is not None else catalog()[property_id]


