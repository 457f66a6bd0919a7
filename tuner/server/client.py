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

__all__ = ["ServerClient", "ServerInfo", "Rank"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rank:
    """One data-parallel rank's own capacity (`internal_states[r]`): a request lives on one
    rank, so capacity is counted per rank, never as rank 0's figure times dp."""

    max_total_num_tokens: int  # memory_usage.token_capacity
    max_running_requests: int  # effective_max_running_requests_per_dp


@dataclass(frozen=True)
class ServerInfo:
    """What the server reports about itself once it is up (docs/sglang-real-server.md rows 4, 9)."""

    version: str | None
    ranks: tuple[Rank, ...]
    args: dict[str, Any] = field(default_factory=dict)
    accept_length: float | None = None  # avg_spec_accept_length (folded every 40 decode steps: a cross-check only)
    accelerator: str | None = None  # GPU model, from /v1/loads when the server has it (not 0.5.9)
    num_accelerators: int | None = None  # GPUs per DP rank
    architecture: str | None = None  # /model_info architectures[0]

    @property
    def dp_size(self) -> int:
        return len(self.ranks)

    @property
    def max_total_num_tokens(self) -> int:
        """KV tokens summed over DP ranks (the top-level field is rank 0's alone)."""
        return sum(r.max_total_num_tokens for r in self.ranks)

    @property
    def max_running_requests(self) -> int:
        """The effective running-request cap summed over DP ranks (the top-level field is the
        declared argument: 48 under speculation whatever fits)."""
        return sum(r.max_running_requests for r in self.ranks)

    @property
    def gpu_count(self) -> int | None:
        return self.num_accelerators * self.dp_size if self.num_accelerators else None

    @property
    def speculative(self) -> bool:
        return bool(self.args.get("speculative_algorithm"))

    @property
    def attention_backend(self) -> str | None:
        return self.args.get("attention_backend")

    @property
    def page_size(self) -> int | None:
        return self.args.get("page_size")

    @property
    def speculative_adaptive(self) -> bool | None:
        """Whether adaptive steps really run (SGLang falls back to static silently); None on a
        server without the field (0.5.9)."""
        return self.args.get("speculative_adaptive")


def _accelerators_per_dp_rank(args: dict[str, Any]) -> int | None:
    """GPUs behind one DP rank, counted from the server's own arguments as SGLang counts them
    for `/v1/loads` (`entrypoints/v1_loads.py · _num_accelerators_per_dp_rank`: tp x pp, over
    the DP ranks under DP attention).  0.5.9's `/v1/loads` has no accelerator fields, but its
    `/server_info` carries every argument; without this a four-GPU rank on 0.5.9 was taken for
    one, and the memory model's reserve range missed its communication buffers."""
    tp = args.get("tp_size")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        return None
    count = tp * max(int(args.get("pp_size") or 1), 1)
    if args.get("enable_dp_attention") and int(args.get("dp_size") or 1) > 1:
        count //= int(args["dp_size"])
    return max(count, 1)


def _ranks(body: dict[str, Any], loads: dict[str, Any] | None) -> tuple[Rank, ...]:
    """Per-rank capacity: internal_states first, then /v1/loads, then the top-level fields
    (a single-rank server that reports nothing else)."""
    states = body.get("internal_states") or []
    by_load = {int(x.get("dp_rank", i)): x for i, x in enumerate((loads or {}).get("loads") or [])}
    out = []
    for i, state in enumerate(states):
        load = by_load.get(i, {})
        tokens = (state.get("memory_usage") or {}).get("token_capacity") or load.get("max_total_num_tokens")
        running = state.get("effective_max_running_requests_per_dp") or load.get("max_running_requests")
        if tokens is None and len(states) == 1:
            tokens = body.get("max_total_num_tokens")
        if running is None and len(states) == 1:
            running = body.get("max_running_requests")
        if tokens is None or running is None:
            raise MeasureError(f"DP rank {i} reports no token_capacity / effective_max_running_requests_per_dp in /server_info or /v1/loads")
        out.append(Rank(int(tokens), int(running)))
    if out:
        return tuple(out)
    if by_load:
        return tuple(Rank(int(x["max_total_num_tokens"]), int(x["max_running_requests"])) for _, x in sorted(by_load.items()))
    if body.get("max_total_num_tokens") is None:
        raise MeasureError("/server_info has no max_total_num_tokens; is this an SGLang server?")
    return (Rank(int(body["max_total_num_tokens"]), int(body.get("max_running_requests") or 0)),)


class ServerClient:
    def __init__(self, url: str, *, api_key: str | None = None, admin_api_key: str | None = None, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # /flush_cache is ADMIN_OPTIONAL (utils/auth.py · decide_request_auth): with
        # --admin-api-key only that key may call it.
        self._admin_headers = {"Authorization": f"Bearer {admin_api_key}"} if admin_api_key else None
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
        """Whether anything listens at the URL.  SGLang's /health runs a one-token generate and
        sleeps at least 1 s (up to 20 s): a slow answer is an answer, only a refused or
        unreachable connection is not."""
        try:
            self._http.get("/health", timeout=httpx.Timeout(5.0, connect=3.0))
            return True
        except (httpx.ConnectError, httpx.ConnectTimeout):
            return False
        except httpx.HTTPError:
            return True

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
        loads = self.loads()
        accept = [x.get("avg_spec_accept_length") for x in body.get("internal_states") or [] if x.get("avg_spec_accept_length") is not None]
        return ServerInfo(
            version=body.get("version"),
            ranks=_ranks(body, loads),
            args=body,
            accept_length=sum(accept) / len(accept) if accept else None,
            accelerator=(loads or {}).get("accelerator"),
            num_accelerators=(loads or {}).get("num_accelerators") or _accelerators_per_dp_rank(body),
            architecture=self.architecture(),
        )

    def architecture(self) -> str | None:
        """`/model_info.architectures[0]`: what SGLang keys its default speculative shape on."""
        try:
            res = self._http.get("/model_info")
            if res.status_code == 404:
                res = self._http.get("/get_model_info")
            names = res.json().get("architectures") if res.status_code == 200 else None
            return names[0] if names else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

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
                res = self._http.post("/flush_cache", headers=self._admin_headers)
            except httpx.HTTPError as exc:
                raise MeasureError(f"{self.url}/flush_cache: {exc}; the server stopped answering") from exc
            if res.status_code == 200:
                return True
            if res.status_code in (401, 403):
                raise MeasureError(
                    f"{self.url}/flush_cache: {res.status_code} Unauthorized: the server runs with --admin-api-key; "
                    "set [target] admin_api_key_env to the variable holding it"
                )
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
