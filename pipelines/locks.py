"""Locks that hold across hosts, for the state several machines change: the serving state (a DAG's deploy on an
Airflow worker, `flywheel rollback` on an operator's machine), the gateway's routes (each replica moves them) and
the project registry.

The embedded profile keeps everything on one machine: a file lock beside the state file (`storage.locked`).
State on object storage is changed from many hosts, and a lock file under each host's home would let them all in;
there the lock is a PostgreSQL advisory lock on the cluster's own database (`locks.postgres_uri`, by default the
Airflow metadata database the cluster profile already has), keyed by the state's URI. An advisory lock belongs to
its database session: it is released when the holder ends or its connection drops (a killed process never leaves
it behind), and the wait for it is bounded by PostgreSQL's `lock_timeout` (every statement by `statement_timeout`,
a dead connection found by TCP keepalives). Any database failure while locking is `Busy`: one line, retry. A holder
whose session is lost inside its block no longer excludes the others (no fencing token): the blocks it guards are
short read-modify-write steps.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from typing import Any

from pipelines.storage import Busy, is_local, locked

CONNECT_TIMEOUT_S = 10
STATEMENT_MARGIN_MS = 5000  # a statement may run this much past the lock's own wait before the server cancels it


def advisory_key(uri: str) -> int:
    """The 64-bit signed key of a state URI (every host computes the same one)."""
    return int.from_bytes(hashlib.sha256(uri.encode()).digest()[:8], "big", signed=True)


def libpq_uri(uri: str) -> str:
    """A SQLAlchemy URI (`postgresql+psycopg2://...`) as the plain libpq one psycopg takes."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://", uri)


@contextlib.contextmanager
def shared_lock(uri: str, timeout_s: float, what: str, postgres_uri: str | None) -> Iterator[None]:
    """Hold the lock of the state at `uri` while the block runs; `Busy` (one line) after `timeout_s`. Local state,
    or no database given: the file lock (one host). State on object storage with a database: the advisory lock
    (every host)."""
    if is_local(uri) or not postgres_uri:
        with locked(uri, timeout_s, what):
            yield
        return
    with _advisory(uri, timeout_s, what, postgres_uri):
        yield


@contextlib.contextmanager
def _advisory(uri: str, timeout_s: float, what: str, postgres_uri: str) -> Iterator[None]:
    import psycopg
    from psycopg import errors

    key = advisory_key(uri)
    try:
        conn: Any = psycopg.connect(
            libpq_uri(postgres_uri),
            connect_timeout=CONNECT_TIMEOUT_S,
            autocommit=True,
            # TCP keepalives: a half-open connection is found dead in about a minute, not hung on
            keepalives=1,
            keepalives_idle=30,
            keepalives_interval=10,
            keepalives_count=3,
        )
    except psycopg.Error as exc:
        raise Busy(f"{what}: the lock database did not answer ({type(exc).__name__}); retry") from None
    with conn:
        try:
            wait_ms = max(1, int(timeout_s * 1000))
            conn.execute(f"SET lock_timeout = {wait_ms}")
            conn.execute(f"SET statement_timeout = {wait_ms + STATEMENT_MARGIN_MS}")  # every statement bounded too
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        except errors.LockNotAvailable:
            raise Busy(
                f"{what} is held by another run (advisory lock {key}) for over {timeout_s:g} s; "
                "retry when it has finished"
            ) from None
        except psycopg.Error as exc:  # a dropped connection, a cancelled statement, a server shutting down
            raise Busy(f"{what}: the lock database failed while locking ({type(exc).__name__}: {exc}); retry") from None
        try:
            yield
        finally:
            with contextlib.suppress(psycopg.Error):  # a dropped connection has released it already
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
