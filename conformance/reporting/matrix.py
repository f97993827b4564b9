"""The verdict matrix: one row per property, one column per backend (against the oracle) and per compared pair.

Shared by the terminal summary, the Markdown report, ``$GITHUB_STEP_SUMMARY`` and the HTML page.
"""

from __future__ import annotations

from typing import Any

from conformance.core.ids import Pair, is_pair


def columns_of(document: dict[str, Any]) -> list[str]:
    """The verdict matrix' columns: every backend, then every compared pair, in the order they were seen."""
    names: list[str] = [b["name"] for b in document["environment"]["backends"]]
    for p in document["properties"]:
        for name in p.get("verdicts", {}):
            if name not in names:
                names.append(name)
    return [n for n in names if not is_pair(n)] + [n for n in names if is_pair(n)]


def cell(p: dict[str, Any], column: str) -> tuple[str, str]:
    """The matrix cell of property ``p`` in ``column``: its verdict and the reason in one line."""
    v = p.get("verdicts", {}).get(column)
    if v is None:
        if p["status"] in ("not-run", "skipped"):
            return p["status"], ""  # the reason is the property's, said once (the report's partial-run line)
        if p.get("not_applicable"):
            return "unsupported", p["not_applicable"]
        return "-", "not checked on this backend / pair"
    status = v["status"]
    if status == "not-checked":
        return "-", "this property does not compare this pair"
    if not v.get("checked") and v.get("reason"):  # left out before any example (another API, broken, ...)
        return status, v["reason"]
    parts = [f"{v['held']}/{v['checked']} checked examples held"]
    if v.get("excluded"):
        parts.append(f"{v['excluded']} excluded by a known limit (" + "; ".join(
            f"{c}: {n}" for c, n in v["exclusions"].items()) + ")")
    if v.get("failed"):
        parts.append(f"{v['failed']} failed (shrinking included)")
    if v.get("suite_errors"):
        parts.append(f"{v['suite_errors']} suite error(s): the suite's own code raised, no verdict on this column")
    if v.get("known_defect"):
        parts.append("known defect " + ", ".join(f"{d} ({n})" for d, n in v["defects"].items()))
    if v.get("divergent"):
        parts.append("divergence: " + "; ".join(v["divergences"]))
    return status, "; ".join(parts)


SYMBOLS = {"passed": "passed", "failed": "FAILED", "suite-error": "SUITE-ERROR", "known-defect": "known-defect",
           "divergence": "divergence", "unsupported": "unsupported", "not-run": "not-run", "skipped": "skipped",
           "-": "-"}


def short_backend(name: str) -> str:
    """A backend's name in a pair column: ``emulated-v1`` -> ``emu1``, ``real-v2`` -> ``real2``, a plug-in by its
    initials (``megatron-fused-a2a-v1`` -> ``mfa1``), ``module:Class`` by the class."""
    for impl, short in (("emulated", "emu"), ("real", "real")):
        if name in (f"{impl}-v1", f"{impl}-v2"):
            return short + name[-1]
    name = name.rpartition(":")[2] if ":" in name else name
    parts = [p for p in name.replace("=", "-").replace("_", "-").split("-") if p]
    version = parts.pop()[-1] if len(parts) > 1 and parts[-1] in ("v1", "v2") else ""
    return ("".join(p[0] for p in parts) if len(parts) > 1 else name) + version


def short_column(name: str) -> str:
    """``emulated-v1 vs emulated-v2`` -> ``emu1~emu2``; ``emulated-v2`` -> ``emulated-v2``."""
    pair = Pair.parse(name)
    return f"{short_backend(pair.first)}~{short_backend(pair.other)}" if pair else name


def pair_legend(columns: list[str]) -> str:
    """``emu1 = emulated-v1, ...``: the short names the pair columns use."""
    names = []
    for column in columns:
        for name in Pair.parse(column) or ():
            if name not in names:
                names.append(name)
    return ", ".join(f"{short_backend(n)} = {n}" for n in names)


def matrix_rows(document: dict[str, Any]) -> tuple[list[str], list[tuple[dict[str, Any], list[tuple[str, str]]]]]:
    """``(columns, [(property, [(verdict, reason) per column])])``."""
    columns = columns_of(document)
    return columns, [(p, [cell(p, c) for c in columns]) for p in document["properties"]]


def counts_text(p: dict[str, Any], column: str) -> str:
    v = p.get("verdicts", {}).get(column)
    if not v or v["status"] == "not-checked":
        return ""
    text = f"{v['held']}/{v['checked']}"
    if v.get("excluded"):
        text += f" +{v['excluded']}x"
    return text


