"""Self-test helpers that install third-party packages from the registry (cached), or skip saying why.

Used by the integrator self-tests: Megatron-Core (a real client of DeepEP), actionlint (the workflow linter) and
the clean-venv wheel test.  Packages go into a cache folder (``CONFORMANCE_TEST_CACHE``, default
``~/.cache/deepep-conformance-tests``), never into the running environment; a registry that cannot be reached
skips the test with pip's last line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def cache_dir() -> Path:
    """Where installed helpers are kept between runs."""
    return Path(os.environ.get("CONFORMANCE_TEST_CACHE") or Path.home() / ".cache" / "deepep-conformance-tests")


def pip(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m pip ARGS`` of this interpreter (quiet, no version check)."""
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, timeout=timeout)


def target_install(requirement: str, name: str, *, no_deps: bool = True) -> Path:
    """``pip install --target`` of ``requirement`` into the cache folder ``name`` (once); the folder, for
    ``PYTHONPATH`` / ``PATH``.  Skips the calling test when pip fails (e.g. the registry is unreachable)."""
    where = cache_dir() / f"{name}-py{sys.version_info.major}{sys.version_info.minor}"
    if (where / ".complete").exists():
        return where
    where.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=where.parent))
    proc = pip("install", *(["--no-deps"] if no_deps else []), "--target", str(staging), requirement)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.skip(f"pip install {requirement} failed (registry unreachable?): {tail}")
    (staging / ".complete").write_text(requirement + "\n")
    if where.exists():
        shutil.rmtree(where)
    staging.rename(where)
    return where


def patched_install(requirement: str, name: str, patch_file: Path) -> Path:
    """:func:`target_install` of ``requirement``, copied into the cache folder ``name`` with ``patch_file`` applied
    (``patch -p1`` from the copy's root, once; the copy is remade when the patch changes).  Skips the calling test
    when ``patch`` is not installed or the patch does not apply."""
    import hashlib

    base = target_install(requirement, name.split("+", 1)[0])
    digest = hashlib.sha256(patch_file.read_bytes()).hexdigest()[:12]
    where = cache_dir() / f"{name}-{digest}-py{sys.version_info.major}{sys.version_info.minor}"
    if (where / ".complete").exists():
        return where
    if shutil.which("patch") is None:
        pytest.skip(f"applying {patch_file.name} needs the 'patch' program, which is not installed here")
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=where.parent))
    shutil.rmtree(staging)
    shutil.copytree(base, staging, ignore=shutil.ignore_patterns(".complete"))
    proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(patch_file)], cwd=staging,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"{patch_file} does not apply to {requirement}: {proc.stdout.strip()} {proc.stderr.strip()}")
    (staging / ".complete").write_text(f"{requirement} + {patch_file} ({digest})\n")
    if where.exists():
        shutil.rmtree(where)
    staging.rename(where)
    return where


#: The torch a clean venv takes first, as the README documents (a looser pin pulls a multi-GB CUDA build).
TORCH = "torch==2.13.0"


def installed_wheel(work: Path, root: Path) -> dict[str, str]:
    """The suite as a user installs it: its wheel, built from a copy of the checkout ``root`` (setuptools builds
    in-tree: never in the checkout itself), installed into a clean venv after :data:`TORCH`.  Returns
    ``{"wheel": ..., "python": ...}``, or ``{"skip": why}`` when the wheel cannot be built or torch not installed
    here (no ``pytest.skip``: the result is shared by the session's tests, see ``once_per_session``)."""
    work.mkdir(parents=True, exist_ok=True)
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    shutil.copytree(root / "conformance", source / "conformance", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    # without this interpreter's PYTHONPATH: a checkout on it, installed in place (its *.egg-info), would make pip
    # take the wheel's requirement as already satisfied and install nothing
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), cwd=work, capture_output=True, text=True, timeout=900, env=env)

    proc = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), "./src")
    if proc.returncode != 0:
        return {"skip": f"could not build the wheel (setuptools from the registry?): {proc.stderr.strip()[-300:]}"}
    (built,) = (work / "dist").glob("deepep_conformance-*.whl")
    venv = work / "venv"
    proc = run(sys.executable, "-m", "venv", str(venv))
    if proc.returncode != 0:
        return {"skip": f"python -m venv failed: {proc.stderr.strip()[-300:]}"}
    # --no-compile: torch's modules are not byte-compiled at install (about 8 s of CPU here); what a run imports is
    # compiled as it is imported.
    pip_install = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                   "--no-compile"]
    proc = run(*pip_install, TORCH)  # first: a looser torch pin pulls a CUDA build
    if proc.returncode != 0:
        return {"skip": f"{TORCH} is not installable here: {proc.stderr.strip()[-300:]}"}
    proc = run(*pip_install, str(built))
    if proc.returncode != 0:  # not a skip: the wheel itself does not install
        return {"wheel": str(built), "error": f"pip install of the wheel failed: {proc.stderr.strip()[-2000:]}"}
    return {"wheel": str(built), "python": str(venv / "bin" / "python")}
