"""`python -m tuner.best --pick ... --format ...`: the configuration to put into production.

    --pick single_tps | concurrent_tps | capacity | balanced   (default balanced)
    --format flags | command | systemd                         (default flags)
    --apply   install it on the target and wait until the server is ready:
              systemd: a drop-in of its own (50-sglang-tuner-best.conf), daemon-reload, restart;
              process: start the command with these flags and leave it running.

Ties within measurement noise go to the configuration with fewer draft tokens (tuner/picks.py).
"""

from __future__ import annotations

import argparse
import os
import sys

from .client import ServerClient
from .config import DEFAULT_CONFIG, apply_overrides, load_config
from .control.process import ProcessControl
from .control.systemd import APPLIED_NAME, SystemdControl, render_dropin
from .errors import LaunchError, TunerError
from .history import params_of
from .host import connect
from .launch import launch_spec
from .picks import PICKS, pick
from .readiness import wait_ready
from .storage import load_existing_study

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.best", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--study-name")
    p.add_argument("--storage")
    p.add_argument("--pick", choices=PICKS, default="balanced")
    p.add_argument("--format", choices=("flags", "command", "systemd"), default="flags")
    p.add_argument("--apply", action="store_true", help="install it on the target and wait until ready")
    args = p.parse_args(argv)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        config = apply_overrides(load_config(args.config), study_name=args.study_name, storage=args.storage)
        study = load_existing_study(config)
        try:
            choice = pick(study, args.pick)
        except ValueError as exc:
            raise TunerError(str(exc)) from None
        params = params_of(choice.trial)
        api_key = os.environ.get(config.target.api_key_env) if config.target.api_key_env else None
        spec = launch_spec(config.server, params, api_key=api_key)
        print(f"# trial {choice.trial.number} ({args.pick}): {choice.reason}", file=sys.stderr)
        if args.format == "flags":
            print(" ".join(params.flags()))
        elif args.format == "command":
            print(spec.launch_command)
        else:
            unit = config.target.unit or "<unit>"
            print(f"# /etc/systemd/system/{unit}.service.d/{APPLIED_NAME}")
            print(render_dropin(launch_spec(config.server, params), original_state=None, study=config.study.name), end="")
        if args.apply:
            shell = connect(config.target)
            client = ServerClient(config.target.url, api_key=api_key)
            try:
                if config.target.manager == "systemd":
                    control = SystemdControl(shell, unit=config.target.unit, name=config.study.name, stop_timeout_s=config.target.stop_timeout_s)
                    where = control.apply(spec, study=config.study.name)
                else:
                    control = ProcessControl(shell, workdir=config.target.workdir, name=f"{config.study.name}-best",
                                             stop_timeout_s=config.target.stop_timeout_s)
                    control.start(spec)
                    where = f"{control.dir}/server.log"
                ready = wait_ready(control, client, params=params, timeout_s=config.target.ready_timeout_s,
                                   poll_s=config.target.poll_interval_s, url=config.target.url)
            finally:
                client.close()
                shell.close()
            print(f"applied: ready in {ready.startup_s:.0f} s at {config.target.url} ({where})", file=sys.stderr)
    except LaunchError as exc:
        print(f"error: the applied configuration did not come up: {exc.reason}", file=sys.stderr)
        return 2
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
