"""Start, stop and inspect the local servers (Airflow standalone, MLflow, later Triton).

Each server runs in its own session/process group (`setsid`), so stopping it stops every child
it forked (Airflow standalone forks a scheduler, API server, DAG processor, triggerer and task
workers; a plain SIGTERM to the parent would leave them running). State is a pid file per
service under `<root>/run/`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger("flywheel.services")


class ServiceError(RuntimeError):
    """A server could not be started or stopped; the message says which and where its log is."""


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    command: list[str]
    env: dict[str, str]
    health_url: str
    url: str
    cwd: str | None = None


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    url: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "running": self.running, "healthy": self.healthy, "url": self.url}


def run_dir(root: str) -> Path:
    path = Path(root) / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_path(root: str, name: str) -> Path:
    path = Path(root) / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path / f"{name}.log"


def _pid_file(root: str, name: str) -> Path:
    return run_dir(root) / f"{name}.pid"


SINCE_BOOT = "boot"  # the pid file's tag: its start is in seconds since boot


def _started_at(pid: int) -> float | None:
    """When the process started, in seconds since boot (None: gone or a zombie). Never the wall clock: an NTP
    step or a VM's clock catching up moves every process's wall-clock start time (psutil's `create_time` is
    boot time + ticks), and a pid file checked against it would be dropped as if its pid had been reused."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() != psutil.STATUS_ZOMBIE:
            return _since_boot(process)
    except psutil.ZombieProcess:
        pass
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    with contextlib.suppress(ChildProcessError):  # killed, not yet reaped: gone; reap it when it is our child
        os.waitpid(pid, os.WNOHANG)
    return None


def _since_boot(process: Any) -> float:
    """Linux: `starttime` of /proc/<pid>/stat (clock ticks since boot, fixed for the process's life); elsewhere
    psutil's start time less its boot time."""
    import psutil

    try:
        stat = Path(f"/proc/{process.pid}/stat").read_bytes()
        return int(stat[stat.rindex(b")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float(process.create_time() - psutil.boot_time())


def _boot_id() -> str:
    """This boot's id (Linux: /proc/sys/kernel/random/boot_id), "" where there is none: after a reboot seconds
    since boot start again, so a pid file of the last boot is told apart by it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _write_pid(root: str, name: str, pid: int) -> None:
    """`<pid> <start> boot <boot id>` written atomically: the start (seconds since boot) and the boot tell our
    process from a reused pid."""
    from pipelines.storage import write_text

    write_text(
        str(_pid_file(root, name)), f"{pid} {_started_at(pid) or 0:.2f} {SINCE_BOOT} {_boot_id()}".strip() + "\n"
    )


def read_pid(root: str, name: str) -> int | None:
    """The service's pid, or None; a stale file (the process is gone, or its pid now belongs to another
    process started later) is removed rather than trusted, so nothing else is ever signalled."""
    path = _pid_file(root, name)
    try:
        fields = path.read_text().split()
        pid = int(fields[0])
        recorded = float(fields[1]) if len(fields) > 1 and float(fields[1]) > 0 else None
    except (FileNotFoundError, ValueError, IndexError):
        return None
    booted, current = (fields[3] if len(fields) > 3 and fields[2] == SINCE_BOOT else ""), _boot_id()
    if booted and current and booted != current:  # written before a reboot: whatever has that pid now is not ours
        path.unlink(missing_ok=True)
        return None
    started = _started_at(pid)
    if started is None and not group_alive(pid):
        path.unlink(missing_ok=True)
        return None
    if started is not None and SINCE_BOOT not in fields[2:]:  # a file an older version wrote: a wall-clock time
        started = _wall_start(pid)
    if recorded is not None and started is not None and abs(started - recorded) > 1.0:
        path.unlink(missing_ok=True)  # the pid was reused by a process that is not ours
        return None
    return pid


def _wall_start(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs: a group whose members are all zombies (killed, waiting
    for a parent that may never reap them, e.g. PID 1 in a container without an init) is gone."""
    import psutil

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return False


def port_free(host: str, port: int, *, reuse_addr: bool = True) -> bool:
    """Whether `port` can be bound; with `reuse_addr` off, a port in TIME_WAIT counts as taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse_addr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback only)
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start(root: str, spec: ServiceSpec, *, host: str, port: int, timeout_s: float = 180.0) -> ServiceStatus:
    """Start `spec` in its own process group and wait until its health URL answers.

    Under a per-service lock: two `flywheel up` at once start one server (the second waits for it)."""
    from filelock import FileLock, Timeout

    wait_s = 2 * timeout_s + 75  # the holder may wait for a server, find its leader gone, stop the rest, start afresh
    try:
        with FileLock(str(run_dir(root) / f"{spec.name}.lock"), timeout=wait_s):
            return _start_locked(root, spec, host=host, port=port, timeout_s=timeout_s)
    except Timeout:
        raise ServiceError(
            f"{spec.name}: another `flywheel up` held its start lock for over {wait_s:.0f} s; "
            f"see {log_path(root, spec.name)}"
        ) from None


def _start_locked(root: str, spec: ServiceSpec, *, host: str, port: int, timeout_s: float) -> ServiceStatus:
    current = status(root, spec.name, spec.health_url, spec.url)
    if current.running and current.pid is not None and not _leader_alive(current.pid):
        _stop_leaderless(root, spec, current.pid)
        current = status(root, spec.name, spec.health_url, spec.url)
    if current.running:
        if current.healthy:
            return current
        try:
            wait_healthy(root, spec, timeout_s, leader=current.pid)
            return status(root, spec.name, spec.health_url, spec.url)
        except _LeaderGone:  # it died while we waited for it (a crash caught mid-exit)
            if read_pid(root, spec.name) is None:  # its whole group is gone too: stopped (`flywheel down`) or exited
                raise ServiceError(
                    f"{spec.name} exited or was stopped while this start waited for it; see {log_path(root, spec.name)}"
                ) from None
            _stop_leaderless(root, spec, current.pid)  # a lingering group: start afresh
    if not port_free(host, port):
        raise ServiceError(f"{spec.name}: port {host}:{port} is already in use; set another port in the config")
    log = log_path(root, spec.name)
    with open(log, "ab") as out:
        proc = subprocess.Popen(  # noqa: S603 (our own argv, no shell)
            spec.command,
            env=spec.env,
            cwd=spec.cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _write_pid(root, spec.name, proc.pid)
    wait_healthy(root, spec, timeout_s, proc)
    return status(root, spec.name, spec.health_url, spec.url)


class _LeaderGone(Exception):
    """The server waited for has no leader any more."""


def _leader_alive(pid: int) -> bool:
    return _started_at(pid) is not None


def _stop_leaderless(root: str, spec: ServiceSpec, pid: int | None) -> None:
    """The leader died (a crash, an OOM kill) and some of its group lingers: that is no server to wait for;
    what is left goes, and a fresh one starts."""
    LOG.warning("%s: its leader %s is gone while its group lingers; stopping the rest", spec.name, pid)
    stop(root, spec.name, grace_s=5.0)


def wait_healthy(
    root: str, spec: ServiceSpec, timeout_s: float, proc: subprocess.Popen | None = None, leader: int | None = None
) -> None:
    """Until the health URL answers (ServiceError past `timeout_s`); `proc` (ours) exiting is an error at once,
    and `leader` (another start's) dying is `_LeaderGone` at once."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if http_ok(spec.health_url):
            return
        if proc is not None and proc.poll() is not None:
            stop(root, spec.name)
            raise ServiceError(f"{spec.name} exited with code {proc.returncode}; see {log_path(root, spec.name)}")
        if leader is not None and not _leader_alive(leader):
            raise _LeaderGone(leader)
        time.sleep(1.0)
    stop(root, spec.name)
    raise ServiceError(f"{spec.name} not healthy after {timeout_s:.0f}s; see {log_path(root, spec.name)}")


def stop(root: str, name: str, grace_s: float = 30.0) -> bool:
    """SIGTERM the service's whole process group, SIGKILL what is left after `grace_s`."""
    pid = read_pid(root, name)
    if pid is None:
        return False
    if group_alive(pid):
        with contextlib.suppress(ProcessLookupError):  # its last member exited since the look
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while group_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.2)
        if group_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while group_alive(pid) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.1)
            if group_alive(pid):  # e.g. a process stuck in uninterruptible I/O: say so, keep the pid file
                raise ServiceError(f"{name}: process group {pid} survived SIGKILL for 10 s; see {log_path(root, name)}")
    _reap(pid)
    _pid_file(root, name).unlink(missing_ok=True)
    return True


def _reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def status(root: str, name: str, health_url: str | None = None, url: str | None = None) -> ServiceStatus:
    pid = read_pid(root, name)
    running = pid is not None and group_alive(pid)
    healthy = bool(running and health_url and http_ok(health_url))
    return ServiceStatus(name, pid if running else None, running, healthy, url)


def stop_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM the process's whole group, SIGKILL what is left after `grace_s` (the leader and every
    child it started: Spark's JVM, torchrun's workers); every wait is bounded."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_alive(proc.pid):
                return
            time.sleep(0.1)
