"""Optional LLM-as-judge: any OpenAI-compatible chat-completions endpoint grades each predicted call
against the request and the expected call (0-1). Only used when `evaluation.judge_url` is set."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

from pipelines.config import Settings

PROMPT = (
    "You grade a commerce assistant's tool call. Request: {request}\nExpected call: {expected}\n"
    "Predicted call: {predicted}\nDoes the predicted call do what the user asked, as well as the expected "
    "call? Answer with one number from 0 to 10 and nothing else."
)


def judge_scores(settings: Settings, items: list[tuple[str, str, str]], timeout: float = 60) -> list[float | None]:
    """(request, expected, predicted) -> a 0-1 score each; None where the judge gave no number."""
    e = settings.evaluation
    if not e.judge_url:
        raise ValueError("evaluation.judge_url is not set")
    url = e.judge_url.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json"}
    if e.judge_api_key:
        headers["Authorization"] = f"Bearer {e.judge_api_key.get_secret_value()}"
    scores: list[float | None] = []
    for request, expected, predicted in items:
        body = {
            "model": e.judge_model or "judge",
            "temperature": 0,
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": PROMPT.format(request=request, expected=expected, predicted=predicted)}
            ],
        }
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")  # noqa: S310
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            answer: Any = json.loads(resp.read())["choices"][0]["message"]["content"]
        match = re.search(r"\d+(\.\d+)?", answer or "")
        scores.append(min(10.0, float(match.group())) / 10 if match else None)
    return scores
