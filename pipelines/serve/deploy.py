"""Deploy and rollback on a running Triton server (the canary: `canary.py`).

Traffic goes to the model named `live` in `<serving zone>/state.json`; the client side resolves
it (`live_model`). A deployment loads the new version next to the live one, smoke-tests it with
real test-split requests, and only then moves `live` (the old one becomes `previous` and stays
loaded, so `rollback` is a pointer swap: seconds). If loading or the smoke test fails, the new
model is unloaded, `live` does not move and the reason is raised and recorded. Every
read-modify-write of state.json (deploy, rollback, canary) holds its file lock (`state_lock`), so
a rollback during a deploy's smoke test waits instead of being overwritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipelines.config import Settings
from pipelines.errors import NotRetryable
from pipelines.locks import advisory_key, shared_lock
from pipelines.serve import repository, shared_base
from pipelines.serve.client import Reply, TritonClient
from pipelines.serve.prompts import conversation, offered_tools
from pipelines.stack import triton as server
from pipelines.storage import Busy, is_local, lock_file, read_json, write_json


class DeployFailed(NotRetryable):
    """The new model did not load or failed its smoke test; the previous model keeps serving."""


class StateCorrupt(NotRetryable):
    """serving/state.json cannot be read as the serving state."""


class StateBusy(NotRetryable):
    """Another deploy, rollback or canary held the serving state's lock past the timeout."""


@dataclass
class Deployment:
    name: str
    version: str | None
    prompt_style: str
    deployed_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


def _state_uri(settings: Settings) -> str:
    return f"{settings.zone('serving')}/state.json"


def state_stamp(settings: Settings) -> tuple[int, int, int] | None:
    """A cheap fingerprint of the serving state (a local file's mtime, size and inode: every write replaces
    the file), so a reader re-reads it only when it changed; None on object storage (re-read on a timer)."""
    uri = _state_uri(settings)
    if not is_local(uri):
        return None
    try:
        found = os.stat(uri.removeprefix("file://"))
    except FileNotFoundError:
        return (0, 0, 0)
    return (found.st_mtime_ns, found.st_size, found.st_ino)


def state(settings: Settings) -> dict[str, Any]:
    uri = _state_uri(settings)
    try:
        current = read_json(uri)
    except FileNotFoundError:
        return {"live": None, "previous": None, "history": []}
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise StateCorrupt(
            f"serving state {uri} is not valid JSON ({exc}): restore it (its last good content "
            f"names `live` and `previous`) or delete it and run `flywheel deploy`"
        ) from None
    if not (
        isinstance(current, dict)
        and all(isinstance(current.get(k), (dict, type(None))) for k in ("live", "previous"))
        and all(
            isinstance(current.get(k), dict) and "name" in current[k] for k in ("live", "previous") if current.get(k)
        )
    ):
        raise StateCorrupt(
            f"serving state {uri} is not a serving state (an object whose `live` and `previous` "
            f"are null or {{name, version, prompt_style}}): restore it or delete it and run "
            f"`flywheel deploy`"
        )
    return current


def lock_name(settings: Settings) -> str:
    """What guards the state's read-modify-writes: the lock file beside state.json locally, the advisory lock
    on `state_lock_uri`'s database for a serving zone on object storage (`pipelines.locks`)."""
    uri = _state_uri(settings)
    if is_local(uri) or not settings.state_lock_uri:
        return f"lock {lock_file(uri)}"
    return f"advisory lock {advisory_key(uri)}"


@contextlib.contextmanager
def state_lock(settings: Settings) -> Iterator[None]:
    """Hold the serving state's lock (every read-modify-write of state.json runs under it)."""
    wait = settings.triton.state_lock_timeout_s
    try:
        with shared_lock(_state_uri(settings), wait, "the serving state", settings.state_lock_uri):
            yield
    except Busy:
        raise StateBusy(
            f"the serving state {_state_uri(settings)} stayed locked by another deploy, rollback or "
            f"canary for {wait:.0f} s ({lock_name(settings)}): wait for it to finish, or raise "
            f"triton.state_lock_timeout_s"
        ) from None


def _save(settings: Settings, current: dict[str, Any], event: dict[str, Any]) -> None:
    current["history"] = [
        *current.get("history", []),
        {**event, "at": datetime.now(UTC).isoformat(timespec="seconds")},
    ][-50:]
    write_json(_state_uri(settings), current)


def live_model(settings: Settings) -> Deployment | None:
    live = state(settings).get("live")
    return Deployment(**live) if live else None


def smoke_rows(settings: Settings, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Real requests from the test split (with their training-time context), as plain dicts."""
    from pipelines.prep.dataset import load_split

    return load_split(settings, "test", n, seed).to_dict("records")


def score_replies(rows: list[dict[str, Any]], replies: list[Reply]) -> dict[str, Any]:
    """Quality and latency of served answers against the rows' logged tool calls. Every request
    counts: an errored one is a wrong (invalid) answer and a latency sample at the time it took."""
    from pipelines.toolcall import score as metrics
    from pipelines.toolcall.calls import call_text

    scores = [
        # a reply has its text unless it errored
        metrics.score(
            rep.text if rep.error is None and rep.text is not None else "", json.loads(call_text(r["target_json"]))
        )
        for r, rep in zip(rows, replies)
    ]
    answered = [rep for rep in replies if rep.error is None]
    latencies = [rep.latency_ms for rep in replies]
    summary = metrics.summarize(scores) if scores else {}
    return {
        "requests": len(rows),
        "errors": len(replies) - len(answered),
        "empty": sum(1 for rep in answered if not (rep.text or "").strip() or rep.output_tokens <= 0),
        "first_error": next((" ".join(rep.error.split()) for rep in replies if rep.error), None),
        "valid_json": summary.get("json_valid", 0.0),
        "exact_match": summary.get("exact_match", 0.0),
        "name_accuracy": summary.get("name_accuracy", 0.0),
        "latency_ms_p50": round(statistics.median(latencies), 1) if latencies else None,
        "prompt_tokens_mean": round(statistics.fmean(rep.prompt_tokens for rep in answered), 1) if answered else None,
        "wrong_writes": sum(1 for s in scores if s.wrong_write),
        "exact": [int(s.exact_match) for s in scores],  # each request's, in the rows' order (paired comparisons)
    }


def smoke_test(settings: Settings, client: TritonClient, entry: Deployment) -> dict[str, Any]:
    rows = smoke_rows(settings, settings.triton.smoke_requests)
    tools = offered_tools(settings, rows, client, entry.name)
    replies = client.infer(entry.name, [conversation(r, entry.prompt_style) for r in rows], tools=tools)
    return {**score_replies(rows, replies), "constrained": tools is not None}


def smoke_failure(settings: Settings, smoke: dict[str, Any]) -> str | None:
    """Why a smoke test failed, or None. Every reply must be well formed (no error, a non-empty
    answer) whatever `smoke_min_valid_json` says; that share of parseable answers is the quality bar
    on top (0 only for untrained test models, which cannot write JSON; quality is the gate's job)."""
    if smoke["errors"]:
        return f"{smoke['errors']} of {smoke.get('requests')} requests failed (first: {smoke.get('first_error')})"
    if smoke.get("empty"):
        return f"{smoke['empty']} of {smoke.get('requests')} replies were empty"
    if smoke["valid_json"] < settings.triton.smoke_min_valid_json:
        return (
            f"valid JSON {smoke['valid_json']:.0%} < triton.smoke_min_valid_json "
            f"{settings.triton.smoke_min_valid_json:.0%}"
        )
    return None


def _server_lost(settings: Settings, client: TritonClient, name: str) -> str | None:
    """A one-line reason when the server stopped answering (or dropped `name`) mid-deployment."""
    if client.ready(name):
        return None
    state_of = "up" if server.status(settings).healthy else "down"
    return (
        f"Triton stopped serving it during the deployment (server {state_of}): `flywheel serve up`, "
        f"then `flywheel deploy` loads the live model again"
    )


def deploy(settings: Settings, alias: str = "champion", *, version: str | None = None) -> dict[str, Any]:
    """Put a registered version (by alias or number) behind Triton, if it loads and passes the smoke test.
    When it is live already, make sure the server has it loaded (after a restart it has not): reload
    and smoke-test it, then answer unchanged. The whole read-modify-write of the state runs under its lock."""
    from pipelines.registry.models import alias_version

    version = version or alias_version(settings, alias)
    if version is None:
        raise DeployFailed(f"no model version has the alias '{alias}' in {settings.mlflow.registered_model}")
    server.up(settings)
    started = time.perf_counter()
    client = TritonClient(settings)
    try:
        with state_lock(settings):
            current = state(settings)
            name = repository.triton_name(settings, version)
            model = shared_base.build_serving(
                settings, version, in_use=_in_use(current, client, name), is_loaded=client.ready
            )
            entry = Deployment(model.name, version, model.prompt_style)
            if current.get("live") and current["live"]["name"] == entry.name:
                return _ensure_loaded(settings, client, current, Deployment(**current["live"]), started)
            previous = current.get("live")
            try:
                client.load(entry.name)
            except Exception as exc:  # noqa: BLE001 (the server's reason goes into the error)
                _retire(settings, client, current, entry.name)
                _save(
                    settings,
                    current,
                    {"event": "deploy_failed", "name": entry.name, "version": version, "reason": f"load: {exc}"},
                )
                raise DeployFailed(
                    f"{entry.name} did not load ({_one_line(exc)}); {_serving(current)} keeps serving"
                ) from None
            smoke = smoke_test(settings, client, entry)
            # the switch needs the new model still loaded: a server lost after the smoke test moves nothing
            lost = _server_lost(settings, client, entry.name)
            failure = lost or smoke_failure(settings, smoke)
            if failure:
                _retire(settings, client, current, entry.name)
                _save(
                    settings,
                    current,
                    {
                        "event": "deploy_failed",
                        "name": entry.name,
                        "version": version,
                        "reason": f"{failure}; smoke test: {smoke}",
                    },
                )
                raise DeployFailed(
                    f"{entry.name} was not switched to ({'' if lost else 'smoke test: '}{failure}); "
                    f"`live` stays {_serving(current)}"
                )
            current.update(live=asdict(entry), previous=previous)
            _save(settings, current, {"event": "deployed", "name": entry.name, "version": version, "smoke": smoke})
            keep = {entry.name, previous["name"] if previous else None, repository.triton_name(settings, None)}
            with contextlib.suppress(Exception):  # switched already: a lost server leaves extras loaded
                for loaded in client.loaded():  # only this project's own models: never another's, nor a shared base
                    if loaded not in keep and shared_base.is_own(settings, loaded):
                        _unload_quietly(client, loaded)
                shared_base.remove_adapters(
                    settings, keep={a for n in keep if n and (a := repository.split_name(n)[1])}
                )
    finally:
        client.close()
    return {
        "deployed": entry.name,
        "version": version,
        "previous": previous,
        "smoke": smoke,
        "stale_folder": model.stale,
        "seconds": round(time.perf_counter() - started, 1),
    }


def restore(settings: Settings) -> dict[str, Any]:
    """After a restart (a reboot, a crash, an upgrade): load what the serving state names, `live` and `previous`
    (kept for rollback), and smoke-test each, so the gateway answers with no `flywheel deploy` in between. The
    state itself never moves here. Raises DeployFailed (one line) when the live model cannot be brought back."""
    current = state(settings)
    wanted = {k: Deployment(**current[k]) for k in ("live", "previous") if current.get(k)}
    if not wanted:
        return {"restored": {}, "healthy": True, "note": "nothing deployed yet"}
    server.up(settings)
    client = TritonClient(settings)
    restored: dict[str, Any] = {}
    try:
        for role, entry in wanted.items():
            row: dict[str, Any] = {"name": entry.name, "version": entry.version, "was_loaded": client.ready(entry.name)}
            try:
                if not row["was_loaded"]:
                    client.load(entry.name)
                smoke = smoke_test(settings, client, entry)
                row.update(smoke=smoke, failure=smoke_failure(settings, smoke))
            except Exception as exc:  # noqa: BLE001 (a folder gone, a load refused: said, and the other kept)
                row["failure"] = f"failed to load or answer ({_one_line(exc)})"
            restored[role] = row
    finally:
        client.close()
    with state_lock(settings):
        _save(
            settings,
            state(settings),
            {"event": "restored", **{k: {"name": v["name"], "failure": v["failure"]} for k, v in restored.items()}},
        )
    live = restored.get("live")
    if live is not None and live["failure"]:
        raise DeployFailed(
            f"after the restart the live model {live['name']} could not be brought back: "
            f"{live['failure']}; `flywheel rollback` serves the previous one"
        )
    return {"restored": restored, "healthy": all(not v["failure"] for v in restored.values())}


def _in_use(current: dict[str, Any], client: TritonClient, name: str) -> bool:
    """The model is live, previous, or loaded on the server: its folder must not be rewritten."""
    return name in _serving_names(current) or client.ready(name)


def _ensure_loaded(
    settings: Settings, client: TritonClient, current: dict[str, Any], live: Deployment, started: float
) -> dict[str, Any]:
    """The requested version is live: answer unchanged once the server has it loaded (reload and
    smoke-test it when a restart dropped it; `live` never moves here)."""
    result = {"deployed": live.name, "version": live.version, "unchanged": True, "reloaded": False}
    if client.ready(live.name):
        return {**result, "state": current}
    try:
        client.load(live.name)
    except Exception as exc:  # noqa: BLE001
        _save(
            settings,
            current,
            {"event": "reload_failed", "name": live.name, "version": live.version, "reason": f"load: {exc}"},
        )
        raise DeployFailed(
            f"{live.name} is live but the server has not loaded it, and it did not load ({_one_line(exc)}): "
            f"check `flywheel serve status` and the Triton log"
        ) from None
    smoke = smoke_test(settings, client, live)
    event = {"name": live.name, "version": live.version, "smoke": smoke}
    failure = smoke_failure(settings, smoke)
    if failure:
        _save(settings, current, {"event": "reload_failed", **event})
        raise DeployFailed(
            f"{live.name} is live and was reloaded, but failed its smoke test ({failure}): "
            f"`flywheel rollback` serves the previous one"
        )
    _save(settings, current, {"event": "reloaded", **event})
    return {
        **result,
        "reloaded": True,
        "smoke": smoke,
        "state": current,
        "seconds": round(time.perf_counter() - started, 1),
    }


def rollback(settings: Settings, *, only_if_live: str | None = None) -> dict[str, Any]:
    """Serve the previous deployment again (a pointer swap; it is reloaded first if it was unloaded).
    `only_if_live`: roll back only while that model is still live (else DeployFailed)."""
    started = time.perf_counter()
    with state_lock(settings):
        current = state(settings)
        previous, live = current.get("previous"), current.get("live")
        if only_if_live is not None and (live or {}).get("name") != only_if_live:
            raise DeployFailed(f"not rolled back: {only_if_live} is no longer live ({_serving(current)} is)")
        if not previous:
            raise DeployFailed("nothing to roll back to: no previous deployment")
        client = TritonClient(settings)
        try:
            if not client.ready(previous["name"]):
                client.load(previous["name"])
        except Exception as exc:  # noqa: BLE001 (tritonclient's errors: a dead server, a broken folder)
            raise DeployFailed(
                f"not rolled back: {previous['name']} could not be loaded ({_one_line(exc)}); "
                f"{_serving(current)} stays live (is the server up? `flywheel serve up`)"
            ) from None
        finally:
            client.close()
        current.update(live=previous, previous=live)
        _save(settings, current, {"event": "rollback", "name": previous["name"], "version": previous["version"]})
    return {"live": previous, "previous": live, "seconds": round(time.perf_counter() - started, 2)}


def undeploy(settings: Settings) -> dict[str, Any]:
    """Take the project out of service: every one of its models the server has loaded (live, previous, a canary's
    candidate, any `v<N>` or its base) is unloaded and nothing is live (the gateway answers 404 for its
    aliases). The history is kept; `flywheel deploy` serves a version again. A server that cannot be reached
    changes nothing (DeployFailed)."""
    with state_lock(settings):
        current = state(settings)
        client = TritonClient(settings)
        try:
            try:
                loaded = set(client.loaded())
            except Exception as exc:  # noqa: BLE001 (tritonclient's errors: a dead server)
                raise DeployFailed(
                    f"not undeployed: the model server did not answer ({_one_line(exc)}); "
                    f"{_serving(current)} stays live (is it up? `flywheel serve up`)"
                ) from None
            names = sorted({n for n in loaded if shared_base.is_own(settings, n)} | (_serving_names(current) & loaded))
            for name in names:
                try:
                    client.unload(name)
                except Exception as exc:  # noqa: BLE001
                    raise DeployFailed(f"not undeployed: {name} could not be unloaded ({_one_line(exc)})") from None
        finally:
            client.close()
        removed = shared_base.remove_adapters(settings)  # a shared base refuses this project's adapters from now on
        current.update(live=None, previous=None)
        _save(settings, current, {"event": "undeploy", "names": names, "adapters_removed": removed})
    return {"unloaded": names, "adapters_removed": removed, "live": None}


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """A server's error text on one line (tritonclient messages can carry the server's multi-line log)."""
    return " ".join(str(exc).split())[:limit]


def _serving(current: dict[str, Any]) -> str:
    return current["live"]["name"] if current.get("live") else "nothing (no model was live)"


def _retire(settings: Settings, client: TritonClient, current: dict[str, Any], name: str) -> None:
    """A model that failed to deploy: unloaded; an adapter on a shared base also taken out of service (unless
    live or previous), so no route reaches it."""
    _unload_quietly(client, name)
    adapter = repository.split_name(name)[1]
    if adapter and name not in _serving_names(current):
        shared_base.remove_adapters(settings, only={adapter})


def _serving_names(current: dict[str, Any]) -> set[str]:
    """The names the serving state keeps: the live and the previous deployment's."""
    return {e["name"] for e in (current.get("live"), current.get("previous")) if e}


def _unload_quietly(client: TritonClient, name: str) -> None:
    try:
        client.unload(name)
    except Exception:  # noqa: BLE001, S110 (already gone)
        pass
