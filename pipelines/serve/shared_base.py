"""One loaded base for every project's adapters (`triton.multi_lora`): the shared base's model folder
(`lora__<base model>`, the Python model in its shared-base mode with `lora_cache.py` beside it), each version's
adapter folder under `<repository>/../lora_adapters/<model name>_v<N>/`, and a version's serving name
`lora__<base>@<model name>_v<N>` (the client sends the part after `@` as the request's ADAPTER)."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from pipelines.config import ConfigError, Settings
from pipelines.serve import repository
from pipelines.serve.repository import (
    SHARED_PREFIX,
    ModelEntry,
    _read_meta,
    model_uri,
    split_name,
    staging_repository,
    token_limits,
    triton_name,
    version_identity,
    write_model,
)

SHARED_BUDGET = 256  # a shared base's answer limit (it serves versions with different budgets; answers end at EOS)


def build_serving(
    settings: Settings, version: str, *, in_use: bool = False, is_loaded: Callable[[str], bool] | None = None
) -> ModelEntry:
    """What serves a registered version: its own model folder (`repository.build_version`), or with
    `triton.multi_lora` its adapter folder beside the shared base's (`is_loaded`: whether the server has a model
    loaded; the shared base's folder is never rewritten while it is)."""
    if not settings.triton.multi_lora:
        return repository.build_version(settings, version, in_use=in_use)
    from pipelines.registry.models import adapter_path

    _, base_model, style = version_identity(settings, version)
    name = triton_name(settings, version)
    shared = build_shared(settings, base_model, is_loaded=is_loaded)
    write_adapter(
        settings,
        name,
        adapter_path(settings, version),
        {
            "registry_version": version,
            "base_model": base_model,
            "prompt_style": style,
            "model": settings.mlflow.registered_model,
            "shared": shared.name,
        },
    )
    return ModelEntry(f"{shared.name}@{name}", shared.path, version, style, base_model, shared.stale)


def shared_name(base_model: str) -> str:
    """The Triton name of the shared base model every project's adapters of `base_model` are served on."""
    return SHARED_PREFIX + re.sub(r"[^a-z0-9]+", "_", base_model.lower()).strip("_")


def adapter_root(settings: Settings) -> Path:
    """The folder of every deployed adapter (all projects), beside the model repository (local only)."""
    return staging_repository(settings).parent / "lora_adapters"


def build_shared(settings: Settings, base_model: str, *, is_loaded: Callable[[str], bool] | None = None) -> ModelEntry:
    """The shared base's model folder (one per base model, for every project; written once, kept while loaded)."""
    from pipelines.base_models import prepare_base
    from pipelines.locks import shared_lock

    if "://" in str(settings.triton.model_repository):
        raise ConfigError(
            "triton.multi_lora serves adapters from a local folder beside the model repository; "
            "on object storage serve them with the vLLM backend's multi-LoRA "
            "(pipelines.serve.vllm.vllm_model) or set triton.multi_lora false"
        )
    name = shared_name(base_model)
    in_use = is_loaded(name) if is_loaded is not None else True
    root = adapter_root(settings)
    root.mkdir(parents=True, exist_ok=True)
    folder = staging_repository(settings) / name
    # every project's: on object storage every host's (the folder's place in the repository keys the lock)
    where = str(folder) if "://" not in str(settings.triton.model_repository) else model_uri(settings, name)
    with shared_lock(where, settings.triton.state_lock_timeout_s, f"the shared base {name}", settings.state_lock_uri):
        path, stale = write_model(
            settings,
            staging_repository(settings),
            name,
            prepare_base(base_model, settings),
            None,
            {"registry_version": None, "base_model": base_model, "prompt_style": "short", "model": "shared"},
            in_use=in_use,
            limits=token_limits(settings, base_model, SHARED_BUDGET),
            shared=shared_params(settings, root),
        )
    return ModelEntry(name, str(path), None, "short", base_model, stale)


def shared_params(settings: Settings, root: Path) -> dict[str, str]:
    """The shared base's Triton parameters: its adapters' folder, how many stay loaded, their largest rank."""
    params = {"adapter_root": str(root), "max_adapters": str(settings.triton.max_adapters)}
    if settings.triton.max_adapter_rank is not None:  # only when set: an unset cap leaves the folder unchanged
        params["max_adapter_rank"] = str(settings.triton.max_adapter_rank)
    return params


def check_rank(settings: Settings, adapter_dir: str, name: str) -> None:
    """ConfigError when the adapter in `adapter_dir` (local or on object storage) has no readable rank or one
    over `triton.max_adapter_rank`."""
    from pipelines.serve.vllm import VllmConfigError, adapter_rank

    cap = settings.triton.max_adapter_rank
    if cap is None:
        return
    try:
        rank = adapter_rank(adapter_dir)
    except VllmConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    if rank > cap:
        raise ConfigError(
            f"{name}: LoRA rank {rank} is over triton.max_adapter_rank {cap}; the shared base "
            "would refuse it (raise the cap, or train the version at a lower rank)"
        )


def write_adapter(settings: Settings, name: str, adapter_dir: str, meta: dict[str, object]) -> Path:
    """A version's adapter folder under `adapter_root`, written whole (staged, then renamed into place). A folder
    holding the same files is kept; one holding other weights under the name (a registry reset that reused the
    version number) or an incomplete one is moved aside first, so for a moment the name is not served (the shared
    base reloads a cached adapter whose folder changed: `lora_cache`)."""
    from pipelines.storage import fs_for

    check_rank(settings, adapter_dir, name)  # refused before anything is copied or put in place
    final = adapter_root(settings) / name
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{name}.staging-{uuid.uuid4().hex[:8]}"
    try:
        fs, remote = fs_for(adapter_dir)
        if "://" in adapter_dir:
            fs.get(remote.rstrip("/") + "/", str(staging), recursive=True)
        else:
            shutil.copytree(adapter_dir, staging)
        meta = {**meta, "fingerprint": _files_digest(staging)}
        existing = _read_meta(final / "flywheel.json")
        if existing is not None and (existing.get("fingerprint") or _files_digest(final)) == meta["fingerprint"]:
            return final
        (staging / "flywheel.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        if final.exists():
            _discard(final)
        try:
            staging.rename(final)
        except OSError:  # another deploy put it in place meanwhile: keep it if it is this one
            if (_read_meta(final / "flywheel.json") or {}).get("fingerprint") != meta["fingerprint"]:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _files_digest(folder: Path) -> str:
    """An adapter folder's weights and config (its flywheel.json, which records this, left out)."""
    import hashlib

    return repository.hash_files(hashlib.sha256(), folder, skip=("flywheel.json",)).hexdigest()


def _discard(folder: Path) -> None:
    """Take a folder out of use at once (one rename: nothing ever sees it half deleted), then delete it."""
    trash = folder.parent / f".{folder.name}.trash-{uuid.uuid4().hex[:8]}"
    folder.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)


def deployed_adapters(settings: Settings) -> dict[str, dict[str, object]]:
    """Every adapter folder under `adapter_root` (all projects): name -> its flywheel.json."""
    root = adapter_root(settings)
    folders = sorted(f for f in root.iterdir() if not f.name.startswith(".")) if root.is_dir() else []
    return {f.name: meta for f in folders if (meta := _read_meta(f / "flywheel.json")) is not None}


def own_version(settings: Settings, name: str) -> str | None:
    """The registry version when `name` (a Triton model or a shared base's adapter) is one of this project's
    versions (`<model name>_v<N>` exactly: never another project's whose name merely starts alike), else None."""
    served = split_name(name)[1] or name
    found = re.fullmatch(rf"{re.escape(settings.triton.model_name)}_v(\d+)", served)
    return found.group(1) if found else None


def is_own(settings: Settings, name: str) -> bool:
    """Whether a Triton model name is one of this project's own models (a version or its base)."""
    return own_version(settings, name) is not None or name == triton_name(settings, None)


def remove_adapters(
    settings: Settings, keep: set[str] | frozenset[str] = frozenset(), only: set[str] | None = None
) -> list[str]:
    """Take this project's adapter folders out of service (those in `only` when given), but those named in
    `keep`: each is renamed away in one step, so the shared base refuses its requests from then on."""
    removed = []
    for name in deployed_adapters(settings):
        if own_version(settings, name) is not None and name not in keep and (only is None or name in only):
            _discard(adapter_root(settings) / name)
            removed.append(name)
    return removed


def served_meta(settings: Settings, name: str) -> dict[str, object]:
    """The flywheel.json of what a serving name serves: an adapter's own on a shared base, else the model's."""
    from pipelines.storage import read_json

    model, adapter = split_name(name)
    if adapter:
        return dict(read_json(str(adapter_root(settings) / adapter / "flywheel.json")))
    return dict(read_json(f"{model_uri(settings, model)}/1/flywheel.json"))


def prompt_style(settings: Settings, name: str) -> str:
    """The prompt style a serving name's model (or adapter) was trained with."""
    return str(served_meta(settings, name)["prompt_style"])
