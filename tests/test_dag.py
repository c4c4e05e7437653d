"""The commerce_flywheel DAG under `airflow dags test`. Under the real scheduler (`flywheel up`, a run
triggered through the REST API): test_drift_scenario (`make test-scenario`, outside `make test`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from helpers import run_flywheel
from ports import free_port

from pipelines.config import load_settings
from pipelines.stack.airflow import dags_test

pytestmark = pytest.mark.slow
DAY = "2026-11-20"


TINY_SWEEP = str(Path(__file__).resolve().parent.parent / "conf" / "sweeps" / "tiny.yaml")


def _small_serving_env() -> dict[str, str]:
    """Triton on free ports, a smoke test the untrained tiny model can pass, a 2-request benchmark."""
    return {
        "FLYWHEEL_TRITON__HTTP_PORT": str(free_port()),
        "FLYWHEEL_TRITON__GRPC_PORT": str(free_port()),
        "FLYWHEEL_TRITON__METRICS_PORT": str(free_port()),
        "FLYWHEEL_TRITON__SMOKE_REQUESTS": "2",
        "FLYWHEEL_TRITON__SMOKE_MIN_VALID_JSON": "0",
        "FLYWHEEL_TRITON__MAX_NEW_TOKENS": "12",
        "FLYWHEEL_BENCH__REQUESTS": "2",
        "FLYWHEEL_BENCH__CONCURRENCY": "[1]",
        "FLYWHEEL_BENCH__SHOTS": "1",
    }


def _run(root: Path, serving: dict[str, str] | None = None, **conf) -> tuple[bool, str]:
    settings = load_settings(root=str(root))
    conf = {"end_date": DAY, "window_days": 1, "seed": 3, "train": False, **conf}
    result = dags_test(
        settings,
        "commerce_flywheel",
        conf,
        extra_env={
            "FLYWHEEL_ROOT": str(root),
            "FLYWHEEL_EVALUATION__EXAMPLES": "4",
            "FLYWHEEL_EVALUATION__SHOTS": "1",
            **(serving or {}),
        },
    )
    out = result.stdout + result.stderr
    return result.returncode == 0 and "state=success" in out, out


def _gateway_captures(raw: Path, n: int = 60) -> list[str]:
    """Turns as the gateway captures them (its own functions: request row, answer, capture record, the
    durable writer), answered with the generator's logged calls, and a thumbs-down for the first five."""
    from datetime import date, datetime

    import orjson

    from pipelines.gateway import capture
    from pipelines.gateway import openai_api as api
    from pipelines.gateway.capture import CaptureWriter
    from pipelines.logs.feedback import feedback_zone
    from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator

    writer, ids = CaptureWriter(str(raw), 1 << 20), []
    for _, line, _ in TrafficGenerator(
        GeneratorConfig(seed=21, records=n, bad_share=0.0, end_date=date.fromisoformat(DAY))
    ).lines():
        r = orjson.loads(line)
        request = api.parse_request(
            json.dumps(
                {
                    "model": "champion",
                    "messages": r["request"]["messages"],
                    "tools": r["request"]["tools"],
                    "user": r["customer_id"],
                }
            ).encode()
        )
        served = api.request_row(request, now=datetime.fromisoformat(r["timestamp"]))
        choice = r["response"]["choices"][0]
        body = api.completion(
            served,
            "champion",
            {"message": choice["message"], "finish_reason": choice["finish_reason"]},
            100,
            10,
            "tool_router_v1",
        )
        writer.write(
            capture.capture_record(
                request,
                served,
                body,
                latency_ms=90.0,
                defaults={"country": "US", "currency": "USD", "channel": "api"},
                served_by="tool_router_v1",
            )
        )
        ids.append(served.response_id)
    writer.close()
    ratings = CaptureWriter(feedback_zone(str(raw)), 1 << 20)
    for record_id in ids[:5]:
        ratings.write({"record_id": record_id, "rating": "down", "timestamp": f"{DAY}T23:00:00+00:00"})
    for record_id in ids[5:20]:  # confirmed by a person: our champion's answers that may train
        ratings.write({"record_id": record_id, "rating": "up", "timestamp": f"{DAY}T23:00:00+00:00"})
    ratings.close()
    return ids


def test_dag_trains_evaluates_registers_promotes_deploys_and_benchmarks_and_a_rerun_changes_nothing(
    tmp_path: Path, spark
) -> None:
    """... on a day holding generated traffic plus turns the gateway captured (and rated) in that day; running
    the date's data tasks again (what a retried or cleared run does: the functions the DAG's ingest, prep,
    validate and features tasks call, with the run's params, here in this process with the shared Spark session,
    ~50 s against ~160 s for a second `airflow dags test`) rewrites the same data, not a second copy."""
    from pipelines import tasks
    from pipelines.features.pipeline import run_features
    from pipelines.prep.pipeline import run_prep
    from pipelines.quality.gates import run_gates
    from pipelines.registry.models import CHAMPION, alias_version
    from pipelines.serve import deploy
    from pipelines.simulate.importers import retail_to_raw
    from pipelines.stack import triton as server
    from pipelines.window import DateWindow

    serving = _small_serving_env()
    captured = _gateway_captures(tmp_path / "raw")
    # imported turns of a tool whose schema has a keyword the grammar lacks (`uniqueItems`): it trains,
    # evaluates and serves like the others, reported as partly constrained
    tagged = {
        "type": "function",
        "function": {
            "name": "list_products_by_tags",
            "parameters": {
                "type": "object",
                "required": ["tags"],
                "properties": {
                    "tags": {
                        "type": "array",
                        "items": {"type": "string", "enum": ["eco", "sale", "new"]},
                        "uniqueItems": True,
                    }
                },
            },
        },
    }
    (tmp_path / "tools.json").write_text(json.dumps([tagged]))
    (tmp_path / "tasks.jsonl").write_text(
        "\n".join(
            json.dumps(
                {
                    "instruction": f"Show me products tagged {' and '.join(tags)} ({n}).",
                    "actions": [{"name": "list_products_by_tags", "arguments": {"tags": list(tags)}}],
                }
            )
            for n in range(4)
            for tags in (("eco",), ("sale",), ("new", "eco"), ("sale", "new"), ("eco", "sale", "new"))
        )
    )
    imported = retail_to_raw(
        tmp_path / "tools.json", tmp_path / "tasks.jsonl", tmp_path / "raw", pd.Timestamp(DAY).date()
    )["records"]
    assert imported == 20
    try:
        # plumbing: the untrained tiny model cannot beat base few-shot, so the first candidate is promoted unchecked
        ok, out = _run(
            tmp_path,
            {
                **serving,
                "FLYWHEEL_PROMOTION__BASELINE": "none",
                # plumbing: an untrained model's random writes are no verdict either
                "FLYWHEEL_PROMOTION__MAX_EXTRA_WRONG_WRITES": "1000",
                # the tune stage with GRPO on: one step of two sampled answers for one of four prompts
                "FLYWHEEL_TUNE__METHOD": "grpo",
                "FLYWHEEL_TUNE__GRPO__MAX_STEPS": "1",
                "FLYWHEEL_TUNE__GRPO__GROUP_SIZE": "2",
                "FLYWHEEL_TUNE__GRPO__PROMPTS_PER_STEP": "1",
                "FLYWHEEL_TUNE__GRPO__MAX_PROMPTS": "4",
                "FLYWHEEL_PROMOTION__SFT_RULE": "false",  # 4 requests cannot show one step of GRPO holds
            },
            records_per_day=1200,
            train=True,
            sweep=TINY_SWEEP,
        )
        assert ok, out[-3000:]
        settings = load_settings(root=str(tmp_path), triton={"http_port": int(serving["FLYWHEEL_TRITON__HTTP_PORT"])})
        assert alias_version(settings, CHAMPION) == "1"
        from pipelines.clients.mlflow import client as mlflow_client

        found = mlflow_client(settings).search_model_versions(f"name='{settings.mlflow.registered_model}'")
        assert sorted(str(v.version) for v in found) == ["1"]  # the sweep's best, registered once
        # tuned by GRPO in a child run of the sweep's, registered with what it trained on and its cost
        tags = found[0].tags
        assert tags["flywheel.tune_method"] == "grpo" and tags["flywheel.tune_examples"] == "4"
        assert found[0].run_id == tags["flywheel.tune_run_id"]
        tune_run = mlflow_client(settings).get_run(tags["flywheel.tune_run_id"])
        assert tune_run.data.tags["mlflow.parentRunId"] == tags["flywheel.sweep_run_id"]
        assert tune_run.data.tags["flywheel.kind"] == "tune" and tune_run.data.metrics["tune_tokens"] > 0
        assert "## Tuning after SFT" in found[0].description and "method: grpo" in found[0].description
        from pipelines.registry.models import adapter_path

        tuned = tmp_path / "runs" / "tune" / f"{tags['flywheel.sweep_id']}-grpo" / "adapter"
        registered = Path(adapter_path(settings, "1")) / "adapter_model.safetensors"
        assert registered.read_bytes() == (tuned / "adapter_model.safetensors").read_bytes()  # the tuned adapter
        from datetime import date

        from pipelines.projects.showback import by_method, training

        spent = by_method(training(settings, date.today()))  # showback: the cost per method
        assert spent["grpo"]["runs"] == 1 and spent["grpo"]["tokens"] > 0 and spent["sft"]["runs"] >= 1
        manifest = json.loads((tmp_path / "curated" / "manifest.json").read_text())
        assert manifest["counts"]["input"] == 1200 + len(captured) + imported  # captured and imported turns too
        partly = {"list_products_by_tags": "partly (checked after decoding: uniqueItems)"}
        assert manifest["grammar_limits"] == partly
        quality = json.loads((tmp_path / "reports" / "quality" / "results" / f"{DAY}_{DAY}.json").read_text())
        assert quality["grammar_limits"] == partly and quality["label_sources"]["import"] > 0
        assert (pd.read_parquet(tmp_path / "curated" / "sft")["tool"] == "list_products_by_tags").any()
        logs = pd.read_parquet(tmp_path / "curated" / "clean_logs")
        mine = logs[logs["record_id"].isin(captured)]
        assert len(mine) > len(captured) // 2 and set(mine["model"]) == {"tool_router_v1"}
        rated = mine[mine["record_id"].isin(captured[:5])]
        assert len(rated) and set(rated["feedback"]) == {"down"}
        assert set(mine[mine["record_id"].isin(captured[5:20])]["feedback"]) == {"up"}
        assert set(mine[mine["record_id"].isin(captured[20:])]["feedback"]) == {"none"}
        assert set(mine["label_source"]) == {"champion"}
        sft = pd.read_parquet(tmp_path / "curated" / "sft")
        # the next training set holds served traffic a person confirmed, never the champion's unconfirmed or
        # down-rated answers (the flywheel never learns from itself)
        assert sft["record_id"].isin(captured[5:20]).any()
        assert not sft["record_id"].isin(captured[:5] + captured[20:]).any()
        evaluated = next((tmp_path / "reports" / "evaluation").glob("tiny-*/report.json"))
        # evaluation.constrained: served (the default): every condition decoded under the grammar, as served
        assert [c["condition"] for c in json.loads(evaluated.read_text())["conditions"]] == [
            "base_zero_shot_constrained",
            "base_few_shot_constrained",
            "tuned_candidate_constrained",
            "tuned_sft_constrained",  # the SFT adapter GRPO started from, beside it
        ]
        compared = json.loads(evaluated.read_text())["comparisons"]
        assert any(c["condition"] == "tuned_candidate_constrained" and c["reference"] == "tuned_sft_constrained"
                   for c in compared)  # fmt: skip
        assert (evaluated.parent / "report.html").is_file()
        live = deploy.live_model(settings)
        assert live is not None and live.version == "1" and server.status(settings).healthy
        bench = json.loads((tmp_path / "reports" / "bench" / "latest.json").read_text())
        assert bench["live"] == live.name and {r["errors"] for r in bench["runs"]} == {0}
        assert {r["constrained"] for r in bench["runs"]} == {True}  # bench.constrained: served
        assert [e["event"] for e in deploy.state(settings)["history"]] == ["deployed"]

        assert manifest["counts"]["reconciled"] and manifest["training_set"]["examples_by_split"]["train"] > 600
        quarantined = len(pd.read_parquet(tmp_path / "quarantine" / "records"))
        raw_files = sorted(p.name for p in (tmp_path / "raw" / f"dt={DAY}").glob("*.jsonl"))
        # the same date again: the run's window and params (those `_run` gave the DAG), the DAG's data tasks
        day = tasks.resolve_window({"end_date": DAY, "window_days": 1})
        assert (
            tasks.ingest(settings, day, {"end_date": DAY, "window_days": 1, "seed": 3, "records_per_day": 1200})[
                "records"
            ]
            == 1200
        )
        window = DateWindow.parse(day["start"], day["end"])
        run_prep(settings, window, spark=spark)
        assert run_gates(settings, window, spark=spark, context_window=tasks.base_context_window(settings, {})).success
        run_features(settings, window, spark=spark)
        again = json.loads((tmp_path / "curated" / "manifest.json").read_text())
        assert again["content_digest"] == manifest["content_digest"]
        assert again["training_set"]["digest"] == manifest["training_set"]["digest"]
        assert again["counts"] == manifest["counts"]
        assert len(pd.read_parquet(tmp_path / "quarantine" / "records")) == quarantined
        assert sorted(p.name for p in (tmp_path / "raw" / f"dt={DAY}").glob("*.jsonl")) == raw_files
    finally:
        server.down(load_settings(root=str(tmp_path)))


def test_failing_gate_stops_the_dag_before_features_and_quarantines_the_batch(tmp_path: Path) -> None:
    """Through `flywheel run` as a user runs it, on logs that landed (`--source landed`: the agent's logs, here
    written by `flywheel logs generate`): the failed task and its reason in one line (the gate's suite,
    expectation, failing count and Data Docs), exit 2 (a data problem the user can fix)."""
    env = {"FLYWHEEL_ROOT": str(tmp_path)}
    landed = run_flywheel(
        "logs", "generate", "--records", "1500", "--seed", "3", "--end-date", DAY, "--bad-share", "0.6", env=env
    )
    assert landed.returncode == 0, landed.stderr
    result = run_flywheel("run", "--end-date", DAY, "--window-days", "1", "--no-train", "--source", "landed", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: task validate failed: quality gate failed"), line
    assert re.search(r"raw_outcomes: expect_column_values_to_be_in_set\(outcome\) failing \d+", line), line
    assert "Data Docs: " in line and "dags-test.log" in line
    log = (tmp_path / "logs" / "dags-test.log").read_text()
    assert "airflow.exceptions.AirflowFailException is deprecated" not in log  # our own imports do not flood it
    assert not (tmp_path / "curated" / "sft").exists(), "features (and training) never ran"
    failed = list((tmp_path / "quarantine" / "failed_batches").glob(f"{DAY}_{DAY}-*"))
    assert len(failed) == 1 and list((failed[0] / "examples").rglob("*.parquet"))
    result = json.loads((failed[0] / "gate_result.json").read_text())
    assert result["success"] is False and result["raw_files"]
    assert not list((tmp_path / "curated" / "examples").glob(f"split=*/dt={DAY}"))


def test_dag_files_parse_without_heavy_imports() -> None:
    """The scheduler parses DAG files often: no ML, Spark or data library may load at parse time."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, 'dags'); import commerce_flywheel, drift_monitor; "
        "print(','.join(m for m in ('torch', 'pyspark', 'pandas', 'numpy', 'mlflow', 'transformers', 'feast', "
        "'great_expectations', 'pipelines.config', 'pipelines.tasks') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "", out.stdout


def test_every_task_of_both_dags_has_a_time_limit() -> None:
    """No task can hang a run: each has an execution_timeout (training's is the longest). And a run with
    `train: false` (`flywheel run --no-train`) stops after the training set: `should_train` answers False for it
    and skips every task after it whatever their trigger rules (`train` runs when none failed). Mutations tried:
    should_train always True; `ignore_downstream_trigger_rules=False`."""
    import subprocess
    import sys

    code = (
        "from airflow.dag_processing.dagbag import DagBag; b = DagBag(dag_folder='dags'); "
        "assert not b.import_errors, b.import_errors; import json; print(json.dumps({d.dag_id: {t.task_id: "
        "(t.execution_timeout.total_seconds() if t.execution_timeout else None) for t in d.tasks} "
        "for d in b.dags.values()})); t = b.dags['commerce_flywheel'].get_task('should_train'); "
        "print(json.dumps({'after': sorted(t.get_flat_relative_ids(upstream=False)), "
        "'ignores_their_rules': t.ignore_downstream_trigger_rules, "
        "'no_train': t.python_callable({}, {'train': False}), "
        "'by_default': t.python_callable({}, {})}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    gate = json.loads(out.stdout.strip().splitlines()[-1])
    assert gate["no_train"] is False and gate["by_default"] is True and gate["ignores_their_rules"] is True, gate
    assert {"train_pods", "train", "evaluate", "register", "promote", "deploy", "benchmark"} <= set(gate["after"]), gate
    limits = json.loads(out.stdout.strip().splitlines()[-2])
    assert set(limits) == {"commerce_flywheel", "drift_monitor"}
    missing = [f"{dag}.{task}" for dag, tasks in limits.items() for task, limit in tasks.items() if not limit]
    assert missing == []
    assert limits["commerce_flywheel"]["train"] == max(limits["commerce_flywheel"].values())
