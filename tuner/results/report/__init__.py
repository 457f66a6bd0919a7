"""The study report: `build(study)` reads everything it shows from the study alone
(contents, plots); `write_html` / `write_markdown` render it (render).  `python -m tuner.report`
is the command line."""

from __future__ import annotations

from datetime import datetime

import optuna
from optuna.trial import TrialState

from tuner.results.picks import measured_front
from tuner.results.report.render import write_html, write_markdown
from tuner.results.report.contents import Choice, Plot, Report, Table, baselines_for, choices_for, classes_for, failures_table, metric_names_of, notes_for, pareto_for, summary_rows
from tuner.results.report.adaptive_section import schedule_for
from tuner.results.optuna_private import storage_of
from tuner.results import baselines
from tuner.results.report.plots import acceptance_plot, capacity_plot, class_plot, failure_plot, front_plot, hypervolume_plot, slo_plot

__all__ = ["Report", "Table", "Choice", "Plot", "build", "write_html", "write_markdown"]

# --- build and write ------------------------------------------------------------------------

def build(study: optuna.Study, *, sampler: str | None = None, target: str | None = None) -> Report:
    """Everything the report shows, from the study alone (`sampler`/`target` describe the config)."""
    names = metric_names_of(study)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values and len(t.values) == len(names)]
    finished = [t for t in trials if t.state.is_finished()]
    front = measured_front(study) if complete else []
    choices = choices_for(study, names) if front else []
    arm_trials = baselines.load(storage_of(study), study.study_name)
    plots = [front_plot(complete, front, names), acceptance_plot(complete), capacity_plot(complete, names),
             hypervolume_plot(finished), failure_plot(finished), slo_plot(front, arm_trials), class_plot(front, arm_trials)]
    arms, over = baselines_for(study, names)
    by_class, class_losses = classes_for(study, front)
    return Report(
        study_name=study.study_name,
        baselines=arms,
        over_baselines=over,
        summary=summary_rows(study, trials, names, sampler, target),
        notes=notes_for(trials, complete),
        pareto=pareto_for(study, names, choices) if front else Table([], []),
        choices=choices,
        failures=failures_table(trials),
        plots=[p for p in plots if p is not None],
        generated=f"{datetime.now():%Y-%m-%d %H:%M}",
        schedule=schedule_for(study),
        by_class=by_class,
        class_losses=class_losses,
    )


