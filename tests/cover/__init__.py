"""Fast self-tests (by cost): in-process checks of the suite's code that start no rank world and no other
interpreter (no subprocess, no run of the suite), so that they run in seconds and a developer can run this folder
on every change.  A self-test that needs a world or a process of its own belongs in ``tests/nocover``."""
