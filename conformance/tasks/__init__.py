"""Tasks that run inside the rank processes; the controller calls them through :meth:`World.run`.

Every task takes :class:`TaskSettings` (backends, active mutant) and a plain :class:`Example`, builds this
rank's inputs from the example, drives the backends, and returns canonical views.  One module per area
(``dispatch``, ``combine``, ...); targets are named ``"conformance.tasks.<module>:<function>"``.
"""

from conformance.tasks.settings import TaskSettings, backend_calls

__all__ = ["TaskSettings", "backend_calls"]
