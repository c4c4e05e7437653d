"""Environments that episodes run against, one per toolset: the tools executed on a per-episode state.

An environment lives beside the toolset it serves (`simulate.retail_env` for tau-bench retail). A project with
its own tools plugs in its own: any class with this protocol, named in `episodes.environment` as
`package.module:Class` (built with the database file's JSON), or registered here under its toolset's name.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipelines.errors import DataProblem
from pipelines.logs.tools import effect_of


@dataclass(frozen=True)
class Step:
    """One tool call's outcome: the tool's own result string, what the model is shown of it, and whether the
    tool refused the call (an `Error: ...` line; the state is unchanged)."""

    result: str
    observation: str
    error: bool = False


class ToolFailed(Exception):  # noqa: N818 (an outcome the runner records, not a programming error)
    """A tool raised while running a call: the episode ends as failed with this message recorded."""


class Environment(Protocol):
    """`fork` another episode's environment over the same database; `reset` to it as shipped; `step` one call;
    `state_hash` of the state (equal states hash equal); `effects`: tool -> read or write; `gold_path`: the calls
    a policy-following agent makes for a task whose gold writes are `actions` (the actions themselves will do)."""

    name: str

    def fork(self) -> Environment: ...

    def reset(self) -> None: ...

    def effects(self) -> dict[str, str]: ...

    def gold_path(
        self, task: dict[str, Any], actions: list[dict[str, Any]], offered: set[str]
    ) -> list[dict[str, Any]]: ...

    def step(self, name: str, arguments: dict[str, Any]) -> Step: ...

    def state_hash(self) -> str: ...

    def snapshot(self) -> dict[str, Any]: ...

    def ends_episode(self, name: str) -> bool: ...

    def tool_names(self) -> list[str]: ...


@dataclass
class Replay:
    """A task's gold replayed: the state its actions leave (hash), and the trajectory a policy-following agent
    walks to it, each call with the environment's answer and its effect."""

    state_hash: str
    path: list[tuple[dict[str, Any], Step, str]]  # (call, the environment's answer, read or write)
    changes_state: bool


def replay(env: Environment, task: dict[str, Any], actions: list[dict[str, Any]], offered: set[str]) -> Replay | str:
    """The gold state (`actions` on a fresh copy) and the gold trajectory (`env.gold_path`) run on another, or
    why the task has none: a gold action the database refuses, or a trajectory that does not reach that state.
    The one replay both the episodes' gold and the importer's training trajectories come from."""
    env.reset()
    for action in actions:
        try:
            step = env.step(action["name"], action["arguments"])
        except ToolFailed as exc:
            return f"gold action {action['name']} fails: {exc}"
        if step.error:
            return f"gold action {action['name']} fails against the database: {step.result[:200]}"
    gold_hash = env.state_hash()
    env.reset()
    untouched = env.state_hash()
    effects = env.effects()
    path = []
    for call in env.gold_path(task, actions, offered):
        try:
            step = env.step(call["name"], call["arguments"])
        except ToolFailed as exc:
            return f"gold trajectory step {call['name']} fails: {exc}"
        path.append((call, step, str(effect_of(call["name"], effects))))
    if env.state_hash() != gold_hash:
        return "the gold trajectory does not reach the gold actions' state"
    return Replay(gold_hash, path, gold_hash != untouched)


class EnvironmentError_(DataProblem):  # noqa: N801 (not the builtin EnvironmentError)
    """The environment cannot be built: unknown name, unreadable database."""


# toolset name -> its environment class, as `package.module:Class` (imported when asked for)
ENVIRONMENTS: dict[str, str] = {"retail": "pipelines.simulate.retail_env:RetailEnvironment"}


def load_environment(name: str, db_file: Path) -> Environment:
    """The environment `name` (a registered toolset, or `package.module:Class`) over the database in `db_file`."""
    if not db_file.is_file():
        raise EnvironmentError_(f"episodes: no database file {db_file}")
    try:
        db = json.loads(db_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EnvironmentError_(f"episodes: {db_file} is not a JSON database ({exc})") from None
    path = ENVIRONMENTS.get(name, name)
    module, _, attr = path.partition(":")
    if not attr:
        raise EnvironmentError_(
            f"episodes.environment {name!r}: expected one of {', '.join(sorted(ENVIRONMENTS))} or package.module:Class"
        )
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise EnvironmentError_(f"episodes.environment {name!r}: {exc}") from None
    return factory(db)
