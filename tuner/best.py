"""`python -m tuner.best --pick ... --format ...`: the configuration to put into production.

    --pick single_tps | concurrent_tps | capacity | slo_capacity | balanced   (default balanced)
    --format flags | command | systemd                         (default flags)
    --apply   install it on the target and wait until the server is ready:
              systemd: a drop-in of its own (50-sglang-tuner-best.conf), daemon-reload, restart;
              process: start the command with these flags and leave it running.
    --restore undo --apply: the drop-in removed and the unit restarted on its own command, or
              the applied process stopped (tuner/server/control/applied.py).

Ties within measurement noise go to the configuration with fewer draft tokens (tuner/results/picks.py).
"""

from __future__ import annotations

import argparse
import sys

import optuna

from tuner import output
from tuner.cli import consoles, exit_with, guarded, parser
from tuner.config import DEFAULT_CONFIG, apply_overrides, load_config
from tuner.errors import TunerError
from tuner.results import classes
from tuner.results.picks import PICKS, pick
from tuner.results.record import params_of
from tuner.results.storage import existing_storage, load_existing_study, study_summaries
from tuner.server.control import applied
from tuner.server.control.systemd import APPLIED_NAME, render_dropin
from tuner.server.launch import launch_spec

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = parser("tuner.best", "Print the configuration of a study to put into production, and optionally install it on the target.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="study config naming the study, its store and the target")
    p.add_argument("--study-name", help="overrides [study] name (default: the config's)")
    p.add_argument("--storage", help="overrides [study] storage (default: the config's)")
    p.add_argument("--pick", default="balanced", metavar="|".join(PICKS),
                   help="which trial of the Pareto front: the best of one objective (any of the study's, e.g. single_tps:long_context), "
                        "or balanced (its weakest objective highest)")
    p.add_argument("--format", choices=("flags", "command", "systemd"), default="flags",
                   help="the searched flags, the whole launch command, or a systemd drop-in")
    output.add_format_flags(p, "the pick (or --list)")
    p.add_argument("--list", action="store_true", help="list the studies in the store with their trial counts and best figures")
    p.add_argument("--apply", action="store_true", help="install it on the target and wait until the server is ready")
    p.add_argument("--restore", action="store_true", help="undo --apply: remove the drop-in and restart the unit on its own command, or stop the applied process")
    return p


def _text(config, params, fmt: str) -> str:
    """The pick in the form `--format` names."""
    if fmt == "flags":
        return " ".join(params.flags())
    if fmt == "command":
        return launch_spec(config.server, params, api_key=config.target.api_key(), admin_api_key=config.target.admin_api_key()).launch_command
    return (f"# /etc/systemd/system/{config.target.unit or '<unit>'}.service.d/{APPLIED_NAME}\n"
            + render_dropin(launch_spec(config.server, params), original_state=None, study=config.study.name))


def _run(args, out) -> int:
    config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
    if args.restore:
        print(f"restored: {applied.restore(config)}", file=sys.stderr)
        return 0
    if args.list:
        output.show(output.list_view(study_summaries(existing_storage(config)), config.storage_url), output.format_of(args), out)
        return 0
    study = load_existing_study(config)
    try:
        choice = pick(study, args.pick)
    except ValueError as exc:
        raise TunerError(str(exc)) from None
    params = params_of(choice.trial)
    print(f"# trial {choice.trial.number} ({args.pick}): {choice.reason}", file=sys.stderr)
    print(*classes.pick_lines(study, choice.trial), sep="\n", file=sys.stderr)  # per request class, and where it loses
    output.show(output.pick_view(config, study, choice, args.pick, _text(config, params, args.format)), output.format_of(args), out)
    _print_predicted(study, config)
    if args.apply:
        done = applied.apply(config, lambda target: target.spec(params))
        print(f"applied: ready in {done.ready.startup_s:.0f} s at {config.target.url} ({done.where})", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out, _ = consoles()
    return guarded(lambda: _run(args, out), launch_prefix="the applied configuration did not come up: ")


def _print_predicted(study: optuna.Study, config) -> None:
    """To stderr: configurations never launched that the model expects on or near the front."""
    from tuner.search.model_sampler import predicted_front

    try:
        header, rows, note = predicted_front(study, config.space, config.server.command_line.params())
    except Exception:  # a convenience: never in the way of the pick
        return
    if rows:
        print(f"# predicted, not launched ({note}); medians [90% interval]:", file=sys.stderr)
        print("#   " + "  ".join(header), file=sys.stderr)
        for row in rows:
            print("#   " + "  ".join(row), file=sys.stderr)


if __name__ == "__main__":
    exit_with(main())
