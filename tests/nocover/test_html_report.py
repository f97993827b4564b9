"""The HTML report of a run with a planted failure, opened in headless Chromium: the verdict matrix and the
counterexample's heat-map are on the page (DOM text, a non-blank picture), and a screenshot is taken.

Set ``UPDATE_REPORT_SCREENSHOT=1`` to copy the screenshot to ``docs/img/report.png`` (shown in docs/reference.md).
Skipped, with the reason, where Chromium or the ``report`` extra (jinja2, matplotlib) is missing; CI installs both.
"""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # a whole run of the suite or more: scheduled first (tests/conftest.py)

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--hide-scrollbars"]


def _pixels(png: bytes):
    from matplotlib import image

    return image.imread(io.BytesIO(png), format="png")


def _chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, timeout=timeout)


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_the_html_report_shows_the_matrix_and_the_counterexample_heatmap(tmp_path: Path, planted_run) -> None:
    """The report of the session's run of P1 and P5 with a planted byte flip (tests/conftest.py: PLANTED_RUN)."""
    pytest.importorskip("jinja2", reason="the report extra is not installed (pip install '.[report]')")
    pytest.importorskip("matplotlib", reason="the report extra is not installed (pip install '.[report]')")
    proc, report, reports = planted_run.proc, planted_run.report, planted_run.report_dir
    assert proc.returncode == 1, proc.stdout[-3000:]
    page = reports / "conformance.html"
    assert report["html"] == str(page) and page.exists()
    html = page.read_text()
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # self-contained

    dom = _chromium("--dump-dom", page.as_uri()).stdout.decode()
    assert 'id="verdict-matrix"' in dom and "FAILED P1-per-expert-payloads" in dom
    matrix = dom[dom.index('id="verdict-matrix"'):dom.index("</table>", dom.index('id="verdict-matrix"'))]
    for text in ("P1-per-expert-payloads", "P5-combine", "emulated-v1", "emulated-v2", "failed", "held"):
        assert text in matrix, text
    assert "Differing bytes" in dom and "expected hex" in dom and "observed hex" in dom
    assert "python -m conformance.repro P1-per-expert-payloads" in dom and "--conformance-seed 1" in dom
    heatmaps = re.findall(r'<img class="heatmap"[^>]*src="data:image/png;base64,([^"]+)"', dom)
    assert heatmaps, "no heat-map image on the page"
    picture = _pixels(base64.b64decode(heatmaps[0]))
    assert picture.shape[0] > 100 and picture.shape[1] > 100 and float(picture[..., :3].std()) > 0.05

    screenshot = tmp_path / "report.png"
    _chromium("--window-size=1400,1800", f"--screenshot={screenshot}", page.as_uri())
    assert screenshot.exists(), "Chromium took no screenshot"
    shot = _pixels(screenshot.read_bytes())
    assert shot.shape[:2] == (1800, 1400) and float(shot[..., :3].std()) > 0.05, "blank screenshot"
    if os.environ.get("UPDATE_REPORT_SCREENSHOT"):
        target = ROOT / "docs" / "img" / "report.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(screenshot, target)
