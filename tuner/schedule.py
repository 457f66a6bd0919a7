"""`python -m tuner.schedule`: a tuned `--speculative-adaptive-config` for SGLang 0.5.23.

    python -m tuner.schedule [--config PATH] [--study-name NAME] [--storage URL]
                             [--levels 1,2,4,8,16,32,64] [--out FILE] [--no-verify] [--apply] [--restore]

Parses, runs `tuner.adaptive.run` (figures per level, the table, its verification, --apply)
and prints the table through `tuner.output`; `--restore` undoes `--apply` (or `tuner.best --apply`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import optuna

from tuner import adaptive, output
from tuner.cli import consoles, exit_with, guarded, parser
from tuner.config import DEFAULT_CONFIG, apply_overrides, load_config
from tuner.errors import ConfigError
from tuner.results import adaptive_table as sch

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = parser("tuner.schedule", "A tuned --speculative-adaptive-config (SGLang 0.5.23) from the study's measurements.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="study config")
    p.add_argument("--study-name", help="overrides [study] name")
    p.add_argument("--storage", help="overrides [study] storage")
    p.add_argument("--levels", help="requests in flight, e.g. 1,2,4,8,16,32,64 (default: powers of two up to the server's running-request cap)")
    p.add_argument("--out", help="where to write the JSON (default studies/<name>.adaptive.json)")
    p.add_argument("--no-verify", action="store_true", help="write the table from measurements alone; never launch the adaptive server")
    p.add_argument("--apply", action="store_true", help="install the table on the target, as tuner.best --apply does")
    p.add_argument("--restore", action="store_true", help="undo --apply: remove the drop-in and the JSON, put the server back")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown on stdout instead of its JSON")
    return p


def _run(args: argparse.Namespace) -> int:
    config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
    if args.restore:
        print(f"restored: {adaptive.restore_applied(config)}", file=sys.stderr)
        return 0
    try:
        levels = sch.parse_levels(args.levels) if args.levels else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out_path = Path(args.out or f"studies/{config.study.name}.adaptive.json")
    stdout, _ = consoles()

    def written(plan: adaptive.Plan, cfg: dict, text: str) -> None:
        adaptive.print_figures(plan, cfg)
        print(f"wrote {out_path} (load it with --speculative-adaptive --speculative-adaptive-config {out_path})", file=sys.stderr)
        output.show(output.adaptive_table_view(cfg, text), "markdown" if args.markdown else "json", stdout)

    adaptive.run(config, levels=levels, out=out_path, verify=not args.no_verify, apply=args.apply, on_written=written)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return guarded(lambda: _run(args), launch_prefix="the scheduled configuration did not come up: ")


if __name__ == "__main__":
    exit_with(main())
