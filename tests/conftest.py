"""Shared fixtures: real emulator processes on free ports, study configs in temp dirs.

Fixtures start processes in their own session and stop the whole group (SIGTERM, then
SIGKILL), and print the server's log when a test fails, as GuideLLM's e2e harness does.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


# Ports the kernel never hands out as a client connection's local port, so a busy suite's
# thousands of short connections (and their TIME_WAIT) cannot sit on a server's port.  SGLang
# under DP attention also binds --port + 233 .. + 239 (PortArgs.init_new); those stay below the
# ephemeral range too.  A CI run failed on exactly that: detokenizer_port held for 30 s.
_EPHEMERAL_LOW = 32768
_DERIVED = range(233, 240)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW


def free_port() -> int:
    """A free port below the ephemeral range whose DP-attention ports are free as well."""
    rng = random.SystemRandom()  # xdist workers must not draw the same sequence
    # Below SGLang's default port 30000 (and its +233..+239), which a developer's own server or
    # `make demo` may hold while the suite runs.
    high = min(_ephemeral_low(), 30000) - max(_DERIVED) - 1
    for _ in range(200):
        port = rng.randrange(12000, high)
        if _bindable(port) and all(_bindable(port + d) for d in _DERIVED):
            return port
    with socket.socket() as s:  # a machine with the low range taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Emulator:
    proc: subprocess.Popen
    port: int
    log_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"emulator exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/health_generate", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"emulator not healthy after {timeout} s:\n{self.log()[-3000:]}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def emulator_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("SGLANG_EMULATOR_LOAD_SCALE", "0.005")
    env.update(extra)
    return env


@pytest.fixture
def start_emulator(tmp_path, request):
    """start_emulator(*flags, env={}) -> Emulator (not waited for)."""
    started: list[Emulator] = []

    def start(*flags: str, env: dict[str, str] | None = None, model: str = "Qwen/Qwen3.5-122B-A10B", port: int | None = None) -> Emulator:
        port = port or free_port()
        argv = [PYTHON, "-m", "sglang_emulator", "--model-path", model, "--host", "127.0.0.1", "--port", str(port), *flags]
        if model.startswith("Qwen/Qwen3.5") and "--tp" not in flags and "--tp-size" not in flags:
            argv += ["--tp", "4"]
        log_path = tmp_path / f"emulator-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=emulator_env(**(env or {})),
                                    start_new_session=True, cwd=REPO)
        emu = Emulator(proc, port, log_path, argv)
        started.append(emu)
        return emu

    yield start
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for emu in started:
        emu.stop()
        if failed:
            print(f"\n--- emulator log ({' '.join(emu.argv[3:])}) ---\n{emu.log()[-4000:]}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


# A [bench] section that measures in seconds: enough to exercise every phase, not to rank configs.
FAST_BENCH = textwrap.dedent("""
    max_tokens = 48
    single_requests = 2
    single_min_passes = 1
    single_max_passes = 2
    concurrency = 4
    concurrent_requests = 8
    warmup_requests = 1
""")


def write_config(tmp_path: Path, *, name: str = "t", port: int | None = None, command_flags: str = "--speculative-algorithm NEXTN",
                 space: str | None = None, bench: str | None = None, target: str = "", study: str = "",
                 env: str = 'SGLANG_EMULATOR_LOAD_SCALE = "0.005", SGLANG_EMULATOR_TIME_SCALE = "0.25"',
                 model: str = "Qwen/Qwen3.5-122B-A10B --tp 4", storage: str | None = None, ready_timeout_s: float = 60) -> Path:
    """A study config for the emulator on a free port, with a small, fast benchmark."""
    port = port or free_port()
    storage = storage or f"sqlite:///{tmp_path / (name + '.db')}"
    space = space if space is not None else textwrap.dedent("""
        speculative_num_steps = { low = 1, high = 3 }
        speculative_eagle_topk = { choices = [1, 2] }
        mem_fraction_static = { low = 0.80, high = 0.90, step = 0.02 }
    """)
    bench = bench if bench is not None else FAST_BENCH
    text = textwrap.dedent(f"""
        [study]
        name = "{name}"
        storage = "{storage}"
        artifacts = "{tmp_path / (name + '.artifacts')}"
        {study if "baselines" in study else study + chr(10) + "baselines = false"}

        [target]
        url = "http://127.0.0.1:{port}"
        ready_timeout_s = {ready_timeout_s}
        poll_interval_s = 0.2
        workdir = "{tmp_path / 'work'}"
        {target}

        [server]
        command = "{PYTHON} -m sglang_emulator --model-path {model} --host 127.0.0.1 --port {port} {command_flags}"
        env = {{ {env} }}

        [space]
        {space}

        [bench]
        {bench}
    """)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([PYTHON, "-m", "tuner.optimize", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=full_env)


def wait_until(predicate, *, timeout: float = 30, what: str = "the condition"):
    """Poll `predicate` until it returns something truthy (returned); never sleep-then-assume."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")


def loads_while_streaming(url: str, requests: int, predicate, *, timeout: float = 60, what: str = "the condition"):
    """Open `requests` streamed /generate requests that cannot finish (far more tokens than any
    wait takes), poll /v1/loads until `predicate(loads)` returns something truthy (returned), then
    close the streams (the server drops them: a client gone).  Why: short requests posted from
    threads made a state that lasted ~1.4-2.7 s (four running on two DP ranks, two running and
    three queued), which a stalled poll on a loaded machine can miss for good."""
    body = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True}}

    async def consume(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", url + "/generate", json=body) as response:
            async for _ in response.aiter_bytes():
                pass

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            streams = [asyncio.create_task(consume(client)) for _ in range(requests)]
            try:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    value = predicate((await client.get(url + "/v1/loads")).json())
                    if value:
                        return value
                    await asyncio.sleep(0.05)
                raise AssertionError(f"{what} not reached within {timeout} s")
            finally:
                for task in streams:
                    task.cancel()
                await asyncio.gather(*streams, return_exceptions=True)

    return asyncio.run(run())


def wait_serving(port: int, timeout: float = 60) -> None:
    """Until a server on this port answers /health_generate with 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health_generate", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no server became ready on port {port} within {timeout} s")


def stop_servers_left_in(directory: Path, timeout: float = 15) -> list[int]:
    """Stop the process groups whose pid files (server.pid, written by the process manager) lie
    under `directory`: a server a test deliberately left running (`best --apply`, a worker killed
    with -9).  Only a group whose leader was started in that pid file's directory is signalled, so
    a stale pid that the system has reused is never touched."""
    stopped = []
    for pid_file in directory.rglob("server.pid"):
        try:
            group = int(pid_file.read_text().strip())
            leader = Path(f"/proc/{group}/cmdline").read_bytes().decode(errors="replace")
        except (ValueError, OSError):
            continue
        if str(pid_file.parent) not in leader or group == os.getpgid(0):
            continue
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(group):
            time.sleep(0.1)
        if _group_alive(group):
            os.killpg(group, signal.SIGKILL)
        stopped.append(group)
    return stopped


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    # Zombies still count for killpg; a group of zombies is as good as gone.
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


# A suite started in the background by a script (`make test &`, `nohup ... &`: POSIX has a
# non-interactive shell start asynchronous commands with SIGINT ignored) would pass that on to
# every process it starts, and the tests that send SIGINT would see it ignored: a fresh-clone
# run started that way lost both "a Ctrl-C is raised" tests.  Ctrl-C raises, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def signals_as_found():
    """Every test leaves this process's SIGINT/SIGTERM handlers and the tuner's interrupt state as
    it found them: a command's `main` run in-process installs the tuner's handler, and a test that
    interrupted it leaves it "stopping", where a later Ctrl-C is only a line."""
    from tuner import interrupts

    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    state = dict(interrupts._state)
    yield
    for s, h in handlers.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)
    interrupts._state.update(state)


@pytest.fixture(scope="session", autouse=True)
def no_server_left_behind(tmp_path_factory):
    """At the end of the run, no emulator started from a test's directory may still be running:
    the tuner promises to leave the target as it found it, and a leaked server would hold a port
    (on a real host: the GPUs).  Leftovers are stopped and reported as an error of the run."""
    yield
    base = str(tmp_path_factory.getbasetemp())
    deadline = time.monotonic() + 10  # a server may still be in its graceful shutdown
    while True:
        left = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                group = os.getpgid(int(proc.name))
            except (OSError, ProcessLookupError):
                continue
            # a zombie's cmdline is empty, so a match is a live process of the group
            if base in cmdline and "sglang_emulator" in cmdline:
                left[group] = cmdline.strip()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for group in left:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, "servers left running by the tests (now killed):\n" + "\n".join(f"  group {g}: {c[:200]}" for g, c in left.items())


def server_processes(port: int) -> list[int]:
    """Live processes of an emulator (or the process manager's wrapper shell) started for `port`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "sglang_emulator" in cmdline and f"--port {port} " in cmdline + " ":
                found.append(int(proc.name))
    return found


def assert_no_server(port: int, timeout: float = 10) -> None:
    """No process of a server for `port` runs (its whole process group included: the wrapper
    shell carries the same command line) and nothing answers on the port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server_processes(port):
        time.sleep(0.2)
    assert not server_processes(port), f"a server for port {port} still runs: {server_processes(port)}"
    with socket.socket() as s:
        s.settimeout(0.5)
        assert s.connect_ex(("127.0.0.1", port)) != 0, f"something still answers on port {port}"
