"""The minimal plug-in example of docs/integrators.md runs exactly as printed (file and command), and the plug-in
machinery around it behaves: entry points, declaration errors, the deep_ep alias."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.docs import example_declaration
from tests.helpers.expectations import expected_for

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrators.md"


def fenced_after(marker: str) -> str:
    """The fenced code block right after the HTML comment ``marker`` in docs/integrators.md."""
    text = DOC.read_text()
    match = re.search(re.escape(f"<!-- {marker} -->") + r"\s*```[a-z]*\n(.*?)```", text, re.S)
    assert match, f"docs/integrators.md has no code block after <!-- {marker} -->"
    return match.group(1)


def env_for(*extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), *extra)))
    env.pop("CONFORMANCE_DEEP_EP", None)
    return env


def test_the_minimal_plugin_example_runs_as_printed(tmp_path: Path) -> None:
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ep.py").write_text(fenced_after("plugin-example: my_pkg/ep.py"))
    (command,) = [line for line in fenced_after("plugin-example-run").splitlines() if line.strip()]
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "pytest"]
    proc = subprocess.run([sys.executable, *args[1:], f"--report-dir={tmp_path / 'reports'}"], cwd=tmp_path,
                          env=env_for(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "reports" / "conformance.json").read_text())
    name = "my_pkg.ep:make_backend"
    (entry,) = [b for b in report["environment"]["backends"] if b["name"] == name]
    assert entry["plugin"] == name and entry["deep_ep"] == "emulation" and entry["deep_ep_seen"]["kind"] == "emulation"
    verdicts = {p["id"]: p["verdicts"][name] for p in report["properties"]}
    expected = expected_for(*example_declaration(DOC.read_text()))  # what the printed class declares
    assert set(verdicts) == {*expected.checked, *expected.unsupported, *expected.skipped}
    for pid in expected.checked:
        assert verdicts[pid]["status"] == "passed", (pid, verdicts[pid])
    for pid, reason in expected.unsupported.items():
        assert verdicts[pid]["status"] == "unsupported" and reason in verdicts[pid]["reason"], (pid, verdicts[pid])
    assert any("'combine_weights'" in note for note in verdicts["P5-combine"]["not_checked"])


#: ``conformance.backends.plugins.probe`` of several targets in one fresh interpreter (what
#: ``python -m conformance.backends.plugins TARGET emulation`` prints for each; one process instead of one each).
PROBES = ("import json, sys\nfrom conformance.backends.plugins import probe\n"
          "for target in sys.argv[1:]:\n    print(json.dumps(probe(target, 'emulation')))\n")


def probes(targets: list[str], *extra: str) -> dict[str, dict]:
    proc = subprocess.run([sys.executable, "-c", PROBES, *targets], env=env_for(*extra), capture_output=True,
                          text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()[-len(targets):]
    assert len(lines) == len(targets), proc.stdout[-2000:] + proc.stderr[-2000:]
    return {target: json.loads(line) for target, line in zip(targets, lines, strict=True)}


def test_a_declaration_is_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "bad_plugins.py").write_text(
        "from conformance.backends.plugins import PluginBackend, declare\n"
        "class V3(PluginBackend):\n    api = 'v3'\n"
        "class Qp(PluginBackend):\n    capabilities = {'combine', 'qp_cap'}\n"
        "def undeclared(env):\n    return None\n"
        "@declare(api='v2', capabilities=['expand'], uses_deep_ep=False)\n"
        "def fine(env):\n    return None\n")
    got = probes(["bad_plugins:V3", "bad_plugins:Qp", "bad_plugins:undeclared", "no_such_module:make",
                  "bad_plugins:fine"], str(tmp_path))
    assert "api='v3'" in got["bad_plugins:V3"]["error"]
    assert "qp_cap" in got["bad_plugins:Qp"]["error"] and "built-in" in got["bad_plugins:Qp"]["error"]
    assert "not a plug-in factory" in got["bad_plugins:undeclared"]["error"]
    assert "No module named" in got["no_such_module:make"]["error"]
    fine = got["bad_plugins:fine"]
    assert fine["importable"] and fine["api"] == "v2" and fine["capabilities"] == ["expand"]
    assert fine["uses_deep_ep"] is False


def test_a_plugin_that_does_not_load_is_a_one_line_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--backends",
                           "emulated-v1,no_such_module:make_backend", "--deep-ep", "emulation"],
                          cwd=tmp_path, env=env_for(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--backends no_such_module:make_backend: the plug-in does not load: ModuleNotFoundError" in proc.stderr


def test_unknown_names_list_the_installed_plugins(tmp_path: Path) -> None:
    info = tmp_path / "ep" / "some_plugins-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: some-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[deepep_conformance.backends]\nmy-ep = my_pkg.ep:make_backend\n")
    code = ("from conformance.core.spec import parse_backends\n"
            "print([s.name for s in parse_backends('my-ep,emulated-v1', False)])\n"
            "try:\n    parse_backends('emulated-v3', False)\nexcept ValueError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env_for(str(tmp_path / "ep")), capture_output=True,
                          text=True, timeout=60)
    lines = proc.stdout.splitlines()
    assert lines[0] == "['my-ep', 'emulated-v1']", proc.stderr
    assert "unknown backend 'emulated-v3'" in lines[1] and "installed plug-ins:" in lines[1] and "my-ep" in lines[1]


def test_the_deep_ep_alias_is_one_module_and_never_silent(tmp_path: Path) -> None:
    code = """
import sys
from conformance.backends import alias
assert alias.describe()["kind"] is None
print(alias.use_emulation()["kind"])
import conformance.emulation as emu
from deep_ep.utils.event import EventOverlap
import deep_ep.utils.event
print(EventOverlap is emu.EventOverlap, deep_ep.utils.event._pending is emu.utils.event._pending)
"""
    proc = subprocess.run([sys.executable, "-c", code], env=env_for(), capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["emulation", "True", "True"], proc.stderr
    (tmp_path / "deep_ep.py").write_text("__version__ = 'real-stand-in'\n")
    code = """
import deep_ep
from conformance.backends import alias
print(alias.describe()["kind"])
try:
    alias.use_emulation()
except RuntimeError as exc:
    print("refused:", exc)
"""
    proc = subprocess.run([sys.executable, "-c", code], env=env_for(str(tmp_path)), capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.startswith("real\nrefused: deep_ep is already imported from"), proc.stdout + proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--backends", "real-v1", "--deep-ep", "emulation"], "a real backend cannot run"),
    (["--deep-ep", "sometimes"], "--deep-ep (or CONFORMANCE_DEEP_EP) must be one of emulation, real, auto or "
                                 "emulation:VERSION"),
    (["--deep-ep", "emulation:9.9.9"], "the emulation models DeepEP 2.1.0, 2.5.0, not 9.9.9"),
])
def test_deep_ep_set_ups_that_cannot_work(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          env=env_for(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4 and message in proc.stderr, proc.stderr[-2000:]
