"""The SGLang server's own endpoints: readiness, server info, cache flush, loads, metrics.

Everything read here is SGLang 0.5.23's JSON (docs/sglang-0.5.23.md §3); fields
that older or other servers may lack are optional, never assumed.  The benchmark's traffic
goes through the `openai` client in `measure.py`, not through here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tuner.errors import MeasureError

__all__ = ["ServerClient", "ServerInfo"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerInfo:
    """What the server reports about itself once it is up."""

    version: str | None
    max_total_num_tokens: int  # summed over DP ranks
    max_running_requests: int  # the effective cap, summed over DP ranks
    dp_size: int
    args: dict[str, Any] = field(default_factory=dict)
    accept_length: float | None = None  # avg_spec_accept_length since start / last flush
    accelerator: str | None = None  # GPU model, from /v1/loads when the server has it
    num_accelerators: int | None = None  # GPUs per DP rank

    @property
    def gpu_count(self) -> int | None:
        return self.num_accelerators * self.dp_size if self.num_accelerators else None


class ServerClient:
    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, trust_env=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ServerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health_generate(self, timeout_s: float = 30.0) -> int | None:
        """HTTP status of /health_generate (200 once the server generates), None if unreachable.
        A server without that route (404) is asked /health instead."""
        try:
            status = self._http.get("/health_generate", timeout=timeout_s).status_code
            if status == 404:
                status = self._http.get("/health", timeout=timeout_s).status_code
            return status
        except httpx.HTTPError:
            return None

    def answers(self) -> bool:
        """Whether anything answers HTTP at the URL (any status)."""
        try:
            self._http.get("/health", timeout=3.0)
            return True
        except httpx.HTTPError:
            return False

    def _get_json(self, path: str, *, fallback: str | None = None) -> dict[str, Any]:
        try:
            res = self._http.get(path)
            if res.status_code == 404 and fallback:
                res = self._http.get(fallback)
            if res.status_code == 401:
                raise MeasureError(f"{self.url}{path}: 401 Unauthorized; set [target] api_key_env to the variable holding the server's --api-key")
            res.raise_for_status()
            return res.json()
        except httpx.HTTPStatusError as exc:
            raise MeasureError(f"{self.url}{path} answered {exc.response.status_code}: {exc.response.text[:200]}") from exc
        except httpx.HTTPError as exc:
            raise MeasureError(f"{self.url}{path}: {type(exc).__name__}: {exc}; the server stopped answering") from exc
        except ValueError as exc:
            raise MeasureError(f"{self.url}{path} did not answer JSON") from exc

    def server_info(self) -> ServerInfo:
        body = self._get_json("/server_info", fallback="/get_server_info")
        states = body.get("internal_states") or []
        per_rank_tokens = body.get("max_total_num_tokens")
        if per_rank_tokens is None and states:
            per_rank_tokens = (states[0].get("memory_usage") or {}).get("token_capacity")
        if per_rank_tokens is None:
            raise MeasureError(f"{self.url}/server_info has no max_total_num_tokens; is this an SGLang server?")
        dp = max(len(states), 1)
        running = [s.get("effective_max_running_requests_per_dp") for s in states]
        loads = self.loads()
        if states and all(isinstance(r, int) for r in running):
            max_running = sum(running)
        elif loads and loads.get("loads"):
            max_running = sum(int(rank.get("max_running_requests", 0)) for rank in loads["loads"])
        else:
            # Older servers: only the declared value, which may exceed what fits.
            max_running = int(body.get("max_running_requests") or 0) * dp
        accept = [s.get("avg_spec_accept_length") for s in states if s.get("avg_spec_accept_length") is not None]
        return ServerInfo(
            version=body.get("version"),
            max_total_num_tokens=int(per_rank_tokens) * dp,
            max_running_requests=int(max_running),
            dp_size=dp,
            args=body,
            accept_length=sum(accept) / len(accept) if accept else None,
            accelerator=(loads or {}).get("accelerator"),
            num_accelerators=(loads or {}).get("num_accelerators"),
        )

    def accept_length(self) -> float | None:
        body = self._get_json("/server_info", fallback="/get_server_info")
        values = [s["avg_spec_accept_length"] for s in body.get("internal_states") or [] if s.get("avg_spec_accept_length") is not None]
        return sum(values) / len(values) if values else None

    def loads(self) -> dict[str, Any] | None:
        try:
            res = self._http.get("/v1/loads", params={"include": "core"})
            return res.json() if res.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def flush_cache(self, *, attempts: int = 20, wait_s: float = 0.25) -> bool:
        """Flush; SGLang refuses (400) while requests run, so retry briefly.  False when the
        server has no such route (the accept length then includes the warm-up)."""
        last = ""
        for _ in range(attempts):
            try:
                res = self._http.post("/flush_cache")
            except httpx.HTTPError as exc:
                raise MeasureError(f"{self.url}/flush_cache: {exc}; the server stopped answering") from exc
            if res.status_code == 200:
                return True
            if res.status_code in (404, 405):
                logger.warning("%s has no /flush_cache: the accept length includes the warm-up", self.url)
                return False
            last = res.text.strip()
            time.sleep(wait_s)
        raise MeasureError(f"{self.url}/flush_cache kept refusing ({last[:100]}); is other traffic reaching this server?")

    def metrics(self) -> str | None:
        try:
            res = self._http.get("/metrics")
            return res.text if res.status_code == 200 else None
        except httpx.HTTPError:
            return None
