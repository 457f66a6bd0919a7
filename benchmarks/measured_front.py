"""Live studies side by side: the hypervolume of what each study measured in its first trials.

    python benchmarks/measured_front.py "20 ms:before=sqlite:///old-0.db" "20 ms:after=sqlite:///new-0.db" ...

Each argument is `<group>:<arm>=<storage URL>`; the storage's study (the one whose name has no
"@", the baselines' being `<name>@baselines`) is read, and its first `--budget` trials scored:
the hypervolume of their measured values (every objective maximised, origin reference), each
objective normalised by its maximum over every study of the same group, both arms.  For a study
whose objectives have no exhaustive truth to score against (`slo_capacity`: a search over load
per trial), the measured front is what both arms saw on the same server.  Also per study: failed
launches (PRUNED or FAIL), reserve probes (the model's note), distinct shapes, each objective's best.

How `docs/search-figures.md`'s "slo_capacity ranked by the model" was scored: copies of
studies/demo-slo.toml on their own storage and port, `p95_itl_ms` 20, 40 and 12, run by
`python -m tuner.optimize --config <copy> --trials 10 --seed <s>` from the tree before and after.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.results.hypervolume import hypervolume  # noqa: E402


def _study(url: str) -> optuna.Study:
    names = [s.study_name for s in optuna.get_all_study_summaries(url) if "@" not in s.study_name]
    if len(names) != 1:
        raise SystemExit(f"{url}: expected one study besides the baselines, found {names or 'none'}")
    return optuna.load_study(study_name=names[0], storage=url)


def _row(study: optuna.Study, budget: int, scale: np.ndarray) -> dict:
    trials = [t for t in study.trials[:budget] if t.state.is_finished()]
    points = np.array([t.values for t in trials if t.values]).reshape(-1, len(scale)) / scale
    shapes = {(t.params.get("speculative_num_steps"), t.params.get("speculative_eagle_topk"),
               t.params.get("speculative_num_draft_tokens")) for t in trials}
    return {"trials": len(trials), "hv": hypervolume(points.tolist()),
            "failed": sum(t.state.name in ("PRUNED", "FAIL") for t in trials),
            "probes": sum(str(t.user_attrs.get("model_note", "")).startswith("model: a reserve probe") for t in trials),
            "shapes": len(shapes), "best": points.max(axis=0) * scale if len(points) else np.zeros(len(scale))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("studies", nargs="+", help="<group>:<arm>=<storage URL>")
    ap.add_argument("--budget", type=int, default=10, help="trials scored per study (default 10)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    groups: dict[str, dict[str, list[tuple[str, optuna.Study]]]] = {}
    for spec in args.studies:
        head, _, url = spec.partition("=")
        group, _, arm = head.rpartition(":")
        if not url or not arm:
            raise SystemExit(f"{spec!r}: expected <group>:<arm>=<storage URL>")
        groups.setdefault(group, {}).setdefault(arm, []).append((url, _study(url)))
    for group, arms in groups.items():
        studies = [s for lst in arms.values() for _, s in lst]
        names = studies[0].metric_names or [f"objective {i}" for i in range(len(studies[0].directions))]
        values = [t.values for s in studies for t in s.trials[:args.budget] if t.values]
        scale = np.max(np.array(values), axis=0) if values else np.ones(len(names))
        print(f"## {group} (normalised by: " + ", ".join(f"{n} {v:g}" for n, v in zip(names, scale)) + ")")
        for arm, lst in arms.items():
            rows = [_row(s, args.budget, scale) for _, s in lst]
            for (url, _), r in zip(lst, rows):
                best = ", ".join(f"{n} {v:.4g}" for n, v in zip(names, r["best"]))
                print(f"  {arm:8s} {url}: {r['trials']} trials, HV {r['hv']:.3f}, failed {r['failed']}, "
                      f"reserve probes {r['probes']}, shapes {r['shapes']}, best {best}")
            hv = [r["hv"] for r in rows]
            failed = [r["failed"] for r in rows]
            print(f"  {arm:8s} mean HV {np.mean(hv):.3f} (worst {min(hv):.3f}), failed launches {np.mean(failed):.2f} a study "
                  f"(most {max(failed)}), reserve probes {np.mean([r['probes'] for r in rows]):.1f}, "
                  f"shapes {np.mean([r['shapes'] for r in rows]):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
