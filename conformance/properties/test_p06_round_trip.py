"""P6 round trip: combine(dispatch(x)) with identity experts = x times the number of ranks the token reached."""

from __future__ import annotations

from conformance.checks.round_trip import check
from conformance.properties import Property, register
from conformance.strategies import sized
from conformance.strategies.combine import round_trip_examples
from conformance.tasks.combine import round_trip

PROPERTY = register(Property(
    id="P6-round-trip",
    title="combine(dispatch(x)) with identity experts = x x (number of ranks the token reached)",
    strategy=sized(round_trip_examples), task=round_trip, check=check, needs=("combine",),
))
test_round_trip = PROPERTY.test
