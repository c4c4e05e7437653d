"""The cluster profile's storage paths against a real S3-compatible server on 127.0.0.1 (moto in
server mode, `tests/s3_server.py`): zone I/O, the drift monitor, the Triton model repository and the
serving state on s3:// roots. Clients find the server through the standard AWS_ENDPOINT_URL only.

Spark on s3a:// is not tested here: the platform's pyspark ships no hadoop-aws / AWS SDK jars (the
cluster image must provide them), so a local session cannot open s3a:// paths offline."""

from __future__ import annotations

import itertools
import json
import threading
import time
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from s3_server import bucket, endpoint  # noqa: F401 - the fixtures these tests take

from pipelines import storage
from pipelines.config import load_settings

pytestmark = pytest.mark.slow


def _raw_get(endpoint: str, uri: str) -> bytes:
    """The object from the server at `endpoint`, through a plain botocore client given that endpoint
    explicitly (not through fsspec or the environment): proof it is really there."""
    import botocore.session
    from s3_server import TEST_ENV

    client = botocore.session.Session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name=TEST_ENV["AWS_DEFAULT_REGION"],
        aws_access_key_id=TEST_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=TEST_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def _keys(uri: str) -> list[str]:
    import fsspec

    prefix = uri.removeprefix("s3://").rstrip("/")
    return sorted(p.removeprefix(prefix + "/") for p in fsspec.filesystem("s3").find(prefix))


# --- a. pipelines.storage --------------------------------------------------------------------------
def test_storage_roundtrip_glob_exists_remove_on_s3(endpoint: str, bucket: str) -> None:
    doc = {"run": "r1", "counts": {"input": 3}, "when": date(2026, 11, 20)}
    assert storage.write_json(f"{bucket}/curated/manifests/a.json", doc) == f"{bucket}/curated/manifests/a.json"
    assert storage.read_json(f"{bucket}/curated/manifests/a.json") == {**doc, "when": "2026-11-20"}
    assert json.loads(_raw_get(endpoint, f"{bucket}/curated/manifests/a.json"))["run"] == "r1"  # on the server
    storage.write_text(f"{bucket}/curated/manifests/b.json", "{}\n")
    assert storage.glob(f"{bucket}/curated/manifests/*.json") == [
        f"{bucket}/curated/manifests/a.json",
        f"{bucket}/curated/manifests/b.json",
    ]
    assert storage.exists(f"{bucket}/curated/manifests/a.json") and storage.exists(f"{bucket}/curated/manifests")
    assert not storage.exists(f"{bucket}/curated/manifests/c.json")
    with pytest.raises(FileNotFoundError):
        storage.read_json(f"{bucket}/curated/manifests/c.json")
    storage.remove(f"{bucket}/curated/manifests/a.json")
    storage.remove(f"{bucket}/curated/manifests/missing.json")  # absent: a no-op
    assert storage.glob(f"{bucket}/curated/manifests/*") == [f"{bucket}/curated/manifests/b.json"]
    storage.remove(f"{bucket}/curated")  # a folder: everything under it
    assert _keys(bucket) == []


def test_write_bytes_replaces_an_object_whole_under_concurrent_writers(bucket: str) -> None:
    """Writers in threads replace one object again and again; a reader only ever sees one whole document."""
    uri = f"{bucket}/serving/state.json"
    docs = {w: json.dumps({"writer": w, "pad": [w] * 40_000}).encode() for w in range(4)}  # ~160 KB each
    storage.write_bytes(uri, docs[0])
    stop, writing = threading.Event(), threading.Event()
    seen: list[bytes] = []
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        deadline = time.monotonic() + 60
        try:  # 8 writes each, and on until the reader has read 5 times while they write
            for n in itertools.count():
                if n >= 8 and (len(seen) >= 5 or time.monotonic() > deadline):
                    break
                writing.set()
                storage.write_bytes(uri, docs[w])
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    def reader() -> None:
        writing.wait(30)  # every read counted is one made while the writers write
        while not stop.is_set():
            try:
                seen.append(storage.read_bytes(uri))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    watcher.join(timeout=30)
    assert not any(t.is_alive() for t in [*threads, watcher]), "a writer or the reader hung"
    assert not errors, errors[0]
    assert len(seen) >= 5
    assert all(data in docs.values() for data in seen), {len(d) for d in seen}
    assert storage.read_bytes(uri) in docs.values()


def test_window_partitions_move_of_a_file_and_lock_file_on_s3(bucket: str, tmp_path: Path) -> None:
    table = f"{bucket}/curated/examples"
    for part in ("split=train/dt=2026-11-19", "split=train/dt=2026-11-20", "split=val/dt=2026-11-20", "dt=2026-11-20"):
        storage.write_bytes(f"{table}/{part}/part-0.parquet", part.encode())
        storage.write_bytes(f"{table}/{part}/part-1.parquet", part.encode())
    assert storage.window_partitions(table, ["2026-11-20"]) == [
        f"{table}/dt=2026-11-20",
        f"{table}/split=train/dt=2026-11-20",
        f"{table}/split=val/dt=2026-11-20",
    ]
    assert storage.window_partitions(table, ["2026-11-18"]) == []
    storage.move(f"{table}/dt=2026-11-20/part-0.parquet", f"{bucket}/curated/_staging/r0/part-0.parquet")  # a file
    assert _keys(f"{bucket}/curated/_staging/r0") == ["part-0.parquet"]
    assert not storage.exists(f"{table}/dt=2026-11-20/part-0.parquet")

    lock = Path(storage.lock_file(f"{bucket}/serving/state.json"))
    assert lock.parent.is_dir() and lock.is_relative_to(tmp_path / "home" / ".flywheel" / "locks")
    assert lock == Path(storage.lock_file(f"{bucket}/serving/state.json"))  # one lock per URI
    assert lock != Path(storage.lock_file(f"{bucket}/reports/drift/state.json"))


def test_move_of_a_folder_on_s3(bucket: str) -> None:
    """What prep's `_swap_window` does to the window's partitions on an s3 root."""
    table = f"{bucket}/curated/examples"
    for part in ("split=train/dt=2026-11-19", "split=train/dt=2026-11-20"):
        for i in range(2):
            storage.write_bytes(f"{table}/{part}/part-{i}.parquet", part.encode())
    storage.move(
        f"{table}/split=train/dt=2026-11-20", f"{bucket}/curated/_staging/r1/replaced/split=train/dt=2026-11-20"
    )
    assert _keys(f"{bucket}/curated/_staging/r1/replaced") == [
        "split=train/dt=2026-11-20/part-0.parquet",
        "split=train/dt=2026-11-20/part-1.parquet",
    ]
    assert not storage.exists(f"{table}/split=train/dt=2026-11-20")
    assert storage.window_partitions(table, ["2026-11-20"]) == []
    assert (
        storage.read_bytes(f"{bucket}/curated/_staging/r1/replaced/split=train/dt=2026-11-20/part-1.parquet")
        == b"split=train/dt=2026-11-20"
    )
    assert _keys(table) == ["split=train/dt=2026-11-19/part-0.parquet", "split=train/dt=2026-11-19/part-1.parquet"]


# --- b. the drift monitor ----------------------------------------------------------------------------
def test_drift_monitor_on_an_s3_root(bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gzipped raw logs read from the bucket; the reference, the reports and the state written there;
    nothing under the local root but MLflow's store; the lock is a local file."""
    import fsspec

    from pipelines.drift import monitor
    from pipelines.simulate.generator import Drift, GeneratorConfig, write_raw_logs
    from pipelines.window import DateWindow

    local = tmp_path / "gen"
    write_raw_logs(
        GeneratorConfig(seed=1, records=1500, days=2, end_date=date(2026, 11, 10), bad_share=0.03), local, compress=True
    )
    write_raw_logs(
        GeneratorConfig(
            seed=3, records=600, end_date=date(2026, 11, 12), bad_share=0.03, drift=Drift.HOLIDAY, drift_magnitude=0.8
        ),
        local,
        compress=True,
    )
    fs = fsspec.filesystem("s3")
    uploaded = 0
    for file in local.rglob("*.jsonl.gz"):
        fs.pipe(f"{bucket.removeprefix('s3://')}/fw/raw/{file.relative_to(local).as_posix()}", file.read_bytes())
        uploaded += 1
    assert uploaded >= 3
    settings = load_settings(root=str(tmp_path / "local"), drift={"min_records": 100, "embedding_sample": 150})
    object.__setattr__(settings, "root", f"{bucket}/fw")  # MLflow stays on the local SQLite store
    # stand-in for the champion's training window from the MLflow registry (the real read:
    # tests/test_drift_scenario.py::test_drift_alert_retrains_once_under_the_scheduler_on_postgres)
    monkeypatch.setattr(monitor, "reference_window", lambda settings: DateWindow.parse("2026-11-09", "2026-11-10"))

    result = monitor.run_monitor(settings, date(2026, 11, 12), now=datetime(2026, 11, 12, 12, tzinfo=UTC))
    assert result["lines"] == 600 and result["fire"], result.get("reason")
    monitor.mark_emitted(settings, result["checked_at"])
    assert result["json_uri"].startswith(f"{bucket}/fw/reports/drift/")
    assert storage.read_json(result["json_uri"])["verdict"] == "act"
    assert b"<html" in storage.read_bytes(result["html_uri"]).lower()
    ref = f"{bucket}/fw/features/drift_reference/2026-11-09_2026-11-10"
    assert {"summary.json", "embeddings.npy"} <= set(_keys(ref))
    assert storage.read_bytes(f"{bucket}/fw/reports/drift/state.json").count(b'"emitted": true') == 1
    assert list((tmp_path / "home" / ".flywheel" / "locks").glob("*.lock"))
    local_zones = {p.name for p in (tmp_path / "local").iterdir()} if (tmp_path / "local").exists() else set()
    assert local_zones <= {"runs"}, local_zones  # only MLflow's store; no zone data on the local disk
    summary, vectors = monitor.reference(settings, DateWindow.parse("2026-11-09", "2026-11-10"))  # stored copy
    assert vectors.shape == (150, 384) and summary.records > 1000


# --- c. the Triton model repository on S3 ------------------------------------------------------------
def _folder(root: Path, name: str, meta: dict, adapter: bytes = b"{}") -> Path:
    folder = root / name
    (folder / "1" / "adapter").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"')
    (folder / "1" / "model.py").write_text("# model\n")
    (folder / "1" / "adapter" / "adapter_config.json").write_bytes(adapter)
    (folder / "1" / "flywheel.json").write_text(json.dumps(meta))
    return folder


def _stamps(uri: str) -> dict[str, tuple[str, str]]:
    import fsspec

    fs = fsspec.filesystem("s3")
    prefix = uri.removeprefix("s3://")
    fs.invalidate_cache()
    return {
        p.removeprefix(prefix + "/"): (fs.info(p)["ETag"], str(fs.info(p)["LastModified"])) for p in fs.find(prefix)
    }


def test_model_folders_are_published_to_an_s3_repository(endpoint: str, bucket: str, tmp_path: Path) -> None:
    from pipelines.serve.repository import ModelInUse, publish

    meta = {
        "registry_version": "3",
        "base_model": "smollm2-135m-instruct",
        "prompt_style": "short",
        "model": "tool_router",
        "fingerprint": "f1",
    }
    settings = load_settings(root=str(tmp_path / "fw"), triton={"model_repository": f"{bucket}/models"})
    uri = f"{bucket}/models/tool_router_v3"
    folder = _folder(tmp_path / "build", "tool_router_v3", meta)
    assert publish(settings, folder) == (uri, False)
    assert _keys(uri) == ["1/adapter/adapter_config.json", "1/flywheel.json", "1/model.py", "config.pbtxt"]
    assert json.loads(_raw_get(endpoint, f"{uri}/1/flywheel.json")) == meta  # on the server, metadata included
    first = _stamps(uri)

    time.sleep(1.1)  # LastModified has one-second resolution: an upload now would change it
    assert publish(settings, folder) == (uri, False)  # identical: nothing uploaded
    assert _stamps(uri) == first

    # in use and built differently (same model): kept as it is, reported stale
    rebuilt = _folder(tmp_path / "build2", "tool_router_v3", {**meta, "fingerprint": "f2"}, adapter=b'{"r": 16}')
    assert publish(settings, rebuilt, in_use=True) == (uri, True)
    assert _stamps(uri) == first
    # in use and serving another model: refused, untouched
    other = _folder(tmp_path / "build3", "tool_router_v3", {**meta, "registry_version": "4", "fingerprint": "f3"})
    with pytest.raises(ModelInUse, match="never rewritten while in use"):
        publish(settings, other, in_use=True)
    assert _stamps(uri) == first
    # not in use: replaced by the new build
    assert publish(settings, rebuilt) == (uri, False)
    assert storage.read_json(f"{uri}/1/flywheel.json")["fingerprint"] == "f2"
    assert storage.read_bytes(f"{uri}/1/adapter/adapter_config.json") == b'{"r": 16}'


# --- d. the serving state and the benchmark's read of a model folder ---------------------------------
def test_serving_state_and_model_metadata_on_s3(bucket: str, tmp_path: Path) -> None:
    """Without a Triton server: the state file's read-modify-write under its (local) lock on an s3
    serving zone, and the benchmark's base-model lookup and served limit from an s3 repository."""
    from pipelines.bench.serving import _base_model_of
    from pipelines.serve import deploy
    from pipelines.serve.repository import configured_limit, publish

    settings = load_settings(root=str(tmp_path / "fw"), triton={"model_repository": f"{bucket}/models"})
    object.__setattr__(settings, "root", f"{bucket}/fw")
    assert deploy.state(settings) == {"live": None, "previous": None, "history": []}
    assert deploy.live_model(settings) is None
    live = {
        "name": "tool_router_v3",
        "version": "3",
        "prompt_style": "short",
        "deployed_at": "2026-11-20T00:00:00+00:00",
    }
    with deploy.state_lock(settings):
        current = deploy.state(settings)
        current["live"] = live
        deploy._save(settings, current, {"event": "deploy", "name": "tool_router_v3"})
    assert json.loads(storage.read_bytes(f"{bucket}/fw/serving/state.json"))["live"] == live
    assert deploy.lock_name(settings).startswith(f"lock {tmp_path / 'home' / '.flywheel' / 'locks'}")  # no lock DB
    assert deploy.live_model(settings) == deploy.Deployment(**live)

    folder = _folder(
        tmp_path / "build",
        "tool_router_v3",
        {
            "registry_version": "3",
            "base_model": "qwen2.5-0.5b-instruct",
            "prompt_style": "short",
            "model": "tool_router",
            "fingerprint": "f1",
        },
    )
    (folder / "config.pbtxt").write_text(
        'parameters [\n  { key: "max_input_tokens" value: { string_value: "2048" } }\n]'
    )
    publish(settings, folder)
    assert _base_model_of(settings, deploy.live_model(settings)) == "qwen2.5-0.5b-instruct"
    assert configured_limit(settings, "tool_router_v3") == 2048

    storage.write_text(f"{bucket}/fw/serving/state.json", '{"live": ')  # a torn or hand-edited state
    with pytest.raises(deploy.StateCorrupt, match="not valid JSON"):
        deploy.state(settings)


def test_gateway_captures_reach_an_s3_raw_zone_whole_and_a_dead_gateways_spool_is_uploaded(
    endpoint: str, bucket: str, tmp_path: Path
) -> None:
    import orjson

    from pipelines.gateway.capture import CaptureWriter

    raw, spool = f"{bucket}/raw", tmp_path / "spool"
    orphan = spool / "20261120T000000-999999999" / "dt=2026-11-20"  # a pid no process has: a killed gateway's
    orphan.mkdir(parents=True)
    (orphan / "gateway-old.jsonl").write_bytes(b'{"record_id": "old", "timestamp": "2026-11-20T10:00:00+00:00"}\n')
    writer = CaptureWriter(raw, rotate_bytes=200, spool=spool)
    assert not (orphan / "gateway-old.jsonl").exists()
    for i in range(5):
        writer.write({"record_id": f"r{i}", "timestamp": "2026-11-21T10:00:00+00:00", "pad": "x" * 60})
    writer.close()
    keys = _keys(raw)
    assert "dt=2026-11-20/gateway-old.jsonl" in keys and len(keys) >= 3  # rotated at 200 bytes, each file uploaded
    records = [orjson.loads(line) for k in keys for line in _raw_get(endpoint, f"{raw}/{k}").splitlines()]
    assert sorted(r["record_id"] for r in records) == ["old", "r0", "r1", "r2", "r3", "r4"]
    assert not list(spool.rglob("*.jsonl"))  # nothing left behind once uploaded


# --- e. a lock that holds across hosts ------------------------------------------------------------------------
RACER = """
import json, sys
from pipelines.config import load_settings
from pipelines.serve import deploy

settings = load_settings(root=sys.argv[1], profile="local", state_lock_uri=sys.argv[2] or None)
object.__setattr__(settings, "root", sys.argv[3])  # the serving zone on the S3 server, as on the cluster
for i in range(int(sys.argv[4])):
    with deploy.state_lock(settings):  # each read-modify-write of state.json under the state's lock
        current = deploy.state(settings)
        deploy._save(settings, current, {"event": "deploy", "name": f"{sys.argv[5]}-{i}"})
"""


def _race(bucket: str, tmp_path: Path, lock_uri: str, rounds: int) -> list[str]:
    """Two processes with their own home folders (two hosts) append `rounds` events each to one state file."""
    import os
    import subprocess
    import sys

    procs = []
    for host in ("worker", "operator"):
        home = tmp_path / host
        home.mkdir(exist_ok=True)
        env = {**os.environ, "HOME": str(home)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RACER, str(home / "root"), lock_uri, f"{bucket}/fw", str(rounds), host],
                env=env,
            )
        )
    for proc in procs:
        assert proc.wait(timeout=300) == 0
    return [e["name"] for e in json.loads(storage.read_bytes(f"{bucket}/fw/serving/state.json"))["history"]]


def test_two_hosts_racing_the_serving_state_keep_every_change(bucket: str, tmp_path: Path, postgres) -> None:
    """The serving state on object storage, changed from two hosts at once (a DAG's deploy on a worker and
    `flywheel rollback` on an operator's machine): under the advisory lock on the cluster's database no change is
    lost. (Mutation tried: `state_lock_uri` unset, so each host takes its own file lock under its home: the race
    lost 13 of the 40 changes.)"""
    from helpers import create_databases

    create_databases(postgres, "locks")
    names = _race(bucket, tmp_path, postgres.uri("locks"), rounds=20)
    assert sorted(names) == sorted([f"worker-{i}" for i in range(20)] + [f"operator-{i}" for i in range(20)])


def test_the_advisory_lock_waits_for_its_holder_and_then_says_busy(postgres, tmp_path: Path) -> None:
    """One holder: a second caller waits at most its timeout, then one clear `Busy` line; the lock is free again
    once the holder's block ends (and with it when the holder's connection drops)."""
    import threading

    from helpers import create_databases

    from pipelines.locks import shared_lock
    from pipelines.storage import Busy

    create_databases(postgres, "locks2")
    dsn, uri = postgres.uri("locks2"), "s3://bucket/fw/serving/state.json"
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with shared_lock(uri, 5, "the serving state", dsn):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(30)
    with pytest.raises(Busy, match="the serving state is held by another run"):
        with shared_lock(uri, 0.5, "the serving state", dsn):
            pass
    release.set()
    thread.join(30)
    with shared_lock(uri, 5, "the serving state", dsn):  # free again
        pass


def test_the_advisory_lock_is_freed_by_a_dropped_holder_and_a_dropped_waiter_is_one_busy_line(
    postgres, tmp_path: Path
) -> None:
    """The holder's session killed (a host gone): the lock is free at once. A waiter whose session is killed while
    it waits gets one `Busy` line, not a driver traceback. (Mutation: only `LockNotAvailable` mapped to `Busy`:
    the waiter raises psycopg's OperationalError.)"""
    import threading

    import psycopg
    from helpers import create_databases

    from pipelines.locks import libpq_uri, shared_lock
    from pipelines.storage import Busy

    create_databases(postgres, "locks3")
    dsn, uri = postgres.uri("locks3"), "s3://bucket/fw/serving/routes.json"
    admin = psycopg.connect(libpq_uri(dsn), autocommit=True)

    def backends(granted: bool) -> list[int]:
        rows = admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted = %s AND pid <> pg_backend_pid()",
            (granted,),
        ).fetchall()
        return [r[0] for r in rows]

    held, release, outcome = threading.Event(), threading.Event(), {}

    def holder() -> None:
        try:
            with shared_lock(uri, 5, "the routes", dsn):
                held.set()
                release.wait(30)
        except Exception as exc:  # noqa: BLE001 (its unlock on a killed session is suppressed; nothing expected)
            outcome["holder"] = exc

    def waiter() -> None:
        try:
            with shared_lock(uri, 30, "the routes", dsn):
                outcome["waiter"] = "got it"
        except Exception as exc:  # noqa: BLE001 (what the waiter met is the assertion)
            outcome["waiter"] = exc

    first = threading.Thread(target=holder)
    first.start()
    assert held.wait(30)
    second = threading.Thread(target=waiter)
    second.start()
    deadline = time.monotonic() + 30
    while not backends(False) and time.monotonic() < deadline:  # polled with a deadline: the waiter's lock request
        time.sleep(0.05)
    (waiting,) = backends(False)
    admin.execute("SELECT pg_terminate_backend(%s)", (waiting,))
    second.join(30)
    assert isinstance(outcome["waiter"], Busy) and "failed while locking" in str(outcome["waiter"]), outcome
    (holding,) = backends(True)
    admin.execute("SELECT pg_terminate_backend(%s)", (holding,))
    with shared_lock(uri, 5, "the routes", dsn):  # free at once: the killed session's lock went with it
        pass
    release.set()
    first.join(30)
    admin.close()
