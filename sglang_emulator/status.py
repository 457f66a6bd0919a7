"""SGLang 0.5.23's status endpoints (`srt/entrypoints/http_server.py`, `v1_loads.py`): health,
readiness, model and server info, loads, models, the cache flush.  Each reads the engines; none
generates text (completions.py does)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from .engine import Engine, EngineDead, Request
from .state import ServerState

__all__ = ["StatusEndpoints"]

logger = logging.getLogger("sglang.srt.entrypoints.http_server")


class StatusEndpoints:
    """The handlers, bound to one server's state."""

    def __init__(self, state: ServerState):
        self.state = state
        self.resolved = state.resolved
        self.context_len = self.resolved.raw.get("context_length") or self.resolved.profile.context_len

    async def health_generate(self, request: HttpRequest) -> Response:
        if self.state.gracefully_exit:
            logger.info("Health check request received during shutdown. Returning 503.")
            return Response(status_code=503)
        if self.state.status == "Starting":
            return Response(status_code=503)
        # http_server.py · health_generate: a 1-token generate (log_metrics=False), then a poll
        # once a second until any output arrives, for up to HEALTH_CHECK_TIMEOUT (20 s): the
        # answer never comes sooner than 1 s.
        timeout = 20.0
        tic = time.time()
        probe = Request(rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", prompt="0", prompt_tokens=1,
                        max_new_tokens=1, temperature=0.0, log_metrics=False)
        engine = self.state.pick_engine()
        try:
            engine.submit(probe)
        except EngineDead:
            pass
        try:
            while time.time() < tic + timeout * self.state.time_scale:
                await asyncio.sleep(1.0 * self.state.time_scale)
                if (probe.generated or not probe.out.empty()) and self.state.healthy:
                    self.state.status = "Up"
                    return Response(status_code=200)
        finally:
            if probe.finish_reason is None:
                probe.cancelled = True
                engine._wake.set()
        logger.error(
            f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{int(timeout)} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(self.state.started_at))}"
        )
        self.state.status = "UnHealthy"
        return Response(status_code=503)

    async def ready(self, request: HttpRequest) -> Response:
        return Response(status_code=200 if self.state.status == "Up" and self.state.healthy else 503)

    def model_info_body(self) -> dict[str, Any]:
        args = self.resolved.raw
        return {
            "model_path": args["model_path"],
            "served_model_name": self.state.served_model_name,
            "tokenizer_path": args.get("tokenizer_path") or args["model_path"],
            "is_generation": True,
            "preferred_sampling_params": args.get("preferred_sampling_params"),
            "weight_version": args.get("weight_version") or "default",
            "load_format": args.get("load_format") or "auto",
            "reasoning_parser": args.get("reasoning_parser"),
            "tool_call_parser": args.get("tool_call_parser"),
            "disaggregation_mode": "null",
            "has_image_understanding": self.resolved.profile.is_multimodal,
            "has_audio_understanding": False,
            "model_type": self.resolved.profile.model_type,
            "architectures": [self.resolved.profile.architecture],
        }

    async def model_info(self, request: HttpRequest) -> Response:
        if request.url.path == "/get_model_info":
            logger.warning(
                "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                "Please use '/model_info' instead."
            )
        return JSONResponse(self.model_info_body())

    def memory_usage(self, plan) -> dict[str, Any]:
        """scheduler_components/memory_usage.py · build_memory_usage (0.5.23); 0.5.9's
        scheduler.py · get_internal_state has no startup_available and one graph figure."""
        if self.resolved.version == "0.5.9":
            return {"weight": round(plan.weights_gib, 2), "kvcache": round(plan.kv_gib + plan.mamba_gib, 2),
                    "token_capacity": plan.max_total_num_tokens, "graph": round(sum(plan.graph_gib.values()), 2)}
        return {
            "weight": round(plan.weights_gib, 3),
            "kvcache": round(plan.kv_gib + plan.mamba_gib, 3),
            "startup_available": round(plan.available_after_capture_gib, 3),
            "token_capacity": plan.max_total_num_tokens,
            "token_capacity_swa": None,
            "graph": {k: round(v, 3) for k, v in plan.graph_gib.items()},
        }

    def internal_state(self, engine: Engine) -> dict[str, Any]:
        plan = engine.plan
        out = self.resolved.as_dict()
        out.update(
            world_size=self.resolved.tp,
            startup_time=self.state.startup_time,
            effective_max_running_requests_per_dp=engine.max_running,
            last_gen_throughput=engine.last_gen_throughput,
            memory_usage=self.memory_usage(plan),
        )
        accept = engine.avg_spec_accept_length
        if accept is not None:
            out["avg_spec_accept_length"] = accept
        if engine.step_time_dict:
            out["step_time_dict"] = engine.step_time_dict
        return out

    async def server_info(self, request: HttpRequest) -> Response:
        if request.url.path == "/get_server_info":
            logger.warning(
                "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                "Please use '/server_info' instead."
            )
        body = self.resolved.as_dict()
        body.update(
            launch_command=self.state.launch_command,
            status="ready",
            # data_parallel_controller.py · _record_scheduler_init_infos: rank 0's figure only.
            max_total_num_tokens=self.state.engines[0].plan.max_total_num_tokens,
            max_req_input_len=self.context_len - 1,
            startup_time=self.state.startup_time,
            internal_states=[self.internal_state(e) for e in self.state.engines],
            version=self.resolved.version,
            frontend="python",
        )
        return JSONResponse(body)

    async def loads(self, request: HttpRequest) -> Response:
        include = request.query_params.get("include")
        sections = {s.strip() for s in include.split(",")} if include else {"all"}
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        if not sections <= valid:
            return JSONResponse(
                {"detail": f"Invalid include sections: {sections - valid}. Valid options: {sorted(valid)}"},
                status_code=400,
            )
        out = []
        for e in self.state.engines:
            load: dict[str, Any] = {
                "timestamp": time.time(),
                "dp_rank": e.dp_rank,
                "num_running_reqs": len(e.running),
                "num_waiting_reqs": len(e.waiting),
                "num_used_tokens": e.used_tokens,
                "num_total_tokens": e.used_tokens,
                "max_total_num_tokens": e.capacity,
                "max_running_requests": e.max_running,
                "token_usage": e.used_tokens / e.capacity,
                "gen_throughput": e.last_gen_throughput,
                "cache_hit_rate": 0.0,
                "utilization": len(e.running) / max(e.max_running, 1),
            }
            if sections & {"all", "memory"}:
                load["memory"] = {
                    "weight_gb": e.plan.weights_gib,
                    "kv_cache_gb": e.plan.kv_gib,
                    "graph_gb": sum(e.plan.graph_gib.values()),
                    "token_capacity": e.capacity,
                }
            if self.resolved.spec.enabled and sections & {"all", "spec"}:
                load["speculative"] = {"accept_length": e.last_accept_length, "accept_rate": e.last_accept_rate}
            out.append(load)
        body: dict[str, Any] = {"timestamp": datetime.now(timezone.utc).isoformat(), "version": self.resolved.version}
        if self.resolved.version != "0.5.9":
            # entrypoints/v1_loads.py · _num_accelerators_per_dp_rank (absent in 0.5.9)
            body["accelerator"] = self.resolved.profile.gpu.name
            per_rank = self.resolved.tp * max(int(self.resolved.raw.get("pp_size") or 1), 1)
            body["num_accelerators"] = per_rank // self.resolved.dp if self.resolved.dp_attention else per_rank
        body["loads"] = out
        return JSONResponse(body)

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.state.served_model_name,
                        "object": "model",
                        "created": int(self.state.startup_time),
                        "owned_by": "sglang",
                        "root": self.state.served_model_name,
                        "parent": None,
                        "max_model_len": self.context_len,
                    }
                ],
            }
        )

    async def flush_cache(self, request: HttpRequest) -> Response:
        # Each rank flushes only when idle (and logs why not otherwise), as the scheduler does.
        flushed = [e.flush_cache() for e in self.state.engines]
        if all(flushed):
            return PlainTextResponse(
                "Cache flushed.\nPlease check backend logs for more details. (When there are running "
                "or waiting requests, the operation will not be performed.)\n"
            )
        return PlainTextResponse("Flush cache failed.\n", status_code=400)
