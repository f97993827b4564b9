"""Mutants patch named seams only (``conformance/emulation/seams.py``, ``conformance/backends/seams.py``).

(a) Activated in this process, every registered mutant changes nothing of the emulation's modules and classes, nor
    of the adapters' modules and classes, but declared seams, and leaves nothing changed on exit.  The same holds
    with the library's classes traced, as in a rank process (a subprocess: tracing is for the process's life).
(b) Every seam is patched by at least one mutant, or its seams module says why not; every declared seam exists.
(c) The mutant modules reach the emulation through the seams only: no patching of their own (``unittest.mock``,
    ``setattr``, ``vars`` / ``__dict__``, an assignment to an attribute of an imported name), no private name
    (``x._y``, an import of ``_z``).  (a) cannot see a patch made while a call runs; (c) forbids the means.
(d) (a) and (c) fail on planted violations, and the helper refuses a name that is not a seam.
"""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

import pytest

import conformance.emulation as emulation
from conformance.backends import seams as adapter_seams
from conformance.backends.tracing import TARGET
from conformance.emulation import seams as emulation_seams
from conformance.mutants import activate, load_catalog
from conformance.mutants.patching import seam
from tests.conftest import ROOT

#: Its module-scoped fixtures are built once: under xdist (the self-tests run with -n) its tests share a worker.
pytestmark = pytest.mark.xdist_group("test_mutant_seams")

#: The modules whose attributes (and whose classes' attributes) only seams may change.
SCOPES = ("conformance.emulation", "conformance.backends")
#: The call-seam registry itself: compared seam by seam, not as a dict.
REGISTRY = ("conformance.emulation.seams", "_current")
MUTANTS_DIR = ROOT / "conformance" / "mutants"
#: Modules of conformance/mutants that are not catalog modules: the registry and the patching helpers.
HELPERS = ("__init__.py", "registry.py", "patching.py")

Key = tuple[str, str]


# ------------------------------------------------------------------------------------------------ snapshots
def _fingerprint(value: Any) -> Any:
    """What must stay the same for ``value`` to count as untouched: its identity, a traced function's target, a
    container's entries (by identity)."""
    if isinstance(value, staticmethod | classmethod):
        return type(value).__name__, _fingerprint(value.__func__)
    target = getattr(value, TARGET, None) if callable(value) else None
    if isinstance(value, dict):
        return id(value), tuple((id(k), id(v)) for k, v in list(value.items()))
    if isinstance(value, list | tuple):
        return id(value), tuple(id(v) for v in value)
    if isinstance(value, set | frozenset):
        return id(value), frozenset(id(v) for v in value)
    return id(value), id(target)


def _modules() -> list[tuple[str, Any]]:
    return sorted((name, module) for name, module in list(sys.modules.items()) if module is not None
                  and any(name == scope or name.startswith(scope + ".") for scope in SCOPES))


def snapshot() -> dict[Key, Any]:
    """Every attribute of the scoped modules and of the classes they define, and every call seam's implementation."""
    state: dict[Key, Any] = {}
    for name, module in _modules():
        for attribute, value in list(vars(module).items()):
            if (name, attribute) != REGISTRY:
                state[(name, attribute)] = _fingerprint(value)
            if isinstance(value, type) and value.__module__ == name:
                for member, inner in list(vars(value).items()):
                    state[(f"{name}.{value.__qualname__}", member)] = _fingerprint(inner)
    for call in emulation_seams.declared():
        state[("seam", call)] = id(emulation_seams.current(call))
    return state


def _where(owner: Any, attribute: str) -> Key:
    return (f"{owner.__module__}.{owner.__qualname__}", attribute)


def seam_of() -> dict[Key, str]:
    """Snapshot key -> the seam that may change it (entry points and adapter seams: the attribute they patch)."""
    keys = {("seam", call): call for call in emulation_seams.CALLS}
    for name in emulation_seams.ENTRY_POINTS:
        if name != "deep_ep":
            keys[_where(*emulation_seams.entry_point(emulation, name))] = name
    for name in adapter_seams.SEAMS:
        keys[_where(*adapter_seams.resolve(name))] = name
    return keys


def _seam_for(key: Key, keys: dict[Key, str]) -> str | None:
    if key in keys:
        return keys[key]
    where, attribute = key
    if where == emulation.__name__ and not attribute.startswith("_") and not isinstance(
            getattr(emulation, attribute, None), type(emulation)):
        return "deep_ep"  # a public name of the package (not one of its modules)
    return None


def changes(patch: Callable[[], AbstractContextManager[None]]) -> tuple[set[str], list[str]]:
    """The seams ``patch()`` changes while active, and what it changes that is no seam (or leaves changed)."""
    keys = seam_of()
    before = snapshot()
    with patch():
        inside = snapshot()
    after = snapshot()
    changed = {k for k in before.keys() | inside.keys() if before.get(k) != inside.get(k)}
    patched = {s for s in (_seam_for(k, keys) for k in changed) if s is not None}
    problems = [f"patches {'.'.join(k)}, which is no seam" for k in sorted(changed) if _seam_for(k, keys) is None]
    problems += [f"leaves {'.'.join(k)} changed on exit"
                 for k in sorted(before.keys() | after.keys()) if before.get(k) != after.get(k)]
    return patched, problems


def every_mutant() -> tuple[dict[str, set[str]], list[str]]:
    """Per registered mutant, the seams it patches; and every problem found (``mutant: problem``)."""
    patched, problems = {}, []
    for name in sorted(load_catalog()):
        patched[name], found = changes(lambda name=name: activate(name))
        problems += [f"{name}: {p}" for p in found]
    return patched, problems


@pytest.fixture(scope="module")
def catalog_changes() -> tuple[dict[str, set[str]], list[str]]:
    return every_mutant()


# ---------------------------------------------------------------------------------------------------- (a)
def test_every_mutant_patches_declared_seams_only(catalog_changes) -> None:
    patched, problems = catalog_changes
    assert len(patched) == len(load_catalog()) > 90
    assert not problems, "\n".join(problems)
    assert all(patched.values()), f"mutants that patch nothing: {[n for n, s in patched.items() if not s]}"


def test_the_same_with_the_library_traced_as_in_a_rank_process() -> None:
    code = ("from conformance.backends.tracing import trace_classes\nimport conformance.emulation as e\n"
            "trace_classes(e, 'emulated')\nfrom tests.quality.test_mutant_seams import every_mutant\n"
            "patched, problems = every_mutant()\nprint(len(patched), 'mutants')\nprint('\\n'.join(problems))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    count, _, problems = run.stdout.partition(" mutants\n")
    assert int(count) == len(load_catalog()) and not problems.strip(), problems


# ---------------------------------------------------------------------------------------------------- (b)
def test_every_seam_exists_and_is_patched_by_a_mutant_or_says_why_not(catalog_changes) -> None:
    assert emulation_seams.declared() == set(emulation_seams.CALLS), "a declared call seam has no @seam function"
    seam_of()  # every entry point and adapter seam resolves to an attribute
    patched = set().union(*catalog_changes[0].values())
    unpatched = {**emulation_seams.UNPATCHED, **adapter_seams.UNPATCHED}
    every = {*emulation_seams.CALLS, *emulation_seams.ENTRY_POINTS, *adapter_seams.SEAMS}
    assert not every - patched - set(unpatched), f"seams no mutant patches: {sorted(every - patched - set(unpatched))}"
    assert not set(unpatched) - every, f"UNPATCHED names no seam: {sorted(set(unpatched) - every)}"
    assert not set(unpatched) & patched, f"UNPATCHED, yet patched: {sorted(set(unpatched) & patched)}"


# ---------------------------------------------------------------------------------------------------- (c)
def _imported_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def reaching_past_seams(source: str) -> list[str]:
    """How the source of a mutant module patches or reaches the emulation other than through a seam."""
    tree = ast.parse(source)
    imported = _imported_names(tree)
    found = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else ""
            names = [module or ""] + [alias.name for alias in node.names]
            if any(n == "unittest.mock" or n.startswith("unittest.mock.") or (module == "unittest" and n == "mock")
                   for n in names):
                found.append(f"{where}: imports unittest.mock")
            if any(part.startswith("_") and part != "__future__" for n in names for part in n.split(".")):
                found.append(f"{where}: imports a private name ({', '.join(names)})")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "setattr", "delattr", "vars"):
            found.append(f"{where}: calls {node.func.id}()")
        elif isinstance(node, ast.Attribute):
            private = node.attr.startswith("_") and not (node.attr.startswith("__") and node.attr.endswith("__"))
            if private or node.attr in ("__dict__", "__setattr__", "__delattr__"):
                found.append(f"{where}: reaches {node.attr}")
        targets = (node.targets if isinstance(node, ast.Assign) else node.targets if isinstance(node, ast.Delete)
                   else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in imported:
                found.append(f"{where}: assigns {target.value.id}.{target.attr}")
    return found


def test_mutant_modules_reach_the_emulation_through_seams_only() -> None:
    modules = sorted(p for p in MUTANTS_DIR.glob("*.py") if p.name not in HELPERS)
    assert len(modules) >= 10
    problems = [f"{p.name} {problem}" for p in modules for problem in reaching_past_seams(p.read_text())]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------- (d)
@contextlib.contextmanager
def _patches_a_private_function() -> Iterator[None]:
    from conformance.emulation import _route

    with mock.patch.object(_route, "count_per_local_expert", lambda idx, n: [0] * n):
        yield


@contextlib.contextmanager
def _patches_a_private_method() -> Iterator[None]:
    from conformance.emulation import Buffer

    with mock.patch.object(Buffer, "_exchange", lambda *a, **kw: None):
        yield


@contextlib.contextmanager
def _edits_private_state() -> Iterator[None]:
    from conformance.emulation.utils import event

    event._pending.append(event._Work(lambda: None))  # work queued for ever on the emulated side stream
    yield


@contextlib.contextmanager
def _through_the_seam() -> Iterator[None]:
    with seam("count_per_local_expert", lambda original, idx, n: [0] * n):
        yield


def test_a_mutant_that_patches_anything_but_a_seam_is_caught() -> None:
    patched, problems = changes(_patches_a_private_function)
    assert patched == set() and problems == [
        "patches conformance.emulation._route.count_per_local_expert, which is no seam"]
    assert changes(_patches_a_private_method)[1] == [
        "patches conformance.emulation.legacy.Buffer._exchange, which is no seam"]
    _, problems = changes(_edits_private_state)
    from conformance.emulation.utils import event

    event._pending.clear()
    assert problems == ["patches conformance.emulation.utils.event._pending, which is no seam",
                        "leaves conformance.emulation.utils.event._pending changed on exit"]
    assert changes(_through_the_seam) == ({"count_per_local_expert"}, [])


def test_a_mutant_module_that_patches_on_its_own_is_caught() -> None:
    source = ("import unittest.mock\nfrom conformance.emulation import _route, Buffer\n"
              "def receive(original, self, *a):\n"
              "    with unittest.mock.patch.object(_route, 'receive_order', None):\n"
              "        return self._ll().mask\n"
              "Buffer.dispatch = receive\nsetattr(Buffer, 'combine', receive)\n")
    assert reaching_past_seams(source) == [
        "line 1: imports unittest.mock", "line 2: imports a private name (conformance.emulation, _route, Buffer)",
        "line 6: assigns Buffer.dispatch", "line 7: calls setattr()", "line 5: reaches _ll"]


def test_the_helper_refuses_a_name_that_is_no_seam() -> None:
    for name in ("Buffer._exchange", "_route.count_per_local_expert", "ElasticBuffer._receive", "count-per-expert"):
        with pytest.raises(KeyError, match="seam"), seam(name, lambda original, *a, **kw: None):
            pass
