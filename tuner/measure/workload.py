"""The prompts a benchmark sends, and the request classes they fall into.

Sources (`[bench] prompts`):
- "builtin": the built-in set (`workloads/builtin.jsonl`: chat, code, maths, summarisation,
  long_context);
- a JSONL file, one object per line: {"messages": [...]} or {"prompt": "..."}, optionally
  "category" and "max_tokens".  An OpenAI-style request log is this format too: each line a
  `/v1/chat/completions` body (`messages`, `max_tokens` or `max_completion_tokens`, optional
  `metadata.category`); content given as a list of text parts is joined;
- a ShareGPT JSON file: a list of {"conversations": [{"from": "human"|"gpt", "value": ...}]},
  the first human turn is the prompt, as SGLang's bench_serving does;
- synthetic lengths (`SyntheticPrompts`): SGLang's bench_serving `random` dataset
  (benchmark/datasets/random.py · sample_random_requests) without a tokenizer: each prompt is
  input_len common English words (one token each on a BPE tokenizer), each answer asks for
  output_len tokens.

Request classes: a prompt's `category` ("user" when the file has none), split further by
`[bench] context_buckets` on the prompt's length.  `[bench] mix` weights the classes (default:
their share of the prompts); a class with no share is not sent.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from tuner.config import BenchConfig, SyntheticPrompts
from tuner.errors import ConfigError

__all__ = ["Prompt", "Workload", "load_workload", "bench_workload", "estimate_tokens", "bucket_name", "BUILTIN", "DEFAULT_CLASS"]

BUILTIN = "builtin"
DEFAULT_CLASS = "user"  # the contract's one class of a file without categories
_WHERE = "[bench] prompts"
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def estimate_tokens(text: str) -> int:
    """Prompt tokens before the server counts them: words and punctuation marks (close to a BPE
    count for English).  Only used to put a prompt in a context bucket; the figures use the
    server's own `usage.prompt_tokens`."""
    return max(1, len(_TOKEN_RE.findall(text)))


def bucket_name(category: str, tokens: int, buckets: list[int] | None) -> str:
    """`category` split by prompt length: "chat/2k" holds prompts up to 2,048 tokens, "chat/32k+"
    those above the last bound."""
    if not buckets:
        return category

    def short(n: int) -> str:
        return f"{n // 1024}k" if n % 1024 == 0 else str(n)

    for bound in buckets:
        if tokens <= bound:
            return f"{category}/{short(bound)}"
    return f"{category}/{short(buckets[-1])}+"


@dataclass(frozen=True)
class Prompt:
    messages: tuple[dict[str, str], ...]
    category: str = DEFAULT_CLASS
    id: str = ""
    max_tokens: int | None = None  # the request's own (a request log, synthetic); else [bench] max_tokens
    request_class: str = ""  # set by the Workload: the category, split by context_buckets

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.messages)


def _content(value: Any) -> str | None:
    """A message's content: a string, or OpenAI's list of parts (the text parts joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(p, dict) for p in value):
        texts = [p.get("text") for p in value if p.get("type", "text") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)
    return None


def _category(obj: dict, where: str) -> str:
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    category = obj.get("category", metadata.get("category", DEFAULT_CLASS))
    if not isinstance(category, str) or not category.strip() or ":" in category:
        raise ConfigError(f"{where}: \"category\" must be a non-empty string without ':', got {category!r}")
    return category.strip()


def _max_tokens(obj: dict, where: str, per_request: bool) -> int | None:
    if not per_request:
        return None
    value = obj.get("max_tokens", obj.get("max_completion_tokens"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ConfigError(f"{where}: \"max_tokens\" must be an integer >= 2, got {value!r}")
    return value


def _messages(raw: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    out = []
    for m in raw:
        content = _content(m.get("content")) if isinstance(m, dict) else None
        if content is None or not m.get("role"):
            raise ConfigError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
        out.append({"role": m["role"], "content": content})
    return tuple(out)


def _from_obj(obj: Any, where: str, *, per_request: bool = True) -> Prompt:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object with \"messages\" or \"prompt\"")
    ident = str(obj.get("id", ""))
    if "messages" in obj:
        return Prompt(_messages(obj["messages"], where), _category(obj, where), ident, _max_tokens(obj, where, per_request))
    if isinstance(obj.get("prompt"), str):
        return Prompt(({"role": "user", "content": obj["prompt"]},), _category(obj, where), ident, _max_tokens(obj, where, per_request))
    if isinstance(obj.get("conversations"), list):
        for turn in obj["conversations"]:
            if isinstance(turn, dict) and turn.get("from") in ("human", "user") and isinstance(turn.get("value"), str):
                return Prompt(({"role": "user", "content": turn["value"]},), "sharegpt", ident)
        raise ConfigError(f"{where}: a ShareGPT entry without a human turn")
    raise ConfigError(f"{where}: expected \"messages\", \"prompt\" or \"conversations\"")


def _read(path: Path, shown: str) -> list[Prompt]:
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{_WHERE}: {shown} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        prompts = []
        for i, obj in enumerate(data):
            try:
                prompts.append(_from_obj(obj, f"{_WHERE}: {shown} entry {i}"))
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
            raise ConfigError(f"{_WHERE}: {shown} line {lineno}: not valid JSON ({exc.msg}); fix or remove the line") from None
        prompts.append(_from_obj(obj, f"{_WHERE}: {shown} line {lineno}"))
    return prompts


# Common English words, one BPE token each with their leading space on Llama/Qwen tokenizers.
_WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
          "you were her she there been one all we their has would when if so no what up out who them some could time "
          "into only then more its these two may first any new very my now people like other how our over also back "
          "after use work well way even because good those just each most know where much should make long down day").split()


def synthetic(spec: SyntheticPrompts, seed: int) -> list[Prompt]:
    """`num_prompts` prompts as bench_serving's `random` dataset sizes them: input and output
    lengths each uniform in [max(int(len x range_ratio), 1), len] (common.py ·
    compute_random_lens); the text is common words, one token each."""
    rng = random.Random(f"{seed}:{spec.category}:{spec.input_len}:{spec.output_len}")

    def length(full: int, low: int = 1) -> int:
        return rng.randint(max(int(full * spec.range_ratio), low), full)

    out = []
    for i in range(spec.num_prompts):
        words = [rng.choice(_WORDS) for _ in range(length(spec.input_len))]
        out.append(Prompt(({"role": "user", "content": " ".join(words)},), spec.category, f"{spec.category}-{i:03d}",
                          max_tokens=length(spec.output_len, 2)))
    return out


class Workload:
    """The prompts in a fixed order (shuffled once with the bench seed), by request class.

    Every trial takes the same prompts for the same phase, so two configurations are compared
    on identical requests (paired), and repeats of a phase replay the same prompts.
    """

    ROLES = ("warmup", "single", "concurrent")

    def __init__(self, prompts: list[Prompt], *, seed: int = 0, name: str = BUILTIN,
                 mix: dict[str, float] | None = None, context_buckets: list[int] | None = None):
        if not prompts:
            raise ConfigError(f"{_WHERE}: {name} has no usable prompts")
        classed = [replace(p, request_class=bucket_name(p.category, estimate_tokens(p.text), context_buckets)) for p in prompts]
        random.Random(seed).shuffle(classed)
        self.name = name
        self.by_class: dict[str, list[Prompt]] = {}
        for p in classed:
            self.by_class.setdefault(p.request_class, []).append(p)
        self.mix = self._shares(mix)
        self.prompts = [p for p in classed if p.request_class in self.mix]

    def _shares(self, mix: dict[str, float] | None) -> dict[str, float]:
        """Each measured class's traffic share, summing to 1, largest first."""
        if mix is None:
            weights = {c: float(len(ps)) for c, ps in self.by_class.items()}
        else:
            unknown = sorted(set(mix) - set(self.by_class))
            if unknown:
                raise ConfigError(f"[bench] mix: no prompt of {self.name} is in class {', '.join(map(repr, unknown))}; "
                                  f"its classes are {', '.join(sorted(self.by_class))}")
            weights = {c: float(w) for c, w in mix.items() if w > 0}
        total = sum(weights.values())
        return {c: w / total for c, w in sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))}

    @property
    def classes(self) -> list[str]:
        """The measured request classes, largest share first."""
        return list(self.mix)

    def single_pass(self, n: int) -> list[Prompt]:
        """One single-stream pass: every class at least once, about `n` x its share, the
        classes interleaved (so a pass cut short still touches them all)."""
        counts = {c: max(1, round(n * w)) for c, w in self.mix.items()}
        picks = {c: self._take(c, "single", k) for c, k in counts.items()}
        out: list[Prompt] = []
        for i in range(max(counts.values())):
            out += [picks[c][i] for c in self.classes if i < len(picks[c])]
        return out

    def for_phase(self, role: str, n: int) -> list[Prompt]:
        """`n` prompts for a phase: the warm-up's from the whole pool, the single stream's by
        `single_pass`, the concurrent phase's drawn in the mix's proportions (each next request
        from the class furthest below its share)."""
        if role == "warmup":
            return [self.prompts[i % len(self.prompts)] for i in range(n)]
        if role == "single":
            return self.single_pass(n)
        sent = {c: 0 for c in self.classes}
        order = []
        for i in range(n):
            c = max(self.classes, key=lambda c: (self.mix[c] * (i + 1) - sent[c], self.mix[c]))
            order.append(c)
            sent[c] += 1
        picks = {c: iter(self._take(c, role, k)) for c, k in sent.items()}
        return [next(picks[c]) for c in order]

    def _take(self, request_class: str, role: str, n: int) -> list[Prompt]:
        """`n` prompts of one class for a phase; phases start at different offsets so they differ."""
        pool = self.by_class[request_class]
        start = {"warmup": 0, "single": len(pool) // 3, "concurrent": 2 * len(pool) // 3}[role]
        return [pool[(start + i) % len(pool)] for i in range(n)]

    def categories(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.prompts:
            out[p.category] = out.get(p.category, 0) + 1
        return out


def _builtin() -> list[Prompt]:
    text = resources.files("tuner.measure").joinpath("workloads/builtin.jsonl").read_text(encoding="utf-8")
    # The built-in set's per-prompt max_tokens are not used: [bench] max_tokens keeps the demo short.
    return [_from_obj(json.loads(line), f"builtin line {i}", per_request=False) for i, line in enumerate(text.splitlines(), 1) if line.strip()]


def load_workload(source: str | Path | SyntheticPrompts | list[SyntheticPrompts], *, seed: int = 0, base_dir: str | Path = ".",
                  mix: dict[str, float] | None = None, context_buckets: list[int] | None = None) -> Workload:
    kwargs: dict[str, Any] = {"seed": seed, "mix": mix, "context_buckets": context_buckets}
    if isinstance(source, (SyntheticPrompts, list)):
        specs = source if isinstance(source, list) else [source]
        return Workload([p for s in specs for p in synthetic(s, seed)], name="synthetic", **kwargs)
    if str(source) == BUILTIN:
        return Workload(_builtin(), name=BUILTIN, **kwargs)
    path = Path(source)
    if not path.is_absolute():
        path = Path(base_dir) / path
    if not path.exists():
        raise ConfigError(f"{_WHERE}: {source} does not exist; give a JSONL or ShareGPT JSON file, or \"builtin\"")
    return Workload(_read(path, str(source)), name=str(source), **kwargs)


def bench_workload(bench: BenchConfig, base_dir: str | Path = ".") -> Workload:
    """The workload `[bench]` describes: its prompts, classes and mix."""
    return load_workload(bench.prompts, seed=bench.seed, base_dir=base_dir, mix=bench.mix, context_buckets=bench.context_buckets)
