"""Spark prep on small generated windows with planted records (real Spark, local mode)."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pandas as pd
import pytest
from data_path import END, PLANTED_PII, write_window

from pipelines.config import load_settings
from pipelines.prep.pipeline import PrepError, run_prep
from pipelines.simulate.generator import EXPECTED_REASON, Kind
from pipelines.storage import read_json
from pipelines.window import DateWindow

pytestmark = pytest.mark.slow
WINDOW = DateWindow.ending(END, 3)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, spark):
    root = tmp_path_factory.mktemp("prep")
    settings = load_settings(root=str(root))
    written = write_window(root / "raw")
    result = run_prep(settings, WINDOW, spark=spark)
    return {"settings": settings, "root": root, "result": result, **written}


def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def test_counts_reconcile(prepared) -> None:
    r = prepared["result"]
    lines_in = prepared["summary"].records + prepared["planted_lines"]
    assert r.input_records == lines_in
    assert r.clean + r.held + r.quarantined + r.duplicates == lines_in
    manifest = read_json(r.manifest_uri)
    assert manifest["counts"]["reconciled"] is True
    assert sum(manifest["examples_by_split"].values()) == r.clean
    root = prepared["root"]
    assert len(_read(root / "curated" / "examples")) == r.clean
    quarantine = _read(root / "quarantine" / "records")
    assert len(quarantine) == r.quarantined + r.duplicates
    assert (quarantine["reason"] == "duplicate").sum() == r.duplicates


def test_every_generated_bad_kind_is_quarantined_with_its_reason(prepared) -> None:
    kinds = prepared["summary"].kinds
    expected: dict[str, int] = {}
    for kind, n in kinds.items():
        reason = EXPECTED_REASON[Kind(kind)]
        if reason is not None:
            expected[reason.value] = expected.get(reason.value, 0) + n
    for reason in prepared["planted"].values():
        if reason not in ("clean", "duplicate"):
            expected[reason] = expected.get(reason, 0) + 1
    assert prepared["result"].reasons == dict(sorted(expected.items()))
    duplicates_generated = kinds.get("exact_duplicate", 0) + kinds.get("near_duplicate", 0)
    assert prepared["result"].duplicates >= duplicates_generated + 1


def test_planted_malformed_lines_land_in_quarantine_with_the_right_reason(prepared) -> None:
    quarantine = _read(prepared["root"] / "quarantine" / "records")
    by_id = dict(zip(quarantine["record_id"], quarantine["reason"]))
    for record_id, reason in prepared["planted"].items():
        if reason == "clean":
            assert record_id not in by_id
        elif record_id == "planted_bad_json":  # not parseable: found by its (redacted) raw text
            assert quarantine.loc[
                quarantine["raw_redacted"].fillna("").str.contains("planted_bad_json"), "reason"
            ].tolist() == ["bad_json"]
        else:
            assert by_id.get(record_id) == reason, record_id
    dup = quarantine[quarantine["record_id"] == "planted_near_duplicate"]
    assert dup["detail"].iloc[0] == "duplicate of planted_original"


def test_planted_pii_never_reaches_curated_or_quarantine(prepared) -> None:
    root = prepared["root"]
    blobs = []
    for table in ("curated/examples", "curated/clean_logs", "quarantine/records"):
        frame = _read(root / table)
        blobs.append(frame.astype(str).to_csv())
    text = "\n".join(blobs)
    for value in PLANTED_PII.values():
        assert value not in text
    examples = _read(root / "curated" / "examples")
    planted = examples[examples["record_id"] == "planted_pii"].iloc[0]
    for placeholder in ("<EMAIL>", "<PHONE>", "<CARD>", "<ADDRESS>"):
        assert placeholder in planted["messages_json"]
    assert '"recipient_email":"<EMAIL>"' in planted["target_json"]
    redactions = prepared["result"].redactions
    assert all(redactions[t] >= 1 for t in ("EMAIL", "PHONE", "CARD", "ADDRESS"))


def test_splits_are_disjoint_by_session_and_stratified_by_tool(prepared) -> None:
    examples = _read(prepared["root"] / "curated" / "examples")
    assert (examples.groupby("session_id")["split"].nunique() == 1).all()
    shares = examples["split"].value_counts(normalize=True)
    assert 0.72 < shares["train"] < 0.88 and shares["test"] > 0.05 and shares["val"] > 0.05
    counts = examples.groupby(["tool", "split"]).size().unstack(fill_value=0)
    for tool, row in counts.iterrows():
        if row.sum() >= 40:
            assert row["test"] > 0 and row["val"] > 0, tool


def test_rerunning_a_window_is_idempotent(prepared, spark) -> None:
    first = read_json(prepared["result"].manifest_uri)
    again = run_prep(prepared["settings"], WINDOW, spark=spark)
    second = read_json(again.manifest_uri)
    assert second["content_digest"] == first["content_digest"]
    assert second["counts"] == first["counts"]
    root = prepared["root"]
    assert len(_read(root / "quarantine" / "records")) == again.quarantined + again.duplicates
    assert len(_read(root / "curated" / "examples")) == again.clean


def test_missing_window_is_a_clear_error(tmp_path: Path, spark) -> None:
    with pytest.raises(PrepError, match="no raw partitions for 2026-01-01..2026-01-01"):
        run_prep(load_settings(root=str(tmp_path)), DateWindow(date(2026, 1, 1), date(2026, 1, 1)), spark=spark)


def test_empty_partition_says_so(tmp_path: Path, spark) -> None:
    day = END - timedelta(days=30)
    (tmp_path / "raw" / f"dt={day}").mkdir(parents=True)
    (tmp_path / "raw" / f"dt={day}" / "empty.jsonl").write_bytes(b"\n\n")
    result = run_prep(load_settings(root=str(tmp_path)), DateWindow(day, day), spark=spark)
    assert (result.input_records, result.clean, result.quarantined) == (0, 0, 0)
    assert "empty" in result.message


def test_partition_of_only_bad_records_says_so(tmp_path: Path, spark) -> None:
    day = END - timedelta(days=31)
    (tmp_path / "raw" / f"dt={day}").mkdir(parents=True)
    (tmp_path / "raw" / f"dt={day}" / "bad.jsonl").write_bytes(b"{oops\nnot json\n[1]\n")
    result = run_prep(load_settings(root=str(tmp_path)), DateWindow(day, day), spark=spark)
    assert (result.input_records, result.clean, result.quarantined) == (3, 0, 3)
    assert "all 3 records were quarantined" in result.message
    assert result.reasons == {"bad_json": 3}


def test_a_prep_run_that_fails_mid_write_keeps_the_last_good_output(tmp_path: Path, spark, monkeypatch) -> None:
    """The window's partitions are replaced only after every output was written: a write that dies
    (here the quarantine table's, the last of three) leaves the previous run's files as they were."""
    from pipelines.prep import nodes

    settings = load_settings(root=str(tmp_path))
    write_window(tmp_path / "raw", records=600, days=1, seed=3)
    day = DateWindow(END, END)
    first = run_prep(settings, day, spark=spark)
    curated = tmp_path / "curated"

    def snapshot() -> dict[str, bytes]:
        return {
            str(p.relative_to(tmp_path)): p.read_bytes()
            for table in (curated / "examples", curated / "clean_logs", tmp_path / "quarantine" / "records")
            for p in sorted(table.rglob("*.parquet"))
        }

    before = snapshot()
    assert before and first.clean > 0

    def dies(*_args, **_kwargs):
        raise RuntimeError("executor lost while writing")

    monkeypatch.setattr(nodes, "quarantine_rows", dies)
    with pytest.raises(RuntimeError, match="executor lost"):
        run_prep(settings, day, spark=spark)
    assert snapshot() == before
    monkeypatch.undo()
    again = run_prep(settings, day, spark=spark)  # a retry replaces the window exactly
    assert again.clean == first.clean and len(pd.read_parquet(curated / "examples")) == first.clean
    assert not list((curated / "_staging").glob("*"))  # neither run left its staging behind


def test_two_runs_of_one_window_at_once_leave_exactly_one_copy(tmp_path: Path, spark, monkeypatch) -> None:
    """`flywheel run` next to the scheduler on the same day: both preps finish, and the window holds
    exactly one run's output (no duplicated rows, no partition moved inside another). Each partition
    move is slowed down so that the two runs' swaps would overlap without the window lock."""
    import threading
    import time

    from pipelines.prep import pipeline
    from pipelines.storage import move

    def slow_move(src: str, dst: str) -> None:
        time.sleep(0.5)
        move(src, dst)

    monkeypatch.setattr(pipeline, "move", slow_move)
    settings = load_settings(root=str(tmp_path))
    write_window(tmp_path / "raw", records=600, days=1, seed=8)
    day = DateWindow(END, END)
    results, errors = [], []

    def prep() -> None:
        try:
            results.append(run_prep(settings, day, spark=spark))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=prep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert errors == [] and len(results) == 2
    assert results[0].clean == results[1].clean
    examples = tmp_path / "curated" / "examples"
    assert len(pd.read_parquet(examples)) == results[0].clean
    nested = [p for p in examples.rglob("dt=*") if p.parent.name.startswith("dt=")]
    assert nested == [] and len(list(examples.glob(f"split=*/dt={END}"))) == len(results[0].examples_by_split)


def test_the_flywheel_never_trains_on_its_own_unconfirmed_or_down_rated_answers(tmp_path: Path, spark) -> None:
    """Label sources (issue 24): the teacher's answers train; our champion's own answers only when a person
    rated them up; a down-rated answer never trains and waits in the review queue, where an accepted
    correction becomes a `human` label that the next prep trains on."""
    import json

    import orjson
    from helpers import run_flywheel

    from pipelines.prep.reviews import ReviewError, decide, queue
    from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator, partition_dir

    day = END - timedelta(days=40)
    gen = TrafficGenerator(GeneratorConfig(seed=5, records=80, bad_share=0.0, end_date=day, days=1))
    records = [orjson.loads(line) for _, line, _ in gen.lines()]
    firsts = [r for r in records if r["turn_index"] == 0 and r["response"]["choices"][0]["message"].get("tool_calls")]
    roles = {
        "teacher": ("teacher", "none"),
        "unconfirmed": ("champion", "none"),
        "confirmed": ("champion", "up"),
        "champion_down": ("champion", "down"),
        "generated_down": ("generated", "down"),
    }
    ids = {}
    for r in records:
        r["feedback"], r["label_source"] = "none", "generated"
    for (role, (source, rating)), r in zip(roles.items(), firsts):
        r["label_source"], r["feedback"] = source, rating
        ids[role] = r["record_id"]
    # the same request and answer as an unrated teacher turn, twice more in other sessions: rated down, then up.
    # The dedupe keeps the teacher's turn for SFT; both ratings still reach KTO's table, where they contradict.
    twin = firsts[len(roles)]
    copies = [{**twin, "record_id": f"{twin['record_id']}-{r}", "session_id": f"twin-{r}", "feedback": r}
              for r in ("down", "up")]  # fmt: skip
    records += copies
    folder = partition_dir(tmp_path / "raw", day)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "day.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    settings = load_settings(root=str(tmp_path))
    window = DateWindow(day, day)
    first = run_prep(settings, window, spark=spark)
    trained = set(pd.read_parquet(tmp_path / "curated" / "examples")["record_id"])
    assert {ids["teacher"], ids["confirmed"]} <= trained
    assert not {ids["unconfirmed"], ids["champion_down"], ids["generated_down"]} & trained
    manifest = read_json(first.manifest_uri)
    assert manifest["counts"]["held"] == first.held == 3 and manifest["counts"]["reconciled"]
    assert manifest["held_reasons"] == {
        "our own model's answer, not confirmed by a person": 1,
        "rated down: waits for review": 2,
    }
    assert manifest["label_sources"]["teacher"] == 1 and manifest["label_sources"]["champion"] == 1
    logs = pd.read_parquet(tmp_path / "curated" / "clean_logs")
    assert ids["unconfirmed"] in set(logs["record_id"]), "held, not lost"
    # every rating reaches KTO's table, a deduplicated turn's too (mutation: `rated_rows` of the kept rows alone:
    # the copies are missing); two identical answers rated both ways are dropped as a contradiction
    from pipelines.prep.thumbs import build_thumbs

    rated = pd.read_parquet(tmp_path / "curated" / "rated")
    by_id = rated.set_index("record_id")
    assert {ids["confirmed"], ids["champion_down"], ids["generated_down"], *(c["record_id"] for c in copies)} <= set(
        by_id.index
    ) and ids["unconfirmed"] not in by_id.index
    assert (by_id.loc[[c["record_id"] for c in copies], "duplicate_of"] == twin["record_id"]).all()
    thumbs, dropped, _ = build_thumbs(rated, pd.DataFrame(columns=["record_id"]))
    assert not {c["record_id"] for c in copies} & set(thumbs["record_id"])
    assert dropped == {
        "down: the same answer rated both up and down": 1,
        "up: the same answer rated both up and down": 1,
    }

    waiting = {r["record_id"] for r in queue(settings)}
    assert waiting == {ids["champion_down"], ids["generated_down"]}
    listed = run_flywheel("labels", "review", "--json", env={"FLYWHEEL_ROOT": str(tmp_path)})
    assert listed.returncode == 0 and {r["record_id"] for r in json.loads(listed.stdout)["queue"]} == waiting
    with pytest.raises(ReviewError, match="not one of the tools this turn offered"):
        decide(settings, ids["champion_down"], True, {"name": "teleport", "arguments": {}})
    # the reviewer finds the down-rated answer right after all: the same call, now a human label (the same
    # request and call as the held original: the correction must win the dedupe, not be dropped as its copy)
    original = next(r for r in records if r["record_id"] == ids["champion_down"])["response"]["choices"][0]["message"]
    same = {
        "name": original["tool_calls"][0]["function"]["name"],
        "arguments": json.loads(original["tool_calls"][0]["function"]["arguments"]),
    }
    decide(settings, ids["champion_down"], True, same, "ana")
    refused = run_flywheel("labels", "reject", ids["generated_down"], env={"FLYWHEEL_ROOT": str(tmp_path)})
    assert refused.returncode == 0, refused.stderr
    assert queue(settings) == []
    again = run_flywheel("labels", "reject", ids["generated_down"], env={"FLYWHEEL_ROOT": str(tmp_path)})
    assert again.returncode == 2 and again.stderr.startswith("error: record") and "already decided" in again.stderr

    # the correction lands in the day it was made: the next run, which prepares that day, trains on it (the
    # turn's own day, forty days back, is never prepared again). (Mutation: the correction written into the
    # turn's own day, as before, and today's prep has nothing to train.)
    from datetime import UTC, datetime

    today = datetime.now(UTC).date()
    second = run_prep(settings, DateWindow(today, today), spark=spark)
    examples = pd.read_parquet(tmp_path / "curated" / "examples")
    fixed = examples[examples["record_id"] == f"{ids['champion_down']}-review"]
    assert len(fixed) == 1 and fixed["label_source"].iloc[0] == "human"
    assert ids["champion_down"] not in set(examples["record_id"]), "the down-rated original still never trains"
    assert second.clean == 1


def test_a_rating_that_arrives_days_later_reaches_the_next_run(tmp_path: Path, spark) -> None:
    """A champion answer logged on day D trains only once a person rates it up; the rating comes on D+2, when D
    was prepared long ago: the run of D+2 prepares that turn with its own day and trains on it; a late thumbs-down
    on a teacher's answer holds it out and queues it for review. (Mutation: no late copy staged, as before: the
    up-rated answer never trains.)"""
    import orjson

    from pipelines.logs.feedback import feedback_zone
    from pipelines.prep.reviews import queue
    from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator, partition_dir

    day = END - timedelta(days=20)
    later = day + timedelta(days=2)
    records = {}
    for when, seed in ((day, 7), (later, 8)):
        gen = TrafficGenerator(GeneratorConfig(seed=seed, records=60, bad_share=0.0, end_date=when, days=1))
        rows = [orjson.loads(line) for _, line, _ in gen.lines()]
        for r in rows:
            r["feedback"], r["label_source"] = "none", "generated"
        records[when] = rows
    calls = [r for r in records[day] if r["response"]["choices"][0]["message"].get("tool_calls")]
    ours, teachers = calls[0], calls[1]
    ours["label_source"], teachers["label_source"] = "champion", "teacher"
    for when, rows in records.items():
        folder = partition_dir(tmp_path / "raw", when)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "day.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    settings = load_settings(root=str(tmp_path))
    run_prep(settings, DateWindow(day, day), spark=spark)
    trained = set(pd.read_parquet(tmp_path / "curated" / "examples")["record_id"])
    assert ours["record_id"] not in trained and teachers["record_id"] in trained  # unconfirmed: held

    ratings = Path(feedback_zone(settings.zone("raw"))) / f"dt={later.isoformat()}"
    ratings.mkdir(parents=True)
    events = [
        {"record_id": ours["record_id"], "rating": "up", "timestamp": f"{later.isoformat()}T09:00:00+00:00"},
        {"record_id": teachers["record_id"], "rating": "down", "timestamp": f"{later.isoformat()}T09:01:00+00:00"},
    ]
    (ratings / "gateway-x.jsonl").write_bytes(b"\n".join(orjson.dumps(e) for e in events) + b"\n")
    run_prep(settings, DateWindow(later, later), spark=spark)
    examples = pd.read_parquet(tmp_path / "curated" / "examples")
    now_trained = set(examples[examples["record_id"].isin([ours["record_id"], teachers["record_id"]])]["record_id"])
    assert ours["record_id"] in now_trained  # the late thumbs-up: our answer, confirmed, trains in the next run
    assert teachers["record_id"] in {r["record_id"] for r in queue(settings)}  # the late thumbs-down waits
    late = tmp_path / "raw" / f"dt={later.isoformat()}" / f"late-ratings-{DateWindow(later, later).label}.jsonl"
    assert late.is_file() and len(late.read_bytes().splitlines()) == 2
    run_prep(settings, DateWindow(later, later), spark=spark)  # a re-run replaces the copy, never doubles it
    assert len(late.read_bytes().splitlines()) == 2


def test_a_late_ratings_copy_counts_for_its_own_window_only_and_never_for_drift(tmp_path: Path) -> None:
    """A copy staged for the window ending on a day is not read again by another window over that day (its rows
    would be quarantined as duplicates there), and the drift monitor never counts copies as the day's traffic.
    (Mutation: `raw_files_for` without the late-copy filter: both other readers see it.)"""
    from pipelines.prep.late import LATE_PREFIX
    from pipelines.prep.pipeline import raw_files_for
    from pipelines.window import DateWindow

    settings = load_settings(root=str(tmp_path))
    day = Path(settings.zone("raw")) / "dt=2026-11-20"
    day.mkdir(parents=True)
    week, one = DateWindow.parse("2026-11-14", "2026-11-20"), DateWindow.parse("2026-11-20", "2026-11-20")
    for name in ("gateway-1.jsonl", f"{LATE_PREFIX}{week.label}.jsonl", f"{LATE_PREFIX}{one.label}.jsonl"):
        (day / name).write_text("{}\n")
    names = lambda files: sorted(f.rsplit("/", 1)[-1] for f in files)  # noqa: E731
    assert names(raw_files_for(settings, week)) == ["gateway-1.jsonl", f"{LATE_PREFIX}{week.label}.jsonl"]
    assert names(raw_files_for(settings, one)) == ["gateway-1.jsonl", f"{LATE_PREFIX}{one.label}.jsonl"]
    assert names(raw_files_for(settings, one, late_copies=False)) == ["gateway-1.jsonl"]


def test_a_rated_duplicate_takes_the_split_of_the_example_it_duplicates(spark) -> None:
    """A rated copy in a training session whose twin is held out for test goes to test: KTO never trains on
    what the test split scores; a copy whose twin is no example (held) keeps its session's split. (Mutations: the
    copy placed by its own session's split: it lands in train; the twin join an inner join: the held twin's copy is
    lost.)"""
    from pipelines.prep import nodes

    examples = spark.createDataFrame(
        [("x", "s1", "test"), ("y", "s2", "train")], "record_id string, session_id string, split string"
    )
    marked = spark.createDataFrame(
        [
            ("x2", "s2", "down", "x", 1, "get_order"),
            ("y", "s2", "up", None, 0, "get_order"),
            ("h2", "s2", "down", "h", 2, "get_order"),
        ],  # fmt: skip
        "record_id string, session_id string, feedback string, duplicate_of string, turn_index int, tool string",
    ).selectExpr("*", "current_timestamp() AS event_timestamp")
    rated = nodes.rated_rows(marked, examples, 0.1, 0.1, salt="t").toPandas().set_index("record_id")
    assert rated.loc["x2", "split"] == "test" and rated.loc["y", "split"] == "train"
    assert rated.loc["h2", "split"] == "train" and len(rated) == 3
