"""The suite's command-line options: declared once, validated before anything starts.

:data:`OPTIONS` is what ``pytest_addoption`` registers (``conformance.plugin``) and what ``conformance.repro`` and
the kill matrix add to their parsers (:func:`add_options`).  Every option defaults to ``None`` on the command line,
so the plugin can tell "given" from "not given" (a given option selects the suite); :data:`DEFAULTS` fills the rest.
:func:`build_run_config` turns them into a :class:`~conformance.harness.config.RunConfig`, resolver by resolver, or
raises :class:`SetupError` with one line naming what is wrong and how to fix it: an impossible set-up never starts a
world.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from conformance.harness.config import DEFAULT_MAX_EXAMPLES

if TYPE_CHECKING:
    from conformance.core.spec import AskedBackends, BackendSpec
    from conformance.harness.config import RunConfig
    from conformance.world.launcher import WorldShape

#: Environment passed to every rank on GPUs (NVLink multicast stays off on shared hosts).
GPU_RANK_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
DEVICES = ("auto", "cpu", "cuda")
RANK_SETUPS = ("isolated", "recorder", "shared")
DEEP_EP_MODES = ("emulation", "real", "auto")
#: Environment variable giving ``--deep-ep`` its default (and naming the resolved mode for the ranks).
DEEP_EP_ENV = "CONFORMANCE_DEEP_EP"


@dataclass(frozen=True)
class Option:
    """One command-line option of the suite."""

    flag: str
    help: str
    type: Any = str
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        """The attribute on ``config.option``."""
        return self.flag.lstrip("-").replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("--nodes", "nodes in the rank world (default 1)", int, 1, "N"),
    Option("--ranks-per-node", "ranks per node (default 2)", int, 2, "R"),
    Option("--backends", "auto (the real deep_ep where it is usable, else the emulation), emulated, real, or a "
           "list such as emulated-v1,real-v2 (default auto)", str, "auto", "LIST"),
    Option("--device", "where ranks run: cuda (NCCL, one GPU per rank), cpu (gloo), or auto: cuda when there is "
           "a GPU for every rank (default auto)", str, "auto", "DEVICE", DEVICES),
    Option("--rank-setup", "on GPUs: isolated (each rank sees only its own GPU; buffers on the default group), "
           "recorder (every rank sees its node's GPUs and calls set_device(LOCAL_RANK); buffers on "
           "dist.new_group(list(range(world))), the set-up fixtures/deepep-real was recorded with), or shared "
           "(every rank on one GPU, time-sliced, over a gloo group, for a machine with fewer GPUs than ranks: "
           "V1's intranode path; V2 too where NCCL_MULTI_RANK_GPU_ENABLE=1 is set; one node; with -n K every "
           "worker's world on that GPU, -n auto: min(4, cores // 4) worlds) (default isolated)", str, "isolated",
           "SETUP", RANK_SETUPS),
    Option("--report-dir", "where reports (conformance.json/.md/.html, junit.xml) and the stored counterexamples "
           "(hypothesis/, replayed first by the next run) go (default reports)", str, "reports", "DIR"),
    Option("--max-examples", f"Hypothesis examples per property (default {DEFAULT_MAX_EXAMPLES})", int,
           DEFAULT_MAX_EXAMPLES, "N"),
    Option("--time-budget", "seconds each property keeps drawing: after its --max-examples, more rounds of "
           "--max-examples new draws (seeds seed+1, seed+2, ...; no explicit or stored cases again) while fewer than S "
           "seconds have passed since the property started; stateful and soak properties run once (default 0: off)",
           float, 0.0, "S"),
    Option("--soak", "soak mode: repeat the soak property's chosen examples (large shapes on GPUs: 4096 tokens per "
           "rank, hidden 7168, top-8 of 256 experts; small ones on CPU) N times, every repetition compared bitwise "
           "with the first and with the oracle; reports repetitions, rows compared, corrupted rows and the time "
           "(default 0: off, P31-soak is skipped)", int, 0, "N"),
    Option("--example-timeout", "seconds one example may take on the ranks before they are declared hung "
           "(default 120)", float, 120.0, "S"),
    Option("--max-restarts", "world restarts after crashes or hangs that one property may spend before it is "
           "reported with the smallest failing case found; a run may spend 4 times as many (default 3)",
           int, 3, "N"),
    Option("--conformance-seed", "seed of every draw (default: random, printed in the header and the report)",
           int, None, "N"),
    Option("--baseline", "a previous conformance.json (or a file of --write-baseline): explain the bump (bump.md) and "
           "fail, one paragraph per reason, if a property that held fails, a capability became unsupported, a "
           "divergence or known defect appeared, vanished or changed, the API surface changed incompatibly or a "
           "wrapper stopped using DeepEP (the exit status is the gate's verdict)", str, None, "FILE"),
    Option("--accept-bump", "with --baseline: a TOML file of accepted changes ([[accept]] finding = ID or pattern, "
           "why = ...; ids as bump.md prints them): the gate reports them and does not fail on them "
           "(docs/reference.md)", str, None, "FILE"),
    Option("--known-defects", "known-defects file (default auto: conformance/versions/<version>/known-defects.toml "
           "of the DeepEP version under test; none: no known defects)", str, None, "FILE"),
    Option("--mutant", "plant a registered defect in the emulation (self-tests; see docs/mutation.md)", str, None,
           "NAME"),
    Option("--deep-ep", "what 'import deep_ep' gives in the rank processes, for plug-in backends and other "
           "third-party code: emulation (the emulation of DeepEP 2.1.0 under the name deep_ep), emulation:VERSION "
           "(the emulation of that DeepEP version, e.g. emulation:2.5.0; the emulated backends run on it too), real, "
           "or auto (the real library where it imports and the ranks have GPUs, else the emulation); default: no "
           "alias (environment variable CONFORMANCE_DEEP_EP)", str, None, "MODE"),
    Option("--rdzv-endpoint", "HOST:PORT the world's c10d rendezvous store listens on; other hosts join with "
           "'python -m conformance.serve --rdzv-endpoint HOST:PORT --token-file FILE' (default 127.0.0.1:0: this "
           "host only, any free port)", str, "127.0.0.1:0", "HOST:PORT"),
    Option("--remote-nodes", "how many of the --nodes are served by other hosts (default 0: every node's agent is "
           "started here)", int, 0, "K"),
    Option("--world-token-file", "write the world's secret token (hex) to FILE, for the other hosts' "
           "--token-file (default: a random token nobody else learns)", str, None, "FILE"),
    Option("--node-wait", "seconds a world start waits for the remote nodes before failing (default 300)", float,
           300.0, "S"),
    Option("--shapes", "the shapes examples are drawn with: free, jit (a bounded vocabulary of hidden / top-k / "
           "experts / pinned maximum / alignment, so that DeepEP V2's JIT compiles each kernel once: python -m "
           "conformance.strategies.vocabulary lists it), or auto: jit where a backend compiles per shape (the real V2, "
           "or a plug-in / class backend over it), else free (default auto)", str, "auto", "MODE"),
    Option("--warm-up", "auto: where a backend compiles per shape and the run draws on the jit vocabulary, compile its "
           "kernels before the first property, in small runs side by side (conformance.harness.jit); off (default "
           "auto; on: wherever the run draws on a vocabulary, also over the emulation)", str, "auto", "MODE",
           ("auto", "on", "off")),
    Option("--write-baseline", "also write this run's conformance.json to FILE, for a later --baseline (refused "
           "for a partial run unless --allow-partial)", str, None, "FILE"),
)
DEFAULTS = {option.dest: option.default for option in OPTIONS}


def add_options(parser: Any, flags: tuple[str, ...], **defaults: Any) -> None:
    """Add the suite options ``flags`` to an ``argparse`` parser (``conformance.repro``, the kill matrix) as the
    table declares them (type, metavar, choices, help); ``defaults`` (by dest) where the tool's own default differs
    from the plug-in's, said in the help."""
    unknown = set(flags) - {option.flag for option in OPTIONS}
    if unknown:
        raise ValueError(f"not options of the suite: {', '.join(sorted(unknown))}")
    for option in OPTIONS:
        if option.flag in flags:
            default = defaults.get(option.dest, option.default)
            parser.add_argument(option.flag, type=option.type, default=default, metavar=option.metavar,
                                choices=option.choices, help=option.help.replace("%", "%%") + (
                                    f"; here the default is {default}" if option.dest in defaults else ""))
#: Flags without a value.
FLAGS = (
    ("--conformance", "run the DeepEP conformance suite (implied by any other option of the suite, or by "
     "naming its property tests)"),
    ("--allow-partial", "let the version gate compare partial runs (a subset of the properties, or an "
     "interrupted run)"),
)


class SetupError(ValueError):
    """The options describe a run that cannot work; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Machine:
    """What the run may use here (found once, in the controller; injectable for tests)."""

    gpus: tuple[str, ...]
    deep_ep: dict[str, Any]  # probe result of the real deep_ep (``importable``, ``error``, ``version``, ...)
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)  # target -> declaration probe (when known)


def option_values(option: Any) -> dict[str, Any]:
    """Every suite option's value, defaults filled in (``option`` is ``config.option`` or an argparse result)."""
    values = {dest: getattr(option, dest, None) for dest in DEFAULTS}
    return {dest: DEFAULTS[dest] if value is None else value for dest, value in values.items()}


def given_options(option: Any) -> list[str]:
    """The suite options given on the command line (either spelling), as flags."""
    given = [o.flag for o in OPTIONS if getattr(option, o.dest, None) is not None]
    return given + [flag for flag, _ in FLAGS if getattr(option, flag[2:].replace("-", "_"), False)]


def detect_machine(real_asked: bool) -> Machine:
    """GPUs visible here (without creating a CUDA context) and, where the real deep_ep could be used, whether it
    imports (probed in a subprocess, so that a library crashing on import cannot take pytest with it)."""
    from conformance.core.probe import probe_in_subprocess
    from conformance.harness.devices import visible_gpus

    gpus = tuple(visible_gpus())
    if not gpus and not real_asked:
        return Machine(gpus, {"module": "deep_ep", "importable": False, "error": "not probed: no GPU here"})
    return Machine(gpus, probe_in_subprocess("deep_ep"))


def deep_ep_option(values: dict[str, Any]) -> tuple[str | None, str | None]:
    """``--deep-ep``, or the environment's :data:`DEEP_EP_ENV` when the option is not given: ``(mode, version)``
    (``("emulation", "2.5.0")`` for ``emulation:2.5.0``; ``(None, None)``: no alias)."""
    from conformance import versions
    from conformance.backends.alias import parse

    mode = values.get("deep_ep") or os.environ.get(DEEP_EP_ENV, "").strip() or None
    if mode is None:
        return None, None
    try:
        return parse(mode)
    except ValueError as exc:
        raise SetupError(f"--deep-ep (or {DEEP_EP_ENV}) must be one of {', '.join(DEEP_EP_MODES)} or emulation:VERSION "
                         f"(VERSION one of {', '.join(versions.emulated_versions())}): {exc}") from None


def library_versions(specs: list[Any], deep_ep: str | None, emulation_version: str | None,
                     real_deep_ep: dict[str, Any]) -> tuple[list[Any], str, list[str]]:
    """Every spec with the DeepEP version it is driven by (``BackendSpec.version``), the emulation's version, and
    notes for the report header.

    The real ``deep_ep``'s version is its ``__version__`` and the API it finds (``conformance.versions.contract_for``:
    an unknown version is driven with the contract of the version whose classes it exports).  The emulation's is the
    one ``--deep-ep emulation:VERSION`` names, else the real one's where a real backend is selected and the emulation
    models that version (real and emulated backends side by side on one version), else the default."""
    from conformance import versions

    notes: list[str] = []
    real_version = None
    if real_deep_ep.get("importable"):
        exports = [name for name in ("Buffer", "ElasticBuffer", "EPBuffer") if real_deep_ep.get(name)]
        found, note = versions.contract_for(real_deep_ep.get("version"), exports)
        real_version = found.version
        if note:
            notes.append(note)
    uses_real = any(s.impl == "real" or (s.deep_ep == "real" and (s.plugin or s.substitute)) for s in specs)
    if emulation_version is None:
        emulation_version = (real_version if uses_real and real_version in versions.emulated_versions()
                             else versions.DEFAULT_VERSION)
    out = []
    for spec in specs:
        real = spec.impl == "real" or (spec.deep_ep == "real" and (spec.plugin or spec.substitute))
        spec = replace(spec, version=real_version if real else emulation_version)
        if spec.removed:
            notes.append(f"{spec.name}: unsupported: {spec.removed} (every property; nothing runs on it)")
        out.append(spec)
    return out, emulation_version, notes


def resolve_plugins(specs: list[Any], machine: Machine, deep_ep: str | None, real_deep_ep: dict[str, Any],
                    mutant: str | None = None) -> tuple[list[Any], list[str]]:
    """Read every plug-in's declaration (probed in a subprocess, with deep_ep resolved as on the ranks) and
    resolve its spec; :class:`SetupError` for a plug-in that does not import or declares nothing valid.
    Returns the specs and notes for the report header."""
    from conformance.core.spec import resolve_plugin

    out, notes = [], []
    for spec in specs:
        if spec.substitute:
            resolved, note = _resolve_class(spec, machine, deep_ep, real_deep_ep)
            out.append(resolved)
            notes.append(note)
            continue
        if not spec.plugin:
            out.append(spec)
            continue
        found = machine.plugins.get(spec.target)
        if found is None:
            from conformance.backends.plugins import probe_in_subprocess  # imports torch: only for a plug-in

            found = machine.plugins[spec.target] = probe_in_subprocess(spec.target, deep_ep, mutant=mutant)
        if not found.get("importable"):
            hint = "" if deep_ep else " (if it imports deep_ep and there is none here, pass --deep-ep emulation)"
            raise SetupError(f"--backends {spec.target}: the plug-in does not load: {found.get('error')}{hint}")
        kind = deep_ep.partition(":")[0] if deep_ep else ("real" if real_deep_ep.get("importable") else None)
        if found.get("uses_deep_ep", True) and kind is None:
            raise SetupError(f"--backends {spec.target}: the plug-in uses deep_ep, which does not import here "
                             f"({real_deep_ep.get('error')}); pass --deep-ep emulation (or auto) to run it on "
                             f"conformance.emulation")
        resolved = resolve_plugin(spec, found, kind)
        out.append(resolved)
        notes.append(f"plug-in {resolved.name} ({resolved.source}): follows the {resolved.api} ({resolved.class_name}) "
                     f"contract, declares {', '.join(sorted(resolved.capabilities)) or 'no capability'}"
                     + (f"; deep_ep = {'the real library' if kind == 'real' else 'conformance.emulation'}"
                        if resolved.deep_ep else "; does not use deep_ep"))
    return out, notes


def _resolve_class(spec: Any, machine: Machine, deep_ep: str | None, real_deep_ep: dict[str, Any]) -> tuple[Any, str]:
    """A class backend (``v2=pkg.mod:Class``) probed in a subprocess: importable, with the API's methods; ``real``
    only when the class is the real library's own."""
    key = spec.name
    found = machine.plugins.get(key)
    if found is None:
        from conformance.backends.plugins import probe_in_subprocess

        found = machine.plugins[key] = probe_in_subprocess(spec.target, deep_ep, api=spec.api)
    if not found.get("importable"):
        hint = "" if deep_ep else " (if it imports deep_ep and there is none here, pass --deep-ep emulation)"
        raise SetupError(f"--backends {spec.name}: the class does not load: {found.get('error')}{hint}")
    kind = deep_ep.partition(":")[0] if deep_ep else ("real" if real_deep_ep.get("importable") else None)
    declared = found.get("capabilities")
    resolved = replace(spec, deep_ep=kind if found.get("uses_deep_ep", True) else None,
                       library=bool(found.get("library")), description=str(found.get("description") or ""),
                       declared=None if declared is None else frozenset(declared))
    return resolved, (f"class backend {resolved.name}: {resolved.description}, driven by the built-in "
                      f"{resolved.api} adapter through its public API" + (
                          " (the real library's own class)" if resolved.library else "; real: false")
                      + (f"; declares {', '.join(sorted(declared)) or 'no capability'}" if declared is not None
                         else "; declares nothing: its instance is probed at run time"))


def build_run_config(option: Any, machine: Machine | None = None, *, worker: int = 0, workers: int = 1
                     ) -> RunConfig:
    """The :class:`~conformance.harness.config.RunConfig` of ``option`` (``config.option`` or an argparse result),
    resolved step by step by the resolvers below, each checking its part; :class:`SetupError` if the run cannot
    work."""
    from conformance.harness.config import RunConfig

    v = option_values(option)
    _check_numbers(v)
    shape = _world_shape(v, workers)
    asked = _asked_backends(v)
    deep_ep, emulation_version = _asked_deep_ep(v, asked, shape)
    machine = _machine(machine, asked, deep_ep)
    _check_real_here(v, asked, deep_ep, machine)
    placed = _placement(v, shape, machine, asked.named, asked.real or deep_ep == "real", worker, workers)
    chosen = _backends(v, asked, deep_ep, emulation_version, machine, placed.device == "cuda" and shape.size >= 2)
    _check_mutant(v, chosen.named)
    known_defects = _known_defects(v)
    rank_env = dict(GPU_RANK_ENV) if placed.device == "cuda" else {}
    # resolved here; the ranks never see "auto" (nor an inherited value)
    rank_env[DEEP_EP_ENV] = (f"emulation:{chosen.emulation_version}" if chosen.deep_ep == "emulation"
                             else chosen.deep_ep) or ""
    shapes, shape_notes, warm_up = _shapes(v, chosen.named, rank_env)
    return RunConfig(
        shape=shape,
        backends=chosen.named,
        device=placed.device,
        example_timeout_s=v["example_timeout"],
        mutant=v["mutant"],
        gpu_ids=placed.gpu_ids,
        rank_env=rank_env,
        max_examples=v["max_examples"],
        time_budget_s=v["time_budget"],
        soak=v["soak"],
        seed=v["conformance_seed"] if v["conformance_seed"] is not None else random.randrange(2**32),
        max_restarts=v["max_restarts"],
        notes=(*placed.notes, *chosen.notes, *shape_notes),
        deep_ep_probe=dict(machine.deep_ep),
        deep_ep=chosen.deep_ep,
        emulation_version=chosen.emulation_version,
        rank_setup=v["rank_setup"],
        plugin_probes={**{spec.target: machine.plugins[spec.target] for spec in chosen.named if spec.plugin},
                       **{spec.name: machine.plugins[spec.name] for spec in chosen.named if spec.substitute}},
        known_defects=known_defects,
        database_dir=os.path.join(os.path.abspath(v["report_dir"]), "hypothesis"),
        rdzv_endpoint=v["rdzv_endpoint"],
        remote_nodes=v["remote_nodes"],
        world_token_file=v["world_token_file"],
        node_wait_s=v["node_wait"],
        shapes=shapes,
        warm_up=warm_up,
    )


# ---------------------------------------------------------------------------------------- the resolvers, in order
def _check_numbers(v: dict[str, Any]) -> None:
    """The numeric options and ``--device``: in range."""
    for dest in ("nodes", "ranks_per_node", "max_examples"):
        if v[dest] < 1:
            raise SetupError(f"--{dest.replace('_', '-')} must be at least 1, got {v[dest]}")
    if v["soak"] < 0:
        raise SetupError(f"--soak must be 0 (off) or a number of repetitions, got {v['soak']}")
    if v["max_restarts"] < 0:
        raise SetupError(f"--max-restarts must be 0 or more, got {v['max_restarts']}")
    if v["time_budget"] < 0:
        raise SetupError(f"--time-budget must be 0 (off) or a number of seconds, got {v['time_budget']:g}")
    if v["example_timeout"] <= 0:
        raise SetupError(f"--example-timeout must be positive, got {v['example_timeout']}")
    if v["device"] not in DEVICES:
        raise SetupError(f"--device must be one of {', '.join(DEVICES)}, got {v['device']!r}")


def _asked_backends(v: dict[str, Any]) -> AskedBackends:
    """``--backends`` read (plug-ins unresolved; ``auto`` decided once the machine is known)."""
    from conformance.core.spec import asked_backends

    try:
        return asked_backends(v["backends"])
    except ValueError as exc:
        raise SetupError(str(exc)) from None


def _world_shape(v: dict[str, Any], workers: int) -> WorldShape:
    """The world's nodes and ranks, and the other hosts' part in it."""
    from conformance.world.launcher import WorldShape

    shape = WorldShape(v["nodes"], v["ranks_per_node"])
    if not 0 <= v["remote_nodes"] <= v["nodes"]:
        raise SetupError(f"--remote-nodes must be between 0 and --nodes ({v['nodes']}), got {v['remote_nodes']}")
    if v["remote_nodes"] and workers > 1:
        raise SetupError("--remote-nodes: the other hosts join one world at --rdzv-endpoint: run without -n")
    if v["remote_nodes"] and v["rdzv_endpoint"].endswith(":0"):
        raise SetupError("--remote-nodes needs a fixed --rdzv-endpoint HOST:PORT the other hosts can reach")
    return shape


def _asked_deep_ep(v: dict[str, Any], asked: AskedBackends, shape: WorldShape) -> tuple[str | None, str | None]:
    """``--deep-ep`` (:func:`deep_ep_option`), checked against the backends asked for and the world's size."""
    deep_ep, emulation_version = deep_ep_option(v)
    if asked.real and deep_ep == "emulation":
        raise SetupError(f"--backends {v['backends']} with --deep-ep emulation: the ranks' deep_ep would be the "
                         f"emulation, so a real backend cannot run; drop --deep-ep or use --backends emulated (the "
                         f"emulated backends follow the real deep_ep's version where the emulation models it)")
    if (asked.real or deep_ep == "real") and shape.size < 2:
        raise SetupError(
            f"{'--backends ' + v['backends'] if asked.real else '--deep-ep real'}: the real DeepEP needs at least 2 "
            f"ranks (it asserts 'Unsupported number of EP ranks: 1'), and this world has {shape.size}; use "
            f"--ranks-per-node 2 (or --nodes 2)"
        )
    return deep_ep, emulation_version


def _machine(machine: Machine | None, asked: AskedBackends, deep_ep: str | None) -> Machine:
    """The machine given (tests), else found here; the real deep_ep probed where a plug-in or ``--deep-ep`` needs
    to know it."""
    if machine is not None:
        return machine
    machine = detect_machine(asked.real or deep_ep == "real")
    plugins_named = any(spec.plugin or spec.substitute for spec in asked.named or ())
    if (deep_ep or plugins_named) and machine.deep_ep.get("error", "").startswith("not probed"):
        from conformance.core.probe import probe_in_subprocess

        machine = replace(machine, deep_ep=probe_in_subprocess("deep_ep"))
    return machine


def _check_real_here(v: dict[str, Any], asked: AskedBackends, deep_ep: str | None, machine: Machine) -> None:
    """A real backend or ``--deep-ep real`` asked for: GPUs and an importable deep_ep here."""
    if v["device"] == "cuda" and not machine.gpus:
        raise SetupError("--device cuda: no CUDA GPU is visible here (check CUDA_VISIBLE_DEVICES and the driver); "
                         "use --device cpu")
    if asked.real and not machine.gpus:
        raise SetupError(f"--backends {v['backends']}: the real DeepEP runs on CUDA GPUs and none is visible here; "
                         f"use --backends emulated to run the suite on the emulation")
    if asked.real and not machine.deep_ep.get("importable"):
        raise SetupError(f"--backends {v['backends']}: the real deep_ep does not import here: "
                         f"{machine.deep_ep.get('error')}")
    if deep_ep == "real" and not machine.gpus:
        raise SetupError("--deep-ep real: the real DeepEP runs on CUDA GPUs and none is visible here; use --deep-ep "
                         "emulation (or auto)")
    if deep_ep == "real" and not machine.deep_ep.get("importable"):
        raise SetupError(f"--deep-ep real: the real deep_ep does not import here: {machine.deep_ep.get('error')}")


@dataclass(frozen=True)
class Placement:
    """Where the ranks run: the device, this worker's GPUs, and why ``auto`` chose what it did."""

    device: str
    gpu_ids: tuple[str, ...]
    notes: tuple[str, ...]


def _placement(v: dict[str, Any], shape: WorldShape, machine: Machine, named: tuple[BackendSpec, ...] | None,
               real: bool, worker: int, workers: int) -> Placement:
    """``--device`` and ``--rank-setup`` against the GPUs here: one GPU per rank of every worker's world, or
    (``shared``) every world on the first one."""
    gpus = machine.gpus
    notes: list[str] = []
    shared = v["rank_setup"] == "shared"
    if shared:
        if shape.nodes != 1:
            raise SetupError("--rank-setup shared: the ranks share one GPU of one host: use --nodes 1 (for several "
                             "worlds side by side on that GPU, -n K: each xdist worker's world shares it)")
        v2 = [s.name for s in (named or []) if s.api == "v2"]
        if (named is None or v2) and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") != "1":
            raise SetupError("--rank-setup shared: ElasticBuffer builds an NCCL communicator, which refuses two ranks "
                             "on one GPU; select V1 backends only (e.g. --backends real-v1,emulated-v1), or set "
                             "NCCL_MULTI_RANK_GPU_ENABLE=1 to let NCCL try (see docs/real-runs/README.md)")
    needed = 1 if shared else shape.size * max(1, workers)
    enough_gpus = len(gpus) >= needed
    if v["device"] == "cuda" or real:
        if not enough_gpus:
            raise SetupError(
                f"{'--device cuda' if v['device'] == 'cuda' else '--backends ' + v['backends']}: one GPU per rank is "
                f"needed, {needed} in all ({shape.nodes} node(s) x {shape.ranks_per_node} rank(s)"
                + (f" x {workers} xdist workers" if workers > 1 else "") + f"), but {len(gpus)} "
                f"{'is' if len(gpus) == 1 else 'are'} visible here; use fewer --ranks-per-node"
                + (", fewer -n workers" if workers > 1 else "") + " or --device cpu"
                + (" (the real DeepEP needs at least 2 ranks)" if real else "")
            )
        device = "cuda"
    elif v["device"] == "auto":
        device = "cuda" if gpus and enough_gpus else "cpu"
        if gpus and not enough_gpus:
            notes.append(f"--device auto chose cpu: {len(gpus)} GPU(s) for {needed} rank(s)")
    else:
        device = "cpu"
    if device != "cuda":
        gpu_ids: tuple[str, ...] = ()
    elif shared:  # every worker's world on the first visible GPU (devices.shared_gpu_workers: how many for -n auto)
        gpu_ids = tuple(gpus[:1])
        if workers > 1:
            notes.append(f"--rank-setup shared with {workers} xdist workers: {workers} worlds of {shape.size} ranks "
                         f"side by side on GPU {gpus[0]}")
    else:
        gpu_ids = tuple(gpus[worker * shape.size:(worker + 1) * shape.size])
    return Placement(device, gpu_ids, tuple(notes))


@dataclass(frozen=True)
class Chosen:
    """The backends that run (plug-ins resolved, versions settled), what ``import deep_ep`` gives in the ranks, the
    version the emulation models, and why ``auto`` chose what it did."""

    named: tuple[BackendSpec, ...]
    deep_ep: str | None
    emulation_version: str
    notes: tuple[str, ...]


def _backends(v: dict[str, Any], asked: AskedBackends, deep_ep: str | None, emulation_version: str | None,
              machine: Machine, cuda_world: bool) -> Chosen:
    """``--deep-ep auto`` and ``--backends auto`` decided by the machine, plug-ins resolved, versions settled."""
    notes: list[str] = []
    real_usable = cuda_world and bool(machine.deep_ep.get("importable"))
    if deep_ep == "auto":
        deep_ep = "real" if real_usable else "emulation"
        notes.append(f"--deep-ep auto chose {'the real deep_ep' if real_usable else 'conformance.emulation'}"
                     + ("" if real_usable else f" (the real one is not usable: "
                        f"{machine.deep_ep.get('error') or 'it needs a CUDA world of at least 2 ranks'})"))
    if deep_ep == "emulation":
        if asked.named is not None and any(spec.impl == "real" for spec in asked.named):
            raise SetupError(f"--backends {v['backends']} with --deep-ep auto: the ranks' deep_ep is the emulation "
                             f"here, so a real backend cannot run")
        if machine.deep_ep.get("importable"):
            notes.append(f"deep_ep resolves to conformance.emulation in the ranks although a real deep_ep "
                         f"({machine.deep_ep.get('version') or 'installed'}) imports here: --deep-ep "
                         f"{v.get('deep_ep') or 'from ' + DEEP_EP_ENV} shadows it")
    usable = real_usable and deep_ep != "emulation"
    named = asked.chosen(usable)
    if asked.named is None:  # auto
        if not usable:
            why = machine.deep_ep.get("error") if not machine.deep_ep.get("importable") else (
                "it needs a CUDA world of at least 2 ranks")
            notes.append(f"--backends auto chose the emulation: real deep_ep not usable ({why})")
    mode = f"emulation:{emulation_version}" if deep_ep == "emulation" and emulation_version else deep_ep
    resolved, plugin_notes = resolve_plugins(list(named), machine, mode, machine.deep_ep, v["mutant"])
    versioned, version, version_notes = library_versions(resolved, deep_ep, emulation_version, machine.deep_ep)
    return Chosen(tuple(versioned), deep_ep, version, (*notes, *plugin_notes, *version_notes))


def _check_mutant(v: dict[str, Any], named: tuple[BackendSpec, ...]) -> None:
    """``--mutant``: registered, and planted where an emulated backend runs."""
    if v["mutant"] is None:
        return
    from conformance.mutants import load_catalog

    known = load_catalog()
    if v["mutant"] not in known:
        raise SetupError(f"--mutant {v['mutant']!r} is not registered; known: {', '.join(sorted(known))}")
    if not any(not b.real for b in named):
        raise SetupError(f"--mutant plants a defect in the emulation, but --backends {v['backends']} selects "
                         f"no emulated backend")


def _known_defects(v: dict[str, Any]) -> str:
    """``--known-defects``: ``auto``, ``none`` or a file that loads."""
    known_defects = v["known_defects"] or "auto"
    if known_defects not in ("auto", "none"):
        from conformance.harness.known_defects import load

        try:
            load(known_defects)
        except ValueError as exc:
            raise SetupError(str(exc)) from None
    return known_defects


def _shapes(v: dict[str, Any], named: tuple[BackendSpec, ...], rank_env: dict[str, str]
            ) -> tuple[str | None, tuple[str, ...], bool]:
    """``--shapes`` and ``--warm-up``: the shape vocabulary the draws snap to (``auto``: ``jit`` where a real V2
    backend compiles a kernel per shape), the JIT cache's environment added to ``rank_env``, and whether the
    kernels are compiled before the first property."""
    from conformance.harness.jit import rank_env as jit_env
    from conformance.strategies.vocabulary import named as vocabulary_named

    compiles_per_shape = [b.name for b in named if b.api == "v2" and b.real]
    try:
        shapes = {"free": None, "auto": "jit" if compiles_per_shape else None}.get(v["shapes"], v["shapes"])
        vocabulary_named(shapes)
    except (IndexError, ValueError):
        shapes = "?"
    if shapes == "?" or (shapes and vocabulary_named(shapes) is None):
        raise SetupError(f"--shapes must be auto, free or jit (jit:N: its shape N alone), got {v['shapes']!r}")
    rank_env.update(jit_env(bool(compiles_per_shape), v["report_dir"]))
    notes = ((f"--shapes auto chose the jit vocabulary: {', '.join(compiles_per_shape)} compile(s) a kernel per new "
              f"shape (python -m conformance.strategies.vocabulary lists the shapes)",)
             if v["shapes"] == "auto" and shapes else ())
    warm_up = bool(shapes and ":" not in shapes and (v["warm_up"] == "on" or v["warm_up"] == "auto"
                                                     and compiles_per_shape))
    return shapes, notes, warm_up
