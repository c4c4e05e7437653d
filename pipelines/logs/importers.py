"""Importers: real public commerce data -> our log format, through the same prep as everything else.

WebShop (princeton-nlp, MIT): crowd-written shopping instructions and the search query a person
actually typed for each; every pair becomes a `search_products` turn of the search agent. The
files are read from where they are (e.g. ../shared/data); nothing is copied into the repository.
"""

from __future__ import annotations

import json
import random
from datetime import date, datetime, timezone
from pathlib import Path

import orjson

from pipelines.logs import catalogue as cat
from pipelines.logs.generator import GeneratorConfig, TrafficGenerator, _iso, _system_prompt, partition_dir


def webshop_to_raw(pairs_file: Path, raw_root: Path, day: date, seed: int = 0) -> dict[str, int | str]:
    """instruction_to_query*.json ({instruction: [queries]}) -> raw/dt=DAY/webshop.jsonl."""
    if not pairs_file.is_file():
        raise FileNotFoundError(f"no WebShop pairs file at {pairs_file}")
    pairs = json.loads(pairs_file.read_text(encoding="utf-8"))
    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=0, end_date=day))
    rng = random.Random(seed)
    customers = cat.customers(5000)
    start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()
    total = sum(len(q) for q in pairs.values())
    lines, n = [], 0
    for s, (instruction, queries) in enumerate(sorted(pairs.items())):
        customer = customers[rng.randrange(len(customers))]
        session_id = f"webshop_{seed}_{s:06d}"
        for k, query in enumerate(queries):
            messages = [{"role": "system", "content": _system_prompt("search_discovery", day)},
                        {"role": "user", "content": " ".join(instruction.split())}]
            arguments = orjson.dumps({"query": query.strip()[:200]}).decode()
            assistant = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_webshop_{s}_{k}", "type": "function",
                 "function": {"name": "search_products", "arguments": arguments}}]}
            record = gen.record(session_id, k, customer, "search_discovery", messages, assistant, "tool_calls")
            record["record_id"] = f"webshop_{seed}_{s:06d}_{k}"
            record["timestamp"] = _iso(start + 86_399.0 * n / max(total, 1))
            lines.append(orjson.dumps(record))
            n += 1
    target = partition_dir(raw_root, day) / "webshop.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"\n".join(lines) + (b"\n" if lines else b""))
    return {"instructions": len(pairs), "records": n, "file": str(target)}


RETAIL_TOOLSET = "retail"
SKIPPED_RETAIL_ACTIONS = {"think"}  # a scratchpad, not a call the agent makes on the shop


def retail_to_raw(tools_file: Path, tasks_file: Path, raw_root: Path, day: date, seed: int = 0
                  ) -> dict[str, int | str]:
    """tau-bench retail tasks (instruction + expected tool calls) -> turns under their own tool schemas.

    Each task is a session: the user's request, then one turn per expected action, with the earlier
    calls and their (unknown, so empty) results in the history. The tools are registered as the
    `retail` toolset, so prep validates the calls against the retail schemas.
    """
    from pipelines.logs.toolsets import register_toolset

    for f in (tools_file, tasks_file):
        if not f.is_file():
            raise FileNotFoundError(f"no such file: {f}")
    tools = json.loads(tools_file.read_text(encoding="utf-8"))
    register_toolset(str(raw_root), RETAIL_TOOLSET, tools)
    tasks = [json.loads(line) for line in tasks_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=0, end_date=day))
    customers = cat.customers(5000)
    rng = random.Random(seed)
    start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()
    system = {"role": "system", "content": f"You are the retail agent of a commerce assistant. Today is {day}."}
    lines: list[bytes] = []
    turns = [(t, [a for a in t["actions"] if a["name"] not in SKIPPED_RETAIL_ACTIONS]) for t in tasks]
    total = sum(len(actions) for _, actions in turns)
    n = 0
    for s, (task, actions) in enumerate(turns):
        customer = customers[rng.randrange(len(customers))]
        session_id = f"retail_{seed}_{s:05d}"
        history: list[dict] = [system, {"role": "user", "content": " ".join(task["instruction"].split())}]
        for k, action in enumerate(actions):
            call_id = f"call_retail_{s}_{k}"
            assistant = {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": action["name"], "arguments": orjson.dumps(action["arguments"]).decode()}}]}
            record = gen.record(session_id, k, customer, "orders", list(history), assistant, "tool_calls")
            record["request"]["tools"] = tools
            record["record_id"] = f"retail_{seed}_{s:05d}_{k}"
            record["timestamp"] = _iso(start + 86_399.0 * n / max(total, 1))
            lines.append(orjson.dumps(record))
            history += [assistant, {"role": "tool", "tool_call_id": call_id, "content": "{}"}]
            n += 1
    target = partition_dir(raw_root, day) / "retail.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"\n".join(lines) + (b"\n" if lines else b""))
    return {"tasks": len(tasks), "records": n, "file": str(target), "toolset": RETAIL_TOOLSET}
