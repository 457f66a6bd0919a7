"""Objectives: one module each, with `name`, `direction`, `unit`, `description` and a pure
`score(m: tuner.measure.Measurement) -> float`.  A module's name is the name used in
`[study] objectives` and Optuna's metric name.  Every objective is maximised."""
