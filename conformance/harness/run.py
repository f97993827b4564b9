"""A selected conformance run: the object ``conformance.plugin`` registers with pytest when the suite runs.

It holds the run's state (configuration, the worker's session, the report entries) and implements the hooks
that only a conformance run needs: set-up checks, the xdist seed hand-over, the report header, recording each
property's outcome, progress, the reports, the version gate and the terminal summary.

Progress (through pytest's terminal reporter, never ``print``): when a property finishes, the controller writes
one line with its verdict, examples and time, and the examples done so far by the properties still running.
Those counts come from ``<report dir>/.progress/<worker>.json``, which each worker rewrites (at most once a
second) as examples finish: pytest-xdist forwards a test's report only when the test ends, so the controller reads
them whenever any report arrives.  Without xdist the running property also gets a line every 20 examples or
30 seconds.  ``-qq`` turns progress off.

SIGTERM (``timeout``, a CI job cancelled, ``kill``) stops a conformance run the way Ctrl-C does: the properties
that finished are reported, the report says the run was interrupted, and no rank process is left.  The handler
is installed only in the main thread of a selected run whose SIGTERM handler is still the default one (a host
that installed its own keeps it), and the default is restored when the run ends.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.core.outcomes import Status
from conformance.harness.options import Machine, SetupError, build_run_config, option_values
from conformance.world.launcher import describe_engine

#: Key of the resolved set-up handed from the xdist controller to its workers.
WORKER_INPUT = "conformance_run"
#: What a worker tells the controller when it ends: what conformance.emulation offers (the report's probes), so that
#: the controller need not import torch.
EMULATION_PROBE_KEY = "conformance_emulation_probe"


class ConformanceRun:
    """One conformance run, in the pytest controller or in one pytest-xdist worker."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        workerinput = getattr(config, "workerinput", None)
        self.is_worker = workerinput is not None
        self.started = time.monotonic()
        self.entries: list[Any] = []
        #: What ``conformance.emulation`` offers, probed by a worker (``None``: probed here, importing torch).
        self.emulation_probe: dict[str, Any] | None = None
        self.document: dict[str, Any] | None = None
        self.baseline: dict[str, Any] | None = None
        self.accept: Any = None  # the accepted changes of the bump (--accept-bump), with --baseline
        self.session: Any = None
        #: What the JIT warm-up did (``conformance.harness.jit.warm_up``), once it ran.
        self.warm_up: dict[str, Any] | None = None
        self._sigterm_installed = False
        values = option_values(config.option)
        seed_note = None
        if not self.is_worker and values["accept_bump"]:
            if not values["baseline"]:
                raise pytest.UsageError("--accept-bump lists accepted changes of a bump: it needs --baseline FILE")
            from conformance.reporting.accept import load_acceptance

            try:
                self.accept = load_acceptance(values["accept_bump"])
            except ValueError as exc:
                raise pytest.UsageError(str(exc)) from None
        if not self.is_worker and values["baseline"]:
            self.baseline = self._load_baseline(values["baseline"])
            seed = self.baseline.get("environment", {}).get("seed")
            if config.option.conformance_seed is None and isinstance(seed, int):
                # Same draws as the baseline: the gate compares the two builds on the same examples (a divergence
                # or known defect a random draw happens to miss is not mistaken for a change).
                config.option.conformance_seed = seed
                seed_note = f"seed {seed} taken from the baseline (--conformance-seed overrides it)"
        try:
            self.run = self._resolve(workerinput)
        except SetupError as exc:
            raise pytest.UsageError(str(exc)) from None
        if seed_note:
            import dataclasses

            self.run = dataclasses.replace(self.run, notes=(*self.run.notes, seed_note))
        self.report_dir = values["report_dir"]
        self.write_baseline = values["write_baseline"]
        self.worker_id = workerinput.get("workerid", "gw0") if workerinput is not None else "main"
        #: This run's name among the runs of its report folder: the xdist workers' one shared JIT warm-up is kept
        #: under it (``jit.warm_up_once``).
        self.run_key = (workerinput[WORKER_INPUT].get("run_key") if workerinput is not None
                        else f"{os.getpid()}-{time.time_ns()}")
        self.progress_dir = os.path.join(os.path.abspath(self.report_dir), ".progress")
        self._last_progress = (0.0, 0)
        self.done = 0
        if not self.is_worker:
            for stale in (os.listdir(self.progress_dir) if os.path.isdir(self.progress_dir) else []):
                try:  # progress files of an earlier run that was killed
                    os.remove(os.path.join(self.progress_dir, stale))
                except OSError:
                    pass
            from conformance.harness.jit import forget_shared_warm_ups

            forget_shared_warm_ups(self.report_dir)  # what earlier runs' workers left (jit.warm_up_once)
            if not config.option.xmlpath and not config.option.collectonly:
                config.option.xmlpath = os.path.join(self.report_dir, "junit.xml")
        self._install_sigterm()

    # ------------------------------------------------------------------------------------------ SIGTERM
    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # the host (an IDE, a runner) handles SIGTERM itself: not ours to change
        signal.signal(signal.SIGTERM, _terminated)
        self._sigterm_installed = True

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._sigterm_installed and signal.getsignal(signal.SIGTERM) is _terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._sigterm_installed = False

    def _resolve(self, workerinput: dict[str, Any] | None) -> Any:
        """The run configuration: checked in the controller, handed to the workers as resolved values."""
        option = self.config.option
        if workerinput is None:
            workers = getattr(option, "numprocesses", None) or 1
            dist = getattr(option, "dist", "no")
            return build_run_config(option, workers=workers if isinstance(workers, int) and dist != "no" else 1)
        resolved = workerinput[WORKER_INPUT]
        from types import SimpleNamespace

        values = {**vars(option), **resolved["options"]}
        machine = Machine(tuple(resolved["gpus"]), dict(resolved.get("deep_ep_probe") or {"importable": True}),
                          dict(resolved.get("plugins") or {}))
        index = int(workerinput.get("workerid", "gw0").removeprefix("gw"))
        return build_run_config(SimpleNamespace(**values), machine, worker=index, workers=resolved["workers"])

    def _load_baseline(self, path: str) -> dict[str, Any]:
        from conformance.reporting.gate import load_report

        try:
            baseline = load_report(path)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        if baseline.get("complete") is False and not self.config.option.allow_partial:
            raise pytest.UsageError(
                f"--baseline {path} is a partial run ({baseline.get('incomplete_reason')}): a version gate needs "
                f"a complete baseline; pass --allow-partial to compare anyway")
        return baseline

    # ------------------------------------------------------------------------------------------- xdist
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """(xdist controller) every worker gets the controller's resolved set-up and seed."""
        run = self.run
        node.workerinput[WORKER_INPUT] = {
            "options": {"backends": ",".join(b.name for b in run.backends), "device": run.device,
                        "conformance_seed": run.seed, "deep_ep": run.deep_ep_mode},  # emulation:VERSION
            "plugins": run.plugin_probes,
            # what the real deep_ep's probe found (its version and classes: the contract of the real backends)
            "deep_ep_probe": run.deep_ep_probe,
            "gpus": list(_gpus_for_workers(run)),
            "workers": getattr(self.config.option, "numprocesses", 1) or 1,
            "run_key": self.run_key,  # the workers' one JIT warm-up is this run's (jit.warm_up_once)
        }

    # ------------------------------------------------------------------------------------------ header
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        run = self.run
        kinds = ", ".join(f"{b.name} ({describe_kind(b)})" for b in run.backends)
        lines = [f"conformance: backends {kinds}; world {run.shape.nodes} node(s) x {run.shape.ranks_per_node} "
                 f"rank(s) on {run.device}; seed {run.seed}; max examples {run.max_examples}"
                 + (f", rounds of them for {run.time_budget_s:g} s per property (--time-budget)"
                    if run.time_budget_s else "")]
        lines.append("conformance: shapes " + (f"{run.shapes} (the bounded vocabulary: python -m "
                                               f"conformance.strategies.vocabulary)" if run.shapes else "free"))
        engine = describe_engine(run.rdzv_endpoint, run.shape, run.remote_nodes, device=run.device)
        lines.append(f"conformance: launcher {engine['launcher']}; rendezvous {engine['rendezvous']}")
        return lines + [f"conformance: {note}" for note in run.notes]

    # ---------------------------------------------------------------------------------- the worker side
    def session_fixture(self, selected: frozenset[str] | None = None) -> Iterator[Any]:
        """Body of the ``conformance`` fixture: the worker's session, closed at the end (``selected``: the property
        ids the run selected, which the JIT warm-up compiles for)."""
        from conformance.harness.session import Session

        if self.session is None:  # else made at collection, its node agents already loading torch
            self.session = Session(self.run)
        session = self.session
        session.on_progress = self._progress
        if self.run.warm_up and self.warm_up is None:
            from conformance.harness.jit import warm_up, warm_up_once

            progress = lambda line: self._write_progress(line, live=True)  # noqa: E731
            if self.is_worker:  # one warm-up for all the workers: the first makes it, the others wait for it
                self.warm_up = warm_up_once(self.run, self.report_dir, progress, selected, key=self.run_key,
                                            who=self.worker_id)
            else:
                self.warm_up = warm_up(self.run, self.report_dir, progress, selected)
        try:
            yield session
        finally:
            # (an interrupted run may have closed and dropped it already: pytest_sessionfinish runs first then)
            session.close()
            self.session = None
            if self.is_worker:
                try:
                    os.remove(os.path.join(self.progress_dir, f"{self.worker_id}.json"))
                except OSError:
                    pass

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Where this process runs the property tests (an xdist worker, or pytest without xdist), start this host's
        node agents before collection: they load torch (seconds) while pytest collects and Hypothesis draws the
        first case, and the first world start only waits for what is left.  (Nothing starts in an xdist
        controller, for ``--collect-only``, or where no property is selected in the end: closed at the finish.)"""
        option = self.config.option
        in_process = not getattr(option, "numprocesses", None) and getattr(option, "dist", "no") == "no"
        if option.collectonly or self.session is not None or not (self.is_worker or in_process):
            return
        from conformance.harness.session import Session

        try:
            self.session = Session(self.run)
            self.session.world.prepare()
        except Exception:  # noqa: BLE001 - an early start only: the fixture makes it again and reports what fails
            if self.session is not None:
                self.session.close()
            self.session = None

    # ---------------------------------------------------------------------------------------- progress
    def _progress(self, property_id: str, examples: int) -> None:
        """(worker side) one more example of ``property_id`` done."""
        now = time.monotonic()
        last_time, last_count = self._last_progress
        if self.is_worker:
            if now - last_time < 1.0:
                return
            self._last_progress = (now, examples)
            os.makedirs(self.progress_dir, exist_ok=True)
            path = os.path.join(self.progress_dir, f"{self.worker_id}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"property": property_id, "examples": examples, "max_examples": self.run.max_examples,
                           "time": time.time()}, f)
            os.replace(path + ".tmp", path)
            return
        if examples < last_count:
            last_count = 0
        if examples - last_count >= 20 or (now - last_time >= 30.0 and examples > last_count):
            self._last_progress = (now, examples)
            self._write_progress(f"conformance: {property_id} running, {examples} examples done "
                                 + (f"(rounds of {self.run.max_examples} for up to {self.run.time_budget_s:g} s)"
                                    if self.run.time_budget_s else
                                    f"(at most {self.run.max_examples} drawn, plus shrinking)"))

    def _write_progress(self, line: str, live: bool = False, **style: bool) -> None:
        """A progress line on the terminal (``live``: now, past pytest's output capture of a running test)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or self.config.get_verbosity() <= -2:
            return
        capture = self.config.pluginmanager.get_plugin("capturemanager") if live else None
        if capture is None:
            reporter.write_line(line, **style)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(line, **style)

    def _running(self) -> list[str]:
        """(controller) ``P1-... 12 examples`` per property a worker is running now."""
        out = []
        try:
            names = sorted(os.listdir(self.progress_dir))
        except OSError:
            return out
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.progress_dir, name)) as f:
                    seen = json.load(f)
            except (OSError, ValueError):
                continue
            out.append(f"{seen['property']} {seen['examples']} examples ({name[:-5]})")
        return out

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        if self.session is not None:
            from conformance.harness.session import Recorder

            self.session.recorder = Recorder()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
        report = yield
        if report.when != "call" or self.session is None or item.get_closest_marker("conformance_property") is None:
            return report
        from conformance.reporting.report import USER_PROPERTY, repro_command

        recorded = self.session.recorder.as_dict()
        report.user_properties.append((USER_PROPERTY, recorded))
        if report.failed and recorded["last_example"]:
            report.sections.append(("conformance reproduction",
                                    repro_command(recorded["id"], recorded["last_example"], self.run)))
        return report

    # ------------------------------------------------------------------------------ the controller side
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" or self.is_worker:
            return
        from conformance.reporting.report import entry_from_report

        entry = entry_from_report(report, self.run, self.report_dir)
        if entry is not None:
            self.entries.append(entry)
            self.done += 1
            running = [r for r in self._running() if not r.startswith(entry.id + " ")]
            counts = "".join(f", {name} {v['held']}/{v['checked']}" for name, v in entry.verdicts.items()
                             if v.get("status") != "not-checked")
            self._write_progress(
                f"conformance: [{self.done} done] {entry.id} {entry.status}: {entry.examples} examples in "
                f"{entry.wall_s:.1f} s (held/checked{counts or ' -'})"
                + (f"; running: {'; '.join(running)}" if running else ""),
                red=entry.status in (Status.FAILED, Status.SUITE_ERROR))

    def _jit(self) -> dict[str, Any] | None:
        """The run's JIT: its compile log (where the ranks logged one) and the warm-up."""
        from conformance.harness.jit import LOG_ENV, summary

        log = self.run.rank_env.get(LOG_ENV)
        if not log:
            return None
        wall = time.monotonic() - self.started
        out = summary(log, time.time() - wall, wall)
        if self.warm_up is None:  # with xdist: the warm-up one worker made for all
            from conformance.harness.jit import shared_warm_up

            self.warm_up = shared_warm_up(self.report_dir, self.run_key)
        out["warm_up"] = self.warm_up
        return out

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
        """Ctrl-C or SIGTERM, wherever it landed (an example, a world start, between properties): this process's
        world is killed now, before the fixtures' teardown would shut it down cleanly (seconds under load)."""
        if self.session is not None:
            self.session.abandon()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """An xdist worker ended: keep its probe of the emulation (the controller does not import it)."""
        output = getattr(node, "workeroutput", {})
        if output.get(EMULATION_PROBE_KEY):
            self.emulation_probe = dict(output[EMULATION_PROBE_KEY])

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.session is not None:  # prepared at collection, never used (e.g. -x stopped before any property)
            self.session.close()
            self.session = None
        if self.is_worker and hasattr(self.config, "workeroutput"):
            from conformance.core.probe import probe_module

            self.config.workeroutput[EMULATION_PROBE_KEY] = probe_module("conformance.emulation")  # loaded: cheap
        if self.is_worker or self.config.option.collectonly:
            return
        from conformance.reporting.report import finish_run

        try:
            os.rmdir(self.progress_dir)  # the workers removed their files; an empty folder is left otherwise
        except OSError:
            pass

        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop)
        self.document = finish_run(self.report_dir, self.run, self.entries, time.monotonic() - self.started,
                                   jit=self._jit(),
                                   baseline=self.baseline, interrupted=interrupted,
                                   allow_partial=bool(self.config.option.allow_partial),
                                   write_baseline=self.write_baseline,
                                   emulation_probe=self.emulation_probe, accept=self.accept,
                                   baseline_path=option_values(self.config.option)["baseline"])
        if self.baseline is not None:  # the gate's verdict is the exit status (reporting.gate.exit_status)
            from conformance.reporting.gate import exit_status

            session.exitstatus = exit_status(bool(self.document.get("gate_failed")), int(session.exitstatus))
        if (self.document.get("gate_failed") or self.document.get("baseline_refused")) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Iterator[None]:
        document = self.document
        if document is not None and document.get("headline"):
            terminalreporter.section("DeepEP conformance", sep="=", red=True, bold=True)
            for line in document["headline"]:
                terminalreporter.write_line(line, red=True, bold=True)
        yield
        if document is None:
            return
        from conformance.reporting.report import summary_lines

        terminalreporter.section("DeepEP conformance summary", sep="-")
        for line, style in summary_lines(document):
            terminalreporter.write_line(line, **style)


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM: stop as Ctrl-C stops (pytest reports what finished, the sessions close their rank worlds).

    A terminal's Ctrl-C reaches the whole process group; a ``kill PID`` reaches this process only, so the
    children (xdist workers, rank processes) get the SIGINT they would have got from Ctrl-C: each worker then
    reports and closes its world at once instead of being waited for."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    for child in _children():
        try:
            os.kill(child, signal.SIGINT)
        except OSError:
            pass
    raise KeyboardInterrupt("SIGTERM: the run was terminated")


def _children() -> list[int]:
    """This process's direct children (Linux ``/proc``; elsewhere none, and the workers are waited for)."""
    pids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{os.getpid()}/task"):
            with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
                pids += [int(pid) for pid in f.read().split()]
    except OSError:
        return []
    return pids


def describe_kind(spec: Any) -> str:
    """``real, deep_ep 2.5.0: EPBuffer`` / ``emulated, DeepEP 2.5.0: EPBuffer`` (the version the backend is driven by
    and its class, or why the version has no such API), or for a plug-in ``plug-in v1 on real deep_ep`` (what it
    wraps)."""
    if spec.substitute:
        return f"class backend, {spec.api} contract, {'the real library' if spec.real else 'real: false'}"
    if not spec.plugin:
        what = "not in this version" if spec.removed else spec.class_name
        return (f"real, deep_ep {spec.contract.version}: {what}" if spec.real
                else f"emulated, DeepEP {spec.contract.version}: {what}")
    on = {"real": "on the real deep_ep", "emulation": "on conformance.emulation", None: "without deep_ep"}
    return f"plug-in, {spec.api} contract, {on[spec.deep_ep]}"


def _gpus_for_workers(run: Any) -> tuple[str, ...]:
    """All GPUs visible to the controller (each worker takes its own slice)."""
    if run.device != "cuda":
        return ()
    from conformance.harness.devices import visible_gpus

    return tuple(visible_gpus())
