"""SGLang 0.5.23's HTTP surface (`srt/entrypoints/http_server.py`) over the emulator's engines.

Routes, status codes, JSON fields and auth rules are SGLang's; see `docs/sglang-0.5.23.md` §3.
The handlers only translate between HTTP and `engine.Engine`, one module per kind:
`status.py` (health, info, loads, flush), `completions.py` (OpenAI and native generation),
`metrics.py` (Prometheus); `state.py` holds what they share.  This module routes and guards.
"""

from __future__ import annotations

import secrets

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from .completions import Completions
from .metrics import EngineCollector, Latency, metrics_endpoint
from .state import ServerState
from .status import StatusEndpoints

__all__ = ["ServerState", "build_app", "SGLANG_VERSION"]

SGLANG_VERSION = "0.5.23"  # default; Resolved.version says which release is played


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


def _routes(state: ServerState) -> list[Route]:
    registry = CollectorRegistry()
    registry.register(EngineCollector(state))
    status = StatusEndpoints(state)
    gen = Completions(state, Latency(registry, state.served_model_name))
    routes = [
        Route("/health", status.health_generate, methods=["GET"]),
        Route("/health_generate", status.health_generate, methods=["GET"]),
        Route("/ready", status.ready, methods=["GET"]),
        Route("/model_info", status.model_info, methods=["GET"]),
        Route("/get_model_info", status.model_info, methods=["GET"]),
        Route("/server_info", status.server_info, methods=["GET"]),
        Route("/get_server_info", status.server_info, methods=["GET"]),
        Route("/v1/loads", status.loads, methods=["GET"]),
        Route("/v1/models", status.models, methods=["GET"]),
        Route("/flush_cache", status.flush_cache, methods=["GET", "POST"]),
        Route("/v1/chat/completions", gen.openai_completion, methods=["POST"]),
        Route("/v1/completions", gen.openai_completion, methods=["POST"]),
        Route("/generate", gen.generate, methods=["POST", "PUT"]),
    ]
    if state.resolved.raw.get("enable_metrics"):
        routes.append(Route("/metrics", metrics_endpoint(registry), methods=["GET"]))
    return routes


class ApiKeyMiddleware:
    """srt/utils/auth.py: a request the keys do not admit gets 401 before any route sees it."""

    def __init__(self, inner, state: ServerState):
        self.inner = inner
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            request = HttpRequest(scope, receive=receive)
            allowed, status = _authorized(self.state, request)
            if not allowed:
                response = JSONResponse({"error": "Unauthorized" if status == 401 else "Forbidden"}, status_code=status)
                await response(scope, receive, send)
                return
        await self.inner(scope, receive, send)


def build_app(state: ServerState) -> ApiKeyMiddleware:
    return ApiKeyMiddleware(Starlette(routes=_routes(state)), state)
