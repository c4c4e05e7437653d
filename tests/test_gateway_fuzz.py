"""The gateway fuzzed from its own OpenAPI schema (schemathesis: bodies that fit the schema, bodies that do not,
missing and wrong keys) and its body decoder with arbitrary bytes and nested JSON (hypothesis). No request may get
a 5xx except a 503 that names its reason (a backend really down); no traceback reaches a caller. The examples are
bounded (FUZZ_EXAMPLES per endpoint) so the run fits `make test`; the failures found are kept below as regression
cases (`test_found_by_fuzzing_stays_fixed`).

The gateway runs in process on a stand-in for Triton's client (`project_gateway.FakeTriton`: it answers every
model with a tool call; the real server behind the real gateway is tests/test_gateway.py's)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies
from project_gateway import build_gateway, gateway  # noqa: F401 (gateway: a fixture)

from pipelines.api_errors import ApiError
from pipelines.gateway import openai_api as api

pytestmark = pytest.mark.slow
FUZZ_EXAMPLES = 250  # per endpoint and mode (valid, invalid): over 2,000 requests in all
SEEN: dict[str, int] = {"requests": 0}


@pytest.fixture(scope="module")
def fuzzed_app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One gateway for the whole fuzz run (the `gateway` fixture's setup, module-wide)."""
    mp = pytest.MonkeyPatch()
    built = build_gateway(tmp_path_factory.mktemp("fuzz"), mp, lifespan=False)  # schemathesis starts it, once
    client, _settings, keys, stop = next(built)
    yield client, keys
    stop()
    mp.undo()


def _operations(client: Any) -> list[Any]:
    """Every operation of the gateway's own OpenAPI schema, each able to call the app in process."""
    loaded = schemathesis.openapi.from_dict(client.app.openapi())
    loaded.app = client.app
    return [result.ok() for result in loaded.get_all_operations()]


def _acceptable(status: int, body: bytes) -> bool:
    """A success; or a 4xx, or a 503 with its reason, in OpenAI's error shape ({"error": {message, type, param,
    code}}); never another 5xx. (Mutation: the gateway's 4xx bodies as `{"detail": ...}`, FastAPI's default shape:
    it fails at the first refused request.)"""
    if status < 400:
        return True
    if status >= 500 and status != 503:
        return False
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    shaped = isinstance(error, dict) and set(error) >= {"message", "type", "param", "code"}
    return shaped and bool(error["message"]) and "Traceback" not in error["message"]


def test_no_request_the_schema_allows_or_breaks_gets_a_server_error(fuzzed_app: Any) -> None:
    """Each operation: FUZZ_EXAMPLES generated requests (valid by the schema and not: schemathesis's positive and
    negative modes), each sent with a project's key and the operator's."""
    client, keys = fuzzed_app
    operations = _operations(client)
    assert {f"{o.method.upper()} {o.path}" for o in operations} >= {"POST /v1/chat/completions", "POST /v1/feedback"}
    modes = list(schemathesis.GenerationMode)  # requests the schema allows, and requests that break it
    # an operation without a body or parameters has nothing to break: the valid requests only
    plan = [(o, m) for o in operations for m in modes if m == modes[0] or o.method.upper() == "POST"]
    for operation, mode in plan:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,  # no examples kept between runs: CI and a checkout generate the same requests
        )  # the same requests every run: a failure reproduces
        def fuzz(case: Any) -> None:
            for key in (keys["search"], keys["default"]):
                response = case.call(headers={"Authorization": f"Bearer {key}"})
                SEEN["requests"] += 1
                assert _acceptable(response.status_code, response.content), (
                    case.method,
                    case.path,
                    case.body,
                    response.status_code,
                    response.text[:500],
                )
                assert "Traceback" not in response.text

        fuzz()
    print(f"fuzzed: {SEEN}")
    assert SEEN["requests"] >= 2000, SEEN


JSON_VALUES = strategies.recursive(
    strategies.none() | strategies.booleans() | strategies.integers() | strategies.floats() | strategies.text(),
    lambda inner: strategies.lists(inner, max_size=4) | strategies.dictionaries(strategies.text(), inner, max_size=4),
    max_leaves=20,
)


@given(raw=strategies.binary(max_size=400) | JSON_VALUES.map(lambda v: json.dumps(v).encode()))
@settings(max_examples=600, deadline=None, derandomize=True, database=None)
def test_the_body_decoder_answers_any_bytes_with_a_request_or_a_400(raw: bytes) -> None:
    try:
        api.parse_request(raw)
    except ApiError as exc:
        assert exc.status == 400 and set(exc.body()["error"]) == {"message", "type", "param", "code"}


def test_the_body_decoder_holds_64_bit_integers_and_refuses_wider_ones_with_a_400() -> None:
    """And `NaN` / `Infinity`, which are not JSON (the capture wrote them as null). (Mutations: `decode_body`
    without `parse_int=_int64`: 2**63 decodes; without `parse_constant`: NaN decodes.)"""
    assert api.decode_body(b'{"a": [9223372036854775807, -9223372036854775808]}') == {"a": [2**63 - 1, -(2**63)]}
    for wide in (b"9223372036854775808", b"-9223372036854775809"):
        with pytest.raises(ApiError) as refused:
            api.decode_body(b'{"a": ' + wide + b"}")
        assert refused.value.status == 400 and "past the 64-bit range" in refused.value.body()["error"]["message"]
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        with pytest.raises(ApiError) as refused:
            api.decode_body(b'{"temperature": ' + constant + b"}")
        error = refused.value.body()["error"]
        assert refused.value.status == 400 and "is not a JSON value" in error["message"] and error["type"]


@pytest.mark.parametrize(
    "body",
    [
        # found by fuzzing (and by the review): each was a 500 before
        b'{"model": "champion", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
        b'"function": {"name": "refund"}}], "tool_choice": {"type": "function", "function": "refund"}}',
        b'{"model": "champion", "n": ' + b"9" * 4400 + b"}",
        b"[" * 1500 + b"]" * 1500,
        b'{"model": "champion", "messages": [{"role": "user", "content": "hi \\ud83d"}], "tools": []}',
        b'{"model": "champion", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
        # found by the schema fuzzer in CI: an integer past 64 bits in a tool's parameters (llguidance's ValueError
        # compiling the grammar) or anywhere in the body (the capture's orjson writer), each a 500 before
        b'{"messages": [{"role": "user"}], "model": "KIND_GPU", "n": 1, "stream": true, "tool_choice": "none", '
        b'"tools": [{"function": {"name": "0", "description": "", "parameters": {"": -9223372036854775809}}}]}',
        b'{"messages": [{"role": "user", "content": "hi"}], "model": "champion", "tools": [{"type": "function", '
        b'"function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer", '
        b'"maximum": 1180591620717411303424}}}}}]}',
        b'{"model": "champion", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "none", '
        b'"metadata": {"n": 1180591620717411303424}}',
    ],
)
def test_found_by_fuzzing_stays_fixed(body: bytes, gateway: Any) -> None:  # noqa: F811 (the fixture)
    """Each was a 500 before its fix."""
    client, _settings, keys, _stop = gateway
    for path in ("/v1/chat/completions", "/v1/feedback"):
        headers = {"Authorization": f"Bearer {keys['search']}", "Content-Type": "application/json"}
        response = client.post(path, content=body, headers=headers)
        assert 400 <= response.status_code < 500, (path, response.status_code, response.text[:300])


@pytest.mark.parametrize(
    "body",
    [
        # found by the schema fuzzer in CI: a call in the history with empty arguments (500 on the empty JSON)
        b'{"messages": [{"role": "user", "content": null, "tool_calls": [{"function": {"arguments": "", "name": '
        b'"0"}, "id": "0"}]}], "model": "KIND_GPU", "tool_choice": "none"}',
    ],
)
def test_found_by_fuzzing_is_answered_without_a_server_error(body: bytes, gateway: Any) -> None:  # noqa: F811
    """A request the schema allows that made a 500: now an answer (or a 4xx), never a server error."""
    client, _settings, keys, _stop = gateway
    headers = {"Authorization": f"Bearer {keys['search']}", "Content-Type": "application/json"}
    response = client.post("/v1/chat/completions", content=body, headers=headers)
    assert response.status_code < 500, (response.status_code, response.text[:300])
