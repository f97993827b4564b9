"""What the real library raised on bad calls, as recorded (``fixtures/deepep-real``, ``errors``).

A copy ships in the recorded version's folder, ``conformance/versions/<version>/recorded-errors.json`` (read through
:mod:`conformance.versions`; tests/quality/test_recorded_data.py keeps 2.1.0's exact), so that an installed suite has it
without the 17 MB recordings.
"""

from __future__ import annotations

from conformance import versions

#: DeepEP 2.1.0's copy (the version the recordings in ``fixtures/deepep-real`` come from).
RECORDED_ERRORS = versions.contract("2.1.0").folder / "recorded-errors.json"


def recorded_errors(version: str | None = "2.1.0") -> dict[str, tuple[str, str]]:
    """``{name: (exception type, message)}`` recorded from the real DeepEP ``version`` (same on both ranks; empty for
    a version nothing was recorded of yet)."""
    return dict(versions.contract(version).recorded_errors)


def expected_refusal(contract: versions.Contract, recorded: str, row_id: str) -> tuple[str, str]:
    """``(exception type, message)`` a call must raise on ``contract``'s DeepEP version: what the real library raised
    where it was recorded (``recorded``, a name of ``recorded-errors.json``), else the version's refusal-table row
    ``row_id`` (read from its source)."""
    found = contract.recorded_errors.get(recorded)
    return found if found is not None else (contract.refusals.exception(row_id), contract.refusals.message(row_id))
