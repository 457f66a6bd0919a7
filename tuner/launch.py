"""The launch command of one trial: the operator's command, minus the searched flags, plus the
trial's values; and the same command with secrets redacted, for records and logs."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields

from .config import ServerConfig
from .space import Params

__all__ = ["LaunchSpec", "launch_spec", "command_spec", "strip_flags", "redact", "SECRET_FLAGS", "SECRET_ENV_HINTS"]

SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password", "--hf-token")
SECRET_ENV_HINTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
REDACTED = "<redacted>"


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


def strip_flags(argv: list[str], names: list[str]) -> list[str]:
    """argv without `--name value` / `--name=value` for each flag name."""
    flags = {"--" + n.replace("_", "-") for n in names}
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        key = arg.split("=", 1)[0]
        if key in flags:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def launch_spec(server: ServerConfig, params: Params, *, api_key: str | None = None, extra: list[str] | None = None) -> LaunchSpec:
    """The trial's command: searched flags replaced, `--api-key` appended from the environment.

    `extra` (tuner.bench --flags) replaces any flag of the command it names as well."""
    names = [f.name for f in fields(Params)]
    extra = extra or []
    names += [a[2:].split("=", 1)[0].replace("-", "_") for a in extra if a.startswith("--")]
    argv = strip_flags(server.argv, names) + params.flags() + extra
    secrets: tuple[str, ...] = ()
    if api_key:
        argv += ["--api-key", api_key]
        secrets = (api_key,)
    env_secrets = tuple(v for k, v in server.env.items() if any(h in k.upper() for h in SECRET_ENV_HINTS) and len(v) >= 4)
    return LaunchSpec(argv=tuple(argv), env=dict(server.env), params=params, secrets=secrets + env_secrets)


def command_spec(server: ServerConfig, argv: list[str], *, api_key: str | None = None) -> LaunchSpec:
    """A launch of exactly `argv` (a baseline), with the server's env and the API key."""
    secrets: tuple[str, ...] = ()
    argv = list(argv)
    if api_key:
        argv += ["--api-key", api_key]
        secrets = (api_key,)
    env_secrets = tuple(v for k, v in server.env.items() if any(h in k.upper() for h in SECRET_ENV_HINTS) and len(v) >= 4)
    return LaunchSpec(argv=tuple(argv), env=dict(server.env), secrets=secrets + env_secrets)
