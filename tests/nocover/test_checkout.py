"""The checkout's top-level ``conftest.py`` earns its place: in a checkout that is not installed (no ``pytest11``
entry point: autoloading off), a plain ``pytest`` still loads the suite's plugin and collects the properties."""

from __future__ import annotations

import json
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


def test_the_gate_starts_from_an_uninstalled_checkout_with_a_baseline_elsewhere(tmp_path) -> None:
    """As the accelerator machine runs the gate: the checkout on ``PYTHONPATH`` (not installed: no entry point), the
    baseline outside the checkout, ``--baseline PATH`` written with a space.  pytest reads ``PATH`` as a test path
    before any plugin can say the option takes a value, so it roots itself at the baseline's folder (or where that
    and the current folder meet), finds no conftest there and refuses every option of the suite (``unrecognized
    arguments``).  The documented form (docs/reference.md, "From a checkout that is not installed"), ``-p
    conformance.plugin``, starts from any folder (here: neither the checkout nor the baseline's)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    baseline = outside / "old.json"
    baseline.write_text(json.dumps({"schema": 3, "complete": True, "environment": {"backends": []},
                                    "properties": []}))
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONPATH=str(ROOT))
    options = ["--co", "-q", "-p", "no:cacheprovider", "--max-examples", "1", "-k", "test_counts"]

    def pytest_run(*args: str, cwd) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120)

    plain = pytest_run(*options, "--baseline", str(baseline), cwd=ROOT)
    assert plain.returncode == 4 and "unrecognized arguments" in plain.stderr, plain.stderr[-2000:]
    # the reason, as pytest says it: its rootdir is not the checkout (the baseline's folder, or a common ancestor)
    rootdir = plain.stderr.split("rootdir: ", 1)[1].splitlines()[0]
    assert rootdir != str(ROOT) and str(outside).startswith(rootdir), plain.stderr[-2000:]
    proc = pytest_run("-p", "conformance.plugin", *options, "--baseline", str(baseline), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "test_p02_counts.py::test_counts" in proc.stdout, proc.stdout[-2000:]


def test_the_benchmarks_catalog_starts_an_uninstalled_checkout_with_a_baseline_elsewhere(tmp_path) -> None:
    """``python -m benchmarks --only catalog --catalog-args "... --baseline PATH"`` (run 33's 2.5.0 part stopped at
    once with ``unrecognized arguments``: its command did not load the plugin by name)."""
    from benchmarks.__main__ import catalog_command

    baseline = tmp_path / "old.json"
    baseline.write_text(json.dumps({"schema": 3, "complete": True, "environment": {"backends": []},
                                    "properties": []}))
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONPATH=str(ROOT))
    command = catalog_command(["--co", "-q", "--max-examples", "1", "-k", "test_counts", "--baseline", str(baseline)],
                              str(tmp_path / "reports"))
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "test_p02_counts.py::test_counts" in proc.stdout, proc.stdout[-2000:]
