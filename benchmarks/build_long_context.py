"""Rebuild the built-in set's long_context class: 16 prompts of ~16k tokens each.

Each prompt is one of the 42 long documents (reports, logs, contracts, ticket exports, API
references, transcripts; ~4k tokens each, kept in benchmarks/data/long_context_excerpts.jsonl)
with its question, after three others given as earlier context of the same session: the kind of
request a retrieval or agent workload sends.  Run once
after editing the excerpts; prints each prompt's token count (words and punctuation marks,
the count `tuner.measure.workload.estimate_tokens` and the emulator use).

    python benchmarks/build_long_context.py
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = ROOT / "tuner" / "measure" / "workloads" / "builtin.jsonl"
SOURCE = ROOT / "benchmarks" / "data" / "long_context_excerpts.jsonl"  # the ~4k-token excerpts
PROMPTS, PER_PROMPT = 16, 4


def build(excerpts: list[dict]) -> list[dict]:
    """Prompt i: three other excerpts as earlier context, then excerpt i's own document and
    question (its system message, if any, kept first)."""
    out = []
    for i in range(PROMPTS):
        asked = excerpts[(i * len(excerpts)) // PROMPTS]
        others = [excerpts[(i * 5 + k * 7 + 1) % len(excerpts)] for k in range(PER_PROMPT - 1)]
        others = [o for o in others if o is not asked]
        context = "\n\n".join(f"=== Earlier document {k + 1} ===\n{o['messages'][-1]['content']}" for k, o in enumerate(others))
        task = asked["messages"][-1]["content"]
        user = ("Earlier in this session you were given the documents below with questions about them; they are "
                f"context only, already answered.\n\n{context}\n\n=== The request to answer now ===\n{task}")
        messages = [*asked["messages"][:-1], {"role": "user", "content": user}]
        out.append({"id": f"long_context-{i + 1:03d}", "category": "long_context", "messages": messages, "max_tokens": 900})
    return out


def main() -> None:
    lines = BUILTIN.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if json.loads(line)["category"] != "long_context"]
    if not SOURCE.exists():  # first run: the ~4k excerpts move out of the built-in set
        SOURCE.parent.mkdir(exist_ok=True)
        SOURCE.write_text("\n".join(line for line in lines if json.loads(line)["category"] == "long_context") + "\n", encoding="utf-8")
    excerpts = [json.loads(line) for line in SOURCE.read_text(encoding="utf-8").splitlines() if line.strip()]
    built = build(excerpts)
    BUILTIN.write_text("\n".join(kept + [json.dumps(p, ensure_ascii=False) for p in built]) + "\n", encoding="utf-8")
    counts = [len(re.findall(r"\w+|[^\w\s]", " ".join(m["content"] for m in p["messages"]))) for p in built]
    print(f"{len(built)} long_context prompts: tokens min {min(counts):,}, median {statistics.median(counts):,.0f}, max {max(counts):,}")


if __name__ == "__main__":
    main()
