"""A local PostgreSQL 15 server (initdb + pg_ctl) on 127.0.0.1: for tests and for running the
flywheel's metadata stores on Postgres without a cluster. On a cluster, RDS (terraform/) plays this part.

The superuser password is generated and written only into the data folder (mode 0600); the server
listens on loopback only and requires scram-sha-256 passwords.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipelines.storage import create_secret_once

DATABASES = ("airflow", "mlflow", "mlflow_auth", "feast")


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL binaries are missing or the server did not start."""


def pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (root / name).is_file():
            return str(root / name)
    raise PostgresUnavailable(f"PostgreSQL binary {name!r} not found (install PostgreSQL 15)")


SERVER_USER = "postgres"  # PostgreSQL refuses to run as root; as root we run it as this user


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *cmd] if os.geteuid() == 0 else cmd


def _hand_over(folder: Path) -> None:
    """As root: the server user must own the folder holding the data (and be able to reach it)."""
    if os.geteuid() == 0:
        shutil.chown(folder, SERVER_USER, SERVER_USER)
        for path in folder.rglob("*"):
            shutil.chown(path, SERVER_USER, SERVER_USER)


@dataclass(frozen=True)
class LocalPostgres:
    data_dir: Path
    port: int
    user: str
    password: str

    def uri(self, database: str, driver: str = "postgresql+psycopg2") -> str:
        return f"{driver}://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        subprocess.run(  # noqa: S603 (our own executable and arguments)
            _as_server_user([pg_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"]),
            capture_output=True,
            text=True,
            check=False,
        )


def start(data_dir: Path, port: int, databases: tuple[str, ...] = DATABASES) -> LocalPostgres:
    """initdb (first time), start on 127.0.0.1:port, create the databases; returns connection details.

    `data_dir`'s parent folder is the server's: as root it is handed to the `postgres` user, so it
    must be a folder of its own (e.g. a fresh temporary folder), not a shared one."""
    data_dir = Path(data_dir)
    secret = data_dir.parent / f"{data_dir.name}.password"
    if not (data_dir / "PG_VERSION").is_file():
        data_dir.mkdir(parents=True, exist_ok=True)
        secret.unlink(missing_ok=True)  # a fresh cluster gets a fresh password (its data folder is new)
        create_secret_once(str(secret), secrets.token_urlsafe(24))  # 0600 from its first byte
        _hand_over(data_dir.parent)
        init = subprocess.run(  # noqa: S603 (our own executable and arguments)
            _as_server_user(
                [
                    pg_bin("initdb"),
                    "-D",
                    str(data_dir),
                    "-U",
                    "flywheel",
                    "--auth=scram-sha-256",
                    f"--pwfile={secret}",
                    "-E",
                    "UTF8",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
    password = secret.read_text().strip()
    options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={data_dir}"
    started = subprocess.run(  # noqa: S603 (our own executable and arguments)
        _as_server_user(
            [
                pg_bin("pg_ctl"),
                "-D",
                str(data_dir),
                "-o",
                options,
                "-l",
                str(data_dir / "server.log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if started.returncode != 0:
        raise PostgresUnavailable(f"pg_ctl start failed: {(data_dir / 'server.log').read_text()[-500:]}")
    server = LocalPostgres(data_dir, port, "flywheel", password)
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user="flywheel", password=password, dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        for db in databases:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{db}"')
    conn.close()
    return server
