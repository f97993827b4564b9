"""The checkout's top-level ``conftest.py`` earns its place: in a checkout that is not installed (no ``pytest11``
entry point: autoloading off), a plain ``pytest`` still loads the suite's plugin and collects the properties."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_a_checkout_runs_the_suite_without_its_entry_point() -> None:
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--max-examples",
                           "1", "-k", "test_counts"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]  # --max-examples is the plugin's option
    assert "test_p02_counts.py::test_counts" in proc.stdout, proc.stdout[-2000:]
