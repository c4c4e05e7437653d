"""Standard Triton model repositories for registered adapters.

One Triton model per registry version (`<model_name>_v<N>`), so a candidate can be loaded next to
the champion (canary) and the previous version stays loaded for a rollback in seconds:

    <repository>/tool_router_v3/config.pbtxt      Python backend, dynamic batching, parameters
    <repository>/tool_router_v3/1/model.py        pipelines/triton_backend/model.py, verbatim
    <repository>/tool_router_v3/1/tool_grammar.py pipelines/toolcall/grammar.py, verbatim
    <repository>/tool_router_v3/1/adapter/        the LoRA adapter (HF-PEFT), from MLflow
    <repository>/tool_router_v3/1/flywheel.json   registry version, base model, prompt style

With `triton.multi_lora` every project's versions share one loaded base instead (`lora__<base model>`, the
Python model in its shared-base mode with `lora_cache.py` and `batched_lora.py` beside it) and each version is an
adapter folder
under `<repository>/../lora_adapters/<model name>_v<N>/`; its serving name is `lora__<base>@<model name>_v<N>`
(the client sends the part after `@` as the request's ADAPTER).

For GPU production, `vllm.vllm_model` writes the official Triton vLLM backend's `model.json` (LoRA
enabled, max rank) and `multi_lora.json`, so the same adapters serve from the vLLM container.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipelines.config import ConfigError, Settings
from pipelines.errors import NotRetryable
from pipelines.toolcall.budget import FALLBACK, recorded

MIN_PROMPT_TOKENS = 16  # below this no chat template fits: a folder built so would refuse every request

BACKEND = Path(__file__).parents[1] / "triton_backend"  # what runs inside Triton, copied verbatim
MODEL_FILE = BACKEND / "model.py"
GRAMMAR_FILE = Path(__file__).parents[1] / "toolcall" / "grammar.py"  # model.py's constrained decoder, copied beside it
GRAMMAR_MODULE = "tool_grammar.py"  # its name there (model.py imports `tool_grammar`)
LORA_FILE = BACKEND / "lora_cache.py"  # the shared base's adapter cache, copied beside model.py
BATCHED_FILE = BACKEND / "batched_lora.py"  # its adapter slots (lora_cache imports it), beside too
SHARED_PREFIX = "lora__"  # a shared base model's Triton name: lora__<base model> (`shared_base`)
BASE_NAME = "base"  # the un-tuned base model (the few-shot baseline in benchmarks)


class ModelInUse(NotRetryable):
    """A model folder that a loaded or live model was built from would have to be rewritten."""


@dataclass(frozen=True)
class ModelEntry:
    name: str  # Triton model name
    path: str
    version: str | None  # registry version; None for the base model
    prompt_style: str
    base_model: str
    stale: bool = False  # kept as it was (the model is in use) although the settings now build it differently


IDENTITY = ("registry_version", "base_model", "prompt_style", "model")  # what a folder serves


def triton_name(settings: Settings, version: str | None) -> str:
    return f"{settings.triton.model_name}_{'v' + str(version) if version else BASE_NAME}"


def token_limits(settings: Settings, base_model: str, budget: int | None) -> tuple[int, int]:
    """(max_input_tokens, max_new_tokens) of a model folder: the settings when given, else sized from the
    model (`toolcall.budget`): the version's answer budget, and the base model's context window minus it."""
    from pipelines.base_models import context_window

    t = settings.triton
    new = t.max_new_tokens or budget or FALLBACK
    if t.max_input_tokens:
        return t.max_input_tokens, new
    window = context_window(base_model)
    if window - new < MIN_PROMPT_TOKENS:  # a folder that would refuse every request: say so when it is built
        source = "triton.max_new_tokens" if t.max_new_tokens else "the version's answer budget"
        raise ConfigError(
            f"{source} {new} leaves {window - new} of {base_model}'s {window}-token context window "
            f"for the prompt (at least {MIN_PROMPT_TOKENS}): set triton.max_new_tokens lower or "
            "triton.max_input_tokens"
        )
    return window - new, new


def config_pbtxt(
    settings: Settings,
    name: str,
    base_model_path: str,
    adapter: str | None,
    limits: tuple[int, int],
    shared: dict[str, str] | None = None,
) -> str:
    """`shared`: the shared-base parameters (adapter_root, max_adapters); the model then takes ADAPTER."""
    t = settings.triton
    params = {
        "base_model_path": base_model_path,
        "adapter": adapter or "",
        "max_input_tokens": str(limits[0]),
        "max_new_tokens": str(limits[1]),
        "threads": str(t.threads),
        "precision": t.precision,
        "bf16_min_rows": str(t.bf16_min_rows),
        **(shared or {}),
    }
    if t.execution_env:
        params["EXECUTION_ENV_PATH"] = t.execution_env
    adapter_input = ',\n  { name: "ADAPTER" data_type: TYPE_STRING dims: [ 1 ] optional: true }' if shared else ""
    rendered = ",\n".join(f'  {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}' for k, v in params.items())
    return f'''name: "{name}"
backend: "python"
max_batch_size: {t.max_batch_size}
input [
  {{ name: "CONVERSATION" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "TOOLS" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "STREAM" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}{adapter_input}
]
output [
  {{ name: "TOOL_CALL" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "PROMPT_TOKENS" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OUTPUT_TOKENS" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "FINAL" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "CUT" data_type: TYPE_BOOL dims: [ 1 ] }}
]
model_transaction_policy {{ decoupled: true }}
dynamic_batching {{ max_queue_delay_microseconds: {t.queue_delay_us} }}
instance_group [ {{ count: {t.instances} kind: {t.instance_kind} }} ]
parameters [
{rendered}
]
'''


def _fingerprint(config: str, adapter_dir: str | None) -> str:
    """Everything a model folder is built from: its config, model.py and the adapter's files."""
    digest = hashlib.sha256(
        config.encode()
        + MODEL_FILE.read_bytes()
        + GRAMMAR_FILE.read_bytes()
        + LORA_FILE.read_bytes()
        + BATCHED_FILE.read_bytes()
    )
    if adapter_dir:
        hash_files(digest, Path(adapter_dir))
    return digest.hexdigest()


def hash_files(digest: hashlib._Hash, folder: Path, skip: tuple[str, ...] = ()) -> hashlib._Hash:
    """Every file under `folder` (its relative path and bytes, in a stable order) into `digest`, but `skip`."""
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in skip):
        digest.update(str(file.relative_to(folder)).encode() + file.read_bytes())
    return digest


def _same(existing: dict[str, object] | None, meta: dict[str, object]) -> tuple[bool, bool]:
    """(serves the same model, built identically) of a folder's flywheel.json against the wanted one."""
    if existing is None:
        return False, False
    identity = all(existing.get(k) == meta.get(k) for k in IDENTITY)
    return identity, identity and existing.get("fingerprint") == meta.get("fingerprint")


def _conflict(name: str, where: str, existing: dict[str, object] | None, meta: dict[str, object]) -> ModelInUse:
    return ModelInUse(
        f"{where} serves { ({k: (existing or {}).get(k) for k in IDENTITY}) }, not "
        f"{ ({k: meta.get(k) for k in IDENTITY}) }, and {name} is loaded or live: its folder is never "
        f"rewritten while in use; unload it (deploy or roll back to another version) and retry"
    )


def write_model(
    settings: Settings,
    repository: Path,
    name: str,
    base_model_path: str,
    adapter_dir: str | None,
    meta: dict[str, object],
    *,
    in_use: bool = False,
    limits: tuple[int, int] | None = None,
    shared: dict[str, str] | None = None,
) -> tuple[Path, bool]:
    """The model folder, written once: (folder, stale). An existing folder built identically is reused
    untouched; one serving the same model but built from other settings is kept while the model is
    `in_use` (loaded or live: stale=True) and replaced otherwise; one serving another model raises
    ModelInUse when in use. New content goes to a private staging folder renamed into place, so Triton
    never sees half a folder."""
    limits = limits or token_limits(settings, str(meta.get("base_model")), None)
    config = config_pbtxt(settings, name, base_model_path, "adapter" if adapter_dir else None, limits, shared)
    meta = {**meta, "fingerprint": _fingerprint(config, adapter_dir)}
    final = repository / name
    existing = _read_meta(final / "1" / "flywheel.json")
    identity, identical = _same(existing, meta)
    if identical:
        return final, False
    if final.exists() and in_use:
        if identity:
            return final, True
        raise _conflict(name, str(final), existing, meta)
    staging = repository / f".{name}.staging-{uuid.uuid4().hex[:8]}"
    (staging / "1").mkdir(parents=True)
    try:
        shutil.copy(MODEL_FILE, staging / "1" / "model.py")
        shutil.copy(GRAMMAR_FILE, staging / "1" / GRAMMAR_MODULE)
        shutil.copy(LORA_FILE, staging / "1" / LORA_FILE.name)
        shutil.copy(BATCHED_FILE, staging / "1" / BATCHED_FILE.name)
        if adapter_dir:
            shutil.copytree(adapter_dir, staging / "1" / "adapter")
        (staging / "1" / "flywheel.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        (staging / "config.pbtxt").write_text(config)
        old = repository / f".{name}.old-{uuid.uuid4().hex[:8]}"
        if final.exists():
            final.rename(old)  # not in use: nothing reads it
        try:
            staging.rename(final)
        except OSError:  # another writer put the folder in place meanwhile: keep it if it is this one
            if not _same(_read_meta(final / "1" / "flywheel.json"), meta)[1]:
                raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final, False


def _read_meta(uri: Path | str) -> dict[str, object] | None:
    from pipelines.storage import read_json

    try:
        meta = read_json(str(uri))
    except (FileNotFoundError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def staging_repository(settings: Settings) -> Path:
    """Where model folders are written: the repository itself locally; a scratch copy when it is on
    object storage (then `publish` uploads each folder; Triton on the cluster reads it from S3)."""
    repository = str(settings.triton.model_repository)
    return Path(repository) if "://" not in repository else Path.home() / ".flywheel" / "model_repository"


README = "README.flywheel"  # the marker that makes an empty repository a repository (Triton needs one to start)


def ensure_repository(settings: Settings) -> str:
    """The model repository, created when missing: Triton on object storage is not ready until its repository
    prefix exists, and a fresh bucket has none before the first deploy (`flywheel serve manifests` calls this)."""
    from pipelines.storage import exists, write_text

    repository = str(settings.triton.model_repository).rstrip("/")
    marker = f"{repository}/{README}"
    if not exists(marker):
        write_text(marker, "The Triton model repository of commerce-flywheel: one folder per served version.\n")
    return repository


def model_uri(settings: Settings, name: str) -> str:
    """A model's folder in the configured repository (a path or an object-store URI)."""
    return f"{str(settings.triton.model_repository).rstrip('/')}/{name}"


def publish(settings: Settings, folder: Path, *, in_use: bool = False) -> tuple[str, bool]:
    """The model folder at its place in the configured repository: (uri, stale). On object storage
    the folder is uploaded only where it is absent or (not in use) built differently; an in-use
    folder is never replaced (the rules of `write_model`)."""
    repository = str(settings.triton.model_repository)
    if "://" not in repository:
        return str(folder), False
    from pipelines.storage import fs_for

    uri = model_uri(settings, folder.name)
    fs, remote = fs_for(uri)
    meta = _read_meta(folder / "1" / "flywheel.json") or {}
    existing = _read_meta(f"{uri}/1/flywheel.json") if fs.exists(remote) else None
    identity, identical = _same(existing, meta)
    if identical:
        return uri, False
    if fs.exists(remote):
        if in_use:
            if identity:
                return uri, True
            raise _conflict(folder.name, uri, existing, meta)
        fs.rm(remote, recursive=True)
    # the metadata last: a folder without it is incomplete and is replaced by the next publish
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "flywheel.json")
    for file in [*files, folder / "1" / "flywheel.json"]:
        fs.put_file(str(file), f"{remote}/{file.relative_to(folder).as_posix()}")
    return uri, False


def configured_limit(settings: Settings, name: str, key: str = "max_input_tokens") -> int:
    """The `max_input_tokens` (or `max_new_tokens`) a model's folder in the repository was built with."""
    found = configured_param(settings, name, key)
    return int(found) if found else {"max_input_tokens": 1024, "max_new_tokens": 96}[key]  # model.py's defaults


def configured_param(settings: Settings, name: str, key: str) -> str | None:
    """A parameter a model's folder in the repository was built with (its `config.pbtxt`); None where it has none."""
    import re

    from pipelines.storage import read_bytes

    config = read_bytes(f"{model_uri(settings, split_name(name)[0])}/config.pbtxt").decode("utf-8")
    found = re.search(rf'key: "{re.escape(key)}" value: \{{ string_value: "([^"]*)" \}}', config)
    return found.group(1) if found else None


def version_identity(settings: Settings, version: str) -> tuple[dict[str, str], str, str]:
    """(registry tags, base model, prompt style) of a registered version."""
    from pipelines.clients.mlflow import client as mlflow_client

    tags = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, version).tags
    return tags, tags.get("flywheel.base_model", "smollm2-135m-instruct"), tags.get("flywheel.prompt_style", "short")


def build_version(settings: Settings, version: str, *, in_use: bool = False, name: str | None = None) -> ModelEntry:
    """The model folder of a registered version (adapter from MLflow, base model from the catalogue);
    `in_use`: the model is loaded or live, so an existing folder of it is never rewritten; `name`: another Triton
    name than the version's own (the benchmark's copies at another precision). (With `triton.multi_lora`
    deployments go through `shared_base.build_serving` instead.)"""
    from pipelines.base_models import prepare_base
    from pipelines.registry.models import adapter_path

    tags, base_model, style = version_identity(settings, version)
    name = name or triton_name(settings, version)
    path, stale = write_model(
        settings,
        staging_repository(settings),
        name,
        prepare_base(base_model, settings),
        adapter_path(settings, version),
        {
            "registry_version": version,
            "base_model": base_model,
            "prompt_style": style,
            "model": settings.mlflow.registered_model,
        },
        in_use=in_use,
        limits=token_limits(settings, base_model, recorded(tags)),
    )
    uri, remote_stale = publish(settings, path, in_use=in_use)
    return ModelEntry(name, uri, version, style, base_model, stale or remote_stale)


def build_base(
    settings: Settings, base_model: str = "smollm2-135m-instruct", *, in_use: bool = False, budget: int | None = None
) -> ModelEntry:
    """The un-tuned base model (full prompt, in-context examples): the baseline the benchmark compares, with
    the answer budget of the model it is compared with."""
    from pipelines.base_models import prepare_base

    name = triton_name(settings, None)
    path, stale = write_model(
        settings,
        staging_repository(settings),
        name,
        prepare_base(base_model, settings),
        None,
        {"registry_version": None, "base_model": base_model, "prompt_style": "full"},
        in_use=in_use,
        limits=token_limits(settings, base_model, budget),
    )
    uri, remote_stale = publish(settings, path, in_use=in_use)
    return ModelEntry(name, uri, None, "full", base_model, stale or remote_stale)


def split_name(name: str) -> tuple[str, str | None]:
    """(Triton model, adapter or None) of a serving name: `lora__<base>@<adapter>` or a plain model name."""
    model, _, adapter = name.partition("@")
    return model, adapter or None
