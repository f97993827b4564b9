"""Mutation self-test: plant every registered mutant and run the property catalog against it.

    python -m conformance.mutation --report reports/mutation.json [--mutants a,b] [--properties P1-...,...]

Writes the kill matrix as JSON and prints a table as it goes.  Exit status: 0 if every harmful mutant
is killed and every benign one spared (and no property fails without a mutant or crashes), 1 otherwise,
2 on bad arguments.  See docs/mutation.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.core.spec import parse_backends
from conformance.harness.config import RunConfig
from conformance.harness.options import add_options
from conformance.harness.session import Session
from conformance.mutants import load_catalog as load_mutants
from conformance.mutation.killmatrix import (
    exit_status,
    property_sort_key,
    summarize,
    summary_lines,
    table_header,
    table_row,
    write_report,
)
from conformance.mutation.runner import Budget, load_catalog, run_mutants
from conformance.world.launcher import WorldShape

DEFAULT_EXAMPLE_TIMEOUT_S = 30.0
DEFAULT_SEED = 0


def parse_args(argv: list[str] | None, catalog_ids: list[str]) -> argparse.Namespace:
    """Parse and validate the command line (unknown mutant or property names exit with status 2)."""
    parser = argparse.ArgumentParser(prog="python -m conformance.mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", required=True, help="where the kill matrix (JSON) is written")
    parser.add_argument("--mutants", default=None, help="comma-separated subset of mutants (default: all)")
    parser.add_argument("--properties", default=None, help="comma-separated subset of property ids (default: all)")
    add_options(parser, ("--max-examples", "--nodes", "--ranks-per-node", "--example-timeout"),
                example_timeout=DEFAULT_EXAMPLE_TIMEOUT_S)  # the suite's own, from its table (per property and mutant)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed of every draw (default {DEFAULT_SEED})")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes, each with its own world (default 1)")
    parser.add_argument("--first-kill", action="store_true",
                        help="stop each harmful mutant at its first killed property (killed_by then names that one; "
                             "benign mutants still run every property)")
    parser.add_argument("--order-from", metavar="REPORT",
                        help="an earlier kill matrix: try each mutant's killers there first (with --first-kill, the "
                             "kill usually comes from the first property tried)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # rows only (a --jobs worker)
    args = parser.parse_args(argv)
    for name in ("max_examples", "nodes", "ranks_per_node", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.example_timeout <= 0:
        parser.error(f"--example-timeout must be positive, got {args.example_timeout}")
    args.mutants = _subset(parser, "--mutants", args.mutants, list(load_mutants()))
    args.properties = _subset(parser, "--properties", args.properties, catalog_ids)
    return args


def _orders(path: str | None) -> dict[str, list[str]]:
    """Each mutant's killers in an earlier kill matrix, quickest first (``--order-from``)."""
    if not path:
        return {}
    entries = json.loads(Path(path).read_text())["mutants"]
    return {e["name"]: sorted(e["killed_by"], key=lambda pid: e["properties"][pid]["examples"]) for e in entries}


def _subset(parser: argparse.ArgumentParser, option: str, value: str | None, known: list[str]) -> list[str]:
    if value is None:
        return known
    chosen = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        parser.error(f"{option}: unknown {', '.join(unknown) or '(empty list)'}; valid: {', '.join(known)}")
    return chosen


def run_in_workers(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    """Split the mutants over ``args.jobs`` worker processes (each its own world); their rows, in order."""
    chunks = [args.mutants[k :: args.jobs] for k in range(args.jobs) if args.mutants[k :: args.jobs]]
    base = _strip_options(argv, ("--mutants", "--report", "--jobs"))
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        parts = [Path(tmp) / f"part-{k}.json" for k in range(len(chunks))]
        procs = [
            subprocess.Popen([sys.executable, "-m", "conformance.mutation", *base, "--worker",
                              "--mutants", ",".join(chunk), "--report", str(part)])
            for chunk, part in zip(chunks, parts, strict=True)
        ]
        for proc in procs:
            proc.wait()
        entries = {}
        for proc, part in zip(procs, parts, strict=True):
            if not part.exists():
                raise SystemExit(f"a worker (pid {proc.pid}) exited with status {proc.returncode} without a report")
            entries.update({e["name"]: e for e in json.loads(part.read_text())["mutants"]})
    return [entries[name] for name in args.mutants]


def _strip_options(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` without the given options (``--opt value`` or ``--opt=value``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in options)):
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the mutation self-test; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    mutants = load_mutants()
    catalog, broken = load_catalog()
    args = parse_args(argv, sorted(catalog, key=property_sort_key))
    whole_catalog = not any(a == "--properties" or a.startswith("--properties=") for a in argv)
    for module, error in broken.items():
        print(f"{'ERROR' if whole_catalog else 'warning'}: property module {module} does not import: {error}")
    started = time.monotonic()
    shape = WorldShape(args.nodes, args.ranks_per_node)
    config = RunConfig(shape, tuple(parse_backends("emulated", False)), "cpu", args.example_timeout)
    backends = [b.name for b in config.backends]
    world = {"nodes": shape.nodes, "ranks_per_node": shape.ranks_per_node, "backends": backends}
    if not args.worker:
        print(f"mutation self-test: {len(args.mutants)} mutant(s) x {len(args.properties)} propert(ies), "
              f"up to {args.max_examples} examples each, seed {args.seed}, world {shape.nodes}x{shape.ranks_per_node}")
        print(table_header(), flush=True)
    if args.jobs > 1:
        entries = run_in_workers(args, argv)
    else:
        session = Session(config)
        try:
            session.world.start()  # start-up is not charged to the first mutant
            entries = run_mutants(
                session,
                [mutants[name] for name in args.mutants],
                {pid: catalog[pid] for pid in args.properties},
                Budget(args.max_examples, args.seed),
                on_entry=lambda entry: print(table_row(entry), flush=True),
                first_kill=args.first_kill,
                orders=_orders(args.order_from),
            )
        finally:
            session.close()
    summary = summarize(entries, wall_s=time.monotonic() - started, max_examples=args.max_examples, world=world)
    summary.update(seed=args.seed, properties=args.properties)
    if whole_catalog:  # a property that cannot even load is a hole in the full run
        summary["errors"] += [f"import {module}: {error}" for module, error in broken.items()]
    path = write_report(args.report, entries, summary)
    if not args.worker:
        for line in summary_lines(summary):
            print(line)
        print(f"kill matrix: {path}")
    return exit_status(summary)


if __name__ == "__main__":
    sys.exit(main())
