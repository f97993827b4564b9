"""A verdict per backend when a known defect ends an example's check (run 24a on the real library: real-v2's P26
defect was matched on every example and emulated-v2, checked after it, was never checked: its cell read
``not-checked`` with no reason).  The check of the backends after the one with the known defect now runs on the same
case (``Session._check_the_rest``): here emulated-v2 (the emulated DeepEP's known defect, first) and a fork with
DeepEP's fix of that defect (``tests.helpers.class_backends.TopkIdxFilledElasticBuffer``), which must be
checked and pass."""

from __future__ import annotations

CLASS = "v2=tests.helpers.class_backends:TopkIdxFilledElasticBuffer"


def test_a_known_defect_of_one_backend_leaves_the_others_checked(suite) -> None:
    proc, report = suite("conformance/properties/test_p26_worst_case_whole.py", "--backends", f"emulated-v2,{CLASS}",
                         "--deep-ep", "emulation", "--max-examples", "2", "--conformance-seed", "1", "-p", "no:xdist")
    assert report, proc.stdout[-3000:] + proc.stderr[-2000:]
    (p26,) = [p for p in report["properties"] if p["id"] == "P26-worst-case-whole"]
    emulated, cls = p26["verdicts"]["emulated-v2"], p26["verdicts"][CLASS]
    assert emulated["status"] == "known-defect" and emulated["checked"] == emulated["known_defect"] >= 2, emulated
    assert cls["status"] == "passed" and cls["checked"] == cls["held"] == emulated["checked"], cls  # (before: 0/0)


def test_several_backends_failing_one_example_each_get_their_own_verdict() -> None:
    """One example on which one backend held, one failed as its known defect says and two failed otherwise (a check
    that judged every backend before raising, e.g. P25's): each column counted once, as what it did."""
    from conformance.harness.verdicts import Tally

    tally = Tally()
    tally.start(("a", "b", "c", "d"), [])
    tally.complete("a")
    tally.failed(("c", "d"), "c broke", {"c": "c broke", "d": "d broke"}, known={"b": "b-defect"})
    columns = tally.as_dict()
    assert {name: c["status"] for name, c in columns.items()} == {
        "a": "passed", "b": "known-defect", "c": "failed", "d": "failed"}
    assert [columns[n]["checked"] for n in "abcd"] == [1, 1, 1, 1]
    assert (columns["b"]["defects"], columns["d"]["message"]) == ({"b-defect": 1}, "d broke")
