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

import orjson

from pipelines.simulate import catalogue as cat
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator, _iso, _system_prompt, partition_dir


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
    _write_atomically(target, b"\n".join(lines) + (b"\n" if lines else b""))
    return {"instructions": len(pairs), "records": n, "file": str(target), "import_id": ident}


RETAIL_TOOLSET = "retail"
# tau-bench retail's tools by effect (its policy: a write needs the user's explicit confirmation); a tool
# of another tools file that is not named here is registered as a write and the import says so
RETAIL_EFFECTS = {
    **dict.fromkeys(
        (
            "calculate",
            "find_user_id_by_email",
            "find_user_id_by_name_zip",
            "get_order_details",
            "get_product_details",
            "get_user_details",
            "list_all_product_types",
            "get_item_details",
            "think",
        ),
        "read",
    ),
    **dict.fromkeys(
        (
            "cancel_pending_order",
            "exchange_delivered_order_items",
            "modify_pending_order_address",
            "modify_pending_order_items",
            "modify_pending_order_payment",
            "modify_user_address",
            "return_delivered_order_items",
            "transfer_to_human_agents",
        ),
        "write",
    ),
}
SKIPPED_RETAIL_ACTIONS = {"think"}  # a scratchpad, not a call the agent makes on the shop


UNRECORDED = json.dumps({"result": "not recorded by the source"})  # a write's result without the database


def retail_to_raw(
    tools_file: Path, tasks_file: Path, raw_root: Path, day: date, seed: int = 0, db_file: Path | None = None
) -> dict[str, int | str | list[str]]:
    """tau-bench retail tasks (instruction + expected write actions) -> turns under their own tool schemas.

    Each task is a session: the user's request, then one turn per step, with the earlier calls and their
    results in the history. With the source's `db_file` (tau-bench's db.json) each task is the whole
    trajectory a policy-following agent runs (`logs.retail.trajectory`): identify the customer, read their
    profile, each order it acts on and each product whose variant changes, then the writes, whose results
    are the writes applied to the database. Without it only the writes remain, and their tool messages say
    the source did not record a result (`UNRECORDED`), never an empty `{}` that looks like a real answer.
    The tools are registered as the `retail` toolset, so prep validates the calls against their schemas.
    """
    from pipelines.logs.toolsets import register_toolset
    from pipelines.simulate.retail import trajectory

    for f in (tools_file, tasks_file, *([db_file] if db_file else [])):
        if not f.is_file():
            raise FileNotFoundError(f"no such file: {f}")
    ident = import_id(tools_file, tasks_file, *([db_file] if db_file else []), seed=seed)
    tools = json.loads(tools_file.read_text(encoding="utf-8"))
    db = json.loads(db_file.read_text(encoding="utf-8")) if db_file else {}
    _, undeclared = register_toolset(str(raw_root), RETAIL_TOOLSET, tools, RETAIL_EFFECTS)
    offered = {t.get("function", {}).get("name") for t in tools}
    tasks = [json.loads(line) for line in tasks_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=0, end_date=day))
    customers = cat.customers(5000)
    rng = random.Random(seed)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
    system = {"role": "system", "content": f"You are the retail agent of a commerce assistant. Today is {day}."}
    sessions = [(task, trajectory(task, db, offered, SKIPPED_RETAIL_ACTIONS, UNRECORDED)) for task in tasks]
    total = sum(len(steps) for _, steps in sessions)
    lines: list[bytes] = []
    n = 0
    counts = {"read": 0, "write": 0}
    unrecorded = 0
    for s, (task, steps) in enumerate(sessions):
        customer = customers[rng.randrange(len(customers))]
        session_id = f"retail_{ident}_{s:05d}"
        history: list[dict] = [system, {"role": "user", "content": " ".join(task["instruction"].split())}]
        for k, (action, result, effect) in enumerate(steps):
            call_id = f"call_retail_{s}_{k}"
            assistant = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": action["name"], "arguments": orjson.dumps(action["arguments"]).decode()},
                    }
                ],
            }
            record = gen.record(session_id, k, customer, "orders", list(history), assistant, "tool_calls")
            record["request"]["tools"] = tools
            record["record_id"] = f"retail_{ident}_{s:05d}_{k}"
            record["label_source"], record["feedback"] = "import", "none"  # the benchmark's expected calls
            record["timestamp"] = _iso(start + 86_399.0 * n / max(total, 1))
            lines.append(orjson.dumps(record))
            history += [assistant, {"role": "tool", "tool_call_id": call_id, "content": result}]
            counts[effect] += 1
            unrecorded += result == UNRECORDED
            n += 1
    target = partition_dir(raw_root, day) / f"retail-{ident}.jsonl"
    _write_atomically(target, b"\n".join(lines) + (b"\n" if lines else b""))
    return {
        "tasks": len(tasks),
        "records": n,
        "file": str(target),
        "import_id": ident,
        "toolset": RETAIL_TOOLSET,
        "reads": counts["read"],
        "writes": counts["write"],
        "results_from_db": n - unrecorded,
        "results_not_recorded": unrecorded,
        "undeclared_tools_treated_as_writes": undeclared,
    }


def _write_atomically(target: Path, data: bytes) -> None:
    """Whole or not at all: a crashed import leaves no half file the next run would read."""
    import os

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    partial.write_bytes(data)
    os.replace(partial, target)
