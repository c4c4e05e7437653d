"""Serving faults on the real Triton server: deploy and rollback at once, a smoke test that an empty
answer fails, a corrupt or deleted serving state, and tritonserver killed between a model's load and
the switch of traffic to it. For each: the live model keeps answering (or the right one is restored),
state.json is never lost or half-written, and the user gets one clear message.

(A Triton restart while a model is live: tests/test_serve.py::test_a_restart_while_a_model_is_live_keeps_it_live.)
One module-scoped server and two registered tiny-model versions serve every test here."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import run_flywheel
from serving_fixtures import registered  # noqa: F401 (module-scoped: v1 champion, v2 candidate, a server)

pytestmark = pytest.mark.slow


def _state_file(settings) -> Path:
    return Path(settings.zone("serving")) / "state.json"


def _name(version: str) -> str:
    return f"tool_router_v{version}"


def _live_answers(settings) -> str:
    """The live model's name, after it answered one real request through the client."""
    from pipelines.serve import deploy
    from pipelines.serve.client import TritonClient
    from pipelines.serve.prompts import conversation

    live = deploy.live_model(settings)
    assert live is not None, "precondition: a deploy records a live model (fails when the serving state has none)"
    client = TritonClient(settings, timeout_s=120)
    try:
        reply = client.infer_one(live.name, conversation(deploy.smoke_rows(settings, 1)[0], live.prompt_style))
    finally:
        client.close()
    assert reply.error is None and reply.output_tokens > 0, reply
    return live.name


def _serving(settings, live: str, previous: str | None = None) -> None:
    """Make `live` the live version (and `previous` the previous one) with the fewest deploys."""
    from pipelines.serve import deploy

    current = deploy.state(settings)
    names = ((current.get("live") or {}).get("name"), (current.get("previous") or {}).get("name"))
    if names == (_name(live), _name(previous) if previous else names[1]):
        deploy.deploy(settings, version=live)  # reloads it if the server lost it
        return
    if previous:
        deploy.deploy(settings, version=previous)
    deploy.deploy(settings, version=live)


def _cli_env(settings) -> dict[str, str]:
    t = settings.triton
    return {
        "FLYWHEEL_ROOT": str(settings.root),
        "FLYWHEEL_TRITON__HTTP_PORT": str(t.http_port),
        "FLYWHEEL_TRITON__GRPC_PORT": str(t.grpc_port),
        "FLYWHEEL_TRITON__METRICS_PORT": str(t.metrics_port),
    }


def _one_error_line(result, *needles: str) -> str:
    """The CLI failed with exit 2 and exactly one `error:` line on stderr naming every needle."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _kill_triton(settings) -> None:
    """SIGKILL tritonserver's whole process group (its Python stubs too) and wait until it is gone."""
    from pipelines import services

    pid = services.read_pid(str(settings.root), "triton")
    assert pid is not None, "precondition: Triton left its pid file (fails when the server was not started by us)"
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while services.group_alive(pid):
        assert time.monotonic() < deadline, f"triton process group {pid} survived SIGKILL for 30 s"
        services._reap(pid)  # it is this process's child: collect it, or it stays a zombie in the group
        time.sleep(0.1)


# --- deploy and rollback at once ------------------------------------------------------------------
def test_deploy_and_rollback_at_once_on_the_real_server(registered, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A rollback that comes in during a deploy's smoke test waits for it, then swaps: both events are
    in the history, `live` is what the last one says, and that model answers."""
    from pipelines.serve import deploy

    settings, v1, v2 = registered["settings"], registered["v1"], registered["v2"]
    _serving(settings, live=v1, previous=v2)
    before = len(deploy.state(settings)["history"])
    smoking, original = threading.Event(), deploy.smoke_test

    def slow_smoke(settings, client, entry):
        smoking.set()
        time.sleep(1.0)  # the rollback arrives while the deploy holds the state's lock
        return original(settings, client, entry)

    monkeypatch.setattr(deploy, "smoke_test", slow_smoke)
    errors: list[BaseException] = []

    def run(call):
        try:
            call()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    deploying = threading.Thread(target=run, args=(lambda: deploy.deploy(settings, version=v2),))
    deploying.start()
    assert smoking.wait(120), "the deploy never reached its smoke test"
    rolling = threading.Thread(target=run, args=(lambda: deploy.rollback(settings),))
    rolling.start()
    deploying.join(300), rolling.join(300)
    assert not deploying.is_alive() and not rolling.is_alive(), "deploy or rollback hung"
    assert not errors, errors
    current = json.loads(_state_file(settings).read_text())  # plain, valid JSON
    events = [(e["event"], e["name"]) for e in current["history"][before:]]
    # the rollback waited for the deploy's lock: without it, the deploy's save would drop the rollback's event
    assert events == [("deployed", _name(v2)), ("rollback", _name(v1))]
    assert current["live"]["name"] == _name(v1) and current["previous"]["name"] == _name(v2)
    assert _live_answers(settings) == _name(v1)


# --- the smoke test at smoke_min_valid_json 0 ------------------------------------------------------
def test_an_empty_answer_fails_the_smoke_test_even_without_a_json_bar(registered, monkeypatch) -> None:  # noqa: F811
    """The DAG tests deploy untrained models at triton.smoke_min_valid_json 0; the smoke test still
    requires every reply to be well formed, so a model that answers nothing is not switched to."""
    from pipelines.serve import deploy
    from pipelines.serve.client import Reply, TritonClient

    settings, v1, v2 = registered["settings"], registered["v1"], registered["v2"]
    assert settings.triton.smoke_min_valid_json == 0
    _serving(settings, live=v1)

    class Mute(TritonClient):
        def infer(self, model, conversations, concurrency=1, tools=None):
            replies = super().infer(model, conversations, concurrency, tools)  # the real server answers ...
            return [
                Reply(
                    "" if model == _name(v2) else r.text,
                    r.prompt_tokens,
                    0 if model == _name(v2) else r.output_tokens,
                    r.latency_ms,
                    r.error,
                )
                for r in replies
            ]  # ... v2 says nothing

    monkeypatch.setattr(deploy, "TritonClient", Mute)
    with pytest.raises(deploy.DeployFailed, match=r"3 of 3 replies were empty.*`live` stays tool_router_v") as caught:
        deploy.deploy(settings, version=v2)
    assert "\n" not in str(caught.value)
    monkeypatch.undo()
    current = deploy.state(settings)
    assert current["live"]["name"] == _name(v1) and current["history"][-1]["event"] == "deploy_failed"
    assert _live_answers(settings) == _name(v1)


# --- a corrupt or deleted state.json ----------------------------------------------------------------
def test_a_corrupt_state_file_is_one_clear_error_everywhere_and_left_as_it_is(registered) -> None:  # noqa: F811
    from pipelines.serve import deploy

    settings, v1 = registered["settings"], registered["v1"]
    _serving(settings, live=v1)
    path = _state_file(settings)
    good = path.read_bytes()
    garbage = b'\x00\xff\xfe{"live": {"name": "tool_rou\x93ter_v1"' + os.urandom(16)
    path.write_bytes(garbage)
    try:
        for call in (
            lambda: deploy.deploy(settings, version=v1),
            lambda: deploy.rollback(settings),
            lambda: deploy.live_model(settings),
        ):
            with pytest.raises(deploy.StateCorrupt, match=f"{path} is not valid JSON.*delete it") as caught:
                call()
            assert "\n" not in str(caught.value)
        env = _cli_env(settings)
        for args in (("rollback",), ("serve", "status"), ("deploy", "--version", v1)):
            _one_error_line(run_flywheel(*args, env=env, timeout=180), str(path), "not valid JSON")
        assert path.read_bytes() == garbage  # nothing "repaired" it behind the user's back
    finally:
        path.write_bytes(good)
    assert _live_answers(settings) == _name(v1)  # the server never stopped serving the live model


def test_a_deleted_state_file_means_no_live_model_and_a_deploy_recreates_it(registered) -> None:  # noqa: F811
    from pipelines.serve import deploy

    settings, v1 = registered["settings"], registered["v1"]
    _serving(settings, live=v1)
    path = _state_file(settings)
    path.unlink()
    assert deploy.live_model(settings) is None
    with pytest.raises(deploy.DeployFailed, match="nothing to roll back to"):
        deploy.rollback(settings)
    env = _cli_env(settings)
    _one_error_line(run_flywheel("rollback", env=env, timeout=180), "nothing to roll back to")
    status = run_flywheel("serve", "status", "--json", env=env, timeout=180)
    assert status.returncode == 0, status.stderr[-2000:]
    row = json.loads(status.stdout)
    assert row["healthy"] and row["live"] is None and _name(v1) in row["loaded"]
    assert not path.exists()  # reading it created nothing

    result = deploy.deploy(settings, "champion")
    assert result["deployed"] == _name(v1) and result["previous"] is None
    current = json.loads(path.read_text())
    assert current["live"]["name"] == _name(v1) and [e["event"] for e in current["history"]] == ["deployed"]
    assert _live_answers(settings) == _name(v1)


# --- tritonserver killed between load and switch ------------------------------------------------------
@pytest.mark.parametrize("moment", ["after_load", "after_smoke_test"])
def test_triton_killed_between_load_and_switch_keeps_the_live_model(registered, monkeypatch, moment) -> None:  # noqa: F811
    """SIGKILL the server right after it loaded v2 (before the smoke test), or right after v2 passed
    its smoke test (before the switch): the deploy fails with one line, state.json still names v1 live
    and is whole, and after `serve up` a deploy of the champion serves v1 again."""
    from pipelines.serve import deploy
    from pipelines.serve.client import TritonClient
    from pipelines.stack import triton as server

    settings, v1, v2 = registered["settings"], registered["v1"], registered["v2"]
    _serving(settings, live=v1)
    before = json.loads(_state_file(settings).read_text())
    killed: list[str] = []

    class Dying(TritonClient):
        def load(self, name):
            super().load(name)
            if moment == "after_load" and name == _name(v2):
                _kill_triton(settings)
                killed.append(name)

    original = deploy.smoke_test

    def smoke_then_die(settings, client, entry):
        smoke = original(settings, client, entry)
        if moment == "after_smoke_test" and entry.name == _name(v2):
            assert smoke["errors"] == 0, smoke
            _kill_triton(settings)
            killed.append(entry.name)
        return smoke

    monkeypatch.setattr(deploy, "TritonClient", Dying)
    monkeypatch.setattr(deploy, "smoke_test", smoke_then_die)
    with pytest.raises(
        deploy.DeployFailed,
        match=r"tool_router_v\d+ was not switched to \(Triton stopped serving it"
        r".*server down.*`flywheel serve up`",
    ) as caught:
        deploy.deploy(settings, version=v2)
    monkeypatch.undo()
    assert killed == [_name(v2)] and "\n" not in str(caught.value)
    assert f"`live` stays {_name(v1)}" in str(caught.value)
    after = json.loads(_state_file(settings).read_text())  # whole, valid JSON
    assert after["live"] == before["live"] and after["previous"] == before["previous"]
    assert after["history"][-1]["event"] == "deploy_failed" and after["history"][-1]["name"] == _name(v2)
    leftovers = sorted(p.name for p in _state_file(settings).parent.iterdir() if "state" in p.name)
    assert leftovers == ["state.json", "state.json.lock"]  # no temporary file of a half-done write

    assert server.up(settings).healthy
    result = deploy.deploy(settings, "champion")
    assert result["unchanged"] and result["reloaded"] and result["smoke"]["errors"] == 0
    assert deploy.live_model(settings).name == _name(v1) and _live_answers(settings) == _name(v1)
