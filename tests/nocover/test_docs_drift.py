"""The docs say what the catalog says: every list of properties is generated from ``catalog()`` (``python -m
conformance.docs``) and up to date, and no hand-written page names a property id that no longer exists."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from conformance.docs import stale
from conformance.properties import catalog
from tests.conftest import ROOT
from tests.helpers import zygote

#: Hand-written pages that may name properties (the kept real runs and reports are history, not docs).
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
         ROOT / "conformance" / "emulation" / "DIVERGENCES.md"]
PROPERTY_ID = re.compile(r"\bP\d+-[a-z0-9]+(?:-[a-z0-9]+)*\b")


def test_the_generated_docs_are_the_catalogs() -> None:
    outdated = [path.relative_to(ROOT).as_posix() for path in stale()]
    assert not outdated, f"{outdated} differ from the property catalog: run python -m conformance.docs --write"


def test_no_page_names_a_property_that_does_not_exist() -> None:
    known = set(catalog())
    source = "\n".join(path.read_text() for path in (ROOT / "conformance").rglob("*.py"))
    for page in PAGES:
        for name in sorted(set(PROPERTY_ID.findall(page.read_text()))):
            # a property id, or another key the code defines (a divergence key such as P9-weight-grads-...)
            assert name in known or f'"{name}"' in source, (
                f"{page.relative_to(ROOT)} names {name!r}, which is neither a property of the catalog nor a key the "
                f"code defines: rename or remove it")


def test_the_check_fails_and_names_the_command_when_a_block_is_stale(tmp_path: Path) -> None:
    for name in ("README.md", "docs"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("| [P2-counts]", "| [P2-count]", 1))
    proc, _ = zygote.run("conformance.docs", ["--root", str(tmp_path)], cwd=ROOT, env=dict(os.environ), timeout=120)
    assert proc.returncode == 1 and "README.md differs" in proc.stderr, proc.stderr
    assert "python -m conformance.docs --write" in proc.stderr
    written, _ = zygote.run("conformance.docs", ["--root", str(tmp_path), "--write"], cwd=ROOT, env=dict(os.environ),
                            timeout=120)
    assert written.returncode == 0 and "wrote README.md" in written.stdout, written.stdout + written.stderr
    assert readme.read_text() == (ROOT / "README.md").read_text()
