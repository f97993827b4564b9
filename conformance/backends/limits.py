"""Known capability limits: configurations a backend is recorded to reject cleanly.

An exception from a backend is a failure unless a limit here names it; then the configuration is
reported as ``unsupported`` for that backend (and as a capability regression when the other API
accepts it).  A limit that no longer raises is reported as a capability gained.  The limits are data of each DeepEP
version (``conformance/versions/<version>/limits.toml``, read through :mod:`conformance.versions`): they come from
recordings of the real library (fixtures/deepep-real/README.md); the emulation mimics them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from conformance import versions
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


def _fields(example: Example) -> dict[str, object]:
    """The example's fields a limit may name (``world_size`` included)."""
    return {"world_size": example.world_size, "hidden": example.hidden, "num_topk": example.num_topk,
            "num_experts": example.num_experts, "num_max_tokens_per_rank": example.num_max_tokens_per_rank,
            "expert_alignment": example.expert_alignment}


def limits_of(version: str | None = None) -> tuple[Limit, ...]:
    """The limits of DeepEP ``version`` (``None``: the default version)."""
    return tuple(Limit(api=data.api, operation=data.operation,
                       applies=lambda example, data=data: data.applies(_fields(example)),
                       reason=data.reason, condition=data.condition, message=data.message)
                 for data in versions.contract(version).limits)


#: The default version's limits.
KNOWN_LIMITS: tuple[Limit, ...] = limits_of()


def known_limit(api: str, operation: str, example: Example, version: str | None = None) -> Limit | None:
    """The limit of DeepEP ``version`` that covers ``api.operation`` on ``example``, if any."""
    for limit in limits_of(version) if version else KNOWN_LIMITS:
        if limit.api == api and limit.operation == operation and limit.applies(example):
            return limit
    return None
