"""SGLang 0.5.23's argument handling, as the emulator reproduces it."""

import pytest

from sglang_emulator.args import parse_args, resolve
from sglang_emulator.profiles import PROFILES, find_profile

QWEN = PROFILES["qwen3.5-122b-a10b"]


def _resolve(*flags, profile=QWEN):
    return resolve(parse_args(["--model-path", "Qwen/Qwen3.5-122B-A10B", *flags]), profile)


def test_tp_is_an_abbreviation_of_tp_size_and_algo_of_algorithm():
    ns = parse_args(["--model", "m", "--tp", "4", "--speculative-algo", "nextn"])
    assert ns.tp_size == 4 and ns.speculative_algorithm == "nextn"


def test_cuda_graph_max_bs_is_ambiguous(capsys):
    with pytest.raises(SystemExit) as exit:
        parse_args(["--model-path", "m", "--cuda-graph-max-bs", "8"])
    assert exit.value.code == 2
    assert "ambiguous option: --cuda-graph-max-bs could match" in capsys.readouterr().err


def test_auto_parameters_and_partial_sets():
    r = _resolve("--speculative-algorithm", "NEXTN")
    assert (r.spec.algorithm, r.spec.steps, r.spec.topk, r.spec.draft_tokens) == ("EAGLE", 3, 1, 4)
    assert r.max_running_requests == 48
    with pytest.raises(AssertionError):
        _resolve("--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "4")
    with pytest.raises(TypeError):
        _resolve("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2")


def test_topk_one_forces_draft_tokens_with_the_warning():
    r = _resolve("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "9")
    assert r.spec.draft_tokens == 3
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1" in r.warnings


def test_explicit_max_running_requests_is_kept():
    r = _resolve("--speculative-algorithm", "EAGLE", "--max-running-requests", "64")
    assert r.max_running_requests == 64 and not r.warnings


def test_page_size_with_tree_needs_a_tree_backend():
    with pytest.raises(ValueError, match="only supported on"):
        _resolve("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                 "--speculative-num-draft-tokens", "5", "--page-size", "16", "--attention-backend", "flashmla")
    ok = _resolve("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                  "--speculative-num-draft-tokens", "5", "--page-size", "16", "--attention-backend", "fa3")
    assert ok.page_size == 16


def test_ngram_and_adaptive_resolution():
    ngram = _resolve("--speculative-algorithm", "NGRAM")
    assert (ngram.spec.topk, ngram.spec.draft_tokens, ngram.spec.steps) == (10, 12, 1)
    adaptive = _resolve("--speculative-algorithm", "EAGLE", "--speculative-adaptive")
    assert adaptive.adaptive and adaptive.spec.steps == 3 and adaptive.spec.topk == 1
    with pytest.raises(ValueError, match="is not in the adaptive config candidate_steps"):
        _resolve("--speculative-algorithm", "EAGLE", "--speculative-adaptive", "--speculative-num-steps", "2")


def test_profiles_are_found_by_model_path():
    assert find_profile("/models/Qwen3.5-122B-A10B").key == "qwen3.5-122b-a10b"
    assert find_profile("meta-llama/Llama-3.1-8B-Instruct").key == "llama-3.1-8b-instruct"
    assert find_profile("some/other-model") is None


@pytest.mark.parametrize("value,expected", [("1024", 1024), ("128k", 128000), ("32Ki", 32768), ("25.6k", 25600)])
def test_context_length_is_read_as_sglang_reads_it(value, expected):
    # 0.5.23 parses it with human_readable_int; read as a string, the length check compared an
    # int with a str and the server never became healthy.
    assert parse_args(["--model-path", "m", "--context-length", value]).context_length == expected


def test_a_context_length_sglang_cannot_read_is_argparses_error(capsys):
    with pytest.raises(SystemExit) as exit:
        parse_args(["--model-path", "m", "--context-length", "abc"])
    assert exit.value.code == 2
    assert "argument --context-length: invalid human_readable_int value: 'abc'" in capsys.readouterr().err
