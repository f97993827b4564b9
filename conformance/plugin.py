"""The pytest plugin: options, the per-worker session (one rank world each), recording and reports.

Active through the ``pytest11`` entry point when installed, or the checkout's ``conftest.py``.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from conformance import config as run_config
from conformance.backends.probe import probe_module, real_deep_ep_available
from conformance.backends.spec import parse_backends
from conformance.config import RunConfig
from conformance.devices import gpu_slice, max_gpu_workers, visible_gpus, worker_index
from conformance.gate import load_report
from conformance.reporting import USER_PROPERTY, entry_from_report, environment, repro_command, write_reports
from conformance.session import Recorder, Session
from conformance.world import WorldShape

SESSION_KEY = pytest.StashKey[Session]()
CONFIG_KEY = pytest.StashKey[RunConfig]()
ENTRIES_KEY = pytest.StashKey[list]()
BASELINE_KEY = pytest.StashKey[dict]()
#: Environment passed to every rank on GPUs (NVLink multicast stays off on shared hosts).
GPU_RANK_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
DEFAULT_MAX_EXAMPLES = 25


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "DeepEP conformance")
    group.addoption("--nodes", type=int, default=1, help="nodes in the rank world (default 1)")
    group.addoption("--ranks-per-node", type=int, default=2, help="ranks per node (default 2)")
    group.addoption(
        "--backends", default="auto",
        help="auto (real deep_ep if importable with CUDA, else the emulation), emulated, real, "
        "or a list such as emulated-v1,real-v2",
    )
    group.addoption("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="where ranks run: cuda (NCCL, one GPU per rank) or cpu (gloo); auto picks cuda if present")
    group.addoption("--report-dir", default="reports", help="where reports are written (default reports/)")
    group.addoption("--max-examples", type=int, default=DEFAULT_MAX_EXAMPLES,
                    help=f"Hypothesis examples per property (default {DEFAULT_MAX_EXAMPLES})")
    group.addoption("--example-timeout", type=float, default=120.0,
                    help="seconds one example may take on the ranks before they are declared hung (default 120)")
    group.addoption("--conformance-seed", type=int, default=None,
                    help="seed of every draw (default: random, printed in the report header)")
    group.addoption("--baseline", default=None,
                    help="a previous conformance.json: fail if a property regressed, a capability disappeared "
                    "or the API surface changed")
    group.addoption("--mutant", default=None, help="plant a registered mutant in the emulation (self-tests)")


def _build_config(config: pytest.Config) -> RunConfig:
    opt = config.option
    for name in ("nodes", "ranks_per_node", "max_examples"):
        if getattr(opt, name) < 1:
            raise pytest.UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(opt, name)}")
    if opt.example_timeout <= 0:
        raise pytest.UsageError(f"--example-timeout must be positive, got {opt.example_timeout}")
    try:
        backends = parse_backends(opt.backends, real_deep_ep_available())
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if opt.mutant is not None:
        from conformance.mutation import MUTANTS, mutants  # noqa: F401 - registers the catalog

        if opt.mutant not in MUTANTS:
            raise pytest.UsageError(f"--mutant {opt.mutant!r} is not registered; known: {sorted(MUTANTS)}")
    shape = WorldShape(opt.nodes, opt.ranks_per_node)
    device = opt.device if opt.device != "auto" else ("cuda" if visible_gpus() else "cpu")
    gpu_ids: tuple[str, ...] = ()
    if device == "cuda":
        index, _ = worker_index()
        gpu_ids = gpu_slice(visible_gpus(), index, shape.size)
    return RunConfig(
        shape=shape,
        backends=tuple(backends),
        device=device,
        example_timeout_s=opt.example_timeout,
        mutant=opt.mutant,
        gpu_ids=gpu_ids,
        rank_env=dict(GPU_RANK_ENV) if device == "cuda" else {},
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance_property(id): a DeepEP contract property test")
    run = _build_config(config)
    config.stash[CONFIG_KEY] = run
    config.stash[ENTRIES_KEY] = []
    run_config.set_active(run)
    workerinput = getattr(config, "workerinput", None)
    seed = workerinput["conformance_seed"] if workerinput else config.option.conformance_seed
    if seed is None:
        seed = random.randrange(2**32)
    config.option.conformance_seed = seed
    if getattr(config.option, "hypothesis_seed", None) is None:
        config.option.hypothesis_seed = seed
    settings.register_profile(
        "conformance",
        max_examples=config.option.max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        print_blob=True,
    )
    settings.load_profile("conformance")
    if workerinput is None and config.option.baseline:
        try:
            config.stash[BASELINE_KEY] = load_report(config.option.baseline)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    if workerinput is None and not config.option.xmlpath:
        config.option.xmlpath = os.path.join(config.option.report_dir, "junit.xml")
    config._conformance_started = time.monotonic()  # type: ignore[attr-defined]


def pytest_configure_node(node: Any) -> None:
    """(xdist controller) every worker gets the same seed."""
    node.workerinput["conformance_seed"] = node.config.option.conformance_seed


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """With GPUs, ``-n auto`` starts only as many workers as there are disjoint GPU slices."""
    if config.option.device == "cpu" or not visible_gpus():
        return None
    return max_gpu_workers(config.option.nodes * config.option.ranks_per_node)


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash[CONFIG_KEY]
    kinds = ", ".join(f"{b.name} ({'real' if b.real else 'emulated'})" for b in run.backends)
    return [
        f"conformance: backends {kinds}; world {run.shape.nodes} node(s) x {run.shape.ranks_per_node} rank(s) "
        f"on {run.device}; seed {config.option.conformance_seed}; max examples {config.option.max_examples}"
    ]


@pytest.fixture(scope="session")
def conformance(request: pytest.FixtureRequest) -> Any:
    """The worker's :class:`~conformance.session.Session` (its rank world starts on first use)."""
    session = Session(request.config.stash[CONFIG_KEY])
    request.config.stash[SESSION_KEY] = session
    yield session
    session.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    session = item.config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.recorder = Recorder()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    session = item.config.stash.get(SESSION_KEY, None)
    if report.when != "call" or session is None or item.get_closest_marker("conformance_property") is None:
        return
    recorded = session.recorder.as_dict()
    report.user_properties.append((USER_PROPERTY, recorded))
    if report.failed and recorded["last_example"]:
        repro = repro_command(recorded["id"], recorded["last_example"], item.config.stash[CONFIG_KEY])
        report.sections.append(("conformance reproduction", repro))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    config = _controller_config
    if config is None:
        return
    entry = entry_from_report(report, config.stash[CONFIG_KEY])
    if entry is not None:
        config.stash[ENTRIES_KEY].append(entry)


_controller_config: pytest.Config | None = None


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _controller_config
    if getattr(session.config, "workerinput", None) is None:
        _controller_config = session.config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if getattr(config, "workerinput", None) is not None:
        return
    run = config.stash[CONFIG_KEY]
    entries = config.stash[ENTRIES_KEY]
    if not entries and not any(i.get_closest_marker("conformance_property") for i in session.items):
        return  # not a conformance run (e.g. the self-tests): leave the last report alone
    probes = {"deep_ep": probe_module("deep_ep"), "conformance.emulation": probe_module("conformance.emulation")}
    env = environment(run, probes, config.option.conformance_seed)
    wall = time.monotonic() - config._conformance_started  # type: ignore[attr-defined]
    baseline = config.stash.get(BASELINE_KEY, None)
    document = write_reports(config.option.report_dir, env, entries, wall, baseline)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"conformance report: {document['path']}")
    if baseline is not None:
        gate = document["gate"]
        if reporter is not None:
            for line in gate["regressions"]:
                reporter.write_line(f"GATE REGRESSION {line}", red=True)
            reporter.write_line(f"version gate: {len(gate['regressions'])} regression(s), "
                                f"{len(gate['improvements'])} improvement(s) against {config.option.baseline}")
        if gate["regressions"] and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
