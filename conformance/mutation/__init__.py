"""The mutation kill matrix (controller side): ``python -m conformance.mutation`` plants every mutant of
:mod:`conformance.mutants` in turn and runs the property catalog against it (see docs/mutation.md)."""
