"""What every command-line entry point shares: its consoles, the one `error:` line, exit codes.

Exit codes: 0 done; 2 with one `error:` line naming the fix; 130 on Ctrl-C.  Error lines are
printed whole, never wrapped, whatever the terminal width (scripts grep them).
"""

from __future__ import annotations

import sys
from typing import Callable

from rich.console import Console

from tuner.errors import LaunchError, TunerError

__all__ = ["consoles", "error", "guarded", "EXIT_ERROR", "EXIT_INTERRUPTED"]

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def consoles() -> tuple[Console, Console]:
    """stdout and stderr consoles; wide enough for tables when piped (CI logs)."""
    out = Console(width=None if sys.stdout.isatty() else 200)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
    return out, err


def error(message: str) -> int:
    """Print the one error line and return the exit status."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def guarded(body: Callable[[], int], *, launch_prefix: str = "") -> int:
    """Run a command's body, turning the tuner's errors into one line and an exit status."""
    try:
        return body()
    except LaunchError as exc:
        return error(launch_prefix + exc.reason)
    except TunerError as exc:
        return error(str(exc))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
