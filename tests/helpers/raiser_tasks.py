"""Rank tasks of tests/nocover/test_public_api.py: an exception of the suite's own code raised inside a
backend's step."""

from __future__ import annotations

import torch


def suite_raises_in_step() -> None:
    """Every rank: the suite's own code fails (a helper handed ``None``) inside ``emulated-v1``'s dispatch step."""
    from conformance.core.views import V1Layout
    from conformance.tasks.env import in_step

    error = None
    try:
        V1Layout.fields(None)  # type: ignore[arg-type]
    except TypeError as exc:
        error = exc
    in_step(torch.device("cpu"), "emulated-v1", "dispatch", error)
