"""The runtime copy of the recorded errors equals the real-library recordings it was taken from."""

from pathlib import Path

import torch

from conformance.oracle.recorded import recorded_errors

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "deepep-real"


def test_recorded_errors_copy_matches_both_ranks_recordings() -> None:
    for rank in (0, 1):
        recorded = torch.load(FIXTURES / f"rank{rank}.pt", weights_only=True)["errors"]
        assert recorded_errors() == {name: tuple(value) for name, value in recorded.items()}
