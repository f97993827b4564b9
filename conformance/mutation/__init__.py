"""Mutants: planted defects that the property catalog must catch (harmful) or spare (benign)."""

from conformance.mutation.registry import MUTANTS, Mutant, activate, register

__all__ = ["MUTANTS", "Mutant", "activate", "register"]
