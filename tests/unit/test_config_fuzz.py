"""Property: whatever TOML a user writes, the loader answers with a Config or one ConfigError line."""

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.config import parse_config
from tuner.errors import ConfigError

SECTIONS = ["study", "target", "server", "space", "bench", "constraints", "extra"]
KEYS = ["name", "storage", "objectives", "host", "manager", "unit", "url", "ready_timeout_s", "command", "env",
        "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "mem_fraction_static",
        "temperature", "max_tokens", "concurrency", "request_tokens", "prompts", "low", "high", "step", "choices",
        "p99_itl_ms", "identity_file", "api_key_env", "single_requests", "draft_tokens_bound", "sudo"]

scalars = st.one_of(
    st.integers(-5, 100_000), st.floats(-2, 2, allow_nan=False), st.booleans(),
    st.text(string.printable, max_size=30), st.sampled_from(["local", "systemd", "http://127.0.0.1:1", "sqlite:///x.db", "demo"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)), max_leaves=8)
documents = st.dictionaries(st.sampled_from(SECTIONS), st.dictionaries(st.sampled_from(KEYS), values, max_size=6), max_size=6)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t").replace("\x0b", "\\u000b").replace("\x0c", "\\f") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_loader_never_raises_anything_but_one_line_config_errors(doc):
    text = "\n".join(f"[{section}]\n" + "\n".join(f"{k} = {_toml_value(v)}" for k, v in body.items()) for section, body in doc.items())
    try:
        parse_config(text, path="fuzz.toml")
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("fuzz.toml") and "\n" not in message and len(message) < 400


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_is_a_config_error(text):
    try:
        parse_config(text, path="fuzz.toml")
    except ConfigError as exc:
        assert "\n" not in str(exc)
