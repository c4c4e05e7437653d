"""Token budgets sized from the data and the model, not from settings found by hand.

The answer budget is how many tokens a model may write for one call: the longest call it learned (the
training targets, in the base model's tokens) plus a margin, so that a served answer is never cut where the
training data had a longer call. It is recorded with the model version (`flywheel.answer_budget`) and used
by the sweep's validation, evaluation and the model's Triton folder (so the gateway too). The prompt ceiling
is the base model's context window minus the answer budget: the quality gate's `approx_tokens` limit and
Triton's `max_input_tokens`. A setting (`evaluation.max_new_tokens`, `triton.max_new_tokens`,
`triton.max_input_tokens`, `quality.max_approx_tokens`) still overrides each when given."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

TAG = "flywheel.answer_budget"  # the model version's tag (and the sweep's MLflow param)
MARGIN = 0.25  # the longest call seen, plus a quarter: a new order id or a longer item list still fits
EXTRA_TOKENS = 8  # the end token and a few more
FLOOR = 16
FALLBACK = 64  # a version registered before budgets were recorded, or no training data at hand
CHARS_PER_TOKEN = 4  # prep's approx_tokens: characters / 4
DEFAULT_CONTEXT_WINDOW = 8192  # SmolLM2-135M's (the default base model) where no caller names the base model


def budget_for(longest_tokens: int) -> int:
    """The answer budget of a model whose longest training call is `longest_tokens` tokens."""
    return max(FLOOR, math.ceil(max(longest_tokens, 0) * (1 + MARGIN)) + EXTRA_TOKENS)


def longest_in_tokens(tokenizer: Any, texts: Iterable[str]) -> int:
    """The longest of `texts` in `tokenizer`'s tokens (no special tokens); 0 for none."""
    unique = sorted(set(texts))
    if not unique:
        return 0
    return max(len(ids) for ids in tokenizer(unique, add_special_tokens=False)["input_ids"])


def prompt_ceiling(context_window: int, longest_target_chars: int) -> int:
    """The quality gate's `approx_tokens` ceiling: the context window minus the answer budget of the window's
    longest target (approximated as prep approximates tokens)."""
    return max(1, context_window - budget_for(math.ceil(longest_target_chars / CHARS_PER_TOKEN)))


def recorded(tags: dict[str, str]) -> int | None:
    """A model version's recorded answer budget (None for a version registered before budgets)."""
    value = tags.get(TAG)
    return int(value) if value and value.isdigit() else None
