"""The real Triton server (tritonserver 2.51 from nvidia-pytriton) serving registered adapters of the
tiny model: start/stop, load/infer/unload, bad requests, a broken repository, smoke tests, rollback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import listening_sockets
from serving_fixtures import registered  # noqa: F401 (the module-scoped fixture: v1 champion, v2 candidate)
from serving_fixtures import triton_settings as _triton_settings

from pipelines.services import port_free

pytestmark = pytest.mark.slow


def test_server_starts_on_free_loopback_ports_and_stops(tmp_path: Path) -> None:
    from pipelines.stack import triton as server

    settings = _triton_settings(tmp_path)
    status = server.up(settings)
    try:
        assert status.healthy and server.up(settings).pid == status.pid  # idempotent
        listening = listening_sockets([status.pid])
        assert {p for _, p in listening} >= {
            settings.triton.http_port,
            settings.triton.grpc_port,
            settings.triton.metrics_port,
        }
        assert {a for a, _ in listening} == {"127.0.0.1"}
    finally:
        assert server.down(settings)
    assert not server.status(settings).running
    assert all(port_free("127.0.0.1", p) for p in (settings.triton.http_port, settings.triton.grpc_port))


def test_deploy_infers_rejects_bad_requests_and_rolls_back(registered) -> None:
    from pipelines.serve import deploy, repository
    from pipelines.serve.client import TritonClient
    from pipelines.serve.prompts import conversation

    settings, v1, v2 = registered["settings"], registered["v1"], registered["v2"]
    first = deploy.deploy(settings, "champion")
    assert first["deployed"] == f"tool_router_v{v1}" and first["smoke"]["errors"] == 0
    assert first["smoke"]["constrained"] is True  # triton.constrained: the smoke test decodes as served
    live = deploy.live_model(settings)
    assert live is not None and live.version == v1
    row = deploy.smoke_rows(settings, 1)[0]
    turns = conversation(row, live.prompt_style)
    for protocol in ("http", "grpc"):
        client = TritonClient(settings, protocol)
        reply = client.infer_one(live.name, turns)
        assert reply.error is None and reply.prompt_tokens > 10 and 0 < reply.output_tokens <= 12
        assert reply.first_token_ms is None  # not streamed: one response
        texts: list[str] = []
        streamed = client.infer_one(live.name, turns, on_text=texts.append)  # decoupled: the text as it grows
        assert streamed.error is None and streamed.text == reply.text, protocol
        assert len(texts) >= 2 and all(b.startswith(a) for a, b in zip(texts, texts[1:])) and texts[-1] == reply.text
        assert 0 < streamed.first_token_ms < streamed.latency_ms and streamed.inter_token_ms is not None
        concurrent = client.infer(live.name, [turns] * 3, concurrency=3, stream=True)  # one stream per thread
        assert [r.text for r in concurrent] == [reply.text] * 3 and all(r.first_token_ms for r in concurrent)
        client.close()

    client = TritonClient(settings)
    for bad, expected in (
        ("not json", "not JSON"),
        (json.dumps({"role": "user"}), "JSON list"),
        (json.dumps([{"role": "user", "content": "hi " * 3000}]), "at most 2048"),
    ):
        reply = client.infer_one(live.name, bad)
        assert reply.error is not None and expected in reply.error
    assert client.infer_one(live.name, turns).error is None  # the server stayed up and still answers

    # constrained decoding in the served model: with TOOLS the answer is one of the grammar's, else an error
    assert client.accepts_tools(live.name) and not client.accepts_tools("no_such_model")
    ping = json.dumps([{"name": "ping", "parameters": {"type": "object", "properties": {}}}])
    answers = ({"name": "ping", "arguments": {}}, {"name": None})  # all the grammar admits

    def parsed(text: str | None) -> object:
        try:
            return json.loads(text or "")
        except ValueError:
            return None

    assert parsed(client.infer_one(live.name, turns).text) not in answers  # the untrained model, unconstrained
    for protocol in ("http", "grpc"):
        constrained = TritonClient(settings, protocol)
        assert constrained.accepts_tools(live.name)  # the config read works for both clients' shapes
        reply = constrained.infer_one(live.name, turns, tools=ping)
        assert reply.error is None and parsed(reply.text) in answers, reply.text
        constrained.close()
    # a keyword the grammar lacks is left out (grammar.enforceable); a pattern it cannot compile is refused
    unenforceable = json.dumps(
        [
            {
                "name": "tag",
                "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}},
            }
        ]
    )
    reply = client.infer_one(live.name, turns, tools=unenforceable)
    assert reply.error is not None and "tool tag" in reply.error and "look-around" in reply.error
    assert client.infer_one(live.name, turns, tools=ping).error is None

    # a broken repository fails to load while the old model keeps answering
    original = repository.MODEL_FILE
    broken = Path(str(settings.root)) / "broken_model.py"
    broken.write_text("raise RuntimeError('this model cannot start')\n")
    repository.MODEL_FILE = broken
    try:
        with pytest.raises(deploy.DeployFailed, match="did not load"):
            deploy.deploy(settings, version=v2)
    finally:
        repository.MODEL_FILE = original
    assert deploy.live_model(settings).version == v1
    assert client.infer_one(live.name, turns).error is None

    # a candidate that fails its smoke test is not switched to
    strict = settings.model_copy(update={"triton": settings.triton.model_copy(update={"smoke_min_valid_json": 1.01})})
    with pytest.raises(deploy.DeployFailed, match="smoke test"):
        deploy.deploy(strict, version=v2)
    assert deploy.live_model(settings).version == v1 and not client.ready(f"tool_router_v{v2}")

    second = deploy.deploy(settings, version=v2)
    assert second["previous"]["version"] == v1 and deploy.live_model(settings).version == v2
    assert set(client.loaded()) == {f"tool_router_v{v1}", f"tool_router_v{v2}"}
    back = deploy.rollback(settings)
    assert back["live"]["version"] == v1 and back["seconds"] < 5
    assert deploy.live_model(settings).version == v1
    assert client.infer_one(f"tool_router_v{v1}", turns).error is None
    events = [e["event"] for e in deploy.state(settings)["history"]]
    assert events == ["deployed", "deploy_failed", "deploy_failed", "deployed", "rollback"]
    client.unload(f"tool_router_v{v2}")
    assert not client.ready(f"tool_router_v{v2}")
    client.close()


def test_canary_splits_replayed_traffic_and_compares(registered) -> None:
    from pipelines.registry.models import CANDIDATE
    from pipelines.serve import canary, deploy

    settings = registered["settings"]
    if deploy.live_model(settings) is None:
        deploy.deploy(settings, "champion")
    result = canary.canary(settings, CANDIDATE, share=0.5, requests=8, seed=3)
    sizes = {name: m["requests"] for name, m in result["models"].items()}
    assert sum(sizes.values()) == 8 and all(n > 0 for n in sizes.values())
    assert result["candidate"] == f"tool_router_v{registered['v2']}"
    assert all(m["errors"] == 0 and m["latency_ms_p50"] > 0 for m in result["models"].values())


def test_vllm_repository_fits_its_adapters(tmp_path: Path) -> None:
    """The Triton vLLM backend's contract: config.pbtxt names backend "vllm"; model.json enables LoRA
    with max_loras >= the adapters and max_lora_rank >= every adapter's rank `r` (vLLM refuses a
    bigger one); multi_lora.json maps each name to an adapter folder; a misfit raises."""
    import re

    from pipelines.serve.vllm import VllmConfigError, vllm_model

    adapters = {}
    for name, rank in (("v3", 16), ("v4", 40)):
        folder = tmp_path / "adapters" / name
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank}))
        adapters[name] = str(folder)
    folder = vllm_model(tmp_path / "tool_router_vllm", "nvidia/Llama-3.1-Nemotron-Nano-8B-v1", adapters)
    assert re.search(r'^backend:\s*"vllm"\s*$', (folder / "config.pbtxt").read_text(), re.M)
    spec = json.loads((folder / "1" / "model.json").read_text())
    named = json.loads((folder / "1" / "multi_lora.json").read_text())
    assert spec["enable_lora"] is True and spec["max_loras"] >= len(named) == 2
    for path in named.values():
        rank = json.loads((Path(path) / "adapter_config.json").read_text())["r"]
        assert spec["max_lora_rank"] >= rank
    assert spec["max_lora_rank"] == 64  # 40 rounded up to a rank vLLM accepts
    with pytest.raises(VllmConfigError, match="above max_lora_rank 32"):
        vllm_model(tmp_path / "too_small", "base", adapters, max_lora_rank=32)
    with pytest.raises(VllmConfigError, match="no adapter_config.json"):
        vllm_model(tmp_path / "missing", "base", {**adapters, "v5": str(tmp_path / "adapters" / "v5")})


def test_percentiles_are_nearest_rank() -> None:
    from pipelines.bench.results import percentile

    values = [float(v) for v in range(100, 0, -1)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)
    assert percentile([10.0, 20.0, 30.0], 50) == 20.0 and percentile([], 50) is None


def test_benchmark_compares_base_few_shot_with_the_tuned_model(registered) -> None:
    from pipelines.bench.serving import run_bench
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.config import BenchSettings
    from pipelines.serve import deploy

    settings = registered["settings"]
    if deploy.live_model(settings) is None:
        deploy.deploy(settings, "champion")
    live = deploy.live_model(settings)
    assert BenchSettings().constrained == "served"  # the demo times the served decoding only; both here
    report = run_bench(settings, BenchSettings(requests=4, concurrency=[2, 1], shots=1, constrained="both"))
    # each model unconstrained and constrained (bench.constrained: both), at each concurrency level
    assert [(r["model"].split()[0], r["constrained"], r["concurrency"]) for r in report["runs"]] == [
        ("base", False, 1),
        ("base", False, 2),
        ("base", True, 1),
        ("base", True, 2),
        ("tuned", False, 1),
        ("tuned", False, 2),
        ("tuned", True, 1),
        ("tuned", True, 2),
    ]
    assert all(r["model"].endswith(", constrained") == r["constrained"] for r in report["runs"])
    assert all(r["errors"] == 0 and r["requests"] == 4 and r["p50_ms"] > 0 for r in report["runs"])
    # streamed: the grammar makes every constrained answer text (an untrained model's free answer may be empty)
    # (measured, not timed: under load the tokens may arrive in one chunk, an inter-token time of 0.0 ms)
    assert all(
        r["ttft_ms"] is not None and r["ttft_ms"] > 0 and r["itl_ms"] is not None and r["itl_ms"] >= 0
        for r in report["runs"]
        if r["constrained"]
    ), [(r["ttft_ms"], r["itl_ms"]) for r in report["runs"]]
    # one request at a time, a constrained answer's tokens arrive apart: an inter-token time never measured (0) fails
    assert any(r["itl_ms"] > 0 for r in report["runs"] if r["constrained"] and r["concurrency"] == 1), [
        (r["concurrency"], r["itl_ms"]) for r in report["runs"]
    ]
    assert all(r["p95_ms"] is None and r["p99_ms"] is None for r in report["runs"])  # 4 samples support no p95
    longest = report["longest_prompt_tokens"]
    assert settings.triton.max_input_tokens >= max(longest.values()) and len(longest) == 2
    base, tuned = report["runs"][2], report["runs"][6]  # the headline: decoded as served (constrained)
    assert report["constrained"] is True and report["direct"]["model"].endswith(", constrained")
    assert base["prompt_tokens_mean"] > tuned["prompt_tokens_mean"]  # schemas + shots vs the short prompt
    assert report["comparison"]["prompt_tokens_change"] < 0 and report["direct"]["requests"] == 4
    # every request's latency is in the report, and the median is one of them (nearest rank)
    assert all(len(r["latencies_ms"]) == 4 and r["p50_ms"] in r["latencies_ms"] for r in report["runs"])
    # 4 requests are too few for an interval of the median: none, and the page says why (the interval: below)
    assert report["comparison"]["latency_p50_change_ci95"] is None and report["comparison"]["paired_requests"] == 4
    assert "fewer than the 8" in report["comparison"]["interval"]
    html = Path(report["html_uri"]).read_text()
    assert (
        "<img" in html and "fewer than the 8" in html and "Every request" in html and Path(report["json_uri"]).is_file()
    )
    tag = json.loads(
        mlflow_client(settings)
        .get_model_version(settings.mlflow.registered_model, live.version)
        .tags["flywheel.benchmark"]
    )
    assert tag["p50_ms_c1"] == tuned["p50_ms"]


def test_episodes_through_triton_are_answered_by_the_served_model(registered, tmp_path: Path) -> None:
    """`flywheel eval --episodes --via triton` (issue 53): the champion's condition is answered by its Triton model,
    greedy (no sampled tries, no gold-call probabilities: the report says so), and a condition Triton does not serve
    is refused in one line before any episode runs. Mutation tried: `TritonPolicy.answer` answering in process
    (`ModelPolicy.answer`): the served model's inference count does not move and the test fails."""
    from test_episodes import TASKS, _db, _tools

    from pipelines.bench.episodes import TritonUnavailable, through_triton
    from pipelines.evaluate.episode_run import EpisodeRun, policies_for, run_episodes
    from pipelines.evaluate.pipeline import Adapter
    from pipelines.registry.models import adapter_path, prompt_style
    from pipelines.serve import deploy
    from pipelines.serve.client import TritonClient
    from pipelines.simulate.retail_env import RetailEnvironment

    settings, v1 = registered["settings"], registered["v1"]
    if deploy.live_model(settings) is None:
        deploy.deploy(settings, "champion")
    live = deploy.live_model(settings)
    assert live is not None and live.version == v1
    db, tools, tasks = tmp_path / "db.json", tmp_path / "tools.json", tmp_path / "tasks.jsonl"
    db.write_text(json.dumps(_db()))
    tools.write_text(json.dumps(_tools()))
    nothing = {"user_id": "ana_lee_1", "instruction": "Just saying hi.", "actions": []}  # a gold of no steps
    tasks.write_text("\n".join(json.dumps(t) for t in [*TASKS[:2], nothing]) + "\n")
    adapters = [Adapter("tuned_champion", adapter_path(settings, v1), prompt_style(settings, v1))]
    effects = RetailEnvironment(_db()).effects()
    common = {"effects": effects, "day": "2026-11-20", "baselines": False, "max_new_tokens": 12}
    policies = policies_for(settings, "tiny-llama", adapters, tools, **common)
    served = through_triton(settings, policies, {"tuned_champion": str(v1)})
    assert [p.served for p in served] == [f"triton {live.name}"]

    def inferences() -> int:
        client = TritonClient(settings)
        try:
            stats = client._control().get_inference_statistics(live.name, **client._deadline)
        finally:
            client.close()
        rows = stats["model_stats"] if isinstance(stats, dict) else stats.model_stats
        first = rows[0]
        return int(first["inference_count"] if isinstance(first, dict) else first.inference_count)

    before = inferences()
    report = run_episodes(settings, EpisodeRun(tasks, db, tools, "via-triton"), served)
    assert inferences() > before  # the episodes' answers came from the served model
    row = report["conditions"]["tuned_champion"]
    assert row["served"] == f"triton {live.name}" and row["sampled"] is False
    assert row["tasks"] == 3 and row["closed_loop_pass^1"] is not None and row["teacher_forced_step_exact"] is not None
    # no probability, not even the 1.0 of a gold with no steps (mutation tried: the empty product kept: fails)
    assert row[f"closed_loop_pass^{settings.episodes.k}"] is None and row["teacher_forced_pass^1"] is None
    assert all(t.get("tf_pass^1") is None for t in row["per_task"].values())
    assert all(s["gold_probability"] is None for s in report["teacher_forced"]["tuned_champion"][0]["steps"])
    with pytest.raises(TritonUnavailable, match="not loaded"):  # a version no Triton model serves
        through_triton(settings, policies, {"tuned_champion": "999"})
    with pytest.raises(TritonUnavailable, match="adapter folder"):  # an --adapter folder: no Triton model
        through_triton(settings, policies, {})


def test_the_latency_change_interval_pairs_the_requests() -> None:
    """Both models answer the same requests: request i's two latencies are resampled together, so a tuned model
    20 % faster on every request has an interval of -20 % at both ends however much the requests differ (an
    unpaired bootstrap of the same numbers spans tens of points). Mutation tried: the two resampled apart, this
    fails."""
    from pipelines.bench.report import change_line, render_html
    from pipelines.bench.results import _compare, nearest_rank, paired_p50_change_ci, percentile

    base = [100.0, 2400.0, 350.0, 1800.0, 90.0, 3000.0, 700.0, 1200.0]
    assert paired_p50_change_ci(base, [x * 0.8 for x in base]) == [-0.2, -0.2]
    lo, hi = paired_p50_change_ci(base, [x * (0.5 if i % 2 else 1.0) for i, x in enumerate(base)])
    assert -0.5 <= lo < hi <= 0.0
    assert paired_p50_change_ci(base[:7], base[:7]) is None  # fewer than 8 pairs
    assert paired_p50_change_ci(base, base[:4]) is None and paired_p50_change_ci([0.0] * 8, base) is None
    assert nearest_rank(8, 50) == 4 and percentile(base, 50) == sorted(base)[3] and nearest_rank(20, 95) == 19

    # the headline compares the rows it is given, request by request, one request at a time only
    def run(latencies: list[float], level: int = 1) -> dict:
        return {
            "p50_ms": percentile(latencies, 50),
            "p95_ms": None,
            "latencies_ms": latencies,
            "concurrency": level,
            "prompt_tokens_mean": 10.0,
            "requests_per_s": 1.0,
            "exact_match": 0.5,
            "model": "tuned v1",
        }

    tuned = [x * (0.5 if i % 2 else 1.0) for i, x in enumerate(base)]
    compared = _compare(run(base), run(tuned))
    assert compared["latency_p50_change_ci95"] == [lo, hi] and compared["paired_requests"] == 8
    assert change_line(compared) == (
        f"{compared['latency_p50_change']:+.1%} (paired 95 % CI {lo:+.1%} to {hi:+.1%}, n = 8)"
    )
    at_four = _compare(run(base, 4), run(tuned, 4))
    assert at_four["latency_p50_change_ci95"] is None and "not resampled as independent" in at_four["interval"]
    page = render_html(
        {
            "runs": [run(base)],
            "comparison": compared,
            "live": "l",
            "baseline": "b",
            "requests": 8,
            "protocol": "http",
            "generated_at": "now",
            "hardware": {"name": "cpu", "peak_bf16_flops": 2e11, "memory_bandwidth": 2e10, "usd_per_hour": 0.1},
        }
    )
    assert "paired 95 % CI" in page and "200.0 GFLOP/s" in page


def test_a_restart_while_a_model_is_live_keeps_it_live(registered) -> None:
    """After a Triton restart nothing is loaded; deploying the live version reloads it (and smoke-tests
    it), so the post-deployment smoke test passes and the previous version is not restored."""
    from pipelines import tasks
    from pipelines.serve import deploy
    from pipelines.serve.client import TritonClient
    from pipelines.stack import triton as server

    settings, v1, v2 = registered["settings"], registered["v1"], registered["v2"]
    if deploy.live_model(settings) is None or deploy.live_model(settings).version != v2:
        if deploy.live_model(settings) is None:
            deploy.deploy(settings, version=v1)
        deploy.deploy(settings, version=v2)
    previous = deploy.state(settings)["previous"]
    folder = Path(str(settings.triton.model_repository)) / f"tool_router_v{v2}"
    written = (folder / "1" / "model.py").stat().st_mtime_ns
    server.down(settings)
    server.up(settings)
    client = TritonClient(settings)
    try:
        assert not client.ready(f"tool_router_v{v2}")
        result = deploy.deploy(settings, version=v2)
        assert result["unchanged"] and result["reloaded"] and result["smoke"]["errors"] == 0
        assert client.ready(f"tool_router_v{v2}")
    finally:
        client.close()
    assert (folder / "1" / "model.py").stat().st_mtime_ns == written  # the live model's folder was not rewritten
    assert tasks.smoke_test(settings, {})["version"] == v2
    assert deploy.live_model(settings).version == v2 and deploy.state(settings)["previous"] == previous
    assert deploy.state(settings)["history"][-1]["event"] == "reloaded"


def test_multi_lora_serves_every_version_as_an_adapter_on_one_loaded_base(registered) -> None:
    """`triton.multi_lora`: deploying v1 then v2 loads one shared base (no per-version model), each version is an
    adapter chosen per request; with a cache of one adapter, alternating requests evict and reload them and every
    one is answered; the gateway's routing table maps champion/previous/vN to the adapters; a rollback is a
    pointer swap; `undeploy` removes the adapters, and the shared base refuses them from then on while it stays
    loaded. Mutations tried: the client not sending ADAPTER (every request on the bare base) fails the adapter
    loads in the Triton log; `ensure` never evicting fails the eviction line."""
    import re

    from pipelines import services
    from pipelines.config import load_settings
    from pipelines.gateway.router import Router
    from pipelines.serve import deploy, shared_base
    from pipelines.serve.client import TritonClient
    from pipelines.serve.prompts import conversation
    from pipelines.stack import triton as server

    plain, v1, v2 = registered["settings"], registered["v1"], registered["v2"]
    t = plain.triton
    settings = load_settings(
        root=str(plain.root),
        evaluation={"examples": 4, "shots": 0},
        triton={
            "http_port": t.http_port,
            "grpc_port": t.grpc_port,
            "metrics_port": t.metrics_port,
            "smoke_requests": 3,
            "smoke_min_valid_json": 0.0,
            "max_new_tokens": 12,
            "max_input_tokens": 2048,
            "multi_lora": True,
            "max_adapters": 1,
        },
    )
    shared = shared_base.shared_name("tiny-llama")
    first = deploy.deploy(settings, version=v1)
    second = deploy.deploy(settings, version=v2)
    assert (first["deployed"], second["deployed"]) == (f"{shared}@tool_router_v{v1}", f"{shared}@tool_router_v{v2}")
    assert first["smoke"]["errors"] == 0 and second["smoke"]["errors"] == 0
    client = TritonClient(settings, "grpc")
    try:
        loaded = client.loaded()
        assert shared in loaded and not [n for n in loaded if n.startswith("tool_router_v")], loaded  # no copies
        row = deploy.smoke_rows(settings, 1)[0]
        names = [f"{shared}@tool_router_v{v}" for v in (v1, v2, v1, v2)]

        def settled(at_least: int = 0) -> dict:
            """The counters once Triton has counted everything answered (it counts an execution when it returns,
            after its answers went out): at least `at_least` inferences and unchanged over 0.3 s, 10 s at most."""
            deadline, seen = time.monotonic() + 10, client.statistics(shared)
            while time.monotonic() < deadline:
                time.sleep(0.3)
                now = client.statistics(shared)
                if now == seen and now["inference_count"] >= at_least:
                    break
                seen = now
            return seen

        counted = settled()
        replies = [client.infer_one(name, conversation(row, "short")) for name in names]
        assert all(r.error is None and r.output_tokens > 0 for r in replies), [r.error for r in replies]
        # Triton's own counters for the shared base (an adapter's name reads its base's): four inferences, one at a
        # time, so four executions of batch size 1, each with compute time
        after = settled(counted["inference_count"] + 4)
        assert after["inference_count"] - counted["inference_count"] == 4, (counted, after)
        assert after["execution_count"] - counted["execution_count"] == 4, (counted, after)
        assert after["executions_by_batch_size"].get(1, 0) - counted["executions_by_batch_size"].get(1, 0) == 4
        assert (
            after["compute_infer_ns"] > counted["compute_infer_ns"] and after["execution_ns"] > counted["execution_ns"]
        )
        assert replies[0].text == replies[2].text and replies[1].text == replies[3].text  # reloaded, same answer
        log = services.log_path(str(settings.root), server.SERVICE).read_text(errors="replace")
        loads = re.findall(rf"adapter tool_router_v(?:{v1}|{v2}) loaded", log)
        assert len(loads) >= 4 and f"adapter tool_router_v{v1} evicted" in log, loads  # a cache of one: each came back
        targets = Router(settings)._build_targets()
        assert targets["champion"].name == names[1] and targets["previous"].name == names[0]
        assert targets[f"v{v1}"].name == names[0] and targets["champion"].prompt_style == "short"
        back = deploy.rollback(settings)
        assert back["live"]["name"] == names[0] and client.infer_one(names[0], conversation(row, "short")).error is None
        from pipelines.bench.serving import run_bench
        from pipelines.config import BenchSettings
        from pipelines.serve import repository

        precisions = ["fp32", "bf16", "auto"]  # a shared base is at no precision: each is a merged copy, timed
        report = run_bench(
            settings,
            BenchSettings(requests=2, concurrency=[1], shots=0, constrained="served", precisions=precisions),
        )
        assert report["live"] == names[0] and {r["errors"] for r in report["runs"]} == {0}
        copies = [f"{repository.triton_name(settings, v1)}_{p}" for p in precisions]
        copied = [r["model"].removesuffix(", constrained") for r in report["runs"]][-3:]
        assert copied == [f"v{v1} at {p} (benchmark copy)" for p in precisions]
        assert [(r["precision"], r["exact_match_diff"]["n"]) for r in report["precision"]["rows"]] == [
            ("bf16", 2),
            ("auto", 2),
        ]
        assert report["served_precision"] == "multi-LoRA shared base"
        base = repository.triton_name(settings, None)
        assert not client.ready(base), "the benchmark's own base copy was left loaded beside the shared base"
        assert not any(client.ready(c) for c in copies), "a precision copy was left loaded"
        alone = run_bench(settings, BenchSettings(requests=1, concurrency=[1], shots=0, baseline=False, direct=False))
        assert [r["model"].split()[0] for r in alone["runs"]] == ["tuned"]  # bench.baseline off: no few-shot base
        assert alone["baseline"] is None and alone["comparison"] == {} and alone["runs"][0]["errors"] == 0
        gone = deploy.undeploy(settings)
        assert sorted(gone["adapters_removed"]) == sorted({f"tool_router_v{v1}", f"tool_router_v{v2}"})
        refused = client.infer_one(names[0], conversation(row, "short"))
        assert refused.error is not None and "unknown adapter" in refused.error
        assert client.ready(shared) and not client.ready(names[0])
    finally:
        client.close()
