"""Airflow's processes on this machine: the environment every Airflow process we start gets (`airflow_env`, so
the scheduler's tasks see the same `FLYWHEEL_*` configuration as the CLI), the standalone server's components,
the layout lock, and `airflow dags test` with its time limit. Its REST API is `pipelines.clients.airflow`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.clients.airflow import HEALTH_PATH, AirflowUnavailable, base_url, password_file
from pipelines.config import Settings
from pipelines.errors import NotRetryable
from pipelines.services import ServiceSpec, stop_group


def bin_dir() -> Path:
    return Path(sys.executable).parent


def airflow_env(settings: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    a = settings.airflow
    env = dict(os.environ)
    env.pop("FLYWHEEL_PROJECT", None)  # the servers and `dags test` are the platform's: a task's DAG names its project
    env.update(
        {
            "AIRFLOW_HOME": str(a.home),
            "AIRFLOW__CORE__DAGS_FOLDER": a.dags_folder,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # `airflow.schedules`: new DAGs start active (their schedules run) unless the root asks for paused
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(a.schedules == "paused"),
            "AIRFLOW__CORE__PARALLELISM": str(a.parallelism),
            "AIRFLOW__CORE__EXECUTOR": a.executor,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": str(a.sql_alchemy_conn),
            "AIRFLOW__API__HOST": a.host,
            "AIRFLOW__API__PORT": str(a.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": base_url(settings),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url(settings)}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "FLYWHEEL_PROFILE": settings.profile,
            "FLYWHEEL_ROOT": str(settings.root),
            "PATH": f"{bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )
    Path(str(a.home)).mkdir(parents=True, exist_ok=True)
    # each project a team with its own DAG bundle and logins (pipelines/projects/airflow_access.py: `prepare`
    # writes the teams' file and removes it when the teams go, so the file says which layout the metadata DB
    # has). Never a process on the other layout: it would move the projects' DAGs off (or onto) their teams.
    teams = multi_team_env_file(settings)
    prepared = teams.is_file()
    if a.multi_team is not False and prepared:  # true, or auto with teams prepared
        env.update(json.loads(teams.read_text()))
    elif "AIRFLOW__CORE__MULTI_TEAM" not in (extra or {}) and (a.multi_team is True or prepared):
        why, verb = (
            ("airflow.multi_team is off but the project teams prepared earlier are still in place", "removes")
            if prepared
            else (f"airflow.multi_team is on but the project teams are not prepared ({teams} is missing)", "prepares")
        )
        raise AirflowUnavailable(f"{why}: run `flywheel up` (or `flywheel run`), which {verb} them")
    env.update(extra or {})
    return env


def multi_team_env_file(settings: Settings) -> Path:
    return Path(str(settings.airflow.home)) / "flywheel-multi-team.json"


def generated_secrets(settings: Settings) -> list[str]:
    """Airflow's generated login passwords and (airflow.multi_team) its token-signing secret: what a secret scan
    looks for."""
    found: list[str] = []
    for path, key in (
        (password_file(settings), None),
        (multi_team_env_file(settings), "AIRFLOW__API_AUTH__JWT_SECRET"),
    ):
        try:
            data = json.loads(path.read_text())
            found += [str(v) for v in data.values()] if key is None else [str(data.get(key) or "")]
        except (OSError, ValueError, AttributeError):
            continue  # not there: Airflow never started (or multi-team is off) in this root
    return found


# What `airflow standalone` runs, minus the log servers: those bind every interface (their host
# is hard-coded) and are not needed when the API server reads task logs from the local disk.
COMPONENTS = (
    ("scheduler", "--skip-serve-logs"),
    ("dag-processor",),
    ("triggerer", "--skip-serve-logs"),
    ("api-server",),
)


def serve_local() -> int:
    """Migrate the metadata DB, run the Airflow components, stop them all when one stops.

    Runs as the `airflow` service's group leader (see `standalone_spec`), so `flywheel down`
    signals the whole group; SIGTERM here is forwarded to every component.
    """
    airflow = str(bin_dir() / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True)  # noqa: S603
    procs = [subprocess.Popen([airflow, *component]) for component in COMPONENTS]  # noqa: S603

    def terminate(*_: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    while all(proc.poll() is None for proc in procs):
        time.sleep(1.0)
    terminate()
    for proc in procs:
        proc.wait(timeout=60)
    return max(proc.returncode or 0 for proc in procs)


def standalone_spec(settings: Settings, extra_env: dict[str, str] | None = None) -> ServiceSpec:
    url = base_url(settings)
    return ServiceSpec(
        name="airflow",
        command=[sys.executable, "-m", "pipelines.stack.airflow", "serve"],
        env=airflow_env(settings, extra_env),
        health_url=f"{url}{HEALTH_PATH}",
        url=url,
        cwd=str(settings.airflow.home),
    )


LAYOUT_LOCK = "flywheel-layout.lock"
LAYOUT_WAIT_S = 900.0


@contextmanager
def layout(settings: Settings, switch: bool = False) -> Iterator[None]:
    """Airflow's layout (one DAG-folder bundle, or project teams: pipelines/projects/airflow_access.py) held
    while a `dags test` runs (shared: waits up to LAYOUT_WAIT_S for a switch in progress), or taken to switch it
    (`switch`: exclusive, refused at once while a run holds it: the run would go on in the layout it parsed)."""
    path = Path(str(settings.airflow.home)) / LAYOUT_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + LAYOUT_WAIT_S
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if switch else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if switch:
                    raise AirflowUnavailable(
                        "an `airflow dags test` run (`flywheel run`, `make demo`) is going on in Airflow's current "
                        "layout; the switch to or from project teams waits for it: run this again when it ends"
                    ) from None
                if time.monotonic() > deadline:
                    raise AirflowUnavailable(
                        f"Airflow's layout was being switched for over {LAYOUT_WAIT_S:g} s (lock {path}): try again"
                    ) from None
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)


def run_cli(
    settings: Settings, *args: str, timeout: float = 900, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `airflow <args>` against our configuration (e.g. `db migrate`, `dags test`)."""
    return subprocess.run(  # noqa: S603
        [str(bin_dir() / "airflow"), *args],
        env=airflow_env(settings, extra_env),
        cwd=str(settings.airflow.home),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class RunTimedOut(NotRetryable):
    """A DAG run did not finish within its limit; it was stopped. The message says where and how to resume."""

    def __init__(self, message: str, running: list[str], log: str) -> None:
        super().__init__(message)
        self.running, self.log = running, log


_STARTED = re.compile(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)")
_ENDED = re.compile(r"\[DAG TEST\] end task task_id=(\S+) map_index=(-?\d+)")


def running_tasks(output: str) -> list[str]:
    """Tasks `airflow dags test` had started and not ended, from its log (in start order)."""
    ended = {m.groups() for m in _ENDED.finditer(output)}
    running = [m.groups() for m in _STARTED.finditer(output) if m.groups() not in ended]
    return list(dict.fromkeys(task if index == "-1" else f"{task}[{index}]" for task, index in running))


@dataclass(frozen=True)
class DagsTest:
    """One `airflow dags test` run: the DAG, its conf, its limit and where its output goes."""

    dag_id: str
    conf: dict[str, Any]
    timeout: float
    extra_env: dict[str, str] | None = None
    log: Path | None = None
    bundle: str | None = None  # the DAG bundle to parse (airflow.multi_team: the project's)
    on_wait: Callable[[], None] | None = None  # called about every second while the run goes


def dags_test(
    settings: Settings,
    dag_id: str,
    conf: dict[str, Any],
    timeout: float | None = None,
    extra_env: dict[str, str] | None = None,
    log: Path | None = None,
    bundle: str | None = None,
    on_wait: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`airflow dags test` (all tasks in one process, no scheduler) after migrating the metadata DB.

    Its output streams to `log` (default `<root>/logs/dags-test-<dag>.log`) as it runs. Past `timeout`
    (default `airflow.run_timeout_s`) the run's whole process group is stopped and `RunTimedOut`
    names the tasks that were running. `bundle`: the DAG bundle to parse (airflow.multi_team: the project's).
    `on_wait`: called about every second while the run goes (`make demo` prints each task as it ends)."""
    run = DagsTest(
        dag_id, conf, settings.airflow.run_timeout_s if timeout is None else timeout, extra_env, log, bundle, on_wait
    )
    with layout(settings):  # no switch to or from project teams under a run
        return _dags_test(settings, run)


def _wait(proc: subprocess.Popen[str], timeout: float, on_wait: Callable[[], None] | None) -> int:
    """The run's exit code; `on_wait` called about every second while it runs (to follow its progress);
    subprocess.TimeoutExpired past `timeout`."""
    if on_wait is None:
        return proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            code = proc.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            on_wait()
            return code
        except subprocess.TimeoutExpired:
            on_wait()
            if time.monotonic() >= deadline:
                raise


def _dags_test(settings: Settings, run: DagsTest) -> subprocess.CompletedProcess[str]:
    migrate = run_cli(settings, "db", "migrate", timeout=settings.airflow.migrate_timeout_s, extra_env=run.extra_env)
    if migrate.returncode != 0:
        return migrate
    log = run.log or Path(str(settings.root)) / "logs" / f"dags-test-{run.dag_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**airflow_env(settings, run.extra_env), "PYTHONUNBUFFERED": "1"}  # the log shows each step as it happens
    args = [
        str(bin_dir() / "airflow"),
        "dags",
        "test",
        run.dag_id,
        "--conf",
        json.dumps(run.conf),
        *(["--bundle-name", run.bundle] if run.bundle else []),
    ]  # one bundle parsed, not every project's
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(  # noqa: S603 (our own executable and arguments)
            args,
            env=env,
            cwd=str(settings.airflow.home),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            code = _wait(proc, run.timeout, run.on_wait)
        except BaseException as exc:  # the limit, or Ctrl-C: the run's whole group stops with us
            stop_group(proc)
            if not isinstance(exc, subprocess.TimeoutExpired):
                raise
            running = running_tasks(log.read_text(encoding="utf-8", errors="replace"))
            where = f"while {', '.join(running)} ran" if running else "before its first task started"
            raise RunTimedOut(
                f"{run.dag_id} did not finish within {run.timeout:g} s (airflow.run_timeout_s) and was stopped "
                f"{where}; run the same command again to resume: every task replaces only its window's outputs "
                f"and the sweep resumes from its checkpoints (log: {log})",
                running,
                str(log),
            ) from None
    return subprocess.CompletedProcess(args, code, log.read_text(encoding="utf-8", errors="replace"), "")


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    sys.exit(serve_local())
