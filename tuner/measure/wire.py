"""SGLang's wire format and the HTTP client the benchmark sends requests through (the `openai`
client for the chat stream, httpx for native `/generate`): what a stream delta carries, the
`sglext.spec_tokens_details` and `meta_info` fields, and one request in, one `RequestResult`
out.  Field names are SGLang 0.5.23's (docs/sglang-0.5.23.md, docs/sglang-real-server.md)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import replace

import httpx
import openai

from tuner.config import BenchConfig
from tuner.errors import ConfigError, MeasureError
from tuner.measure.result import RequestResult
from tuner.measure.stalls import LoopWatch
from tuner.measure.workload import Prompt

__all__ = ["StreamClient", "step_tokens", "sum_histograms"]


def _carries_tokens(delta) -> bool:
    """A stream delta with generated tokens of any kind: the answer, thinking
    (`reasoning_content`, an SGLang extension field) or a tool call."""
    if delta is None:
        return False
    extra = delta.model_extra or {}
    return bool(delta.content or extra.get("reasoning_content") or delta.tool_calls)


def _spec_details(chunk) -> dict | None:
    """`sglext.spec_tokens_details` of a chunk (0.5.23 sends it in a chunk of its own, before
    the usage chunk: serving_chat.py · _generate_chat_stream)."""
    sglext = (chunk.model_extra or {}).get("sglext")
    details = sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None
    if isinstance(details, list):  # one per choice (n > 1)
        details = details[0] if details else None
    return details if isinstance(details, dict) else None


def _histogram(value) -> tuple[int, ...] | None:
    """A per-request accept histogram as SGLang reports it (a list of step counts), or None."""
    if not isinstance(value, list) or not value:
        return None
    try:
        hist = tuple(int(x) for x in value)
    except (TypeError, ValueError):
        return None
    return hist if sum(hist) > 0 and min(hist) >= 0 else None


def sum_histograms(hists) -> tuple[int, ...] | None:
    hists = [h for h in hists if h]
    if not hists:
        return None
    out = [0] * max(len(h) for h in hists)
    for h in hists:
        for k, n in enumerate(h):
            out[k] += n
    return tuple(out)


def step_tokens(counts: list[tuple[int, int | None]]) -> list[int]:
    """Tokens per verify step from a stream's cumulative (completion_tokens, spec_verify_ct)
    per chunk: the differences, first and last chunk dropped; where the chunks count verify
    steps, a delta spanning more (or fewer) than one step was coalesced and is not kept."""
    steps = []
    pairs = list(zip(counts, counts[1:]))[:-1]
    for (t0, v0), (t1, v1) in pairs:
        if v0 is not None and v1 is not None and v1 - v0 != 1:
            continue
        if t1 > t0:
            steps.append(t1 - t0)
    return steps


def _reasoning_tokens(usage) -> int | None:
    """Thinking tokens of a completion: SGLang 0.5.23's usage.reasoning_tokens, or OpenAI's
    completion_tokens_details.reasoning_tokens; None when the server does not count them."""
    value = (usage.model_extra or {}).get("reasoning_tokens")
    details = getattr(usage, "completion_tokens_details", None)
    if not value and details is not None and details.reasoning_tokens:
        value = details.reasoning_tokens
    return int(value) if value else None


def _refused(exc: openai.APIStatusError, prompt: Prompt) -> ConfigError | MeasureError:
    """A request the server answered with an error status.  One longer than its context is the
    workload's fault, not the launch's: no searched flag changes the context length, and every
    launch would fail the same request after its load (SGLang's tokenizer_manager.py ·
    _validate_one_request), so it stops the run."""
    if exc.status_code == 400 and "context length" in str(exc.message):
        return ConfigError(f"[bench] prompts: the server refused a {prompt.request_class or prompt.category or 'workload'} "
                           f"request as longer than its context ({_first_sentence(exc)}); shorten or drop the "
                           "longest prompts, lower [bench] max_tokens, or raise the server's --context-length")
    return MeasureError(f"the server answered {exc.status_code} mid-benchmark: {str(exc.message)[:200]}")


def _first_sentence(exc: openai.APIStatusError) -> str:
    """The server's own words for an error: SGLang's JSON `message` (openai keeps the body), its first sentence."""
    body = exc.body if isinstance(exc.body, dict) else {}
    text = str(body.get("message") or re.sub(r"^Error code: \d+ - ", "", str(exc.message)))
    return text.split(". ")[0].strip().rstrip(".")[:200]


class StreamClient:
    def __init__(self, url: str, api_key: str | None, bench: BenchConfig, model: str):
        self.bench = bench
        self.model = model
        self.client = openai.AsyncOpenAI(
            base_url=url.rstrip("/") + "/v1",
            api_key=api_key or "EMPTY",
            max_retries=0,
            # A hung server is seen after stall_timeout_s without a byte, not after a whole request.
            timeout=httpx.Timeout(bench.request_timeout_s, read=bench.stall_timeout_s, connect=10.0),
        )
        self.sent = 0
        self.ignore_eos = bench.ignore_eos
        self.watch = LoopWatch()  # when this client itself could not run: stalls.py
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, trust_env=False,
                                      timeout=httpx.Timeout(bench.request_timeout_s, read=bench.stall_timeout_s, connect=10.0))

    async def one(self, prompt: Prompt, max_tokens: int) -> RequestResult:
        """One streamed chat request, timed by when its chunks were read; `client_stall_s`
        says how long of it the client itself could not run."""
        self.watch.start()
        try:
            result = await asyncio.wait_for(self._one(prompt, max_tokens), self.bench.request_timeout_s)
        except asyncio.TimeoutError:
            raise MeasureError(f"a request took longer than request_timeout_s={self.bench.request_timeout_s:g} s") from None
        return replace(result, client_stall_s=self.watch.starved_s(result.start, result.end),
                       client_stall_gaps=self.watch.starved_gaps(result.chunk_times))

    async def _one(self, prompt: Prompt, max_tokens: int) -> RequestResult:
        self.sent += 1
        extra = self._extra_body()
        start = time.monotonic()
        first = None
        chunk_times: list[float] = []
        usage = None
        finish = None
        details = None
        try:
            stream = await self.client.chat.completions.create(
                model=self.model,
                messages=list(prompt.messages),
                max_tokens=max_tokens,
                temperature=self.bench.temperature,
                top_p=self.bench.top_p,
                seed=self.bench.seed + self.sent if self.bench.temperature > 0 else None,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            )
            async for chunk in stream:
                if chunk.choices:
                    choice = chunk.choices[0]
                    if _carries_tokens(choice.delta):
                        now = time.monotonic()
                        first = first or now
                        chunk_times.append(now)
                    if choice.finish_reason:
                        finish = choice.finish_reason
                details = _spec_details(chunk) or details
                if chunk.usage is not None:
                    usage = chunk.usage
        except openai.APIStatusError as exc:
            raise _refused(exc, prompt) from None
        except openai.APITimeoutError as exc:
            raise MeasureError(f"the server sent nothing for {self.bench.stall_timeout_s:g} s mid-benchmark: it hangs") from exc
        except openai.APIConnectionError as exc:
            raise MeasureError(f"the server stopped answering mid-benchmark ({exc.__cause__ or exc})") from exc
        end = time.monotonic()
        if usage is None:
            raise MeasureError("the server sent no usage with stream_options.include_usage; token counts cannot be trusted")
        if first is None:
            first = end
        return RequestResult(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            start=start,
            first_token=first,
            end=end,
            chunk_times=tuple(chunk_times),
            finish_reason=finish,
            reasoning_tokens=_reasoning_tokens(usage),
            spec_verify_ct=details.get("spec_verify_ct") if details else None,
            accept_histogram=_histogram((details or {}).get("spec_correct_drafts_histogram")),
            request_class=prompt.request_class or prompt.category,
            max_tokens=max_tokens,
            prompt_key=hash((prompt.text, max_tokens)),
        )

    def _extra_body(self) -> dict:
        # Unknown fields are ignored by SGLang's request models (0.5.9 too); 0.5.23 answers
        # return_spec_tokens_details with sglext.spec_tokens_details in the stream.
        extra: dict = {"return_spec_tokens_details": True}
        if self.ignore_eos:
            extra["ignore_eos"] = True
        if self.bench.thinking != "server":
            extra["chat_template_kwargs"] = {"enable_thinking": self.bench.thinking == "on"}
        return extra

    async def generate(self, prompt: Prompt, max_tokens: int) -> tuple[int, int | None, tuple[int, ...] | None]:
        """One native `/generate` request: (completion tokens, spec_verify_ct, verify steps by
        drafts accepted) from its meta_info (tokenizer_manager.py ·
        _calculate_spec_decoding_metrics; the histogram is `spec_correct_drafts_histogram` on
        0.5.23, `spec_accept_histogram` on 0.5.9)."""
        body = {"text": prompt.text, "sampling_params": {"max_new_tokens": max_tokens, "temperature": self.bench.temperature,
                                                         "top_p": self.bench.top_p, "ignore_eos": self.ignore_eos}}
        try:
            res = await self.http.post("/generate", json=body)
        except httpx.HTTPError as exc:
            raise MeasureError(f"/generate: {exc}; the server stopped answering") from exc
        if res.status_code != 200:
            return 0, None, None
        meta = res.json().get("meta_info") or {}
        hist = _histogram(meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram"))
        return int(meta.get("completion_tokens") or 0), meta.get("spec_verify_ct"), hist

    async def generate_steps(self, prompt: Prompt, max_tokens: int) -> list[int]:
        """One streaming native `/generate` request: the tokens each verify step produced
        (cumulative `meta_info.completion_tokens`, differenced).  Asked with stream_interval 1
        (a per-request override of `--stream-interval`), SGLang sends a chunk per decode
        iteration, but its tokenizer manager coalesces chunks a slow reader has not taken yet
        (tokenizer_manager.py · _wait_one_response): where the chunks carry the cumulative
        `spec_verify_ct`, only deltas of exactly one verify step are kept.  The first chunk (the
        prefill's token) and the last (max_tokens may cut it) are dropped."""
        body = {"text": prompt.text, "stream": True,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": self.bench.temperature,
                                    "top_p": self.bench.top_p, "ignore_eos": self.ignore_eos, "stream_interval": 1}}
        counts: list[tuple[int, int | None]] = []
        try:
            async with self.http.stream("POST", "/generate", json=body) as res:
                if res.status_code != 200:
                    return []
                async for line in res.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    try:
                        meta = json.loads(line[5:])["meta_info"]
                        ct = meta.get("spec_verify_ct")
                        counts.append((int(meta["completion_tokens"]), None if ct is None else int(ct)))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        return []
        except httpx.HTTPError:
            return []
        return step_tokens(counts)

    async def close(self) -> None:
        await self.watch.stop()
        await self.http.aclose()
        await self.client.close()
