"""What the tokenizer manager holds (status, the engines, start-up facts) and SGLang's error body:
shared by every handler module (status.py, completions.py, metrics.py)."""

from __future__ import annotations

import itertools
import time

from starlette.responses import JSONResponse

from . import model as m
from .args import Resolved
from .engine import Engine

__all__ = ["ServerState", "error"]


class ServerState:
    """What the tokenizer manager holds: status, the engines, and start-up facts."""

    def __init__(self, resolved: Resolved, plan: m.MemoryPlan, engines: list[Engine], time_scale: float):
        self.resolved = resolved
        self.plan = plan
        self.engines = engines
        self.time_scale = time_scale
        self.status = "Starting"  # ServerStatus.Starting -> Up (after warm-up)
        self.startup_time = time.time()
        self.started_at = time.time()
        self.gracefully_exit = False
        self.launch_command = ""
        self._next_rank = itertools.cycle(range(len(engines)))
        args = resolved.raw
        self.served_model_name = args.get("served_model_name") or args["model_path"]
        self.api_key = args.get("api_key")
        self.admin_api_key = args.get("admin_api_key")

    def pick_engine(self) -> Engine:
        return self.engines[next(self._next_rank)]

    @property
    def healthy(self) -> bool:
        return all(e.dead is None and not e.hung for e in self.engines)


def error(status: int, message: str, err_type: str = "BadRequestError") -> JSONResponse:
    return JSONResponse(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status},
        status_code=status,
    )
