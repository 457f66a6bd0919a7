"""What every command-line entry point shares: its consoles, the one `error:` line, exit codes.

Exit codes: 0 done; 2 with one `error:` line naming the fix; 130 on Ctrl-C.  Error lines are
printed whole, never wrapped, whatever the terminal width (scripts grep them).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import Callable, NoReturn

from rich.console import Console

import tuner.interrupts as interrupts
from tuner.errors import LaunchError, TunerError

__all__ = ["consoles", "error", "guarded", "exit_with", "parser", "prog_name", "EXIT_ERROR", "EXIT_INTERRUPTED", "ENTRY_POINT", "in_config"]

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


ENTRY_POINT = "sglang-tuner"  # the installed script: `python -m tuner.optimize` by another name


def prog_name(module: str) -> str:
    """How a command names itself in its usage line: the installed script as itself."""
    if module == "tuner.optimize" and os.path.basename(sys.argv[0] or "") == ENTRY_POINT:
        return ENTRY_POINT
    return f"python -m {module}"


class _Defaults(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help when it has a value default its help does not
    already state (None and off switches have none to state)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS) or action.option_strings == ["-h", "--help"]:
            return text
        return f"{text} (default: %(default)s)"


def parser(module: str, description: str) -> argparse.ArgumentParser:
    """A command's parser: a sentence as description, every flag's default in its help."""
    return argparse.ArgumentParser(prog=prog_name(module), description=description,
                                   formatter_class=_Defaults)


def consoles() -> tuple[Console, Console]:
    """stdout and stderr consoles; wide enough for tables when piped (CI logs), and lines of
    text are never wrapped (soft wrap), whatever the width."""
    out = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=True)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 200, soft_wrap=True)
    return out, err


_SECTION = re.compile(r"\[(study|target|server|space|bench|constraints|slo)\]")


def in_config(reason: str, path: str | None) -> str:
    """A reason that names a config section (`fix [server] command`) also names the file."""
    if path and path not in reason and _SECTION.search(reason):
        return f"{reason} (in {path})"
    return reason


def error(message: str) -> int:
    """Print the one error line and return the exit status."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def exit_with(code: int) -> NoReturn:
    """`python -m tuner.<command>`: exit with the command's status.  After an interruption the
    bookkeeping is done (records written, the target restored), so the process ends at once:
    tearing down a loaded interpreter (optuna, sqlalchemy, pydantic, rich) took 20-25 s on a
    busy 2-core machine, past the few seconds a Ctrl-C should take."""
    if code == EXIT_INTERRUPTED:
        logging.shutdown()  # the --log-file lines
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def guarded(body: Callable[[], int], *, launch_prefix: str = "") -> int:
    """Run a command's body, turning the tuner's errors into one line and an exit status; a
    Ctrl-C or SIGTERM ends it 130 with one line once the target is restored (`tuner.interrupts`)."""
    interrupts.install()
    try:
        return body()
    except LaunchError as exc:
        return error(launch_prefix + exc.reason)
    except TunerError as exc:
        return error(str(exc))
    except KeyboardInterrupt as exc:
        print(str(exc) if isinstance(exc, interrupts.Interrupted) else "interrupted; the target was restored",
              file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
