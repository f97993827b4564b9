"""``conformance.html``: one self-contained page (no network: styles inline, pictures as data URIs).

The page is a jinja2 template (``templates/report.html.j2``) over the report document: the verdict matrix
(property x backend / pair, the reason on hover and beside it), the version gate's paragraphs, the known defects,
and per failure the shrunk counterexample: per-rank token counts, the routing of the offending tokens as a
heat-map (:mod:`conformance.reporting.figures`), the differing bytes side by side (expected vs observed, hex and
value) and the commands that reproduce it.  jinja2 and matplotlib are the optional ``report`` extra: without
jinja2 no page is written (the summary says why); without matplotlib the routing is a table.
"""

from __future__ import annotations

import json
import os
from typing import Any

TEMPLATE = "report.html.j2"


def render(document: dict[str, Any]) -> str:
    """The page of ``document`` (raises ``ImportError`` without jinja2)."""
    import jinja2

    from conformance.core.outcomes import STATUSES
    from conformance.reporting.figures import routing_heatmap, routing_of
    from conformance.reporting.matrix import counts_text, matrix_rows

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    columns, rows = matrix_rows(document)
    cells = [(p, [(verdict, reason, counts_text(p, c)) for c, (verdict, reason) in zip(columns, row, strict=True)])
             for p, row in rows]
    database = os.path.join(os.path.dirname(document.get("path") or "reports/x"), "hypothesis")
    failures = []
    for p in document["properties"]:
        if p["status"] != "failed":
            continue
        detail = p.get("failure_detail")
        routing = routing_of(p.get("counterexample"), detail)
        message = p.get("message") or ""
        for marker in ("\nFailing test case", "\nFalsifying example"):  # Hypothesis' own notes: shown below
            message = message.split(marker, 1)[0]
        failures.append({
            "p": p, "message": message, "detail": detail, "routing": routing, "database": database,
            "heatmap": routing_heatmap(routing) if routing is not None else None,
            "byte_rows": list(zip(detail["expected"], detail["got"], strict=False)) if detail else [],
            "counterexample_json": json.dumps(p.get("counterexample")),
        })
    exclusions = [(p, backend, info, p.get("verdicts", {}).get(backend))
                  for p in document["properties"] for backend, info in p.get("unsupported", {}).items()]
    summary = document["summary"]
    return env.get_template(TEMPLATE).render(
        doc=document, env=document["environment"], summary=summary,
        counts=[(s, summary[s]) for s in STATUSES if summary.get(s)], columns=columns, rows=cells,
        gate=document.get("gate"), known=document.get("known_defects") or {"entries": []}, failures=failures,
        exclusions=exclusions, env_json=json.dumps(document["environment"], indent=1, default=str),
    )


def write_html(path: str, document: dict[str, Any]) -> tuple[str | None, str | None]:
    """Write the page to ``path``: ``(path, None)``, or ``(None, why not)`` without jinja2."""
    try:
        page = render(document)
    except ImportError as exc:
        return None, f"not written ({exc.name or exc} is not installed: pip install 'deepep-conformance[report]')"
    with open(path, "w") as f:
        f.write(page)
    return path, None
