"""Slow self-tests (by cost): those that run the suite or another interpreter in a process of its own (the ``suite``
fixture, ``run_suite``/``run_pytest``, the zygote, ``subprocess``, the shared catalog runs of ``tests/conftest.py``,
the ``slow`` mark) or build a rank world (``emulated_session``, ``two_node_session``, a ``World`` or ``Session`` of
their own).  Kept apart from ``tests/cover`` so that the fast folder stays fast; ``pytest tests`` runs every folder."""
