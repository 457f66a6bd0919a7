"""`python -m tuner.report` and notebooks/analysis.ipynb on a real small study made by the CLI.

The study (module fixture) is built in four runs of `python -m tuner.optimize` against the
emulator, with four objectives (concurrency levels 2 and 4): a configuration measured twice (the
second run of it is a duplicate, no restart), a mem fraction of 0.60 (PRUNED, KV cache), a server
that crashes mid-benchmark (FAIL), then three sampled trials.  About 40 s.
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import optuna
import pytest
from nbclient import NotebookClient
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from tuner import report
from tuner.results.record import params_of
from tuner.results.picks import measured_front, pick

from ..conftest import PYTHON, REPO, run_cli, write_config

pytestmark = pytest.mark.e2e

NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"
PLOTS = ("front", "acceptance", "capacity", "hypervolume", "failures", "classes")  # classes: the built-in prompts have five
BENCH = textwrap.dedent("""
    max_tokens = 48
    single_requests = 2
    single_min_passes = 1
    single_max_passes = 2
    concurrency = [2, 4]
    concurrent_requests = 8
    warmup_requests = 1
""")
FAST = 'SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_TIME_SCALE = "0.25"'


def _space(steps: tuple[int, int], topk: tuple[int, int], mem: tuple[float, float]) -> str:
    # Ranges only (no `choices`): Optuna refuses a categorical whose choices change between runs.
    return (f"speculative_num_steps = {{ low = {steps[0]}, high = {steps[1]} }}\n"
            f"speculative_eagle_topk = {{ low = {topk[0]}, high = {topk[1]} }}\n"
            f"mem_fraction_static = {{ low = {mem[0]}, high = {mem[1]}, step = 0.02 }}")


@pytest.fixture(scope="module")
def study_config(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    runs = [
        (_space((1, 1), (1, 1), (0.80, 0.80)), FAST, 2),  # trial 0, and trial 1 its duplicate
        (_space((2, 2), (1, 1), (0.60, 0.60)), FAST, 1),  # PRUNED: the KV cache does not fit
        (_space((1, 1), (2, 2), (0.84, 0.84)), FAST + ', SGLANG_EMULATOR_FAULT = "crash_after_tokens=150"', 1),  # FAIL
        (_space((1, 3), (1, 2), (0.80, 0.90)), FAST, 3),
    ]
    for space, env, trials in runs:
        config = write_config(tmp, name="rep", space=space, bench=BENCH, env=env)
        result = run_cli("--trials", str(trials), "--config", str(config), "--seed", "7")
        assert result.returncode == 0, result.stderr
    study = _load(config)
    states = [t.state for t in study.trials]
    assert len(states) == 7 and TrialState.PRUNED in states and TrialState.FAIL in states, states
    assert study.trials[1].user_attrs.get("duplicate_of") == 0
    return config


def _load(config: Path) -> optuna.Study:
    return optuna.load_study(study_name="rep", storage=f"sqlite:///{config.parent / 'rep.db'}")


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "tuner.report", *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_report_has_the_front_the_picks_with_flags_and_every_plot(study_config, tmp_path):
    out = tmp_path / "out"
    result = _report("--config", str(study_config), "--out", str(out))
    assert result.returncode == 0, result.stderr
    written = result.stdout.split()
    assert written[:2] == [str(out / "report.html"), str(out / "report.md")]
    assert sorted(Path(p).name for p in written[2:]) == sorted(f"{p}.png" for p in PLOTS)
    page = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    study = _load(study_config)
    names = study.metric_names
    assert names == ["single_tps", "concurrent_tps@2", "concurrent_tps@4", "capacity"]

    # Summary: counts by state and the objectives.
    assert "7: 5 complete, 1 fail, 1 pruned" in page and "7: 5 complete, 1 fail, 1 pruned" in md
    assert "1 duplicate(s) of an earlier trial" in page

    # The Pareto table: the terminal's columns, one row per measured front trial (the duplicate left out).
    # "backend / page": what actually ran (read back from /server_info), since it confounds topk.
    header = ["trial", "steps", "topk", "draft", "mem", *names, "accept", "max_running", "kv_tokens", "backend / page"]
    assert "".join(f"<th>{h}</th>" for h in header) in page
    assert "| " + " | ".join(header) + " | picked for |" in md
    assert "flashinfer / 1" in md
    front = measured_front(study)
    assert front and all(t.number != 1 for t in front)
    table = page.split("<h2>Pareto front</h2>")[1].split("</table>")[0]
    assert sorted(int(n) for n in re.findall(r"<tr><td>(\d+)</td>", table)) == sorted(t.number for t in front)
    for t in front:
        assert f"<td>{t.user_attrs['max_total_num_tokens']:,}</td>" in table

    # Best per objective and the balanced pick, with tuner.results.picks' choice and the exact flags.
    for how in [*names, "balanced"]:
        chosen = pick(study, how)
        flags = " ".join(params_of(chosen.trial).flags())
        assert f"<h3>{how}: trial {chosen.trial.number}</h3>" in page
        assert f"### {how}: trial {chosen.trial.number}" in md
        section = md.split(f"### {how}: trial {chosen.trial.number}")[1].split("###")[0]
        assert f"```\n{flags}\n```" in section and chosen.reason in section

    # Every plot: embedded in the page, a PNG file beside the Markdown.
    for name in PLOTS:
        match = re.search(rf'<figure id="{name}">.*?src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
        assert match, name
        assert base64.b64decode(match.group(1))[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name}.png)" in md and (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"

    # Pruned and failed trials with their reasons.
    for t in study.trials:
        if t.state in (TrialState.PRUNED, TrialState.FAIL):
            reason = t.user_attrs["fail_reason"].splitlines()[0]
            assert reason.replace("|", "\\|") in md
    assert "KV cache does not fit in mem_fraction_static" in page and "mid-benchmark" in page

    # Self-contained: nothing fetched, nothing run.
    for external in ('src="http', "src='http", 'href="http', "<script", "<link", "@import", "url("):
        assert external not in page.lower(), external


def test_report_default_out_is_beside_the_study(study_config, capsys):
    assert report.main(["--config", str(study_config)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(study_config.parent / "rep.report" / "report.html")


def test_report_errors_are_one_line(study_config, tmp_path, capsys):
    assert report.main(["--config", str(study_config), "--study-name", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no study 'nope' in ") and len(err.splitlines()) == 1
    assert report.main(["--config", str(study_config), "--storage", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "no such study database" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


@pytest.fixture(scope="module")
def jupyter_path(tmp_path_factory) -> str:
    """A `python3` kernelspec that runs this interpreter (the venv's own spec says just `python`)."""
    prefix = tmp_path_factory.mktemp("kernel")
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", "python3"],
                   check=True, capture_output=True)
    return str(prefix / "share" / "jupyter")


def _run_notebook(monkeypatch, jupyter_path: str, storage: str, name: str) -> nbformat.NotebookNode:
    monkeypatch.setenv("JUPYTER_PATH", jupyter_path)
    monkeypatch.setenv("TUNER_STUDY_STORAGE", storage)
    monkeypatch.setenv("TUNER_STUDY_NAME", name)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=180, resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{output.ename}: {output.evalue}"
            if output.output_type == "stream":
                assert "Traceback" not in output.text and "Error" not in output.text, output.text
    return nb


def _text(nb: nbformat.NotebookNode) -> str:
    return "\n".join(o.text for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream")


def _images(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def test_notebook_runs_top_to_bottom_on_the_study(study_config, monkeypatch, jupyter_path):
    study = _load(study_config)
    nb = _run_notebook(monkeypatch, jupyter_path, f"sqlite:///{study_config.parent / 'rep.db'}", "rep")
    text = _text(nb)
    assert "study 'rep'" in text and "7 trial(s): 5 complete, 1 fail, 1 pruned" in text
    for i, name in enumerate(study.metric_names):
        best = max(measured_front(study), key=lambda t: t.values[i])
        assert f"best {name}: trial {best.number} " in text
        assert re.search(rf"^{re.escape(name)}: (no importance|\w+ \d\.\d\d)", text, re.M), name  # importances
    assert "KV cache does not fit in mem_fraction_static" in text and "mid-benchmark" in text
    # Front projections, importances, acceptance, memory (2 figures): one image each.
    assert _images(nb) == 5


def _study_without_complete_trials(tmp_path: Path) -> str:
    storage = f"sqlite:///{tmp_path / 'empty.db'}"
    study = optuna.create_study(study_name="empty", storage=storage, directions=["maximize"] * 3)
    study.set_metric_names(["single_tps", "concurrent_tps", "capacity"])
    dists = {"speculative_num_steps": IntDistribution(1, 3), "mem_fraction_static": FloatDistribution(0.5, 0.97, step=0.01)}
    study.add_trial(create_trial(
        state=TrialState.PRUNED, params={"speculative_num_steps": 2, "mem_fraction_static": 0.97}, distributions=dists,
        user_attrs={"fail_reason": "CUDA graph capture ran out of memory at mem_fraction_static=0.97", "failure_kind": "memory_graph",
                    "flags": {"speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3, "mem_fraction_static": 0.97}}))
    study.add_trial(create_trial(state=TrialState.FAIL, params={"speculative_num_steps": 1, "mem_fraction_static": 0.8}, distributions=dists))
    return storage


def test_a_study_with_no_complete_trial_says_so(tmp_path, capsys, monkeypatch, jupyter_path):
    storage = _study_without_complete_trials(tmp_path)
    monkeypatch.chdir(REPO)
    assert report.main(["--storage", storage, "--study-name", "empty", "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(tmp_path / "out" / "report.html")
    page = (tmp_path / "out" / "report.html").read_text()
    md = (tmp_path / "out" / "report.md").read_text()
    for text in (page, md):
        assert "No trial has completed yet" in text and "2: 1 fail, 1 pruned" in text
        assert "CUDA graph capture ran out of memory at mem_fraction_static=0.97" in text
        assert "Best configuration per objective" not in text and "Pareto front</h2>" not in text
    nb = _run_notebook(monkeypatch, jupyter_path, storage, "empty")
    assert "No complete trial yet: no Pareto front." in _text(nb)


def test_trials_from_other_tools_and_duplicates(tmp_path, capsys, monkeypatch):
    """No metric names, no user attrs at all, a duplicate on the front: the report still reads."""
    storage = f"sqlite:///{tmp_path / 'other.db'}"
    study = optuna.create_study(study_name="other", storage=storage, directions=["maximize"] * 2)
    dists = {"speculative_num_steps": IntDistribution(1, 6), "speculative_eagle_topk": IntDistribution(1, 4),
             "mem_fraction_static": FloatDistribution(0.6, 0.95)}
    for steps, topk, mem, values, attrs in [(1, 1, 0.9, [120.0, 40.0], {}), (4, 1, 0.85, [210.0, 20.0], {}),
                                            (3, 2, 0.7, [150.0, 10.0], {}), (4, 1, 0.85, [210.0, 20.0], {"duplicate_of": 1})]:
        study.add_trial(create_trial(params={"speculative_num_steps": steps, "speculative_eagle_topk": topk, "mem_fraction_static": mem},
                                     distributions=dists, values=values, user_attrs=attrs))
    monkeypatch.chdir(REPO)
    assert report.main(["--storage", storage, "--study-name", "other", "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h3>objective_0: trial 1</h3>" in page and "<h3>objective_1: trial 0</h3>" in page
    assert "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5 --mem-fraction-static 0.85" in page
    assert "carry no `flags` attribute" in page and "repeat an earlier trial" in page
    table = page.split("<h2>Pareto front</h2>")[1].split("</table>")[0]
    assert re.findall(r"<tr><td>(\d+)</td>", table) == ["1", "0"]  # the duplicate (3) left out
    assert "<td>-</td>" in table  # no accept length, max_running_requests or KV tokens recorded
    built = report.build(optuna.load_study(study_name="other", storage=storage))
    assert [p.name for p in built.plots] == ["front", "hypervolume", "failures"]  # no accept length, no capacity
