"""`python -m tuner.report`: a study as a self-contained HTML page and a Markdown file, with plots."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import optuna

from tuner.cli import error, parser
from tuner.config import DEFAULT_CONFIG, Config, apply_overrides, load_config, sqlite_path
from tuner.errors import TunerError
from tuner.results.report import Report, build, write_html, write_markdown
from tuner.results.storage import load_existing_study

__all__ = ["Report", "build", "write_html", "write_markdown", "default_out", "main", "build_parser"]


# --- command line ---------------------------------------------------------------------------

def default_out(config: Config) -> Path:
    """`<dir of the sqlite file>/<name>.report/` (studies/demo.report for the demo), else studies/<name>.report/."""
    db = sqlite_path(config.storage_url)
    if db is not None:
        return db.parent / f"{config.study.name}.report"
    return Path("studies") / f"{config.study.name}.report"


def build_parser() -> argparse.ArgumentParser:
    p = parser("tuner.report", "Write a study as a self-contained HTML page and a Markdown report with plots.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="study config naming the study and its store")
    p.add_argument("--study-name", help="overrides [study] name (default: the config's)")
    p.add_argument("--storage", help="overrides [study] storage (default: the config's)")
    p.add_argument("--out", help="output directory (default: <name>.report/ beside the sqlite file, else studies/<name>.report/)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    out = None
    try:
        config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
        study = load_existing_study(config)
        report = build(study, sampler=config.study.sampler, target=f"{config.target.host} ({config.target.manager}), {config.target.url}")
        _add_predicted(report, study, config)
        out = Path(args.out) if args.out else default_out(config)
        paths = [write_html(report, out / "report.html"), *write_markdown(report, out / "report.md")]
    except TunerError as exc:
        return error(str(exc))
    except OSError as exc:
        return error(f"--out {out}: cannot write the report there: {exc.strerror or exc}; pass --out with a writable directory")
    for path in paths:
        print(path)
    return 0


def _add_predicted(report: Report, study: optuna.Study, config: Config) -> None:
    """The model's predicted front beside the measured one (tuner/search/model_sampler.py)."""
    from tuner.results.report import Table
    from tuner.search.model_sampler import predicted_front

    try:
        header, rows, note = predicted_front(study, config.space, config.server.command_line.params())
    except Exception as exc:  # a convenience: it must never cost the report
        header, rows, note = [], [], f"not available: {exc}"
    if header:
        report.predicted, report.predicted_note = Table(header, rows), note


if __name__ == "__main__":
    sys.exit(main())
