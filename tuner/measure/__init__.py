"""What a trial measures on a running server: the workload, the benchmark runner, its
statistics, and the objectives scored from it.  Knows SGLang's HTTP API, not Optuna.

`Measurement` is public: objective modules in `objectives/` take one.
"""

from tuner.measure.runner import Measurement

__all__ = ["Measurement"]
