"""Sweeps (MLflow parent/child runs), the evaluation report, and the adapter registry (gate, rollback,
loading by alias), on the tiny model and a small generated training set."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from train_data import write_training_set

from pipelines.config import ConfigError, load_settings
from pipelines.toolcall.calls import call_text
from pipelines.toolcall.prompt import short_system_prompt, tool_signatures, tools_json_for
from pipelines.train.sweep_config import SweepConfig, load_sweep, variants

TINY = str(Path(__file__).resolve().parent.parent / "conf" / "sweeps" / "tiny.yaml")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("registry-root")
    write_training_set(path)
    return path


@pytest.fixture(scope="module")
def settings(root: Path):
    return load_settings(root=str(root), evaluation={"examples": 6, "shots": 2, "constrained": "both"})


@pytest.fixture(scope="module")
def first_sweep(settings):
    from pipelines import tasks

    return tasks.train(settings, {"sweep": TINY})


def test_every_committed_sweep_file_is_valid() -> None:
    files = sorted(Path(TINY).parent.glob("*.yaml"))
    assert {f.stem for f in files} >= {"demo", "tiny", "case-study", "drift"}
    sizes = {f.stem: len(variants(load_sweep(str(f)))) for f in files}
    assert sizes["case-study"] == 20 and sizes["demo"] == 2 and sizes["tiny"] == 2 and sizes["drift"] == 1


def test_grid_and_random_search_and_clear_errors() -> None:
    grid = SweepConfig(name="g", grid={"learning_rate": [1e-4, 2e-4], "optimizer": ["adam", "adamw"], "lora_rank": [8]})
    configs = variants(grid)
    assert len(configs) == 4
    assert {(c.learning_rate, c.optimizer) for c in configs} == {
        (1e-4, "adam"),
        (1e-4, "adamw"),
        (2e-4, "adam"),
        (2e-4, "adamw"),
    }
    random_search = SweepConfig(
        name="r",
        method="random",
        samples=3,
        seed=1,
        grid={"learning_rate": [1e-4, 2e-4, 5e-4], "lora_rank": [4, 8, 16]},
    )
    picked = variants(random_search)
    assert len(picked) == 3 and len({(c.learning_rate, c.lora_rank) for c in picked}) == 3
    assert [c.model_dump() for c in picked] == [c.model_dump() for c in variants(random_search)]  # seeded
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        SweepConfig(name="x", grid={"learning_rat": [1e-4]})
    with pytest.raises(ConfigError, match="variant"):
        variants(SweepConfig(name="x", grid={"learning_rate": [-1.0]}))


def test_the_prompt_style_is_a_sweep_dimension(settings, first_sweep) -> None:
    import yaml

    from mlflow import MlflowClient
    from pipelines.train.sweep import run_sweep
    from pipelines.train.sweep_config import variant_points

    with pytest.raises(ValueError, match="prompt_style"):
        SweepConfig(name="x", grid={"prompt_style": ["tiny"]})
    data = yaml.safe_load(Path(TINY).read_text())
    data.update(name="tiny-styles", prompt_style="full", grid={"prompt_style": ["names", "short"]})
    sweep = SweepConfig.model_validate(data)
    assert [style for _, style in variant_points(sweep)] == ["names", "short"]
    result = run_sweep(settings, sweep)
    assert [v.prompt_style for v in result.variants] == ["names", "short"]
    # what evaluation and the registry use: the best variant's style, not the sweep's default
    assert result.prompt_style == result.best_variant.prompt_style != "full"
    client = MlflowClient()
    for v in result.variants:
        run = client.get_run(v.run_id)
        assert run.data.tags["flywheel.prompt_style"] == run.data.params["prompt_style"] == v.prompt_style
    # the names prompt lists tool names only: its variant trained on shorter examples than the short one
    tokens = {v.prompt_style: v.metrics["train_tokens"] for v in result.variants}
    assert tokens["names"] < tokens["short"]


def test_short_prompt_keeps_signatures_and_allowed_values_only() -> None:
    tools = tools_json_for(["track_shipment", "get_order"])
    line = tool_signatures(tools)
    assert "get_order(order_id)" in line
    assert "track_shipment(" in line and "carrier?=UPS|" in line
    prompt = short_system_prompt(tools, "2026-11-20", "country DE")
    assert "description" not in prompt and "2026-11-20" in prompt and "country DE" in prompt
    assert len(prompt) < len(tools) / 2
    assert call_text('{"arguments":{"a":1},"name":"t"}') == '{"name":"t","arguments":{"a":1}}'
    assert call_text('{"name": null}') == '{"name":null}'


def test_sweep_logs_parent_and_child_runs_and_a_retry_reuses_them(settings, first_sweep) -> None:
    from mlflow import MlflowClient
    from pipelines.clients.mlflow import use_tracking
    from pipelines.storage import read_json

    experiment = use_tracking(settings)
    sweep = read_json(first_sweep["sweep_uri"])
    client = MlflowClient()
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{sweep['parent_run_id']}'")
    assert len(children) == 2
    for child in children:
        assert child.data.params["optimizer"] == "adamw" and child.data.params["learning_rate"] in ("0.005", "0.01")
        assert {"val_exact_match", "tokens_per_s", "peak_memory_mb", "wall_s"} <= set(child.data.metrics)
        assert len(client.get_metric_history(child.info.run_id, "train_loss")) == 4
        assert [m.step for m in client.get_metric_history(child.info.run_id, "learning_rate")] == [0, 1, 2, 3]
        assert child.data.tags["flywheel.hardware"].startswith("CPU")
        assert {a.path for a in client.list_artifacts(child.info.run_id)} >= {"adapter"}
    before = len(client.search_runs([experiment]))
    from pipelines import tasks

    again = tasks.train(settings, {"sweep": TINY})  # a retried task: finished variants are not retrained
    assert again["best_run_id"] == first_sweep["best_run_id"]
    assert len(client.search_runs([experiment])) == before


def test_evaluation_report_compares_conditions_on_the_same_requests(settings, first_sweep, caplog, monkeypatch) -> None:
    from pipelines import hardware, tasks
    from pipelines.toolcall.decode import MIN_SHARED_PREFIX

    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: True)  # triton.precision bf16 (the default) serves bf16
    with caplog.at_level("INFO", logger="flywheel.evaluate"):
        evaluated = tasks.evaluate(settings, first_sweep)
    # progress where no bar is drawn (an Airflow task log): a line as each condition starts and ends
    done = [r.getMessage() for r in caplog.records if r.name == "flywheel.evaluate" and " done in " in r.getMessage()]
    assert len(done) == 6 and any("tuned_candidate_constrained done in" in m for m in done), done
    rows = {r["condition"]: r for r in evaluated["table"]}
    conditions = ("base_zero_shot", "base_few_shot", "tuned_candidate")
    assert set(rows) == {*conditions, *(f"{c}_constrained" for c in conditions)}  # evaluation.constrained: both
    assert (
        rows["tuned_candidate"]["prompt_tokens_mean"]
        < rows["base_zero_shot"]["prompt_tokens_mean"]
        < rows["base_few_shot"]["prompt_tokens_mean"]
    )
    for c in conditions:  # the same prompts, only the decoding differs
        assert rows[f"{c}_constrained"]["prompt_tokens_mean"] == rows[c]["prompt_tokens_mean"]
    # evaluation.share_prefix (on): the full prompt's system turn and tool schemas were computed once per condition
    assert rows["base_zero_shot"]["shared_prefix_tokens"] >= MIN_SHARED_PREFIX, rows["base_zero_shot"]
    report = json.loads(Path(evaluated["json_uri"]).read_text())
    assert report["examples"] == 6 and all(c["confusion"] for c in report["conditions"])
    # evaluation.max_new_tokens unset: every condition decodes within the sweep's answer budget (its longest
    # training call in the base model's tokens plus a margin), as the registered version will be served
    sweep = json.loads(Path(first_sweep["sweep_uri"]).read_text())
    assert report["settings"]["max_new_tokens"] == sweep["answer_budget"]
    # each condition's model computed in the precision Triton serves (triton.precision bf16 on a CPU with bf16 units)
    assert report["settings"]["precision"] == dict.fromkeys(rows, "bf16")
    # measured on the training targets (not the prompts): within the budget of the split's longest target
    from mlflow import MlflowClient
    from pipelines.base_models import load_tokenizer
    from pipelines.prep.dataset import load_split
    from pipelines.toolcall.budget import budget_for, longest_in_tokens
    from pipelines.toolcall.examples import to_examples

    targets = [e.target for e in to_examples(load_split(settings, "train", 100_000), "names")]
    longest = longest_in_tokens(load_tokenizer("tiny-llama", settings), targets)
    assert budget_for(10) < sweep["answer_budget"] <= budget_for(longest)
    assert MlflowClient().get_run(sweep["parent_run_id"]).data.params["flywheel.answer_budget"] == str(
        sweep["answer_budget"]
    )
    assert [c["constrained"] for c in report["conditions"]] == [False, True] * 3
    html = Path(evaluated["html_uri"]).read_text()
    assert "confusion matrix tuned_candidate" in html and html.count("data:image/png;base64") >= 5
    assert "computed in bf16, as served" in html


def _row(exact: float, f1: float, latency: float) -> dict:
    return {"exact_match": exact, "arg_f1": f1, "latency_ms_p50": latency}


def test_gate_needs_the_margins_and_no_slowdown(settings) -> None:
    from pipelines.registry.models import gate

    assert not gate(_row(0.5, 0.5, 100), None, settings).promoted  # no champion, no few-shot row: nothing to beat
    assert gate(_row(0.60, 0.70, 100), _row(0.50, 0.60, 100), settings).promoted
    verdict = gate(_row(0.51, 0.70, 100), _row(0.50, 0.60, 100), settings)  # +0.01 < the 0.02 margin
    assert not verdict.promoted and "task score gain +0.010" in verdict.reason
    verdict = gate(_row(0.60, 0.70, 130), _row(0.50, 0.60, 100), settings)
    assert not verdict.promoted and "latency +30%" in verdict.reason


def test_register_promote_gate_both_ways_rollback_and_load_by_alias(settings, first_sweep) -> None:
    import mlflow
    from pipelines import tasks
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import CANDIDATE, CHAMPION, RegistryError, alias_version, history, rollback

    evaluated = {
        "table": [
            {"condition": "base_few_shot", **_row(0.3, 0.4, 300)},
            {"condition": "tuned_candidate", **_row(0.5, 0.5, 100)},
        ],
        "json_uri": "e.json",
    }
    first = tasks.register(settings, first_sweep, evaluated)
    assert tasks.register(settings, first_sweep, evaluated)["version"] == first["version"]  # idempotent
    from pipelines.registry.models import answer_budget
    from pipelines.serve.repository import build_version, configured_limit, triton_name

    budget = json.loads(Path(first_sweep["sweep_uri"]).read_text())["answer_budget"]
    assert answer_budget(settings, first["version"]) == budget  # recorded with the version
    build_version(settings, first["version"])  # its Triton folder writes within it (triton.max_new_tokens unset)
    assert configured_limit(settings, triton_name(settings, first["version"]), "max_new_tokens") == budget
    assert configured_limit(settings, triton_name(settings, first["version"])) == 2048 - budget  # tiny-llama's window
    decision = tasks.promote(settings, first, evaluated, {"reason": "first"})  # beats base few-shot
    assert decision["promoted"] and alias_version(settings, CHAMPION) == first["version"]
    assert decision["compared_with"] == "base_few_shot" and decision["numbers"]["base_few_shot_exact_match"] == 0.3

    second_sweep = tasks.train(settings, {"sweep": _variant_of_tiny(settings)})
    measured = tasks.evaluate(settings, second_sweep)  # the champion is measured on the same requests
    assert [r["condition"] for r in measured["table"]][-4:] == [
        "tuned_candidate",
        "tuned_candidate_constrained",
        "tuned_champion",
        "tuned_champion_constrained",
    ]
    assert measured["champion_version"] == first["version"]
    second = tasks.register(settings, second_sweep, evaluated)
    assert second["version"] != first["version"] and alias_version(settings, CANDIDATE) == second["version"]
    with pytest.raises(RegistryError, match="`candidate` now points at"):  # gates only what this run registered
        tasks.promote(settings, first, evaluated, {})
    worse = {
        "table": [
            {"condition": "tuned_candidate", **_row(0.5, 0.5, 100)},
            {"condition": "tuned_champion", **_row(0.5, 0.5, 100)},
        ]
    }
    decision = tasks.promote(settings, second, worse, {})
    assert not decision["promoted"] and alias_version(settings, CHAMPION) == first["version"]
    client = mlflow_client(settings)
    recorded = json.loads(
        client.get_model_version(settings.mlflow.registered_model, second["version"]).tags["flywheel.gate"]
    )
    assert recorded["promoted"] is False and recorded["numbers"]["champion_exact_match"] == 0.5
    card = client.get_model_version(settings.mlflow.registered_model, first["version"]).description
    assert "- labels (the training window's examples by who wrote the answer): generated " in card, card
    better = {
        "table": [
            {"condition": "tuned_candidate", **_row(0.8, 0.9, 100)},
            {"condition": "tuned_champion", **_row(0.5, 0.5, 100)},
        ]
    }
    # the DAG's promote with the SFT rule on (the default): a tuned candidate that beats the champion but makes
    # more wrong writes than the SFT adapter it was tuned from is refused (mutation: the rule left out of promote)
    tuned = {"table": [*better["table"], {"condition": "tuned_sft", **_row(0.7, 0.8, 100), "wrong_writes": 0}]}
    tuned["table"][0] = {**tuned["table"][0], "wrong_writes": 3, "examples": 40}
    decision = tasks.promote(settings, second, tuned, {})
    assert not decision["promoted"] and "against its SFT adapter (tuned_sft)" in decision["reason"], decision
    assert alias_version(settings, CHAMPION) == first["version"]
    decision = tasks.promote(settings, second, better, {"reason": "drift: holiday"})
    assert decision["promoted"] and alias_version(settings, CHAMPION) == second["version"]
    assert history(settings)[-1]["reason"].startswith("[drift: holiday]")

    assert rollback(settings)["champion"] == first["version"]
    assert alias_version(settings, CHAMPION) == first["version"]
    with pytest.raises(RegistryError, match="no previous champion"):
        rollback(settings)

    version = client.get_model_version(settings.mlflow.registered_model, first["version"])
    assert version.tags["flywheel.dataset_digest"] == first_sweep_digest(settings)
    files = [a.path for a in client.list_artifacts(version.run_id, "registered_model/artifacts/adapter")]
    assert any(f.endswith("adapter_model.safetensors") for f in files)
    assert not any(f.endswith("model.safetensors") and "adapter" not in f for f in files)  # never the base
    run = client.get_run(version.run_id)
    assert run.inputs.dataset_inputs and run.inputs.dataset_inputs[0].dataset.digest

    model = mlflow.pyfunc.load_model(f"models:/{settings.mlflow.registered_model}@champion")
    from pipelines.prep.dataset import load_split

    rows = load_split(settings, "test", 2, 0)
    out = model.predict(
        pd.DataFrame(
            {
                "messages": rows["messages_json"],
                "tools_json": rows["tools_json"],
                "event_time": rows["event_time"],
                "context": "",
            }
        ),
        params={"max_new_tokens": 8},
    )
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    with pytest.raises(ValueError, match="missing input column"):
        model.predict(pd.DataFrame({"messages": ["[]"]}))


@pytest.fixture()
def light(settings, request: pytest.FixtureRequest):
    """Settings on a registered model of its own, with two versions that need no training."""
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.clients.mlflow import use_tracking

    name = f"light-{request.node.name[5:30]}"
    light = load_settings(
        root=str(settings.root), evaluation={"examples": 6, "shots": 2}, mlflow={"registered_model": name}
    )
    client = mlflow_client(light)
    client.create_registered_model(name)
    run = client.create_run(use_tracking(light)).info.run_id
    for _ in range(2):
        client.create_model_version(name, source=str(settings.root), run_id=run)
    client.set_registered_model_alias(name, "candidate", "1")
    return light


BETTER = {
    "tuned_candidate": _row(0.9, 0.9, 90),
    "tuned_champion": _row(0.5, 0.5, 100),
    "base_few_shot": _row(0.5, 0.5, 100),
}


def test_registry_list_shows_aliases(light) -> None:
    from helpers import run_flywheel

    from pipelines.registry.models import CHAMPION, alias_version, promote

    assert promote(light, BETTER, "1").promoted and alias_version(light, CHAMPION) == "1"
    result = run_flywheel(
        "registry",
        "list",
        "--json",
        env={"FLYWHEEL_ROOT": str(light.root), "FLYWHEEL_MLFLOW__REGISTERED_MODEL": light.mlflow.registered_model},
    )
    assert result.returncode == 0, result.stderr
    listed = {str(v["version"]): v for v in json.loads(result.stdout)["versions"]}
    assert sorted(listed["1"]["aliases"]) == ["candidate", "champion"] and listed["2"]["aliases"] == []
    assert json.loads(listed["1"]["gate"])["promoted"] is True


def test_promote_needs_the_current_champion_measured_on_the_same_requests(light) -> None:
    from pipelines.registry.models import CANDIDATE, CHAMPION, alias_version, promote

    assert promote(light, BETTER, "1").promoted
    from pipelines.clients.mlflow import client as mlflow_client

    mlflow_client(light).set_registered_model_alias(light.mlflow.registered_model, CANDIDATE, "2")
    no_champion_row = {k: r for k, r in BETTER.items() if k != "tuned_champion"}
    stale = {**BETTER, "tuned_champion": {**BETTER["tuned_champion"], "version": "9"}}
    for rows, measured in ((no_champion_row, "no champion"), (stale, "v9")):
        decision = promote(light, rows, "2")
        assert not decision.promoted and f"the champion is v1 but the evaluation measured {measured}" in decision.reason
    assert alias_version(light, CHAMPION) == "1"


def test_history_stays_within_one_tag_and_rollback_survives_60_promotions_and_a_crash(light) -> None:
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry import models

    client, name = mlflow_client(light), light.mlflow.registered_model
    for i in range(60):
        version = str(1 + i % 2)
        client.set_registered_model_alias(name, models.CANDIDATE, version)
        assert models.promote(light, BETTER, version, f"[run {i}: {'drift ' * 30}] ").promoted
    tag = client.get_registered_model(name).tags[models.HISTORY_TAG]
    entries = models.history(light)
    assert len(tag) <= 5000 and len(entries) >= 10 and entries[-1]["reason"].startswith("[run 59")
    # a promotion that crashed after its history entry, before the alias moved: rollback skips it
    models._append_history(client, name, {"champion": "7", "previous": "2", "reason": "crashed", "at": "now"})
    assert models.alias_version(light, models.CHAMPION) == "2"
    assert models.rollback(light) == {"name": name, "champion": "1", "was": "2"}
    assert models.alias_version(light, models.CHAMPION) == "1"


def test_a_large_decision_goes_to_an_artifact_and_the_tag_keeps_a_summary(light) -> None:
    import mlflow
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import GATE_TAG, promote

    def tools(exact: float) -> dict:
        return {f"tool_{i:03d}": {"n": 9, "exact_match": exact, "arg_f1": exact} for i in range(80)}

    rows = {k: {**r, "per_tool": tools(r["exact_match"])} for k, r in BETTER.items()}
    assert promote(light, rows, "1").promoted
    tag = mlflow_client(light).get_model_version(light.mlflow.registered_model, "1").tags[GATE_TAG]
    summary = json.loads(tag)
    assert len(tag) <= 5000 and summary["promoted"] and summary["numbers"]["base_few_shot_exact_match"] == 0.5
    full = json.loads(mlflow.artifacts.load_text(summary["full_decision"]))
    candidate, baseline = BETTER["tuned_candidate"]["exact_match"], BETTER["base_few_shot"]["exact_match"]
    assert full["numbers"]["per_tool"]["tool_079"] == {
        "n": [9, 9],
        "exact_match": [candidate, baseline],
        "arg_f1": [candidate, baseline],
        "checked": True,
    }


def first_sweep_digest(settings) -> str:
    from pipelines.prep.dataset import manifest

    return manifest(settings)["training_set"]["digest"]


def _variant_of_tiny(settings) -> str:
    import yaml

    data = yaml.safe_load(Path(TINY).read_text())
    data["name"] = "tiny-b"
    data["grid"] = {"learning_rate": [2e-2]}
    path = Path(str(settings.root)) / "tiny-b.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)
