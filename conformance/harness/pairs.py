"""Which backends a property's check compares with each other: the pairs of the report's columns (``a vs b``).

Asked by the session (the check context's ``pairs``) for the backends that returned results on an example.
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.core.spec import IMPLS, BackendSpec


def family_of(spec: BackendSpec) -> str:
    """The wrapper ``spec`` is one path of: a plug-in's declared family (default its name); the built-in backends of
    one implementation (``real``, ``emulated``) form one family each."""
    if spec.plugin:
        return spec.family or spec.name
    return spec.name if spec.substitute else spec.impl


def compared_pairs(names: Sequence[str], specs: Sequence[BackendSpec]) -> list[tuple[str, str]]:
    """The pairs of ``names`` (backends with results, in the selection's order) a property compares with each other,
    each ``(reference, other)``; only pairs that mean something:

    1. the emulation's fidelity: a real backend and the emulated one of its API (``real-v1 vs emulated-v1``);
    2. a wrapper (a plug-in) or a class backend and the raw backend of its API under it (the real one where it sees
       the real deep_ep, else the emulated one): ``emulated-v2 vs megatron-fused-a2a-v2``;
    3. the migration: the V1 and V2 members of one family (``real-v1 vs real-v2``; a wrapper's two paths); for the
       built-in backends the real family where it has both APIs, else the emulated one;
    4. a backend in no pair yet is compared with the one before it in the selection (so nothing goes unpaired).
    """
    by_name = {spec.name: spec for spec in specs}
    present = [by_name[n] for n in names if n in by_name]
    pairs: list[tuple[str, str]] = []

    def add(first: BackendSpec | None, other: BackendSpec | None) -> None:
        if first is None or other is None or first.name == other.name:
            return
        if (first.name, other.name) not in pairs and (other.name, first.name) not in pairs:
            pairs.append((first.name, other.name))

    builtin = {(s.impl, s.api): s for s in present if s.impl in IMPLS}
    for spec in present:
        if spec.impl == "real":
            add(spec, builtin.get(("emulated", spec.api)))
    for spec in present:
        if spec.plugin or spec.substitute:
            under = ("real" if spec.real else "emulated", spec.api)
            add(builtin.get(under) or builtin.get(("emulated" if spec.real else "real", spec.api)), spec)
    families: dict[str, dict[str, BackendSpec]] = {}
    for spec in present:
        families.setdefault(family_of(spec), {}).setdefault(spec.api, spec)
    real_complete = len(families.get("real", {})) == 2
    for family, members in families.items():
        if family == "emulated" and real_complete:
            continue
        add(members.get("v1"), members.get("v2"))
    paired = {name for pair in pairs for name in pair}
    for first, name in zip(names, names[1:], strict=False):
        if name not in paired or first not in paired:
            if (first, name) not in pairs and (name, first) not in pairs:
                pairs.append((first, name))
            paired.update((first, name))
    return pairs
