"""Function-calling metrics, as published function-calling benchmarks define them.

For one example the model's text is parsed into a call {"name": str | None, "arguments": {...}}
(`{"name": null}` means "no tool fits"). Per example: JSON validity, name match, exact match of
name and arguments, argument-level precision/recall/F1 over (key, value) pairs, abstention, and
`text_f1`: for free-text (string) arguments such as a search query, where exact match is too strict,
the mean token F1 of the predicted against the gold string after the same normalization of both. Ids
(`*_id`, `*_ids`) are never free text: they count by exact match only, and an id list as a set.
Aggregates are plain means, with a per-tool breakdown and a confusion matrix of names.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.logs.tools import effect_of
from pipelines.toolcall.calls import INVALID, NO_TOOL, parse_call


def _canonical(value: Any) -> Any:
    """Values compare as JSON: 5 == 5.0, strings trimmed, lists in order, dicts by key."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else str(value)
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    return repr(value)


def normalize_text(text: str) -> list[str]:
    """Tokens of `text`: Unicode NFKC, lowercase, punctuation removed, split on whitespace."""
    folded = unicodedata.normalize("NFKC", text).lower()
    kept = "".join(ch for ch in folded if not unicodedata.category(ch).startswith("P"))
    return kept.split()


def text_f1(pred: str, gold: str) -> float:
    """Bag-of-tokens F1 of `pred` against `gold` after `normalize_text` of both (1.0 when both are empty)."""
    pred_tokens, gold_tokens = normalize_text(pred), normalize_text(gold)
    if not pred_tokens and not gold_tokens:
        return 1.0
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _string_arguments_f1(predicted: dict[str, Any] | None, gold: dict[str, Any]) -> float | None:
    """Mean `text_f1` over the gold call's string-valued arguments, each against the predicted argument
    of the same name (missing or not a string: 0); None when the gold call has no string argument.
    `predicted` is None when the prediction is not a call of the gold tool (every argument scores 0)."""
    strings = {k: v for k, v in gold.items() if isinstance(v, str) and not _is_id(k)}
    if not strings:
        return None
    found = predicted or {}
    return _mean([text_f1(found[k], v) if isinstance(found.get(k), str) else 0.0 for k, v in strings.items()])


@dataclass(frozen=True)
class ExampleScore:
    tool: str  # expected tool (NO_TOOL for an expected abstention)
    predicted: str  # predicted tool, NO_TOOL, or INVALID when the output was not a call
    json_valid: bool
    name_match: bool
    exact_match: bool
    arg_precision: float | None  # None when the expected answer is an abstention
    arg_recall: float | None
    arg_f1: float | None
    text_f1: float | None = None  # mean token F1 of string arguments; None: abstention or no string argument
    wrong_write: str | None = None  # WRONG_WRITES kind when the answer is a write it should not make
    expected_write: bool = False  # the expected call is a write


# A wrong write: the answer calls a write tool and it is not the expected call's tool (`wrong_tool`), or it
# is but targets other ids (`other_ids`: the `*_id`/`*_ids` arguments differ), or a read or no call was
# expected (`unexpected_write`). Counted apart from every other error: the gate vetoes on it.
WRONG_WRITES = ("wrong_tool", "other_ids", "unexpected_write")


def _is_id(key: str) -> bool:
    return key.endswith(("_id", "_ids"))


def _argument(key: str, value: Any) -> Any:
    """An argument as compared: an id list (`*_ids`) as a multiset (the same items in another order are the
    same call), everything else as JSON (`_canonical`)."""
    if key.endswith("_ids") and isinstance(value, list):
        return tuple(sorted(map(repr, _canonical(value))))
    return _canonical(value)


def _ids(arguments: dict[str, Any]) -> dict[str, Any]:
    """The identifier arguments; a `*_ids` list as a multiset (the same items in another order are the same ids)."""
    return {k: _argument(k, v) for k, v in arguments.items() if _is_id(k)}


def wrong_write(
    call: dict[str, Any] | None, expected: dict[str, Any], effects: Mapping[str, str] | None = None
) -> str | None:
    """The kind of wrong write `call` is against `expected` (None: no write, or the right one). A tool nobody
    declared counts as a write (`logs.tools.effect_of`: fail safe)."""
    if call is None or call.get("name") is None or effect_of(call["name"], effects) != "write":
        return None
    gold = expected.get("name")
    if gold is None or effect_of(gold, effects) != "write":
        return "unexpected_write"
    if call["name"] != gold:
        return "wrong_tool"
    if _ids(call.get("arguments") or {}) != _ids(expected.get("arguments") or {}):
        return "other_ids"
    return None


def score(prediction_text: str, expected: dict[str, Any], effects: Mapping[str, str] | None = None) -> ExampleScore:
    """Score one model output against the expected call ({"name": ..., "arguments": ...}); `effects`: tool ->
    read/write (default: our catalogue's; `logs.toolsets.tool_effects` adds the imported toolsets)."""
    gold_name = expected.get("name")
    gold_tool = gold_name if gold_name is not None else NO_TOOL
    gold_args = expected.get("arguments") or {}
    gold_write = effect_of(gold_name, effects) == "write"
    call = parse_call(prediction_text)
    if call is None:
        empty = None if gold_name is None else 0.0
        text = None if gold_name is None else _string_arguments_f1(None, gold_args)
        return ExampleScore(
            gold_tool, INVALID, False, False, False, empty, empty, empty, text, expected_write=gold_write
        )
    predicted = call["name"] if call["name"] is not None else NO_TOOL
    name_match = predicted == gold_tool
    wrong = wrong_write(call, expected, effects)
    if gold_name is None:
        return ExampleScore(gold_tool, predicted, True, name_match, name_match, None, None, None, wrong_write=wrong)
    gold_pairs = {(k, _argument(k, v)) for k, v in gold_args.items()}
    pred_pairs = {(k, _argument(k, v)) for k, v in call["arguments"].items()} if name_match else set()
    hit = len(gold_pairs & pred_pairs)
    if not gold_pairs and not pred_pairs:
        p = r = f1 = 1.0 if name_match else 0.0
    else:
        p = hit / len(pred_pairs) if pred_pairs else 0.0
        r = hit / len(gold_pairs) if gold_pairs else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
    text = _string_arguments_f1(call["arguments"] if name_match else None, gold_args)
    return ExampleScore(
        gold_tool,
        predicted,
        True,
        name_match,
        name_match and gold_pairs == pred_pairs,
        p,
        r,
        f1,
        text,
        wrong,
        gold_write,
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(scores: list[ExampleScore]) -> dict[str, Any]:
    """Means over examples; abstention as precision/recall of predicting 'no tool'."""
    calls = [s for s in scores if s.tool != NO_TOOL]
    abstain_gold = [s for s in scores if s.tool == NO_TOOL]
    abstain_pred = [s for s in scores if s.predicted == NO_TOOL]
    correct_abstain = sum(1 for s in abstain_gold if s.predicted == NO_TOOL)
    return {
        "examples": len(scores),
        "json_valid": _mean([float(s.json_valid) for s in scores]),
        "name_accuracy": _mean([float(s.name_match) for s in scores]),
        "exact_match": _mean([float(s.exact_match) for s in scores]),
        # an expected call always has its argument scores (None only where the expected answer abstains)
        "arg_precision": _mean([s.arg_precision for s in calls if s.arg_precision is not None]),
        "arg_recall": _mean([s.arg_recall for s in calls if s.arg_recall is not None]),
        "arg_f1": _mean([s.arg_f1 for s in calls if s.arg_f1 is not None]),
        "text_f1": _mean([s.text_f1 for s in scores if s.text_f1 is not None]),
        "abstention_recall": correct_abstain / len(abstain_gold) if abstain_gold else None,
        "abstention_precision": correct_abstain / len(abstain_pred) if abstain_pred else None,
        "abstention_examples": len(abstain_gold),
        **wrong_write_summary(scores),
    }


def wrong_write_summary(scores: list[ExampleScore]) -> dict[str, Any]:
    """`wrong_writes` (count), `wrong_write_rate`, the split by kind, and which write for which expected call."""
    wrong = [s for s in scores if s.wrong_write]
    pairs = Counter(f"{s.predicted} for {s.tool}" for s in wrong)
    return {
        "wrong_writes": len(wrong),
        "wrong_write_rate": len(wrong) / len(scores) if scores else None,
        "wrong_write_kinds": {k: sum(1 for s in wrong if s.wrong_write == k) for k in WRONG_WRITES},
        "wrong_write_pairs": dict(pairs.most_common()),
        "expected_writes": sum(1 for s in scores if s.expected_write),
    }


def per_tool(scores: list[ExampleScore]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[ExampleScore]] = defaultdict(list)
    for s in scores:
        groups[s.tool].append(s)
    return {tool: summarize(group) for tool, group in sorted(groups.items())}


def confusion(scores: list[ExampleScore]) -> dict[str, dict[str, int]]:
    """expected tool -> predicted tool -> count (predicted may be NO_TOOL or INVALID)."""
    matrix: dict[str, Counter[str]] = defaultdict(Counter)
    for s in scores:
        matrix[s.tool][s.predicted] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(matrix.items())}
