"""SGLang's command line, read and edited in one place.

Every part of the tuner that reads the operator's launch command (the searched flags' current
values, the algorithm, the model, DP ranks) or edits it (a trial's flags, a baseline without
speculation, secrets redacted) goes through `CommandLine`.  It reads the command as SGLang's
argparse does (sglang 0.5.23, `server_args.py · prepare_server_args`):

- `--flag value` and `--flag=value`; options with several values (`--cuda-graph-bs 1 2 4`):
  SGLang has no positional arguments, so a token that is not an option belongs to the option
  before it;
- unambiguous abbreviations (`--mem-frac 0.8`, `--speculative-algo EAGLE`), resolved against
  SGLang 0.5.23's own option table (`tuner/data/sglang_options.json`, copied from the wheel);
- a repeated option: the last one wins;
- `--config file.yaml`: SGLang merges the YAML under the command line (the command line wins).
  `with_config_file` folds such a file in, read through the target's shell.

`Params` is the one definition of the searched flags.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Iterable

from tuner.errors import ConfigError

__all__ = [
    "SEARCHED", "Params", "CommandLine", "Option", "flag_of", "redact", "REDACTED",
    "SECRET_FLAGS", "SEARCHABLE_ALGORITHMS", "ADAPTIVE_ALGORITHMS", "family_default",
]

# The four searched flags, as SGLang's ServerArgs names them.
SEARCHED = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "mem_fraction_static")
SPECULATIVE_SHAPE = SEARCHED[:3]
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password", "--hf-token")
REDACTED = "<redacted>"
# Algorithms whose shape is (steps, topk, draft tokens) as searched (speculative_hook.py ·
# _handle_eagle_family; NEXTN is EAGLE, STANDALONE shares the path).  NGRAM forces topk to
# --speculative-ngram-max-bfs-breadth; DFLASH and DSPARK force steps = topk = 1.
SEARCHABLE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")  # _maybe_disable_adaptive keeps these only


def flag_of(name: str) -> str:
    """`mem_fraction_static` -> `--mem-fraction-static`."""
    return "--" + name.replace("_", "-")


@lru_cache(maxsize=1)
def _options() -> dict[str, dict[str, Any]]:
    text = resources.files("tuner").joinpath("data/sglang_options.json").read_text(encoding="utf-8")
    return json.loads(text)["options"]


def canonical(option: str) -> str:
    """An option string as argparse resolves it: exact, or the one option it abbreviates.
    Unknown or ambiguous strings stay as written (SGLang itself will reject them)."""
    table = _options()
    if option in table:
        return option
    matches = [o for o in table if o.startswith(option)]
    dests = {table[o]["dest"] for o in matches}
    return matches[0] if len(dests) == 1 and matches else option


@dataclass(frozen=True)
class Option:
    """One option as written (`raw` tokens) and as SGLang reads it (`name`, `values`)."""

    name: str  # canonical option string, e.g. "--mem-fraction-static"
    values: tuple[str, ...]
    raw: tuple[str, ...]

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")


@dataclass(frozen=True)
class Params:
    """One configuration of the searched flags, as SGLang will resolve it."""

    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    mem_fraction_static: float | None = None

    def flags(self) -> list[str]:
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out += [flag_of(f.name), f"{value:.6g}" if isinstance(value, float) else str(value)]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @property
    def speculative(self) -> bool:
        return self.speculative_num_steps is not None


@dataclass(frozen=True)
class CommandLine:
    """A launch command: the program (`prefix`, e.g. `python -m sglang.launch_server`) and
    SGLang's options in order."""

    prefix: tuple[str, ...]
    options: tuple[Option, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, argv: Iterable[str]) -> "CommandLine":
        argv = list(argv)
        first = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
        options: list[Option] = []
        i = first
        while i < len(argv):
            token = argv[i]
            key, eq, inline = token.partition("=")
            name = canonical(key)
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            values = (inline,) if eq else tuple(argv[i + 1:j])
            raw = tuple(argv[i:j])
            if eq and j > i + 1:  # `--a=1 stray`: keep the stray tokens with it, as written
                values = (inline, *argv[i + 1:j])
            options.append(Option(name, values, raw))
            i = j
        return cls(tuple(argv[:first]), tuple(options))

    @classmethod
    def split(cls, command: str) -> "CommandLine":
        return cls.parse(shlex.split(command))

    # -- reading -------------------------------------------------------------------------
    def _matching(self, name: str) -> list[Option]:
        wanted = flag_of(name) if not name.startswith("--") else name
        return [o for o in self.options if o.name == wanted]

    def has(self, name: str) -> bool:
        return bool(self._matching(name))

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value SGLang will use (the last occurrence wins); `default` when absent."""
        found = self._matching(name)
        if not found:
            return default
        values = found[-1].values
        return values[-1] if values else ""

    def get_int(self, name: str, default: int | None = None) -> int | None:
        value = self.get(name)
        try:
            return int(value) if value not in (None, "") else default
        except ValueError:
            return default

    @property
    def algorithm(self) -> str | None:
        value = self.get("speculative_algorithm")
        return value.upper() if value else None

    def incomplete_speculation(self) -> str | None:
        """What SGLang's start-up needs of the speculative flags that this command leaves unset,
        or None.  SGLang 0.5.23 (arg_groups/speculative_hook.py · _handle_eagle_family) picks
        all three itself only when --speculative-num-steps is unset, asserting the other two are
        too (a bare AssertionError); with steps set and topk unset it compares None with 1 (a
        TypeError); a tree without draft tokens breaks when the pools are sized.  A trial always
        passes all three; `tuner.bench --flags` can leave some out."""
        if self.algorithm not in ("EAGLE", "EAGLE3", "NEXTN") or self.has("speculative_adaptive"):
            return None
        steps, topk, draft = (self.get_int(n) for n in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"))
        if steps is None and (topk is not None or draft is not None):
            return ("SGLang chooses --speculative-eagle-topk and --speculative-num-draft-tokens itself only with "
                    "--speculative-num-steps unset (it asserts the others are unset too): set --speculative-num-steps as well")
        if steps is not None and topk is None:
            return ("with --speculative-num-steps SGLang needs --speculative-eagle-topk (unset, its start-up fails with a "
                    "TypeError): add --speculative-eagle-topk 1 for a chain, or the tree's width")
        if topk is not None and topk > 1 and draft is None:
            return "with --speculative-eagle-topk above 1 SGLang needs --speculative-num-draft-tokens: add it"
        return None

    @property
    def model_path(self) -> str:
        return self.get("model_path") or ""

    def params(self) -> Params:
        """The searched flags' current values (the operator's configuration)."""
        found: dict[str, Any] = {}
        for name in SEARCHED:
            value = self.get(name)
            if value in (None, ""):
                continue
            try:
                found[name] = float(value) if name == "mem_fraction_static" else int(value)
            except ValueError:
                pass  # the server will reject it; the launch error says so
        return Params(**found)

    # -- editing -------------------------------------------------------------------------
    def without(self, drop: Callable[[Option], bool] | Iterable[str]) -> "CommandLine":
        """The command without the options `drop` selects (a predicate, or dest names)."""
        if not callable(drop):
            names = {flag_of(n) if not n.startswith("--") else n for n in drop}
            drop = lambda o, names=names: o.name in names  # noqa: E731
        return CommandLine(self.prefix, tuple(o for o in self.options if not drop(o)))

    def with_args(self, argv: Iterable[str]) -> "CommandLine":
        """The command with `argv`'s options replacing the same options in it."""
        extra = CommandLine.parse(list(argv))
        names = {o.name for o in extra.options}
        kept = self.without(lambda o: o.name in names)
        return CommandLine(self.prefix, kept.options + extra.options)

    def with_params(self, params: Params) -> "CommandLine":
        """The trial's command: every searched flag removed, the trial's values appended."""
        return CommandLine(self.prefix, self.without(SEARCHED).options).with_args(params.flags())

    def without_speculation(self) -> "CommandLine":
        return self.without(lambda o: o.name.startswith("--speculative"))

    def argv(self) -> list[str]:
        return [*self.prefix, *(t for o in self.options for t in o.raw)]

    def with_config_file(self, read: Callable[[str], str]) -> "CommandLine":
        """Fold a `--config FILE` (YAML) in as SGLang does: the file's keys first, the command
        line over them.  `read(path)` returns the file's text (through the target's shell)."""
        path = self.get("config")
        if path is None:
            return self
        import yaml  # optuna's own dependency

        try:
            data = yaml.safe_load(read(path)) or {}
        except Exception as exc:
            raise ConfigError(f"[server] command: --config {path}: cannot read it ({exc}); put its options on the command line instead") from None
        if not isinstance(data, dict):
            raise ConfigError(f"[server] command: --config {path}: not a YAML mapping of options; put its options on the command line instead")
        argv: list[str] = []
        for key, value in data.items():
            name = flag_of(str(key).replace("-", "_"))
            if isinstance(value, bool):
                argv += [name] if value else []
            elif isinstance(value, list):
                argv += [name, *map(str, value)]
            elif value is not None:
                argv += [name, str(value)]
        from_file = CommandLine.parse(argv)
        mine = {o.name for o in self.options}
        merged = tuple(o for o in from_file.options if o.name not in mine) + self.without(["config"]).options
        return CommandLine(self.prefix, merged)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def family_default(architecture: str | None, algorithm: str | None = None) -> tuple[int, int, int]:
    """SGLang 0.5.23's auto choice of (steps, topk, draft tokens) when steps is unset
    (`speculative_hook.py · _auto_choose_speculative_params`): keyed on the model's
    `architectures[0]` (from /model_info): LlamaForCausalLM, Grok1ForCausalLM and
    Grok1VForCausalLM get (5, 4, 8); everything else (Llama-4 included) and STANDALONE (3, 1, 4)."""
    if (algorithm or "").upper() == "STANDALONE":
        return (3, 1, 4)
    if architecture in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"):
        return (5, 4, 8)
    return (3, 1, 4)
