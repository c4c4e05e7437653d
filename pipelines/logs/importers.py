"""Importers: real public commerce data -> our log format, through the same prep as everything else.

WebShop (princeton-nlp, MIT): crowd-written shopping instructions and the search query a person
actually typed for each; every pair becomes a `search_products` turn of the search agent. The
files are read from where they are (e.g. ../shared/data); nothing is copied into the repository.
"""

from __future__ import annotations

import hashlib
import json
import random
from datetime import date, datetime, timezone
from pathlib import Path

import orjson

from pipelines.logs import catalogue as cat
from pipelines.logs.generator import GeneratorConfig, TrafficGenerator, _iso, _system_prompt, partition_dir


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
    start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()
    total = sum(len(q) for q in pairs.values())
    lines, n = [], 0
    for s, (instruction, queries) in enumerate(sorted(pairs.items())):
        customer = customers[rng.randrange(len(customers))]
        session_id = f"webshop_{ident}_{s:06d}"
        for k, query in enumerate(queries):
            messages = [{"role": "system", "content": _system_prompt("search_discovery", day)},
                        {"role": "user", "content": " ".join(instruction.split())}]
            arguments = orjson.dumps({"query": query.strip()[:200]}).decode()
            assistant = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_webshop_{s}_{k}", "type": "function",
                 "function": {"name": "search_products", "arguments": arguments}}]}
            record = gen.record(session_id, k, customer, "search_discovery", messages, assistant, "tool_calls")
            record["record_id"] = f"webshop_{ident}_{s:06d}_{k}"
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
    **dict.fromkeys(("calculate", "find_user_id_by_email", "find_user_id_by_name_zip", "get_order_details",
                     "get_product_details", "get_user_details", "list_all_product_types", "get_item_details",
                     "think"), "read"),
    **dict.fromkeys(("cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
                     "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
                     "return_delivered_order_items", "transfer_to_human_agents"), "write"),
}
SKIPPED_RETAIL_ACTIONS = {"think"}  # a scratchpad, not a call the agent makes on the shop


UNRECORDED = json.dumps({"result": "not recorded by the source"})  # a write call's result we do not have


def _order_lookup(db: dict | None, tools: list[dict], order_id: object) -> str | None:
    """The order's details as `get_order_details` would return them (from tau-bench's db.json), when the
    source has them and the toolset offers that call; else None."""
    if not db or not isinstance(order_id, str) or order_id not in db.get("orders", {}):
        return None
    if not any(t.get("function", {}).get("name") == "get_order_details" for t in tools):
        return None
    order = db["orders"][order_id]
    # what decides the next call (status, the item ids behind the names, payment ids), not the whole record:
    # a full order is ~400 tokens and would push the instruction out of a 512-token training example
    brief = {"order_id": order.get("order_id", order_id), "status": order.get("status"),
             "items": [{"name": i.get("name"), "item_id": i.get("item_id"), "product_id": i.get("product_id"),
                        "options": i.get("options")}
                       for i in order.get("items") or []],
             "payment_method_ids": sorted({p.get("payment_method_id") for p in order.get("payment_history") or []
                                           if p.get("payment_method_id")})}
    return json.dumps(brief, separators=(",", ":"), ensure_ascii=False)


def retail_to_raw(tools_file: Path, tasks_file: Path, raw_root: Path, day: date, seed: int = 0,
                  db_file: Path | None = None) -> dict[str, int | str]:
    """tau-bench retail tasks (instruction + expected tool calls) -> turns under their own tool schemas.

    Each task is a session: the user's request, then one turn per expected action, with the earlier
    calls and their results in the history. The tasks list only write actions, whose results the source
    does not record: their tool message says so (`UNRECORDED`), never an empty `{}` that looks like a
    real answer. With the source's `db_file` (tau-bench's db.json), each order an action touches is first
    looked up: a `get_order_details` turn (the read an agent makes before acting, e.g. to find the item
    ids behind "Electric Kettle") whose result comes from the database, so the history carries the state
    that decides the next step. The tools are registered as the `retail` toolset, so prep validates the
    calls against the retail schemas.
    """
    from pipelines.logs.toolsets import register_toolset

    for f in (tools_file, tasks_file, *([db_file] if db_file else [])):
        if not f.is_file():
            raise FileNotFoundError(f"no such file: {f}")
    ident = import_id(tools_file, tasks_file, *([db_file] if db_file else []), seed=seed)
    tools = json.loads(tools_file.read_text(encoding="utf-8"))
    db = json.loads(db_file.read_text(encoding="utf-8")) if db_file else None
    _, undeclared = register_toolset(str(raw_root), RETAIL_TOOLSET, tools, RETAIL_EFFECTS)
    tasks = [json.loads(line) for line in tasks_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=0, end_date=day))
    customers = cat.customers(5000)
    rng = random.Random(seed)
    start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()
    system = {"role": "system", "content": f"You are the retail agent of a commerce assistant. Today is {day}."}
    sessions = []
    for task in tasks:
        calls: list[tuple[dict, str, bool]] = []  # (action, the result the history shows, from the database)
        seen: set[str] = set()
        for action in (a for a in task["actions"] if a["name"] not in SKIPPED_RETAIL_ACTIONS):
            order_id = (action.get("arguments") or {}).get("order_id")
            order_id = order_id if isinstance(order_id, str) else None
            details = _order_lookup(db, tools, order_id) if order_id and order_id not in seen else None
            if details is not None:
                seen.add(order_id)
                calls.append(({"name": "get_order_details", "arguments": {"order_id": order_id}}, details, True))
            calls.append((action, UNRECORDED, False))
        sessions.append((task, calls))
    total = sum(len(calls) for _, calls in sessions)
    lines: list[bytes] = []
    n = lookups = 0
    for s, (task, calls) in enumerate(sessions):
        customer = customers[rng.randrange(len(customers))]
        session_id = f"retail_{ident}_{s:05d}"
        history: list[dict] = [system, {"role": "user", "content": " ".join(task["instruction"].split())}]
        for k, (action, result, from_db) in enumerate(calls):
            call_id = f"call_retail_{s}_{k}"
            assistant = {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": action["name"], "arguments": orjson.dumps(action["arguments"]).decode()}}]}
            record = gen.record(session_id, k, customer, "orders", list(history), assistant, "tool_calls")
            record["request"]["tools"] = tools
            record["record_id"] = f"retail_{ident}_{s:05d}_{k}"
            record["timestamp"] = _iso(start + 86_399.0 * n / max(total, 1))
            lines.append(orjson.dumps(record))
            history += [assistant, {"role": "tool", "tool_call_id": call_id, "content": result}]
            lookups += from_db
            n += 1
    target = partition_dir(raw_root, day) / f"retail-{ident}.jsonl"
    _write_atomically(target, b"\n".join(lines) + (b"\n" if lines else b""))
    return {"tasks": len(tasks), "records": n, "file": str(target), "import_id": ident, "toolset": RETAIL_TOOLSET,
            "lookups_from_db": lookups, "results_not_recorded": n - lookups,
            "undeclared_tools_treated_as_writes": undeclared}


def _write_atomically(target: Path, data: bytes) -> None:
    """Whole or not at all: a crashed import leaves no half file the next run would read."""
    import os

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    partial.write_bytes(data)
    os.replace(partial, target)
