"""What a run must say of a backend, derived from the catalog (never a list of ids written by hand): the properties
that check a backend of a given API and declaration, those that report it ``unsupported`` (and why), and those a
default run skips (an option's mode that is off).  A property added to the catalog is expected here at once."""

from __future__ import annotations

from dataclasses import dataclass, field

from conformance.core.spec import APIS, BackendSpec
from conformance.harness.config import RunConfig
from conformance.properties import catalog
from conformance.world.launcher import WorldShape


@dataclass(frozen=True)
class Expected:
    """Per property id: ``checked`` (a verdict of its own), ``unsupported`` (id -> the reason's key phrase: the
    contract or the capability it needs), ``skipped`` (id -> why a default run skips it)."""

    checked: tuple[str, ...]
    unsupported: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def expected_for(api: str, capabilities: frozenset[str] | set[str]) -> Expected:
    """What a default run (no ``--soak``) says of a backend following ``api`` that declares ``capabilities``."""
    default = RunConfig(WorldShape(1, 2), (BackendSpec("emulated", api),))
    checked, unsupported, skipped = [], {}, {}
    for pid, prop in catalog().items():
        mode = prop.configured(default) if prop.configured is not None else None
        if isinstance(mode, str):
            skipped[pid] = mode
        elif prop.applies_to(api, capabilities) is None:
            checked.append(pid)
        elif api not in prop.apis:
            unsupported[pid] = " or ".join(f"{a} ({APIS[a]})" for a in prop.apis) + " contract"
        else:
            unsupported[pid] = next(f"'{need}'" for need in prop.needs if need not in capabilities)
    return Expected(tuple(checked), unsupported, skipped)
