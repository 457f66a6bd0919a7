"""The prompts a benchmark sends: the built-in set, a JSONL file, or a ShareGPT JSON file.

Formats:
- JSONL, one object per line, either {"messages": [{"role": ..., "content": ...}, ...]} or
  {"prompt": "..."} (sent as one user message); the built-in set is this format.
- ShareGPT: a JSON list of {"conversations": [{"from": "human"|"gpt", "value": ...}, ...]};
  the first human turn is the prompt, as SGLang's bench_serving does.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

__all__ = ["Prompt", "Workload", "load_workload", "BUILTIN"]

BUILTIN = "builtin"


@dataclass(frozen=True)
class Prompt:
    messages: tuple[dict[str, str], ...]
    category: str = "user"
    id: str = ""

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.messages)


def _from_obj(obj: Any, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object with \"messages\" or \"prompt\"")
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages
        ):
            raise ConfigError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
        return Prompt(tuple({"role": m["role"], "content": m["content"]} for m in messages), obj.get("category", "user"), str(obj.get("id", "")))
    if isinstance(obj.get("prompt"), str):
        return Prompt(({"role": "user", "content": obj["prompt"]},), obj.get("category", "user"), str(obj.get("id", "")))
    if isinstance(obj.get("conversations"), list):
        for turn in obj["conversations"]:
            if isinstance(turn, dict) and turn.get("from") in ("human", "user") and isinstance(turn.get("value"), str):
                return Prompt(({"role": "user", "content": turn["value"]},), "sharegpt", str(obj.get("id", "")))
        raise ConfigError(f"{where}: a ShareGPT entry without a human turn")
    raise ConfigError(f"{where}: expected \"messages\", \"prompt\" or \"conversations\"")


def _read(path: Path) -> list[Prompt]:
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        prompts = []
        for i, obj in enumerate(data):
            try:
                prompts.append(_from_obj(obj, f"{path} entry {i}"))
            except ConfigError:
                continue  # ShareGPT dumps hold entries without a human turn; skip them
        return prompts
    prompts = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} line {lineno}: not valid JSON ({exc.msg})") from None
        prompts.append(_from_obj(obj, f"{path} line {lineno}"))
    return prompts


class Workload:
    """The prompts in a fixed order (shuffled once with the bench seed).

    Every trial takes the same prompts for the same phase, so two configurations are compared
    on identical requests (paired), and repeats of a phase replay the same prompts.
    """

    ROLES = ("warmup", "single", "concurrent")

    def __init__(self, prompts: list[Prompt], *, seed: int = 0, name: str = BUILTIN):
        if not prompts:
            raise ConfigError(f"{name}: no usable prompts")
        self.prompts = list(prompts)
        random.Random(seed).shuffle(self.prompts)
        self.name = name

    def for_phase(self, role: str, n: int) -> list[Prompt]:
        """`n` prompts for a phase; phases start at different offsets so they differ."""
        start = {"warmup": 0, "single": len(self.prompts) // 3, "concurrent": 2 * len(self.prompts) // 3}[role]
        return [self.prompts[(start + i) % len(self.prompts)] for i in range(n)]

    def categories(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.prompts:
            out[p.category] = out.get(p.category, 0) + 1
        return out


def load_workload(source: str | Path, *, seed: int = 0, base_dir: str | Path = ".") -> Workload:
    if str(source) == BUILTIN:
        text = resources.files("tuner.measure").joinpath("workloads/builtin.jsonl").read_text(encoding="utf-8")
        prompts = [_from_obj(json.loads(line), f"builtin line {i}") for i, line in enumerate(text.splitlines(), 1) if line.strip()]
        return Workload(prompts, seed=seed, name=BUILTIN)
    path = Path(source)
    if not path.is_absolute():
        path = Path(base_dir) / path
    if not path.exists():
        raise ConfigError(f"[bench] prompts: {source} does not exist; give a JSONL or ShareGPT JSON file, or \"builtin\"")
    try:
        return Workload(_read(path), seed=seed, name=str(source))
    except ConfigError as exc:  # the file's own line or entry, named as the config key it came from
        raise ConfigError(f"[bench] prompts: {exc}; fix the file, or set prompts = \"builtin\"") from None
