"""A built report written as one self-contained HTML file and a Markdown file with PNGs."""

from __future__ import annotations

import base64
import html
from pathlib import Path


from tuner.results.report.contents import Choice, Report, Table


_CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f; background: #fafafa; margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 26px; margin-bottom: 0; } h2 { margin-top: 36px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; margin-top: 4px; }
table { border-collapse: collapse; background: #fff; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #e0e0e0; padding: 4px 9px; text-align: right; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; }
table.kv td:first-child { font-weight: 600; text-align: left; white-space: nowrap; } table.kv td { text-align: left; }
.note { background: #fff8e1; border-left: 4px solid #ffb300; padding: 8px 12px; margin: 12px 0; }
.choices { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 14px; }
.choice { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 10px 14px; }
.choice h3 { margin: 0 0 4px; font-size: 16px; } .choice p { margin: 4px 0; }
pre { background: #263238; color: #eceff1; padding: 8px 10px; border-radius: 4px; white-space: pre-wrap; overflow-wrap: anywhere; margin: 6px 0 0; }
figure { margin: 18px 0 28px; } figure img { max-width: 100%; border: 1px solid #e0e0e0; background: #fff; }
figcaption { color: #444; max-width: 900px; } .legend { color: #555; font-size: 13px; }
"""


def _html_table(table: Table, text_columns: tuple[str, ...] = ()) -> str:
    def cls(name: str) -> str:
        return ' class="text"' if name in text_columns else ""

    head = "".join(f"<th{cls(h)}>{html.escape(h)}</th>" for h in table.header)
    body = "".join("<tr>" + "".join(f"<td{cls(h)}>{html.escape(c)}</td>" for h, c in zip(table.header, row)) + "</tr>" for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _choice_html(c: Choice) -> str:
    return (f'<div class="choice"><h3>{html.escape(c.label)}: trial {c.trial}</h3><p>{html.escape(c.values)}</p>'
            f"<p>Why: {html.escape(c.reason)}.</p><pre><code>{html.escape(c.flags)}</code></pre></div>")


def write_html(report: Report, path: Path) -> Path:
    """One file: styles inline, plots as base64 PNGs, no script and no external reference."""
    e = html.escape
    parts = [f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Study {e(report.study_name)}: speculative-decoding report</title>'
             f"<style>{_CSS}</style></head><body><main>",
             f"<h1>Speculative-decoding study <code>{e(report.study_name)}</code></h1>",
             f'<p class="sub">Generated {e(report.generated)} by <code>python -m tuner.report</code>.</p>',
             "<h2>Summary</h2><table class=\"kv\">" + "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in report.summary) + "</table>",
             *(f'<p class="note">{e(n)}</p>' for n in report.notes)]
    if report.choices:
        parts.append("<h2>Best configuration per objective</h2><p>From <code>tuner.results.picks</code>: ties within measurement noise "
                     "go to fewer draft tokens (more KV headroom), then the smaller topk, then fewer steps. Append the flags to the launch command, or run "
                     "<code>python -m tuner.best --pick NAME</code>.</p>")
        parts.append('<div class="choices">' + "".join(_choice_html(c) for c in report.choices) + "</div>")
    if report.pareto.rows:
        parts.append("<h2>Pareto front</h2>" + _html_table(report.pareto, ("picked for",)))
        parts.append(f'<p class="legend">{e(_LEGEND)}</p>')
    if report.baselines.rows:
        parts.append("<h2>Baselines: what tuning adds</h2>" + _html_table(report.baselines, ("baseline", "state")))
        parts += [f"<p>{e(line)}</p>" for line in report.over_baselines]
    if report.by_class.rows:
        parts.append(f"<h2>Per request class</h2><p>{html.escape(_CLASSES_INTRO)}</p>" + _html_table(report.by_class, ("configuration", "class")))
        parts += [f'<p class="note">slower than no speculation: {e(line)}</p>' for line in report.class_losses]
    parts += _schedule_html(report)
    if report.plots:
        parts.append("<h2>Figures</h2>")
        for p in report.plots:
            data = base64.b64encode(p.png).decode("ascii")
            parts.append(f'<figure id="{e(p.name)}"><h3>{e(p.title)}</h3><img alt="{e(p.title)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{e(p.caption)}</figcaption></figure>")
    parts.append("<h2>Pruned and failed trials</h2>")
    parts.append(_html_table(report.failures, ("kind", "reason", "state")) if report.failures.rows else "<p>None.</p>")
    if report.predicted is not None:
        parts.append(f"<h2>Predicted front: not launched</h2><p>What the study's model expects ({html.escape(report.predicted_note)}): "
                     "medians [90% intervals]; configurations the study did not try.</p>")
        parts.append(_html_table(report.predicted) if report.predicted.rows else "<p>None.</p>")
    parts.append("</main></body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


_CLASSES_INTRO = ("Each request class of the workload ([bench] prompts' category, split by context_buckets), weighted by "
                  "[bench] mix: single_tps is its single-stream decode rate, vs no speculation that rate over the no-speculation "
                  "baseline's, concurrent_tps its share of the first level's steady-window rate.")

_LEGEND = ("steps, topk, draft, mem: --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens, "
           "--mem-fraction-static; accept: average accept length; max_running: max_running_requests; "
           "kv_tokens: max_total_num_tokens. Sorted by the first objective.")


def _md_cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> str:
    lines = ["| " + " | ".join(table.header) + " |", "|" + "|".join("---:" if h not in ("kind", "reason", "state", "picked for", "baseline", "configuration", "class") else "---" for h in table.header) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def write_markdown(report: Report, path: Path) -> list[Path]:
    """report.md, and its plots as PNG files beside it; returns every path written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# Speculative-decoding study `{report.study_name}`", "", f"Generated {report.generated} by `python -m tuner.report`.", "",
             "## Summary", "", *(f"- **{k}**: {v}" for k, v in report.summary), ""]
    lines += [f"> {n}\n" for n in report.notes]
    if report.choices:
        lines += ["## Best configuration per objective", "",
                  "From `tuner.results.picks`: ties within measurement noise go to fewer draft tokens (more KV headroom), "
                  "then the smaller topk, then fewer steps.", ""]
        for c in report.choices:
            lines += [f"### {c.label}: trial {c.trial}", "", c.values, "", f"Why: {c.reason}.", ""]
            lines += ["```", c.flags, "```", ""]
    if report.pareto.rows:
        lines += ["## Pareto front", "", _md_table(report.pareto), "", _LEGEND, ""]
    if report.baselines.rows:
        lines += ["## Baselines: what tuning adds", "", _md_table(report.baselines), "", *(f"- {line}" for line in report.over_baselines), ""]
    if report.by_class.rows:
        lines += ["## Per request class", "", _CLASSES_INTRO, "", _md_table(report.by_class), ""]
        lines += [f"- **slower than no speculation**: {line}" for line in report.class_losses] + ([""] if report.class_losses else [])
    lines += _schedule_md(report)
    written = []
    if report.plots:
        lines += ["## Figures", ""]
        for p in report.plots:
            png = path.parent / f"{p.name}.png"
            png.write_bytes(p.png)
            written.append(png)
            lines += [f"### {p.title}", "", f"![{p.title}]({png.name})", "", p.caption, ""]
    if report.predicted is not None:
        lines += ["## Predicted front: not launched", "", f"What the study's model expects ({report.predicted_note}): medians "
                  "[90% intervals]; configurations the study did not try.", "",
                  _md_table(report.predicted) if report.predicted.rows else "None: the measured front is what the model expects.", ""]
    lines += ["## Pruned and failed trials", "", _md_table(report.failures) if report.failures.rows else "None.", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return [path, *written]




_SCHEDULE_INTRO = ("The latest table written and verified by python -m tuner.schedule (launch {n} of {name}@baselines), "
                   "for --speculative-adaptive --speculative-adaptive-config FILE on SGLang 0.5.23; tok/s per level of "
                   "requests in flight.")


def _schedule_html(report: Report) -> list[str]:
    s = report.schedule
    if s is None:
        return []
    e = html.escape
    parts = ["<h2>Adaptive schedule</h2>", f"<p>{e(_SCHEDULE_INTRO.format(n=s.trial, name=report.study_name))}</p>",
             f"<pre><code>{e(s.table_json)}</code></pre>", _html_table(s.comparison), f"<p>Verdict: {e(s.verdict)}.</p>"]
    if s.note:
        parts.append(f'<p class="note">{e(s.note)}</p>')
    return parts


def _schedule_md(report: Report) -> list[str]:
    s = report.schedule
    if s is None:
        return []
    lines = ["## Adaptive schedule", "", _SCHEDULE_INTRO.format(n=s.trial, name=report.study_name), "",
             "```json", s.table_json.rstrip("\n"), "```", "", _md_table(s.comparison), "", f"Verdict: {s.verdict}.", ""]
    return lines + ([f"> {s.note}", ""] if s.note else [])
