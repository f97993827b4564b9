"""Name the library call a rank is in, and record which parameters the suite's calls gave the library.

:func:`trace_classes` wraps the public methods (and constructors) of a deep_ep-like module's classes, in the rank
process only.  Each call of a buffer class runs inside :func:`conformance.world.rank.current_call`: when it kills
the process (a segfault in the library's C++) or hangs, the controller reads the name back and says, e.g.,
``rank 1 by SIGSEGV in ElasticBuffer.__init__ [real-v2]``.  The wrappers keep the wrapped functions' signatures
(``functools.wraps``), so the API surface property sees the library's own.

Every traced call (of ``Buffer``, ``ElasticBuffer``, ``EventOverlap`` and ``EPHandle``) also adds one entry to
:data:`CALLS`: the backend, ``Class.method``, the parameters it was *given* (rule below), whether it returned or
raised, and the traced call it was made from (the library calling itself, e.g. ``Buffer.dispatch`` forwarding to
``Buffer.internode_dispatch`` on several nodes, or constructing its ``EventOverlap``).  The set stays in the rank
process; :func:`drain` hands it over and empties it (the controller collects it with one small task at the end
of each property: ``conformance.tasks.coverage``), so nothing travels per call.

A parameter is *given* when the call passed it (positionally or by keyword) with a value other than its default:
a required parameter whenever it is passed; an optional one when ``value is not default`` and not (same type and
``==``) -- so ``async_finish=False``, ``num_sms=0`` or ``previous_event=None`` spelled out is *not* given, and
``do_cpu_sync=True`` (default ``None``) is.  Values are compared by identity and, for a scalar default, by type and
equality only: a tensor is never compared by value.  The cost is a loop over the passed arguments and one set
insertion per call (a few microseconds; the library calls take far longer).
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any

from conformance.core.ids import CallId
from conformance.world.rank import current_call

#: The classes traced, with the API each belongs to (``None``: shared by both APIs, or built by the library itself;
#: not named as the rank's current call, which stays the buffer call that uses them).
TRACED: dict[str, str | None] = {"Buffer": "v1", "ElasticBuffer": "v2", "EPBuffer": "v2", "EventOverlap": None,
                                 "EPHandle": None}
#: Dunder methods that are part of the API (``EventOverlap`` is a context manager and a callable).
DUNDERS = ("__init__", "__call__", "__enter__", "__exit__")
_traced: set[int] = set()
#: ``(impl, "Class.method") -> len(result)`` of every traced call that returned a tuple in this rank process (the
#: API surface records it: a changed return arity breaks every caller that unpacks).
RETURN_ARITY: dict[tuple[str, str], int] = {}
#: ``(backend, "Class.method", given parameters, returned, enclosing "Class.method" or None)`` of every traced call
#: since the last :func:`drain` (module docstring).
CALLS: set[tuple[str, str, frozenset[str], bool, str | None]] = set()
_stack: list[str] = []
_REQUIRED = inspect.Parameter.empty

#: Attribute of a traced wrapper holding the function it calls (a planted defect replaces that, so the trace
#: stays outermost, as around the real library's code).
TARGET = "__traced_target__"


def drain() -> list[tuple[str, str, frozenset[str], bool, str | None]]:
    """The calls recorded since the last drain (sorted), forgetting them."""
    calls = sorted(CALLS, key=lambda c: (c[0], c[1], sorted(c[2]), c[3], c[4] or ""))
    CALLS.clear()
    return calls


def _parameters(function: Any, bound: bool) -> tuple[tuple[str, ...], dict[str, Any], str | None]:
    """The positional parameter names (after ``self``/``cls`` when ``bound``), every parameter's default
    (``_REQUIRED`` when it has none) and the ``*args`` name, if any."""
    params = list(inspect.signature(function).parameters.values())
    if bound and params:
        params = params[1:]
    positional = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    var = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), None)
    return positional, {p.name: p.default for p in params}, var


def _given(value: Any, default: Any) -> bool:
    if default is _REQUIRED:
        return True
    return not (value is default or (type(value) is type(default) and value == default))


def _traced_function(function: Any, name: str, bound: bool, named: bool) -> Any:
    impl, method = CallId.parse(name) or (name, "")
    positional, defaults, var = _parameters(function, bound)
    skip = 1 if bound else 0

    @functools.wraps(function)
    def traced(*args: Any, **kwargs: Any) -> Any:
        given = []
        for index in range(skip, len(args)):
            at = index - skip
            param = positional[at] if at < len(positional) else (var or "*args")
            if _given(args[index], defaults.get(param, _REQUIRED)):
                given.append(param)
        for param, value in kwargs.items():
            if _given(value, defaults.get(param, _REQUIRED)):
                given.append(param)
        outer = _stack[-1] if _stack else None
        _stack.append(method)
        returned = False
        try:
            if named:
                with current_call(name):
                    result = getattr(traced, TARGET)(*args, **kwargs)
            else:
                result = getattr(traced, TARGET)(*args, **kwargs)
            returned = True
        except TypeError as exc:
            if exc.__traceback__ is not None and exc.__traceback__.tb_next is None:  # raised entering the callee:
                exc.conformance_raiser = "callee"  # type: ignore[attr-defined]  # its signature refused the arguments
            raise
        finally:
            _stack.pop()
            CALLS.add((impl, method, frozenset(given), returned, outer))
        if isinstance(result, tuple):
            RETURN_ARITY[(impl.rsplit("-", 1)[0], method)] = len(result)
        return result

    setattr(traced, TARGET, function)
    return traced


def _class_of(module: ModuleType, class_name: str) -> type | None:
    cls = getattr(module, class_name, None)
    if cls is None and class_name == "EventOverlap":  # deep_ep.utils.event
        cls = getattr(getattr(getattr(module, "utils", None), "event", None), class_name, None)
    return cls if isinstance(cls, type) else None


def trace_classes(module: ModuleType, impl: str) -> None:
    """Trace every public method, the constructor and the API's dunders of ``module``'s :data:`TRACED` classes
    (once; inherited methods are traced in the class that defines them, so a planted defect there stays inside)."""
    for class_name, api in TRACED.items():
        cls = _class_of(module, class_name)
        if cls is None or id(cls) in _traced:
            continue
        _traced.add(id(cls))
        backend = f"{impl}-{api}" if api else impl
        for attr in dir(cls):
            if attr.startswith("_") and attr not in DUNDERS:
                continue
            owner = next((k for k in cls.__mro__ if attr in vars(k)), object)
            if owner is object:
                continue
            value = vars(owner)[attr]
            name = str(CallId(backend, f"{class_name}.{attr}"))
            if isinstance(value, staticmethod | classmethod):
                if not hasattr(value.__func__, TARGET):
                    wrapped = _traced_function(value.__func__, name, isinstance(value, classmethod), api is not None)
                    setattr(owner, attr, type(value)(wrapped))
            elif callable(value) and not isinstance(value, type) and not hasattr(value, TARGET):
                setattr(owner, attr, _traced_function(value, name, True, api is not None))
