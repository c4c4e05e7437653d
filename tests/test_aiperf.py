"""The AIPerf benchmark's own parts without AIPerf: the trace it replays carries our tools and customer
ids in AIPerf's mooncake_trace shape, a run streams with the key only in AIPerf's environment, and AIPerf's summary
export becomes our row (every request counted, errors included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.bench import aiperf


def test_the_trace_carries_messages_tools_and_the_customer_and_no_timestamps() -> None:
    lines = aiperf.trace_lines(5)
    assert len(lines) == 5
    for line in lines:
        assert set(line) == {"messages", "tools", "extra"}  # a timestamp would switch AIPerf to timed replay
        assert line["messages"][-1]["role"] in ("user", "tool") and line["tools"][0]["type"] == "function"
        assert line["extra"]["user"].startswith("cus_")


def test_a_run_streams_our_trace_with_the_key_only_in_the_environment(tmp_path: Path) -> None:
    import yaml

    config = yaml.safe_load(
        aiperf.run_config("champion", "http://127.0.0.1:8400", 4, 24, tmp_path / "t.jsonl", tmp_path / "out")
    )["benchmark"]
    assert config["model"] == "champion" and config["endpoint"]["streaming"] is True
    assert config["endpoint"]["api_key"] == "${OPENAI_API_KEY}"  # resolved by AIPerf from its environment
    assert config["dataset"] == {"type": "file", "path": str(tmp_path / "t.jsonl"), "format": "mooncake_trace"}
    warmup, profiling = config["phases"]
    assert warmup["excludeFromResults"] is True and (profiling["requests"], profiling["concurrency"]) == (24, 4)
    cmd = aiperf.command(Path("/x/aiperf"), tmp_path / "run.yaml", "/tok")
    assert cmd[:4] == ["/x/aiperf", "profile", "--config", str(tmp_path / "run.yaml")]
    assert "--use-server-token-count" in cmd and "--api-key" not in cmd


def test_the_summary_export_becomes_a_row_with_every_request_counted() -> None:
    export = {
        "time_to_first_token": {"unit": "ms", "p50": 120.04, "p99": 300.0},
        "inter_token_latency": {"unit": "ms", "p50": 41.26},
        "request_latency": {"unit": "ms", "p50": 1500.0, "p99": 2400.55},
        "request_throughput": {"avg": 0.6543},
        "request_count": {"avg": 22},
        "error_request_count": {"avg": 2},
        "input_sequence_length": {"p50": 180},
        "output_sequence_length": {"p50": 31},
    }
    row = aiperf.summarize(export)
    assert row == {
        "ttft_p50_ms": 120.0,
        "ttft_p99_ms": 300.0,
        "itl_p50_ms": 41.3,
        "latency_p50_ms": 1500.0,
        "latency_p99_ms": 2400.6,
        "requests_per_s": 0.654,
        "requests": 24,
        "errors": 2,
        "prompt_tokens_p50": 180.0,
        "output_tokens_p50": 31.0,
    }
    clean = aiperf.summarize({**export, "error_request_count": None})
    assert (clean["requests"], clean["errors"]) == (22, 0)


def test_a_missing_aiperf_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pipelines.config import load_settings

    monkeypatch.setenv("FLYWHEEL_AIPERF", str(tmp_path / "nowhere" / "aiperf"))  # the older variable still works
    settings = load_settings(root=str(tmp_path))
    with pytest.raises(aiperf.AiperfFailed, match="make aiperf-env"):
        aiperf.executable(settings.bench.aiperf)


def test_the_report_page_has_the_table_and_the_plot() -> None:
    row = {
        "model": "champion",
        "concurrency": 1,
        "requests": 24,
        "errors": 1,
        "ttft_p50_ms": 600.0,
        "ttft_p99_ms": None,
        "itl_p50_ms": 28.0,
        "latency_p50_ms": 1700.0,
        "latency_p99_ms": 2300.0,
        "requests_per_s": 0.58,
        "prompt_tokens_p50": 118.0,
        "output_tokens_p50": 35.0,
    }
    page = aiperf.render_html(
        {
            "runs": [row, {**row, "concurrency": 4, "latency_p50_ms": 6000.0}],
            "live": "tool_router_v1",
            "aiperf": "0.13.0",
            "requests_per_run": 24,
            "generated_at": "2026-11-24T05:00:00+00:00",
        }
    )
    assert "<img" in page and "tool_router_v1" in page and "1700.0" in page.replace(",", "") and "n/a" in page
