"""The cluster path of the tune stage (issue 51, item 4): the same preference pairs and GRPO prompts, exported in
NVIDIA NeMo RL's formats, with the config overrides its `examples/run_dpo.py` and `examples/run_grpo.py` read.

- **DPO**: one JSON line per training pair, `prompt` (the SFT prompt's messages, system first), `chosen_response`
  and `rejected_response` (call texts as SFT's targets are written), for NeMo RL's `BinaryPreferenceDataset` with
  `prompt_key` / `chosen_key` / `rejected_key` set to those names (a list prompt is its `context` as it is).
- **GRPO**: one JSON line per prompt, as NeMo RL's function-calling datasets carry them: `messages`, `tools` (the
  grammar's tools JSON, write ids grounded), `gold_answers` (a JSON list of the expected call), `task_name`
  (`flywheel_toolcall`, the environment that scores it) and `record_id`. The reward is the environment:
  `environment.json` names `pipelines.tune.reward:reward` and its weights, so the GPU run scores by the same
  definition as the evaluation here.

What runs on the GPU (NeMo RL's container and Ray) is not here: the files and the pod plan are tested for format
(`tests/test_tune_grpo.py`); the run itself needs a lent GPU.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pipelines.config.tune import DpoSettings, GrpoSettings
from pipelines.toolcall.examples import Example
from pipelines.tune import reward as rewards

TASK = "flywheel_toolcall"
DPO_KEYS = {"prompt_key": "prompt", "chosen_key": "chosen_response", "rejected_key": "rejected_response"}
FILES = {"dpo": "dpo_train.jsonl", "grpo": "grpo_prompts.jsonl"}


def dpo_records(rows: list[tuple[list[dict[str, str]], str, str]]) -> list[dict[str, Any]]:
    """`tune.dpo.preference_rows` as NeMo RL's binary preference records."""
    return [
        {DPO_KEYS["prompt_key"]: turns, DPO_KEYS["chosen_key"]: chosen, DPO_KEYS["rejected_key"]: rejected}
        for turns, chosen, rejected in rows
    ]


def grpo_records(examples: list[Example], tools: list[str]) -> list[dict[str, Any]]:
    """The GRPO prompts (`tools`: each example's grammar tools) as NeMo RL function-calling records."""
    return [
        {
            "messages": e.turns,
            "tools": offered,
            "gold_answers": json.dumps([e.expected]),
            "task_name": TASK,
            "record_id": e.record_id,
        }
        for e, offered in zip(examples, tools, strict=True)
    ]


def environment(effects: Mapping[str, str]) -> dict[str, Any]:
    """The reward as NeMo RL's environment reads it: the function, its weights, the tools' effects."""
    return {
        "task_name": TASK,
        "reward": "pipelines.tune.reward:reward",
        "weights": {"json": rewards.JSON, "name": rewards.NAME, "args": rewards.ARGS, "exact": rewards.EXACT},
        "wrong_write": rewards.WRONG_WRITE,
        "abstention": rewards.BEST,
        "effects": dict(sorted(effects.items())),
    }


def dpo_overrides(base_model: str, data_path: str, cfg: DpoSettings) -> dict[str, Any]:
    """NeMo RL's DPO config overrides (`examples/run_dpo.py`): the pairs, the SFT checkpoint, beta, steps."""
    return {
        "policy": {"model_name": base_model, "max_total_sequence_length": cfg.max_length},
        "dpo": {"reference_policy_kl_penalty": cfg.beta, "max_num_steps": cfg.max_steps, "seed": cfg.seed},
        "data": {"dataset_name": "BinaryPreferenceDataset", "train_data_path": data_path, **DPO_KEYS},
    }


def grpo_overrides(base_model: str, data_path: str, cfg: GrpoSettings, max_new_tokens: int) -> dict[str, Any]:
    """NeMo RL's GRPO config overrides (`examples/run_grpo.py`): groups, KL, steps, sampling as served."""
    return {
        "policy": {
            "model_name": base_model,
            "generation": {
                "temperature": cfg.temperature,
                "top_p": 1.0,
                "top_k": None,
                "max_new_tokens": max_new_tokens,
            },
        },
        "grpo": {
            "num_prompts_per_step": cfg.prompts_per_step,
            "num_generations_per_prompt": cfg.group_size,
            "max_num_steps": cfg.max_steps,
            "seed": cfg.seed,
        },
        "loss_fn": {"reference_policy_kl_penalty": cfg.kl_beta},
        "data": {"train_data_path": data_path, "task_name": TASK},
        "env": {TASK: {"environment_file": "environment.json"}},
    }


def jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()


def model_name(base_model: str) -> str:
    """The model NeMo RL loads: a hub model's id, else the catalogue's name (a folder the pod must have)."""
    from pipelines.base_models import CATALOGUE

    spec = CATALOGUE.get(base_model)
    return spec.reference if spec is not None and spec.source == "hub" else base_model


def export(
    settings: Any, method: str, folder: str, *, base_model: str, style: Any, sft_adapter: str,
    recorded_budget: int | None, max_prompts: int | None = None, window: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Write `method`'s records, its NeMo RL overrides (`<method>_config.yaml`), the environment (GRPO) and
    `plan.json` (what trains from what) under `folder` (`max_prompts`: GRPO's draw, else `tune.grpo`'s); returns
    the plan. Nothing to export: DataProblem."""
    import yaml

    from pipelines.errors import DataProblem
    from pipelines.storage import write_bytes, write_json

    base = folder.rstrip("/")
    data_path = f"/export/{FILES[method]}"  # where the pod's init container puts it
    if method == "dpo":
        from pipelines.prep.pairs import collect_pairs
        from pipelines.tune.dpo import preference_rows

        pairs, _, _ = collect_pairs(settings)
        records = dpo_records(preference_rows(pairs[pairs["split"] == "train"], style))
        overrides = dpo_overrides(model_name(base_model), data_path, settings.tune.dpo)
    else:
        from pipelines.tune.stage import answer_budget, grpo_prompts

        cfg = (
            settings.tune.grpo
            if max_prompts is None
            else settings.tune.grpo.model_copy(update={"max_prompts": max_prompts})
        )
        _, examples, tools, effects = grpo_prompts(settings, cfg, style, window)
        records = grpo_records(examples, tools)
        budget = answer_budget(settings, cfg, recorded_budget)
        overrides = grpo_overrides(model_name(base_model), data_path, cfg, budget)
    if not records:
        raise DataProblem(f"tune export: no {method} training record to export")
    if method == "grpo":
        write_json(f"{base}/environment.json", environment(effects))
    write_bytes(f"{base}/{FILES[method]}", jsonl(records))
    write_bytes(f"{base}/{method}_config.yaml", yaml.safe_dump(overrides, sort_keys=True).encode())
    plan = {
        "method": method,
        "records": len(records),
        "base_model": base_model,
        "sft_adapter": sft_adapter,
        # what the pod does not do yet (docs/training.md, "The cluster path"): the plan is a format, not a run
        "not_yet": [
            "the SFT adapter is not merged into model_name: NeMo RL starts from the base model",
            "the checkpoint stays in the pod (/work): nothing uploads it to the runs zone",
            "environment.json is not registered as a NeMo RL environment: the flywheel_toolcall task needs one",
        ],
        "prompt_style": str(style),
        "files": sorted([FILES[method], f"{method}_config.yaml", *(["environment.json"] if method == "grpo" else [])]),
    }
    write_json(f"{base}/plan.json", plan)
    return plan
