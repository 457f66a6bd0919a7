"""The CUDA-graph capture lines a server logs, runner by runner, in SGLang's own wording.

Each runner logs the free memory before its capture and, once captured, what it used and what
is left, so a client can read the memory of a launch that failed halfway (issue #23).
0.5.23: `model_executor/model_runner_components/cuda_graph_setup.py · capture_decode_graph`
(target) and `speculative/eagle_worker_v2.py` (draft decode, draft extend).  0.5.9:
`model_executor/model_runner.py · init_device_graphs` and `speculative/eagle_worker.py`,
plus `cuda_graph_runner.py`'s "Capture cuda graph bs [...]".
"""

from __future__ import annotations

from . import model as m

__all__ = ["capture_lines"]

_RUNNER_0_5_9 = {"target_verify": "", "decode": "", "draft_decode": "draft ", "draft_extend": "draft extend "}


def _runners(spec: m.SpecShape) -> list[tuple[str, str, int]]:
    """(runner, 0.5.23 name, tokens per request) in capture order."""
    if not spec.enabled:
        return [("decode", "target decode", 1)]
    out = [("target_verify", "target verify", spec.draft_tokens)]
    if spec.steps > 1 and spec.algorithm != "NGRAM":
        out.append(("draft_decode", "draft decode", spec.topk))
    if spec.algorithm != "NGRAM":
        out.append(("draft_extend", "draft extend", spec.draft_tokens))
    return out


def capture_lines(spec: m.SpecShape, graphs: dict[str, float], capture_bs: tuple[int, ...], avail_gib: float, *,
                  failed_runner: str | None, version: str, elapsed_s: float) -> list[str]:
    """The begin/end lines up to the runner that fails (its begin line only), or all of them."""
    bs = list(capture_bs)
    lines = [f"Capture cuda graph bs {bs}"] if version == "0.5.9" else []
    avail = max(avail_gib, 0.0)  # free memory, as the driver reports it: never below zero
    for runner, name, tokens in _runners(spec):
        used = graphs.get(runner, 0.0)
        if version == "0.5.9":
            lines.append(f"Capture {_RUNNER_0_5_9[runner]}cuda graph begin. This can take up to several minutes. avail mem={avail:.2f} GB")
            if runner == failed_runner:
                break
            lines.append(f"Capture {_RUNNER_0_5_9[runner]}cuda graph end. Time elapsed: {elapsed_s:.2f} s. "
                         f"mem usage={used:.2f} GB. avail mem={max(avail - used, 0.0):.2f} GB.")
        else:
            draft_bs = f"bs={bs}, " if runner.startswith("draft") else ""
            lines.append(f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={tokens}, {draft_bs}avail mem={avail:.2f} GB")
            if runner == failed_runner:
                break
            target_bs = "" if runner.startswith("draft") else f"bs={bs}, "
            lines.append(f"Capture {name} CUDA graph end. {target_bs}elapsed={elapsed_s:.2f} s, "
                         f"mem usage={used:.2f} GB, avail mem={max(avail - used, 0.0):.2f} GB.")
        avail = max(avail - used, 0.0)
    return lines
