"""``python -m conformance.new_property NAME`` (issue 26): in a scratch copy of the checkout, a new property's three
files are all it takes: it is in the catalog, the README's table, docs/properties.md, the integrators' applicability
table and the self-tests' derived expectations, the doc-drift check passes, and its skeleton cannot pass: its
meta-test fails until a mutant is named."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.new_property import next_number
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

#: The scaffold's test property: the next free number, a name no property will have.
NUMBER = next_number(ROOT)
NAME = "scaffold-self-test"
PID = f"P{NUMBER}-{NAME}"
MODULE = f"test_p{NUMBER:02d}_scaffold_self_test"


def scratch_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    copy.mkdir()
    for name in ("conformance", "tests"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, copy / name)
    (copy / "docs").mkdir()
    for page in (ROOT / "docs").glob("*.md"):
        shutil.copy(page, copy / "docs" / page.name)
    return copy


def run(copy: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=copy, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=timeout)


def test_a_new_property_is_three_files_and_everything_else_follows(tmp_path: Path) -> None:
    copy = scratch_copy(tmp_path)
    before = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()}
    made = run(copy, "-m", "conformance.new_property", NAME, "--title", "a property the scaffold's self-test makes")
    assert made.returncode == 0, made.stdout + made.stderr
    created = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file() and "__pycache__" not in p.parts} - before
    assert created == {Path(f"conformance/properties/{MODULE}.py"), Path(f"tests/quality/test_p{NUMBER:02d}_meta.py"),
                       Path("conformance/strategies/scaffold_self_test.py")}
    # the generated docs were rewritten, and nothing else was touched
    changed = {p for p in before if p.suffix == ".md" and (copy / p).read_text() != (ROOT / p).read_text()}
    assert changed == {Path("README.md"), Path("docs/properties.md"), Path("docs/integrators.md")}, changed
    for page in changed:
        assert PID in (copy / page).read_text(), page
    assert run(copy, "-m", "conformance.docs").returncode == 0  # the drift check passes
    listed = run(copy, "-c", "from conformance.properties import catalog; "
                             "from tests.helpers.expectations import expected_for;"
                             "print(list(catalog())); print(expected_for('v1', {'combine'}).checked)")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count(PID) == 2, listed.stdout  # in the catalog and in what a v1 plug-in is checked by
    if importlib.util.find_spec("ruff") is not None:  # (tests/nocover/test_lint.py says so where ruff is not installed)
        linted = run(copy, "-m", "ruff", "check", "conformance", "tests")
        assert linted.returncode == 0, linted.stdout + linted.stderr
    # the skeleton cannot pass: its meta-test fails until its mutant is named, saying so
    meta = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/quality/test_p{NUMBER:02d}_meta.py", "-k",
               "catches")
    assert meta.returncode == 1 and "unknown mutant 'TODO'" in meta.stdout, meta.stdout[-3000:]


def test_a_name_taken_or_an_unknown_capability_is_refused_in_one_line(tmp_path: Path) -> None:
    copy = scratch_copy(tmp_path)
    taken = run(copy, "-m", "conformance.new_property", "x", "--number", "2")
    assert taken.returncode == 2 and "P2 is taken (test_p02_counts.py)" in taken.stderr, taken.stderr
    wrong = run(copy, "-m", "conformance.new_property", "x", "--needs", "teleport")
    assert wrong.returncode == 2 and "unknown API or capability: teleport" in wrong.stderr, wrong.stderr
