"""``python -m conformance.new_property NAME``: start a new property, with nothing else to edit by hand.

Writes the three files a property is made of and regenerates the docs that list properties:

- ``conformance/properties/test_pNN_<name>.py``: the property module (its id ``PNN-<name>``, title, strategy, task,
  applicability and, in its docstring, its documentation); its check raises until you write it;
- ``conformance/strategies/<name>.py``: its draws, starting from the shared vocabulary (``--no-strategy``: use
  :func:`conformance.strategies.examples` as it is);
- ``tests/quality/test_pNN_meta.py``: its meta-test (the planted defect it catches, that it holds on the emulation); it
  fails until you name the mutant;
- then ``python -m conformance.docs --write`` (the README's catalog table, docs/properties.md, the integrators'
  applicability table).  The report, the verdict matrix, ``conformance.repro``, the kill matrix and the self-tests'
  expectations (``tests/helpers/expectations.py``) read the catalog: the new property is in all of them at once.

``NN`` is the lowest number no property has.  ``--apis v2`` for a property of one API, ``--needs a,b`` for the
capabilities a backend must declare (``conformance.core.spec.CAPABILITIES``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from conformance.core.spec import APIS, CAPABILITIES

ROOT = Path(__file__).resolve().parent.parent

PROPERTY = '''"""{pid}: {title}.

TODO: what holds, in the words of the contract: which outputs, against what (the oracle, the other API), byte-exact
or within which derived bound, and why the strategy's corners are the ones that matter.  This docstring is the
property's documentation (docs/properties.md is generated from it).
"""

from __future__ import annotations

from typing import Any

from conformance.assertions import for_each_backend
from conformance.core.example import Example, build_all_inputs
from conformance.core.views import DispatchView
from conformance.properties import CheckContext, Property, register
{strategy_import}
from conformance.tasks.dispatch import dispatch_views


def check(ctx: CheckContext, example: Example, per_rank: list[dict[str, Any]]) -> None:
    """TODO: raise AssertionError (through conformance.assertions' helpers) where the contract is broken."""
    __tracebackhide__ = True
    inputs = build_all_inputs(example)

    def against_oracle(rank: int, backend: str, view: DispatchView) -> None:
        raise NotImplementedError(
            f"{pid}: the check is not written yet ({{len(inputs)}} ranks' inputs, {{view.call}})")

    def pairwise(rank: int, first: tuple[str, DispatchView], other: tuple[str, DispatchView]) -> None:
        raise NotImplementedError("{pid}: the pairwise check is not written yet")

    for_each_backend(ctx, example, per_rank, against_oracle, pairwise)


PROPERTY = register(Property(
    id="{pid}",
    title="{title}",
    strategy=sized({strategy}), task=dispatch_views, check=check,{extra}
))
test_{snake} = PROPERTY.test
'''

STRATEGY = '''"""Draws of {pid}.

TODO: which corners of the contract they aim at (see conformance/strategies/__init__).
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.core.example import Example
from conformance.strategies import examples


def {strategy}(world_size: int) -> st.SearchStrategy[Example]:
    """Examples for {pid} on a world of ``world_size`` ranks.

    TODO: narrow or extend the shared draws.
    """
    return examples(world_size)
'''

META = '''"""Meta-tests of {pid}: it catches the defect it exists to catch, and holds on the emulation."""

from {strategy_module} import {strategy}
from tests.helpers.meta import assert_caught, assert_holds, sample

PID = "{pid}"
#: TODO: the registered mutant (conformance/mutants/) this property must catch; a new kind of defect is a new mutant.
MUTANT = "TODO"


def test_{snake}_catches_its_defect(emulated_session) -> None:
    example, message = assert_caught(emulated_session, PID, MUTANT, {strategy}(2))
    assert message, (example, message)  # TODO: what the message must name (the value, the expectation, the call)


def test_{snake}_holds_on_the_emulation_including_two_nodes(emulated_session, two_node_session) -> None:
    assert_holds(emulated_session, PID, sample({strategy}(2), 10))
    assert_holds(two_node_session, PID, sample({strategy}(4), 5))
'''


def taken_numbers(root: Path) -> dict[int, str]:
    """``{number: module file}`` of the property modules of ``root``."""
    return {int(m.group(1)): path.name for path in (root / "conformance" / "properties").glob("test_p*.py")
            if (m := re.match(r"test_p(\d+)_", path.name))}


def next_number(root: Path) -> int:
    """The lowest property number no module of ``root`` has."""
    taken = taken_numbers(root)
    return next(n for n in range(1, 1000) if n not in taken)


def create(root: Path, name: str, title: str, apis: tuple[str, ...], needs: tuple[str, ...], strategy_module: bool,
           number: int | None = None) -> list[Path]:
    """Write the new property's files under ``root``; return them."""
    kebab = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not kebab:
        raise ValueError(f"{name!r} has no letters or digits to make a property name of")
    snake = kebab.replace("-", "_")
    if number is not None and number in taken_numbers(root):
        raise ValueError(f"P{number} is taken ({taken_numbers(root)[number]}); leave --number out for a free one")
    number = number or next_number(root)
    pid = f"P{number}-{kebab}"
    extra = "".join([f"\n    apis={apis!r}," if tuple(apis) != tuple(APIS) else "",
                     f"\n    needs={needs!r}," if needs else ""])
    strategy_import = (f"from conformance.strategies import sized\nfrom conformance.strategies.{snake} import "
                       f"{snake}_examples" if strategy_module else "from conformance.strategies import examples, sized")
    names = {"strategy_import": strategy_import, "pid": pid, "title": title.replace('"', "'"), "snake": snake,
             "extra": extra,
             "strategy": f"{snake}_examples" if strategy_module else "examples",
             "strategy_module": f"conformance.strategies.{snake}" if strategy_module else "conformance.strategies"}
    files = {root / "conformance" / "properties" / f"test_p{number:02d}_{snake}.py": PROPERTY,
             root / "tests" / "quality" / f"test_p{number:02d}_meta.py": META}
    if strategy_module:
        files[root / "conformance" / "strategies" / f"{snake}.py"] = STRATEGY
    for path in files:
        if path.exists():
            raise FileExistsError(f"{path} exists already")
    for path, template in files.items():
        path.write_text(template.format(**names))
    return list(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.new_property",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("name", help="the property's name, e.g. all-tokens-to-one-rank (its id: PNN-<name>)")
    parser.add_argument("--title", default="TODO: one line saying what holds", help="one line saying what holds")
    parser.add_argument("--apis", default="v1,v2", help="the APIs it checks: v1, v2 or v1,v2 (default)")
    parser.add_argument("--needs", default="", help="capabilities a backend must declare, comma-separated")
    parser.add_argument("--no-strategy", action="store_true", help="draw with conformance.strategies.examples")
    parser.add_argument("--number", type=int, help="its NN (default: the lowest free one)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    apis = tuple(a for a in args.apis.split(",") if a)
    needs = tuple(n for n in args.needs.split(",") if n)
    wrong = [a for a in apis if a not in APIS] + [n for n in needs if n not in CAPABILITIES]
    if wrong or not apis:
        parser.error(f"unknown API or capability: {', '.join(wrong) or '(no API)'}; APIs: {', '.join(APIS)}; "
                     f"capabilities: {', '.join(CAPABILITIES)}")
    try:
        files = create(args.root, args.name, args.title, apis, needs, not args.no_strategy, args.number)
    except (ValueError, FileExistsError) as exc:
        print(f"python -m conformance.new_property: {exc}", file=sys.stderr)
        return 2
    for path in files:
        print(f"wrote {path.relative_to(args.root)}")
    from conformance import docs  # after the files exist: the catalog imports the new module

    docs.main(["--root", str(args.root), "--write"])
    print(f"""
Next (docs/architecture.md, "Adding a property"):
  1. {files[0].relative_to(args.root)}: the docstring, the title and the check (it raises until written);
     reuse a task of conformance/tasks/ or write a @rank_task there.
  2. {files[-1].relative_to(args.root) if len(files) > 2 else 'conformance.strategies.examples'}: the draws.
  3. {files[1].relative_to(args.root)}: MUTANT, a registered defect it must catch (or a new one in
     conformance/mutants/).
  4. python -m conformance.docs --write   (after changing the title or the docstring)
  5. pytest {files[1].relative_to(args.root)} && pytest conformance/properties/{files[0].name} && \\
     python -m conformance.mutation --mutants MUTANT --report /tmp/m.json""")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
