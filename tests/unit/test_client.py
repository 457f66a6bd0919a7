"""The server client against servers that lack optional routes (httpx's MockTransport)."""

import httpx

from tuner.target.client import ServerClient


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


def test_server_info_sums_dp_ranks_and_falls_back_to_loads():
    def handler(request):
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"max_total_num_tokens": 1000, "version": "0.5.23",
                                             "internal_states": [{"effective_max_running_requests_per_dp": 7},
                                                                 {"effective_max_running_requests_per_dp": 9}]})
        return httpx.Response(200, json={"accelerator": "NVIDIA H200", "num_accelerators": 2, "loads": []})

    info = _client(handler).server_info()
    assert (info.max_total_num_tokens, info.max_running_requests, info.dp_size, info.gpu_count) == (2000, 16, 2, 4)

    def old_server(request):
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"max_total_num_tokens": 500, "max_running_requests": 48, "internal_states": [{}]})
        return httpx.Response(404)

    assert _client(old_server).server_info().max_running_requests == 48
