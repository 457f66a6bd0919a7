"""SGLang 0.5.23's generation endpoints: `/v1/chat/completions` and `/v1/completions`
(`srt/entrypoints/openai/serving_chat.py`, `serving_completions.py`), streamed or whole, and the
native `/generate` (`http_server.py · generate_request`).  A request is parsed into a `Call`,
then answered whole or as server-sent events; the engines do the decoding."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from .engine import Chunk, EngineDead, Request, count_tokens
from .metrics import Latency
from .state import ServerState, error

__all__ = ["Completions", "chat_prompt"]


# --- request plumbing ---------------------------------------------------------------------------


async def _stream(state: ServerState, req: Request, latency: Latency | None) -> AsyncIterator[Chunk]:
    engine = state.pick_engine()
    engine.submit(req)
    last, first = req.arrival, True
    try:
        while True:
            item = await req.out.get()
            if isinstance(item, Exception):
                raise EngineDead(str(item))
            now = time.monotonic()
            if latency is not None:
                # The first chunk, not "the tokens so far are this chunk's": the engine may have
                # decoded further before a loaded event loop reads the queue (a fresh-clone suite
                # beside a CPU hog scraped a /metrics with no TTFT sample after a whole request).
                if first:
                    latency.ttft.labels(*latency.values).observe(now - req.arrival)
                elif item.tokens:
                    gap = (now - last) / item.tokens
                    for _ in range(item.tokens):
                        latency.itl.labels(*latency.values).observe(gap)
                if item.finish_reason:
                    latency.e2e.labels(*latency.values).observe(now - req.arrival)
            last, first = now, False
            yield item
            if item.finish_reason:
                return
    finally:
        if req.finish_reason is None:
            req.cancelled = True
            engine._wake.set()


async def _collect(state: ServerState, req: Request, latency: Latency | None) -> tuple[str, str | None, int | None]:
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
        return error(
            400,
            f"Requested token count exceeds the model's maximum context length of {context_len} "
            f"tokens. You requested a total of {prompt_tokens + max_new} tokens: {prompt_tokens} "
            f"tokens from the input messages and {max_new} tokens for the completion. Please "
            "reduce the number of tokens in the input messages or the completion to fit within "
            "the limit.",
        )
    return None


def chat_prompt(messages: list[dict[str, Any]]) -> str:
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


async def _read_json(request: HttpRequest) -> dict[str, Any] | JSONResponse:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error(400, "Invalid JSON body")
    if not isinstance(body, dict):
        return error(400, "The request body must be a JSON object")
    return body


def _split(chunk: Chunk, separate: bool) -> tuple[str, str]:
    """(reasoning, content) of one chunk as the reasoning parser separates them."""
    if not separate or not chunk.reasoning_tokens:
        return "", chunk.text
    reasoning = chunk.reasoning_text
    if reasoning.endswith(" </think>"):
        reasoning = reasoning[: -len(" </think>")]
    return reasoning, chunk.text[len(chunk.reasoning_text):]


def _openai_prompt(body: dict[str, Any], chat: bool) -> str | JSONResponse:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error(400, "messages must be a non-empty list")
        return chat_prompt(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    if not isinstance(prompt, str):
        return error(400, "prompt must be a string")
    return prompt


@dataclass
class Call:
    """One OpenAI-style request, parsed: what its answer carries besides the tokens."""

    chat: bool
    req: Request
    rid: str
    created: int
    model_name: str
    separate: bool  # reasoning moved into reasoning_content
    want_spec: bool  # sglext.spec_tokens_details asked for
    include_usage: bool
    continuous: bool  # usage in every chunk

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


class Completions:
    """The generation handlers, bound to one server's state and latency histograms."""

    def __init__(self, state: ServerState, latency: Latency):
        self.state = state
        self.latency = latency
        self.resolved = state.resolved
        self.context_len = self.resolved.raw.get("context_length") or self.resolved.profile.context_len

    def new_request(self, prompt: str, prompt_tokens: int, params: dict[str, Any], thinking: bool = False) -> Request:
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

    def spec_meta(self, req: Request) -> dict[str, Any]:
        """tokenizer_manager.py · _calculate_spec_decoding_metrics (only once a verify ran),
        with the acceptance histogram: `spec_correct_drafts_histogram` on 0.5.23,
        `spec_accept_histogram` on 0.5.9 (verify steps by drafts accepted, per request)."""
        if not self.resolved.spec.enabled or not req.verify_ct:
            return {}
        proposed = req.verify_ct * (self.resolved.spec.draft_tokens - 1)
        if proposed <= 0:
            return {}
        meta = {
            "spec_accept_rate": req.accepted_drafts / proposed,
            "spec_accept_length": req.generated / req.verify_ct,
            "spec_num_correct_drafts": req.accepted_drafts,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": req.verify_ct,
        }
        key = "spec_accept_histogram" if self.resolved.version == "0.5.9" else "spec_correct_drafts_histogram"
        if req.correct_drafts_histogram:
            meta[key] = list(req.correct_drafts_histogram)
        return meta

    def spec_tokens_details(self, req: Request) -> dict[str, Any] | None:
        """openai/utils.py · spec_tokens_details_from_meta_info: every SpecTokensDetails field,
        defaults for the ones this request's meta_info lacks; None without any spec metric."""
        meta = self.spec_meta(req)
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

    def _openai_call(self, body: dict[str, Any], chat: bool) -> Call | JSONResponse:
        prompt = _openai_prompt(body, chat)
        if isinstance(prompt, JSONResponse):
            return prompt
        try:
            params = _sampling(body, default_max=128 if not chat else self.context_len)
        except (TypeError, ValueError) as exc:
            return error(400, f"Invalid sampling parameters: {exc}")
        prompt_tokens = count_tokens(prompt)
        if chat and not (body.get("max_completion_tokens") or body.get("max_tokens")):
            params["max_new_tokens"] = self.context_len - prompt_tokens
        bad = _check_length(self.state, prompt_tokens, params["max_new_tokens"])
        if bad is not None:
            return bad
        # A thinking model behind --reasoning-parser thinks first unless the chat template is
        # told not to (serving_chat.py: chat_template_kwargs.enable_thinking, default on);
        # separate_reasoning (default true) moves the thinking into reasoning_content.
        reasoning_parser = self.resolved.raw.get("reasoning_parser")
        thinking = False
        if chat and reasoning_parser:
            enable = (body.get("chat_template_kwargs") or {}).get("enable_thinking")
            thinking = True if enable is None else bool(enable)
        req = self.new_request(prompt, prompt_tokens, params, thinking)
        options = body.get("stream_options") or {}
        return Call(chat=chat, req=req, rid=f"chatcmpl-{req.rid}" if chat else f"cmpl-{req.rid}", created=int(time.time()),
                    model_name=body.get("model") or self.state.served_model_name,
                    separate=bool(body.get("separate_reasoning", True)) and bool(reasoning_parser),
                    # protocol.py: return_spec_tokens_details exists in 0.5.23's requests only.
                    want_spec=bool(body.get("return_spec_tokens_details")) and self.resolved.version != "0.5.9",
                    include_usage=bool(options.get("include_usage")), continuous=bool(options.get("continuous_usage_stats")))

    async def openai_completion(self, request: HttpRequest) -> Response:
        body = await _read_json(request)
        if isinstance(body, JSONResponse):
            return body
        call = self._openai_call(body, chat=request.url.path.endswith("/chat/completions"))
        if isinstance(call, JSONResponse):
            return call
        if not self.state.healthy:
            return error(503, "The server is not healthy.", "ServiceUnavailableError")
        if not body.get("stream"):
            return await self._openai_answer(call)
        return StreamingResponse(self._openai_events(call), media_type="text/event-stream")

    async def _openai_answer(self, call: Call) -> Response:
        """The whole answer, once the request finished."""
        req = call.req
        reasoning_parts, content_parts, finish, matched = [], [], None, None
        try:
            async for chunk in _stream(self.state, req, self.latency):
                r, c = _split(chunk, call.separate)
                reasoning_parts.append(r)
                content_parts.append(c)
                finish, matched = chunk.finish_reason, chunk.matched_stop
        except EngineDead as exc:
            return error(500, f"Internal server error: {exc}", "InternalServerError")
        text = "".join(content_parts)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
        if call.chat:
            reasoning = "".join(reasoning_parts)
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": reasoning or None, "tool_calls": None}
        else:
            choice["text"] = text
        out = {
            "id": call.rid,
            "object": "chat.completion" if call.chat else "text_completion",
            "created": call.created,
            "model": call.model_name,
            "choices": [choice],
            "usage": _usage(req, self.resolved.version),
            "metadata": {"weight_version": "default"},
        }
        details = self.spec_tokens_details(req) if call.want_spec else None
        if details is not None:
            out["sglext"] = {"spec_tokens_details": details}
        return JSONResponse(out)

    def _event(self, call: Call, choice: dict[str, Any]) -> str:
        return _sse({"id": call.rid, "object": call.chunk_object, "created": call.created, "model": call.model_name,
                     "choices": [choice], "usage": _usage(call.req, self.resolved.version) if call.continuous else None})

    def _chunk_events(self, call: Call, chunk: Chunk) -> list[str]:
        """One decoded chunk as the events SGLang streams for it."""
        end = {"finish_reason": chunk.finish_reason, "matched_stop": chunk.matched_stop}
        none = {"finish_reason": None, "matched_stop": None}
        if not call.chat:
            return [self._event(call, {"index": 0, "text": chunk.text, "logprobs": None, **end})]
        reasoning, content = _split(chunk, call.separate)
        out = []
        if reasoning:
            out.append(self._event(call, {"index": 0, "delta": {"role": None, "content": None, "reasoning_content": reasoning},
                                          "logprobs": None, **(none if content else end)}))
        if content or not reasoning:
            out.append(self._event(call, {"index": 0, "delta": {"role": None, "content": content, "reasoning_content": None},
                                          "logprobs": None, **end}))
        return out

    async def _openai_events(self, call: Call) -> AsyncIterator[str]:
        req = call.req
        if call.chat:
            yield self._event(call, {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None, "matched_stop": None})
        try:
            async for chunk in _stream(self.state, req, self.latency):
                for event in self._chunk_events(call, chunk):
                    yield event
        except EngineDead as exc:
            yield _sse({"object": "error", "message": f"Internal server error: {exc}", "type": "InternalServerError", "param": None, "code": 500})
            return
        details = self.spec_tokens_details(req) if call.want_spec else None
        if details is not None:
            # serving_chat.py · _generate_chat_stream: a choices-less chunk carrying sglext.
            yield _sse({"id": call.rid, "object": call.chunk_object, "created": call.created, "model": call.model_name, "choices": [],
                        "usage": None, "sglext": {"spec_tokens_details": details}})
        if call.include_usage:
            yield _sse({"id": call.rid, "object": call.chunk_object, "created": call.created, "model": call.model_name, "choices": [],
                        "usage": _usage(req, self.resolved.version)})
        yield "data: [DONE]\n\n"

    async def generate(self, request: HttpRequest) -> Response:
        body = await _read_json(request)
        if isinstance(body, JSONResponse):
            return body
        text = body.get("text")
        if isinstance(text, list):
            text = text[0] if text else ""
        if text is None and body.get("input_ids") is not None:
            ids = body["input_ids"]
            text = " ".join(str(i) for i in (ids if isinstance(ids, list) else [ids]))
        if not isinstance(text, str):
            return error(400, "text must be a string")
        sp = body.get("sampling_params") or {}
        params = {
            "max_new_tokens": int(sp.get("max_new_tokens", 128)),
            "temperature": float(sp.get("temperature", 1.0)),
            "top_p": float(sp.get("top_p", 1.0)),
            "ignore_eos": bool(sp.get("ignore_eos", False)),
            "seed": sp.get("sampling_seed"),
        }
        prompt_tokens = count_tokens(text)
        bad = _check_length(self.state, prompt_tokens, params["max_new_tokens"])
        if bad is not None:
            return bad
        req = self.new_request(text, prompt_tokens, params)

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
            info.update(self.spec_meta(req))
            return info

        if not body.get("stream"):
            try:
                text, finish, matched = await _collect(self.state, req, self.latency)
            except EngineDead as exc:
                return error(500, f"Internal server error: {exc}", "InternalServerError")
            return JSONResponse({"text": text, "output_ids": list(range(req.generated)), "meta_info": meta(finish, matched)})

        async def events() -> AsyncIterator[str]:
            acc = []
            async for chunk in _stream(self.state, req, self.latency):
                acc.append(chunk.text)
                yield _sse({"text": "".join(acc), "output_ids": list(range(req.generated)), "meta_info": meta(chunk.finish_reason, chunk.matched_stop)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
