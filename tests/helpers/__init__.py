"""The self-tests' helper modules (no tests here): what the test modules of ``tests/cover``, ``tests/nocover`` and
``tests/quality`` share.  Running the suite or a tool in a process of its own (:mod:`tests.helpers.runs`, forked
from the warm zygote of :mod:`tests.helpers.zygote` and :mod:`tests.helpers.zygote_server`), installing the wheel
(:mod:`tests.helpers.installs`), the meta-tests' planting and checking (:mod:`tests.helpers.meta`), the
expectations of plug-ins (:mod:`tests.helpers.expectations`), replaying a real recording against the emulation
(:mod:`tests.helpers.replay`), and the tasks, backends and plug-ins the self-tests hand to a rank world or a run by
dotted name (``tests.helpers.world_tasks:...``, ``tests.helpers.exit_plugins:TearsDown``, ...)."""
