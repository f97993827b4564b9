"""Errors the world raises in the controller.  Each carries every rank's side of the story."""

from __future__ import annotations

from conformance.core.ids import CallId


class WorldError(RuntimeError):
    """The world could not be started or used (bad environment, start-up failure)."""


class RankFailure(RuntimeError):
    """A task failed on at least one rank.  ``per_rank`` maps rank -> what that rank said or showed."""

    kind = "failed"

    def __init__(
        self,
        target: str,
        per_rank: dict[int, str],
        culprits: list[int] | None = None,
        calls: dict[int, str] | None = None,
        signals: dict[int, str] | None = None,
        hosts: dict[int, str] | None = None,
        backend: str | None = None,
        in_step: bool = False,
        suite: dict[int, str] | None = None,
    ) -> None:
        self.target = target
        #: rank -> where the suite's own code raised on that rank (``path:line in function``): a suite error, never
        #: the backend's failure (``conformance.core.raisers``).
        self.suite = dict(suite or {})
        #: The backend whose call failed, where the ranks know it (a backend's call raised in step).
        self.backend = backend
        #: Every rank ended the task together after a backend's call raised: the world was kept, not retired.
        self.in_step = in_step
        self.per_rank = per_rank
        self.culprits = sorted(per_rank) if culprits is None else sorted(culprits)
        #: rank -> the library call it was in (``backend|Class.method``, see ``world.rank.current_call``).
        self.calls = dict(calls or {})
        #: rank -> the signal that killed it (``SIGSEGV``), for crashed ranks.
        self.signals = dict(signals or {})
        #: rank -> the host it ran on (named in the headline when the world spans several hosts).
        self.hosts = dict(hosts or {})
        on = (lambda r: f" on host {self.hosts[r]}") if len(set(self.hosts.values())) > 1 else (lambda r: "")
        waiting = sorted(set(per_rank) - set(self.culprits))
        headline = f"{target}: {self.kind} on rank(s) {self.culprits}"
        where = [f"rank {r}" + on(r) + (f" by {self.signals[r]}" if r in self.signals else "")
                 + (f" in {describe_call(self.calls[r])}" if self.calls.get(r) else "") for r in self.culprits]
        if any(r in self.signals or self.calls.get(r) or on(r) for r in self.culprits):
            headline += " (" + "; ".join(where) + ")"
        if waiting and not in_step:
            headline += f"; rank(s) {waiting} were still running (their stacks follow)"
        if in_step:
            headline += "; every rank ended the task in step (the world was kept)"
        if self.suite:
            rank = min(self.suite)
            headline = (f"SUITE ERROR (the suite's own code raised, at {self.suite[rank]} on rank {rank}; not a "
                        f"verdict on any backend): {headline}")
        details = "\n".join(f"--- rank {rank} ---\n{text.rstrip()}" for rank, text in sorted(per_rank.items()))
        super().__init__(f"{headline}\n{details}")


    def culprit_call(self) -> str | None:
        """The library call the first culprit was in (``backend|Class.method``), if it was in one."""
        return next((self.calls[r] for r in self.culprits if self.calls.get(r)), None)


def describe_call(call: str) -> str:
    """``emulated-v2|ElasticBuffer.__init__`` -> ``ElasticBuffer.__init__ [emulated-v2]``; task names unchanged."""
    parsed = CallId.parse(call)
    return f"{parsed.operation} [{parsed.backend}]" if parsed else call


class RankRaised(RankFailure):
    """A rank raised an exception; ``per_rank`` holds the tracebacks (and stacks of ranks left waiting)."""

    kind = "raised an exception"


class RankTimeout(RankFailure):
    """The task did not finish in time; ``per_rank`` holds every rank's Python stacks (faulthandler)."""

    kind = "timed out (hung)"


class RankCrashed(RankFailure):
    """A rank process died; ``per_rank`` holds exit codes and the tail of its log."""

    kind = "crashed (process died)"
