"""The house rules, checked by walking every import of the package (module level and inside functions).

Layers, lowest first; a module may import its own layer or lower ones, never a higher one.  So the rank side
never loads the controller's modules (checks, strategies, the oracle), and the emulation knows nothing of the
suite.  There is no import cycle between modules.  (docs/architecture.md draws the same picture.)
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest

#: Its module-scoped fixtures are built once: under xdist (the self-tests run with -n) its tests share a worker.
pytestmark = pytest.mark.xdist_group("test_architecture")

ROOT = Path(__file__).resolve().parents[2] / "conformance"


@functools.cache
def source_of(path: Path) -> str:
    """``path``'s text, read once per session (every rule reads every module)."""
    return path.read_text()


@functools.cache
def nodes_of(source: str) -> tuple[ast.AST, ...]:
    """Every node of ``source``'s syntax tree, parsed and walked once per session."""
    return tuple(ast.walk(ast.parse(source)))

#: (layer, module prefixes), lowest first.  The longest matching prefix decides a module's layer.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("the package", ("conformance",)),  # its __init__ imports nothing
    ("the library's versions", ("conformance.versions",)),  # per-version data: the emulation reads it too
    ("the library model", ("conformance.emulation",)),
    ("shared data", ("conformance.core", "conformance.world", "conformance.world.errors", "conformance.tools")),
    ("rank side", ("conformance.world.rank", "conformance.backends", "conformance.tasks", "conformance.mutants",
                   "conformance.integrations", "conformance.serve")),
    ("controller foundations", ("conformance.oracle", "conformance.strategies", "conformance.canonical",
                                "conformance.assertions", "conformance.world.launcher")),
    ("shared checks", ("conformance.checks",)),  # what several properties assert: never a property module
    ("properties", ("conformance.properties",)),
    ("harness", ("conformance.harness", "conformance.reporting", "conformance.mutation", "conformance.repro",
                 "conformance.docs", "conformance.new_property",
                 "conformance.plugin")),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    best, layer = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), index
    assert layer is not None, f"{module} is in no layer: add it to LAYERS"
    return layer


def imports_of(path: Path, module: str | None = None) -> set[str]:
    """The ``conformance.*`` modules ``path`` imports (``from a import b``: ``a.b`` if it is a module, else ``a``)."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes_of(source_of(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            subs = [f"{base}.{alias.name}" for alias in node.names]
            modules = [sub for sub in subs if sub in MODULES]
            found.update(modules)
            if len(modules) < len(subs):  # names taken from ``base`` itself
                found.add(base)
    return {name for name in found if name == "conformance" or name.startswith("conformance.")}


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def resolved(name: str) -> str | None:
    """``name`` if it is a module of the package (else ``None``: a function or class imported from one)."""
    return name if name in MODULES else None


def explicit_graph() -> dict[str, set[str]]:
    """module -> the package modules it names in an import."""
    return {module: {t for t in map(resolved, imports_of(path)) if t and t != module}
            for module, path in MODULES.items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """module -> every package module importing it loads: the ones it names and their parent packages."""
    out = {}
    for module, targets in explicit_graph().items():
        parents = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
        out[module] = targets | {p for p in parents if p in MODULES and p != module}
    return out


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_a_higher_layer(graph: dict[str, set[str]]) -> None:
    upward = [f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
              for module, targets in sorted(graph.items()) for target in sorted(targets)
              if layer_of(target) > layer_of(module)]
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_the_rank_side_never_loads_the_controller(graph: dict[str, set[str]]) -> None:
    """Everything a rank task can reach (transitively) is at most rank side."""
    rank_side = max(i for i, (name, _) in enumerate(LAYERS) if name == "rank side")
    for start in (m for m in MODULES if layer_of(m) <= rank_side):
        seen, todo = set(), [start]
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            assert layer_of(module) <= rank_side, f"{start} reaches the controller module {module}"
            todo.extend(graph[module])


def test_no_import_cycle() -> None:
    """(Between the modules named in imports: a package's ``__init__`` importing its own modules is not a cycle.)"""
    graph = explicit_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_the_rule_checker_sees_a_planted_upward_import(tmp_path: Path) -> None:
    """Meta-test: an import from the rank side up into the properties is reported."""
    planted = tmp_path / "planted.py"
    planted.write_text("def task():\n    from ..properties import catalog\n")
    targets = {t for t in map(resolved, imports_of(planted, "conformance.tasks.planted")) if t}
    assert targets == {"conformance.properties"}
    assert layer_of("conformance.properties") > layer_of("conformance.tasks.planted")


def test_property_ids_read_from_source_match_the_catalog() -> None:
    """An interrupted xdist controller reports the catalog read from the modules' source (importing them costs
    seconds); it must be the catalog."""
    from conformance.core.ids import ids_from_source
    from conformance.properties import catalog

    assert ids_from_source() == list(catalog())



def property_import_offenders(modules: dict[str, Path]) -> list[str]:
    """Each import of a property module that names another property module, or an emulation module whose name
    starts with ``_`` (the emulation's private model)."""
    offenders = []
    for module, path in modules.items():
        if not module.startswith("conformance.properties.test_p"):
            continue
        for target in sorted(imports_of(path, module)):
            if target.startswith("conformance.properties.test_p") and target != module:
                offenders.append(f"{module} imports the property module {target}")
            if target.startswith("conformance.emulation") and any(
                    part.startswith("_") for part in target.split(".")[2:]):
                offenders.append(f"{module} imports the emulation's private module {target}")
    return offenders


def test_a_property_module_imports_no_other_property_and_no_private_emulation_module() -> None:
    """A property module reads the checks it shares from ``conformance.checks`` and the library's per-version data
    from ``conformance.versions``: never another property module (a check living in another property's module), nor
    the emulation's private modules."""
    assert not property_import_offenders(MODULES), "\n".join(property_import_offenders(MODULES))


def test_the_property_import_rule_sees_planted_imports(tmp_path: Path) -> None:
    planted = tmp_path / "test_p99_planted.py"
    planted.write_text("from conformance.properties.test_p06_round_trip import PROPERTY\n"
                       "from conformance.emulation._refusals import table\n"
                       "from conformance.checks.round_trip import check\n")
    found = property_import_offenders({"conformance.properties.test_p99_planted": planted})
    assert len(found) == 2 and "test_p06_round_trip" in found[1] and "_refusals" in found[0], found


#: The separators of a pair column and of a call id (conformance/core/ids.py builds and reads both).
ID_SEPARATORS = (" vs ", "|")
ID_MODULE = "conformance.core.ids"


def id_string_offenders(source: str, where: str) -> list[str]:
    """Each place in ``source`` that builds or reads a pair column or a call id by hand: a split, partition or
    ``in`` test on a separator, a join with the pair separator, or an f-string that is just ``{a} vs {b}`` or
    ``{a}|{b}``."""
    found = []
    for node in nodes_of(source):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if node.func.attr in ("split", "rsplit", "partition", "rpartition") and set(args) & set(ID_SEPARATORS):
                found.append(f"{line}: .{node.func.attr}({args[0]!r})")
            receiver = node.func.value
            if node.func.attr == "join" and isinstance(receiver, ast.Constant) and receiver.value == " vs ":
                found.append(f"{line}: ' vs '.join")
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                node.left.value in ID_SEPARATORS and all(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            found.append(f"{line}: {node.left.value!r} in ...")
        elif isinstance(node, ast.JoinedStr) and len(node.values) == 3 and \
                isinstance(node.values[1], ast.Constant) and node.values[1].value in ID_SEPARATORS and \
                all(isinstance(v, ast.FormattedValue) for v in (node.values[0], node.values[2])):
            found.append(f"{line}: f'{{...}}{node.values[1].value}{{...}}'")
    return found


def test_pair_columns_and_call_ids_are_built_and_read_in_one_module() -> None:
    """Typed ids: a pair column is ``conformance.core.ids.Pair``, a call id ``CallId``; no other module splits,
    joins or formats them by hand (they are strings only in the tally, the report and the messages)."""
    offenders = [o for module, path in MODULES.items() if module != ID_MODULE
                 for o in id_string_offenders(source_of(path), module)]
    assert not offenders, "\n".join(offenders)


def test_the_id_rule_sees_planted_hand_made_ids() -> None:
    planted = ('a, b = column.split(" vs ")\nbackend = call.partition("|")[0]\nif " vs " in name: pass\n'
               'name = f"{a} vs {b}"\ncall = f"{backend}|{op}"\ncol = " vs ".join(w)\n'
               'fine = f"{got} vs {want} [{call}]"\ntext = text.replace("|", "-")\n')
    assert len(id_string_offenders(planted, "planted")) == 6, id_string_offenders(planted, "planted")


def test_verdicts_and_statuses_are_defined_once() -> None:
    """The verdict and status lists the tally, the severity ranking and the matrix use are
    ``conformance.core.outcomes``' (three hand-kept tuples before); a verdict is a status too."""
    from conformance.core import outcomes
    from conformance.harness import verdicts
    from conformance.reporting import report

    assert report.VERDICT_ORDER is outcomes.VERDICTS and report.STATUSES is outcomes.STATUSES
    assert verdicts.SUITE_ERROR == outcomes.Verdict.SUITE_ERROR == "suite-error"
    assert set(outcomes.VERDICTS) <= set(outcomes.STATUSES)
    literal = [o for module, path in MODULES.items() if module != "conformance.core.outcomes"
               for o in _status_tuples(source_of(path), module)]
    assert not literal, "a hand-kept list of verdicts or statuses:\n" + "\n".join(literal)


def _status_tuples(source: str, where: str) -> list[str]:
    """Tuples or lists of three or more string constants that are all verdict or status names."""
    from conformance.core.outcomes import STATUSES

    found = []
    for node in nodes_of(source):
        if isinstance(node, ast.Tuple | ast.List) and len(node.elts) >= 3 and all(
                isinstance(e, ast.Constant) and e.value in STATUSES for e in node.elts):
            found.append(f"{where}:{node.lineno}")
    return found


def test_the_status_list_rule_sees_a_planted_hand_kept_list() -> None:
    planted = ('HOLDS = ("passed", "divergence", "unsupported")\nfine = ("passed", "other", "failed")\n'
               'pair = ("passed", "failed")\n')
    assert _status_tuples(planted, "planted") == ["planted:1"]


#: Verdict and status names that mean nothing else in the suite's code (``passed`` and ``failed`` also name other
#: things: a known defect's sightings, a job's count).
UNAMBIGUOUS = ("known-defect", "suite-error", "divergence", "unsupported", "not-run")


def _verdict_literals(source: str, where: str) -> list[str]:
    """String constants naming a verdict or status (:data:`UNAMBIGUOUS`) that a comparison or a ``return`` uses:
    the code decides by them, so it names ``Verdict``'s or ``Status``' member."""
    found = []
    for node in nodes_of(source):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else \
            [node.value] if isinstance(node, ast.Return) and node.value is not None else []
        for operand in operands:
            for leaf in (operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]):
                if isinstance(leaf, ast.Constant) and leaf.value in UNAMBIGUOUS:
                    found.append(f"{where}:{leaf.lineno} {leaf.value!r}")
    return found


def test_code_outside_the_report_decides_by_verdict_members_not_strings() -> None:
    """Outside the report's edge (``conformance.reporting``: JSON, Markdown, HTML, old reports) and the outcomes'
    own module, a comparison or a ``return`` names a verdict or status by its member, never its string."""
    offenders = [o for module, path in MODULES.items()
                 if not module.startswith("conformance.reporting") and module != "conformance.core.outcomes"
                 for o in _verdict_literals(source_of(path), module)]
    assert not offenders, "\n".join(offenders)


def test_the_verdict_literal_rule_sees_planted_strings() -> None:
    planted = ('def f(s):\n    if s.status == "known-defect": return "unsupported"\n'
               '    if s in ("failed", "suite-error"): pass\n    key = {"unsupported": 1}\n'
               '    return Verdict.PASSED\n')
    assert _verdict_literals(planted, "p") == ["p:2 'known-defect'", "p:2 'unsupported'", "p:3 'suite-error'"], \
        _verdict_literals(planted, "p")


#: What drives Hypothesis (makes and runs a test over draws): only ``conformance.harness.hypothesis_glue`` imports
#: these; strategies, state machines' rules and Hypothesis' errors are vocabulary, imported anywhere.
HYPOTHESIS_DRIVERS = {"given", "settings", "seed", "find", "example", "run_state_machine_as_test", "Phase",
                      "HealthCheck"}
GLUE = "conformance.harness.hypothesis_glue"


def hypothesis_driver_imports(source: str, where: str) -> list[str]:
    """Each import in ``source`` of a name that drives Hypothesis (:data:`HYPOTHESIS_DRIVERS`), or of
    ``hypothesis`` itself."""
    found = []
    for node in nodes_of(source):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hypothesis":
            found += [f"{where}:{node.lineno}: {alias.name}" for alias in node.names
                      if alias.name in HYPOTHESIS_DRIVERS]
        elif isinstance(node, ast.Import):
            found += [f"{where}:{node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name.split(".")[0] == "hypothesis"]
    return found


def test_hypothesis_is_driven_from_one_place() -> None:
    """The property tests' draws, the kill matrix's and the meta-tests' helpers (tests/helpers/meta.py) are all built by
    ``conformance.harness.hypothesis_glue`` (settings, seeding, explicit cases, the example database)."""
    places = {**{m: p for m, p in MODULES.items() if m != GLUE},
              "tests.helpers.meta": ROOT.parent / "tests" / "helpers" / "meta.py"}
    offenders = [o for module, path in places.items() for o in hypothesis_driver_imports(source_of(path), module)]
    assert not offenders, "\n".join(offenders)


def test_the_hypothesis_rule_sees_planted_drivers() -> None:
    planted = ("from hypothesis import given, settings, strategies as st\nimport hypothesis\n"
               "from hypothesis.stateful import rule, run_state_machine_as_test\nfrom hypothesis.errors import Flaky\n")
    assert len(hypothesis_driver_imports(planted, "planted")) == 4, hypothesis_driver_imports(planted, "planted")


RUN_MENTION = re.compile(r"\bruns? \d+[a-z]?\b")


def history_offenders(source: str, where: str) -> list[str]:
    """Each comment or string of ``source`` that names a run of the real library ("run 21") without citing where
    it is kept (``docs/real-runs``): history belongs in docs/real-runs/README.md, the code says what and why."""
    found = [f"{where}:{token.start[0]}: {token.string.strip()[:80]}"
             for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type == tokenize.COMMENT and RUN_MENTION.search(token.string)
             and "docs/real-runs" not in token.string]
    found += [f"{where}:{node.lineno}: {node.value.strip()[:80]!r}" for node in nodes_of(source)
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and RUN_MENTION.search(node.value)
              and "docs/real-runs" not in node.value]
    return found


def test_code_keeps_no_history_of_runs() -> None:
    """No comment or string of the package tells which run showed something ("run 21 on one H200") unless it cites
    docs/real-runs/ (a property's evidence, a setup limit's): the table "What the code keeps from these runs" in
    docs/real-runs/README.md holds that."""
    offenders = [o for module, path in MODULES.items() for o in history_offenders(source_of(path), module)]
    assert not offenders, "\n".join(offenders)


def test_the_history_rule_sees_planted_history() -> None:
    planted = ('x = 1  # seen in run 21 on one H200\ny = "fixed after runs 20c and 21"\n'
               'z = "held (docs/real-runs/, run 10b)"  # see docs/real-runs, run 12\nw = "a run of 3 examples"\n')
    assert len(history_offenders(planted, "planted")) == 2, history_offenders(planted, "planted")
