"""What the gateway keeps is never lost: captures reach object storage within a bounded time, a spool left by a
gateway that is gone is uploaded by the next (whatever its process id: in a pod every gateway is PID 1), a
deleted project's request in flight recreates nothing, and a closed tenant leaves no connection open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from s3_server import bucket, endpoint  # noqa: F401 - the fixtures these tests take

from pipelines import storage
from pipelines.gateway.capture import LOCK, CaptureWriter, WriterClosed

pytestmark = pytest.mark.slow


def _record(n: int, day: str = "2026-11-20") -> dict:
    return {"record_id": f"r{n}", "timestamp": f"{day}T10:00:{n:02d}+00:00", "pad": "x"}


def _uploaded(bucket: str) -> list[str]:
    return sorted(storage.glob(f"{bucket}/raw/dt=*/gateway-*.jsonl"))


def test_an_acknowledged_turn_reaches_object_storage_within_the_upload_interval(bucket: str, tmp_path: Path) -> None:
    """Files upload when they are `max_age_s` old (the flusher calls `rotate_old`), not only at 16 MB, a new day
    or the gateway's stop. (Mutation: `rotate_old` closing nothing leaves the turn on the replica's disk.)"""
    writer = CaptureWriter(f"{bucket}/raw", 16_000_000, tmp_path / "spool", max_age_s=0.0)
    writer.write(_record(1))
    assert _uploaded(bucket) == []  # acknowledged, on the local spool, not yet in the zone
    assert writer.rotate_old() == 1
    assert len(_uploaded(bucket)) == 1
    writer.write(_record(2))  # the next turn opens a new file
    writer.close()
    assert len(_uploaded(bucket)) == 2


def test_a_spool_left_by_a_gateway_with_the_same_process_id_is_uploaded(bucket: str, tmp_path: Path) -> None:
    """A container restart: the old gateway was PID 1 and so is the new one; its spool folder names a live pid but
    its lock is free, so the new writer uploads it. A folder whose writer still runs (its lock held) is left
    alone. (Mutation: the old pid check skips the folder named with this process's own pid.)"""
    spool = tmp_path / "spool"
    left = spool / f"20261120T000000-{os.getpid()}"  # the dead container's gateway had this process's pid
    (left / "dt=2026-11-20").mkdir(parents=True)
    (left / "dt=2026-11-20" / "gateway-20261120T000000-1-0001.jsonl").write_bytes(b'{"record_id": "old"}\n')
    live = CaptureWriter(f"{bucket}/raw", 16_000_000, spool)  # another replica in the pod, still running
    live.write(_record(3))
    assert (live.folder / LOCK).is_file()

    restarted = CaptureWriter(f"{bucket}/raw", 16_000_000, spool)  # the new container's gateway
    names = [uri.rsplit("/", 1)[-1] for uri in _uploaded(bucket)]
    assert names == ["gateway-20261120T000000-1-0001.jsonl"]  # the dead one's, uploaded; the live one's kept
    assert not left.exists() and any(live.folder.glob("dt=*/gateway-*.jsonl"))
    live.close()
    restarted.close()
    assert len(_uploaded(bucket)) == 2


def test_a_closed_writer_refuses_and_recreates_nothing(tmp_path: Path) -> None:
    """A project deleted while a request of its ran: the tenant's writer is closed, its zone moved; the request's
    capture is refused (the caller gets a 503 to retry, then a 401) instead of recreating the moved folders."""
    raw = tmp_path / "raw"
    writer = CaptureWriter(str(raw), 16_000_000)
    writer.write(_record(4))
    assert writer.close() == []
    moved = tmp_path / "_deleted"
    raw.rename(moved)
    with pytest.raises(WriterClosed):
        writer.write(_record(5))
    assert not raw.exists()


def test_a_failed_upload_at_close_leaves_the_file_in_the_spool_and_closes_the_rest(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a stop, one file that cannot be uploaded (object storage gone for a moment) is kept for the next start;
    the writer's other files are still closed and uploaded. (Mutation: stopping at the first error.)"""
    writer = CaptureWriter(f"{bucket}/raw", 16_000_000, tmp_path / "spool")
    writer.write(_record(6, "2026-11-20"))
    writer.write(_record(7, "2026-11-21"))
    real = storage.write_bytes

    def flaky(uri: str, data: bytes) -> str:
        if "dt=2026-11-20" in uri:
            raise OSError("the object store is unreachable")
        return real(uri, data)

    monkeypatch.setattr(storage, "write_bytes", flaky)
    failures = writer.close()
    assert len(failures) == 1 and "2026-11-20" in failures[0]
    assert [u.rsplit("/", 2)[-2] for u in _uploaded(bucket)] == ["dt=2026-11-21"]
    monkeypatch.setattr(storage, "write_bytes", real)
    CaptureWriter(f"{bucket}/raw", 16_000_000, tmp_path / "spool").close()  # the next start uploads it
    assert [u.rsplit("/", 2)[-2] for u in _uploaded(bucket)] == ["dt=2026-11-20", "dt=2026-11-21"]


def test_two_writers_with_the_same_pid_and_start_never_share_an_uploaded_name(bucket: str, tmp_path: Path) -> None:
    """Two replicas in their pods, both PID 1, started in the same second: each writer's files keep a name of their
    own in the zone. (Mutation: the writer's token left out of the file name: the second upload replaces the
    first, one file.)"""
    first = CaptureWriter(f"{bucket}/raw", 16_000_000, tmp_path / "spool-a")
    second = CaptureWriter(f"{bucket}/raw", 16_000_000, tmp_path / "spool-b")
    second._stamp = first._stamp  # the same second, as two pods started together
    first.write(_record(8))
    second.write(_record(9))
    first.close()
    second.close()
    uploaded = _uploaded(bucket)
    assert len(uploaded) == 2, uploaded
    assert sorted(storage.read_bytes(u).decode().count("record_id") for u in uploaded) == [1, 1]


def test_a_failed_upload_is_tried_again_while_the_writer_runs(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Object storage away at a rotation: the request that rotated is still answered (no error), the file stays in
    the spool, and the flusher's next pass uploads it, not only the next start. (Mutation: the failed file dropped
    from the retry list: it is never uploaded while the writer runs.)"""
    writer = CaptureWriter(f"{bucket}/raw", 200, tmp_path / "spool", max_age_s=3600.0)
    real = storage.write_bytes

    def down(uri: str, data: bytes) -> str:
        raise OSError("the object store is unreachable")

    monkeypatch.setattr(storage, "write_bytes", down)
    writer.write(_record(10))
    writer.write({**_record(11), "pad": "x" * 300})  # past rotate_bytes: rotates, the upload fails, no error
    assert _uploaded(bucket) == [] and len(list(writer.folder.glob("dt=*/gateway-*.jsonl"))) == 2
    monkeypatch.setattr(storage, "write_bytes", real)
    assert writer.rotate_old() == 0  # nothing old enough to close, but the waiting file goes up
    assert len(_uploaded(bucket)) == 1
    writer.close()
    assert len(_uploaded(bucket)) == 2


def test_closing_a_store_closes_its_online_connection(tmp_path: Path) -> None:
    """A closed tenant's Feast stores hold no connection (one store per gateway thread per project used to stay
    open for good). (Mutation: `close_store` not closing `_conn` leaves the SQLite connection usable.)"""
    import sqlite3

    from pipelines.clients.feast import close_store, feature_store
    from pipelines.config import load_settings

    store = feature_store(load_settings(root=str(tmp_path)))
    online = store._get_provider().online_store
    conn = online._get_conn(store.config)
    conn.execute("select 1")
    close_store(store)
    assert online._conn is None
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("select 1")
