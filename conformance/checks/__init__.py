"""One check per contract item (P1-P14).  A check takes the session and one example, runs what it needs
on the ranks, and raises ``AssertionError`` with an array-api-tests style message on a violation.

The same checks back the pytest property tests and ``python -m conformance.repro``.
"""

from conformance.checks.registry import CHECKS, register

# Importing the modules registers their checks.
from conformance.checks import p01_payloads  # noqa: E402,F401  isort: skip

__all__ = ["CHECKS", "register"]
