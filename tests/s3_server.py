"""A real S3-compatible server on loopback for the cluster profile's s3:// paths: moto in server mode.

`moto_server()` starts `.venv-s3/bin/moto_server` (created by `make s3-env`) on 127.0.0.1 in its own
process group, waits (bounded) until it answers HTTP, yields its endpoint URL and stops the group.
`s3_env(monkeypatch, endpoint)` points botocore/s3fs at it with dummy, test-only credentials.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from ports import free_port

from pipelines.services import http_ok, stop_group

REPO = Path(__file__).resolve().parent.parent
MOTO_SERVER = REPO / ".venv-s3" / "bin" / "moto_server"
# dummy values moto accepts; they open nothing anywhere else
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "flywheel-test",
    "AWS_SECRET_ACCESS_KEY": "flywheel-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextmanager
def moto_server(start_timeout_s: float = 30.0, log_dir: Path | None = None) -> Iterator[str]:
    """The endpoint URL (`http://127.0.0.1:<port>`) of a moto server that lives for the block."""
    if not MOTO_SERVER.exists():
        pytest.fail(
            f"{MOTO_SERVER} is missing: run `make s3-env` (make test creates it) to install the "
            "S3-compatible test server",
            pytrace=False,
        )
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="flywheel-moto-"))
    log_path = log_dir / f"moto-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not http_ok(f"{endpoint}/moto-api/", timeout=2.0):
            if proc.poll() is not None:
                pytest.fail(f"moto_server exited with {proc.returncode}; see {log_path}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(
                    f"moto_server did not answer on {endpoint} within {start_timeout_s:g} s; see {log_path}",
                    pytrace=False,
                )
            time.sleep(0.2)
        yield endpoint
    finally:
        stop_group(proc, grace_s=10)


def clear_fs_caches() -> None:
    """fsspec caches filesystem instances (with their endpoint and credentials): drop them."""
    import fsspec

    fsspec.AbstractFileSystem.clear_instance_cache()
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:
        pass


def s3_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Point botocore (hence s3fs) at `endpoint` through the standard environment variables only."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "FSSPEC_S3", "FSSPEC_S3_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for key, value in TEST_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")  # no user config or credentials file is read
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    clear_fs_caches()


def make_bucket(name: str) -> str:
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.mkdir(name)
    return f"s3://{name}"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One S3 server for a test module (import this fixture into the module)."""
    with moto_server(log_dir=tmp_path_factory.mktemp("moto")) as url:
        yield url


@pytest.fixture
def bucket(endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket on the module's server (`s3://...`); HOME is private to the test (lock files land there)."""
    s3_env(monkeypatch, endpoint)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    uri = make_bucket(f"fw-{uuid.uuid4().hex[:12]}")
    yield uri
    clear_fs_caches()
