"""Synthetic commerce-agent traffic: the platform's demo and test data.

Deterministic for a seed (same arguments -> byte-identical files). Realistic enough to exercise
every later stage: many phrasings per intent, typos, multi-turn sessions, PII in free text and in
tool arguments, a configurable share of bad records of every kind prep must quarantine or dedupe,
and drift scenarios the monitor must catch.

The package: `config` (knobs, bad kinds, drift scenarios), `traffic` (sessions and records), `intents`
(one builder per intent, PII), `corruption` (bad records, near-duplicates), `helpers`, `writer` (files).
"""

from pipelines.logs.luhn import luhn_complete, luhn_valid  # noqa: F401
from pipelines.simulate.generator.config import (  # noqa: F401 (the public surface)
    BAD_KINDS,
    EXPECTED_REASON,
    TEACHER_MODEL,
    Drift,
    GenerationSummary,
    GeneratorConfig,
    Kind,
    Slip,
)
from pipelines.simulate.generator.helpers import _iso, _system_prompt  # noqa: F401
from pipelines.simulate.generator.traffic import TrafficGenerator  # noqa: F401
from pipelines.simulate.generator.writer import partition_dir, write_raw_logs  # noqa: F401
