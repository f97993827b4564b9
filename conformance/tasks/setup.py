"""The rank side of the set-up limits (``conformance/core/setup_limits.py``): a task about to build a buffer asks
:func:`refuse_if_limited` first, which raises :class:`SetupLimited` (a ``NotSupported``: the backend's ``unsupported``
result, with the limit's reason and evidence) instead of making a call that cannot work on this rank's set-up.
:func:`guarded` gives a recorder the same check on every constructor of a module."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Mapping
from typing import Any

from conformance.backends.contract import NotSupported
from conformance.core.outcomes import Why
from conformance.core.setup_limits import SETUP_LIMITS, SetupLimit, rank_setup, setup_limit


class SetupLimited(NotSupported):
    """A call a set-up limit names was not made (``limit``, on ``setup``): reported ``unsupported``."""

    why = Why.SETUP

    def __init__(self, limit: SetupLimit, setup: str) -> None:
        super().__init__(limit.reason(setup))
        self.limit, self.setup = limit, setup
        #: the configurations excluded, as the reports count them
        self.condition = f"{limit.call} with {limit.condition} on {setup} (set-up limit {limit.id})"


def refuse_if_limited(real: bool, call: str, arguments: Mapping[str, Any], setup: str | None = None) -> None:
    """Raise :class:`SetupLimited` when ``call(**arguments)`` cannot work on ``setup`` (default: this rank's) with
    the real library (``real``); return otherwise."""
    setup = setup or rank_setup()
    limit = setup_limit(setup, real, call, arguments)
    if limit is not None:
        raise SetupLimited(limit, setup)


def guarded(module: Any, real: bool, setup: str | None = None) -> Any:
    """``module`` itself where no limit can apply to it (not the real library, or a set-up without limits), else a
    copy of it whose classes named by a limit check it before constructing on ``setup`` (default: this rank's):
    subclasses with the same name, so what a recorder calls and records is unchanged where no limit applies."""
    setup = setup or rank_setup()
    names = {limit.call.partition(".")[0] for limit in SETUP_LIMITS if setup in limit.setups}
    if not real or not names:
        return module
    copy = types.ModuleType(module.__name__, module.__doc__)
    copy.__dict__.update(vars(module))
    for name in names:
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            setattr(copy, name, _guarded_class(cls, setup))
    return copy


def _guarded_class(cls: type, setup: str) -> type:
    signature = inspect.signature(cls.__init__)

    @functools.wraps(cls.__init__)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the constructor it guards
        bound = signature.bind_partial(self, *args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        refuse_if_limited(True, f"{cls.__name__}.__init__", arguments, setup)
        cls.__init__(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__qualname__": cls.__qualname__,
                                       "__module__": cls.__module__})
