"""What a set-up cannot do on the real library: the one table every task that builds buffers consults.

A *set-up* is how the ranks sit on the hardware (``--rank-setup``: :data:`SETUPS`); the rank process knows its own
from ``CONFORMANCE_RANK_SETUP``, which the world sets for every rank (``world/rank.py``; :func:`rank_setup`).  A
:class:`SetupLimit` names a library call and the arguments that cannot work there (e.g. a constructor that never
returns where two ranks share one GPU), with the evidence (a kept real run) and what of the suite it covers.  Every
limit is of the real DeepEP only: the emulation (every CPU run) has none, and a backend over the emulation is never
limited (a limit here is a property of the hardware set-up and the real library together, not of the contract).

Where a limit names a call, the task does not make it: the configuration is reported ``unsupported`` for that
backend and set-up, with the limit's reason (:meth:`SetupLimit.reason`), through the suite's one outcome for it (a
``NotChecked`` of kind ``setup``: a backend's ``NotSupported`` result, or ``ctx.not_checked`` for one part of a
check), and is checked where the set-up allows it.  ``python -m conformance.docs --write`` writes the table of
``docs/reference.md`` from :data:`SETUP_LIMITS`.

Set-ups without entries, and why: *one GPU per rank* (``isolated``, ``recorder``): nothing known to hang or fail;
*no IBGDA* (an NVLink-only host: NVSHMEM's IBGDA transport does not initialise): not a set-up the rank can tell, and
what fails there (the shrink-mode clean) is the library's known defect ``v1-shrink-clean-needs-ibgda``, not a limit
(everything else of low-latency mode runs there); *CPU*: the real library does not run on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: The environment variable that tells a rank its set-up (set by ``world/rank.py``, from ``--rank-setup``).
SETUP_ENV = "CONFORMANCE_RANK_SETUP"

#: The set-ups (``--rank-setup``), in words.
SETUPS: dict[str, str] = {
    "isolated": "one GPU per rank, each rank seeing only its own (--rank-setup isolated, the default)",
    "recorder": "one GPU per rank, every rank seeing the node's GPUs (--rank-setup recorder)",
    "shared": "ranks sharing one GPU (--rank-setup shared: one host, every rank on its first GPU, gloo groups, "
              "NCCL_MULTI_RANK_GPU_ENABLE=1 for ElasticBuffer's communicator)",
}


def rank_setup(environ: Mapping[str, str] | None = None) -> str:
    """This rank's set-up (:data:`SETUPS`; ``isolated`` where nothing says otherwise)."""
    return (os.environ if environ is None else environ).get(SETUP_ENV, "isolated")


@dataclass(frozen=True)
class SetupLimit:
    """``call`` with arguments for which ``applies`` holds cannot work on the real library in the set-ups
    ``setups``: ``cannot`` says what happens there, ``evidence`` where it was seen, ``covers`` which calls of the
    suite it keeps from being made, ``checked_with`` where they are checked instead."""

    id: str
    setups: tuple[str, ...]
    call: str  # "Class.method" of the library ("ElasticBuffer.__init__")
    condition: str  # ``applies`` in words
    applies: Callable[[Mapping[str, Any]], bool]  # on the call's arguments, by name
    cannot: str
    evidence: str
    covers: tuple[str, ...]
    checked_with: str

    def reason(self, setup: str) -> str:
        """Why the call is not made on ``setup`` (the ``unsupported`` reason the reports show)."""
        return (f"{self.call} with {self.condition} is not made on the real library with {SETUPS.get(setup, setup)} "
                f"(set-up limit {self.id}): {self.cannot} ({self.evidence}); checked with {self.checked_with}")


def _cpu_bytes_with_num_bytes(arguments: Mapping[str, Any]) -> bool:
    # num_bytes left out: the library refuses num_cpu_bytes > 0 in Python before anything else (refusal row
    # v2_init_cpu_bytes_without_num_bytes, deep_ep/buffers/elastic.py:286), so that bad call is still made
    return (arguments.get("num_cpu_bytes") or 0) > 0 and arguments.get("num_bytes") is not None


#: The known set-up limits.
SETUP_LIMITS: tuple[SetupLimit, ...] = (
    SetupLimit(
        id="shared-gpu-v2-cpu-bytes",
        setups=("shared",),
        call="ElasticBuffer.__init__",
        condition="num_cpu_bytes > 0 (and num_bytes given)",
        applies=_cpu_bytes_with_num_bytes,
        cannot="the constructor never returns: every rank hangs in ElasticBuffer.__init__ holding the GIL (DeepEP "
               "2.1.0, NCCL_MULTI_RANK_GPU_ENABLE=1); whether this set-up's or the library's cannot be told on one GPU",
        evidence="docs/real-runs/2026-12-04-1xH200 run 16: P11's explicit buffer with num_cpu_bytes=2 MiB hung on "
                 "both ranks, and run 18: a fresh world of two ranks building only that buffer "
                 "(v2_cpu_bytes_init.py --fresh --configs 2:129); issue 37's catalog run on one H100 at 84fcbf6: "
                 "P12's valid neighbour of v2_init_cpu_bytes_without_num_bytes hung the same way",
        covers=("P11: the explicit buffer of an example with num_cpu_bytes > 0 (the example is unsupported for that "
                "backend)",
                "P12: refusal rows v2_init_cpu_bytes_without_num_bytes (its valid neighbour), "
                "v2_init_cpu_handle_alignment and v2_init_cpu_bytes_exceed (both calls: their refusals come after "
                "the library built its CPU-bytes communicator, and whether they return here is not known)",
                "P30, fixtures/record.py: no sequence step or recorded unit asks for CPU bytes today; both consult "
                "the table at every construction"),
        checked_with="one GPU per rank (--rank-setup isolated or recorder)",
    ),
)


def setup_limit(setup: str, real: bool, call: str, arguments: Mapping[str, Any]) -> SetupLimit | None:
    """The limit that keeps ``call(**arguments)`` from being made on ``setup`` (``real``: the backend drives the
    real library), if any."""
    if not real:
        return None
    for limit in SETUP_LIMITS:
        if setup in limit.setups and limit.call == call and limit.applies(arguments):
            return limit
    return None
