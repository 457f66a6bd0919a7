"""Config errors are one line naming the file, section, key and fix."""

import textwrap

import pytest

from tuner.config import load_config, parse_config
from tuner.errors import ConfigError

BASE = """
[study]
name = "s"
[server]
command = "python3 -m sglang.launch_server --model-path m --speculative-algorithm EAGLE3"
"""


def _err(extra: str, base: str = BASE) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(textwrap.dedent(base) + textwrap.dedent(extra), path="x.toml")
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_minimal_config_gets_the_contract_defaults():
    cfg = parse_config(BASE)
    assert cfg.storage_url == "sqlite:///studies/s.db"
    assert cfg.study.objectives == ["single_tps", "concurrent_tps", "capacity"]
    assert cfg.target.host == "local" and cfg.target.manager == "process"
    assert cfg.bench.concurrency_levels == [16] and cfg.bench.request_tokens == "auto"


@pytest.mark.parametrize(
    "extra, expected",
    [
        ("[space]\nspeculative_eagle_topk = { choices = [0, 2] }", "x.toml [space]: speculative_eagle_topk: values must be integers >= 1, got [0]"),
        ("[space]\nmem_fraction_static = { low = 0.9, high = 0.7 }", "x.toml [space] mem_fraction_static: low (0.9) is above high (0.7); swap them"),
        ("[space]\nmem_fraction_static = { low = 0.5, high = 1.2 }", "x.toml [space]: mem_fraction_static: values must lie in (0, 1), got [1.2]"),
        ("[space]\nspeculative_num_draft_tokens = { low = 1, high = 8 }", "x.toml [space]: speculative_num_draft_tokens: low must be >= 2, got 1"),
        ("[bench]\nconcurency = 8", "x.toml [bench] concurency: unknown key; check its spelling against the README's config reference"),
        ("[bench]\nmax_tokens = \"many\"", "x.toml [bench] max_tokens: is the string 'many'; give a whole number"),
        ("[target]\nmanager = \"systemd\"", "x.toml [target]: manager = \"systemd\" needs unit = \"<the service's unit name>\""),
        ("[target]\nurl = \"localhost:30000\"", "x.toml [target] url: 'localhost:30000' is not an http(s) URL like \"http://127.0.0.1:30000\""),
        ("[target]\nhost = \"me@gpu1\"\nidentity_file = \"/no/such/key\"", "x.toml [target] identity_file: /no/such/key does not exist; fix the path"),
        ("[extra]\na = 1", "x.toml: unknown section [extra]; sections are [study], [target], [server], [space], [bench], [constraints], [slo]"),
    ],
)
def test_bad_values_name_the_key_and_the_fix(extra, expected):
    assert _err(extra) == expected


def test_missing_command_and_clear_text_api_key():
    assert _err("", base="[study]\nname = \"s\"\n[server]\n") == "x.toml [server] command: is required"
    msg = _err("", base='[study]\nname = "s"\n[server]\ncommand = "sglang serve --model-path m --api-key abc"\n')
    assert "api_key_env" in msg and "abc" not in msg


def test_speculative_space_without_an_algorithm_is_refused():
    base = '[study]\nname = "s"\n[server]\ncommand = "sglang serve --model-path m"\n'
    assert "has no --speculative-algorithm" in _err("[space]\nspeculative_num_steps = { low = 1, high = 3 }", base=base)


def test_study_name_is_validated():
    assert "not a valid study name" in _err("", base='[study]\nname = "../etc"\n[server]\ncommand = "x"\n')


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="no such config file; pass --config"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[study\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_repo_configs_load():
    for path in ("studies/demo.toml",):
        cfg = load_config(path)
        assert cfg.space.searched


def test_storage_passwords_are_refused():
    from tuner.results.storage import storage_for_url

    with pytest.raises(ConfigError, match="holds a password; keep it out of configs"):
        storage_for_url("postgresql://tuner:hunter2@db.example/optuna")


def test_an_unresolvable_url_host_is_a_config_error():
    assert "cannot resolve host 'no-such-host.invalid'" in _err('[target]\nurl = "http://no-such-host.invalid:30000"')
