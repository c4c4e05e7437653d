"""Shared by the gateway's serverless tests: generated agent-log records and the chat request each one makes."""

from __future__ import annotations

import json
from datetime import date

import orjson

from pipelines.gateway import openai_api as api
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator

DEFAULTS = {"country": "US", "currency": "USD", "channel": "api"}


def generated_records(n: int = 300) -> list[dict]:
    gen = TrafficGenerator(GeneratorConfig(seed=11, records=n, bad_share=0.0, end_date=date(2026, 11, 20)))
    return [orjson.loads(line) for _, line, _ in gen.lines()]


def chat_request(record: dict, **extra) -> api.ChatCompletionRequest:
    body = {
        "model": "champion",
        "messages": record["request"]["messages"],
        "tools": record["request"]["tools"],
        "user": record["customer_id"],
        **extra,
    }
    return api.parse_request(json.dumps(body).encode())
