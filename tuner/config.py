"""The study config: TOML -> typed, frozen sections; every check on the user's input lives here.

The layout is fixed by `docs/contract.md` ([study], [target], [server], [space], [bench]);
keys beyond the contract's are documented in the README.  pydantic does the type work (it is
already installed with openai); messages are rewritten into one line that names the file, the
section, the key and the fix.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import ConfigError
from tuner.sglang_args import SEARCHABLE_ALGORITHMS, SEARCHED, CommandLine

__all__ = [
    "Config",
    "StudyConfig",
    "TargetConfig",
    "ServerConfig",
    "SpaceConfig",
    "BenchConfig",
    "SloConfig",
    "SyntheticPrompts",
    "IntRange",
    "FloatRange",
    "Choices",
    "load_config",
    "apply_overrides",
    "DEFAULT_CONFIG",
    "SEARCHED_FLAGS",
    "sqlite_path",
]

DEFAULT_CONFIG = "studies/demo.toml"
SEARCHED_FLAGS = SEARCHED  # the searched flags are named once, in tuner/sglang_args.py
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@-]{1,200}$")


class _Section(BaseModel):
    # Strict: TOML has its own types, so `max_tokens = "128"` is a mistake to name, not a string
    # to convert silently (an int still fills a float: `temperature = 0`).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class IntRange(_Section):
    low: int
    high: int
    step: int = 1

    @model_validator(mode="after")
    def _check(self) -> "IntRange":
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high}); swap them")
        if self.step < 1:
            raise ValueError(f"step must be >= 1, got {self.step}")
        return self

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))


class FloatRange(_Section):
    low: float
    high: float
    step: float | None = None

    @model_validator(mode="after")
    def _check(self) -> "FloatRange":
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high}); swap them")
        if self.step is not None and self.step <= 0:
            raise ValueError(f"step must be > 0, got {self.step}")
        return self


class Choices(_Section):
    choices: list[Any] = Field(min_length=1)


IntSpace = Union[IntRange, Choices]
FloatSpace = Union[FloatRange, Choices]


class StudyConfig(_Section):
    name: str
    storage: str | None = None
    objectives: list[str] = Field(default_factory=lambda: ["single_tps", "concurrent_tps", "capacity"])
    sampler: str = "auto"
    seed: int | None = None
    artifacts: str | None = None  # directory for trial logs (optuna artifact store)
    heartbeat_s: int | None = None  # RDB heartbeat for multi-host studies
    storage_outage_s: float = Field(default=300.0, gt=0)  # ride out a database outage this long
    allow_mixed_hardware: bool = False
    enqueue_current: bool = True  # warm start: the command's own settings and SGLang's default first
    baselines: bool = True  # also measure no speculation and --speculative-adaptive, once per study

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(f"{value!r} is not a valid study name; use letters, digits, '.', '_' or '-'")
        return value

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("list at least one objective, e.g. [\"single_tps\"]")
        if len(set(value)) != len(value):
            raise ValueError(f"objectives repeat a name: {value}")
        return value


class TargetConfig(_Section):
    host: str = "local"
    manager: Literal["process", "systemd"] = "process"
    unit: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    accept_unknown_host: bool = False
    sudo: bool | None = None  # None: use sudo when the SSH user is not root
    url: str = "http://127.0.0.1:30000"
    ready_timeout_s: float = Field(default=900.0, gt=0)
    stop_timeout_s: float = Field(default=30.0, gt=0)
    poll_interval_s: float = Field(default=0.5, gt=0, le=5)
    workdir: str = "~/.cache/sglang-tuner"
    api_key_env: str | None = None  # name of the environment variable that holds --api-key
    admin_api_key_env: str | None = None  # ... that holds --admin-api-key (/flush_cache needs it then)
    leave_best: bool = False  # systemd: keep the best configuration applied at the end

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+(:\d+)?/?$", value):
            raise ValueError(f"{value!r} is not an http(s) URL like \"http://127.0.0.1:30000\"")
        return value.rstrip("/")

    @field_validator("unit")
    @classmethod
    def _unit(cls, value: str | None) -> str | None:
        if value is not None and not _UNIT_RE.match(value):
            raise ValueError(f"{value!r} is not a valid systemd unit name")
        if value is not None and value.endswith(".service"):
            value = value[: -len(".service")]
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if value != "local" and not re.match(r"^([A-Za-z0-9._-]+@)?[A-Za-z0-9._-]+(:\d{1,5})?$", value):
            raise ValueError(f"{value!r} is not \"local\" or an SSH destination \"user@host[:port]\"")
        return value

    @model_validator(mode="after")
    def _systemd_needs_unit(self) -> "TargetConfig":
        if self.manager == "systemd" and not self.unit:
            raise ValueError('manager = "systemd" needs unit = "<the service\'s unit name>"')
        if self.host == "local" and (self.identity_file or self.known_hosts):
            raise ValueError("identity_file and known_hosts apply to SSH hosts only; set host = \"user@host\"")
        return self

    @property
    def is_remote(self) -> bool:
        return self.host != "local"

    def api_key(self) -> str | None:
        """The server's API key, from the environment variable `api_key_env` names (never
        from a file the study could record)."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def admin_api_key(self) -> str | None:
        return os.environ.get(self.admin_api_key_env) if self.admin_api_key_env else None


class ServerConfig(_Section):
    command: str
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("command")
    @classmethod
    def _command(cls, value: str) -> str:
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split the command into arguments: {exc}") from None
        if not argv:
            raise ValueError("the launch command is empty")
        for flag, key in (("--api-key", "api_key_env"), ("--admin-api-key", "admin_api_key_env")):
            if flag in argv or any(a.startswith(flag + "=") for a in argv):
                raise ValueError(
                    f"has {flag} in clear text; put the key in an environment variable and set "
                    f"[target] {key} to its name"
                )
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return value

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command)

    @property
    def command_line(self) -> CommandLine:
        """The command as SGLang reads it (abbreviations, `--flag=value`, last one wins)."""
        return CommandLine.parse(self.argv)


class SpaceConfig(_Section):
    speculative_num_steps: IntSpace | None = None
    speculative_eagle_topk: IntSpace | None = None
    speculative_num_draft_tokens: IntRange | None = None
    mem_fraction_static: FloatSpace | None = None
    # "sweep": draft tokens <= steps * topk + 1 (bench_speculative.py's filter);
    # "tree": up to EAGLE's candidate pool, topk + (steps - 1) * topk^2 + 1.
    draft_tokens_bound: Literal["sweep", "tree"] = "sweep"

    @model_validator(mode="after")
    def _check(self) -> "SpaceConfig":
        for key in ("speculative_num_steps", "speculative_eagle_topk"):
            space = getattr(self, key)
            values = space.values() if isinstance(space, IntRange) else (space.choices if space else [])
            bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < 1]
            if bad:
                raise ValueError(f"{key}: values must be integers >= 1, got {bad}")
        draft = self.speculative_num_draft_tokens
        if draft is not None and draft.low < 2:
            raise ValueError(f"speculative_num_draft_tokens: low must be >= 2, got {draft.low}")
        mfs = self.mem_fraction_static
        values = [mfs.low, mfs.high] if isinstance(mfs, FloatRange) else (mfs.choices if mfs else [])
        bad = [v for v in values if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < 1]
        if bad:
            raise ValueError(f"mem_fraction_static: values must lie in (0, 1), got {bad}")
        return self

    @property
    def searched(self) -> list[str]:
        return [k for k in SEARCHED_FLAGS if getattr(self, k) is not None]


class SyntheticPrompts(_Section):
    """Prompts of given lengths, as SGLang's bench_serving `random` dataset draws them
    (benchmark/datasets/common.py · compute_random_lens: each length uniform in
    [max(int(len x range_ratio), 1), len]; its --random-range-ratio defaults to 0.0)."""

    input_len: int = Field(ge=1)
    output_len: int = Field(ge=2)
    range_ratio: float = Field(default=0.0, ge=0, le=1)
    num_prompts: int = Field(default=32, ge=1)
    category: str = "random"


class BenchConfig(_Section):
    temperature: float = Field(default=0.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=256, ge=2)
    ignore_eos: bool = False
    single_requests: int = Field(default=4, ge=1)  # prompts in one single-stream pass
    single_min_passes: int = Field(default=2, ge=1)
    single_max_passes: int = Field(default=5, ge=1)
    single_target_ci: float = Field(default=0.03, gt=0, lt=1)  # 95% CI half-width / mean
    concurrency: int | list[int] = 16
    concurrent_requests: int = Field(default=64, ge=1)  # per level at most; a level sends min(this, 4 x its concurrency)
    # A level's concurrent phase stops sending at its request count or after this many seconds of
    # steady state (from its first completion), whichever comes first; in-flight requests finish.
    level_seconds: float = Field(default=60.0, gt=0)
    # KV tokens one request holds, for capacity; "auto": the workload's own mean, measured.
    request_tokens: Union[int, Literal["auto"]] = "auto"
    warmup_requests: int = Field(default=2, ge=0)
    # "builtin", a JSONL / ShareGPT / request-log file, or synthetic lengths: a table (or a list
    # of tables, one per class) {input_len, output_len, range_ratio, num_prompts, category}.
    prompts: Union[str, SyntheticPrompts, list[SyntheticPrompts]] = "builtin"
    # Traffic shares by request class ({chat = 0.6, long_context = 0.4}); default: as the file has them.
    mix: dict[str, float] | None = None
    # Prompt-length bounds (tokens) that split each class further: [2048, 8192, 32768].
    context_buckets: list[int] | None = None
    seed: int = 0
    request_timeout_s: float = Field(default=600.0, gt=0)  # one whole request
    stall_timeout_s: float = Field(default=60.0, gt=0)  # no byte from the server for this long: it hangs
    # A thinking model (--reasoning-parser): "server" measures it as the server serves it;
    # "on"/"off" ask for it per request (chat_template_kwargs.enable_thinking).
    thinking: Literal["server", "on", "off"] = "server"

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, value: int | list[int]) -> int | list[int]:
        values = value if isinstance(value, list) else [value]
        if not values or any(v < 1 for v in values):
            raise ValueError(f"must be >= 1 (or a non-empty list of such), got {value}")
        if len(set(values)) != len(values):
            raise ValueError(f"repeats a level: {value}")
        return value

    @property
    def concurrency_levels(self) -> list[int]:
        return self.concurrency if isinstance(self.concurrency, list) else [self.concurrency]

    @property
    def prompts_json(self) -> Any:
        """`prompts` as JSON (a record of which workload was measured): the path, or the synthetic tables."""
        if isinstance(self.prompts, str):
            return self.prompts
        tables = self.prompts if isinstance(self.prompts, list) else [self.prompts]
        return [t.model_dump() for t in tables]

    def level_requests(self, level: int) -> int:
        """Requests a concurrency level sends: a few times its concurrency (enough for a steady
        window), never more than `concurrent_requests`."""
        return min(self.concurrent_requests, max(4 * level, 8))

    @field_validator("request_tokens", mode="before")
    @classmethod
    def _request_tokens(cls, value: Any) -> int | str:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"must be a positive integer or \"auto\" (the workload's own mean), got {value!r}")
        return value

    @field_validator("prompts", mode="before")
    @classmethod
    def _prompts(cls, value: Any) -> Any:
        """One line for a bad synthetic table (pydantic would list every member of the union)."""
        if isinstance(value, str):
            return value
        tables = value if isinstance(value, list) else [value]
        if not tables or not all(isinstance(t, dict) for t in tables):
            raise ValueError("must be \"builtin\", a file path, or synthetic lengths { input_len = 1024, output_len = 256 } (or a list of such)")
        out = []
        for table in tables:
            try:
                out.append(SyntheticPrompts.model_validate(table))
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(p) for p in error["loc"]) or "table"
                raise ValueError(f"synthetic {where}: {error['msg']}") from None
        categories = [t.category for t in out]
        if len(set(categories)) != len(categories):
            raise ValueError(f"synthetic tables repeat a category: {categories}; give each its own category")
        return out if isinstance(value, list) else out[0]

    @field_validator("mix")
    @classmethod
    def _mix(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("is empty; give each request class its traffic share, e.g. { chat = 0.6, long_context = 0.4 }, or leave it out")
        bad = {k: v for k, v in value.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0}
        if bad:
            raise ValueError(f"shares must be numbers >= 0, got {bad}")
        if sum(value.values()) <= 0:
            raise ValueError("every share is 0; give at least one class a share above 0")
        return value

    @field_validator("context_buckets")
    @classmethod
    def _buckets(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(v < 1 for v in value) or sorted(set(value)) != value):
            raise ValueError(f"must be increasing prompt-token bounds >= 1, like [2048, 8192, 32768], got {value}")
        return value

    @model_validator(mode="after")
    def _check(self) -> "BenchConfig":
        if self.single_max_passes < self.single_min_passes:
            raise ValueError(
                f"single_max_passes ({self.single_max_passes}) is below single_min_passes "
                f"({self.single_min_passes}); raise it"
            )
        return self


class ConstraintsConfig(_Section):
    p99_itl_ms: float | None = Field(default=None, gt=0)
    ttft_ms: float | None = Field(default=None, gt=0)


_PERCENTILES = (50, 90, 95, 99)


class SloConfig(_Section):
    """[slo]: the latency promises behind the objective `slo_capacity` (tuner/measure/load_sweep.py).

    A load holds the SLO when every promise holds over its requests (the percentile of their
    inter-token latencies, the percentile of their times to first token) and at least
    `attainment` of the requests are good (DistServe's goodput: a request is good only if its
    TTFT and its time per output token are within every promise)."""

    p50_itl_ms: float | None = Field(default=None, gt=0)
    p90_itl_ms: float | None = Field(default=None, gt=0)
    p95_itl_ms: float | None = Field(default=None, gt=0)
    p99_itl_ms: float | None = Field(default=None, gt=0)
    p50_ttft_ms: float | None = Field(default=None, gt=0)
    p90_ttft_ms: float | None = Field(default=None, gt=0)
    p95_ttft_ms: float | None = Field(default=None, gt=0)
    p99_ttft_ms: float | None = Field(default=None, gt=0)
    attainment: float = Field(default=0.95, gt=0, le=1)  # share of requests meeting every promise
    precision: float = Field(default=0.10, gt=0, lt=1)  # relative width the search stops at
    max_points: int = Field(default=6, ge=1, le=50)  # load points the search may add per trial
    rounds: int = Field(default=2, ge=1, le=20)  # judged requests per point, in multiples of the load
    # "closed": the load is requests in flight (slo_capacity in requests); "poisson": requests
    # arrive at a rate whatever is in flight (slo_capacity in requests per second).
    arrival: Literal["closed", "poisson"] = "closed"

    @model_validator(mode="after")
    def _check(self) -> "SloConfig":
        if not self.promises:
            raise ValueError("no latency promise; add one, e.g. p95_itl_ms = 50")
        return self

    @property
    def promises(self) -> list[tuple[str, int, float]]:
        """(metric "itl" | "ttft", percentile, limit in ms) for every promise set."""
        out = []
        for metric in ("itl", "ttft"):
            for q in _PERCENTILES:
                limit = getattr(self, f"p{q}_{metric}_ms")
                if limit is not None:
                    out.append((metric, q, float(limit)))
        return out

    def describe(self) -> str:
        parts = [f"p{q} {metric.upper()} <= {limit:g} ms" for metric, q, limit in self.promises]
        return ", ".join(parts) + f", {self.attainment:.0%} of requests good"


class Config(_Section):
    study: StudyConfig
    target: TargetConfig = Field(default_factory=TargetConfig)
    server: ServerConfig
    space: SpaceConfig = Field(default_factory=SpaceConfig)
    bench: BenchConfig = Field(default_factory=BenchConfig)
    constraints: ConstraintsConfig = Field(default_factory=ConstraintsConfig)
    slo: SloConfig | None = None
    path: str = "<config>"
    base_dir: str = "."
    storage_flag: bool = False  # the storage URL came from --storage (errors name the flag)

    @property
    def storage_url(self) -> str:
        if self.study.storage:
            return self.study.storage
        # The contract's default, relative to the working directory like any sqlite URL.
        return f"sqlite:///studies/{self.study.name}.db"

    @property
    def sweep_slo(self) -> SloConfig | None:
        """[slo] when an objective needs the search over load (slo_capacity), else None: the
        search costs seconds per trial, so it runs only when something scores it."""
        wanted = any(name.partition("@")[0] == "slo_capacity" for name in self.study.objectives)
        return self.slo if wanted else None

    @property
    def artifacts_dir(self) -> Path:
        if self.study.artifacts:
            return Path(os.path.expanduser(self.study.artifacts))
        db = sqlite_path(self.storage_url)
        if db is not None:
            return db.with_name(db.stem + ".artifacts")
        return Path("studies") / f"{self.study.name}.artifacts"

    def resolve_path(self, value: str) -> Path:
        """A path from the config, relative to the config's directory."""
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else Path(self.base_dir) / path


_TYPED = {"int_type": "a whole number", "float_type": "a number", "bool_type": "true or false", "list_type": "a list"}


def _quoted(text: str, kind: str) -> str:
    """A value written as a TOML string where a number, a boolean or a list belongs."""
    if kind == "list_type":
        items = ", ".join(part.strip() for part in text.split(",") if part.strip())
        return f"is the string {text!r}, not a list; write it as a list: [{items}]"
    bare = text.strip().lower() if kind == "bool_type" else text.strip()
    try:
        fits = bare in ("true", "false") if kind == "bool_type" else bool(int(bare) if kind == "int_type" else float(bare)) or True
    except ValueError:
        fits = False
    if fits:
        return f"is the string {text!r}, not {_TYPED[kind]}; write it without quotes: {bare}"
    return f"is the string {text!r}; give {_TYPED[kind]}"


def _first_error(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error to report.  A `{ low, high }` or `{ choices }` key is tried as each shape, and
    the shape the user did not mean reports "low: is required": a wrong value in the keys
    written says more than a key missing from the other shape."""
    written = [e for e in errors if e["type"] not in ("missing", "extra_forbidden")]
    return (written or errors)[0]


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///path` URL (`~` expanded); None for another store or `:memory:`.
    The one parser of sqlite URLs (the store, the report's folder, the artifacts, --dry-run)."""
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    return Path(path).expanduser() if path and path != ":memory:" else None


def _describe(error: dict[str, Any]) -> str:
    loc = [str(p) for p in error["loc"] if not str(p).startswith(("function-after", "IntRange", "FloatRange", "Choices", "int", "list"))]
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    if error["type"] == "extra_forbidden" and loc[:1] == ["slo"]:
        close = difflib.get_close_matches(loc[-1], list(SloConfig.model_fields), n=1)
        message = (f"unknown key; did you mean {close[0]}?" if close else
                   "unknown key; [slo] takes p50_/p90_/p95_/p99_itl_ms, the same for _ttft_ms, "
                   "attainment, precision, max_points, rounds and arrival")
    elif error["type"] == "extra_forbidden":
        message = "unknown key; check its spelling against the README's config reference"
    elif error["type"] == "missing":
        message = "is required"
    elif isinstance(error.get("input"), str) and error["type"] in _TYPED:
        message = _quoted(error["input"], error["type"])
    section = f"[{loc[0]}]" if loc else ""
    key = " ".join(loc[1:])
    return f"{section} {key}: {message}".replace(" :", ":").strip()


def _parse(path: str, text: str, base_dir: str) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for section, value in data.items():
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: top-level key {section!r} must be a [section]")
    try:
        config = Config.model_validate({**data, "path": path, "base_dir": base_dir})
    except ValidationError as exc:
        first = _first_error(exc.errors())
        if first["type"] == "extra_forbidden" and len(first["loc"]) == 1:
            raise ConfigError(
                f"{path}: unknown section [{first['loc'][0]}]; sections are [study], [target], "
                "[server], [space], [bench], [constraints], [slo]"
            ) from None
        raise ConfigError(f"{path} {_describe(first)}") from None
    _check_cross(config)
    return config


def _check_cross(config: Config) -> None:
    """Checks that need more than one section."""
    command = config.server.command_line
    spec_searched = [k for k in config.space.searched if k.startswith("speculative_")]
    algorithm = command.algorithm
    if spec_searched and algorithm is None:
        raise ConfigError(
            f"{config.path} [server] command: has no --speculative-algorithm, so the searched "
            f"{', '.join(spec_searched)} would be ignored; add e.g. --speculative-algorithm EAGLE3 "
            "(or NEXTN for MTP models)"
        )
    if spec_searched and algorithm not in SEARCHABLE_ALGORITHMS:
        # SGLang overrides the shape for these (speculative_hook.py: _handle_ngram forces topk to
        # --speculative-ngram-max-bfs-breadth; DFLASH and DSPARK force steps = topk = 1), so a
        # search over steps/topk/draft tokens would measure flags the server ignores.
        raise ConfigError(
            f"{config.path} [server] command: --speculative-algorithm {algorithm} is outside the search "
            f"(SGLang overrides its steps/topk); use one of {', '.join(SEARCHABLE_ALGORITHMS)}, or search only mem_fraction_static"
        )
    if config.target.manager == "process" and config.target.is_remote and config.target.leave_best:
        raise ConfigError(f"{config.path} [target] leave_best: applies to manager = \"systemd\" only")
    for key in ("api_key_env", "admin_api_key_env"):
        name = getattr(config.target, key)
        if name and name not in os.environ:
            raise ConfigError(
                f"{config.path} [target] {key}: environment variable {name} is not set; "
                f"export it with the server's {'admin ' if key.startswith('admin') else ''}API key"
            )
    for key in ("identity_file", "known_hosts"):
        value = getattr(config.target, key)
        if value and not os.path.exists(os.path.expanduser(value)):
            raise ConfigError(f"{config.path} [target] {key}: {value} does not exist; fix the path")
    host = re.match(r"^https?://([^/:]+|\[[^\]]+\])", config.target.url).group(1).strip("[]")
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror:
        raise ConfigError(f"{config.path} [target] url: cannot resolve host {host!r}; fix the URL (the server's address as seen from the tuner)") from None
    _check_slo(config)
    prompts = config.bench.prompts
    if isinstance(prompts, str) and prompts != "builtin" and not config.resolve_path(prompts).exists():
        raise ConfigError(f"{config.path} [bench] prompts: {prompts} does not exist; give a JSONL or ShareGPT JSON file, or \"builtin\"")


def _check_slo(config: Config) -> None:
    wants = any(name.partition("@")[0] == "slo_capacity" for name in config.study.objectives)
    if wants and config.slo is None:
        raise ConfigError(f"{config.path} [study] objectives: slo_capacity needs the promise it holds; "
                          "add an [slo] section, e.g. p95_itl_ms = 50")


def load_config(path: str | os.PathLike[str] = DEFAULT_CONFIG) -> Config:
    """Read and check a study config; raise ConfigError with one line naming the fix."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file; pass --config with a path to a .toml study config") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return _parse(path, text, str(Path(path).parent))


def apply_overrides(config: Config, *, study_name: str | None, storage: str | None) -> Config:
    update = {}
    if study_name:
        update["name"] = study_name
    if storage:
        update["storage"] = storage
    if not update:
        return config
    try:
        study = StudyConfig.model_validate({**config.study.model_dump(), **update})
    except ValidationError as exc:
        raise ConfigError(f"--study-name: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    return config.model_copy(update={"study": study, "storage_flag": bool(storage) or config.storage_flag})


def parse_config(text: str, *, path: str = "<config>", base_dir: str = ".") -> Config:
    """Like load_config, for a config held in memory (tests, notebooks)."""
    return _parse(path, text, base_dir)
