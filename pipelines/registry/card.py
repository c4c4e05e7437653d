"""A registered version's model card and its tuning tags: what it is, what trained it, how it evaluated."""

from __future__ import annotations

import json
from typing import Any

TUNE_TAG = "flywheel.tune_method"


def tuned_method(tune: dict[str, Any] | None) -> str:
    """The method that trained the registered adapter: off when none ran or it was skipped."""
    if not tune or tune.get("skipped") or not tune.get("run_id"):
        return "off"
    return str(tune.get("method") or "off")


def tune_tags(tune: dict[str, Any] | None) -> dict[str, str]:
    """The version's tuning tags: the method and what it trained on (prompts or pairs), its cost."""
    method = tuned_method(tune)
    if method == "off" or tune is None:
        return {}
    return {
        TUNE_TAG: method,
        "flywheel.tune_run_id": str(tune["run_id"]),
        "flywheel.tune_examples": str(tune.get("prompts") or tune.get("pairs") or tune.get("rows") or 0),
        "flywheel.tune_seconds": str(tune.get("seconds", "")),
        "flywheel.tune_tokens": str(tune.get("tokens", "")),
    }


def tune_lines(tune: dict[str, Any] | None) -> list[str]:
    """The model card's section on tuning after SFT."""
    if not tune or tune.get("method") in (None, "off"):
        return []
    if tune.get("skipped"):
        return ["", "## Tuning after SFT", "", f"- {tune['method']}: {tune['skipped']}"]
    what = {
        "grpo": f"{tune.get('prompts', 0)} rewarded prompts ({_counts(tune, 'prompts_by_tool')})",
        "kto": f"{tune.get('rows', 0)} rated answers, {tune.get('desirable', 0)} desirable and "
        f"{tune.get('undesirable', 0)} undesirable ({_counts(tune, 'thumbs_by_source')})",
    }.get(tune["method"], f"{tune.get('pairs', 0)} preference pairs ({_counts(tune, 'pairs_by_source')})")
    lines = [
        "",
        "## Tuning after SFT",
        "",
        f"- method: {tune['method']}, on the SFT adapter above; trained on {what}",
        f"- {tune.get('steps')} steps, {tune.get('seconds')} s, {tune.get('tokens')} tokens trained (run "
        f"`{tune.get('run_id')}`)",
    ]
    if "reward_first" in tune:
        lines.append(f"- mean sampled reward: first step {tune['reward_first']:.3f}, last {tune['reward_last']:.3f}")
    return lines


def _counts(tune: dict[str, Any], key: str) -> str:
    return json.dumps(tune.get(key) or {}, sort_keys=True)


def model_card(
    name: str,
    sweep: dict[str, Any],
    variant: dict[str, Any],
    evaluation: dict[str, Any] | None,
    label_sources: dict[str, int] | None = None,
    tune: dict[str, Any] | None = None,
) -> str:
    lines = [
        f"# {name}",
        "",
        f"LoRA adapter for the commerce agent's tool-calling step, on base model `{sweep['base_model']}` "
        f"(not included: the base is loaded by name).",
        "",
        f"- sweep: `{sweep['sweep_id']}` ({sweep['backend']} backend), variant {variant['index']}",
        f"- prompt style: {sweep['prompt_style']}; training set digest: `{sweep['dataset_digest']}`",
        (
            f"- answer budget: {sweep.get('answer_budget') or 'not recorded'} tokens (the longest training call "
            "plus a margin: what evaluation and serving let it write)"
        ),
        f"- hyperparameters: {json.dumps(variant['params'], sort_keys=True)}",
        f"- validation: {json.dumps({k: round(v, 4) for k, v in variant['metrics'].items()}, sort_keys=True)}",
    ]
    if label_sources:  # who wrote the answers it learned from (prep.labels)
        total = sum(label_sources.values())
        lines.append(
            "- labels (the training window's examples by who wrote the answer): "
            + ", ".join(f"{source} {n} ({n / total:.0%})" for source, n in sorted(label_sources.items()))
        )
    lines += tune_lines(tune)
    if evaluation:
        lines += [
            "",
            "## Evaluation (test split)",
            "",
            "| condition | exact match | name acc. | arg F1 | prompt tokens | latency p50 ms |",
            "|---|---|---|---|---|---|",
        ]
        for row in evaluation["table"]:
            cells = [
                row.get(k) for k in ("exact_match", "name_accuracy", "arg_f1", "prompt_tokens_mean", "latency_ms_p50")
            ]
            lines.append(f"| {row['condition']} | " + " | ".join("" if c is None else f"{c:.3f}" for c in cells) + " |")
    lines += ["", 'Load: `mlflow.pyfunc.load_model("models:/' + name + '@champion")`.']
    return "\n".join(lines)
