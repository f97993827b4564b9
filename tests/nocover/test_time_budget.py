"""``--time-budget``: a property keeps drawing rounds of ``--max-examples`` new cases until its time is spent."""

from __future__ import annotations


def test_a_time_budget_draws_new_cases_in_rounds(suite) -> None:
    proc, report = suite("-v", "-p", "no:xdist", "conformance/properties/test_p02_counts.py", "--max-examples", "4",
                         "--time-budget", "6", "--conformance-seed", "7", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # -v: the header, which -q hides
    assert "rounds of them for 6 s per property (--time-budget)" in proc.stdout, proc.stdout[:2000]
    entry = next(p for p in report["properties"] if p["id"] == "P2-counts")
    assert entry["examples"] >= 12, entry  # rounds of 4 on a fast property: several rounds
    assert entry["wall_s"] >= 6 - 3, entry  # most of the budget spent drawing (the world start counts too)


def test_without_a_time_budget_max_examples_is_the_bound(suite) -> None:
    proc, report = suite("-p", "no:xdist", "conformance/properties/test_p02_counts.py", "--max-examples", "4",
                         "--conformance-seed", "7", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    entry = next(p for p in report["properties"] if p["id"] == "P2-counts")
    assert entry["examples"] <= 4 + 1, entry  # the property's explicit case aside, at most --max-examples draws
