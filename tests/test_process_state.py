"""State files and pid files: atomic writes by concurrent writers, stale pid files (fast, no servers)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from ports import free_port

from pipelines import services
from pipelines.storage import read_json, write_json


def test_concurrent_writers_of_one_file_never_collide_or_leave_half_a_file(tmp_path: Path) -> None:
    """Eight threads rewrite one JSON file 50 times each: every read sees one whole document, no
    temporary file is left behind (a shared `{path}.tmp` made writers fail or interleave)."""
    target = str(tmp_path / "state.json")
    errors: list[BaseException] = []
    payload = {"rows": list(range(2000))}

    def writer(n: int) -> None:
        try:
            for i in range(50):
                write_json(target, {**payload, "writer": n, "i": i})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def reader() -> None:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                data = read_json(target)
            except FileNotFoundError:
                continue
            except json.JSONDecodeError as exc:  # half a file
                errors.append(exc)
                return
            assert len(data["rows"]) == 2000

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a writer or the reader hung"
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_stale_pid_file_never_signals_a_process_that_is_not_ours(tmp_path: Path) -> None:
    """A pid file whose pid now belongs to another process (reused after a crash or reboot) is dropped:
    `stop` signals nothing and `read_pid` says the service is not running."""
    root = str(tmp_path)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        pid_file = services.run_dir(root) / "mlflow.pid"
        pid_file.write_text(f"{other.pid} {time.time() - 86_400:.2f}\n")  # recorded: started a day ago
        assert services.read_pid(root, "mlflow") is None and not pid_file.exists()
        pid_file.write_text(f"{other.pid} 12345.00\n")
        assert services.stop(root, "mlflow") is False
        assert other.poll() is None, "an unrelated process was signalled"
        services._write_pid(root, "mlflow", other.pid)  # recorded by us: trusted
        assert services.read_pid(root, "mlflow") == other.pid
    finally:
        other.kill()
        other.wait(timeout=10)


def test_a_pid_file_of_ours_is_still_trusted_after_the_wall_clock_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An NTP step or a VM's clock catching up moves every process's wall-clock start time (psutil's boot time
    moves): the pid file records the start since boot, so the service is still ours and still running. Before,
    the check dropped the live Triton's and gateway's pid files mid-run (mutation: the start taken from psutil's
    `create_time` again)."""
    import psutil._pslinux as pslinux

    root = str(tmp_path)
    ours = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        services._write_pid(root, "triton", ours.pid)
        stepped = pslinux.boot_time() + 3600.0
        monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)  # the clock stepped an hour forward
        assert services.read_pid(root, "triton") == ours.pid and services.status(root, "triton").running
        # a file an older version wrote holds the wall-clock start: still read as it was written
        (services.run_dir(root) / "old.pid").write_text(f"{ours.pid} {psutil.Process(ours.pid).create_time():.2f}\n")
        assert services.read_pid(root, "old") == ours.pid
    finally:
        ours.kill()
        ours.wait(timeout=10)


def test_a_pid_file_from_another_boot_or_with_another_start_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a reboot seconds since boot start again, so a live process can hold the pid and the start a pid file
    of the last boot recorded: the boot id tells them apart (mutation: the boot id not compared); a `boot`-tagged
    file whose start is not the process's is dropped too (mutation: the start check skipped for `boot` files)."""
    root = str(tmp_path)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        services._write_pid(root, "gateway", other.pid)
        pid, start, tag, boot = (services.run_dir(root) / "gateway.pid").read_text().split()
        assert tag == services.SINCE_BOOT and boot == services._boot_id() != ""
        assert services.read_pid(root, "gateway") == other.pid  # this boot, this start: ours
        pid_file = services.run_dir(root) / "gateway.pid"
        pid_file.write_text(f"{pid} {start} {tag} 00000000-0000-0000-0000-000000000000\n")  # the last boot's
        assert services.read_pid(root, "gateway") is None and not pid_file.exists()
        pid_file.write_text(f"{pid} {float(start) + 30:.2f} {tag} {boot}\n")  # this boot, a later start
        assert services.read_pid(root, "gateway") is None and not pid_file.exists()
        assert other.poll() is None
        pid_file.write_text(f"{pid} {start} {tag}\n")  # the format before the boot was recorded: still ours
        assert services.read_pid(root, "gateway") == other.pid
        pid_file.write_text(f"{pid} {start} {tag} {boot}\n")  # this boot's id cannot be read now: not dropped
        monkeypatch.setattr(services, "_boot_id", lambda: "")  # (mutation: an unreadable id taken as another boot)
        assert services.read_pid(root, "gateway") == other.pid and pid_file.exists()
    finally:
        other.kill()
        other.wait(timeout=10)


def _web(tmp_path: Path) -> tuple[str, int, services.ServiceSpec]:
    """A stand-in for a platform service (MLflow, Airflow, the gateway): a server whose group has a second process
    (`sleep`) that outlives its leader (a web server). Every real service SIGKILLed and started again by
    `flywheel up`: tests/test_drift_scenario.py::test_drift_alert_retrains_once_under_the_scheduler_on_postgres."""
    import os
    import sys

    root, port = str(tmp_path), free_port()
    return (
        root,
        port,
        services.ServiceSpec(
            "web",
            ["sh", "-c", f"sleep 300 & exec {sys.executable} -m http.server {port} --bind 127.0.0.1"],
            dict(os.environ),
            f"http://127.0.0.1:{port}/",
            f"http://127.0.0.1:{port}/",
            cwd=root,
        ),
    )


@pytest.mark.parametrize("mid_exit", [False, True], ids=["gone", "caught-mid-exit"])
def test_a_server_whose_leader_was_killed_is_started_afresh_not_waited_for(
    tmp_path: Path, monkeypatch, mid_exit: bool
) -> None:
    """A crash kills a server's leader while a child of its group lingers (or is still exiting): `start` stops
    what is left and starts a fresh server at once, instead of waiting the whole start timeout for a health
    check that cannot pass and then failing. A group whose processes are all zombies counts as gone. A leader
    caught still alive in its exit (the first look says alive) is seen gone while `start` waits for it, and
    replaced then. (Mutation tried: no leader check in `wait_healthy`: the mid-exit case waits its 30 s and
    fails, as it once did in a full suite run under load.)"""
    import os
    import signal

    root, port, spec = _web(tmp_path)
    first = services.start(root, spec, host="127.0.0.1", port=port, timeout_s=30)
    try:
        assert first.healthy
        os.kill(first.pid, signal.SIGKILL)  # the leader only: `sleep` lives on in its group
        deadline = time.monotonic() + 10
        while services.http_ok(spec.health_url) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert services.group_alive(first.pid)  # the lingering child
        if mid_exit:
            real, looks = services._leader_alive, []
            monkeypatch.setattr(
                services, "_leader_alive", lambda pid: looks.append(pid) or len(looks) == 1 or real(pid)
            )
        started = time.monotonic()
        second = services.start(root, spec, host="127.0.0.1", port=port, timeout_s=30)
        assert second.healthy and second.pid != first.pid
        assert time.monotonic() - started < 20, "waited for a server that was gone"
        assert not services.group_alive(first.pid)  # what was left of the old group is gone
        assert not mid_exit or len(looks) >= 2  # the forced "alive" was the first look; the wait looked again
    finally:
        services.stop(root, "web", grace_s=5)


def test_a_server_stopped_while_a_start_waits_for_it_stays_stopped(tmp_path: Path, monkeypatch) -> None:
    """`flywheel down` stops a server whose start another `flywheel up` is waiting for: the waiting start says
    so at once (one error) instead of starting the server again behind the user's back. (Mutation tried: the
    lingering-group check removed, a fresh server starts: this fails.)"""
    import os
    import signal

    root, port, spec = _web(tmp_path)
    first = services.start(root, spec, host="127.0.0.1", port=port, timeout_s=30)
    try:
        os.kill(first.pid, signal.SIGKILL)  # a server not answering (its leader caught mid-exit at the first look)
        deadline = time.monotonic() + 10
        while services.http_ok(spec.health_url) and time.monotonic() < deadline:
            time.sleep(0.1)
        real, looks = services._leader_alive, []

        def look(pid: int) -> bool:
            looks.append(pid)
            if len(looks) == 2:  # while the start waits: `flywheel down` stops the whole group
                services.stop(root, "web", grace_s=5)
            return len(looks) == 1 or real(pid)

        monkeypatch.setattr(services, "_leader_alive", look)
        started = time.monotonic()
        with pytest.raises(services.ServiceError, match="exited or was stopped while this start waited"):
            services.start(root, spec, host="127.0.0.1", port=port, timeout_s=30)
        assert time.monotonic() - started < 20 and not services.http_ok(spec.health_url)
        assert services.read_pid(root, "web") is None and not services.group_alive(first.pid)
    finally:
        services.stop(root, "web", grace_s=5)
