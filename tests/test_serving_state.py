"""Serving without a server: the benchmark's arithmetic, the client's target and deadlines, the
serving state's lock and its errors, and model folders that are never rewritten while in use."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pipelines.config import load_settings
from pipelines.serve.client import Reply

CALL = json.dumps({"name": "search_products", "arguments": {"query": "red shoes"}})
RIGHT = '{"name":"search_products","arguments":{"query":"red shoes"}}'


def _settings(root: Path, **triton: Any):
    return load_settings(root=str(root), triton=triton)


# --- benchmark arithmetic -------------------------------------------------------------------------
def test_an_errored_request_counts_as_wrong_and_as_a_latency_sample() -> None:
    from pipelines.bench.results import summarize_run

    rows = [{"target_json": CALL}] * 4
    replies = [
        Reply(RIGHT, 100, 10, 10.0),
        Reply(RIGHT, 100, 10, 20.0),
        Reply(RIGHT, 100, 10, 30.0),
        Reply(None, 0, 0, 5000.0, "prompt is 1100 tokens; this model accepts at most 1024"),
    ]
    run = summarize_run("base", 1, rows, replies, seconds=2.0)
    assert run["requests"] == 4 and run["errors"] == 1
    assert run["exact_match"] == 0.75  # 3 of 4, not 3 of 3
    assert run["p50_ms"] == 20.0 and run["requests_per_s"] == 1.5  # goodput: answered requests only
    assert "at most 1024" in run["first_error"]
    many = summarize_run("base", 1, rows * 5, (replies[:3] * 6 + replies[3:] * 2), seconds=1.0)
    assert many["p95_ms"] == 5000.0  # the timed-out requests are the slow tail, not dropped
    assert many["exact_match"] == 18 / 20
    # a request refused at once counts at the client's timeout: failing fast does not look fast
    fast_fail = [Reply(None, 0, 0, 2.0, "connection refused")] * 20
    refused = summarize_run("base", 1, rows * 5, fast_fail, seconds=0.1, timeout_ms=600_000)
    assert refused["p50_ms"] == 600_000 and refused["requests_per_s"] == 0.0 and refused["exact_match"] == 0.0
    assert many["exact_match"] == 18 / 20


def test_percentiles_the_sample_cannot_support_are_none() -> None:
    from pipelines.bench.results import percentile, summarize_run, table_rows

    assert percentile([1.0] * 19, 95) is None and percentile([1.0] * 20, 95) == 1.0
    assert percentile([1.0] * 99, 99) is None and percentile([1.0] * 100, 99) == 1.0
    assert percentile([7.0], 50) == 7.0
    run = summarize_run(
        "tuned", 1, [{"target_json": CALL}] * 8, [Reply(RIGHT, 50, 10, 10.0 * i) for i in range(8)], 1.0
    )
    assert run["p95_ms"] is None and run["p99_ms"] is None and run["p50_ms"] == 30.0
    cells = table_rows({"runs": [{**run, "usd_per_million_requests": None}], "direct": None})[0]
    assert cells[4] == "0" and cells[8:10] == ["n/a", "n/a"]  # errors column; unsupported percentiles
    assert cells[5:7] == ["n/a", "n/a"]  # not streamed: no time to first token, no inter-token latency
    streamed = [Reply(RIGHT, 50, 11, 1000.0 + i, first_token_ms=100.0 + i) for i in range(3)]
    timed = summarize_run("tuned", 1, [{"target_json": CALL}] * 3, streamed, 1.0)
    assert (timed["ttft_ms"], timed["itl_ms"]) == (101.0, 90.0)  # (1001 - 101) / (11 - 1)
    assert cells[:3] == ["tuned", "free", "1"]
    graded = {**run, "model": "tuned, constrained", "constrained": True, "usd_per_million_requests": None}
    assert table_rows({"runs": [graded], "direct": None})[0][:2] == ["tuned", "grammar"]


def test_a_prompt_over_the_served_limit_stops_the_benchmark_before_it_starts() -> None:
    from pipelines.bench.serving import PromptTooLong, check_prompt_lengths

    class Words:  # one token per word, as a tokenizer would count them
        """A stand-in for the base model's Hugging Face tokenizer; its encoding is made with `type(...)` to stand
        in for `BatchEncoding`. The real tokenizer is checked in
        tests/test_serve.py::test_benchmark_compares_base_few_shot_with_the_tuned_model."""

        def apply_chat_template(self, turns, tokenize, add_generation_prompt):
            return " ".join(t["content"] for t in turns)

        def __call__(self, text, add_special_tokens):
            return type("Encoded", (), {"input_ids": text.split()})()

    short, long = [{"role": "user", "content": "a " * 10}], [{"role": "user", "content": "a " * 30}]
    assert check_prompt_lengths(Words(), {"tuned": ([short], 16)}) == {"tuned": 10}
    with pytest.raises(PromptTooLong, match=r"longest base \+ 3-shot prompt is 30 tokens .* at most 16"):
        check_prompt_lengths(Words(), {"tuned": ([short], 16), "base + 3-shot": ([short, long], 16)})


def test_the_dag_s_benchmark_task_is_skipped_and_says_so_when_switched_off(tmp_path: Path, monkeypatch) -> None:
    from pipelines import tasks
    from pipelines.bench import serving

    ran = []
    # stand-in for the benchmark on a running Triton server (the real one:
    # tests/test_serve.py::test_benchmark_compares_base_few_shot_with_the_tuned_model)
    monkeypatch.setattr(
        serving,
        "run_bench",
        lambda settings: (
            ran.append(settings)
            or {
                "live": "m",
                "version": "1",
                "comparison": {},
                "json_uri": "j",
                "html_uri": "h",
                "triton_overhead_ms": 1.0,
            }
        ),
    )
    smoked = {"live": "champion-v2", "version": "2"}
    off = load_settings(root=str(tmp_path), bench={"after_deploy": False})
    assert (
        tasks.benchmark(off, smoked) == {"live": "champion-v2", "version": "2", "skipped": "bench.after_deploy is off"}
        and ran == []
    )
    assert tasks.benchmark(load_settings(root=str(tmp_path)), smoked)["json_uri"] == "j" and len(ran) == 1


# --- the client ----------------------------------------------------------------------------------
def test_the_client_connects_to_triton_url(tmp_path: Path) -> None:
    from pipelines.serve.client import target

    local = _settings(tmp_path, http_port=8123, grpc_port=8124)
    assert target(local, "http") == ("127.0.0.1:8123", False) and target(local, "grpc") == ("127.0.0.1:8124", False)
    cluster = _settings(tmp_path, url="http://triton.flywheel.svc.cluster.local:8000", http_port=9999)
    assert target(cluster, "http") == ("triton.flywheel.svc.cluster.local:8000", False)
    assert target(cluster, "grpc") == ("triton.flywheel.svc.cluster.local:8001", False)
    assert target(_settings(tmp_path, url="https://triton.example.com"), "http") == ("triton.example.com:443", True)


def test_every_grpc_call_carries_the_client_timeout(tmp_path: Path) -> None:
    import numpy as np

    from pipelines.serve.client import TritonClient

    calls: list[tuple[str, dict[str, Any]]] = []

    class Result:
        """A stand-in for `tritonclient.grpc.InferResult` (real: the test_serve.py test named below)."""

        def as_numpy(self, name):
            return {"TOOL_CALL": np.array([[RIGHT.encode()]], dtype=np.object_), "FINAL": np.array([[True]])}.get(
                name, np.array([[3]])
            )

    class Recorder:
        """A stand-in for `tritonclient.grpc.InferenceServerClient` that records each call and its keywords. The
        real client against a real Triton server runs in
        tests/test_serve.py::test_deploy_infers_rejects_bad_requests_and_rolls_back."""

        def __getattr__(self, method):
            def call(*args, **kwargs):
                calls.append((method, kwargs))
                return {"get_model_repository_index": [], "is_model_ready": False}.get(method)

            return call

    class Stream(Recorder):  # the per-thread streaming connection: answers each request with one final response
        """A stand-in for the gRPC client's stream (real: the same test_serve.py test, streamed)."""

        def start_stream(self, callback, **kwargs):
            calls.append(("start_stream", kwargs))
            self.callback = callback

        def async_stream_infer(self, model, inputs, **kwargs):
            calls.append(("async_stream_infer", kwargs))
            if model == "m":
                self.callback(Result(), None)

    client = TritonClient(_settings(tmp_path), "grpc", timeout_s=0.5)  # a gRPC channel connects lazily
    client._local.control = Recorder()  # this thread's control connection
    client._local.grpc = Stream()
    client.load("m"), client.unload("m"), client.ready("m"), client.loaded()
    assert client.infer_one("m", [{"role": "user", "content": "hi"}]).text == RIGHT
    assert [m for m, _ in calls] == [
        "load_model",
        "unload_model",
        "is_model_ready",
        "get_model_repository_index",
        "start_stream",
        "async_stream_infer",
        "stop_stream",
    ]
    assert all(kwargs.get("client_timeout") == 0.5 for _, kwargs in calls[:4])
    assert calls[4][1]["stream_timeout"] == 0.5
    silent = client.infer_one("quiet", [{"role": "user", "content": "hi"}])  # a model that never answers
    assert silent.text is None and "no answer from quiet within 0.5 s" in silent.error


def test_a_model_folder_built_before_streaming_is_called_as_built(tmp_path: Path) -> None:
    """A live folder is never rewritten, so after an upgrade the client still meets models without the
    STREAM input and FINAL output: it must not send STREAM, and each answer is final."""
    import numpy as np

    from pipelines.serve.client import TritonClient

    sent: list[list[str]] = []

    class Old:  # one response per request, no FINAL tensor
        """A stand-in for `tritonclient.grpc.InferResult` from a model folder built before streaming (the real client
        and server: the test_serve.py test named below)."""

        def as_numpy(self, name):
            return {
                "TOOL_CALL": np.array([[RIGHT.encode()]], dtype=np.object_),
                "PROMPT_TOKENS": np.array([[3]]),
                "OUTPUT_TOKENS": np.array([[5]]),
            }.get(name)

    class Control:
        """A stand-in for the control connection's `get_model_config` of a folder without STREAM or FINAL (real:
        the test_serve.py test named below)."""

        def get_model_config(self, name, **kwargs):
            return {"input": [{"name": "CONVERSATION"}, {"name": "TOOLS"}]}

    class Stream:
        """A stand-in for the gRPC client's stream that records the inputs sent. The real client and server run in
        tests/test_serve.py::test_deploy_infers_rejects_bad_requests_and_rolls_back (folders built with STREAM)."""

        def start_stream(self, callback, **kwargs):
            self.callback = callback

        def async_stream_infer(self, model, inputs, **kwargs):
            sent.append([i.name() for i in inputs])
            self.callback(Old(), None)

        def stop_stream(self, **kwargs):
            pass

    client = TritonClient(_settings(tmp_path), "grpc", timeout_s=5)
    client._local.control = Control()
    client._local.grpc = Stream()
    texts: list[str] = []
    reply = client.infer_one("tool_router_v1", [{"role": "user", "content": "hi"}], on_text=texts.append)
    assert (reply.text, reply.output_tokens, reply.error, reply.first_token_ms) == (RIGHT, 5, None, None)
    assert sent == [["CONVERSATION"]] and texts == []  # no STREAM input for a model that does not declare it


# --- the serving state -----------------------------------------------------------------------------
class FakeClient:
    """A stand-in for Triton's client (`serve.client.TritonClient`): model control of a server that loads everything
    it is asked to. Deploy and rollback on the real server run in
    tests/test_faults_serving.py::test_deploy_and_rollback_at_once_on_the_real_server, and a restart in
    tests/test_serve.py::test_a_restart_while_a_model_is_live_keeps_it_live."""

    loaded_models: set[str] = set()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def ready(self, name: str) -> bool:
        return name in FakeClient.loaded_models

    def load(self, name: str) -> None:
        FakeClient.loaded_models.add(name)

    def unload(self, name: str, wait_s: float = 0) -> None:
        FakeClient.loaded_models.discard(name)

    def loaded(self) -> list[str]:
        return sorted(FakeClient.loaded_models)

    def close(self) -> None:
        pass


@pytest.fixture
def fake_serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """deploy/rollback with stand-ins for the server, the registered version's model folder and the smoke test
    (which takes `slow_smoke_s`). The real ones run in
    tests/test_faults_serving.py::test_deploy_and_rollback_at_once_on_the_real_server."""
    from pipelines.serve import deploy, repository

    settings = _settings(tmp_path / "root", state_lock_timeout_s=30)
    FakeClient.loaded_models = set()
    smoke_calls: list[str] = []
    slow = {"s": 0.0}
    smoking = threading.Event()  # set while a smoke test runs (the deploy holds the state lock then)

    def smoke(settings, client, entry):
        """A stand-in for the smoke test (`deploy.smoke_test`: requests to the loaded model); the real one runs in
        the test named above."""
        smoke_calls.append(entry.name)
        smoking.set()
        time.sleep(slow["s"])
        return {"errors": 0, "valid_json": 1.0}

    monkeypatch.setattr(deploy, "TritonClient", FakeClient)
    # stand-in for starting tritonserver (the real start:
    # tests/test_serve.py::test_server_starts_on_free_loopback_ports_and_stops)
    monkeypatch.setattr(deploy.server, "up", lambda settings: None)
    monkeypatch.setattr(deploy, "smoke_test", smoke)
    # stand-in for building a registered version's model folder (the real build:
    # tests/test_faults_serving.py::test_deploy_and_rollback_at_once_on_the_real_server)
    monkeypatch.setattr(
        repository,
        "build_version",
        lambda settings, version, in_use=False: repository.ModelEntry(
            repository.triton_name(settings, version), "", version, "short", "tiny"
        ),
    )
    return {"settings": settings, "smoke_calls": smoke_calls, "slow": slow, "smoking": smoking}


def test_deploy_and_rollback_at_once_lose_no_update(fake_serving) -> None:
    from pipelines.serve import deploy

    settings = fake_serving["settings"]
    deploy.deploy(settings, version="1")
    deploy.deploy(settings, version="2")
    fake_serving["slow"]["s"] = 1.0  # v3's smoke test runs while the rollback comes in
    errors: list[BaseException] = []

    def run(call):
        try:
            call()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    fake_serving["smoking"].clear()
    deploying = threading.Thread(target=run, args=(lambda: deploy.deploy(settings, version="3"),))
    deploying.start()
    assert fake_serving["smoking"].wait(10), "the deploy never reached its smoke test"
    rolling = threading.Thread(target=run, args=(lambda: deploy.rollback(settings),))
    rolling.start()
    deploying.join(30), rolling.join(30)
    assert not errors
    current = deploy.state(settings)
    assert [e["event"] for e in current["history"]] == ["deployed", "deployed", "deployed", "rollback"]
    assert current["live"]["name"] == "tool_router_v2" and current["previous"]["name"] == "tool_router_v3"


def test_a_held_state_lock_times_out_with_one_clear_error(fake_serving) -> None:
    from pipelines.serve import deploy

    settings = fake_serving["settings"]
    deploy.deploy(settings, version="1")
    quick = settings.model_copy(update={"triton": settings.triton.model_copy(update={"state_lock_timeout_s": 0.2})})
    holding, release = threading.Event(), threading.Event()

    def hold():
        with deploy.state_lock(settings):
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    try:
        with pytest.raises(deploy.StateBusy, match="stayed locked .* triton.state_lock_timeout_s") as caught:
            deploy.deploy(quick, version="2")
        assert "\n" not in str(caught.value)
    finally:
        release.set()
        holder.join(10)
    assert deploy.live_model(settings).name == "tool_router_v1"


def test_deploy_of_the_live_version_reloads_it_after_a_restart(fake_serving) -> None:
    from pipelines.serve import deploy

    settings = fake_serving["settings"]
    deploy.deploy(settings, version="1")
    deploy.deploy(settings, version="2")
    assert deploy.deploy(settings, version="2")["reloaded"] is False  # loaded: nothing to do
    FakeClient.loaded_models.clear()  # the server restarted
    fake_serving["smoke_calls"].clear()
    result = deploy.deploy(settings, version="2")
    assert result["unchanged"] and result["reloaded"] and FakeClient.loaded_models == {"tool_router_v2"}
    assert fake_serving["smoke_calls"] == ["tool_router_v2"]
    assert deploy.live_model(settings).name == "tool_router_v2"
    assert deploy.state(settings)["previous"]["name"] == "tool_router_v1"


def test_a_corrupt_state_file_is_one_clear_error(tmp_path: Path) -> None:
    from pipelines.serve import deploy

    settings = _settings(tmp_path)
    path = Path(settings.zone("serving")) / "state.json"
    path.parent.mkdir(parents=True)
    for content in ('{"live": {"name": "tool_router_v1", ', '["live"]', '{"live": "tool_router_v1"}'):
        path.write_text(content)
        with pytest.raises(deploy.StateCorrupt, match=f"{path}.*delete it") as caught:
            deploy.live_model(settings)
        assert "\n" not in str(caught.value)


# --- model folders ---------------------------------------------------------------------------------
def _folder(settings, repo: Path, in_use: bool, style: str = "short", **triton: Any):
    from pipelines.serve.repository import write_model

    if triton:
        settings = settings.model_copy(update={"triton": settings.triton.model_copy(update=triton)})
    return write_model(
        settings,
        repo,
        "tool_router_v1",
        "/models/base",
        None,
        {"registry_version": "1", "base_model": "tiny", "prompt_style": style},
        in_use=in_use,
    )


def test_a_folder_in_use_is_never_rewritten(tmp_path: Path) -> None:
    from pipelines.serve.repository import ModelInUse

    settings, repo = _settings(tmp_path), tmp_path / "repository"
    folder, stale = _folder(settings, repo, in_use=False)
    marker = folder / "1" / "loaded-by-triton"
    marker.write_text("")
    assert _folder(settings, repo, in_use=True) == (folder, False) and marker.exists()  # identical: reused
    assert _folder(settings, repo, in_use=True, max_input_tokens=4096) == (folder, True) and marker.exists()
    with pytest.raises(ModelInUse, match="never rewritten while in use"):
        _folder(settings, repo, in_use=True, style="full")
    assert marker.exists()
    assert _folder(settings, repo, in_use=False, max_input_tokens=4096) == (folder, False)  # not in use: replaced
    assert not marker.exists() and '"4096"' in (folder / "config.pbtxt").read_text()
    assert sorted(p.name for p in repo.iterdir()) == ["tool_router_v1"]  # no staging left behind


def test_publish_uploads_a_model_folder_only_where_absent(tmp_path: Path) -> None:
    import fsspec

    from pipelines.serve.repository import ModelInUse, publish

    settings = _settings(tmp_path, model_repository="memory://models/repository")
    fs = fsspec.filesystem("memory")
    folder, _ = _folder(settings, tmp_path / "staging", in_use=False)
    uri, stale = publish(settings, folder)
    assert uri == "memory://models/repository/tool_router_v1" and not stale
    fs.pipe_file("/models/repository/tool_router_v1/1/loaded-by-triton", b"")
    assert publish(settings, folder, in_use=True) == (uri, False)  # identical: not uploaded again
    assert fs.exists("/models/repository/tool_router_v1/1/loaded-by-triton")
    other, _ = _folder(settings, tmp_path / "staging", in_use=False, style="full")
    with pytest.raises(ModelInUse):
        publish(settings, other, in_use=True)
    assert fs.exists("/models/repository/tool_router_v1/1/loaded-by-triton")
    publish(settings, other, in_use=False)
    assert not fs.exists("/models/repository/tool_router_v1/1/loaded-by-triton")
    assert json.loads(fs.cat_file("/models/repository/tool_router_v1/1/flywheel.json"))["prompt_style"] == "full"
    fs.rm("/models/repository", recursive=True)
