"""The server being tuned: where it runs (host), how its command line reads (sglang_args), how
it is started and stopped (control), whether it came up (readiness, diagnose), and its HTTP
surface (client).  Knows SGLang, not Optuna."""
