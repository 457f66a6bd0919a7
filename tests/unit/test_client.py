"""The server client against servers that lack optional routes (httpx's MockTransport)."""

import httpx
import pytest

from tuner.errors import MeasureError

from tuner.server.client import ServerClient


def _client(handler) -> ServerClient:
    client = ServerClient("http://server:30000")
    client._http = httpx.Client(base_url="http://server:30000", transport=httpx.MockTransport(handler))
    return client


def test_health_falls_back_to_health_when_health_generate_is_missing():
    seen = []

    def handler(request):
        seen.append(request.url.path)
        return httpx.Response(404 if request.url.path == "/health_generate" else 200)

    assert _client(handler).health_generate() == 200 and seen == ["/health_generate", "/health"]


def test_flush_is_best_effort_without_the_route_and_retries_while_busy():
    calls = []

    def missing(request):
        return httpx.Response(404)

    assert _client(missing).flush_cache(attempts=3, wait_s=0) is False

    def busy_then_ok(request):
        calls.append(1)
        return httpx.Response(400 if len(calls) < 3 else 200, text="Flush cache failed.")

    assert _client(busy_then_ok).flush_cache(attempts=5, wait_s=0) is True and len(calls) == 3


def test_server_info_reads_each_dp_rank_never_rank_zero_times_dp():
    # As SGLang 0.5.23 answers with --dp-size 2: top-level max_total_num_tokens is rank 0's
    # alone and max_running_requests the declared 48; each rank has its own figures.
    def handler(request):
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"max_total_num_tokens": 970, "max_running_requests": 48, "version": "0.5.23",
                                             "speculative_algorithm": "EAGLE", "attention_backend": "flashinfer", "page_size": 1,
                                             "internal_states": [
                                                 {"effective_max_running_requests_per_dp": 7, "memory_usage": {"token_capacity": 970}},
                                                 {"effective_max_running_requests_per_dp": 9, "memory_usage": {"token_capacity": 1000}}]})
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"architectures": ["LlamaForCausalLM"]})
        return httpx.Response(200, json={"accelerator": "NVIDIA H200", "num_accelerators": 2, "loads": []})

    info = _client(handler).server_info()
    assert [(r.max_total_num_tokens, r.max_running_requests) for r in info.ranks] == [(970, 7), (1000, 9)]
    assert (info.max_total_num_tokens, info.max_running_requests, info.dp_size, info.gpu_count) == (1970, 16, 2, 4)
    assert (info.attention_backend, info.page_size, info.architecture, info.speculative) == ("flashinfer", 1, "LlamaForCausalLM", True)


def test_a_0_5_9_server_without_accelerator_fields_still_says_how_many_gpus_a_rank_spans():
    # 0.5.9's /v1/loads has no accelerator fields; its /server_info carries tp_size, pp_size,
    # dp_size and enable_dp_attention, from which SGLang 0.5.23 counts num_accelerators itself.
    def server(args, ranks):
        def handler(request):
            if request.url.path == "/server_info":
                states = [{"effective_max_running_requests_per_dp": 8, "memory_usage": {"token_capacity": 1000}}] * ranks
                return httpx.Response(200, json={"version": "0.5.9", "max_total_num_tokens": 1000, "max_running_requests": 48,
                                                 "internal_states": states, **args})
            if request.url.path == "/v1/loads":
                return httpx.Response(200, json={"version": "0.5.9", "loads": []})
            return httpx.Response(404)
        return _client(handler).server_info()

    assert server({"tp_size": 4, "pp_size": 1, "dp_size": 1, "enable_dp_attention": False}, 1).gpu_count == 4
    assert server({"tp_size": 2, "pp_size": 2, "dp_size": 1}, 1).gpu_count == 4
    under_dp_attention = server({"tp_size": 4, "dp_size": 2, "enable_dp_attention": True}, 2)
    assert (under_dp_attention.num_accelerators, under_dp_attention.gpu_count) == (2, 4)
    assert server({"tp_size": 2, "dp_size": 2, "enable_dp_attention": False}, 2).gpu_count == 4  # two replicas of two
    assert server({}, 1).gpu_count is None  # nothing said: unknown, not one


def test_capacity_is_summed_per_rank():
    from tuner.measure.runner import Measurement
    from tuner.server.client import Rank

    m = Measurement(single_tps=1, single_runs=(1,), single_ci95=(1, 1), concurrent_tps_by_level={1: 1}, concurrent_window_s={1: 1},
                    max_total_num_tokens=25_000, max_running_requests=20, request_tokens=1000, accept_length=None,
                    ttft_ms=0, ttft_p90_ms=0, ttft_p99_ms=0, itl_ms=0, itl_p90_ms=0, itl_p99_ms=0, e2e_ms=0, e2e_p90_ms=0, e2e_p99_ms=0,
                    ranks=(Rank(12_500, 10), Rank(12_500, 10)))
    # 12 per rank fit by KV but only 10 may run: 20, not min(20, 25) = 20 by luck -- check an uneven case too.
    assert m.capacity == 20
    uneven = Measurement(**{**m.__dict__, "ranks": (Rank(24_000, 10), Rank(1_000, 10))})
    assert uneven.capacity == 10 + 1  # pooled, min(20, 25) would claim 20


def test_a_rank_without_figures_is_an_error_not_a_guess():
    def handler(request):
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"max_total_num_tokens": 500, "max_running_requests": 48, "internal_states": [{}, {}]})
        return httpx.Response(404)

    with pytest.raises(MeasureError, match="DP rank 0 reports no token_capacity"):
        _client(handler).server_info()
    single = lambda request: httpx.Response(200, json={"max_total_num_tokens": 500, "max_running_requests": 48, "internal_states": [{}]}) \
        if request.url.path == "/server_info" else httpx.Response(404)  # noqa: E731
    assert _client(single).server_info().max_running_requests == 48  # one rank: the top-level fields are its own


def test_flush_with_an_admin_key_sends_it_and_a_401_is_one_clear_error():
    seen = []

    def handler(request):
        seen.append(request.headers.get("authorization"))
        return httpx.Response(401, json={"error": "Unauthorized"})

    client = _client(handler)
    with pytest.raises(MeasureError, match="--admin-api-key; set \\[target\\] admin_api_key_env"):
        client.flush_cache(attempts=20, wait_s=0)
    assert len(seen) == 1  # not twenty retries
    admin = ServerClient("http://server:30000", api_key="user", admin_api_key="root")
    admin._http = httpx.Client(base_url="http://server:30000", transport=httpx.MockTransport(lambda r: seen.append(r.headers["authorization"]) or httpx.Response(200)))
    assert admin.flush_cache() and seen[-1] == "Bearer root"


def test_a_slow_health_answer_is_an_answer():
    def slow(request):
        raise httpx.ReadTimeout("no answer yet", request=request)

    def refused(request):
        raise httpx.ConnectError("refused", request=request)

    assert _client(slow).answers() is True
    assert _client(refused).answers() is False
