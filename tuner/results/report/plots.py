"""The report's plots: matplotlib figures rendered to PNG bytes (no display needed)."""

from __future__ import annotations

import io
import math
from itertools import combinations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from optuna.trial import FrozenTrial, TrialState

from tuner.results import record
from tuner.results.hypervolume import study_history
from tuner.results.report.contents import DRAFT, MEM, TOPK, DPI, OUTCOMES, Plot, STEPS, as_number, param_of


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




def _slo_series(trial: FrozenTrial) -> tuple[list[dict], dict, float | None]:
    curve = record.slo_curve_of(trial)
    promise = trial.user_attrs.get(record.SLO_PROMISE) or {}
    value = as_number(trial.user_attrs.get(record.SLO_CAPACITY)) if trial.user_attrs.get(record.SLO_CAPACITY) is not None else None
    return curve, promise, value


def slo_plot(front: list[FrozenTrial], arms: dict[str, FrozenTrial]) -> Plot | None:
    """ITL and TTFT against load for the front and the baselines, each promise of [slo] as a
    line and each configuration's slo_capacity marked (GuideLLM's and AIPerf's sweep plots)."""
    shown = [(f"trial {t.number}", t) for t in sorted(front, key=lambda t: t.number)]
    shown += [(kind.replace("_", " "), t) for kind, t in arms.items() if t.state == TrialState.COMPLETE]
    shown = [(label, t) for label, t in shown if record.slo_curve_of(t)][:10]
    if not shown:
        return None
    promise = next(p for _, t in shown if (p := _slo_series(t)[1]))
    itl_q = next((k for k in ("p99_itl_ms", "p95_itl_ms", "p90_itl_ms", "p50_itl_ms") if k in promise), "p95_itl_ms")
    ttft_q = next((k for k in ("p99_ttft_ms", "p95_ttft_ms", "p90_ttft_ms", "p50_ttft_ms") if k in promise), "p95_ttft_ms")
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    for k, key in enumerate((itl_q, ttft_q)):
        ax = fig.add_subplot(1, 2, k + 1)
        for n, (label, t) in enumerate(shown):
            curve, _, capacity = _slo_series(t)
            color, dashed = f"C{n % 10}", not label.startswith("trial")
            loads = [p["load"] for p in curve]
            ax.plot(loads, [p.get(key) for p in curve], marker="o", ms=3, color=color, linestyle="--" if dashed else "-",
                    label=f"{label} (slo_capacity {capacity:g})" if capacity is not None else label)
            if capacity:
                at = next((p.get(key) for p in curve if p["load"] == capacity), None)
                if at is not None:
                    ax.scatter([capacity], [at], marker="*", s=140, color=color, edgecolor="black", linewidth=0.5, zorder=4)
        if key in promise:
            ax.axhline(promise[key], color="#c62828", linewidth=1.2, label=f"SLO {key.split('_')[0]} {promise[key]:g} ms")
        ax.set_xlabel("requests per second (Poisson arrivals)" if promise.get("arrival") == "poisson" else "requests in flight (load)")
        ax.set_ylabel(f"{key.split('_')[0]} {'ITL' if 'itl' in key else 'TTFT'} (ms)")
        if promise.get("arrival") != "poisson":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=7, loc="upper left")
    return Plot("slo", "Latency against load, with the SLO: the front and the baselines",
                "Each line is one configuration's load curve (the loads its trial measured: one stream, [bench] concurrency, "
                "and those the search over load added); the red line is the promise of [slo] and the star each configuration's "
                "slo_capacity, the largest load at which every promise holds (judged on the curve smoothed to be monotone). "
                "Dashed: the baselines.", _png(fig))


def _class_series(shown: list[tuple[str, FrozenTrial]], classes: list[str]) -> list[tuple[str, list[float], list[float]]]:
    """Per configuration: its single_tps per class and the half-width of each 95% interval."""
    out = []
    for label, t in shown:
        figures = record.by_class_of(t)
        tps = [as_number(figures.get(c, {}).get("single_tps")) or math.nan for c in classes]
        ci = [figures.get(c, {}).get("single_tps_ci95") or [math.nan, math.nan] for c in classes]
        out.append((label, tps, [abs(hi - lo) / 2 if math.isfinite(hi - lo) else 0.0 for lo, hi in ci]))
    return out


def class_plot(front: list[FrozenTrial], arms: dict[str, FrozenTrial]) -> Plot | None:
    """Single-stream decode speed per request class for the front and the baselines, and each
    front configuration's speed-up over no speculation per class: where speculation's gain
    shrinks or inverts (long context, a category its draft head predicts badly) shows here,
    not in the blended single_tps."""
    shown = [(f"trial {t.number}", t) for t in sorted(front, key=lambda t: -(t.values[0] if t.values else 0))][:6]
    shown += [(kind.replace("_", " "), t) for kind, t in arms.items() if t.state == TrialState.COMPLETE]
    classes = sorted({c for _, t in shown for c in record.by_class_of(t)},
                     key=lambda c: -max((record.by_class_of(t).get(c, {}).get("share") or 0) for _, t in shown))
    if len(classes) < 2:
        return None  # one class: the front plot's single_tps is that class
    series = _class_series(shown, classes)
    base = dict(zip(classes, next((tps for label, tps, _ in series if label == "no speculation"), [math.nan] * len(classes))))
    panels = 2 if any(math.isfinite(v) for v in base.values()) else 1
    fig = Figure(figsize=(6.5 * panels, 4.2), layout="constrained")
    width = 0.8 / len(series)
    ax = fig.add_subplot(1, panels, 1)
    for n, (label, tps, half) in enumerate(series):
        xs = [i + (n - (len(series) - 1) / 2) * width for i in range(len(classes))]
        ax.bar(xs, tps, width, yerr=half, capsize=2, color=f"C{n % 10}", label=label,
               hatch="//" if not label.startswith("trial") else None, edgecolor="black", linewidth=0.3)
    ax.set_xticks(range(len(classes)), classes, rotation=20)
    ax.set_ylabel("single_tps (tokens/s, one request alone)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="best")
    if panels == 2:
        ax2 = fig.add_subplot(1, 2, 2)
        trials = [(label, tps) for label, tps, _ in series if label.startswith("trial")]
        for n, (label, tps) in enumerate(trials):
            xs = [i + (n - (len(trials) - 1) / 2) * (0.8 / max(1, len(trials))) for i in range(len(classes))]
            ax2.bar(xs, [v / base[c] if base[c] else math.nan for v, c in zip(tps, classes)], 0.8 / max(1, len(trials)),
                    color=f"C{n % 10}", label=label, edgecolor="black", linewidth=0.3)
        ax2.axhline(1.0, color="#c62828", linewidth=1.2, label="no speculation")
        ax2.set_xticks(range(len(classes)), classes, rotation=20)
        ax2.set_ylabel("speed-up over no speculation (x)")
        ax2.grid(alpha=0.3, axis="y")
        ax2.legend(fontsize=7, loc="best")
    caption = ("Each configuration's single-stream decode rate per request class (the prompts' category, split by "
               "[bench] context_buckets), with its 95% interval; hatched bars are the baselines.")
    if panels == 2:
        caption += (" Right: each front configuration's speed-up over no speculation per class; a bar below the red line "
                    "is a class this configuration serves more slowly than no speculation at all.")
    return Plot("classes", "Decode speed per request class: the front and the baselines", caption, _png(fig))
