"""Planted defects (mutants) in the emulated library, one module per area; they run inside the rank processes.

A mutant patches the emulation (or an adapter) as narrowly as a real bug would sit, while a task runs
(:func:`activate`).  The property catalog must catch every ``harmful`` mutant and spare every ``benign`` one;
``python -m conformance.mutation`` (the kill matrix, controller side) checks that.
"""

from conformance.mutants.registry import MUTANTS, Mutant, activate, load_catalog, register

__all__ = ["MUTANTS", "Mutant", "activate", "load_catalog", "register"]
