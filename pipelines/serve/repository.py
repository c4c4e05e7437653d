"""Standard Triton model repositories for registered adapters.

One Triton model per registry version (`<model_name>_v<N>`), so a candidate can be loaded next to
the champion (canary) and the previous version stays loaded for a rollback in seconds:

    <repository>/tool_router_v3/config.pbtxt      Python backend, dynamic batching, parameters
    <repository>/tool_router_v3/1/model.py        pipelines/serve/triton_model.py, verbatim
    <repository>/tool_router_v3/1/adapter/        the LoRA adapter (HF-PEFT), from MLflow
    <repository>/tool_router_v3/1/flywheel.json   registry version, base model, prompt style

For GPU production, `vllm_model` writes the official Triton vLLM backend's `model.json` (LoRA
enabled, max rank) and `multi_lora.json`, so the same adapters serve from the vLLM container.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipelines.config import Settings

MODEL_FILE = Path(__file__).with_name("triton_model.py")
BASE_NAME = "base"  # the un-tuned base model (the few-shot baseline in benchmarks)


@dataclass(frozen=True)
class ModelEntry:
    name: str  # Triton model name
    path: str
    version: str | None  # registry version; None for the base model
    prompt_style: str
    base_model: str


def triton_name(settings: Settings, version: str | None) -> str:
    return f"{settings.triton.model_name}_{'v' + str(version) if version else BASE_NAME}"


def config_pbtxt(settings: Settings, name: str, base_model_path: str, adapter: str | None) -> str:
    t = settings.triton
    params = {"base_model_path": base_model_path, "adapter": adapter or "",
              "max_input_tokens": str(t.max_input_tokens), "max_new_tokens": str(t.max_new_tokens)}
    if t.execution_env:
        params["EXECUTION_ENV_PATH"] = t.execution_env
    rendered = ",\n".join(f'  {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}' for k, v in params.items())
    return f'''name: "{name}"
backend: "python"
max_batch_size: {t.max_batch_size}
input [
  {{ name: "CONVERSATION" data_type: TYPE_STRING dims: [ 1 ] }}
]
output [
  {{ name: "TOOL_CALL" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "PROMPT_TOKENS" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OUTPUT_TOKENS" data_type: TYPE_INT32 dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: {t.queue_delay_us} }}
instance_group [ {{ count: 1 kind: {t.instance_kind} }} ]
parameters [
{rendered}
]
'''


def write_model(settings: Settings, repository: Path, name: str, base_model_path: str, adapter_dir: str | None,
                meta: dict[str, object]) -> Path:
    """Write (or rewrite, atomically per model) one model folder; returns it."""
    final = repository / name
    staging = repository / f".{name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "1").mkdir(parents=True)
    shutil.copy(MODEL_FILE, staging / "1" / "model.py")
    if adapter_dir:
        shutil.copytree(adapter_dir, staging / "1" / "adapter")
    (staging / "1" / "flywheel.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    (staging / "config.pbtxt").write_text(config_pbtxt(settings, name, base_model_path, "adapter" if adapter_dir else None))
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return final


def staging_repository(settings: Settings) -> Path:
    """Where model folders are written: the repository itself locally; a scratch copy when it is on
    object storage (then `publish` uploads each folder; Triton on the cluster reads it from S3)."""
    repository = str(settings.triton.model_repository)
    return Path(repository) if "://" not in repository else Path.home() / ".flywheel" / "model_repository"


def publish(settings: Settings, folder: Path) -> str:
    """The model folder at its place in the configured repository (an upload when that is S3)."""
    repository = str(settings.triton.model_repository)
    if "://" not in repository:
        return str(folder)
    from pipelines.storage import fs_for

    fs, remote = fs_for(f"{repository.rstrip('/')}/{folder.name}")
    if fs.exists(remote):
        fs.rm(remote, recursive=True)
    fs.put(str(folder), remote, recursive=True)
    return f"{repository.rstrip('/')}/{folder.name}"


def build_version(settings: Settings, version: str) -> ModelEntry:
    """The model folder of a registered version (adapter from MLflow, base model from the catalogue)."""
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import adapter_path
    from pipelines.train.models import prepare_base

    tags = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, version).tags
    base_model = tags.get("flywheel.base_model", "smollm2-135m-instruct")
    style = tags.get("flywheel.prompt_style", "short")
    name = triton_name(settings, version)
    path = write_model(settings, staging_repository(settings), name, prepare_base(base_model, settings),
                       adapter_path(settings, version), {"registry_version": version, "base_model": base_model,
                                                         "prompt_style": style, "model": settings.mlflow.registered_model})
    return ModelEntry(name, publish(settings, path), version, style, base_model)


def build_base(settings: Settings, base_model: str = "smollm2-135m-instruct") -> ModelEntry:
    """The un-tuned base model (full prompt, in-context examples): the baseline the benchmark compares."""
    from pipelines.train.models import prepare_base

    name = triton_name(settings, None)
    path = write_model(settings, staging_repository(settings), name, prepare_base(base_model, settings),
                       None, {"registry_version": None, "base_model": base_model, "prompt_style": "full"})
    return ModelEntry(name, publish(settings, path), None, "full", base_model)


def vllm_model(out: Path, base_model: str, adapters: dict[str, str], max_lora_rank: int = 64,
               gpu_memory_utilization: float = 0.85) -> Path:
    """A model folder for the official Triton vLLM container: base model with LoRA adapters by name
    (requests pick one with the `lora_name` parameter)."""
    (out / "1").mkdir(parents=True, exist_ok=True)
    (out / "1" / "model.json").write_text(json.dumps({
        "model": base_model, "enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": max(1, len(adapters)),
        "gpu_memory_utilization": gpu_memory_utilization, "disable_log_requests": True}, indent=2))
    (out / "1" / "multi_lora.json").write_text(json.dumps(adapters, indent=2, sort_keys=True))
    (out / "config.pbtxt").write_text('backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n')
    return out
