"""One check per contract item (P1-P14).  A check takes the session and one example, runs what it needs
on the ranks, and raises ``AssertionError`` with an array-api-tests style message on a violation.

The same checks back the pytest property tests and ``python -m conformance.repro``.  Every module named
``pNN_*.py`` in this package is imported, which registers its checks.
"""

import importlib
import pkgutil

from conformance.checks.registry import CASE_TYPES, CHECKS, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name[0] == "p" and _module.name[1:3].isdigit():
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["CASE_TYPES", "CHECKS", "register"]
