"""The operator's console (#18): storage errors as one line, no side effects of read-only
commands, help with defaults, the installed script named as itself."""

from __future__ import annotations

import argparse
import json
import sqlite3
import warnings

import optuna
import pytest

from tuner import bench, best, dashboard, optimize, report
from tuner.bench import blame_flags
from tuner.config import apply_overrides, parse_config
from tuner.errors import ConfigError
from tuner.results.storage import open_storage, storage_for_url

CONFIG = '[study]\nname = "s"\n{storage}\n[server]\ncommand = "python -m sglang_emulator --model-path m --speculative-algorithm NEXTN"\n'


def _config(storage: str | None = None, flag: str | None = None):
    cfg = parse_config(CONFIG.format(storage=f'storage = "{storage}"' if storage else ""), path="studies/x.toml")
    return apply_overrides(cfg, study_name=None, storage=flag)


def test_an_unsupported_driver_is_one_line_naming_the_flag():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no FutureWarning on the way either
        with pytest.raises(ConfigError, match=r"^--storage: 'mysql://u@localhost/x' is not a store the tuner supports; use sqlite"):
            open_storage(_config(flag="mysql://u@localhost/x"))


def test_a_missing_sqlite_folder_is_an_error_and_nothing_is_created(tmp_path):
    url = f"sqlite:///{tmp_path}/nowhere/deeper/x.db"
    with pytest.raises(ConfigError, match=r"studies/x.toml \[study\] storage: folder .*nowhere/deeper does not exist"):
        open_storage(_config(storage=url))
    assert not (tmp_path / "nowhere").exists()


def test_a_corrupt_store_is_one_line(tmp_path):
    (tmp_path / "bad.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigError, match=r"--storage: .*bad.db is damaged \(file is not a database\); restore it from a backup"):
        open_storage(_config(flag=f"sqlite:///{tmp_path}/bad.db"))
    other = tmp_path / "other.db"  # a sqlite file of another program
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE studies (x TEXT)")
    with pytest.raises(ConfigError, match="not a usable Optuna store"):
        open_storage(_config(flag=f"sqlite:///{other}"))


def test_the_password_error_names_the_config_file():
    with pytest.raises(ConfigError, match=r"^studies/x.toml \[study\] storage: the URL holds a password"):
        open_storage(_config(storage="postgresql://tuner:hunter2@db.example/optuna"))


def test_heartbeat_storage_uses_the_current_optuna_api_without_deprecation_warnings(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        storage = storage_for_url(f"sqlite:///{tmp_path}/hb.db", heartbeat_s=30)
    assert isinstance(storage, optuna.storages.RDBStorage)


def test_read_only_commands_never_create_a_store(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(storage=f'storage = "sqlite:///{tmp_path}/none.db"'))
    assert dashboard.main(["--config", str(config), "--port", "0"]) == 2
    assert "none.db: no such study database" in capsys.readouterr().err
    assert best.main(["--config", str(config), "--list"]) == 2
    assert not (tmp_path / "none.db").exists()


def test_best_list_names_every_study_with_counts_and_best_figures(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, directions=["maximize", "maximize"])
    study.set_metric_names(["single_tps", "capacity"])
    study.add_trial(optuna.trial.create_trial(values=[100.0, 7.0]))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED))
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(storage=f'storage = "{url}"'))
    assert best.main(["--config", str(config), "--list", "--json"]) == 0
    import json

    (row,) = json.loads(capsys.readouterr().out)
    assert row == {"study": "s", "trials": {"complete": 1, "pruned": 1}, "best": {"single_tps": 100.0, "capacity": 7.0}}


@pytest.mark.parametrize("module", [optimize, bench, best, dashboard, report], ids=lambda m: m.__name__)
def test_every_flag_has_help_and_states_its_default(module):
    p = module.build_parser()
    assert not p.description.startswith(("`", "python -m")), p.description
    text = p.format_help()
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{module.__name__} {action.option_strings} has no help"
        if action.default not in (None, False):
            assert "default" in p._get_formatter()._get_help_string(action), action.option_strings
    assert "(default: studies/demo.toml)" in " ".join(text.split())


def test_the_installed_script_names_itself(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/sglang-tuner", "--help"])
    assert optimize.build_parser().format_usage().startswith("usage: sglang-tuner ")


def test_bench_blames_the_flag_given_in_flags():
    reason = "the server rejects argument(s) --speculative-bogus 3; remove them from [server] command"
    assert blame_flags(reason, "--speculative-bogus 3").endswith("remove them from --flags")
    assert blame_flags(reason, "--tp 2").endswith("[server] command")


def test_baselines_are_shown_under_their_label_outside_the_trial_counter(tmp_path):
    import io

    from rich.console import Console

    from tuner.progress import RichReporter

    cfg = _config(storage=f"sqlite:///{tmp_path}/r.db")
    study = optuna.create_study(study_name="s", storage=cfg.storage_url, directions=["maximize"] * 3)
    study.set_metric_names(["single_tps", "concurrent_tps", "capacity"])
    console = Console(file=io.StringIO(), width=200)
    reporter = RichReporter(console)
    reporter.run_started(study, cfg, 2)
    base = optuna.trial.create_trial(values=[60.0, 500.0, 50.0], user_attrs={"baseline": "no_speculation"})
    reporter.baseline_started("no_speculation", "python -m x")
    assert reporter.progress.tasks[0].description == "baseline no speculation"
    reporter.baseline_finished(base)
    assert reporter.progress.tasks[0].completed == 0
    assert "baseline  no speculation" in console.file.getvalue()
    assert "left" in reporter.progress.tasks[0].fields["eta"]  # the estimated remaining time


def _study_with_arms(tmp_path):
    url = f"sqlite:///{tmp_path}/b.db"
    names = ["single_tps", "concurrent_tps", "capacity"]
    study = optuna.create_study(study_name="s", storage=url, directions=["maximize"] * 3)
    study.set_metric_names(names)
    flags = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "mem_fraction_static": 0.9}
    study.add_trial(optuna.trial.create_trial(values=[180.0, 1200.0, 24.0], user_attrs={"flags": flags}))
    sibling = optuna.create_study(study_name="s@baselines", storage=url, directions=["maximize"] * 3)
    sibling.add_trial(optuna.trial.create_trial(values=[60.0, 500.0, 50.0], user_attrs={"baseline": "no_speculation"}))
    sibling.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL,
                                                user_attrs={"baseline": "adaptive", "fail_reason": "interrupted"}))
    return study


def test_a_baseline_that_is_not_complete_is_measured_again(tmp_path):
    from tuner.results import baselines

    study = _study_with_arms(tmp_path)
    have = baselines.load(optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/b.db"), "s")
    assert baselines.missing(have, _config().server.command_line) == ["adaptive"]


def test_the_report_and_the_dashboard_note_show_the_baseline_arms(tmp_path):
    from tuner.results import baselines
    from tuner.results.report import build

    study = _study_with_arms(tmp_path)
    report = build(study)
    assert [row[:2] for row in report.baselines.rows] == [["no speculation", "complete"], ["adaptive", "fail"]]
    assert any(line.startswith("over no speculation: single_tps 180.0 vs 60.0 (+200%)") for line in report.over_baselines)
    assert "adaptive: not measured (interrupted); measured again on the next run" in report.over_baselines
    arms = baselines.load(optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/b.db"), "s")
    note = baselines.study_note(study, arms)
    assert "| no speculation | COMPLETE | 60.0 | 500.0 | 50.0 |" in note and "over no speculation" in note


def test_a_baseline_failure_reason_prints_its_brackets(tmp_path, capsys):
    """A reason naming a config section ("fix [server] command") is text, not console markup:
    the section used to vanish from the line under the baselines table."""
    import io

    from rich.console import Console

    from tuner import output
    from tuner.study import RunResult
    from tuner.measure.objectives import load_objectives
    from tuner.results import baselines

    study = _study_with_arms(tmp_path)
    sibling = optuna.load_study(study_name="s@baselines", storage=f"sqlite:///{tmp_path}/b.db")
    sibling.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs={
        "baseline": "adaptive", "fail_reason": "python has no module sglang; fix the interpreter in [server] command"}))
    arms = baselines.load(optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/b.db"), "s")
    result = RunResult(study=study, objectives=load_objectives(["single_tps", "concurrent_tps", "capacity"], [16]), baselines=arms)
    view = output.study_view(result, _config(), 1)
    terminal = Console(file=io.StringIO(), width=400)
    output.show(view, "table", terminal)
    assert "fix the interpreter in [server] command); measured again on the next run" in terminal.file.getvalue()
    assert "in [server] command" in output.render_markdown(view)


def test_an_interrupted_baseline_records_why(tmp_path):
    from types import SimpleNamespace

    from tuner.progress import SilentReporter
    from tuner.results.baselines import baseline_command
    from tuner.server.launch import command_spec
    from tuner.trial import TrialRunner

    cfg = _config()
    runner = object.__new__(TrialRunner)
    target = SimpleNamespace(api_key=None)
    target.command_spec = lambda command, params=None: command_spec(cfg.server, command)
    runner.config, runner.target, runner.reporter = cfg, target, SilentReporter()

    def interrupted(trial, spec):
        raise KeyboardInterrupt

    runner.run = interrupted
    sibling = optuna.create_study(directions=["maximize"] * 3)
    with pytest.raises(KeyboardInterrupt):
        runner.run_baseline(sibling, "no_speculation", baseline_command(cfg.server.command_line, "no_speculation"))
    (trial,) = sibling.trials
    assert trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs["fail_reason"] == "interrupted"


def test_console_lines_are_never_wrapped_when_piped(capsys):
    from tuner.cli import consoles

    out, err = consoles()
    line = "warning: " + " ".join(["word"] * 80)  # ~400 columns
    err.print(line, highlight=False)
    assert capsys.readouterr().err == line + "\n"


def test_an_error_naming_a_config_section_also_names_the_file():
    from tuner.cli import in_config

    reason = "model x does not exist on the target; fix --model-path in [server] command"
    assert in_config(reason, "studies/demo.toml") == reason + " (in studies/demo.toml)"
    assert in_config("studies/demo.toml [bench] x: unknown key", "studies/demo.toml") == "studies/demo.toml [bench] x: unknown key"
    assert in_config("--trials must be >= 0", "studies/demo.toml") == "--trials must be >= 0"


def test_best_json_quotes_the_pick_with_its_flags_and_command(tmp_path, capsys):
    import json

    study = _study_with_arms(tmp_path)
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(storage=f'storage = "sqlite:///{tmp_path}/b.db"'))
    assert best.main(["--config", str(config), "--pick", "single_tps", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["study"] == study.study_name and doc["trial"] == 0 and doc["values"]["single_tps"] == 180.0
    assert doc["flags"]["speculative_num_steps"] == 3 and "--speculative-num-steps 3" in doc["launch_command"]
    assert doc["reason"].startswith("the highest single_tps (180.0)")


def test_the_estimate_comes_from_the_study_history_and_warns_below_the_memory_edge():
    from datetime import datetime, timedelta

    from tuner.results.estimate import DEFAULT_STARTUP_S, estimate

    fresh = estimate([], n_trials=2, n_baselines=2, gpus=4)
    assert fresh.startup_s == DEFAULT_STARTUP_S and fresh.warnings and "--trials 2" in fresh.warnings[0]
    t0 = datetime(2026, 1, 1)
    done = optuna.trial.create_trial(values=[1.0], user_attrs={"startup_s": 10.0, "measure_s": 20.0})
    pruned = optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED)
    pruned.datetime_start, pruned.datetime_complete = t0, t0 + timedelta(seconds=5)
    known = estimate([done, pruned], n_trials=10, n_baselines=0, gpus=4)
    assert not known.warnings and known.total_s == 10 * 30 and known.gpu_hours == pytest.approx(300 * 4 / 3600)


def test_one_result_prints_as_a_table_json_or_markdown(capsys):
    """tuner/output.py: the Markdown form is the terminal tables as Markdown (title, header,
    one row per row, markup gone, pipes escaped), the JSON form the view's data."""
    import io

    from rich.console import Console
    from rich.table import Table

    from tuner import output

    table = Table(title="Pareto front of study 's'")
    table.add_column("trial")
    table.add_column("single_tps")
    table.add_row("3", "[green]181.5[/green]")
    table.add_row("7", "a|b")
    view = output.View({"front": [3, 7]}, [table, "over no speculation: [bold]+45%[/bold]"])
    assert output.render_markdown(view) == (
        "**Pareto front of study 's'**\n\n| trial | single_tps |\n|---|---|\n| 3 | 181.5 |\n| 7 | a\\|b |\n\n"
        "over no speculation: +45%\n")
    output.show(view, "json", Console(file=io.StringIO()))
    assert json.loads(capsys.readouterr().out) == {"front": [3, 7]}
    terminal = Console(file=io.StringIO(), width=120)
    output.show(view, "table", terminal)
    assert "181.5" in terminal.file.getvalue() and "[green]" not in terminal.file.getvalue()


def test_a_benchmarks_table_prints_the_config_keys_it_names():
    # "[bench] request_tokens" is rich markup's tag syntax: printed as markup the detail read
    # " request_tokens" (tuner.bench on a config with a fixed request size).
    from io import StringIO

    from rich.console import Console

    from tuner.measure.objectives import load_objectives
    from tuner.measure.result import Measurement
    from tuner.output import measurement_view, show

    m = Measurement(single_tps=150.0, single_runs=(149.0, 151.0), single_ci95=(140.0, 160.0), concurrent_tps_by_level={16: 1200.0},
                    concurrent_window_s={16: 10.0}, concurrent_p99_itl_ms={16: 9.0}, max_total_num_tokens=300_000,
                    max_running_requests=17, request_tokens=8192, accept_length=2.9, ttft_ms=50, ttft_p90_ms=60, ttft_p99_ms=70,
                    itl_ms=6, itl_p90_ms=7, itl_p99_ms=9, e2e_ms=900, e2e_p90_ms=950, e2e_p99_ms=990)
    objectives = load_objectives(["single_tps", "capacity"], [16])
    out = StringIO()
    show(measurement_view(m, objectives), "table", Console(file=out, width=200))
    assert "[bench] request_tokens" in out.getvalue()
