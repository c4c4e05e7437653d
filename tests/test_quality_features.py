"""Great Expectations gates and Feast features on a prepared window (real GE, Feast, Spark)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta
from pathlib import Path

import pandas as pd
import pytest
from data_path import END, write_window

from pipelines.clients import feast as feast_client
from pipelines.config import load_settings
from pipelines.features.nodes import CUSTOMER_FEATURES
from pipelines.features.pipeline import online_context, run_features
from pipelines.prep.pipeline import run_prep
from pipelines.quality.gates import QualityGateFailed, run_gates
from pipelines.toolcall.prompt import format_context
from pipelines.window import DateWindow

pytestmark = pytest.mark.slow
WINDOW = DateWindow.ending(END, 3)


@pytest.fixture(scope="module")
def window_root(tmp_path_factory: pytest.TempPathFactory, spark):
    root = tmp_path_factory.mktemp("gates")
    settings = load_settings(root=str(root))
    write_window(root / "raw", records=4000, bad_share=0.05, seed=23)
    run_prep(settings, WINDOW, spark=spark)
    report = run_gates(settings, WINDOW, spark=spark)
    features = run_features(settings, WINDOW, spark=spark)
    return {"settings": settings, "root": root, "report": report, "features": features}


def test_gates_pass_on_a_clean_window_and_write_docs_and_json(window_root) -> None:
    report = window_root["report"]
    assert report.success and report.failures == []
    assert {s.suite for s in report.suites} == {
        "raw_logs",
        "raw_outcomes",
        "curated_examples",
        "curated_tool_counts",
        "curated_session_splits",
    }
    index = Path(report.data_docs.removeprefix("file://"))
    assert index.is_file()
    # one Data Docs build for the window: a page per suite's result and per suite, each linked from the index
    pages = {p.parent.parent.parent.name for p in (index.parent / "validations").rglob("*.html")}
    assert pages == {s.suite for s in report.suites}
    assert {p.stem for p in (index.parent / "expectations").glob("*.html")} == pages
    assert all(f"validations/{suite}/" in index.read_text() for suite in pages)
    checkpoints = list((index.parents[3] / "checkpoints").glob("*.json"))  # the build is run_gates', once
    assert len(checkpoints) == 5 and all(json.loads(c.read_text())["actions"] == [] for c in checkpoints)
    assert json.loads(Path(report.result_uri).read_text())["success"] is True


def test_the_report_counts_the_signals_tuning_learns_from(window_root) -> None:
    """The quality report's `signals`: the window's kept turns by rating, its training split (GRPO's prompts)
    and the preference pairs (none here: nobody corrected and no shadow ran), the same in its JSON."""
    root, report = window_root["root"], window_root["report"]
    days = WINDOW.isoformat_days()
    logs = pd.read_parquet(root / "curated" / "clean_logs")
    logs = logs[logs["dt"].astype(str).isin(days)]
    rated = logs["feedback"].where(logs["feedback"].isin(["up", "down"]), "none").value_counts()
    assert report.signals["ratings"] == {k: int(rated.get(k, 0)) for k in ("up", "down", "none")}
    assert report.signals["ratings"]["up"] > 0 and report.signals["ratings"]["down"] > 0
    train = pd.read_parquet(root / "curated" / "examples" / "split=train")
    assert report.signals["rewarded_prompts"] == int(train["dt"].astype(str).isin(days).sum()) > 0
    # no training set yet (the features stage writes it): no pairs, and the scope says whose they would be
    assert report.signals["preference_pairs"]["pairs"] == 0
    assert report.signals["preference_pairs"]["scope"] == "the current training set"
    assert json.loads(Path(report.result_uri).read_text())["signals"] == report.signals


def test_a_signal_that_cannot_be_counted_is_recorded_not_a_failed_gate(tmp_path: Path) -> None:
    """`signals` informs the report: a failure to count (here, no frame to count in) is its `error`, the gate's
    verdict stays the suites' (mutation: signals() without its try)."""
    from pipelines.quality.gates import signals

    counted = signals(None, load_settings(root=str(tmp_path)), WINDOW, None)  # type: ignore[arg-type]
    assert set(counted) == {"error"} and counted["error"]


def test_leaked_pii_fails_the_gate_quarantines_the_batch_and_never_shows_the_value(tmp_path: Path, spark) -> None:
    settings = load_settings(root=str(tmp_path))
    write_window(tmp_path / "raw", records=1500, days=1, seed=5)
    day = DateWindow(END, END)
    run_prep(settings, day, spark=spark)
    examples = tmp_path / "curated" / "examples"
    before = sorted(p.relative_to(examples) for p in examples.rglob("*.parquet"))
    # Simulate a redactor regression: a raw email survives into the curated text.
    leaked = "leaky.customer@example.net"
    target = next(examples.glob(f"split=train/dt={END}/*.parquet"))
    frame = pd.read_parquet(target)
    frame.loc[frame.index[0], "messages_json"] = frame.loc[frame.index[0], "messages_json"][:-2] + f' {leaked}"}}]'
    frame.to_parquet(target, index=False)
    target.with_name(f".{target.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old bytes

    with pytest.raises(QualityGateFailed, match="curated_examples: expect_column_values_to_not_match_regex"):
        run_gates(settings, day, spark=spark)
    result_files = list((tmp_path / "reports" / "quality" / "results").glob("*.json"))
    result = json.loads(result_files[0].read_text())
    assert result["success"] is False
    failed = [f for s in result["suites"] for f in s["failed"]]
    assert any(f["pii"] == "EMAIL" and f["unexpected_count"] == 1 for f in failed)
    moved_to = Path(result["quarantined_to"])
    assert sorted(p.relative_to(moved_to / "examples") for p in (moved_to / "examples").rglob("*.parquet")) == before
    assert not list(examples.glob(f"split=*/dt={END}"))
    assert list((tmp_path / "raw" / f"dt={END}").glob("*.jsonl")), "raw is immutable"
    for path in [
        *tmp_path.joinpath("reports").rglob("*.json"),
        *tmp_path.joinpath("reports").rglob("*.html"),
        moved_to / "gate_result.json",
    ]:
        assert leaked not in path.read_text(errors="replace"), path


def test_a_window_mostly_labelled_by_our_own_model_fails_the_trusted_label_gate(tmp_path: Path, spark) -> None:
    settings = load_settings(root=str(tmp_path))
    write_window(tmp_path / "raw", records=800, days=1, seed=6)
    day = DateWindow(END, END)
    assert list(run_prep(settings, day, spark=spark).label_sources) == ["generated"]
    # as if most of the day were our champion's answers that people rated up (they may train, but a window
    # of them alone would retrain the champion on itself)
    for target in (tmp_path / "curated" / "examples").rglob("*.parquet"):
        frame = pd.read_parquet(target)
        frame["label_source"] = ["champion" if i % 4 else "teacher" for i in range(len(frame))]
        frame.to_parquet(target, index=False)
        target.with_name(f".{target.name}.crc").unlink(missing_ok=True)
    loose = load_settings(root=str(tmp_path), quality={"min_trusted_label_share": 0.2})
    assert run_gates(loose, day, spark=spark).success  # the share is a setting
    report = run_gates(settings, day, spark=spark, raise_on_failure=False)
    assert not report.success and report.label_sources["champion"] > 2 * report.label_sources["teacher"]
    [failed] = [f for s in report.suites for f in s.failed]
    assert failed["expectation"] == "expect_column_values_to_be_in_set" and failed["column"] == "label_source"
    assert report.quarantined_to and not list((tmp_path / "curated" / "examples").rglob("*.parquet"))


def test_the_rated_answers_reach_kto_with_their_prompts_split_as_their_sessions(window_root) -> None:
    """Prep's `rated` table and the features step's rated set (issue 51, KTO): every kept turn people rated, up or
    down (trained or held), is a thumb with the training prompt and context its SFT example has, in its session's
    split (a rated duplicate in its twin's split, so no test request trains KTO). Mutations tried: `rated_rows` split
    on its own (`assign_splits` over the rated rows alone): a thumb's split differs from its session's examples and
    it fails; the rated rows left out of the context join: the prompts differ and it fails; a duplicate given its own
    session's split: the copied rows differ from their twins and it fails."""
    from pipelines.prep.thumbs import collect_thumbs, thumb_summary

    root, settings = window_root["root"], window_root["settings"]
    logs = pd.read_parquet(root / "curated" / "clean_logs")
    rated = logs[logs["feedback"].isin(["up", "down"])]
    thumbs, dropped, quarantined = collect_thumbs(settings)
    assert quarantined == [] and (rated["feedback"] == "down").sum() > 0
    table = pd.read_parquet(root / "curated" / "rated")  # every clean rated turn, deduplicated ones too
    assert set(rated["record_id"]) <= set(table["record_id"]) and len(thumbs) + sum(dropped.values()) == len(table)
    copies = set(table.loc[table["duplicate_of"].notna(), "record_id"])
    assert set(thumbs["record_id"]) - set(rated["record_id"]) <= copies
    held = set(rated.loc[rated["held"].notna(), "record_id"])
    assert held & set(thumbs["record_id"]), "down-rated (held) answers are thumbs too"
    downs = set(table.loc[table["feedback"] == "down", "record_id"])
    assert set(thumbs.loc[~thumbs["desirable"], "record_id"]) <= downs and len(downs) > 0
    sft_parts = [
        pd.read_parquet(p).assign(split=p.parent.parent.name.removeprefix("split="))
        for p in (root / "curated" / "sft").rglob("*.parquet")
    ]
    sft = pd.concat(sft_parts, ignore_index=True)
    session_split = dict(zip(sft["session_id"], sft["split"]))
    twin_of = dict(zip(table["record_id"], table["duplicate_of"]))
    twin_split = thumbs["record_id"].map(twin_of).map(dict(zip(sft["record_id"], sft["split"])))
    kept = thumbs[twin_split.isna() & thumbs["session_id"].isin(session_split)]
    assert len(kept) > 0 and (kept["split"] == kept["session_id"].map(session_split)).all()
    copied = thumbs[twin_split.notna()]  # a rated duplicate goes where the example it duplicates went
    assert len(copied) > 0 and (copied["split"] == twin_split[twin_split.notna()]).all()
    assert (copied["session_id"].map(session_split) != copied["split"]).any(), "a copy whose session split differs"
    same = thumbs.merge(sft[["record_id", "system_prompt", "context"]], on="record_id", suffixes=("", "_sft"))
    assert len(same) > 0 and (same["system_prompt"] == same["system_prompt_sft"]).all()
    assert (same["context"] != "").any()
    summary = thumb_summary(thumbs, dropped, quarantined)
    assert summary["train_undesirable"] > 0 and summary["train_desirable"] > 0
    assert window_root["report"].signals["thumbs"]["thumbs"] == 0  # counted before the features step built it


def test_training_set_carries_point_in_time_context(window_root) -> None:
    root = window_root["root"]
    sft = pd.read_parquet(root / "curated" / "sft")
    assert window_root["features"].with_context == int((sft["context"] != "").sum()) > 0
    first_day = sft[sft["event_timestamp"].dt.date == WINDOW.start]
    assert (first_day["context"] == "").all(), "no snapshot exists before the window's first day"
    with_context = sft[sft["context"] != ""].iloc[0]
    assert f"Customer context: {with_context['context']}" in with_context["system_prompt"]


def test_point_in_time_features_never_see_the_future(window_root) -> None:
    settings, root = window_root["settings"], window_root["root"]
    clean = pd.read_parquet(root / "curated" / "clean_logs")
    clean["day"] = clean["event_timestamp"].dt.date
    per_customer_days = clean.groupby("customer_id")["day"].nunique()
    customers = per_customer_days[per_customer_days >= 2].index[:25].tolist()
    assert customers, "the window must have returning customers"
    rows = []
    for customer in customers:
        for day in WINDOW.days():
            rows.append({"customer_id": customer, "event_timestamp": datetime.combine(day, time(12), tzinfo=UTC)})
    joined = feast_client.historical_customer_features(settings, pd.DataFrame(rows))
    for row in joined.to_dict("records"):
        day = row["event_timestamp"].date()
        past = clean[(clean["customer_id"] == row["customer_id"]) & (clean["day"] < day)]
        expected = len(past) if len(past) else None
        got = None if pd.isna(row["requests_30d"]) else int(row["requests_30d"])
        assert got == expected, (row["customer_id"], day)


def test_a_request_of_a_customer_with_no_snapshot_gets_no_context_and_breaks_no_join(window_root) -> None:
    """A rated turn dropped by the dedupe can belong to a customer the snapshots never saw; Feast's file store
    cannot sort a join that holds one (mutation: the snapshot filter removed: the join raises)."""
    from pipelines.features.pipeline import point_in_time_contexts

    settings, root = window_root["settings"], window_root["root"]
    seen = pd.read_parquet(root / "curated" / "clean_logs").sort_values("event_timestamp").iloc[-3:]
    requests = seen[["record_id", "customer_id", "event_timestamp"]].copy()
    stranger = {"record_id": "nobody-1", "customer_id": "cus_never_seen", "event_timestamp": requests.iloc[-1, 2]}
    contexts = point_in_time_contexts(settings, pd.concat([requests, pd.DataFrame([stranger])], ignore_index=True))
    assert "nobody-1" not in contexts and set(contexts) <= set(requests["record_id"]) and any(contexts.values())


def test_online_and_offline_context_agree(window_root) -> None:
    settings, root = window_root["settings"], window_root["root"]
    customers = pd.read_parquet(root / "curated" / "clean_logs")["customer_id"].drop_duplicates().head(20).tolist()
    after = datetime.combine(END + timedelta(days=1), time(6), tzinfo=UTC)
    offline = feast_client.historical_customer_features(
        settings, pd.DataFrame({"customer_id": customers, "event_timestamp": [after] * len(customers)})
    )
    offline_by_customer = {
        r["customer_id"]: format_context({n: (None if pd.isna(r[n]) else r[n]) for n in CUSTOMER_FEATURES})
        for r in offline.to_dict("records")
    }
    for customer in customers:
        online = online_context(customer, settings)
        assert online and online == offline_by_customer[customer]


def test_serving_client_builds_the_training_prompt(window_root) -> None:
    """A live request's prompt (context from the online store) equals the prompt the training set
    builder makes for the same request with the point-in-time features of that moment."""
    from pipelines.serve.prompts import conversation
    from pipelines.toolcall.prompt import chat_turns, system_for

    settings, root = window_root["settings"], window_root["root"]
    rows = pd.read_parquet(root / "curated" / "sft").drop(columns=["context"]).head(30).to_dict("records")
    after = datetime.combine(END + timedelta(days=1), time(6), tzinfo=UTC)
    customers = sorted({r["customer_id"] for r in rows})
    offline = feast_client.historical_customer_features(
        settings, pd.DataFrame({"customer_id": customers, "event_timestamp": [after] * len(customers)})
    )
    context = {
        r["customer_id"]: format_context({n: (None if pd.isna(r[n]) else r[n]) for n in CUSTOMER_FEATURES})
        for r in offline.to_dict("records")
    }
    for row in rows:
        live = {**row, "event_time": after.isoformat()}
        for style in ("names", "short"):
            served = conversation(live, style, settings)  # context looked up online
            trained = chat_turns(
                system_for({**live, "context": context[row["customer_id"]]}, style), row["messages_json"]
            )
            assert served == trained
            assert context[row["customer_id"]] and context[row["customer_id"]] in served[0]["content"]


def test_an_evaluation_from_a_log_file_gets_the_served_context_and_a_stratified_sample(
    window_root, tmp_path: Path
) -> None:
    """`flywheel eval --logs`: each request is prompted as the gateway would serve it, with its customer's
    context line from the online store (a tuned model's prompt carries it), and the sample is drawn by
    (tool, source) like a split's; a root whose online store has nothing serves, and evaluates, without."""
    from pipelines.evaluate.pipeline import EvalConfig, logs_frame
    from pipelines.prep.dataset import _strata
    from pipelines.toolcall.examples import to_examples

    settings, root = window_root["settings"], window_root["root"]
    day = sorted((root / "raw").glob("dt=*"))[-1]
    log = tmp_path / "heldout.jsonl"
    log.write_bytes(b"".join(f.read_bytes() for f in sorted(day.glob("*.jsonl")) if f.name != "planted.jsonl"))
    frame, note = logs_frame(settings, EvalConfig(logs=str(log), examples=40))
    assert len(frame) == 40 and note.startswith("the online store, as served")
    for row in frame.to_dict("records"):
        assert row["context"] == online_context(row["customer_id"], settings)
    known = frame[frame["context"] != ""]
    assert len(known) > 0 and f"({len(known)} of 40 requests' customers" in note
    prompt = to_examples(known.head(1), "names")[0].turns[0]["content"]
    assert known["context"].iloc[0] in prompt  # what the tuned model reads, as served
    everything = logs_frame(settings, EvalConfig(logs=str(log), examples=100000))[0]
    assert set(_strata(frame)) == set(_strata(everything)), "every (tool, source) stratum of the file is drawn"

    bare = load_settings(root=str(tmp_path / "bare"))  # no features stage ever ran here
    plain, said = logs_frame(bare, EvalConfig(logs=str(log), examples=40))
    assert (plain["context"] == "").all() and ("none:" in said or said.startswith("the online store, as served (0 of"))


def test_a_customer_seen_only_before_the_short_horizon_gets_zero_shares(spark) -> None:
    """A one-day window after a week of history: a customer whose last request is 9 days old has no
    requests in the 7-day horizon (shares 0, not a division by zero) but keeps the 30-day features."""
    from pipelines.features import nodes

    rows = [
        (
            "cus_old",
            datetime(2026, 11, 1, 10, tzinfo=UTC),
            "search_discovery",
            "search_products",
            "toys",
            None,
            "US",
            "USD",
        ),
        ("cus_new", datetime(2026, 11, 10, 9, tzinfo=UTC), "orders", "create_order", None, 20.0, "DE", "EUR"),
    ]
    clean = spark.createDataFrame(
        rows,
        "customer_id string, event_timestamp timestamp, workload_id string, "
        "tool string, category string, amount double, country string, currency string",
    )
    window = DateWindow.parse("2026-11-10", "2026-11-10")
    got = {r["customer_id"]: r.asDict() for r in nodes.customer_features(clean, window).collect()}
    assert set(got) == {"cus_old", "cus_new"}
    old = got["cus_old"]
    assert all(old[f"share_{w}_7d"] == 0.0 for w in nodes.WORKLOADS)
    assert old["share_search_discovery_30d"] == 1.0 and old["requests_30d"] == 1
    assert got["cus_new"]["share_orders_7d"] == 1.0


def test_a_backfill_builds_its_own_window_and_never_moves_the_current_training_set(tmp_path: Path, spark) -> None:
    """Prep + features of an older day after a newer one: that day's manifest and training set are
    built, `curated/manifest.json` (what training reads by default) stays on the newer window, and
    training pinned to the old window reads only its rows."""
    from pipelines.prep.dataset import load_split, manifest
    from pipelines.simulate.generator import GeneratorConfig, write_raw_logs

    settings = load_settings(root=str(tmp_path))
    old_day = END - timedelta(days=5)
    for day in (END, old_day):
        write_raw_logs(
            GeneratorConfig(seed=day.day, records=800, days=1, end_date=day, bad_share=0.0), tmp_path / "raw"
        )
    for day in (END, old_day):  # the newer day first, then the backfill
        window = DateWindow(day, day)
        run_prep(settings, window, spark=spark)
        run_gates(settings, window, spark=spark)
        run_features(settings, window, spark=spark)
    current = manifest(settings)
    assert current["window"] == {"start": END.isoformat(), "end": END.isoformat()}
    old_label = DateWindow(old_day, old_day).label
    old = manifest(settings, old_label)
    assert (
        old["window"]["end"] == old_day.isoformat()
        and old["training_set"]["digest"] != current["training_set"]["digest"]
    )
    rows = load_split(settings, "train", window=old_label)
    assert len(rows) > 0 and set(pd.to_datetime(rows["event_timestamp"]).dt.date) == {old_day}


def test_an_example_past_the_base_models_context_window_fails_the_gate(tmp_path: Path, spark) -> None:
    """quality.max_approx_tokens unset: the ceiling is the context window the caller names minus the answer
    budget of the window's longest target; a window that fits passes, the same window against a smaller
    model's window fails on approx_tokens."""
    settings = load_settings(root=str(tmp_path))
    write_window(tmp_path / "raw", records=300, days=1, seed=8)
    day = DateWindow(END, END)
    run_prep(settings, day, spark=spark)
    examples = pd.concat(pd.read_parquet(p) for p in (tmp_path / "curated" / "examples").rglob("*.parquet"))
    fits = run_gates(settings, day, spark=spark, raise_on_failure=False, context_window=8192)
    assert fits.success and fits.prompt_ceiling["source"] == "context window - answer budget"
    from pipelines.toolcall.budget import budget_for

    longest = int(examples["target_json"].str.len().max())  # the answer budget of the window's longest target
    budget = budget_for(-(-longest // 4))  # in prep's approximate tokens (characters / 4, rounded up)
    assert fits.prompt_ceiling["longest_target_chars"] == longest
    assert fits.prompt_ceiling["max_approx_tokens"] == 8192 - budget
    median = int(examples["approx_tokens"].median())  # a model whose window holds half the examples
    report = run_gates(settings, day, spark=spark, raise_on_failure=False, context_window=median + budget)
    assert report.prompt_ceiling["max_approx_tokens"] == median
    [failed] = [f for s in report.suites for f in s.failed]
    assert failed["column"] == "approx_tokens" and not report.success
    index = Path(report.data_docs.removeprefix("file://"))  # a failed window has its Data Docs too
    assert len(list((index.parent / "validations" / "curated_examples").rglob("*.html"))) == 2  # both runs


def test_importing_feast_through_its_client_skips_typeguards_rewriting(tmp_path: Path) -> None:
    """Feast's classes are not recompiled with typeguard's checks at import (9 of `import feast`'s 14 s here,
    in every process that imports it): the client makes the decorator the identity before Feast is imported.
    (Mutation: the client's call removed: DataSource's constructor holds typeguard's checks and this fails.)"""
    import subprocess
    import sys

    code = (
        "import pipelines.clients.feast, feast.data_source as d; "
        "print('TypeCheckMemo' in d.DataSource.__init__.__code__.co_names)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr
    # our feature repository's definitions still pass Feast's type checks, built with typeguard's on (feast
    # imported first: the client then leaves it as it is)
    code = (
        "import feast, feast.data_source as d; assert 'TypeCheckMemo' in d.DataSource.__init__.__code__.co_names; "
        "from pipelines.clients.feast import definitions; from pipelines.config import load_settings; "
        f"print(sorted(definitions(load_settings(root={str(tmp_path)!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0 and "customer_profile" in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_landed_window_of_imported_turns_only_builds_its_training_set(tmp_path: Path, spark) -> None:
    """A window holding only WebShop-style imported turns (pairs written here): no product categories, no
    customer history, one workload. The DAG's data path (the landed ingest task, then the functions its prep,
    validate and features tasks call, in this process with the shared Spark session) builds its training set
    with empty context. The DAG itself runs a landed window in test_dag.py (the failing gate)."""
    from pipelines import tasks
    from pipelines.prep.pipeline import PrepError
    from pipelines.simulate.importers import webshop_to_raw

    pairs = {
        f"find me {a} {b} for my {c}": [f"{a} {b}", f"{b} for {c}"]
        for a in ("waterproof", "wireless", "organic", "leather")
        for b in ("boots", "earbuds", "tea", "wallet")
        for c in ("father", "sister", "trip")
    }
    pairs_file = tmp_path / "pairs.json"
    pairs_file.write_text(json.dumps(pairs))
    root, day = tmp_path / "fw", END.isoformat()
    settings = load_settings(root=str(root))
    window = DateWindow.parse(day, day)
    with pytest.raises(PrepError, match="no raw logs landed"):  # nothing landed yet: the ingest task says so
        tasks.ingest(settings, {"start": day, "end": day}, {"source": "landed"})
    webshop_to_raw(pairs_file, root / "raw", END)
    assert tasks.ingest(settings, {"start": day, "end": day}, {"source": "landed"})["files"]
    run_prep(settings, window, spark=spark)
    assert run_gates(settings, window, spark=spark, context_window=tasks.base_context_window(settings, {})).success
    run_features(settings, window, spark=spark)
    manifest = json.loads((root / "curated" / "manifest.json").read_text())
    assert manifest["counts"]["input"] == 96 and sum(manifest["training_set"]["examples_by_split"].values()) > 0
    assert manifest["training_set"]["with_customer_context"] == 0
    sft = pd.read_parquet(root / "curated" / "sft")
    assert set(sft["tool"]) == {"search_products"} and (sft["context"] == "").all()
