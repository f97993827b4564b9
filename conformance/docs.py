"""``python -m conformance.docs``: the documentation generated from the property catalog.

A property module (``conformance/properties/test_pNN_<name>.py``) is the only place its id, title, applicability
(the APIs it checks and the capabilities it needs) and documentation (the module's docstring) live.  Everything that
lists properties is generated from :func:`conformance.properties.catalog` here:

- ``docs/properties.md``: the whole catalog, one section per property (title, what it applies to, its docstring);
- the catalog table of ``README.md`` (block ``catalog``);
- the applicability table of ``docs/integrators.md`` (block ``applicability``): which properties check a plug-in
  with the declarations the document shows (its minimal example, Megatron-Core's wrapper), and why the others do not;
- the set-up limits table of ``docs/reference.md`` (block ``setup-limits``), from ``conformance/core/setup_limits.py``.

``python -m conformance.docs`` checks them (exit 1, naming each stale file and this command); ``--write`` rewrites
them.  ``tests/nocover/test_docs_drift.py`` runs the check, so a property added without running ``--write`` fails the
self-tests with that instruction.  (The migration table of ``docs/integrators.md`` is generated from a run instead:
``conformance.reporting.migration``.)
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from conformance.core.spec import APIS
from conformance.properties import Property, catalog

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python -m conformance.docs --write"


def begin(name: str) -> str:
    """The line opening generated block ``name`` in a Markdown file."""
    return f"<!-- generated: {name} ({COMMAND}); do not edit -->"


def end(name: str) -> str:
    """The line closing generated block ``name``."""
    return f"<!-- /generated: {name} -->"


def anchor(prop: Property) -> str:
    """The GitHub anchor of a property's section in docs/properties.md."""
    return re.sub(r"[^a-z0-9-]", "", prop.id.lower())


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _applies(prop: Property) -> str:
    apis = " and ".join(f"{api.upper()} (`{APIS[api]}`)" for api in prop.apis)
    needs = ", ".join(f"`{need}`" for need in prop.needs)
    return apis + (f"; backends that declare {needs}" if needs else "")


def catalog_table(props: Iterable[Property], link: str = "docs/properties.md") -> list[str]:
    """One row per property: its id (linked to its section), what holds, which APIs."""
    lines = ["| property | what holds | APIs |", "|---|---|---|"]
    for prop in props:
        lines.append(f"| [{prop.id}]({link}#{anchor(prop)}) | {_cell(prop.title)} | "
                     f"{', '.join(api.upper() for api in prop.apis)} |")
    return lines


def properties_page(props: Iterable[Property]) -> str:
    """docs/properties.md: every property, in catalog order."""
    props = list(props)
    lines = ["# The properties", "",
             f"<!-- This file is generated from the property modules ({COMMAND}); do not edit. -->", "",
             "One section per property, in catalog order, written from its module (`conformance/properties/"
             "test_pNN_<name>.py`: the registry entry and the module's docstring). How to read a verdict: the "
             "README's \"Reading a report\"; how to add a property: docs/architecture.md.", "",
             *catalog_table(props, link=""), ""]
    for prop in props:
        path = Path(sys.modules[prop.module].__file__ or "").resolve()
        try:
            shown = path.relative_to(ROOT).as_posix()
        except ValueError:
            shown = path.name
        lines += [f"## {prop.id}", "", f"**What holds:** {_cell(prop.title)}", "",
                  f"**Checks:** {_applies(prop)}. **Module:** [`{shown}`](../{shown})", "", prop.doc, ""]
    return "\n".join(lines).rstrip() + "\n"


def applicability_table(props: Iterable[Property], backends: list[tuple[str, str, frozenset[str]]]) -> list[str]:
    """Per property, for each ``(label, api, capabilities)`` backend: ``checked``, or why not (the session's rule,
    :meth:`Property.applies_to`)."""
    lines = ["| property | " + " | ".join(label for label, _, _ in backends) + " |",
             "|---|" + "---|" * len(backends)]
    for prop in props:
        cells = []
        for _, api, capabilities in backends:
            reason = prop.applies_to(api, capabilities)
            if reason is None:
                cells.append("checked")
            elif api not in prop.apis:
                cells.append(f"unsupported: the {'/'.join(a.upper() for a in prop.apis)} contract")
            else:
                missing = [need for need in prop.needs if need not in capabilities]
                cells.append("unsupported: needs " + ", ".join(f"`{m}`" for m in missing))
        lines.append(f"| {prop.id} | " + " | ".join(cells) + " |")
    return lines


def example_declaration(text: str, marker: str = "<!-- plugin-example:") -> tuple[str, frozenset[str]]:
    """``(api, capabilities)`` the minimal plug-in example printed in ``text`` declares (its class attributes)."""
    code = text.split(marker, 1)[1].split("```python", 1)[1].split("```", 1)[0]
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("api", "capabilities"):
            found[node.targets[0].id] = ast.literal_eval(node.value)
    return str(found["api"]), frozenset(found["capabilities"])  # type: ignore[arg-type]


def integrator_backends(text: str) -> list[tuple[str, str, frozenset[str]]]:
    """The backends docs/integrators.md shows: its minimal example and Megatron-Core's two paths."""
    from conformance.integrations import MEGATRON_CAPABILITIES

    api, capabilities = example_declaration(text)
    example = ", ".join(f"`{c}`" for c in sorted(capabilities))
    megatron = ", ".join(f"`{c}`" for c in sorted(MEGATRON_CAPABILITIES))
    return [(f"the minimal example ({api.upper()}: {example})", api, capabilities),
            (f"`megatron-fused-a2a-v1` ({megatron})", "v1", MEGATRON_CAPABILITIES),
            ("`megatron-fused-a2a-v2` (the same)", "v2", MEGATRON_CAPABILITIES)]


def setup_limits_table() -> list[str]:
    """The set-up limits (``conformance/core/setup_limits.py``), one row each: where, what cannot work, the evidence,
    what of the suite it keeps from being made, where that is checked instead."""
    from conformance.core.setup_limits import SETUP_LIMITS, SETUPS

    lines = ["| limit | set-up | the call | what cannot work | evidence | not made (reported `unsupported`) | "
             "checked with |", "|---|---|---|---|---|---|---|"]
    for limit in SETUP_LIMITS:
        setups = "; ".join(f"`{setup}`: {SETUPS[setup]}" for setup in limit.setups)
        lines.append(f"| `{limit.id}` | {_cell(setups)} | `{limit.call}` with {_cell(limit.condition)} on the real "
                     f"library | {_cell(limit.cannot)} | {_cell(limit.evidence)} | "
                     f"{'<br>'.join(_cell(line) for line in limit.covers)} | {_cell(limit.checked_with)} |")
    return lines


def replace_block(text: str, name: str, block: list[str], path: str) -> str:
    """``text`` with generated block ``name`` replaced by ``block``."""
    opening, closing = begin(name), end(name)
    if opening not in text or closing not in text:
        raise ValueError(f"{path} has no generated block '{name}' ({opening} ... {closing})")
    head, rest = text.split(opening, 1)
    _, tail = rest.split(closing, 1)
    return head + opening + "\n" + "\n".join(block).rstrip() + "\n" + closing + tail


def rendered(root: Path = ROOT) -> dict[Path, str]:
    """``{file: what it must hold}`` for every generated file or block under ``root``."""
    props = list(catalog().values())
    readme, integrators = root / "README.md", root / "docs" / "integrators.md"
    reference = root / "docs" / "reference.md"
    integrators_text = integrators.read_text()
    return {
        reference: replace_block(reference.read_text(), "setup-limits", setup_limits_table(), "docs/reference.md"),
        root / "docs" / "properties.md": properties_page(props),
        readme: replace_block(readme.read_text(), "catalog", catalog_table(props), "README.md"),
        integrators: replace_block(integrators_text, "applicability",
                                   applicability_table(props, integrator_backends(integrators_text)),
                                   "docs/integrators.md"),
    }


def stale(root: Path = ROOT) -> list[Path]:
    """The generated files that differ from what the catalog says now."""
    return [path for path, text in rendered(root).items() if not path.exists() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.docs", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the generated files and blocks")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    if args.write:
        for path, text in rendered(args.root).items():
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                print(f"wrote {path.relative_to(args.root)}")
        return 0
    outdated = stale(args.root)
    for path in outdated:
        print(f"{path.relative_to(args.root)} differs from the property catalog: run {COMMAND}", file=sys.stderr)
    return 1 if outdated else 0


if __name__ == "__main__":
    raise SystemExit(main())
