"""The pictures of the HTML report: a counterexample's routing as a heat-map (matplotlib, PNG as a data URI).

matplotlib is optional (the ``report`` extra): :func:`routing_heatmap` returns ``None`` without it and the page
shows the same routing as a table.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from typing import Any

#: At most this many token rows in a heat-map (the offending tokens first, then their neighbours).
MAX_ROWS = 32


@dataclass
class Routing:
    """The routing of a counterexample's tokens: rows (source rank, token), top-k weights per expert."""

    world_size: int
    num_experts: int
    experts_per_rank: int
    tokens_per_rank: list[int]
    rows: list[tuple[int, int]]  # (source rank, source token)
    weights: list[list[float | None]]  # per row, per expert: the routed weight, None where not routed
    offending: set[tuple[int, int]]
    receiving_rank: int | None  # the rank where the failure was seen
    total_tokens: int

    def owner(self, expert: int) -> int:
        """The rank that owns ``expert``."""
        return expert // self.experts_per_rank


def example_of_counterexample(counterexample: dict[str, Any] | None) -> Any:
    """The :class:`~conformance.core.example.Example` inside a counterexample (a case or an example), or ``None``."""
    from conformance.core.example import Example

    if not counterexample:
        return None
    fields = counterexample.get("example", counterexample)
    if not isinstance(fields, dict) or "tokens_per_rank" not in fields:
        return None
    try:
        return Example.from_json(json.dumps(fields))
    except (TypeError, ValueError):
        return None


def routing_of(counterexample: dict[str, Any] | None, detail: dict[str, Any] | None) -> Routing | None:
    """The routing to draw for a failure: the offending tokens (from the failure's detail) and their neighbours,
    or the first tokens when no token is named."""
    from conformance.core.example import build_all_inputs

    example = example_of_counterexample(counterexample)
    if example is None:
        return None
    inputs = build_all_inputs(example)
    offending = {(int(r), int(t)) for r, t in (detail or {}).get("tokens", [])}
    every = [(r, t) for r in range(example.world_size) for t in range(example.tokens_per_rank[r])]
    if len(every) <= MAX_ROWS:
        rows = every
    else:
        chosen = [tok for tok in every if tok in offending]
        for r, t in list(chosen) or every[:1]:
            chosen += [(r, u) for u in range(max(0, t - 3), t + 4) if u < example.tokens_per_rank[r]]
        chosen += every
        rows = sorted(dict.fromkeys(chosen[: 4 * MAX_ROWS]))[:MAX_ROWS]
    weights = []
    for r, t in rows:
        row: list[float | None] = [None] * example.num_experts
        idx, w = inputs[r].topk_idx[t].tolist(), inputs[r].topk_weights[t].tolist()
        for slot, expert in enumerate(idx):
            if expert >= 0:
                row[expert] = float(w[slot])
        weights.append(row)
    return Routing(example.world_size, example.num_experts, example.num_experts // example.world_size,
                   list(example.tokens_per_rank), rows, weights, offending,
                   (detail or {}).get("rank"), len(every))


def routing_heatmap(routing: Routing) -> str | None:
    """The routing as a PNG data URI: tokens x experts, the routed weight as colour, experts grouped by owning
    rank (bands and labels), offending tokens outlined in red; ``None`` without matplotlib."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        return None
    import numpy as np

    data = np.array([[np.nan if w is None else w for w in row] for row in routing.weights], dtype=float)
    rows, experts = data.shape if data.size else (len(routing.rows), routing.num_experts)
    fig = Figure(figsize=(min(max(6.5, 2.4 + 0.42 * experts), 12), min(max(2.8, 1.8 + 0.3 * rows), 11)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#f2f2f2")
    image = ax.imshow(np.ma.masked_invalid(data) if data.size else np.zeros((1, experts)), cmap=cmap,
                      aspect="auto", interpolation="nearest", vmin=0.0, vmax=max(1e-9, float(np.nanmax(data)))
                      if data.size and np.isfinite(data).any() else 1.0)
    band = ("#d9e6f5", "#f5e6d9")
    for rank in range(routing.world_size):
        first = rank * routing.experts_per_rank
        ax.axvspan(first - 0.5, first + routing.experts_per_rank - 0.5, ymin=1.0, ymax=1.04, clip_on=False,
                   color=band[rank % 2] if rank != routing.receiving_rank else "#f4a3a3")
        ax.text(first + routing.experts_per_rank / 2 - 0.5, 1.06, f"rank {rank}", ha="center", va="bottom",
                fontsize=8, fontweight="bold" if rank == routing.receiving_rank else "normal",
                transform=ax.get_xaxis_transform())
        if rank:
            ax.axvline(first - 0.5, color="black", linewidth=1.2)
    for i, (r, t) in enumerate(routing.rows):
        if (r, t) in routing.offending:
            ax.add_patch(Rectangle((-0.5, i - 0.5), experts, 1, fill=False, edgecolor="red", linewidth=2.2))
        for e in range(experts):
            w = routing.weights[i][e]
            if w is not None and experts * rows <= 400:
                ax.text(e, i, f"{w:.2g}", ha="center", va="center", fontsize=6,
                        color="white" if w < 0.6 * float(np.nanmax(data)) else "black")
    ax.set_xticks(range(experts))
    ax.set_xticklabels([str(e) for e in range(experts)], fontsize=7)
    ax.set_yticks(range(len(routing.rows)))
    ax.set_yticklabels([("> " if tok in routing.offending else "") + f"r{tok[0]} t{tok[1]}" for tok in routing.rows],
                       fontsize=7)
    for label, tok in zip(ax.get_yticklabels(), routing.rows, strict=True):
        if tok in routing.offending:
            label.set_color("red")
    ax.set_xlabel("expert (grouped by the rank that owns it)", fontsize=8)
    ax.set_ylabel("token (source rank, index)", fontsize=8)
    shown = f"{len(routing.rows)} of {routing.total_tokens} tokens" if len(routing.rows) < routing.total_tokens \
        else f"all {routing.total_tokens} tokens"
    ax.set_title(f"top-k weight per (token, expert), {shown}; offending tokens in red;\n"
                 f"experts grouped by owning rank (rank {routing.receiving_rank} saw the failure)", fontsize=9,
                 pad=24)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02).ax.tick_params(labelsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
