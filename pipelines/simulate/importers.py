"""Importers: real public commerce data -> our log format, through the same prep as everything else.

WebShop (princeton-nlp, MIT): crowd-written shopping instructions and the search query a person
actually typed for each; every pair becomes a `search_products` turn of the search agent. The
files are read from where they are (e.g. ../shared/data); nothing is copied into the repository.
"""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import orjson

from pipelines import storage
from pipelines.errors import DataProblem
from pipelines.logs.tools import effect_of
from pipelines.simulate import catalogue as cat
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator, _iso, _system_prompt, partition_dir
from pipelines.simulate.retail import RETAIL_EFFECTS


def import_id(*sources: Path, seed: int = 0) -> str:
    """One import's name: a digest of its source files and seed. Two imports of other files into the same
    day append side by side (their file names and record ids differ); the same import again rewrites its
    own file with the same ids (safe to retry, nothing doubled)."""
    digest = hashlib.sha256(str(seed).encode())
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:10]


def webshop_to_raw(pairs_file: Path, raw_root: Path, day: date, seed: int = 0) -> dict[str, int | str]:
    """instruction_to_query*.json ({instruction: [queries]}) -> raw/dt=DAY/webshop-<import id>.jsonl."""
    if not pairs_file.is_file():
        raise FileNotFoundError(f"no WebShop pairs file at {pairs_file}")
    ident = import_id(pairs_file, seed=seed)
    pairs = json.loads(pairs_file.read_text(encoding="utf-8"))
    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=0, end_date=day))
    rng = random.Random(seed)
    customers = cat.customers(5000)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
    total = sum(len(q) for q in pairs.values())
    lines, n = [], 0
    for s, (instruction, queries) in enumerate(sorted(pairs.items())):
        customer = customers[rng.randrange(len(customers))]
        session_id = f"webshop_{ident}_{s:06d}"
        for k, query in enumerate(queries):
            messages = [
                {"role": "system", "content": _system_prompt("search_discovery", day)},
                {"role": "user", "content": " ".join(instruction.split())},
            ]
            arguments = orjson.dumps({"query": query.strip()[:200]}).decode()
            assistant = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_webshop_{s}_{k}",
                        "type": "function",
                        "function": {"name": "search_products", "arguments": arguments},
                    }
                ],
            }
            record = gen.record(session_id, k, customer, "search_discovery", messages, assistant, "tool_calls")
            record["record_id"] = f"webshop_{ident}_{s:06d}_{k}"
            record["label_source"], record["feedback"] = "import", "none"  # a person's query, not a rated answer
            record["timestamp"] = _iso(start + 86_399.0 * n / max(total, 1))
            lines.append(orjson.dumps(record))
            n += 1
    target = partition_dir(raw_root, day) / f"webshop-{ident}.jsonl"
    storage.write_bytes(str(target), b"\n".join(lines) + (b"\n" if lines else b""))
    return {"instructions": len(pairs), "records": n, "file": str(target), "import_id": ident}


RETAIL_TOOLSET = "retail"
SKIPPED_RETAIL_ACTIONS = {"think"}  # a scratchpad, not a call the agent makes on the shop


UNRECORDED = json.dumps({"result": "not recorded by the source"})  # a write's result without the database


def retail_to_raw(
    tools_file: Path, tasks_file: Path, raw_root: Path, day: date, seed: int = 0, db_file: Path | None = None
) -> dict[str, Any]:
    """tau-bench retail tasks (instruction + expected write actions) -> turns under their own tool schemas.

    Each task is a session: the user's request, then one turn per step (each step a target), with the earlier
    calls and their results in the history. With the source's `db_file` (tau-bench's db.json) each task is the
    gold replay the episodes judge against (`simulate.environments.replay` over `simulate.retail_env`): identify
    the customer, read their profile, each order it acts on and each product whose variant changes, then the
    writes, every result the environment's real answer on a per-task copy, shown as the episodes show it. A task
    whose gold the database refuses is skipped with its reason (counted in the result), never trained on.
    Without the database only the writes remain, and their tool messages say the source did not record a result
    (`UNRECORDED`), never an empty `{}` that looks like a real answer. The tools are registered as the `retail`
    toolset, so prep validates the calls against their schemas.
    """
    from pipelines.logs.toolsets import register_toolset

    for f in (tools_file, tasks_file, *([db_file] if db_file else [])):
        if not f.is_file():
            raise FileNotFoundError(f"no such file: {f}")
    ident = import_id(tools_file, tasks_file, *([db_file] if db_file else []), seed=seed)
    tools = json.loads(tools_file.read_text(encoding="utf-8"))
    offered = {t.get("function", {}).get("name") for t in tools}
    tasks = [json.loads(line) for line in tasks_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    sessions, skipped = _retail_sessions(tasks, offered, db_file)
    if tasks and not sessions:  # before anything is written: nothing registered, no empty file left behind
        raise DataProblem(
            f"the database refuses every task's gold (first: {skipped[0]['reason']}): "
            f"is {db_file} these tools' database?"
        )
    _, undeclared = register_toolset(str(raw_root), RETAIL_TOOLSET, tools, RETAIL_EFFECTS)
    writer = SessionWriter(day, seed, tools, f"retail_{ident}", "import")  # the benchmark's expected calls
    for s, task, steps in sessions:
        writer.session(f"{s:05d}", task["instruction"], steps)
    target = partition_dir(raw_root, day) / f"retail-{ident}.jsonl"
    storage.write_bytes(str(target), writer.data())
    n = writer.records
    return {
        "tasks": len(tasks),
        "records": n,
        "file": str(target),
        "import_id": ident,
        "toolset": RETAIL_TOOLSET,
        "reads": writer.effects["read"],
        "writes": writer.effects["write"],
        "results_from_db": n - writer.unrecorded,
        "results_not_recorded": writer.unrecorded,
        "tasks_skipped": len(skipped),
        "skipped": skipped[:20],
        "undeclared_tools_treated_as_writes": undeclared,
    }


def _retail_sessions(
    tasks: list[dict[str, Any]], offered: set[str], db_file: Path | None
) -> tuple[list[tuple[int, dict[str, Any], list[tuple[dict[str, Any], str, str]]]], list[dict[str, Any]]]:
    """Each task's steps [(call, result, read or write)], and the tasks skipped with their reasons."""
    from pipelines.simulate.environments import replay
    from pipelines.simulate.retail_env import RetailEnvironment

    env = RetailEnvironment(json.loads(db_file.read_text(encoding="utf-8"))) if db_file else None
    sessions, skipped = [], []
    for s, task in enumerate(tasks):
        actions = [
            {"name": a.get("name"), "arguments": a.get("arguments") or {}}
            for a in task.get("actions") or []
            if a.get("name") not in SKIPPED_RETAIL_ACTIONS
        ]
        if env is None:
            sessions.append((s, task, [(a, UNRECORDED, str(effect_of(a["name"], RETAIL_EFFECTS))) for a in actions]))
            continue
        gold = replay(env, task, actions, offered)
        if isinstance(gold, str):
            skipped.append({"task": s, "reason": gold})
        else:
            sessions.append((s, task, [(call, step.observation, effect) for call, step, effect in gold.path]))
    return sessions, skipped


class SessionWriter:
    """Multi-turn sessions as raw log records, one per step: the request with every earlier call and its result
    in the history, the step's call as the answer, `label_source` saying who wrote the calls. The importer's
    tasks and the episodes' verified trajectories (`evaluate.episode_data`) are written by this one builder."""

    def __init__(
        self, day: date, seed: int, tools: list[dict[str, Any]], prefix: str, label_source: str, model: str = ""
    ):
        self.day, self.tools, self.prefix, self.label_source, self.model = day, tools, prefix, label_source, model
        self.gen = TrafficGenerator(GeneratorConfig(seed=seed, records=0, end_date=day))
        self.customers = cat.customers(5000)
        self.rng = random.Random(seed)
        self.system = {
            "role": "system",
            "content": f"You are the retail agent of a commerce assistant. Today is {day}.",
        }
        self.pending: list[dict[str, Any]] = []
        self.records, self.unrecorded = 0, 0
        self.effects = {"read": 0, "write": 0}

    def session(
        self, key: str, instruction: str, steps: list[tuple[dict[str, Any], str, str]], model: str | None = None
    ) -> None:
        """One session; `model`: who wrote its calls, when not the writer's `model`."""
        model = self.model if model is None else model
        customer = self.customers[self.rng.randrange(len(self.customers))]
        session_id = f"{self.prefix}_{key}"
        history: list[dict] = [self.system, {"role": "user", "content": " ".join(instruction.split())}]
        for k, (action, result, effect) in enumerate(steps):
            call_id = f"call_{session_id}_{k}"
            function = {"name": action["name"], "arguments": orjson.dumps(action["arguments"]).decode()}
            assistant = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
            record = self.gen.record(session_id, k, customer, "orders", list(history), assistant, "tool_calls")
            record["request"]["tools"] = self.tools
            record["record_id"] = f"{session_id}_{k}"
            record["label_source"], record["feedback"] = self.label_source, "none"
            if model:  # who wrote the calls (default: the generator's teacher name, as the importer's tasks)
                record["model"] = model
            self.pending.append(record)
            history += [assistant, {"role": "tool", "tool_call_id": call_id, "content": result}]
            self.effects[effect if effect in self.effects else "write"] += 1
            self.unrecorded += result == UNRECORDED
            self.records += 1

    def data(self) -> bytes:
        """The records as JSON lines, their timestamps spread over the day in order."""
        start = datetime(self.day.year, self.day.month, self.day.day, tzinfo=UTC).timestamp()
        total = max(len(self.pending), 1)
        lines = []
        for n, record in enumerate(self.pending):
            record["timestamp"] = _iso(start + 86_399.0 * n / total)
            lines.append(orjson.dumps(record))
        return b"\n".join(lines) + (b"\n" if lines else b"")
