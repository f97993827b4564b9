"""What the real library raised on bad calls, as recorded (``fixtures/deepep-real``, ``errors``).

A copy ships in ``conformance/data/recorded_errors.json`` (tests/test_recorded_data.py keeps it exact) so that
an installed suite has it without the 17 MB recordings.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

RECORDED_ERRORS = Path(__file__).resolve().parents[1] / "data" / "recorded_errors.json"


@functools.lru_cache(maxsize=1)
def recorded_errors() -> dict[str, tuple[str, str]]:
    """``{name: (exception type, message)}`` recorded from the real DeepEP 2.1.0 (same on both ranks)."""
    errors = json.loads(RECORDED_ERRORS.read_text())["errors"]
    return {name: (kind, message) for name, (kind, message) in errors.items()}
