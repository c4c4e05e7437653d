"""The training schedule sized by the training set: epochs over its rows, bounded by a step cap."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipelines.train.hf_backend import TrainConfig, epochs_seen, schedule_steps, steps_for


def test_the_epoch_based_schedule_gives_the_step_count_by_hand() -> None:
    assert schedule_steps(800, 4, epochs=2, max_steps=None, cap=None) == 400  # 800 * 2 / 4
    assert schedule_steps(800, 4, epochs=2, max_steps=None, cap=300) == 300  # the cap bounds it
    assert schedule_steps(800, 4, epochs=2, max_steps=None, cap=1000) == 400  # a loose cap changes nothing
    assert schedule_steps(800, 4, epochs=None, max_steps=150, cap=None) == 150  # today's fixed step count
    assert schedule_steps(800, 4, epochs=2, max_steps=150, cap=None) == 400  # epochs, when given, decide
    assert schedule_steps(10, 4, epochs=1, max_steps=None, cap=None) == 3  # ceil(10 / 4): the last batch counts
    assert schedule_steps(10, 4, epochs=0.5, max_steps=None, cap=None) == 2  # ceil(5 / 4)
    assert schedule_steps(10, 4, epochs=None, max_steps=None, cap=None) == 3  # neither: one epoch, as before
    assert epochs_seen(150, 4, 800) == pytest.approx(0.75)  # the demo's 150 steps: less than one pass


def test_a_variant_resolves_its_schedule_from_its_settings() -> None:
    assert steps_for(TrainConfig(batch_size=4, epochs=2, max_steps_cap=300), 800) == 300
    assert steps_for(TrainConfig(batch_size=4, max_steps=150), 800) == 150
    with pytest.raises(ValidationError, match="not both"):  # which one wins would be a guess
        TrainConfig(epochs=2, max_steps=150)


def test_the_nemo_recipe_follows_the_same_schedule() -> None:
    from pipelines.train.nemo_backend import recipe

    cfg = TrainConfig(base_model="tiny-llama", batch_size=4, epochs=2)
    spec = recipe(cfg, base_model_path="/m", num_layers=2, train_file="/d.jsonl", checkpoint_dir="/c", examples=10)
    # ceil(10 * 2 / 4) = 5 steps; an epoch that drops its partial batch has 2, so 3 epochs cover them
    assert spec["step_scheduler"]["max_steps"] == 5 and spec["step_scheduler"]["num_epochs"] == 3


def test_a_variant_run_logs_its_resolved_schedule(tmp_path, monkeypatch) -> None:
    """MLflow gets the resolved steps and epochs as params and the epochs actually seen as a metric
    (training and validation replaced by stand-ins: seconds, no model)."""
    from rich.console import Console

    import mlflow
    from pipelines.clients.mlflow import use_tracking
    from pipelines.config import load_settings
    from pipelines.train import sweep as sweep_module
    from pipelines.train.hf_backend import TrainResult

    settings = load_settings(root=str(tmp_path / "root"))
    experiment_id = use_tracking(settings)
    cfg = TrainConfig(base_model="tiny-llama", batch_size=4, epochs=2, max_steps_cap=3)
    train = [([{"role": "user", "content": "hi"}], '{"name": null}')] * 10  # 2 epochs = 5 steps, capped to 3

    def fake_train(settings, sweep, cfg, train, out, on_step, console) -> TrainResult:
        """A stand-in for the trainer (`sweep.train_variant`): no model, a result that stopped after 2 steps. The
        real trainer runs through the sweep in
        tests/test_sweep_registry.py::test_sweep_logs_parent_and_child_runs_and_a_retry_reuses_them and on its
        own in tests/test_train_hf.py::test_training_learns_and_writes_a_peft_adapter."""
        out.mkdir(parents=True)
        return TrainResult(str(out / "adapter"), "diverged", 2, 0, 10, 1.0, 10.0, 9.9)  # stopped after 2 steps

    monkeypatch.setattr(sweep_module, "train_variant", fake_train)
    sweep = sweep_module.SweepConfig(name="s", base=cfg)
    parent = sweep_module.find_or_start_run(experiment_id, {"flywheel.kind": "test"}, "parent")
    ctx = sweep_module.SweepContext(
        settings, sweep, "sid", tmp_path / "work", experiment_id, parent, Console(quiet=True), budget=64
    )
    result = sweep_module._run_variant(ctx, 0, cfg, "short", train, [])
    run = mlflow.MlflowClient().get_run(result.run_id).data
    assert run.params["resolved_steps"] == "3" and run.params["resolved_epochs"] == "1.2"  # 3 * 4 / 10
    assert run.metrics["epochs_seen"] == pytest.approx(0.8)  # 2 steps * 4 / 10


def test_the_hf_backend_trains_the_resolved_number_of_steps(tmp_path) -> None:
    from train_data import examples, tiny_config, tiny_loader

    from pipelines.train.hf_backend import train_lora

    rows = examples()  # 24 rows: half an epoch in batches of 4 is 3 steps
    result = train_lora(rows, tiny_config(epochs=0.5), tmp_path / "run", tiny_loader(str(tmp_path / "models")))
    assert len(rows) == 24 and result.steps == 3


def _frame(sizes: dict[tuple[str, str], int]):
    import pandas as pd

    rows = [
        {"record_id": f"{source}_0_{tool}_{i:04d}", "tool": tool}
        for (tool, source), n in sizes.items()
        for i in range(n)
    ]
    return pd.DataFrame(rows)


def test_a_balanced_training_sample_spreads_over_tools_and_sources() -> None:
    from pipelines.prep.dataset import balanced_sample, source_of

    frame = _frame(
        {
            ("search_products", "webshop"): 300,
            ("get_order", "rec"): 12,
            ("get_invoice", "rec"): 5,
            ("search_products", "rec"): 40,
        }
    )
    sample = balanced_sample(frame, 60, seed=1)
    counts = sample.groupby([sample["tool"], sample["record_id"].map(source_of)]).size().to_dict()
    # by hand: 4 strata, 15 each; get_invoice gives its 5 and get_order its 12, the two others share the
    # 13 left (6 each, the last one to the first in sorted order)
    assert counts == {
        ("get_invoice", "rec"): 5,
        ("get_order", "rec"): 12,
        ("search_products", "rec"): 22,
        ("search_products", "webshop"): 21,
    }
    assert len(sample) == 60 and sample["record_id"].is_unique
    assert balanced_sample(frame, 60, seed=1).equals(sample)  # seeded
    assert len(balanced_sample(frame, 1000)) == len(frame)


def test_a_square_root_sample_keeps_more_of_a_large_source_and_still_lifts_the_rare_tools() -> None:
    from pipelines.prep.dataset import balanced_sample, share_quotas, source_of

    frame = _frame(
        {
            ("search_products", "webshop"): 300,
            ("get_order", "rec"): 12,
            ("get_invoice", "rec"): 5,
            ("search_products", "rec"): 40,
        }
    )
    sample = balanced_sample(frame, 60, seed=1, power=0.5)
    counts = sample.groupby([sample["tool"], sample["record_id"].map(source_of)]).size().to_dict()
    # by hand: sqrt sizes 17.32 / 3.46 / 2.24 / 6.32 (sum 29.35) of 60 -> 35.41 / 7.08 / 4.57 / 12.93: 35, 7, 4,
    # 12 and the 2 rows left to the largest remainders (search_products|rec .93, get_invoice .57)
    assert counts == {
        ("search_products", "webshop"): 35,
        ("get_order", "rec"): 7,
        ("get_invoice", "rec"): 5,
        ("search_products", "rec"): 13,
    }
    # equal shares would give WebShop 21 of 60, its random share is 50 of 60 (300 of 357 rows)
    assert share_quotas({"a": 300, "b": 5}, 60, 1.0) == {"a": 59, "b": 1}  # power 1: the mix, 59.02 and 0.98
    assert share_quotas({"a": 3, "b": 4}, 60, 0.5) == {"a": 3, "b": 4}  # fewer rows than wanted: all of them


def test_the_validation_sample_is_stratified_with_every_stratum_present() -> None:
    from pipelines.prep.dataset import source_of, stratified_sample

    frame = _frame({("search_products", "webshop"): 100, ("get_order", "rec"): 10, ("get_invoice", "retail"): 2})
    sample = stratified_sample(frame, 12, seed=0)
    counts = sample.groupby([sample["tool"], sample["record_id"].map(source_of)]).size().to_dict()
    # proportional: 10.7, 1.07, 0.21 -> 10 / 1 / 1 (the rare stratum is judged too)
    assert counts == {("search_products", "webshop"): 10, ("get_order", "rec"): 1, ("get_invoice", "retail"): 1}


def test_a_validation_sample_smaller_than_the_strata_keeps_the_largest() -> None:
    from pipelines.prep.dataset import stratified_sample

    frame = _frame(
        {
            ("search_products", "webshop"): 100,
            ("get_order", "rec"): 1,
            ("get_invoice", "rec"): 2,
            ("track_shipment", "rec"): 1,
        }
    )
    sample = stratified_sample(frame, 2, seed=0)
    assert sorted(sample["tool"]) == ["get_invoice", "search_products"]  # the two largest strata, one each
    assert not stratified_sample(frame, 12, seed=0).equals(stratified_sample(frame, 12, seed=5))  # seeded draws


def test_a_packed_nemo_recipe_takes_as_many_packs_per_step_as_hold_a_batch() -> None:
    from pipelines.train.nemo_backend import packs_per_step, recipe

    cfg = TrainConfig(base_model="tiny-llama", batch_size=4, epochs=2, max_seq_len=512, packed_seq_len=1000)
    lengths = [300] * 12  # three 300-token examples fill a 1000-token row: 4 packs; 4 examples ~ 1.33 packs -> 1
    assert packs_per_step(cfg, lengths) == (4, 1)
    assert packs_per_step(cfg.model_copy(update={"batch_size": 8}), lengths) == (4, 3)  # 8 * 4 / 12 = 2.67 -> 3
    spec = recipe(
        cfg,
        base_model_path="/m",
        num_layers=2,
        train_file="/d.jsonl",
        checkpoint_dir="/c",
        examples=12,
        lengths=lengths,
    )
    assert spec["packed_sequence"] == {
        "packed_sequence_size": 1000,
        "packing_strategy": "neat",
        "drop_long_samples": False,
    }
    # the step count stays the unpacked one (ceil(12 * 2 / 4) = 6); each step takes one pack, 4 packs an epoch
    assert spec["step_scheduler"]["max_steps"] == 6 and spec["step_scheduler"]["global_batch_size"] == 1
    assert spec["step_scheduler"]["num_epochs"] == 2 + 1  # 6 steps of 4 packs: 2 epochs, and one spare for NEAT
    unpacked = recipe(
        cfg.model_copy(update={"packed_seq_len": None}),
        base_model_path="/m",
        num_layers=2,
        train_file="/d.jsonl",
        checkpoint_dir="/c",
        examples=12,
    )
    assert "packed_sequence" not in unpacked and unpacked["step_scheduler"]["global_batch_size"] == 4
    on_gpus = recipe(
        cfg,
        base_model_path="/m",
        num_layers=2,
        train_file="/d.jsonl",
        checkpoint_dir="/c",
        examples=12,
        lengths=lengths,
        gpus=8,
    )  # one pack a step would not split over 8 data-parallel ranks
    assert on_gpus["step_scheduler"]["global_batch_size"] == 8 and on_gpus["step_scheduler"]["local_batch_size"] == 1
    with pytest.raises(ValueError, match="token length"):
        recipe(cfg, base_model_path="/m", num_layers=2, train_file="/d.jsonl", checkpoint_dir="/c", examples=12)
