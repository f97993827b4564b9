"""The install story: the wheel built from the checkout installs into a clean venv (torch first, as documented) and
``pytest --pyargs conformance.properties -n auto --nodes 2`` runs from a folder outside the checkout.

The wheel carries the package and the data a run reads (``conformance/data``: the API-surface snapshot and the
recorded errors), and nothing else: not the real-library recordings under ``fixtures/`` (only the
emulation-fidelity self-test reads them), not the self-tests.  (~1.5 min here: most of it installing torch.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

#: Its module-scoped fixtures are built once: under xdist (the self-tests run with -n) its tests share a worker.
pytestmark = [pytest.mark.xdist_group("test_integrators_wheel"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
#: What a run needs besides the Python modules.
DATA = ("conformance/data/recorded_errors.json", "conformance/data/api-surface/deep_ep-2.1.0.json",
        "conformance/data/api-surface/deep_ep-2.1.0-signatures.txt")
MAX_WHEEL_BYTES = 1 << 20


def run(args: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the checkout (setuptools builds in-tree: never in the checkout itself)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "conformance", source / "conformance", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), "./src"], work)
    if proc.returncode != 0:
        pytest.skip(f"could not build the wheel (setuptools from the registry?): {proc.stderr.strip()[-300:]}")
    (built,) = (work / "dist").glob("deepep_conformance-*.whl")
    return built


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


def test_a_clean_venv_runs_the_properties_from_any_folder(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    proc = run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # --no-compile: torch's modules are not byte-compiled at install (about 8 s of CPU here); what the run imports
    # is compiled as it is imported.
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    proc = run([*pip, "torch==2.13.0"], tmp_path, timeout=900)  # first: a looser torch pin pulls a CUDA build
    if proc.returncode != 0:
        pytest.skip(f"torch==2.13.0 is not installable here: {proc.stderr.strip()[-300:]}")
    proc = run([*pip, str(wheel)], tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outside = tmp_path / "anywhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CONFORMANCE_DEEP_EP")}
    where = run([str(venv / "bin" / "python"), "-c", "import conformance; print(conformance.__file__)"], outside,
                env=env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    proc = run([str(venv / "bin" / "pytest"), "--pyargs", "conformance.properties", "-n", "auto", "--nodes", "2",
                "--max-examples", "2", "-p", "no:cacheprovider"], outside, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((outside / "reports" / "conformance.json").read_text())
    assert report["complete"] and report["summary"]["failed"] == 0, report["summary"]
    assert report["environment"]["nodes"] == 2
