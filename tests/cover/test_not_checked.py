"""What is not checked has one value (``core.outcomes.NotChecked``) and one way in (the check context's
``not_checked``): each span lands where the report reads it, with its kind of reason, and the exclusions of a property
say which kind keeps a backend out."""

from __future__ import annotations

import dataclasses

from conformance.core.example import Example
from conformance.core.outcomes import WHYS, NotChecked, Span, Why
from conformance.core.spec import BackendSpec
from conformance.harness.config import RunConfig
from conformance.harness.faults import HungBackend
from conformance.harness.session import Session
from conformance.properties import catalog
from conformance.world.launcher import WorldShape

V1, V2 = BackendSpec("emulated", "v1"), BackendSpec("emulated", "v2")
EXAMPLE = Example(tokens_per_rank=(1, 2), hidden=128, num_topk=1, num_experts=2)


def test_exclusions_say_which_kind_of_reason_keeps_a_backend_out() -> None:
    v2_only = catalog()["P8-expand-layout"]
    plugin = BackendSpec("plugin", "v2", target="my_pkg.ep:factory", declared=frozenset({"combine"}))
    on_2_5_0 = dataclasses.replace(V1, version="2.5.0")
    got = v2_only.exclusions((V1, V2, plugin))
    assert set(got) == {"emulated-v1", "my_pkg.ep:factory"}, got
    assert got["emulated-v1"].why is Why.API and got["emulated-v1"].span is Span.PROPERTY, got
    assert got["my_pkg.ep:factory"].why is Why.CAPABILITY and "does not declare" in got["my_pkg.ep:factory"].reason
    removed = catalog()["P1-per-expert-payloads"].exclusions((on_2_5_0, V2))
    assert list(removed) == ["emulated-v1"] and removed["emulated-v1"].why is Why.REMOVED, removed
    assert "2.5.0" in removed["emulated-v1"].reason, removed


def test_each_span_lands_where_the_report_reads_it_with_its_kind() -> None:
    session = Session(RunConfig(WorldShape(1, 2), (V1, V2)))  # (no world is started: nothing runs)
    recorder = session.recorder
    session.not_checked(NotChecked.excluded("emulated-v1", Why.API, "another API's property"))
    session.not_checked(NotChecked.example("emulated-v2", Why.LIMIT, "ElasticBuffer.combine", "RuntimeError: hidden",
                                           "hidden == 128"), EXAMPLE)
    session.not_checked(NotChecked.example("emulated-v2", Why.LIMIT, "ElasticBuffer.combine", "RuntimeError: hidden",
                                           "hidden == 128"), EXAMPLE)  # (every rank says it: counted once)
    session.not_checked(NotChecked.part("emulated-v2", Why.CAPABILITY, "layout outputs"))
    session.not_checked(HungBackend("emulated-v2", {"call": None}, EXAMPLE, 5.0).not_checked())
    assert recorder.excluded == {"emulated-v1": "another API's property"}
    assert recorder.unsupported["emulated-v2"]["count"] == 1 and recorder.unsupported["emulated-v2"]["condition"] \
        == "hidden == 128", recorder.unsupported
    assert recorder.tally.excluded == {"emulated-v2": "hidden == 128"}  # beside its verdict on this example
    assert recorder.not_checked["emulated-v2"][0] == "layout outputs"
    assert "hung in its calls" in recorder.not_checked["emulated-v2"][1], recorder.not_checked
    assert recorder.why == {"emulated-v1": ["api"], "emulated-v2": ["limit", "capability", "hung"]}
    assert recorder.as_dict()["why"] == recorder.why and set(WHYS) == {w.value for w in Why}


def test_a_column_lists_its_kinds_of_reason_in_one_order() -> None:
    from conformance.reporting.report import PropertyEntry, annotate_verdicts

    entry = PropertyEntry(id="P8-expand-layout", test="t", backends=["emulated-v1", "emulated-v2"], status="passed",
                          examples=1, wall_s=0.0, excluded={"emulated-v1": "another API's property"},
                          verdicts={"emulated-v2": {"status": "passed", "checked": 1, "held": 1}},
                          why={"emulated-v1": ["api"], "emulated-v2": ["hung", "capability"]})
    columns = annotate_verdicts(entry, RunConfig(WorldShape(1, 2), (V1, V2)), 1)
    assert columns["emulated-v1"]["status"] == "unsupported" and columns["emulated-v1"]["why"] == ["api"], columns
    assert columns["emulated-v2"]["why"] == ["capability", "hung"], columns  # Why's order, not the order seen


def test_every_kind_of_reason_is_given_somewhere() -> None:
    """A kind no path gives would be a reason the report can never say (a dead word in the vocabulary)."""
    from pathlib import Path

    import conformance

    source = "\n".join(path.read_text() for path in Path(conformance.__file__).parent.rglob("*.py"))
    given = {why for why in Why if f"Why.{why.name}" in source}
    assert given == set(Why), set(Why) - given
