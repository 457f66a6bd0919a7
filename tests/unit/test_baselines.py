"""Baselines and the warm start, on the operator's command."""

import optuna

from tuner.results.baselines import baseline_argv
from tuner.sglang_args import family_default
from tuner.config import parse_config
from tuner.search.warm_start import warm_start

CMD = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3.5-122B-A10B", "--tp", "4",
       "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
       "--speculative-num-draft-tokens", "3", "--mem-fraction-static", "0.85", "--enable-metrics"]


def test_no_speculation_removes_every_speculative_flag_and_keeps_the_rest():
    assert baseline_argv(CMD, "no_speculation") == ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3.5-122B-A10B",
                                                    "--tp", "4", "--mem-fraction-static", "0.85", "--enable-metrics"]


def test_adaptive_keeps_the_algorithm_and_lets_sglang_choose_steps():
    argv = baseline_argv(CMD, "adaptive")
    assert argv[-1] == "--speculative-adaptive" and "--speculative-algorithm" in argv
    assert not any(a in argv for a in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"))
    ngram = [a if a != "NEXTN" else "NGRAM" for a in CMD]
    assert baseline_argv(ngram, "adaptive") is None  # SGLang runs adaptive for EAGLE/EAGLE3 only


def test_family_defaults_follow_sglangs_auto_choice():
    assert family_default("Qwen3_5MoeForConditionalGeneration") == (3, 1, 4)
    assert family_default("LlamaForCausalLM") == (5, 4, 8)
    assert family_default("Grok1ForCausalLM") == (5, 4, 8)
    assert family_default("Llama4ForConditionalGeneration") == (3, 1, 4)
    assert family_default("LlamaForCausalLM", "STANDALONE") == (3, 1, 4)


def test_warm_start_queues_the_current_config_and_sglangs_default_inside_the_space():
    cfg = parse_config('[study]\nname = "s"\n[server]\ncommand = "' + " ".join(CMD) + '"\n[space]\n'
                       'speculative_num_steps = { low = 1, high = 6 }\nspeculative_eagle_topk = { choices = [1, 2, 4] }\n'
                       'mem_fraction_static = { low = 0.70, high = 0.92, step = 0.01 }\n')
    study = optuna.create_study(directions=["maximize"] * 3)
    queued = warm_start(cfg, study)
    assert queued == [{"speculative_num_steps": 2, "speculative_eagle_topk": 1}, {"speculative_num_steps": 3, "speculative_eagle_topk": 1}]
    assert warm_start(cfg, study) == []  # only a new study is warm-started
