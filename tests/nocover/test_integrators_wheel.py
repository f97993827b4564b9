"""The install story: the wheel built from the checkout installs into a clean venv (torch first, as documented) and
``pytest --pyargs conformance.properties -n 2 --nodes 2`` runs from a folder outside the checkout.

That run is the session's two-node catalog run (``catalog_runs`` in tests/conftest.py: the API coverage and the
main job's self-tests read it too), so the installed package is what they measure.  The wheel carries the package
and the data a run reads (``conformance/data``: the API-surface snapshot and the recorded errors), and nothing else:
not the real-library recordings under ``fixtures/`` (only the emulation-fidelity self-test reads them), not the
self-tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # reads the session's whole-catalog runs: scheduled first (tests/conftest.py)

#: What a run needs besides the Python modules.
DATA = ("conformance/versions/2.1.0/recorded-errors.json", "conformance/versions/2.1.0/api-surface.json",
        "conformance/versions/2.1.0/api-surface-signatures.txt", "conformance/versions/2.1.0/contract.toml",
        "conformance/versions/2.1.0/refusals.toml", "conformance/versions/2.1.0/known-defects.toml",
        "conformance/versions/2.1.0/limits.toml")
MAX_WHEEL_BYTES = 1 << 20


@pytest.fixture(scope="module")
def installed(catalog_runs: dict[int, Any]) -> dict[str, str]:
    """How the session's two-node catalog run was installed (skips where no wheel could be built or no torch
    installed, saying why; fails where the wheel itself does not install)."""
    how = catalog_runs[2].installed
    if "skip" in how:
        pytest.skip(how["skip"])
    assert "error" not in how, how["error"]
    return how


@pytest.fixture(scope="module")
def wheel(installed: dict[str, str]) -> Path:
    return Path(installed["wheel"])


def test_the_wheel_carries_what_a_run_needs_and_nothing_else(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    size = wheel.stat().st_size
    assert size < MAX_WHEEL_BYTES, f"the wheel is {size} bytes"
    assert all(name.startswith(("conformance/", "deepep_conformance-")) for name in names), names
    assert not [n for n in names if "fixtures" in n or n.startswith("tests/") or n.endswith((".pt", ".pyc"))]
    for name in DATA:
        assert name in names, name
    assert "conformance/integrations/megatron.py" in names
    assert "conformance.plugin = conformance.plugin" in entry_points
    assert "[deepep_conformance.backends]" in entry_points
    assert "megatron-fused-a2a = conformance.integrations.megatron:MegatronFusedA2A" in entry_points


def test_a_clean_venv_runs_the_properties_from_any_folder(installed: dict[str, str], catalog_runs) -> None:
    python, outside = Path(installed["python"]), Path(installed["cwd"])
    venv = python.parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CONFORMANCE_DEEP_EP")}
    where = subprocess.run([str(python), "-c", "import conformance; print(conformance.__file__)"], cwd=outside,
                           capture_output=True, text=True, timeout=120, env=env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    run = catalog_runs[2]
    assert run.proc.args[:3] == [str(python), "-m", "pytest"] and "--pyargs" in run.proc.args, run.proc.args
    assert run.proc.returncode == 0, run.proc.stdout[-4000:] + run.proc.stderr[-2000:]
    assert run.report_dir == outside / "reports"  # the default report folder, in the folder it ran from
    report = json.loads((outside / "reports" / "conformance.json").read_text())
    assert report["complete"] and report["summary"]["failed"] == 0, report["summary"]
    assert report["environment"]["nodes"] == 2
