"""The checkout is ruff-clean (the rules of pyproject.toml), so that the README's self-test command is also the lint
CI runs; where ruff is not installed the test is skipped, naming the extra that installs it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (pip install -e '.[dev]', as the README's self-test command does)")
def test_the_checkout_is_ruff_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"ruff check . found problems:\n{proc.stdout}{proc.stderr}"
