"""SGLang's command line as SGLang's argparse reads it: one parser for every reader and editor."""

import pytest

from tuner.errors import ConfigError
from tuner.sglang_args import CommandLine, Params

BASE = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "4"]


def test_abbreviations_resolve_like_argparse():
    cmd = CommandLine.parse([*BASE, "--mem-frac", "0.8", "--speculative-algo", "eagle3", "--speculative-num-st", "4"])
    assert cmd.get("mem_fraction_static") == "0.8"
    assert cmd.algorithm == "EAGLE3"
    assert cmd.params() == Params(4, None, None, 0.8)


def test_ambiguous_or_unknown_abbreviations_are_left_for_sglang_to_reject():
    cmd = CommandLine.parse([*BASE, "--cuda-graph-max-bs", "8", "--no-such-flag", "1"])
    assert [o.name for o in cmd.options][-2:] == ["--cuda-graph-max-bs", "--no-such-flag"]
    assert cmd.argv() == [*BASE, "--cuda-graph-max-bs", "8", "--no-such-flag", "1"]


def test_equals_spelling_repeats_and_multi_value_options():
    cmd = CommandLine.parse([*BASE, "--mem-fraction-static=0.7", "--cuda-graph-bs", "1", "2", "4", "--mem-fraction-static", "0.9"])
    assert cmd.get("mem_fraction_static") == "0.9"  # the last one wins
    assert [o.values for o in cmd.options if o.name == "--cuda-graph-bs"] == [("1", "2", "4")]


def test_trial_flags_replace_every_spelling_of_the_searched_flags():
    cmd = CommandLine.parse([*BASE, "--speculative-algorithm", "NEXTN", "--mem-frac=0.7", "--speculative-num-steps", "1", "--enable-metrics"])
    argv = cmd.with_params(Params(3, 1, None, 0.85)).argv()
    assert argv == [*BASE, "--speculative-algorithm", "NEXTN", "--enable-metrics",
                    "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--mem-fraction-static", "0.85"]


def test_no_speculation_really_has_no_speculative_option_left():
    cmd = CommandLine.parse([*BASE, "--speculative-algo", "EAGLE", "--speculative-draft-model-path", "d",
                             "--speculative-num-steps=3", "--enable-metrics"])
    off = cmd.without_speculation()
    assert off.argv() == [*BASE, "--enable-metrics"]
    assert off.algorithm is None and not off.params().speculative


def test_config_file_is_merged_under_the_command_line():
    cmd = CommandLine.parse([*BASE, "--config", "/etc/sglang.yaml", "--mem-fraction-static", "0.8"])
    yaml_text = "speculative-algorithm: EAGLE3\nmem-fraction-static: 0.9\nspeculative_num_steps: 5\nenable-metrics: true\ncuda-graph-bs: [1, 2]\n"
    merged = cmd.with_config_file(lambda path: yaml_text if path == "/etc/sglang.yaml" else "")
    assert merged.get("mem_fraction_static") == "0.8"  # the command line wins
    assert merged.algorithm == "EAGLE3" and merged.params().speculative_num_steps == 5
    assert merged.has("enable_metrics") and not merged.has("config")


def test_unreadable_config_file_is_one_clear_error():
    cmd = CommandLine.parse([*BASE, "--config", "/nope.yaml"])

    def read(path):
        raise OSError("No such file or directory")

    with pytest.raises(ConfigError, match=r"--config /nope.yaml: cannot read it .*put its options on the command line"):
        cmd.with_config_file(read)


@pytest.mark.parametrize("flags,needs", [
    ("--speculative-num-steps 3", "needs --speculative-eagle-topk"),
    ("--speculative-eagle-topk 2", "set --speculative-num-steps as well"),
    ("--speculative-num-draft-tokens 4", "set --speculative-num-steps as well"),
    ("--speculative-num-steps 3 --speculative-eagle-topk 2", "needs --speculative-num-draft-tokens"),
    ("--speculative-num-steps 3 --speculative-eagle-topk 1", None),  # SGLang sets a chain's draft tokens itself
    ("--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8", None),
    ("", None),  # SGLang picks all three
])
def test_speculative_flags_sglang_cannot_start_with_are_named_with_the_missing_one(flags, needs):
    # SGLang 0.5.23 (speculative_hook.py · _handle_eagle_family): steps without topk is a
    # TypeError, topk or draft without steps a bare AssertionError, at start-up.
    command = CommandLine.split("python -m sglang.launch_server --model-path m --speculative-algorithm EAGLE3 " + flags)
    problem = command.incomplete_speculation()
    assert (problem is None) if needs is None else (needs in problem)
    assert CommandLine.split("python -m sglang.launch_server --model-path m " + flags).incomplete_speculation() is None
