"""P25 the end of a run: after a backend's teardown (or its absence) and ``destroy_process_group()``, every rank
process exits with status 0.

Users build a buffer lazily in their first call, keep it in a module global, and exit.  What they owe the library
before ``destroy_process_group()`` differs by API (DeepEP 2.1.0's ``ElasticBuffer`` collected after its group is
gone kills the process: the known defect ``v2-buffer-outlives-process-group``), and a wrapper owes its users a
teardown that pays it.  Scenario ``teardown``: each backend's own end of a run (a plug-in's ``teardown()``, the
built-in adapters' ``destroy()``); scenario ``garbage-collected`` (built-in backends): buffers built with
``explicitly_destroy=False`` and left to the garbage collector.  Each backend runs in fresh processes
(:mod:`conformance.tasks.lifecycle`); a process that dies at exit is the backend's failure, with the output it left
and a reproduction.
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import for_each_backend
from conformance.core.cases import ExitCase
from conformance.properties import CheckContext, Property, register
from conformance.strategies import sized
from conformance.strategies.lifecycle import exit_cases
from conformance.tasks.lifecycle import exit_checks, torch_gloo_exit_abort

#: The reproduction a failure message ends with (what the child process did).
REPRODUCTION = "init_process_group(...); {setup}; dispatch + combine; {end}; dist.destroy_process_group(); exit"


#: What a death at the end of a run says of a backend that is not the library's own (``result["kind"]``).
WHOSE_END = {
    "plugin": " A defect of the wrapper: its processes cannot end cleanly the way its users end a run (it leaves its "
              "buffer to the garbage collector after the group is gone, or its teardown does not release it).",
    "class": " A defect of the class: its processes cannot end cleanly the way its API's users end a run (the end "
             "of the run above is one its API allows).",
}


def describe_death(result: dict[str, Any]) -> str:
    """How the process ended, in words."""
    if result["hung"]:
        return "did not exit (killed after the children's timeout)"
    if result["signal"]:
        return f"died by {result['signal']}"
    return f"exited with status {result['exit']}"


def check(ctx: CheckContext, case: ExitCase, per_rank: list[dict[str, Any]]) -> None:
    """Every rank's process of every backend returned from its calls, destroyed the group and exited with 0."""
    __tracebackhide__ = True

    def exited_cleanly(rank: int, backend: str, result: dict[str, Any]) -> None:
        if result["exit"] == 0 and not result["hung"] and result["destroyed"]:
            return
        where = ("after destroy_process_group(), while the interpreter exited" if result["destroyed"] else
                 "after its calls returned, before destroy_process_group() returned" if result["calls_done"] else
                 "before its dispatch and combine returned")
        # whose end it is (a wrapper's, a class's): said where the calls returned (else the calls failed, below)
        culprit = WHOSE_END.get(result["kind"], "") if result["calls_done"] else ""
        if torch_gloo_exit_abort(result):
            culprit += (f" The abort is torch's gloo teardown (a process group still referenced at exit, after "
                        f"destroy_process_group()), {result['attempts']} attempts in a row: the backend keeps its "
                        f"group past destroy_process_group().")
        tail = "\n".join(line for line in result["tail"].strip().splitlines()[-12:])
        raise AssertionError(
            f"{backend}: rank {rank}'s process {describe_death(result)} {where}; its end of the run: "
            f"{result['end']} (scenario '{case.scenario}').{culprit}\nreproduction: "
            + REPRODUCTION.format(setup=f"the {backend} backend as the suite builds it", end=result["end"])
            + f"\nits last output:\n{tail}")

    for_each_backend(ctx, case, per_rank, exited_cleanly, backend_major=True)


PROPERTY = register(Property(
    id="P25-clean-exit",
    title="after a backend's teardown (or its absence) and destroy_process_group(), every rank process exits "
          "cleanly: the wrapper's whole life, from a lazily built module-global buffer to the interpreter's exit",
    strategy=sized(exit_cases), task=exit_checks, check=check, case_type=ExitCase, shapes="small",
    memo=True,
))
test_clean_exit = PROPERTY.test
