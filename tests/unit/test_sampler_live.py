"""benchmarks/sampler_live.py's scoring, on a study written by hand (no server): the report of a
run's journal, and the truth of the prompts a study sent beside the truth of the mix."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("sampler_live", _ROOT / "benchmarks" / "sampler_live.py")
S = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("sampler_live", S)
_spec.loader.exec_module(S)


def _study(tmp_path: Path, flags: list[dict]) -> dict:
    """One qwen-demo study as a run journals it: its config (the demo's [bench]), its trials."""
    lands = S.landscape("qwen-demo")
    srv = S.served(lands.spec, lands, 0, tmp_path)
    config = S.write_config(tmp_path, lands.spec, srv, 40000, name="live-model-0")
    trials = [{"number": i, "state": "COMPLETE", "kind": "launch", "flags": f, "failure_kind": None,
               "true_feasible": True, "true_failure": None, "true": list(lands.expect(S.Params(**f)).values()),
               "measured": list(lands.expect(S.Params(**f)).values()), "p_start": None} for i, f in enumerate(flags)]
    return {"landscape": "qwen-demo", "sampler": "model", "seed": 0, "config": config.read_text(),
            "run": {"seconds": 60.0}, "trials": trials, "at": {10: S.at_budget(trials, lands)}, "ok": True}


def test_a_runs_journal_reports_both_truths(tmp_path, capsys):
    # A run killed before its report leaves only <out>.studies.jsonl; --merge reports from it,
    # and every study is scored on the mix's truth and on the truth of the prompts it sent.
    lands = S.landscape("qwen-demo")
    best = max(lands.front, key=lambda k: lands.front[k][0])  # the front's single-stream end
    flags = [dict(zip(("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                       "mem_fraction_static"), best))]
    journal = tmp_path / "run.studies.jsonl"
    journal.write_text(json.dumps(_study(tmp_path, flags)) + "\n")
    assert S.main(["--merge", str(journal), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "HV@10 sent prompts" in report and "| qwen-demo | model |" in report
    cell = json.loads((tmp_path / "report.json").read_text())["cells"]["qwen-demo | model"]
    assert 0 < cell["hv"]["10"]["mean"] < 1 and 0 < cell["hv_prompts"]["10"]["mean"] < 1


def test_the_demos_single_stream_prompts_are_not_the_mix(tmp_path):
    # The truth of the sent prompts differs from the mix's: the demo's few single-stream
    # prompts have their own acceptance, and the score follows them.
    lands = S.landscape("qwen-demo")
    single, concurrent = S.sent_prompts(lands, _study(tmp_path, [])["config"])
    assert single.shifts and concurrent.shifts and len(concurrent.shifts) > len(single.shifts)
    truth = S.landscape("qwen-demo", prompts=(single, concurrent))
    p = S.Params(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                 mem_fraction_static=0.85)
    assert truth.expect(p).single_tps != pytest.approx(lands.expect(p).single_tps, rel=0.01)


def test_a_drawn_landscape_with_another_capture_reserve_is_served_as_that_draw(tmp_path, monkeypatch):
    # `--capture-reserve 0.12`: the emulator must serve the overridden draw, not the seed's own
    # (served() checks what the emulator would serve against the landscape and raises otherwise).
    from types import SimpleNamespace
    from sglang_emulator.profiles import LANDSCAPE_SEED_ENV, PROFILE_ENV, profile_from_dict

    monkeypatch.setattr(S.offline, "CAPTURE_RESERVE", None)  # parse_args sets it; restored after the test
    S.parse_args(["--landscapes", "family:2", "--capture-reserve", "0.12"])
    assert S.offline.CAPTURE_RESERVE == 0.12
    spec = S.landscape_spec("family:2")
    srv = S.served(spec, SimpleNamespace(profile=profile_from_dict(spec.profile)), 0, tmp_path)
    assert LANDSCAPE_SEED_ENV not in srv.env
    assert json.loads(Path(srv.env[PROFILE_ENV]).read_text())["memory"]["capture_reserve_frac"] == 0.12
    with pytest.raises(SystemExit):
        S.parse_args(["--capture-reserve", "12"])  # a share, not a percentage


def test_the_report_shows_how_far_measurements_scatter_around_the_truth_of_the_sent_prompts(tmp_path):
    # What the replay's --noise stands for: a study measuring every shape at one scale of its
    # truth scatters 0%; one whose concurrent rate is 5% off either way, alternately, 5%.
    lands = S.landscape("qwen-demo")
    flags = [dict(zip(("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                       "mem_fraction_static"), k)) for k in list(lands.front)[:4]]
    study = _study(tmp_path, flags)
    truth = S.landscape("qwen-demo", prompts=S.sent_prompts(lands, study["config"]))
    for i, t in enumerate(study["trials"]):
        single, concurrent, capacity = truth.expect(S.Params(**t["flags"])).values()
        t["measured"] = [1.2 * single, 0.8 * concurrent * (1.05 if i % 2 else 0.95), capacity]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in S._scatter([study]) if line.startswith("| qwen")}
    assert rows["qwen-demo"] == ["4", "0.0%", "5.0% |"]
