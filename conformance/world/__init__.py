"""The rank world: nodes x ranks-per-node processes with torchrun semantics, kept across examples.

:mod:`~conformance.world.launcher` is the controller's side (start, run a task on every rank, retire after a
failure), :mod:`~conformance.world.rank` the ranks' side (join the process group, run tasks until told to
stop), :mod:`~conformance.world.errors` what a failure reports.  This package imports neither side, so that a
rank loading its own module never loads the controller's.
"""
