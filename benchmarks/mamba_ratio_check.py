"""Does the model sampler need `--mamba-full-memory-ratio`?  It fits a hybrid's pools in SGLang's
form with r = 0.9 (SGLang's fallback, `tuner/search/model.py · _MAMBA_SHARE`).  This builds three
started launches from the emulator's own memory physics (Qwen3.5-122B-A10B MTP, tp 4) at another
r, fits the model, and prints the predicted capacity (running requests; requests of 4,096
tokens) at unlaunched shapes and fractions beside the truth.

The fitted form absorbs r (the launches fix s / share and cell / (1 - share), not r), so the
error does not grow as r moves away from 0.9; a variant that read r from /server_info gave the
same predictions to the request (2026-12-01) and was not kept.
`python benchmarks/mamba_ratio_check.py`."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optuna.distributions import FloatDistribution  # noqa: E402
from optuna.trial import TrialState, create_trial  # noqa: E402

from sglang_emulator import model as EM  # noqa: E402
from sglang_emulator.profiles import PROFILES  # noqa: E402
from tuner.results import record  # noqa: E402
from tuner.search import model as M  # noqa: E402

QWEN = PROFILES["qwen3.5-122b-a10b"]
CHUNK, MAX_BS = EM.default_graph_settings(QWEN.gpu.total_mib, QWEN.reference_tp)
LAUNCHED = ((2, 0.85), (3, 0.88), (5, 0.85))  # (steps of a chain, mem_fraction_static)
ASKED = ((4, 0.91), (6, 0.91), (1, 0.92), (3, 0.93))


def plan(ratio: float, steps: int, mfs: float) -> EM.MemoryPlan:
    profile = dataclasses.replace(QWEN, memory=dataclasses.replace(QWEN.memory, mamba_full_memory_ratio=ratio))
    return EM.size_memory(profile, tp=4, dp=1, mem_fraction_static=mfs, spec=EM.SpecShape("EAGLE", steps, 1, steps + 1),
                          max_running_requests=48, max_total_tokens=None, chunked_prefill_size=CHUNK, cuda_graph_max_bs=min(MAX_BS, 48))


def trial(ratio: float, steps: int, mfs: float):
    p = plan(ratio, steps, mfs)
    accept = 1 + sum(0.8 ** j for j in range(1, steps + 1))
    reach = [1.0] + [0.8 ** j for j in range(1, steps + 1)] + [0.0]
    usage = {"weight": round(p.weights_gib, 2), "kvcache": round(p.kv_gib + p.mamba_gib, 2), "token_capacity": p.max_total_num_tokens,
             "startup_available": round(p.available_after_capture_gib, 2), "graph": {n: round(v, 2) for n, v in p.graph_gib.items()}}
    attrs = {record.FLAGS: {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": None,
                            "mem_fraction_static": mfs},
             record.MAX_TOTAL_NUM_TOKENS: p.max_total_num_tokens, record.MAX_RUNNING_REQUESTS: p.max_running_requests,
             record.DECLARED_MAX_RUNNING: 48, record.ACCEPT_LENGTH: accept, record.REQUEST_TOKENS: 4096,
             record.ARCHITECTURE: QWEN.architecture, "concurrent_tps_by_level": {"16": 1000 * accept},
             record.ACCEPT_HISTOGRAM: [int(1000 * (reach[k] - reach[k + 1])) for k in range(steps + 1)], record.MEMORY_USAGE: usage}
    values = [accept / (10 + 0.3 * steps) * 1000, 16 * accept / (12 + 0.5 * steps) * 1000,
              min(p.max_running_requests, p.max_total_num_tokens // 4096)]
    return create_trial(state=TrialState.COMPLETE, values=values, params={"mem_fraction_static": mfs},
                        distributions={"mem_fraction_static": FloatDistribution(0.8, 0.95)}, user_attrs=attrs)


def main() -> None:
    print(f"launched: {', '.join(f'steps {s} at {m}' for s, m in LAUNCHED)} (chains)\n")
    print("| --mamba-full-memory-ratio | steps | mem | running requests (truth) | predicted (model assumes 0.9) |")
    print("|---|---|---|---|---|")
    for ratio in (0.1, 0.5, 0.9, 3.0):
        model, why = M.fit([trial(ratio, s, m) for s, m in LAUNCHED], ["single_tps", "concurrent_tps", "capacity"])
        assert model is not None, why
        for steps, mfs in ASKED:
            got = int(model.predict([steps], [1], [steps + 1], [mfs]).capacity[0])
            print(f"| {ratio} | {steps} | {mfs} | {plan(ratio, steps, mfs).max_running_requests} | {got} |")


if __name__ == "__main__":
    main()
