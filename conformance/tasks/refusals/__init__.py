"""Bad calls: for every live row of the refusal table (``conformance/versions/<version>/refusals.toml``) a *recipe* that
makes exactly the offending call, and its *neighbour*, the closest valid call (named ``<row id>`` and
``<row id>.ok`` in :data:`RECIPES`).

Runs inside rank processes.  A recipe takes a :class:`BadCallEnv` (the ``deep_ep``-like module, real or emulated,
the group, this rank's inputs of an :class:`~conformance.core.example.Example`) and makes its calls; it is
deterministic and identical on every rank (every rank makes the same sequence of calls, so collectives such as
buffer construction line up).  :func:`run` makes one and destroys the buffers it built (:mod:`.env`); global state
a recipe changes (``Buffer.num_sms``, torch's deterministic mode, ``LOCAL_WORLD_SIZE``) is restored before it
returns.  Recipes never import the emulation: the sizes they need are computed from the library's own formulas
(:mod:`.helpers`), and the table is read as a file (:mod:`.registry`).

Adding a row.  The table row says what the library refuses (``exception``, ``message``, ``source``) and, in its
recipe columns, how to make the call: ``topology`` and ``requires`` (where the recipe applies, :mod:`.registry`),
``self_test_only`` (why P12 does not draw it, when it does not), and either

* the mistake as data, when the offending call is a valid call with one argument changed (a dtype, a shape, an
  out-of-range count, one argument set to a bad value...): ``valid_call``, ``given`` and ``edit``, which
  :func:`.edits.make` interprets (the neighbour is the valid call with ``given``, the recipe the neighbour with
  ``edit``).  Nothing else to write::

      valid_call = "ElasticBuffer.dispatch"
      edit = { topk_weights = "bfloat16" }

* or, for a stateful recipe (earlier calls, a destroyed buffer, a low-latency buffer's state, a handle made by
  another buffer, global state), a function ``fn(env, bad)`` registered with ``@recipe("<row id>")`` in the module
  of its call family: :mod:`.init` (constructors, ``destroy``, ``set_num_sms``), :mod:`.dispatch` (V1 layout and
  dispatch), :mod:`.combine` (V1 combine), :mod:`.low_latency` (V1 low-latency calls, masks, local buffers),
  :mod:`.elastic` (``ElasticBuffer``, ``EventOverlap``).  ``bad`` selects the offending call.

``tests/nocover/test_refusals.py`` makes every row's two calls on the emulation, and checks that every live row has
exactly one recipe.
"""

from __future__ import annotations

from conformance.tasks.refusals import combine, dispatch, elastic, ep, init, low_latency  # noqa: F401 (registration)
from conformance.tasks.refusals.edits import register as _register_edits
from conformance.tasks.refusals.env import BadCallEnv, LLCall, SharedBuffers, V1Call, V2Call, make_env
from conformance.tasks.refusals.helpers import LLShape
from conformance.tasks.refusals.registry import RECIPES, REQUIRES, TOPOLOGIES, all_names, applies, recipe, rows, run

_register_edits(rows())

__all__ = ["RECIPES", "REQUIRES", "TOPOLOGIES", "BadCallEnv", "LLCall", "LLShape", "SharedBuffers", "V1Call", "V2Call",
           "all_names", "applies", "make_env", "recipe", "rows", "run"]
