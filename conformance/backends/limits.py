"""Known capability limits: configurations a backend is recorded to reject cleanly.

An exception from a backend is a failure unless a limit here names it; then the configuration is
reported as ``unsupported`` for that backend (and as a capability regression when the other API
accepts it).  A limit that no longer raises is reported as a capability gained.  Entries come from
recordings of the real library (fixtures/deepep-real/README.md); the emulation mimics them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from conformance.core.example import Example


@dataclass(frozen=True)
class Limit:
    """``api``'s ``operation`` rejects examples for which ``applies`` is true."""

    api: str
    operation: str
    applies: Callable[[Example], bool]
    reason: str
    condition: str  # ``applies`` in words, for reports: the configurations excluded
    #: A regular expression the exception's ``Type: message`` must contain: only the library's own refusal is excused
    message: str = ""

    def refused(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this limit's refusal (its message matches)."""
        return not self.message or re.search(self.message, f"{type(exc).__name__}: {exc}") is not None


#: World sizes the legacy Buffer's default dispatch/combine configs cover (deep_ep/buffers/legacy.py).
V1_CONFIGURED_RANKS = (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160)

KNOWN_LIMITS: tuple[Limit, ...] = (
    *(Limit(
        api="v1",
        operation=operation,
        applies=lambda example: example.world_size not in V1_CONFIGURED_RANKS,
        condition="a world size without a default config (not 2, 4, 8, 16, ... 160 ranks)",
        reason="Buffer's default configs cover only 2, 4, 8, 16, ... 160 ranks ('Unsupported number of EP ranks: N', "
               "deep_ep/buffers/legacy.py:259)",
        message="Unsupported number of EP ranks",
    ) for operation in ("dispatch", "combine")),
    Limit(
        api="v1",
        operation="destroy",
        applies=lambda example: example.world_size not in V1_CONFIGURED_RANKS,
        condition="a world size without a default config (not 2, 4, 8, 16, ... 160 ranks)",
        reason="Buffer.destroy's intranode barrier supports 2, 4 or 8 ranks per node ('Unsupported ranks', "
               "csrc/kernels/legacy/intranode.cu:21); on those world sizes dispatch and combine are refused first",
        message="Unsupported (number of EP )?ranks",
    ),
    Limit(
        api="v2",
        operation="combine",
        applies=lambda example: example.hidden == 128,
        condition="hidden == 128",
        reason="ElasticBuffer.combine's JIT build rejects hidden=128 ('Invalid hidden'), seen on DeepEP 2.1.0",
        message="NVCC compilation failed|Invalid hidden",
    ),
)


def known_limit(api: str, operation: str, example: Example) -> Limit | None:
    """The limit that covers ``api.operation`` on ``example``, if any."""
    for limit in KNOWN_LIMITS:
        if limit.api == api and limit.operation == operation and limit.applies(example):
            return limit
    return None
