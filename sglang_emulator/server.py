"""SGLang 0.5.23's HTTP surface (`srt/entrypoints/http_server.py`) over the emulator's engines.

Routes, status codes, JSON fields and auth rules are SGLang's; see the notes in
`../shared/notes/sglang-0.5.23.md` §3.  The handlers only translate between HTTP and
`engine.Engine`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
import time
import uuid
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from . import model as m
from .args import Resolved
from .engine import Chunk, Engine, EngineDead, Request, count_tokens

__all__ = ["ServerState", "build_app", "SGLANG_VERSION"]

SGLANG_VERSION = "0.5.23"  # default; Resolved.version says which release is played
logger = logging.getLogger("sglang.srt.entrypoints.http_server")


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


# --- auth (srt/utils/auth.py::decide_request_auth) --------------------------------------------

_ADMIN_OPTIONAL = {"/flush_cache", "/set_internal_state"}


def _authorized(state: ServerState, request: HttpRequest) -> tuple[bool, int]:
    path = request.url.path
    if request.method == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
        return True, 200

    def check(expected: str) -> bool:
        header = request.headers.get("authorization")
        if not header:
            return False
        parts = header.split(" ", 1)
        return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(parts[1], expected)

    if path in _ADMIN_OPTIONAL:
        if state.admin_api_key:
            return check(state.admin_api_key), 401
        if state.api_key:
            return check(state.api_key), 401
        return True, 200
    if state.api_key:
        return check(state.api_key), 401
    return True, 200


def _error(status: int, message: str, err_type: str = "BadRequestError") -> JSONResponse:
    return JSONResponse(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status},
        status_code=status,
    )


# --- metrics ------------------------------------------------------------------------------------


class _EngineCollector:
    """Scheduler gauges and tokenizer counters read straight from the engines at scrape time."""

    def __init__(self, state: ServerState):
        self.state = state

    def collect(self):
        state = self.state
        name = state.served_model_name
        sched_labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]

        def gauge(metric: str, doc: str, value_of):
            g = GaugeMetricFamily(metric, doc, labels=sched_labels)
            for e in state.engines:
                g.add_metric([name, "unified", "0", "0", "0", str(e.dp_rank)], float(value_of(e)))
            return g

        yield gauge("sglang:num_running_reqs", "The number of running requests.", lambda e: len(e.running))
        yield gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", lambda e: len(e.waiting))
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", lambda e: e.used_tokens)
        yield gauge("sglang:token_usage", "The token usage.", lambda e: e.used_tokens / e.capacity)
        yield gauge("sglang:gen_throughput", "The generation throughput (token/s).", lambda e: e.last_gen_throughput)
        yield gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", lambda e: 0.0)
        yield gauge("sglang:num_retracted_reqs", "The number of retracted requests.", lambda e: e.retracted)
        yield gauge("sglang:is_cuda_graph", "Whether batch is using CUDA graph.", lambda e: 1.0)
        yield gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", lambda e: e.capacity)
        yield gauge("sglang:max_running_requests_under_SLO", "Max running requests under SLO.", lambda e: e.max_running)
        yield gauge("sglang:context_len", "The context length.", lambda e: e.profile.context_len)
        yield gauge("sglang:weight_memory_usage_gb", "Weight memory (GB).", lambda e: e.plan.weights_gib)
        yield gauge("sglang:kv_cache_memory_usage_gb", "KV cache memory (GB).", lambda e: e.plan.kv_gib)
        yield gauge("sglang:graph_memory_usage_gb", "CUDA graph memory (GB).", lambda e: sum(e.plan.graph_gib.values()))
        yield gauge(
            "sglang:startup_available_gpu_memory_gb",
            "Available GPU memory at start-up (GB).",
            lambda e: e.plan.available_after_capture_gib,
        )
        if state.resolved.spec.enabled:
            yield gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", lambda e: e.last_accept_length)
            yield gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding.", lambda e: e.last_accept_rate)
            yield gauge("sglang:spec_num_steps", "Speculative num steps.", lambda e: e.resolved.spec.steps)
            yield gauge("sglang:spec_num_draft_tokens", "Speculative num draft tokens.", lambda e: e.resolved.spec.draft_tokens)

        tok_labels = ["model_name", "engine_type"]

        def counter(metric: str, doc: str, total: float):
            c = CounterMetricFamily(metric, doc, labels=tok_labels)
            c.add_metric([name, "unified"], total)
            return c

        engines = state.engines
        yield counter("sglang:prompt_tokens", "Number of prefill tokens processed.", sum(e.total_prompt_tokens for e in engines))
        yield counter("sglang:generation_tokens", "Number of generation tokens processed.", sum(e.total_generation_tokens for e in engines))
        yield counter("sglang:num_requests", "Number of requests processed.", sum(e.total_requests for e in engines))
        yield counter("sglang:spec_verify_calls", "Number of speculative verify calls.", sum(e.total_verify_calls for e in engines))


class _Latency:
    """Tokenizer-side histograms, observed as requests progress."""

    def __init__(self, registry: CollectorRegistry, served_model_name: str):
        labels = ["model_name", "engine_type"]
        self.values = [served_model_name, "unified"]
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            labels, registry=registry,
            buckets=(0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 120, 160),
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            labels, registry=registry,
            buckets=(0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0),
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
            labels, registry=registry,
            buckets=(0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 120, 160, 200, 400, 800),
        )


# --- request plumbing ---------------------------------------------------------------------------


async def _stream(state: ServerState, req: Request, latency: _Latency | None) -> AsyncIterator[Chunk]:
    engine = state.pick_engine()
    engine.submit(req)
    last = req.arrival
    try:
        while True:
            item = await req.out.get()
            if isinstance(item, Exception):
                raise EngineDead(str(item))
            now = time.monotonic()
            if latency is not None:
                if req.generated == item.tokens:
                    latency.ttft.labels(*latency.values).observe(now - req.arrival)
                elif item.tokens:
                    gap = (now - last) / item.tokens
                    for _ in range(item.tokens):
                        latency.itl.labels(*latency.values).observe(gap)
                if item.finish_reason:
                    latency.e2e.labels(*latency.values).observe(now - req.arrival)
            last = now
            yield item
            if item.finish_reason:
                return
    finally:
        if req.finish_reason is None:
            req.cancelled = True
            engine._wake.set()


async def _collect(state: ServerState, req: Request, latency: _Latency | None) -> tuple[str, str | None, int | None]:
    """A whole non-streaming answer: its text, finish reason and matched stop."""
    texts, finish, matched = [], None, None
    async for chunk in _stream(state, req, latency):
        texts.append(chunk.text)
        finish, matched = chunk.finish_reason, chunk.matched_stop
    return "".join(texts), finish, matched


def _sampling(body: dict[str, Any], default_max: int) -> dict[str, Any]:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
    temperature = body.get("temperature")
    return {
        "max_new_tokens": int(max_tokens),
        "temperature": 1.0 if temperature is None else float(temperature),
        "top_p": 1.0 if body.get("top_p") is None else float(body["top_p"]),
        "ignore_eos": bool(body.get("ignore_eos", False)),
        "seed": body.get("seed"),
    }


def _usage(req: Request, version: str = "0.5.23") -> dict[str, Any]:
    """usage_processor.py · calculate_*_usage: completion_tokens counts thinking and answer;
    0.5.23 reports the thinking in `reasoning_tokens` and, only when there is some, in
    `completion_tokens_details.reasoning_tokens`; 0.5.9 leaves `reasoning_tokens` at 0."""
    reasoning = min(req.generated, req.think_len) if version != "0.5.9" else 0
    usage: dict[str, Any] = {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + req.generated,
        "completion_tokens": req.generated,
        "prompt_tokens_details": None,
        "reasoning_tokens": reasoning,
    }
    if version != "0.5.9":
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning} if reasoning else None
    return usage


def _check_length(state: ServerState, prompt_tokens: int, max_new: int) -> JSONResponse | None:
    context_len = state.resolved.raw.get("context_length") or state.resolved.profile.context_len
    if prompt_tokens + max_new > context_len:
        return _error(
            400,
            f"Requested token count exceeds the model's maximum context length of {context_len} "
            f"tokens. You requested a total of {prompt_tokens + max_new} tokens: {prompt_tokens} "
            f"tokens from the input messages and {max_new} tokens for the completion. Please "
            "reduce the number of tokens in the input messages or the completion to fit within "
            "the limit.",
        )
    return None


def _chat_prompt(messages: list[dict[str, Any]]) -> str:
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content or ''}<|im_end|>")
    parts.append("<|im_start|>assistant\n")
    return "\n".join(parts)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def build_app(state: ServerState) -> Starlette:
    registry = CollectorRegistry()
    registry.register(_EngineCollector(state))
    latency = _Latency(registry, state.served_model_name)
    resolved = state.resolved
    context_len = resolved.raw.get("context_length") or resolved.profile.context_len

    async def health_generate(request: HttpRequest) -> Response:
        if state.gracefully_exit:
            logger.info("Health check request received during shutdown. Returning 503.")
            return Response(status_code=503)
        if state.status == "Starting":
            return Response(status_code=503)
        # http_server.py · health_generate: a 1-token generate (log_metrics=False), then a poll
        # once a second until any output arrives, for up to HEALTH_CHECK_TIMEOUT (20 s): the
        # answer never comes sooner than 1 s.
        timeout = 20.0
        tic = time.time()
        probe = Request(rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", prompt="0", prompt_tokens=1,
                        max_new_tokens=1, temperature=0.0, log_metrics=False)
        engine = state.pick_engine()
        try:
            engine.submit(probe)
        except EngineDead:
            pass
        try:
            while time.time() < tic + timeout * state.time_scale:
                await asyncio.sleep(1.0 * state.time_scale)
                if (probe.generated or not probe.out.empty()) and state.healthy:
                    state.status = "Up"
                    return Response(status_code=200)
        finally:
            if probe.finish_reason is None:
                probe.cancelled = True
                engine._wake.set()
        logger.error(
            f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{int(timeout)} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(state.started_at))}"
        )
        state.status = "UnHealthy"
        return Response(status_code=503)

    async def ready(request: HttpRequest) -> Response:
        return Response(status_code=200 if state.status == "Up" and state.healthy else 503)

    def model_info_body() -> dict[str, Any]:
        args = resolved.raw
        return {
            "model_path": args["model_path"],
            "served_model_name": state.served_model_name,
            "tokenizer_path": args.get("tokenizer_path") or args["model_path"],
            "is_generation": True,
            "preferred_sampling_params": args.get("preferred_sampling_params"),
            "weight_version": args.get("weight_version") or "default",
            "load_format": args.get("load_format") or "auto",
            "reasoning_parser": args.get("reasoning_parser"),
            "tool_call_parser": args.get("tool_call_parser"),
            "disaggregation_mode": "null",
            "has_image_understanding": resolved.profile.is_multimodal,
            "has_audio_understanding": False,
            "model_type": resolved.profile.model_type,
            "architectures": [resolved.profile.architecture],
        }

    async def model_info(request: HttpRequest) -> Response:
        if request.url.path == "/get_model_info":
            logger.warning(
                "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                "Please use '/model_info' instead."
            )
        return JSONResponse(model_info_body())

    def memory_usage(plan) -> dict[str, Any]:
        """scheduler_components/memory_usage.py · build_memory_usage (0.5.23); 0.5.9's
        scheduler.py · get_internal_state has no startup_available and one graph figure."""
        if resolved.version == "0.5.9":
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

    def internal_state(engine: Engine) -> dict[str, Any]:
        plan = engine.plan
        out = resolved.as_dict()
        out.update(
            world_size=resolved.tp,
            startup_time=state.startup_time,
            effective_max_running_requests_per_dp=engine.max_running,
            last_gen_throughput=engine.last_gen_throughput,
            memory_usage=memory_usage(plan),
        )
        accept = engine.avg_spec_accept_length
        if accept is not None:
            out["avg_spec_accept_length"] = accept
        if engine.step_time_dict:
            out["step_time_dict"] = engine.step_time_dict
        return out

    async def server_info(request: HttpRequest) -> Response:
        if request.url.path == "/get_server_info":
            logger.warning(
                "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                "Please use '/server_info' instead."
            )
        body = resolved.as_dict()
        body.update(
            launch_command=state.launch_command,
            status="ready",
            # data_parallel_controller.py · _record_scheduler_init_infos: rank 0's figure only.
            max_total_num_tokens=state.engines[0].plan.max_total_num_tokens,
            max_req_input_len=context_len - 1,
            startup_time=state.startup_time,
            internal_states=[internal_state(e) for e in state.engines],
            version=resolved.version,
            frontend="python",
        )
        return JSONResponse(body)

    async def loads(request: HttpRequest) -> Response:
        include = request.query_params.get("include")
        sections = {s.strip() for s in include.split(",")} if include else {"all"}
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        if not sections <= valid:
            return JSONResponse(
                {"detail": f"Invalid include sections: {sections - valid}. Valid options: {sorted(valid)}"},
                status_code=400,
            )
        out = []
        for e in state.engines:
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
            if resolved.spec.enabled and sections & {"all", "spec"}:
                load["speculative"] = {"accept_length": e.last_accept_length, "accept_rate": e.last_accept_rate}
            out.append(load)
        body: dict[str, Any] = {"timestamp": datetime.now(timezone.utc).isoformat(), "version": resolved.version}
        if resolved.version != "0.5.9":
            # entrypoints/v1_loads.py · _num_accelerators_per_dp_rank (absent in 0.5.9)
            body["accelerator"] = resolved.profile.gpu.name
            body["num_accelerators"] = resolved.tp // resolved.dp if resolved.dp_attention else resolved.tp
        body["loads"] = out
        return JSONResponse(body)

    async def models(request: HttpRequest) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": state.served_model_name,
                        "object": "model",
                        "created": int(state.startup_time),
                        "owned_by": "sglang",
                        "root": state.served_model_name,
                        "parent": None,
                        "max_model_len": context_len,
                    }
                ],
            }
        )

    async def flush_cache(request: HttpRequest) -> Response:
        # Each rank flushes only when idle (and logs why not otherwise), as the scheduler does.
        flushed = [e.flush_cache() for e in state.engines]
        if all(flushed):
            return PlainTextResponse(
                "Cache flushed.\nPlease check backend logs for more details. (When there are running "
                "or waiting requests, the operation will not be performed.)\n"
            )
        return PlainTextResponse("Flush cache failed.\n", status_code=400)

    async def metrics(request: HttpRequest) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def read_json(request: HttpRequest) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "Invalid JSON body")
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object")
        return body

    def new_request(prompt: str, prompt_tokens: int, params: dict[str, Any], thinking: bool = False) -> Request:
        return Request(
            rid=uuid.uuid4().hex,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_new_tokens=params["max_new_tokens"],
            temperature=params["temperature"],
            top_p=params["top_p"],
            ignore_eos=params["ignore_eos"],
            seed=params["seed"],
            thinking=thinking,
        )

    def spec_meta(req: Request) -> dict[str, Any]:
        """tokenizer_manager.py · _calculate_spec_decoding_metrics (only once a verify ran),
        with the acceptance histogram: `spec_correct_drafts_histogram` on 0.5.23,
        `spec_accept_histogram` on 0.5.9 (verify steps by drafts accepted, per request)."""
        if not resolved.spec.enabled or not req.verify_ct:
            return {}
        proposed = req.verify_ct * (resolved.spec.draft_tokens - 1)
        if proposed <= 0:
            return {}
        meta = {
            "spec_accept_rate": req.accepted_drafts / proposed,
            "spec_accept_length": req.generated / req.verify_ct,
            "spec_num_correct_drafts": req.accepted_drafts,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": req.verify_ct,
        }
        key = "spec_accept_histogram" if resolved.version == "0.5.9" else "spec_correct_drafts_histogram"
        if req.correct_drafts_histogram:
            meta[key] = list(req.correct_drafts_histogram)
        return meta

    def spec_tokens_details(req: Request) -> dict[str, Any] | None:
        """openai/utils.py · spec_tokens_details_from_meta_info: every SpecTokensDetails field,
        defaults for the ones this request's meta_info lacks; None without any spec metric."""
        meta = spec_meta(req)
        if not meta:
            return None
        return {
            "spec_accept_rate": meta.get("spec_accept_rate") or 0.0,
            "spec_accept_length": meta.get("spec_accept_length") or 0.0,
            "spec_cap_length": 0.0,
            "spec_block_accept_length": 0.0,
            "spec_num_correct_drafts": meta.get("spec_num_correct_drafts") or 0,
            "spec_num_proposed_drafts": meta.get("spec_num_proposed_drafts") or 0,
            "spec_verify_ct": meta.get("spec_verify_ct") or 0,
            "spec_correct_drafts_histogram": meta.get("spec_correct_drafts_histogram") or [],
            "spec_cap_lens_histogram": [],
        }

    async def openai_completion(request: HttpRequest) -> Response:
        body = await read_json(request)
        if isinstance(body, JSONResponse):
            return body
        chat = request.url.path.endswith("/chat/completions")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "messages must be a non-empty list")
            prompt = _chat_prompt(messages)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                prompt = prompt[0] if prompt else ""
            if not isinstance(prompt, str):
                return _error(400, "prompt must be a string")
        try:
            params = _sampling(body, default_max=128 if not chat else context_len)
        except (TypeError, ValueError) as exc:
            return _error(400, f"Invalid sampling parameters: {exc}")
        prompt_tokens = count_tokens(prompt)
        if chat and not (body.get("max_completion_tokens") or body.get("max_tokens")):
            params["max_new_tokens"] = context_len - prompt_tokens
        bad = _check_length(state, prompt_tokens, params["max_new_tokens"])
        if bad is not None:
            return bad
        # A thinking model behind --reasoning-parser thinks first unless the chat template is
        # told not to (serving_chat.py: chat_template_kwargs.enable_thinking, default on);
        # separate_reasoning (default true) moves the thinking into reasoning_content.
        reasoning_parser = resolved.raw.get("reasoning_parser")
        thinking = False
        if chat and reasoning_parser:
            enable = (body.get("chat_template_kwargs") or {}).get("enable_thinking")
            thinking = True if enable is None else bool(enable)
        separate = bool(body.get("separate_reasoning", True)) and bool(reasoning_parser)
        # protocol.py: return_spec_tokens_details exists in 0.5.23's requests only.
        want_spec = bool(body.get("return_spec_tokens_details")) and resolved.version != "0.5.9"
        req = new_request(prompt, prompt_tokens, params, thinking)
        rid = f"chatcmpl-{req.rid}" if chat else f"cmpl-{req.rid}"
        created = int(time.time())
        model_name = body.get("model") or state.served_model_name
        obj = "chat.completion" if chat else "text_completion"
        if not state.healthy:
            return _error(503, "The server is not healthy.", "ServiceUnavailableError")

        def split(chunk: Chunk) -> tuple[str, str]:
            """(reasoning, content) of one chunk as the reasoning parser separates them."""
            if not separate or not chunk.reasoning_tokens:
                return "", chunk.text
            reasoning = chunk.reasoning_text
            if reasoning.endswith(" </think>"):
                reasoning = reasoning[: -len(" </think>")]
            return reasoning, chunk.text[len(chunk.reasoning_text):]

        if not body.get("stream"):
            reasoning_parts, content_parts, finish, matched = [], [], None, None
            try:
                async for chunk in _stream(state, req, latency):
                    r, c = split(chunk)
                    reasoning_parts.append(r)
                    content_parts.append(c)
                    finish, matched = chunk.finish_reason, chunk.matched_stop
            except EngineDead as exc:
                return _error(500, f"Internal server error: {exc}", "InternalServerError")
            text = "".join(content_parts)
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
            if chat:
                reasoning = "".join(reasoning_parts)
                choice["message"] = {"role": "assistant", "content": text, "reasoning_content": reasoning or None, "tool_calls": None}
            else:
                choice["text"] = text
            out = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model_name,
                "choices": [choice],
                "usage": _usage(req, resolved.version),
                "metadata": {"weight_version": "default"},
            }
            details = spec_tokens_details(req) if want_spec else None
            if details is not None:
                out["sglext"] = {"spec_tokens_details": details}
            return JSONResponse(out)

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))

        async def events() -> AsyncIterator[str]:
            chunk_obj = "chat.completion.chunk" if chat else "text_completion"

            def event(choice: dict[str, Any]) -> str:
                return _sse({"id": rid, "object": chunk_obj, "created": created, "model": model_name,
                             "choices": [choice], "usage": _usage(req, resolved.version) if continuous else None})

            if chat:
                yield event({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None, "matched_stop": None})
            try:
                async for chunk in _stream(state, req, latency):
                    end = {"finish_reason": chunk.finish_reason, "matched_stop": chunk.matched_stop}
                    none = {"finish_reason": None, "matched_stop": None}
                    if chat:
                        reasoning, content = split(chunk)
                        if reasoning:
                            yield event({"index": 0, "delta": {"role": None, "content": None, "reasoning_content": reasoning},
                                         "logprobs": None, **(none if content else end)})
                        if content or not reasoning:
                            yield event({"index": 0, "delta": {"role": None, "content": content, "reasoning_content": None},
                                         "logprobs": None, **end})
                    else:
                        yield event({"index": 0, "text": chunk.text, "logprobs": None, **end})
            except EngineDead as exc:
                yield _sse({"object": "error", "message": f"Internal server error: {exc}", "type": "InternalServerError", "param": None, "code": 500})
                return
            details = spec_tokens_details(req) if want_spec else None
            if details is not None:
                # serving_chat.py · _generate_chat_stream: a choices-less chunk carrying sglext.
                yield _sse({"id": rid, "object": chunk_obj, "created": created, "model": model_name, "choices": [],
                            "usage": None, "sglext": {"spec_tokens_details": details}})
            if include_usage:
                yield _sse({"id": rid, "object": chunk_obj, "created": created, "model": model_name, "choices": [], "usage": _usage(req, resolved.version)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def generate(request: HttpRequest) -> Response:
        body = await read_json(request)
        if isinstance(body, JSONResponse):
            return body
        text = body.get("text")
        if isinstance(text, list):
            text = text[0] if text else ""
        if text is None and body.get("input_ids") is not None:
            ids = body["input_ids"]
            text = " ".join(str(i) for i in (ids if isinstance(ids, list) else [ids]))
        if not isinstance(text, str):
            return _error(400, "text must be a string")
        sp = body.get("sampling_params") or {}
        params = {
            "max_new_tokens": int(sp.get("max_new_tokens", 128)),
            "temperature": float(sp.get("temperature", 1.0)),
            "top_p": float(sp.get("top_p", 1.0)),
            "ignore_eos": bool(sp.get("ignore_eos", False)),
            "seed": sp.get("sampling_seed"),
        }
        prompt_tokens = count_tokens(text)
        bad = _check_length(state, prompt_tokens, params["max_new_tokens"])
        if bad is not None:
            return bad
        req = new_request(text, prompt_tokens, params)

        def meta(finish: str | None, matched: int | None) -> dict[str, Any]:
            info: dict[str, Any] = {
                "id": req.rid,
                "finish_reason": {"type": finish, "length": req.generated} if finish == "length" else ({"type": finish, "matched": matched} if finish else None),
                "prompt_tokens": req.prompt_tokens,
                "weight_version": "default",
                "completion_tokens": req.generated,
                "cached_tokens": 0,
                "e2e_latency": time.monotonic() - req.arrival,
            }
            info.update(spec_meta(req))
            return info

        if not body.get("stream"):
            try:
                text, finish, matched = await _collect(state, req, latency)
            except EngineDead as exc:
                return _error(500, f"Internal server error: {exc}", "InternalServerError")
            return JSONResponse({"text": text, "output_ids": list(range(req.generated)), "meta_info": meta(finish, matched)})

        async def events() -> AsyncIterator[str]:
            acc = []
            async for chunk in _stream(state, req, latency):
                acc.append(chunk.text)
                yield _sse({"text": "".join(acc), "output_ids": list(range(req.generated)), "meta_info": meta(chunk.finish_reason, chunk.matched_stop)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    routes = [
        Route("/health", health_generate, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/v1/loads", loads, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/v1/chat/completions", openai_completion, methods=["POST"]),
        Route("/v1/completions", openai_completion, methods=["POST"]),
        Route("/generate", generate, methods=["POST", "PUT"]),
    ]
    if resolved.raw.get("enable_metrics"):
        routes.append(Route("/metrics", metrics, methods=["GET"]))

    app = Starlette(routes=routes)

    class ApiKeyMiddleware:
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http":
                request = HttpRequest(scope, receive=receive)
                allowed, status = _authorized(state, request)
                if not allowed:
                    response = JSONResponse({"error": "Unauthorized" if status == 401 else "Forbidden"}, status_code=status)
                    await response(scope, receive, send)
                    return
            await self.inner(scope, receive, send)

    return ApiKeyMiddleware(app)
