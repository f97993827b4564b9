"""A real client nobody here wrote: Megatron-Core's ``fused_a2a.py`` (megatron-core 0.16.1, unchanged) run as a
plug-in backend on the emulation (CPU, gloo, 2 ranks), side by side with the raw V1 backend.

Finding: as installed, fused_a2a does not import DeepEP 2.1.0 (its guard ``from deep_ep.utils import EventHandle,
EventOverlap`` fails: 2.1.0 exports EventOverlap from deep_ep.utils.event only, recorded on the real library), so
``megatron-fused-a2a`` fails every property it takes part in, with that reason, while the other backends are
still checked.  ``megatron-fused-a2a-shimmed`` applies the one-line workaround; for it the report must give a
verdict on every property and explain every non-pass: the properties of the V2 contract (P8, P11) and those that
drive the library directly (P12, P14) are ``unsupported`` with the reason; what the wrapper cannot take
(topk_weights / bias in combine, expert_alignment, layout outputs) is listed under ``not_checked``; everything else
passes against the oracle and the raw backends.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from conformance.integrations import MEGATRON_CAPABILITIES
from tests.conftest import run_suite
from tests.helpers.expectations import expected_for
from tests.helpers.installs import target_install

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

PINNED = "0.16.1"
PLAIN = "megatron-fused-a2a"
NAME = "megatron-fused-a2a-shimmed"
TARGET = "conformance.integrations.megatron:MegatronFusedA2AShimmed"
#: What the run must say of the wrapper (V1, Megatron's declaration), derived from the catalog: the properties that
#: check it (P4 and P9 may also report the documented V1/V2 divergences), those that report it unsupported and why,
#: those a default run skips.
EXPECTED = expected_for("v1", MEGATRON_CAPABILITIES)
CHECKED, UNSUPPORTED, SKIPPED = EXPECTED.checked, EXPECTED.unsupported, EXPECTED.skipped


def megatron_path() -> tuple[str, ...]:
    """Extra PYTHONPATH entries that make megatron-core 0.16.1 importable (none when it is installed here)."""
    try:
        if importlib.util.find_spec("megatron") is not None and version("megatron-core") == PINNED:
            return ()
    except PackageNotFoundError:
        pass
    for module in ("numpy", "packaging"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"megatron-core needs {module}, which is not installed here")
    return (str(target_install(f"megatron-core=={PINNED}", f"megatron-core-{PINNED}")),)


def entry_point_dir(tmp_path: Path) -> str:
    """A distribution on the path that registers the plug-in under its entry-point name (as an installed
    deepep-conformance does), so that ``--backends megatron-fused-a2a`` resolves from a checkout too."""
    info = tmp_path / "ep" / "megatron_plugin_selftest-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-plugin-selftest\nVersion: 0.0\n")
    plain_target = "conformance.integrations.megatron:MegatronFusedA2A"
    entries = f"[deepep_conformance.backends]\n{NAME} = {TARGET}\n{PLAIN} = {plain_target}\n"
    (info / "entry_points.txt").write_text(entries)
    return str(tmp_path / "ep")


def test_megatron_fused_a2a_as_a_plugin_on_the_emulation(tmp_path: Path) -> None:
    path = (*megatron_path(), entry_point_dir(tmp_path))
    # the raw V1 beside the wrapper (a V1-contract plug-in is compared with it; docs/integrators.md's command adds
    # emulated-v2 for the user's own comparison, which this test does not read)
    proc, report = run_suite(["-p", "no:xdist", "--backends", f"emulated-v1,{PLAIN},{NAME}", "--deep-ep",
                              "auto", "--device", "cpu", "--max-examples", "3", "--conformance-seed", "7"],
                             tmp_path / "reports", timeout=600, extra_path=path)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]  # the plain wrapper's finding
    guard = "its guard 'from deep_ep.utils import EventHandle, EventOverlap' fails"
    assert guard in report["headline"][0] and PLAIN in report["headline"][0], report["headline"]
    for p in report["properties"]:
        plain, raw = p["verdicts"][PLAIN], p["verdicts"]["emulated-v1"]
        if p["id"] in CHECKED:
            assert p["status"] == "failed" and plain["status"] == "failed", (p["id"], plain)
            assert guard in plain["reason"], (p["id"], plain)
            assert raw["status"] in ("passed", "divergence"), (p["id"], raw)  # still checked
    (plugin,) = [b for b in report["environment"]["backends"] if b["name"] == NAME]
    assert plugin["plugin"] == TARGET and plugin["api"] == "Buffer" and plugin["real"] is False
    assert "workaround" in plugin["description"]
    assert plugin["deep_ep"] == "emulation" and plugin["deep_ep_seen"]["kind"] == "emulation"
    assert f"Megatron-Core {PINNED}" in plugin["description"]
    assert plugin["capabilities"] == ["autograd", "cached_dispatch", "combine", "events"]
    assert any("--deep-ep auto chose conformance.emulation" in note for note in report["environment"]["notes"])
    verdicts = {p["id"]: p["verdicts"][NAME] for p in report["properties"]}
    assert set(verdicts) == set(CHECKED) | set(UNSUPPORTED) | set(SKIPPED)
    for pid, reason in SKIPPED.items():
        assert verdicts[pid]["status"] == "skipped" and reason in verdicts[pid]["reason"], (pid, verdicts[pid])
    for pid in CHECKED:
        assert verdicts[pid]["status"] in ("passed", "divergence"), (pid, verdicts[pid])
    for pid, reason in UNSUPPORTED.items():
        assert verdicts[pid]["status"] == "unsupported" and reason in verdicts[pid]["reason"], (pid, verdicts[pid])
    for pid, verdict in verdicts.items():  # every non-pass is explained
        assert verdict["status"] == "passed" or verdict["reason"], (pid, verdict)
    # What the wrapper cannot take is listed, precisely, not silently skipped:
    assert any("'combine_weights'" in n for n in verdicts["P5-combine"]["not_checked"])
    assert any("'layout'" in n for n in verdicts["P2-counts"]["not_checked"])
    assert any("'combine_weights'" in n for n in verdicts["P9-gradients"]["not_checked"])
    markdown = (tmp_path / "reports" / "conformance.md").read_text()
    assert "## Verdicts explained" in markdown and f"plug-in {TARGET}" in markdown


@pytest.mark.skipif(importlib.util.find_spec("deep_ep") is not None, reason="a real deep_ep is installed here")
def test_a_plugin_using_deep_ep_without_one_is_a_usage_error(tmp_path: Path) -> None:
    proc, _ = run_suite(["--backends", f"emulated-v1,{TARGET}", "--device", "cpu"], tmp_path / "reports",
                        extra_path=megatron_path())
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "pass --deep-ep emulation (or auto)" in proc.stderr
