"""The launch of one server: its argv and environment, the secrets to scrub from its records,
and the parameters it was given.  Built from the operator's command (`tuner.sglang_args`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from tuner.config import ServerConfig
from tuner.errors import ConfigError
from tuner.sglang_args import CommandLine, Params, redact

__all__ = ["LaunchSpec", "launch_spec", "command_spec", "SECRET_ENV_HINTS"]

SECRET_ENV_HINTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


@dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    params: Params = field(default_factory=Params)
    secrets: tuple[str, ...] = ()  # values to scrub from logs before they are stored

    @property
    def launch_command(self) -> str:
        """The full command with secrets redacted: what a study records."""
        return redact(shlex.join(self.argv), self.secrets)

    def shell_command(self) -> str:
        return shlex.join(self.argv)


def command_spec(server: ServerConfig, command: CommandLine | list[str], *, api_key: str | None = None,
                 params: Params | None = None, admin_api_key: str | None = None) -> LaunchSpec:
    """A launch of exactly `command` (plus `--api-key` / `--admin-api-key` from the
    environment), with the server's environment; secrets in either are scrubbed from what is
    recorded."""
    argv = command.argv() if isinstance(command, CommandLine) else list(command)
    secrets: tuple[str, ...] = ()
    for flag, value in (("--api-key", api_key), ("--admin-api-key", admin_api_key)):
        if value:
            argv += [flag, value]
            secrets += (value,)
    env_secrets = tuple(v for k, v in server.env.items() if any(h in k.upper() for h in SECRET_ENV_HINTS) and len(v) >= 4)
    return LaunchSpec(argv=tuple(argv), env=dict(server.env), params=params or Params(), secrets=secrets + env_secrets)


def launch_spec(server: ServerConfig, params: Params, *, api_key: str | None = None, extra: list[str] | None = None,
                admin_api_key: str | None = None, command: CommandLine | None = None) -> LaunchSpec:
    """The trial's command: searched flags replaced by the trial's values.

    `command` is the operator's command as resolved on the target (a `--config` file folded
    in), default the configured one; `extra` (tuner.bench --flags) replaces any option of the
    command it names as well."""
    command = (command or server.command_line).with_params(params).with_args(extra or [])
    if extra and (problem := command.incomplete_speculation()):
        # Found before a launch: SGLang's own failure is a bare AssertionError or a TypeError.
        raise ConfigError(f"--flags: {problem}")
    return command_spec(server, command, api_key=api_key, params=params, admin_api_key=admin_api_key)
