"""Bad records of every kind prep must quarantine, and near-duplicates dedupe must remove."""

from __future__ import annotations

import random
from typing import Any

import orjson

from pipelines.logs.luhn import luhn_complete, luhn_valid  # noqa: F401 (re-exported)
from pipelines.simulate.generator.config import GeneratorConfig, Kind


class Corruption:
    """Mixin of `TrafficGenerator`: its `rng`, `cfg` and `counter`."""

    rng: random.Random
    cfg: GeneratorConfig
    counter: int

    def _corrupt(self, kind: Kind, record: dict[str, Any]) -> bytes:
        rng = self.rng
        record = orjson.loads(orjson.dumps(record))  # messages are shared with later turns' history
        if kind is Kind.BAD_JSON:
            line = orjson.dumps(record)
            return line[: max(1, int(len(line) * (0.2 + 0.7 * rng.random())))]
        if kind is Kind.MISSING_FIELD:
            del record[rng.choice(("customer_id", "timestamp", "session_id", "workload_id", "response", "request"))]
        elif kind is Kind.WRONG_TYPE:
            field_name, value = rng.choice(
                (
                    ("latency_ms", "fast"),
                    ("prompt_tokens", "many"),
                    ("turn_index", [1]),
                    ("feedback", 5),
                    ("country", "United States"),
                )
            )
            record[field_name] = value
        elif kind is Kind.UNKNOWN_TOOL:
            message = record["response"]["choices"][0]["message"]
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": "call_x",
                    "type": "function",
                    "function": {
                        "name": rng.choice(("refund_everything", "search_product", "delete_account", "get_weather")),
                        "arguments": "{}",
                    },
                }
            ]
        elif kind is Kind.INVALID_ARGUMENTS:
            message = record["response"]["choices"][0]["message"]
            calls = message.get("tool_calls")
            if not calls:  # an abstention: give it a call whose arguments break the schema
                name = record["request"]["tools"][0]["function"]["name"]
                calls = message["tool_calls"] = [
                    {"id": "call_y", "type": "function", "function": {"name": name, "arguments": "{}"}}
                ]
            fn = calls[0]["function"]
            if rng.random() < 0.5:
                fn["arguments"] = orjson.dumps({**orjson.loads(fn["arguments"]), "debug_mode": True}).decode()
            else:
                fn["arguments"] = fn["arguments"].replace('"', "'") + "}" if fn["arguments"] != "{}" else "{'a':"
        elif kind is Kind.IMPOSSIBLE_LATENCY:
            choice = rng.random()
            if choice < 0.4:
                record["latency_ms"] = -record["latency_ms"]
            elif choice < 0.7:
                record["latency_ms"] = 3_600_000.0 + record["latency_ms"]
            else:
                record["retrieval_latency_ms"] = record["latency_ms"] * 3 + 1
        return orjson.dumps(record)

    def _near_duplicate(self, previous: dict[str, Any], timestamp: str) -> dict[str, Any]:
        rng = self.rng
        twin = orjson.loads(orjson.dumps(previous))
        user = twin["request"]["messages"][-1]
        text = user["content"]
        user["content"] = rng.choice((text.upper(), f"  {text}  ", text.replace(" ", "  "), text.lower() + "!"))
        self.counter += 1
        twin["record_id"] = f"rec_{self.cfg.seed}_{self.counter:09d}"
        twin["timestamp"] = timestamp
        return twin

    # ---- PII -----------------------------------------------------------------------------
