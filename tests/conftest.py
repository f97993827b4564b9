"""Self-test helpers: run the suite itself as a subprocess and read its JSON report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from tests.helpers import zygote
from tests.helpers.installs import installed_wheel
from tests.helpers.runs import report_of, run_pytest

ROOT = Path(__file__).resolve().parent.parent


def run_suite(args: list[str], report_dir: Path, timeout: float = 600, extra_path: tuple[str, ...] = ()
              ) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``pytest <args>`` on the suite in a process of its own (forked from a warm interpreter where that is the
    same as a fresh one: tests/helpers/zygote.py); return the process and its JSON report.  ``extra_path``: more entries
    for ``PYTHONPATH`` (after the checkout)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), *extra_path)))
    env.pop("CONFORMANCE_DEEP_EP", None)
    env.pop("GITHUB_STEP_SUMMARY", None)  # a self-test's inner run must not write into CI's job summary
    proc, _ = zygote.run("pytest", ["-q", "-p", "no:cacheprovider", f"--report-dir={report_dir}", *args], cwd=ROOT,
                         env=env, timeout=timeout)
    report_path = report_dir / "conformance.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return proc, report


def pytest_configure(config: pytest.Config) -> None:
    # The suite's own modules compiled once, not in every process the self-tests start (where the environment says
    # PYTHONDONTWRITEBYTECODE, as on the 2-core machine: about 0.3 s of CPU per process that imports the suite)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    config.addinivalue_line("markers", "slow: a self-test that runs the suite (or more) in subprocesses: scheduled "
                                       "first, so that the workers end together")
    config.addinivalue_line("markers", "xdist_group(name): self-tests run on one worker, one after the other (see "
                                       "xdist_groups; registered here too for runs without pytest-xdist)")
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):  # xdist's controller
        # in their collection order (the ``slow`` ones first), not the largest group first
        config.option.loadscopereorder = False
        fd, groups = tempfile.mkstemp(prefix="selftest-groups-", suffix=".json")
        os.close(fd)
        os.environ[GROUPS_ENV] = groups  # the workers, started after this, write there (see below)
        config.add_cleanup(lambda: Path(groups).unlink(missing_ok=True))


#: The session fixtures that run the suite once for several self-tests (a file lock makes every other worker that
#: asks wait for the first): the self-tests that read one are one xdist group, on one worker, so that no other
#: worker waits.
SHARED_RUNS = ("catalog_runs", "planted_run", "both_paths")
#: Where the workers write the self-tests' xdist groups for the controller's scheduler (a file per session).
GROUPS_ENV = "CONFORMANCE_SELFTEST_GROUPS"


def xdist_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Each grouped self-test's group: its ``xdist_group`` marks and the shared runs it reads (:data:`SHARED_RUNS`)."""
    groups = {}
    for item in items:
        names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                 for mark in item.iter_markers("xdist_group")}
        names.update(name for name in SHARED_RUNS if name in getattr(item, "fixturenames", ()))
        if names:
            groups[item.nodeid] = "group:" + "_".join(sorted(names))
    return groups


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups of the shared runs first, then the ``slow`` self-tests and the other groups (each group a unit of
    several tests on one worker), the rest after them (a stable sort: otherwise in collection order), so that under
    xdist the longest units start at once and the many short tests fill the end of the run instead of lengthening
    it; a worker writes the groups for the scheduler."""
    groups = xdist_groups(items)
    for item in items:  # the ``suite`` fixture runs the suite in a subprocess: slow by definition
        if "suite" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    shared = {groups[item.nodeid] for item in items if set(SHARED_RUNS) & set(getattr(item, "fixturenames", ()))}

    def order(item: pytest.Item) -> int:  # the shared runs' groups are the longest units: first of all
        if groups.get(item.nodeid) in shared:
            return 0
        return 1 if item.get_closest_marker("slow") or item.nodeid in groups else 2

    items.sort(key=order)
    if hasattr(config, "workerinput") and os.environ.get(GROUPS_ENV):
        path = Path(os.environ[GROUPS_ENV])
        mine = path.with_name(f"{path.name}.{config.workerinput['workerid']}")
        mine.write_text(json.dumps(groups))
        mine.replace(path)  # whole, whichever worker writes last (they collected the same tests)


#: Why a self-test may be skipped on a machine, as the run's last line counts them: (pattern of the reason, label).
#: The reason itself (printed in full above that line) says what would run the test.
SKIP_LABELS = (
    (re.compile(r"needs \d+ GPUs"), "no GPUs here"),
    (re.compile(r"Chromium"), "no Chromium"),
    (re.compile(r"seed PR's patch is not here"), "no ../shared (seed PR)"),
    (re.compile(r"DeepEP mirror"), "no DeepEP mirror"),
    (re.compile(r"the recording .* holds section"), "a recorded section is an error"),
    (re.compile(r"no real recording of section"), "a section not recorded on the real library yet"),
    (re.compile(r"not installed|needs the '\w+' program|registry unreachable|not installable"), "a tool missing"),
    (re.compile(r"network namespaces"), "no network namespaces"),
)


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test's report gives."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def skip_label(reason: str) -> str:
    """The short label of a skip reason (:data:`SKIP_LABELS`, else the reason's first clause)."""
    for pattern, label in SKIP_LABELS:
        if pattern.search(reason):
            return label
    return re.split(r" \(|; |: ", reason, maxsplit=1)[0][:60]


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    """A skipped self-test is counted under its reason's label, so that the run's last line says how many were
    skipped for which reason (``492 passed, 3 skipped (no GPUs here), 1 skipped (no Chromium)``)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        return f"skipped ({skip_label(skip_reason(report))})", "s", ("SKIPPED", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Every skip reason in full (what would run the test), with its count and tests, before the last line."""
    skipped = [report for key, reports in terminalreporter.stats.items() if key.startswith("skipped (")
               for report in reports]
    if not skipped:
        return
    by_reason: dict[str, list[str]] = {}
    for report in skipped:
        by_reason.setdefault(skip_reason(report), []).append(report.nodeid)
    terminalreporter.section(f"{len(skipped)} skipped, by reason (what would run them)", sep="-")
    for reason, nodeids in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        terminalreporter.write_line(f"{len(nodeids)} x {reason}")
        for nodeid in nodeids[:3]:
            terminalreporter.write_line(f"      {nodeid}")
        if len(nodeids) > 3:
            terminalreporter.write_line(f"      ... and {len(nodeids) - 3} more")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``pytest tests -n auto``: one worker more than the cores (a self-test spends much of its time waiting on the
    worlds and runs it starts)."""
    return (os.cpu_count() or 1) + 1


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The self-tests are scheduled by group whatever ``--dist`` says (:func:`xdist_groups`): a module marked
    ``xdist_group`` keeps its costly module fixture (a started world) on one worker, and the self-tests reading one
    shared run wait for it on one worker, not on three.  (xdist's own ``--dist loadgroup`` puts the group into the
    test's id, which pytest 9.2 no longer lets a plug-in change: the groups come from the workers in a file.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first asked once every worker collected (and wrote the groups)
                path = os.environ.get(GROUPS_ENV)
                text = Path(path).read_text() if path and Path(path).exists() else ""
                self.groups = json.loads(text) if text else {}
                self.log(f"self-test groups: {len(set(self.groups.values()))} groups of {len(self.groups)} tests")
            return self.groups.get(nodeid, nodeid)

    return ByGroup(config, log)


@pytest.fixture(scope="session")
def worker_id(request: pytest.FixtureRequest) -> str:
    """pytest-xdist's ``worker_id`` (``gw0``...; ``master`` without workers), also where its plug-in is not loaded
    (``-p no:xdist``), so that the session fixtures below work in both."""
    return getattr(request.config, "workerinput", {}).get("workerid", "master")


@pytest.fixture
def suite(tmp_path: Path):
    """Callable running the suite with its reports in a temporary directory."""
    return lambda *args, **kw: run_suite(list(args), tmp_path / "reports", **kw)


@pytest.fixture(scope="session")
def emulated_session():
    """A session on a 1-node x 2-rank CPU world over the emulated V1 and V2 (shared by meta-tests)."""
    from conformance.core.spec import parse_backends
    from conformance.harness.config import RunConfig
    from conformance.harness.session import Session
    from conformance.world.launcher import WorldShape

    config = RunConfig(WorldShape(1, 2), tuple(parse_backends("emulated", False)), "cpu", 120.0)
    session = Session(config)
    yield session
    session.close()


@pytest.fixture(scope="session")
def two_node_session():
    """A session on a 2-node x 2-rank CPU world (internode paths) over the emulated V1 and V2."""
    from conformance.core.spec import parse_backends
    from conformance.harness.config import RunConfig
    from conformance.harness.session import Session
    from conformance.world.launcher import WorldShape

    session = Session(RunConfig(WorldShape(2, 2), tuple(parse_backends("emulated", False)), "cpu", 120.0))
    yield session
    session.close()


@dataclass(frozen=True)
class CatalogRun:
    """One pytest run of the whole catalog on the emulation, as a user makes it (no process left behind)."""

    proc: subprocess.CompletedProcess
    took: float
    report_dir: Path
    #: Two nodes: the installed wheel that ran it (``tests.helpers.installs.installed_wheel``: wheel, python, cwd) or
    #: why the checkout ran it instead (skip / error); one node: empty (the checkout runs it).
    installed: dict[str, str]

    @property
    def report(self) -> dict:
        return report_of(self.report_dir)


#: The whole-catalog runs several self-tests read (API coverage, the serial and the xdist paths, partial runs, the
#: option spellings, the installed wheel), by world: one node from the checkout where pytest-xdist is not installed
#: (no plug-in autoloads, ``import xdist`` fails: :data:`NO_XDIST`; only the suite's and Hypothesis' plug-ins
#: named), two nodes with ``-n 2`` as a user runs it: the wheel installed in a clean venv, from a folder outside the
#: checkout, its report in that folder's ``reports/`` (the checkout runs it where no wheel can be installed, and the
#: wheel's test fails or skips, saying why); 3 examples per property, seed 0.
CATALOG_RUNS = {1: ["-p", "conformance.plugin", "-p", "hypothesis.extra.pytestplugin", "--nodes", "1"],
                2: ["--pyargs", "conformance.properties", "-n", "2", "--nodes", "2"]}
#: A ``sitecustomize`` that makes ``import xdist`` fail, as where the package is not installed.
NO_XDIST = ("import sys\nclass _NoXdist:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'xdist' or name.startswith('xdist.'):\n"
            "            raise ModuleNotFoundError(\"No module named 'xdist'\", name=name)\n"
            "sys.meta_path.insert(0, _NoXdist())\n")


def without_xdist(folder: Path) -> dict[str, str]:
    """The environment of a pytest run as where pytest-xdist is not installed (:data:`NO_XDIST` in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(NO_XDIST)
    return {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": f"{folder}:{ROOT}"}


#: What else the catalog runs are given (a test comparing another run with one of them gives these too).
CATALOG_RUN_OPTIONS = ["--max-examples", "3", "--conformance-seed", "0", "--backends", "emulated"]


def once_per_session(tmp_path_factory: pytest.TempPathFactory, worker_id: str, key: str,
                     make: Callable[[Path], Any]) -> Any:
    """``make(folder)``'s JSON-able result, made once per self-test session whatever xdist does: under xdist the
    first worker that asks makes it and the others read it (pytest-xdist's recipe: a file lock in the session's
    shared temporary folder), so a costly run is never repeated because its readers landed on several workers or
    a worker tore a module fixture down between them."""
    if worker_id == "master":  # no xdist: this process is the session
        return make(tmp_path_factory.mktemp(key))
    shared = tmp_path_factory.getbasetemp().parent  # one per session, shared by its workers
    done = shared / f"{key}.json"
    with FileLock(str(done) + ".lock"):
        if not done.exists():
            done.write_text(json.dumps(make(shared / key)))
    return json.loads(done.read_text())


def completed(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    """``proc`` as JSON (:func:`once_per_session`); :func:`process` reads it back."""
    return {"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def process(data: dict[str, Any]) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(data["args"], data["returncode"], data["stdout"], data["stderr"])


@pytest.fixture(scope="session")
def catalog_runs(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[int, CatalogRun]:
    """The catalog on the emulation, run once per self-test session (the two worlds side by side) for every
    self-test that needs a complete run."""
    runs = once_per_session(tmp_path_factory, worker_id, "catalog-runs", _catalog_runs)
    return {int(nodes): CatalogRun(process(r["proc"]), r["took"], Path(r["report_dir"]), r["installed"])
            for nodes, r in runs.items()}


#: The run with a planted byte flip that the main job's failure report and the HTML report's self-tests both read:
#: P1 fails on it (the flip), P5 holds beside it; two nodes, so the counterexample names rank 3.
PLANTED_RUN = ["conformance/properties/test_p01_payloads.py", "conformance/properties/test_p05_combine.py",
               "--nodes", "2", "--max-examples", "10", "--conformance-seed", "1", "--mutant", "flip-one-byte",
               "-p", "no:xdist"]


@dataclass
class PlantedRun:
    proc: subprocess.CompletedProcess
    report: dict[str, Any]
    report_dir: Path


@pytest.fixture(scope="session")
def planted_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> PlantedRun:
    """:data:`PLANTED_RUN`, made once per self-test session."""

    def make(root: Path) -> dict[str, Any]:
        proc, _ = run_suite(PLANTED_RUN, root / "reports")
        return {"proc": completed(proc), "report_dir": str(root / "reports")}

    made = once_per_session(tmp_path_factory, worker_id, "planted-run", make)
    report_dir = Path(made["report_dir"])
    path = report_dir / "conformance.json"
    return PlantedRun(process(made["proc"]), json.loads(path.read_text()) if path.exists() else {}, report_dir)


def _catalog_runs(root: Path) -> dict[int, dict[str, Any]]:
    def run(nodes: int) -> dict[str, Any]:
        if nodes == 1:
            report_dir = root / "nodes1"
            proc, took = run_pytest([*CATALOG_RUNS[1], *CATALOG_RUN_OPTIONS, "-q", f"--report-dir={report_dir}"],
                                    env=without_xdist(root / "no-xdist"))
            return {"proc": completed(proc), "took": took, "report_dir": str(report_dir), "installed": {}}
        installed = installed_wheel(root / "wheel", ROOT)
        if "python" in installed:
            outside = root / "anywhere"
            outside.mkdir()
            proc, took = run_pytest([*CATALOG_RUNS[2], *CATALOG_RUN_OPTIONS, "-q", "-p", "no:cacheprovider"],
                                    cwd=outside, python=installed["python"])
            installed["cwd"] = str(outside)
            return {"proc": completed(proc), "took": took, "report_dir": str(outside / "reports"),
                    "installed": installed}
        report_dir = root / "nodes2"
        proc, took = run_pytest(["-n", "2", "--nodes", "2", *CATALOG_RUN_OPTIONS, "-q", f"--report-dir={report_dir}"])
        return {"proc": completed(proc), "took": took, "report_dir": str(report_dir), "installed": installed}

    with ThreadPoolExecutor(len(CATALOG_RUNS)) as pool:
        return dict(zip(CATALOG_RUNS, pool.map(run, CATALOG_RUNS), strict=True))
