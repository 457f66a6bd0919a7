"""A continuous-batching scheduler that runs in real time on the model of `model.py`.

One `Engine` per DP rank.  Requests wait until a slot (`max_running_requests`) and KV room are
free, are prefilled in batches of up to `chunked_prefill_size` tokens (a longer prompt in chunks,
one per iteration; every prefill iteration stalls the running streams' decode, as SGLang's does),
then decode together:
each iteration sleeps for `model.step_ms(...)` and gives every running request 1 + the draft
tokens it accepted, drawn from the request's acceptance distribution.  A stream chunk carries
all tokens of one iteration, as SGLang's does.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import random
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from . import model as m
from .adaptive import AdaptiveSpeculativeParams
from .args import Resolved

__all__ = ["Engine", "Request", "Chunk", "count_tokens", "prompt_traits", "EngineDead", "DECODE_LOG_INTERVAL"]

logger = logging.getLogger("sglang.srt.managers.scheduler")

DECODE_LOG_INTERVAL = 40  # --decode-log-interval default
EOS_TOKEN_ID = 151645  # reported as matched_stop when a request ends at its natural EOS

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_FALLBACK_WORDS = (
    "the model answers with a short and clear explanation of each step so that the reader "
    "can follow along and check the result against the question"
).split()


def count_tokens(text: str) -> int:
    """A tokenizer stand-in: words and punctuation marks, close to BPE counts for English."""
    return max(1, len(_TOKEN_RE.findall(text)))


class EngineDead(RuntimeError):
    """The scheduler crashed; requests in flight get an error."""


@dataclass
class Chunk:
    tokens: int
    text: str
    finish_reason: str | None = None
    matched_stop: int | None = None
    # Of `tokens`/`text`, the part that is still thinking (a --reasoning-parser request).
    reasoning_tokens: int = 0
    reasoning_text: str = ""


@dataclass
class Request:
    rid: str
    prompt: str
    prompt_tokens: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = False
    seed: int | None = None
    log_metrics: bool = True  # False for /health's probe (GenerateReqInput.log_metrics)
    thinking: bool = False  # a chat request to a thinking model with thinking on
    arrival: float = field(default_factory=time.monotonic)
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    generated: int = 0
    verify_ct: int = 0
    prefilled: int = 0  # prompt tokens prefilled so far (chunked prefill)
    accepted_drafts: int = 0
    # schedule_batch.py · update_spec_correct_drafts_histogram: verify steps by drafts accepted
    correct_drafts_histogram: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    cancelled: bool = False
    # Filled in at admission:
    natural_len: int = 0
    think_len: int = 0  # thinking tokens, the closing </think> included
    prompt_shift: float = 0.0
    rng: random.Random | None = None
    words: list[str] = field(default_factory=list)
    loop: list[str] = field(default_factory=list)

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated


THINK_END = "</think>"


def thinking_length(prompt: str) -> int:
    """How long a thinking model thinks before answering `prompt`, the closing </think>
    included: deterministic from the prompt, median ~600 tokens, so that a 256-token
    max_tokens is mostly spent thinking (Qwen3-style models think for hundreds to thousands
    of tokens on chat prompts)."""
    digest = hashlib.sha256(b"think:" + prompt.encode("utf-8", "replace")).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    return int(min(max(rng.lognormvariate(math.log(600), 0.5), 120), 6000))


def prompt_traits(prompt: str, acc: m.Acceptance, prompt_tokens: int) -> tuple[float, int, random.Random]:
    """Per-prompt predictability shift, natural answer length and a seeded RNG.

    The shift is the profile's: by the kind of text asked for (code and quoted material are
    easier to draft, creative writing harder: `Acceptance.category_shifts`) and by the context
    the answer is drafted over (`Acceptance.context_decay`); the rest of the variation is a
    deterministic draw from the prompt's hash, so the same prompt behaves the same way on
    every server.
    """
    digest = hashlib.sha256(prompt.encode("utf-8", "replace")).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    shift = rng.gauss(0.0, acc.prompt_spread)
    shift += m.category_shift(acc, m.prompt_category(prompt)) + m.context_shift(acc, prompt_tokens)
    median = 180 if len(prompt) < 400 else 320
    natural = int(min(max(rng.lognormvariate(math.log(median), 0.6), 8), 4000))
    return shift, natural, rng


class Engine:
    """One DP rank's scheduler: `submit()` requests, `run()` as a task."""

    def __init__(
        self,
        resolved: Resolved,
        plan: m.MemoryPlan,
        *,
        dp_rank: int = 0,
        time_scale: float = 1.0,
        step_noise: float = 0.02,
        seed: int | None = None,
    ):
        self.resolved = resolved
        self.profile = resolved.profile
        self.plan = plan
        self.dp_rank = dp_rank
        self.time_scale = time_scale
        self.step_noise = step_noise
        self.rng = random.Random(seed)
        # A launch-to-launch factor: clocks, placement and thermals differ between restarts.
        self.launch_factor = math.exp(self.rng.gauss(0.0, step_noise / 2))
        self.capacity = plan.max_total_num_tokens
        self.max_running = plan.max_running_requests
        self.decode_log_interval = int(resolved.raw.get("decode_log_interval") or DECODE_LOG_INTERVAL)
        # metrics_reporter.report_decode_stats folds the accept counters in only once every
        # --decode-log-interval decode iterations; SGLANG_EMULATOR_KIND=1 folds every iteration.
        self.fold_every_step = os.environ.get("SGLANG_EMULATOR_KIND", "") not in ("", "0")
        self._pending_accept_tokens = 0
        self._pending_verify_ct = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.chunked: Request | None = None  # a prompt cut by --chunked-prefill-size, continued first
        self._wake = asyncio.Event()
        self._clock: float | None = None
        self._mass_cache: dict[tuple, list[float]] = {}
        self.dead: Exception | None = None
        self.hung = False
        # Counters since start or /flush_cache (SGLang resets them on flush).
        self.spec_accept_tokens = 0
        self.spec_verify_ct = 0
        self.spec_accepted_drafts = 0
        self.spec_proposed_drafts = 0
        # Counters since start (Prometheus counters never reset).
        self.total_prompt_tokens = 0
        self.total_generation_tokens = 0
        self.total_requests = 0
        self.total_verify_calls = 0
        self.forward_ct = 0
        self.last_gen_throughput = 0.0
        self._interval_tokens = 0
        self._interval_start = time.monotonic()
        self.step_time_dict: dict[str, list[float]] = {}
        self._interval_step_s = 0.0
        self.last_accept_length = 0.0
        self.last_accept_rate = 0.0
        self.retracted = 0
        self.new_token_ratio = 0.3  # --init-new-token-ratio (scheduler's new_token_ratio_tracker)
        # Adaptive speculation (--speculative-adaptive): SGLang's policy, routed by batch size
        # over the captured graph sizes; the resolved steps are the active state at start.
        self.adaptive: AdaptiveSpeculativeParams | None = None
        if resolved.adaptive and resolved.adaptive_table is not None:
            self.adaptive = AdaptiveSpeculativeParams(
                resolved.spec.steps, resolved.adaptive_table, plan.capture_bs, announce=False
            )
        self.observers: list[Any] = []  # metrics hooks: callables(event, **kw)

    # --- public ------------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        if self.dead is not None:
            raise EngineDead(str(self.dead))
        self.waiting.append(req)
        self.total_requests += req.log_metrics
        self._wake.set()

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and self.chunked is None

    @property
    def used_tokens(self) -> int:
        return sum(r.context_tokens for r in self.running)

    def flush_cache(self) -> bool:
        if not self.idle:
            logging.warning(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {len(self.waiting)}, #running-req: {len(self.running)}"
            )
            return False
        self.spec_accept_tokens = self.spec_verify_ct = 0
        self._pending_accept_tokens = self._pending_verify_ct = 0
        self.spec_accepted_drafts = self.spec_proposed_drafts = 0
        self.last_accept_length = self.last_accept_rate = 0.0
        logger.info("Cache flushed successfully!")
        return True

    @property
    def avg_spec_accept_length(self) -> float | None:
        if not self.resolved.spec.enabled or self.spec_verify_ct == 0:
            return None
        return self.spec_accept_tokens / self.spec_verify_ct

    def crash(self, exc: Exception) -> None:
        self.dead = exc
        for req in list(self.running) + list(self.waiting) + ([self.chunked] if self.chunked else []):
            req.out.put_nowait(exc)
        self.chunked = None
        self.running.clear()
        self.waiting.clear()

    # --- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            if self.hung:
                await asyncio.sleep(3600)
                continue
            if self.idle:
                self._wake.clear()
                self._clock = None
                await self._wake.wait()
                continue
            self._drop_cancelled()
            admitted = self._admit()
            if admitted:
                await self._prefill(admitted)
            elif self.running:
                await self._decode()
            else:
                # Waiting requests that cannot be admitted yet (KV full): let time pass.
                await asyncio.sleep(0.005 * self.time_scale)

    async def _advance(self, ms: float) -> None:
        """Sleep until the simulated GPU finishes `ms` of work, without drift."""
        now = time.monotonic()
        if self._clock is None or now - self._clock > 0.05:
            self._clock = now  # after idling or a stall we cannot catch up on
        self._clock += ms / 1000 * self.time_scale
        delay = self._clock - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _drop_cancelled(self) -> None:
        if any(r.cancelled for r in self.running):
            self.running = [r for r in self.running if not r.cancelled]
        if any(r.cancelled for r in self.waiting):
            self.waiting = deque(r for r in self.waiting if not r.cancelled)
        if self.chunked is not None and self.chunked.cancelled:
            self.chunked = None

    def _admit(self) -> list[tuple[Request, int]]:
        """This iteration's prefill: (request, prompt tokens prefilled now), or [] to decode.

        scheduler.py · get_next_batch_to_run: a prefill batch, when there is one, runs instead
        of the decode batch (decode waits for it: prefill stalls every running stream), and a
        request cut by the chunk budget is continued first, one chunk per iteration
        (schedule_policy.py · PrefillAdder.add_one_req: a prompt longer than what is left of
        `--chunked-prefill-size` is truncated into the chunked request; -1 disables chunking).
        A request counts toward `--max-running-requests` from its first chunk.
        """
        chunk = self.resolved.chunked_prefill_size
        budget = chunk if chunk and chunk > 0 else math.inf
        used = self.used_tokens + (self.chunked.prefilled if self.chunked else 0)
        batch: list[tuple[Request, int]] = []
        if self.chunked is not None:
            req = self.chunked
            take = int(min(req.prompt_tokens - req.prefilled, budget))
            batch.append((req, take))
            budget -= take
            if req.prefilled + take < req.prompt_tokens:
                return batch  # the chunk budget is spent on it
        while self.waiting and budget > 0 and len(self.running) + len(batch) < self.max_running:
            req = self.waiting[0]
            # Reserve room for part of the answer, as SGLang's new_token_ratio does.
            need = req.prompt_tokens + int(min(req.max_new_tokens, 4096) * self.new_token_ratio)
            if used + need > self.capacity:
                break
            self.waiting.popleft()
            self._prepare(req)
            take = int(min(req.prompt_tokens, budget))
            batch.append((req, take))
            used += req.prompt_tokens
            budget -= take
        return batch

    def _prepare(self, req: Request) -> None:
        shift, natural, rng = prompt_traits(req.prompt, self.profile.acceptance, req.prompt_tokens)
        req.prompt_shift, req.natural_len = shift, natural
        if req.thinking:
            req.think_len = thinking_length(req.prompt)
            req.natural_len += req.think_len
        if req.temperature > 0 or req.seed is not None:
            # Sampled text differs run to run unless the client fixes a seed.
            seed = req.seed if req.seed is not None else self.rng.getrandbits(64)
            rng = random.Random(seed)
        req.rng = rng
        words = [w for w in _TOKEN_RE.findall(req.prompt) if w.isalpha()][:400]
        req.words = words if len(words) >= 8 else list(_FALLBACK_WORDS)

    async def _prefill(self, batch: list[tuple[Request, int]]) -> None:
        tokens = sum(take for _, take in batch)
        ms = m.prefill_ms(self.profile, tokens=tokens, tp=self.resolved.tp)
        if self.resolved.spec.enabled and self.resolved.spec.algorithm != "NGRAM":
            ms += m.draft_step_ms(self.profile, batch=len(batch), topk=1)  # draft prefill
        await self._advance(ms * self._noise())
        self.chunked = None
        done = []
        for req, take in batch:
            req.prefilled += take
            if req.prefilled < req.prompt_tokens:
                self.chunked = req  # scheduler.py · self.chunked_req: continued next iteration
            else:
                done.append(req)
        logger.info(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {tokens}, #cached-token: 0, "
            f"token usage: {self.used_tokens / self.capacity:.2f}, "
            f"#running-req: {len(self.running)}, #queue-req: {len(self.waiting)}"
        )
        now = time.monotonic()
        for req in done:
            if req.cancelled:
                continue
            if req.first_token_at is None:  # not a retracted request coming back
                self.total_prompt_tokens += req.prompt_tokens * req.log_metrics
                req.first_token_at = now
            self._emit(req, 1)
            if req.finish_reason is None:
                self.running.append(req)

    def _current_spec(self, batch: int) -> m.SpecShape:
        """The shape this decode batch runs with: the static one, or the adaptive state the
        batch size routes to (eagle_worker_v2.py · activate_step_by_batch).  Steps 0 still runs
        the target through the verify graph at one token and the draft extend."""
        spec = self.resolved.spec
        if self.adaptive is None:
            return spec
        steps = self.adaptive.activate_step_by_batch(batch)
        return m.SpecShape(spec.algorithm, steps, 1, steps + 1)

    def _mass(self, req: Request, spec: m.SpecShape, degenerate: bool) -> list[float]:
        key = (spec, round(req.prompt_shift, 3), req.temperature, req.top_p, degenerate)
        mass = self._mass_cache.get(key)
        if mass is None:
            qs = m.depth_acceptance(
                self.profile.acceptance,
                steps=spec.steps,
                temperature=req.temperature,
                top_p=req.top_p,
                prompt_shift=req.prompt_shift,
                degenerate=degenerate,
            )
            if spec.algorithm == "NGRAM":
                # N-gram drafts come from the prompt and earlier output: good on copying, weak on
                # fresh text.  Modelled as a weaker chain with the tree's breadth.
                qs = [q * 0.6 for q in qs]
            mass = m.accept_length_distribution(
                qs,
                topk=spec.topk,
                draft_tokens=spec.draft_tokens,
                second_share=self.profile.acceptance.second_share,
            )
            self._mass_cache[key] = mass
        return mass

    def _noise(self) -> float:
        return self.launch_factor * math.exp(self.rng.gauss(0.0, self.step_noise))

    async def _decode(self) -> None:
        batch = len(self.running)
        spec = self._current_spec(batch)
        ms = m.step_ms(
            self.profile,
            spec=spec,
            batch=batch,
            context_tokens=self.used_tokens,
            tp=self.resolved.tp,
            attention_backend_forced=self.resolved.attention_backend_set,
        )
        # KV pressure: each request needs room for this step's drafts; adaptive mode reserves
        # for its largest candidate (allocation_sizing.get_alloc_len_per_decode reads
        # max_speculative_num_draft_tokens).
        per_req = max(spec.steps * spec.topk, spec.draft_tokens) if spec.enabled else 1
        if self.adaptive is not None:
            per_req = max(per_req, self.adaptive.table.max_draft_tokens)
        victims: list[Request] = []
        while self.running and self.used_tokens + per_req * len(self.running) > self.capacity:
            victims.append(self.running.pop())
        if victims:
            # scheduler.py: the normal answer to a full KV pool, logged at WARNING.
            self.retracted += len(victims)
            old_ratio = self.new_token_ratio
            self.new_token_ratio = min(1.0, old_ratio + 0.2)
            details = f"#retracted_reqs: {len(victims)}, #new_tokens_gained: {sum(v.context_tokens for v in victims)}"
            if self.profile.hybrid:
                details += f", #mamba_num_gained: {len(victims)}"
            logger.warning(
                "KV cache pool is full. Retract requests. " + details
                + f", #new_token_ratio: {old_ratio:.4f} -> {self.new_token_ratio:.4f}"
            )
            for victim in victims:
                victim.prefilled = 0  # a retracted request is prefilled again
                self.waiting.appendleft(victim)
        elif self.new_token_ratio > 0.3:
            self.new_token_ratio = max(0.3, self.new_token_ratio - 0.001)  # decay_step
        if not self.running:
            return
        step_s = ms * self._noise() / 1000
        await self._advance(step_s * 1000)
        self.forward_ct += 1
        self._interval_step_s += step_s
        correct_drafts: list[int] = []
        for req in list(self.running):
            if req.cancelled:
                continue
            tokens = 1
            if spec.enabled:
                degenerate = req.ignore_eos and req.generated >= req.natural_len
                mass = self._mass(req, spec, degenerate)
                u = req.rng.random()
                accepted = sum(1 for p in mass if u < p)
                tokens += accepted
                self._pending_verify_ct += 1
                self.total_verify_calls += 1
                self.spec_accepted_drafts += accepted
                self.spec_proposed_drafts += max(spec.draft_tokens - 1, 0)
                req.verify_ct += 1
                req.accepted_drafts += accepted
                if len(req.correct_drafts_histogram) <= accepted:
                    req.correct_drafts_histogram.extend([0] * (accepted + 1 - len(req.correct_drafts_histogram)))
                req.correct_drafts_histogram[accepted] += 1
                correct_drafts.append(accepted)
            emitted = self._emit(req, tokens)
            if spec.enabled:
                self._pending_accept_tokens += emitted
        self.running = [r for r in self.running if r.finish_reason is None and not r.cancelled]
        if self.adaptive is not None:
            # batch_result_processor.py: on_verify_complete_cpu(num_correct_drafts_per_req,
            # batch_size=len(batch.reqs)) after every decode batch, steps 0 included.
            self.adaptive.on_verify_complete(correct_drafts, batch)
        if self.fold_every_step:
            self._fold_accept_counters()
        if self.forward_ct % self.decode_log_interval == 0:
            self._fold_accept_counters()
            self._log_decode(batch)

    def _fold_accept_counters(self) -> None:
        self.spec_accept_tokens += self._pending_accept_tokens
        self.spec_verify_ct += self._pending_verify_ct
        self._pending_accept_tokens = self._pending_verify_ct = 0

    def _emit(self, req: Request, tokens: int) -> int:
        """Give `req` up to `tokens` new tokens; finish it at EOS or max_new_tokens."""
        tokens = min(tokens, req.max_new_tokens - req.generated)
        finish, matched = None, None
        if not req.ignore_eos and req.generated + tokens >= req.natural_len:
            tokens = max(req.natural_len - req.generated, 1)
            finish, matched = "stop", EOS_TOKEN_ID
        if req.generated + tokens >= req.max_new_tokens:
            finish, matched = finish or "length", matched
        text = self._text(req, tokens)
        reasoning_tokens, reasoning_text = 0, ""
        if req.think_len and req.generated < req.think_len:
            # The first think_len tokens are thinking; the last of them is </think>.
            reasoning_tokens = min(tokens, req.think_len - req.generated)
            words = text.split(" ")[1:]
            if req.generated + reasoning_tokens == req.think_len:
                words[reasoning_tokens - 1] = THINK_END
            reasoning_text = "".join(" " + w for w in words[:reasoning_tokens])
            text = reasoning_text + "".join(" " + w for w in words[reasoning_tokens:])
        req.generated += tokens
        if req.log_metrics:
            self.total_generation_tokens += tokens
        self._interval_tokens += tokens
        if finish:
            req.finish_reason = finish
            req.finished_at = time.monotonic()
        req.out.put_nowait(Chunk(tokens, text, finish, matched if finish == "stop" else None, reasoning_tokens, reasoning_text))
        for observe in self.observers:
            observe("tokens", request=req, tokens=tokens, finished=finish is not None)
        return tokens

    def _text(self, req: Request, tokens: int) -> str:
        out = []
        for _ in range(tokens):
            if req.generated >= req.natural_len and req.ignore_eos:
                # Past the natural end the text degenerates into a loop.
                if not req.loop:
                    req.loop = [req.rng.choice(req.words) for _ in range(6)]
                word = req.loop[(req.generated + len(out)) % len(req.loop)]
            else:
                word = req.rng.choice(req.words)
            out.append(" " + word)
        return "".join(out)

    def _log_decode(self, batch: int) -> None:
        now = time.monotonic()
        elapsed = max(now - self._interval_start, 1e-6)
        self.last_gen_throughput = self._interval_tokens / elapsed
        self._interval_start, self._interval_tokens = now, 0
        key = str(batch)
        if os.environ.get("SGLANG_RECORD_STEP_TIME") == "1":
            self.step_time_dict.setdefault(key, []).append(self._interval_step_s / self.decode_log_interval)
        self._interval_step_s = 0.0
        usage = self.used_tokens / self.capacity
        spec_part = ""
        if self.resolved.spec.enabled:
            length = self.spec_accept_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0
            rate = (
                self.spec_accepted_drafts / self.spec_proposed_drafts if self.spec_proposed_drafts else 0.0
            )
            self.last_accept_length, self.last_accept_rate = length, rate
            spec_part = f"accept len: {length:.2f}, accept rate: {rate:.2f}, "
        if self.profile.hybrid:
            token_part = (
                f"#full token: {self.used_tokens}, full token usage: {usage:.2f}, "
                f"mamba num: {len(self.running)}, "
                f"mamba usage: {len(self.running) / max(self.plan.max_mamba_cache_size or 1, 1):.2f}, "
            )
        else:
            token_part = f"#token: {self.used_tokens}, token usage: {usage:.2f}, "
        logger.info(
            f"Decode batch, #running-req: {batch}, {token_part}{spec_part}cuda graph: "
            f"{batch <= self.plan.capture_bs[-1]}, gen throughput (token/s): "
            f"{self.last_gen_throughput:.2f}, #queue-req: {len(self.waiting)}"
        )
