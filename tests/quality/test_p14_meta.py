"""Meta-tests of P14: a renamed keyword fails, an added optional keyword is reported and passes; the snapshot is
the surface recorded on the real library."""

import json

from hypothesis import strategies as st

from conformance.core.api_surface import SIGNATURES, SNAPSHOT, diff_surface, load_snapshot, snapshot_from_signatures
from conformance.core.cases import ApiSurfaceCase
from tests.conftest import ROOT
from tests.helpers.meta import assert_caught, assert_holds

P14 = "P14-api-surface"
CASE = ApiSurfaceCase(world_size=2)


def test_p14_catches_a_renamed_keyword_argument(emulated_session) -> None:
    _, message = assert_caught(emulated_session, P14, "renamed-dispatch-kwarg", st.just(CASE), shrink=False)
    assert "ElasticBuffer.dispatch(num_max_tokens_per_rank): renamed-param" in message
    assert "(renamed to 'max_tokens_per_rank')" in message


def test_p14_reports_an_added_optional_argument_and_passes(emulated_session) -> None:
    emulated_session.recorder.artifacts.clear()
    assert_holds(emulated_session, P14, [CASE], mutant="added-optional-combine-kwarg")
    changes = emulated_session.recorder.artifacts["api-surface:conformance.emulation"]["changes"]
    assert [(c["where"], c["kind"], c["breaking"]) for c in changes] == [
        ("ElasticBuffer.combine(do_zero_padding)", "added-optional-param", False)
    ]


def test_p14_holds_on_the_emulation(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, P14, [CASE])
    assert_holds(two_node_session, P14, [ApiSurfaceCase(world_size=4)])


def test_committed_snapshot_is_generated_from_the_transcribed_signatures() -> None:
    assert load_snapshot() == snapshot_from_signatures(SIGNATURES), f"regenerate {SNAPSHOT.name}"


def test_diff_rules_on_a_removed_and_a_required_argument() -> None:
    snapshot = load_snapshot()
    observed = load_snapshot()
    params = observed["classes"]["Buffer"]["combine"]["params"]
    observed["classes"]["Buffer"]["combine"]["params"] = [p for p in params if p["name"] != "bias"] + [
        {"name": "stream", "kind": "KEYWORD_ONLY", "default": None}]
    kinds = {(c.where, c.kind, c.breaking) for c in diff_surface(snapshot, observed)}
    assert ("Buffer.combine(bias)", "removed-param", True) in kinds
    assert ("Buffer.combine(stream)", "added-required-param", True) in kinds


def test_the_snapshot_is_the_surface_recorded_on_the_real_library() -> None:
    """Every public method of the real 2.1.0 (docs/real-runs/api-surface-real-2.1.0.json, probed on hardware) is
    either compared, with the signature recorded there, or listed ``not_covered``; the transcribed signatures of
    ``not_covered`` methods (the mask calls, compared once emulated) are the recorded ones too."""
    real = json.loads((ROOT / "docs" / "real-runs" / "api-surface-real-2.1.0.json").read_text())["surface"]
    snapshot = load_snapshot()
    transcribed = snapshot_from_signatures(SIGNATURES, include_not_covered=True)["classes"]
    for cls, methods in real["classes"].items():
        compared, not_covered = snapshot["classes"][cls], set(snapshot["not_covered"].get(cls, []))
        assert set(methods) == set(compared) | not_covered and not set(compared) & not_covered, cls
        for name, entry in transcribed[cls].items():
            assert entry == methods[name], f"{cls}.{name}: transcribed {entry}, recorded {methods[name]}"
