"""A connected target: the shell on the server's host, the control that starts and stops the
server, its HTTP client and the operator's command as SGLang will read it.  `connected` opens
all of them and restores the target on every way out."""

from __future__ import annotations

import shlex
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

from tuner.config import Config, TargetConfig
from tuner.errors import HostError
from tuner.sglang_args import CommandLine, Params
from tuner.server.client import ServerClient
from tuner.server.control import ServiceControl, control_for
from tuner.server.host import Shell, connect
from tuner.server.launch import LaunchSpec, command_spec, launch_spec

__all__ = ["Target", "connected", "resolved_command", "refuse_if_answering"]


@dataclass
class Target:
    """A connected target: where commands run, what starts the server, its HTTP surface."""

    config: Config
    shell: Shell
    control: ServiceControl
    client: ServerClient
    api_key: str | None
    command: CommandLine  # the operator's command as SGLang will read it (a --config file folded in)

    def spec(self, params: Params, extra: list[str] | None = None) -> LaunchSpec:
        return launch_spec(self.config.server, params, api_key=self.api_key, extra=extra,
                           admin_api_key=self.config.target.admin_api_key(), command=self.command)

    def command_spec(self, command, params: Params | None = None) -> LaunchSpec:
        """A launch of exactly `command` (a baseline, a schedule's adaptive server)."""
        return command_spec(self.config.server, command, api_key=self.api_key, params=params,
                            admin_api_key=self.config.target.admin_api_key())


@contextmanager
def connected(config: Config, *, control: Callable[[Shell], ServiceControl] | None = None,
              prepare: bool = True, restore: bool = True) -> Iterator[Target]:
    """Connect to the target; on leaving, the target is restored (our server stopped, the
    operator's unit put back) and the connections closed, on every path including Ctrl-C.
    `restore=False` leaves what was launched running (`tuner.best --apply`)."""
    shell = connect(config.target)
    api_key = config.target.api_key()
    client = ServerClient(config.target.url, api_key=api_key, admin_api_key=config.target.admin_api_key())
    try:
        ctl = (control or (lambda sh: control_for(config, sh)))(shell)
        with ctl if restore else nullcontext(ctl):
            if prepare:
                ctl.prepare()  # check the target; undo what a killed run left behind
            yield Target(config, shell, ctl, client, api_key, resolved_command(config, shell))
    finally:
        client.close()
        shell.close()


def resolved_command(config: Config, shell: Shell) -> CommandLine:
    """The configured command with a `--config FILE` folded in as SGLang merges it, the file
    read through the target's shell; launches then pass every option inline, so removing the
    speculative ones (the no-speculation baseline) really removes them."""
    command = config.server.command_line

    def read(path: str) -> str:
        result = shell.run(f"cat {shlex.quote(path)}")
        if not result.ok:
            raise OSError(result.stderr.strip() or f"cat exited {result.exited}")
        return result.stdout

    return command.with_config_file(read) if command.has("config") else command


def refuse_if_answering(client: ServerClient, target: TargetConfig) -> None:
    """Before a command launches anything: with the process manager the URL must be free (a
    server the tuner did not start would answer every request meant for ours, and every figure
    would be its).  A systemd unit's own server is the one the tuner replaces, so it may answer."""
    if target.manager == "process" and client.answers():
        raise HostError(f"something already answers at {target.url} that the tuner did not start; "
                        "stop it or point [target] url (and --port) elsewhere")
