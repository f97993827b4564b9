"""Tasks that run inside the rank processes, one module per area; the controller sends the functions.

Every task is ``@rank_task``-decorated (:mod:`conformance.tasks.env`): it receives a :class:`RankEnv` with
this rank's inputs for the case and the selected backends, and returns plain data for the controller's
checks.  Nothing here imports the controller side (checks, strategies, the oracle).
"""
