"""The run configuration, built from pytest options or from ``conformance.repro``'s arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

from conformance import versions
from conformance.core.spec import BackendSpec
from conformance.world.launcher import WorldShape

#: Hypothesis examples per property when ``--max-examples`` is not given (the plug-in, the mutation runner).
DEFAULT_MAX_EXAMPLES = 25


@dataclass(frozen=True)
class RunConfig:
    """Everything that decides how examples run."""

    shape: WorldShape
    backends: tuple[BackendSpec, ...]
    device: str = "cpu"
    example_timeout_s: float = 120.0
    mutant: str | None = None
    gpu_ids: tuple[str, ...] = ()
    rank_env: dict[str, str] = field(default_factory=dict)
    #: "isolated" or "recorder" (see ``world.launcher.World``).
    rank_setup: str = "isolated"
    max_examples: int = DEFAULT_MAX_EXAMPLES
    #: ``--time-budget``: seconds each property keeps drawing rounds of ``max_examples`` new draws; 0 = off.
    time_budget_s: float = 0.0
    #: Soak mode (``--soak N``): repetitions of each soak example; 0 = off.
    soak: int = 0
    seed: int | None = None
    #: World restarts after crashes or hangs that one property may spend (a run may spend 4 times as many).
    max_restarts: int = 3
    #: Why ``auto`` settled on what it did (e.g. the real deep_ep's import error), for the report header.
    notes: tuple[str, ...] = ()
    #: What the import probe of the real ``deep_ep`` found (``importable``, ``version``, ``error``, ...).
    deep_ep_probe: dict = field(default_factory=dict)
    #: What ``import deep_ep`` gives in the ranks (``--deep-ep`` resolved): ``real``, ``emulation``, or ``None``
    #: (no alias).
    deep_ep: str | None = None
    #: The DeepEP version the emulation models in this run (``--deep-ep emulation:VERSION``; else the real deep_ep's
    #: version where the emulation models it and a real backend is selected; else the default, 2.1.0): the emulated
    #: backends and the ``deep_ep`` alias run on it.
    emulation_version: str = versions.DEFAULT_VERSION
    #: What each plug-in declared (its probe, by target), for the report and the xdist workers.
    plugin_probes: dict = field(default_factory=dict)
    #: Known-defects file: ``auto`` (by the DeepEP version under test), ``none``, or a path (harness.known_defects).
    known_defects: str = "auto"
    #: Hypothesis' example database (failing examples, replayed first next time); ``None``: no database.
    database_dir: str | None = None
    #: Where the world's c10d rendezvous store listens (``HOST:PORT``; port 0: any free one, this host only).
    rdzv_endpoint: str = "127.0.0.1:0"
    #: Nodes served by other hosts (``python -m conformance.serve --rdzv-endpoint ...``), and how long to wait.
    remote_nodes: int = 0
    world_token_file: str | None = None
    node_wait_s: float = 300.0
    #: The shape vocabulary draws snap to (``conformance.strategies.vocabulary``: ``jit``), or ``None``: drawn freely.
    shapes: str | None = None
    #: Compile the vocabulary's kernels before the first property (``conformance.harness.jit``).
    warm_up: bool = False

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self.shape.size

    @property
    def library_version(self) -> str:
        """The DeepEP version this run tests (whose contract the draws and the known defects follow): the version
        of the first selected backend that is real, else the emulation's."""
        real = next((b for b in self.backends if b.real and b.version), None)
        return real.version if real is not None and real.version else self.emulation_version

    @property
    def deep_ep_mode(self) -> str | None:
        """``--deep-ep`` as the ranks and the plug-in probes take it: ``emulation:VERSION`` for another version of the
        emulation than the default, else :attr:`deep_ep`."""
        if self.deep_ep == "emulation" and self.emulation_version != versions.DEFAULT_VERSION:
            return f"emulation:{self.emulation_version}"
        return self.deep_ep

    def cli_args(self) -> str:
        """The command-line options that reproduce this configuration."""
        args = (
            f"--nodes {self.shape.nodes} --ranks-per-node {self.shape.ranks_per_node} "
            f"--backends {','.join(b.name for b in self.backends)} --device {self.device}"
            + (f" --rank-setup {self.rank_setup}" if self.rank_setup != "isolated" else "")
        )
        if self.deep_ep:
            args += f" --deep-ep {self.deep_ep_mode}"
        if self.mutant:
            args += f" --mutant {self.mutant}"
        if self.shapes:
            args += f" --shapes {self.shapes}"
        return args
