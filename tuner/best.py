"""`python -m tuner.best --pick ... --format ...`: the configuration to put into production.

    --pick single_tps | concurrent_tps | capacity | balanced   (default balanced)
    --format flags | command | systemd                         (default flags)
    --apply   install it on the target and wait until the server is ready:
              systemd: a drop-in of its own (50-sglang-tuner-best.conf), daemon-reload, restart;
              process: start the command with these flags and leave it running.

Ties within measurement noise go to the configuration with fewer draft tokens (tuner/results/picks.py).
"""

from __future__ import annotations

import argparse
import json
import sys

import optuna

from tuner.cli import guarded, parser, exit_with
from tuner.config import DEFAULT_CONFIG, apply_overrides, load_config
from tuner.errors import TunerError
from tuner.results.picks import PICKS, pick
from tuner.results.storage import existing_storage, load_existing_study, study_summaries
from tuner.results.record import params_of
from tuner.sequence import connected, launch, refuse_if_answering
from tuner.server.control.process import ProcessControl
from tuner.server.control.systemd import APPLIED_NAME, SystemdControl, render_dropin
from tuner.server.launch import launch_spec
from tuner.server.readiness import wait_ready

__all__ = ["main", "build_parser"]


def _apply(config, params) -> None:
    """Install `params` on the target for good and wait until the server is ready on them."""
    def control(shell):
        if config.target.manager == "systemd":
            return SystemdControl(shell, unit=config.target.unit, name=config.study.name, stop_timeout_s=config.target.stop_timeout_s)
        return ProcessControl(shell, workdir=config.target.workdir, name=f"{config.study.name}-best", stop_timeout_s=config.target.stop_timeout_s)

    with connected(config, control=control, prepare=False, restore=False) as target:
        spec = target.spec(params)
        if isinstance(target.control, SystemdControl):
            where = target.control.apply(spec, study=config.study.name)
            ready = wait_ready(target.control, target.client, params=params, timeout_s=config.target.ready_timeout_s,
                               poll_s=config.target.poll_interval_s, url=config.target.url, spec=spec)
        else:
            target.control.prepare()  # the server an earlier --apply left running is ours: stopped first
            refuse_if_answering(target.client, config.target)
            ready = launch(target, spec)
            where = f"{target.control.dir}/server.log"
    print(f"applied: ready in {ready.startup_s:.0f} s at {config.target.url} ({where})", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    p = parser("tuner.best", "Print the configuration of a study to put into production, and optionally install it on the target.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="study config naming the study, its store and the target")
    p.add_argument("--study-name", help="overrides [study] name (default: the config's)")
    p.add_argument("--storage", help="overrides [study] storage (default: the config's)")
    p.add_argument("--pick", choices=PICKS, default="balanced",
                   help="which trial of the Pareto front: the best of one objective, or balanced (its weakest objective highest)")
    p.add_argument("--format", choices=("flags", "command", "systemd"), default="flags",
                   help="the searched flags, the whole launch command, or a systemd drop-in")
    p.add_argument("--json", action="store_true", help="print the pick (or --list) as JSON on stdout")
    p.add_argument("--list", action="store_true", help="list the studies in the store with their trial counts and best figures")
    p.add_argument("--apply", action="store_true", help="install it on the target and wait until the server is ready")
    return p


def _pick_json(config, study, choice, how: str) -> dict:
    names = list(study.metric_names or [])
    params = params_of(choice.trial)
    return {"study": study.study_name, "pick": how, "trial": choice.trial.number, "reason": choice.reason,
            "tied_with": list(choice.tied_with), "values": dict(zip(names, choice.trial.values)),
            "flags": params.as_dict() if params else {}, "flags_text": " ".join(params.flags()) if params else "",
            "launch_command": launch_spec(config.server, params).launch_command if params else None}


def _list(config, as_json: bool) -> int:
    storage = existing_storage(config)
    rows = study_summaries(storage)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no study in {config.storage_url.split('@')[-1]}")
    for row in rows:
        best = "  ".join(f"{k}={v:,.1f}" for k, v in row["best"].items()) or "nothing measured"
        counts = ", ".join(f"{n} {s}" for s, n in row["trials"].items()) or "no trials"
        if row.get("kinds"):
            counts += " (" + ", ".join(f"{n} {k}" for k, n in row["kinds"].items() if n) + ")"
        print(f"{row['study']:<24} {counts:<40} best: {best}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def body() -> int:
        config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
        if args.list:
            return _list(config, args.json)
        study = load_existing_study(config)
        try:
            choice = pick(study, args.pick)
        except ValueError as exc:
            raise TunerError(str(exc)) from None
        params = params_of(choice.trial)
        print(f"# trial {choice.trial.number} ({args.pick}): {choice.reason}", file=sys.stderr)
        if args.json:
            print(json.dumps(_pick_json(config, study, choice, args.pick), indent=2))
        elif args.format == "flags":
            print(" ".join(params.flags()))
        elif args.format == "command":
            print(launch_spec(config.server, params, api_key=config.target.api_key()).launch_command)
        else:
            print(f"# /etc/systemd/system/{config.target.unit or '<unit>'}.service.d/{APPLIED_NAME}")
            print(render_dropin(launch_spec(config.server, params), original_state=None, study=config.study.name), end="")
        _print_predicted(study, config)
        if args.apply:
            _apply(config, params)
        return 0

    return guarded(body, launch_prefix="the applied configuration did not come up: ")


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
