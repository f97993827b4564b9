"""Name the library call a rank is in, so that a crash or a hang inside the library can be reported by name.

:func:`trace_classes` wraps the public methods (and constructors) of a deep_ep-like module's buffer classes,
in the rank process only, so that each call runs inside :func:`conformance.world.rank.current_call`.  When the
call kills the process (a segfault in the library's C++) or hangs, the controller reads the name back and
says, e.g., ``rank 1 by SIGSEGV in ElasticBuffer.__init__ [real-v2]``.  The wrappers keep the wrapped
functions' signatures (``functools.wraps``), so the API surface property sees the library's own.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from conformance.world.rank import current_call

#: The classes traced, with the API each belongs to.
TRACED = {"Buffer": "v1", "ElasticBuffer": "v2"}
_traced: set[int] = set()
#: ``(impl, "Class.method") -> len(result)`` of every traced call that returned a tuple in this rank process (the
#: API surface records it: a changed return arity breaks every caller that unpacks).
RETURN_ARITY: dict[tuple[str, str], int] = {}


#: Attribute of a traced wrapper holding the function it calls (a planted defect replaces that, so the trace
#: stays outermost, as around the real library's code).
TARGET = "__traced_target__"


def _traced_function(function: Any, name: str) -> Any:
    impl, _, method = name.partition("|")

    @functools.wraps(function)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with current_call(name):
            result = getattr(traced, TARGET)(*args, **kwargs)
        if isinstance(result, tuple):
            RETURN_ARITY[(impl.rsplit("-", 1)[0], method)] = len(result)
        return result

    setattr(traced, TARGET, function)
    return traced


def trace_classes(module: ModuleType, impl: str) -> None:
    """Trace every public method and the constructor of ``module.Buffer`` / ``module.ElasticBuffer`` (once)."""
    for class_name, api in TRACED.items():
        cls = getattr(module, class_name, None)
        if cls is None or id(cls) in _traced:
            continue
        _traced.add(id(cls))
        for attr, value in list(vars(cls).items()):
            if attr.startswith("_") and attr != "__init__":
                continue
            name = f"{impl}-{api}|{class_name}.{attr}"
            if isinstance(value, staticmethod):
                setattr(cls, attr, staticmethod(_traced_function(value.__func__, name)))
            elif isinstance(value, classmethod):
                setattr(cls, attr, classmethod(_traced_function(value.__func__, name)))
            elif callable(value) and not isinstance(value, type):
                setattr(cls, attr, _traced_function(value, name))
