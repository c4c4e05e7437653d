"""Helpers for tests that run the real `flywheel` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FLYWHEEL = str(Path(sys.executable).parent / "flywheel")


def clean_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any FLYWHEEL_ setting, plus `env`: what a `flywheel` child gets."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    full_env.update(env or {})
    return full_env


def run_flywheel(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLYWHEEL, *args], env=clean_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def processes_with_env(marker: str) -> list[int]:
    """PIDs of live processes whose environment contains `marker` (e.g. FLYWHEEL_ROOT=<tmp>)."""
    needle = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().split(")")[-1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found


def listening_sockets(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state owned by these processes (read from /proc);
    IPv4-mapped IPv6 addresses are given as IPv4, ::1 as "::1"."""
    import socket

    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = fd.readlink().as_posix()
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A = LISTEN
                continue
            host, port = cols[1].split(":")
            raw = bytes.fromhex(host)
            if len(raw) == 16:  # /proc prints each 32-bit word in host byte order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                address = (
                    socket.inet_ntoa(raw[12:])
                    if raw[:12] == bytes(10) + b"\xff\xff"
                    else socket.inet_ntop(socket.AF_INET6, raw)
                )
            else:
                address = socket.inet_ntoa(raw[::-1])
            found.add((address, int(port, 16)))
    return found


def assert_kubernetes_schema(manifest: dict, model: str | None = None, where: str = "") -> None:
    """Every field of a manifest exists in the Kubernetes API (the client's OpenAPI models): a typo
    such as `readinessprobe` or a field at the wrong level fails here, not at `kubectl apply`."""
    from kubernetes import client

    model = model or f"V1{manifest['kind']}"
    cls = getattr(client, model)
    fields = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, value in manifest.items():
        path = f"{where}.{key}" if where else key
        assert key in fields, f"{model} has no field {path!r}"
        kind = cls.openapi_types[fields[key]]
        if kind.startswith("list[V") and isinstance(value, list):
            for i, item in enumerate(value):
                assert_kubernetes_schema(item, kind[5:-1], f"{path}[{i}]")
        elif kind.startswith("V") and isinstance(value, dict):
            assert_kubernetes_schema(value, kind, path)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 3.0):
    """Poll `predicate` until it returns something truthy (returned) or fail naming `what`."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}")


def create_databases(postgres, *names: str) -> None:
    """Empty databases on the `postgres` fixture's server, one per name."""
    import psycopg2

    conn = psycopg2.connect(
        host="127.0.0.1", port=postgres.port, user=postgres.user, password=postgres.password, dbname="postgres"
    )
    conn.autocommit = True
    with conn.cursor() as cur:
        for name in names:
            cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
