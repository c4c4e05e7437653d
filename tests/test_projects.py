"""AI projects: the commands and their boundaries, each project's own zones and names, and MLflow's own
permissions keeping one project's runs from another's members. The gateway's side (keys, models,
captures, quotas): test_projects_gateway.py, across replicas test_projects_gateway_replicas.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipelines.config import load_settings


def _flywheel(capsys, *args: str) -> tuple[int, str, str]:
    """`flywheel ARGS` in this process: (exit code, stdout, stderr)."""
    from pipelines import cli

    code = 0
    try:
        cli.main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        os.environ.pop("FLYWHEEL_PROJECT", None)  # `--project` sets it for the rest of this process
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_error(code: int, err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (code, err)


def test_a_project_has_its_own_zones_and_names_and_shares_the_servers(tmp_path: Path) -> None:
    from pipelines.projects import settings_for

    platform = load_settings(root=str(tmp_path))
    a = settings_for(platform, "search")
    assert a.zone("raw") == f"{tmp_path}/projects/search/raw" and platform.zone("raw") == f"{tmp_path}/raw"
    assert (a.mlflow.experiment, a.mlflow.registered_model, a.feast.project, a.triton.model_name) == (
        "commerce-flywheel--search",
        "commerce-tool-caller--search",
        "commerce_flywheel__search",
        "search__tool_router",
    )
    assert a.feast.online_store == f"{tmp_path}/projects/search/features/online_store.db"
    # shared: one tracking store, one Triton model repository, one Airflow
    for field in ("mlflow.backend_store_uri", "triton.model_repository", "airflow.home", "mlflow.tracking_uri"):
        section, name = field.split(".")
        assert getattr(getattr(a, section), name) == getattr(getattr(platform, section), name), field
    b = settings_for(a, "disputes")  # from one project to another: never scoped twice
    assert b.triton.model_name == "disputes__tool_router" and b.mlflow.experiment == "commerce-flywheel--disputes"
    assert settings_for(b, "default").triton.model_name == "tool_router"
    # another project's models never look like ours (the router lists `<model_name>_v<N>`)
    assert not f"{b.triton.model_name}_v1".startswith(f"{a.triton.model_name}_v")
    assert not f"{a.triton.model_name}_v1".startswith(f"{platform.triton.model_name}_v")


def test_project_commands_and_every_boundary_are_one_error_line(flywheel_root: Path, capsys) -> None:
    """Mutation tried: `tune_method` returning `tune.method` always (the project's choice ignored): fails."""
    from pipelines.config import TuneSettings
    from pipelines.projects import settings_for

    def settings_of(name: str) -> Any:
        return settings_for(load_settings(), name)

    code, out, err = _flywheel(capsys, "project", "create", "search", "--owner", "alice", "--rpm", "5", "--json")
    assert code == 0, err
    created = json.loads(out)
    assert created["members"] == {"alice": "owner"} and created["quotas"]["rpm"] == 5
    assert _flywheel(capsys, "project", "create", "disputes", "--owner", "bob")[0] == 0

    _one_error(*_flywheel(capsys, "project", "create", "search")[::2], "exists already")
    for bad in ("Search", "a", "search-team", "../x", "9lives"):
        _one_error(*_flywheel(capsys, "project", "create", bad)[::2], "project name")
    _one_error(*_flywheel(capsys, "--project", "nope", "config", "show")[::2], "unknown project 'nope'")
    _one_error(*_flywheel(capsys, "--project", "Bad!", "config", "show")[::2], "project name")
    _one_error(*_flywheel(capsys, "project", "show", "nope")[::2], "unknown project")
    _one_error(*_flywheel(capsys, "project", "members", "search", "remove", "carol")[::2], "no member of search")
    _one_error(*_flywheel(capsys, "project", "members", "search", "remove", "alice")[::2], "only owner")
    _one_error(*_flywheel(capsys, "project", "members", "search", "add", "carol", "--role", "god")[::2], "role 'god'")
    _one_error(*_flywheel(capsys, "project", "members", "search", "add", "car ol")[::2], "user 'car ol'")
    assert _flywheel(capsys, "project", "members", "search", "add", "carol", "--role", "viewer")[0] == 0

    code, out, err = _flywheel(capsys, "project", "key", "create", "search", "--json")
    shown = json.loads(out)
    assert code == 0 and set(shown) == {"project", "key", "id"} and shown["project"] == "search"
    stored = (flywheel_root / "projects" / "registry.json").read_text()
    assert shown["key"] not in stored  # only its hash is kept
    from pipelines.projects import registry

    assert registry.key_index(load_settings()) == {registry.key_digest(shown["key"]): "search"}
    _one_error(*_flywheel(capsys, "project", "key", "revoke", "search", "nokey")[::2], "no active key 'nokey'")
    _one_error(*_flywheel(capsys, "project", "key", "create", "default")[::2], "the gateway's own")
    assert _flywheel(capsys, "project", "key", "revoke", "search", shown["id"])[0] == 0
    assert registry.key_index(load_settings()) == {}

    # a project's tune method wins over the platform's tune.method; `platform` hands the choice back
    assert registry.tune_method(settings_of("search")) == "off"
    code, out, err = _flywheel(capsys, "project", "tune", "search", "--method", "grpo", "--json")
    assert code == 0 and json.loads(out) == {"project": "search", "tune_method": "grpo"}, err
    assert (
        registry.tune_method(settings_of("search")) == "grpo" and registry.tune_method(settings_of("disputes")) == "off"
    )
    _one_error(*_flywheel(capsys, "project", "tune", "search", "--method", "ppo")[::2], "--method: expected one of")
    _one_error(*_flywheel(capsys, "project", "tune", "nope", "--method", "dpo")[::2], "unknown project")
    assert _flywheel(capsys, "project", "tune", "search", "--method", "platform")[0] == 0
    assert registry.tune_method(settings_of("search").model_copy(update={"tune": TuneSettings(method="dpo")})) == "dpo"

    # the project's own commands see its zones: a run names its DAG, a show names its champion
    code, out, _ = _flywheel(capsys, "--project", "search", "config", "show", "--json")
    assert code == 0 and json.loads(out)["project"] == "search"

    # delete refuses while the project serves traffic, then keeps its data apart
    from pipelines.projects import settings_for
    from pipelines.storage import write_json

    scoped = settings_for(load_settings(), "search")
    write_json(
        f"{scoped.zone('serving')}/state.json",
        {"live": {"name": "search__tool_router_v1", "version": "1", "prompt_style": "names"}, "previous": None},
    )
    _one_error(*_flywheel(capsys, "project", "delete", "search")[::2], "serves traffic")
    assert (flywheel_root / "projects" / "search" / "serving" / "state.json").is_file()
    write_json(f"{scoped.zone('serving')}/state.json", {"live": None, "previous": None})
    code, out, err = _flywheel(capsys, "project", "delete", "search", "--json")
    assert code == 0, err
    kept = json.loads(out)["data_kept_at"]
    assert (
        kept and Path(kept, "serving", "state.json").is_file() and not (flywheel_root / "projects" / "search").exists()
    )
    _one_error(*_flywheel(capsys, "--project", "search", "config", "show")[::2], "unknown project 'search'")
    _one_error(*_flywheel(capsys, "project", "delete", "default")[::2], "cannot be deleted")
    code, out, _ = _flywheel(capsys, "project", "list", "--json")
    assert sorted(p["name"] for p in json.loads(out)["projects"]) == ["default", "disputes"]
    _one_error(*_flywheel(capsys, "project", "create", "search")[::2], "was deleted")  # its MLflow history stays its


def test_each_project_gets_its_own_dags_with_its_own_run_quota(flywheel_root: Path) -> None:
    """Airflow parses one commerce_flywheel and one drift_monitor per project; a project's drift alert schedules
    only that project's flywheel; its runs have the project's quota; a task of its DAG works in its zones."""
    import subprocess
    import sys

    from pipelines.airflow_tasks import project_of, task_settings
    from pipelines.projects import registry

    registry.create(load_settings(), "search", "alice", registry.Quotas(training_runs=2))
    code = (
        "from airflow.dag_processing.dagbag import DagBag; import json; b = DagBag(dag_folder='dags'); "
        "assert not b.import_errors, b.import_errors; print(json.dumps({d.dag_id: {'runs': d.max_active_runs, "
        "'outlets': sorted(a.name for t in d.tasks for a in t.outlets), "
        "'on': str(getattr(d.timetable, 'asset_condition', '')), "
        "'source': d.params.get('source') if 'source' in d.params else None} for d in b.dags.values()}))"
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")},
        "FLYWHEEL_ROOT": str(flywheel_root),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    dags = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(dags) == {"commerce_flywheel", "drift_monitor", "commerce_flywheel__search", "drift_monitor__search"}
    assert dags["commerce_flywheel__search"]["runs"] == 2 and dags["commerce_flywheel"]["runs"] == 1
    # a project's daily run trains on its own landed logs; only the default project's demo generates traffic
    assert (
        dags["commerce_flywheel__search"]["source"] == "landed" and dags["commerce_flywheel"]["source"] == "synthetic"
    )
    assert dags["drift_monitor__search"]["outlets"] == ["flywheel_drift__search"]
    assert dags["drift_monitor"]["outlets"] == ["flywheel_drift"]
    assert "flywheel_drift__search" in dags["commerce_flywheel__search"]["on"]
    assert (
        "flywheel_drift__search" not in dags["commerce_flywheel"]["on"]
        and "flywheel_drift" in dags["commerce_flywheel"]["on"]
    )
    assert project_of("commerce_flywheel__search") == "search" and project_of("drift_monitor") == "default"
    # a task of the project's DAG gets that project's settings, passed in (the process's environment unchanged)
    assert task_settings("search").zone("raw") == f"{flywheel_root}/projects/search/raw"
    assert task_settings("default").zone("raw") == f"{flywheel_root}/raw"
    assert "FLYWHEEL_PROJECT" not in os.environ


def test_mlflow_itself_keeps_a_projects_runs_from_other_projects_members(tmp_path: Path) -> None:
    """The real tracking server with basic auth: a viewer of `search` reads its runs and model through MLflow's
    REST API and cannot write them; `disputes`' runs and model are refused to them; an editor of `disputes`
    writes there only; a removed member loses what they had, also when removed while the server was down.
    (Mutations: default_permission READ in mlflow/basic_auth.ini lets the viewer read `disputes`; `sync` revoking
    only the `removed` it is given leaves dave's grant after the offline removal.)"""
    import httpx
    from helpers import run_flywheel
    from ports import free_port

    env = {"FLYWHEEL_ROOT": str(tmp_path), "FLYWHEEL_MLFLOW__PORT": str(free_port())}
    url = f"http://127.0.0.1:{env['FLYWHEEL_MLFLOW__PORT']}"
    for args in (
        ("project", "create", "search", "--owner", "alice"),
        ("project", "create", "disputes", "--owner", "bob"),
    ):
        assert run_flywheel(*args, env=env).returncode == 0
    started = run_flywheel("up", "--only", "mlflow", "--json", env=env, timeout=300)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        assert set(json.loads(started.stdout)["mlflow"]["projects"]) == {"default", "search", "disputes"}
        import psutil  # MLflow's job runner (six huey consumers polling, ~40 CPU-seconds a start) stays off

        def command(process: psutil.Process) -> str:
            try:
                return " ".join(process.cmdline())
            except psutil.Error:  # gone meanwhile
                return ""

        server = psutil.Process(json.loads(started.stdout)["mlflow"]["pid"])
        children = [command(c) for c in server.children(recursive=True)]
        assert children and not [c for c in children if "huey" in c or "mlflow.server.jobs" in c], children
        for user, project, role in (("carol", "search", "viewer"), ("dave", "disputes", "editor")):
            added = run_flywheel("project", "members", project, "add", user, "--role", role, "--json", env=env)
            assert added.returncode == 0 and "MLflow permissions set" in json.loads(added.stdout)["access"], (
                added.stderr
            )

        def login(user: str) -> tuple[str, str]:
            name = "runs/mlflow-admin.password" if user == "admin" else f"runs/users/{user}.password"
            return user, (tmp_path / name).read_text().strip()

        def call(user: str, method: str, path: str, **kw) -> httpx.Response:
            return httpx.request(method, f"{url}/api/2.0/mlflow/{path}", auth=login(user), timeout=30, **kw)

        ids = {
            e["name"]: e["experiment_id"]
            for e in call("admin", "POST", "experiments/search", json={"max_results": 50}).json()["experiments"]
        }
        search, disputes = ids["commerce-flywheel--search"], ids["commerce-flywheel--disputes"]
        for exp in (search, disputes):
            assert call("admin", "POST", "runs/create", json={"experiment_id": exp}).status_code == 200
        for name in ("commerce-tool-caller--search", "commerce-tool-caller--disputes"):
            assert call("admin", "POST", "registered-models/create", json={"name": name}).status_code == 200

        seen = call("carol", "POST", "runs/search", json={"experiment_ids": [search]})
        assert seen.status_code == 200 and len(seen.json()["runs"]) == 1
        other = call("carol", "POST", "runs/search", json={"experiment_ids": [disputes]})
        assert other.status_code == 403 or other.json().get("runs", []) == []
        assert call("carol", "GET", "experiments/get", params={"experiment_id": disputes}).status_code == 403
        assert (
            call("carol", "GET", "registered-models/get", params={"name": "commerce-tool-caller--disputes"}).status_code
            == 403
        )
        assert (
            call("carol", "GET", "registered-models/get", params={"name": "commerce-tool-caller--search"}).status_code
            == 200
        )
        assert call("carol", "POST", "runs/create", json={"experiment_id": search}).status_code == 403  # a viewer
        assert call("dave", "POST", "runs/create", json={"experiment_id": disputes}).status_code == 200  # an editor
        assert call("dave", "POST", "runs/create", json={"experiment_id": search}).status_code == 403
        listed = call("carol", "POST", "experiments/search", json={"max_results": 50}).json().get("experiments", [])
        assert [e["name"] for e in listed] == ["commerce-flywheel--search"]

        removed = run_flywheel("project", "members", "search", "remove", "carol", env=env)
        assert removed.returncode == 0, removed.stderr
        gone = call("carol", "POST", "runs/search", json={"experiment_ids": [search]})
        assert gone.status_code == 403 or gone.json().get("runs", []) == []

        # removed while the tracking server is down: the next `flywheel up` converges (the grant is not in the
        # member list, so it goes), whoever removed the member and whenever (issue: grants were deltas)
        assert run_flywheel("down", env=env, timeout=120).returncode == 0
        offline = run_flywheel("project", "members", "disputes", "remove", "dave", "--json", env=env)
        assert offline.returncode == 0 and "when the tracking server starts" in json.loads(offline.stdout)["access"]
        again = run_flywheel("up", "--only", "mlflow", "--json", env=env, timeout=300)
        assert again.returncode == 0, again.stderr[-2000:]
        assert call("dave", "POST", "runs/create", json={"experiment_id": disputes}).status_code == 403
        assert call("dave", "GET", "experiments/get", params={"experiment_id": disputes}).status_code == 403
        assert call("bob", "GET", "experiments/get", params={"experiment_id": disputes}).status_code == 200  # owner
    finally:
        run_flywheel("down", env=env, timeout=120)


def test_what_runs_elsewhere_knows_its_project(tmp_path: Path) -> None:
    """The gateway process gets the platform's settings whatever project its command ran in (a project's
    names scoped twice would route its key nowhere); a training pod of a project's run trains that project."""
    from pipelines.cluster import training as kubernetes
    from pipelines.gateway.app import _settings_file
    from pipelines.projects import settings_for

    scoped = settings_for(load_settings(root=str(tmp_path)), "search")
    written = load_settings(**json.loads(_settings_file(scoped).read_text()))
    assert (written.project, written.triton.model_name, written.mlflow.experiment) == (
        "default",
        "tool_router",
        "commerce-flywheel",
    )
    assert settings_for(written, "search").triton.model_name == "search__tool_router"
    pod = kubernetes.variant_pod(scoped, sweep={"name": "demo"}, sweep_id="s1", index=0, gpus=1)
    command = pod["spec"]["containers"][0]["command"]
    assert command[command.index("--project") + 1] == "search"


def test_a_delete_reads_the_members_it_buries_under_the_registry_lock(tmp_path: Path, monkeypatch) -> None:
    """A member added just before the delete takes the registry's lock is in the tombstone (and so loses MLflow
    access at the next sync). (Mutation: reading the members before the lock, as before, leaves eve out.)"""
    from pipelines.projects import registry

    settings = load_settings(root=str(tmp_path))
    registry.create(settings, "search", "alice")
    real = registry._change

    def another_operator_first(settings_, change, tombstones=None):
        if tombstones is not None:  # the delete's change: another operator adds a member just before it
            real(settings_, lambda projects: projects["search"].members.update({"eve": "viewer"}))
        return real(settings_, change, tombstones)

    monkeypatch.setattr(registry, "_change", another_operator_first)
    result = registry.delete(settings, "search")
    assert result["members"] == ["alice", "eve"] and registry.deleted(settings)["search"]["members"] == ["alice", "eve"]


def test_storage_is_billed_to_the_project_that_owns_it_not_to_default(tmp_path: Path) -> None:
    """The shared Triton repository, its adapters and the MLflow artifact store lie under the platform's zones:
    each project is billed its own models and artifacts, `default` only its own. (Mutation: `storage` measuring
    each zone whole, as before, bills default for search's model and artifacts.)"""
    from pipelines.clients import mlflow as mlflow_client
    from pipelines.projects import registry, settings_for, showback

    settings = load_settings(root=str(tmp_path))
    registry.create(settings, "search", "alice")
    search = settings_for(settings, "search")
    repository = Path(str(settings.triton.model_repository))
    for name, size in (("tool_router_v1", 1000), ("search__tool_router_v1", 7000)):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "weights").write_bytes(b"w" * size)
    adapters = repository.parent / "lora_adapters" / "search__tool_router_v2"
    adapters.mkdir(parents=True)
    (adapters / "adapter.safetensors").write_bytes(b"a" * 3000)
    for scoped, size in ((settings, 200), (search, 5000)):
        mlflow_client.use_tracking(scoped)  # each project's experiment, its artifacts where the store puts them
        where = showback._own_artifacts(scoped)
        assert where is not None
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / "adapter.bin").write_bytes(b"x" * size)
    mine, platform = showback.storage(search), showback.storage(settings)
    assert mine["serving"] >= 7000 + 3000 and mine["runs"] >= 5000
    assert 1000 <= platform["serving"] < 7000  # its own model, never search's
    (Path(str(showback._own_artifacts(search))) / "more.bin").write_bytes(b"y" * 4000)  # search's runs grow
    assert showback.storage(search)["runs"] == mine["runs"] + 4000
    assert showback.storage(settings)["runs"] == platform["runs"]  # the platform's (its store) does not
