"""The report's plots: matplotlib figures rendered to PNG bytes (no display needed)."""

from __future__ import annotations

import io
import math
from itertools import combinations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from optuna.trial import FrozenTrial, TrialState

from tuner.results.hypervolume import study_history
from tuner.results.report.contents import DRAFT, MEM, TOPK, DPI, OUTCOMES, Plot, STEPS, as_number, param_of
from tuner.results import record


# --- plots ----------------------------------------------------------------------------------

def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def front_plot(complete: list[FrozenTrial], front: list[FrozenTrial], names: list[str]) -> Plot | None:
    pairs = list(combinations(range(len(names)), 2))
    if not complete or not pairs:
        return None
    cols = min(3, len(pairs))
    rows = math.ceil(len(pairs) / cols)
    fig = Figure(figsize=(3.9 * cols, 3.3 * rows), layout="constrained")
    for k, (i, j) in enumerate(pairs):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.scatter([t.values[i] for t in complete], [t.values[j] for t in complete], s=22, color="#b0b0b0", label="all complete trials")
        ax.scatter([t.values[i] for t in front], [t.values[j] for t in front], s=40, color="#d32f2f", edgecolor="black", linewidth=0.5, label="Pareto front", zorder=3)
        for n, t in enumerate(sorted(front, key=lambda t: (t.values[i], t.values[j]))):
            # Alternate above/below so that labels of neighbouring points do not overprint.
            ax.annotate(str(t.number), (t.values[i], t.values[j]), textcoords="offset points", xytext=(4, 3 if n % 2 else -9), fontsize=7)
        ax.set_xlabel(names[i])
        ax.set_ylabel(names[j])
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=7, loc="best")
    return Plot("front", "Pareto front, projected on each pair of objectives",
                "Every complete trial in grey, the Pareto-optimal ones in red with their trial number. A front point can sit "
                "inside the cloud of one projection: it is best on another objective.", _png(fig))


def acceptance_plot(complete: list[FrozenTrial]) -> Plot | None:
    points = [(as_number(param_of(t, STEPS)), param_of(t, TOPK), as_number(t.user_attrs.get(record.ACCEPT_LENGTH)), param_of(t, DRAFT)) for t in complete]
    points = [(s, k, a, d) for s, k, a, d in points if s is not None and a is not None]
    if not points:
        return None
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    topks = sorted({k for _, k, _, _ in points}, key=lambda k: (k is None, k))
    width = 0.5 / max(1, len(topks))
    for n, k in enumerate(topks):
        offset = (n - (len(topks) - 1) / 2) * width
        group = [(s, a, d) for s, kk, a, d in points if kk == k]
        color = f"C{n}"
        ax.scatter([s + offset for s, _, _ in group], [a for _, a, _ in group], color=color, s=30, alpha=0.8, label=f"topk {k if k is not None else '?'}")
        for s, a, d in group:
            if k != 1 and d is not None:  # a tree verifies only its draft tokens: they cap acceptance
                ax.annotate(f"d={d}", (s + offset, a), textcoords="offset points", xytext=(4, -9), fontsize=7, color=color)
        steps = sorted({s for s, _, _ in group})
        means = [sum(a for s2, a, _ in group if s2 == s) / sum(1 for s2, _, _ in group if s2 == s) for s in steps]
        ax.plot([s + offset for s in steps], means, color=color, alpha=0.6)
    steps = sorted({s for s, _, _, _ in points})
    ax.plot(steps, [s + 1 for s in steps], linestyle="--", color="#9e9e9e", label="steps + 1 (every draft accepted)")
    ax.set_xticks(steps)
    ax.set_xlabel("speculative_num_steps")
    ax.set_ylabel("accept length (tokens per verify step)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return Plot("acceptance", "Accept length vs speculative_num_steps, by topk",
                "The server's average accept length over the measured phases; lines join the mean per step count. "
                "Deeper drafts are accepted less and less per extra step, and a tree (topk > 1) verifies only its "
                "speculative_num_draft_tokens (labelled d=N), which caps its accept length.",
                _png(fig))


def capacity_plot(complete: list[FrozenTrial], names: list[str]) -> Plot | None:
    if "capacity" in names:
        label, y_of = "capacity (requests)", (lambda t: t.values[names.index("capacity")])
    else:
        label, y_of = "max_running_requests", (lambda t: as_number(t.user_attrs.get(record.MAX_RUNNING_REQUESTS)))
    points = [(as_number(param_of(t, DRAFT)), as_number(param_of(t, MEM)), y_of(t)) for t in complete]
    points = [p for p in points if p[2] is not None and (p[0] is not None or p[1] is not None)]
    if not points:
        return None
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    for k, (x_index, c_index, xlabel, clabel, cmap) in enumerate((
        (0, 1, "speculative_num_draft_tokens", "mem_fraction_static", "viridis"),
        (1, 0, "mem_fraction_static", "speculative_num_draft_tokens", "plasma"),
    )):
        ax = fig.add_subplot(1, 2, k + 1)
        shown = [p for p in points if p[x_index] is not None]
        colors = [p[c_index] if p[c_index] is not None else math.nan for p in shown]
        art = ax.scatter([p[x_index] for p in shown], [p[2] for p in shown], c=colors, cmap=cmap, s=36, edgecolor="black", linewidth=0.4)
        if any(not math.isnan(c) for c in colors):
            fig.colorbar(art, ax=ax, label=clabel)
        if x_index == 0:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    return Plot("capacity", f"{label.split(' ')[0].capitalize()} vs draft tokens and vs mem_fraction_static",
                "Requests of this workload the KV cache holds at once. Every draft token is verified for every running request, "
                "so more draft tokens cost KV room; a higher mem_fraction_static buys it back until CUDA graphs no longer fit.",
                _png(fig))


def hypervolume_plot(finished: list[FrozenTrial]) -> Plot | None:
    ordered = sorted(finished, key=lambda t: t.number)
    if not any(t.state == TrialState.COMPLETE for t in ordered):
        return None
    series = study_history(ordered)
    numbers = [t.number for t in ordered]
    fig = Figure(figsize=(7.5, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ax.step(numbers, series, where="post", color="#1565c0")
    for state, style in ((TrialState.COMPLETE, dict(marker="o", color="#1565c0", label="complete")),
                         (TrialState.PRUNED, dict(marker="x", color="#c62828", label="pruned")),
                         (TrialState.FAIL, dict(marker="X", color="#000000", label="failed"))):
        xs = [(n, h) for n, h, t in zip(numbers, series, ordered) if t.state == state]
        if xs:
            ax.scatter([n for n, _ in xs], [h for _, h in xs], s=24, zorder=3, **style)
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("hypervolume (fraction of the final box)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return Plot("hypervolume", "Hypervolume of the front over trials",
                "How much of the objective space the front dominates after each trial, each objective divided by its best value. "
                "A long flat tail means more trials are unlikely to find much better trade-offs.", _png(fig))


def _outcome(trial: FrozenTrial) -> str:
    if trial.state == TrialState.COMPLETE:
        return "complete"
    if trial.state == TrialState.FAIL:
        return "fail"
    if trial.user_attrs.get(record.RULED_OUT_BY) is not None:
        return "ruled_out"
    kind = trial.user_attrs.get(record.FAILURE_KIND)
    return kind if kind in OUTCOMES else "pruned"


def failure_plot(finished: list[FrozenTrial]) -> Plot | None:
    points = [(as_number(param_of(t, MEM)), as_number(param_of(t, DRAFT)), _outcome(t)) for t in finished]
    points = [p for p in points if p[0] is not None and p[1] is not None]
    if not points:
        return None
    fig = Figure(figsize=(7.5, 4.4), layout="constrained")
    ax = fig.add_subplot()
    for outcome, style in OUTCOMES.items():
        group = [(m, d) for m, d, o in points if o == outcome]
        if group:
            look = dict(facecolors="none", edgecolors=style["color"]) if outcome == "complete" else dict(color=style["color"])
            ax.scatter([m for m, _ in group], [d for _, d in group], s=42, marker=style["marker"], alpha=0.85,
                       label=style["label"], zorder=3, linewidths=1.2, **look)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("mem_fraction_static")
    ax.set_ylabel("speculative_num_draft_tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return Plot("failures", "Where configurations fail: mem_fraction_static vs draft tokens",
                "Every finished trial by how it ended. Too little memory for the KV cache fails on the left; "
                "too little left for CUDA graphs fails on the right; crashes mid-benchmark are failures, not pruned.", _png(fig))


