"""Replay one example against one property, outside Hypothesis and pytest.

    python -m conformance.repro P1-per-expert-payloads '{"tokens_per_rank": [3, 0], ...}' --nodes 1 --ranks-per-node 2

Every failure message of the suite ends with such a line.  Exit status: 0 if the property holds, 1 if
it fails or a rank raised, hung or died (the message, with every rank's story, is printed), 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import sys

from conformance.harness.options import add_options, build_run_config
from conformance.harness.session import Session
from conformance.properties import NotApplicable, catalog
from conformance.world.errors import RankFailure


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the check once, print the verdict."""
    parser = argparse.ArgumentParser(prog="python -m conformance.repro", description=__doc__.split("\n\n")[0])
    properties = catalog()
    parser.add_argument("property", choices=list(properties), metavar="PROPERTY", help="e.g. P1-per-expert-payloads")
    parser.add_argument("example", help="the example (case) as JSON, from a report or a failure message")
    # the suite's own options, from its table; the case is replayed on the shapes it was drawn on, as given
    add_options(parser, ("--nodes", "--ranks-per-node", "--backends", "--device", "--example-timeout", "--mutant",
                         "--deep-ep", "--rank-setup", "--shapes"), shapes="free")
    args = parser.parse_args(argv)
    try:
        example = properties[args.property].case_type.from_json(args.example)
        example.validate()
        config = build_run_config(args)
    except (ValueError, TypeError) as exc:  # SetupError is a ValueError
        parser.error(str(exc))
    if example.world_size != config.world_size:
        parser.error(f"the example is written for {example.world_size} ranks, the world has {config.world_size}")
    backends = config.backends
    session = Session(config)
    try:
        session.check(args.property, example)
    except (AssertionError, RankFailure) as failure:  # a wrong result, or a rank that raised, hung or died
        print(f"FAILED {args.property}: {failure}")
        return 1
    except NotApplicable as reason:
        print(f"NOT APPLICABLE {args.property}: {reason}")
        return 0
    finally:
        session.close()
    for defect_id, seen in session.recorder.known_defects.items():
        if seen["failed"]:
            print(f"KNOWN DEFECT {args.property} ({defect_id}, {session.known_defects.path}): {seen['message']}")
            return 1
    print(f"PASSED {args.property} on {', '.join(b.name for b in backends)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
