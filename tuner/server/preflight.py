"""What a dry run can check on the target without starting a server: the model the command
names.  A launch with a model that does not exist fails in seconds with "X is not a local
folder and is not a valid model identifier" (transformers, through SGLang's
srt/utils/hf_transformers_utils.py · get_config; the emulator raises the same,
sglang_emulator/args.py · model_not_found); the dry run asks the same question of the
command's own Python on the target: a folder, else a Hugging Face id in the cache or on the
hub (the emulator: one of its profiles)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.server.connection import Target
from tuner.sglang_args import CommandLine

__all__ = ["ModelCheck", "check_model"]

# Printed by the probe: folder | profile | cached | hub (found); missing; unknown (cannot tell).
_PROBE = r"""
import os, sys
m, emulator = sys.argv[1], sys.argv[2] == "1"
if os.path.isdir(os.path.expanduser(m)):
    print("folder"); sys.exit()
if emulator:
    from sglang_emulator.profiles import find_profile
    print("profile" if find_profile(m) is not None else "missing"); sys.exit()
try:
    from huggingface_hub import model_info, try_to_load_from_cache
except ImportError:
    print("unknown"); sys.exit()
try:
    if isinstance(try_to_load_from_cache(m, "config.json"), str):
        print("cached"); sys.exit()
    model_info(m, timeout=10)
    print("hub")
except Exception as exc:
    print("missing" if type(exc).__name__ in ("RepositoryNotFoundError", "HFValidationError") else "unknown")
"""


@dataclass(frozen=True)
class ModelCheck:
    model: str
    found: str  # folder | profile | cached | hub | unknown


def check_model(target: Target, command: CommandLine) -> ModelCheck:
    """Raise `ConfigError` with the real run's line when the model does not exist on the
    target; otherwise say where it was found (or "unknown": no Python in the command, no
    huggingface_hub, the hub unreachable)."""
    model = command.model_path
    python = command.prefix[0] if command.prefix else ""
    if not model or "python" not in python.rsplit("/", 1)[-1]:
        return ModelCheck(model, "unknown")
    emulator = "sglang_emulator" in command.prefix
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in target.config.server.env.items())
    probe = f"env {env} {shlex.quote(python)} -c {shlex.quote(_PROBE)} {shlex.quote(model)} {int(emulator)}"
    result = target.shell.run(probe, timeout=60)
    found = result.stdout.strip().splitlines()[-1] if result.ok and result.stdout.strip() else "unknown"
    if found == "missing":
        raise ConfigError(f"model {model} does not exist on the target (not a folder there, nor a model "
                          f"{'profile of the emulator' if emulator else 'on the Hugging Face hub'}); fix --model-path in [server] command")
    return ModelCheck(model, found)
