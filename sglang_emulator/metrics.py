"""SGLang 0.5.23's Prometheus metrics (`--enable-metrics`): scheduler gauges and tokenizer
counters read from the engines at scrape time, latency histograms observed as requests stream."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from .state import ServerState

__all__ = ["Latency", "EngineCollector", "metrics_endpoint"]


class EngineCollector:
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


class Latency:
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


def metrics_endpoint(registry: CollectorRegistry):
    async def metrics(request: HttpRequest) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    return metrics
