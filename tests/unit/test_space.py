"""The search space follows SGLang's rules on every sampled trial."""

import optuna
import pytest

from tuner.config import parse_config
from tuner.search.space import draft_token_bounds, grid, suggest
from tuner.sglang_args import CommandLine, Params

CONFIG = """
[study]
name = "s"
[server]
command = "sglang serve --model-path m --speculative-algorithm EAGLE3 --speculative-num-steps 3 --mem-fraction-static 0.8"
[space]
speculative_num_steps = { low = 1, high = 6 }
speculative_eagle_topk = { choices = [1, 2, 4] }
speculative_num_draft_tokens = { low = 2, high = 16 }
mem_fraction_static = { low = 0.70, high = 0.92, step = 0.01 }
"""


@pytest.mark.parametrize("bound", ["sweep", "tree"])
def test_sampled_trials_obey_sglangs_rules(bound):
    cfg = parse_config(CONFIG.replace("[space]", f"[space]\ndraft_tokens_bound = \"{bound}\""))
    study = optuna.create_study(directions=["maximize"], sampler=optuna.samplers.RandomSampler(seed=1))
    base = cfg.server.command_line.params()
    for _ in range(400):
        trial = study.ask()
        p = suggest(trial, cfg.space, base)
        assert p.speculative_num_steps is not None and p.speculative_eagle_topk is not None and p.speculative_num_draft_tokens is not None
        if p.speculative_eagle_topk == 1:
            assert p.speculative_num_draft_tokens == p.speculative_num_steps + 1
            assert "speculative_num_draft_tokens" not in trial.params
        else:
            low, high = draft_token_bounds(p.speculative_num_steps, p.speculative_eagle_topk, bound)
            assert 2 <= p.speculative_num_draft_tokens <= min(high, 16)
            assert trial.params["speculative_num_draft_tokens"] == p.speculative_num_draft_tokens
        assert 0.70 <= p.mem_fraction_static <= 0.92
        assert round(p.mem_fraction_static, 2) == p.mem_fraction_static
        study.tell(trial, 1.0)


def test_all_three_speculative_flags_are_always_passed():
    flags = Params(2, 1, 3, 0.85).flags()
    assert flags == ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3", "--mem-fraction-static", "0.85"]


def test_unsearched_keys_come_from_the_command():
    cfg = parse_config(CONFIG.split("[space]")[0] + "[space]\nspeculative_eagle_topk = { choices = [1] }\n")
    trial = optuna.create_study().ask()
    p = suggest(trial, cfg.space, cfg.server.command_line.params())
    assert p == Params(3, 1, 4, 0.8)


def test_params_from_argv_reads_both_spellings():
    assert CommandLine.parse(["x", "--speculative-num-steps=2", "--mem-fraction-static", "0.9"]).params() == Params(2, None, None, 0.9)


def test_grid_counts_trees_within_the_sweep_bound():
    cfg = parse_config(CONFIG)
    points = grid(cfg.space, Params(), mfs_values=[0.8])
    # topk 1: 6 chains; topk 2: sum over steps of (2*s+1 - 1); topk 4: min(4s+1,16) - 1
    expected = 6 + sum(2 * s for s in range(1, 7)) + sum(min(4 * s + 1, 16) - 1 for s in range(1, 7))
    assert len(points) == expected


def test_a_space_that_changes_form_between_runs_is_refused():
    from tuner.errors import ConfigError
    from tuner.search.space import check_compatible

    study = optuna.create_study(directions=["maximize"])
    cfg = parse_config(CONFIG)
    trial = study.ask()
    suggest(trial, cfg.space, Params())
    study.tell(trial, 1.0)
    check_compatible(cfg.space, study)  # same space: fine
    changed = parse_config(CONFIG.replace("speculative_eagle_topk = { choices = [1, 2, 4] }", "speculative_eagle_topk = { choices = [1, 2] }"))
    with pytest.raises(ConfigError, match=r"\[space\] speculative_eagle_topk: study .* already samples it as choices \[1, 2, 4\]"):
        check_compatible(changed.space, study)
    wider = parse_config(CONFIG.replace("high = 6", "high = 8"))
    check_compatible(wider.space, study)  # a wider range is still a range
