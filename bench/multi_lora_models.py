"""The models `bench/multi_lora.py` compares, built from a config (no downloads): the base at a named shape,
PEFT-format LoRA adapters with random weights, a merged copy, PEFT's mixed-batch model, and greedy generation of
exactly --new-tokens. `batched_lora.py` (the serving engine) is loaded by path, as the Triton model loads it.
CUDA bf16 when there, else CPU fp32."""

from __future__ import annotations

import gc
import importlib.util
import math
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

HERE = Path(__file__).resolve().parent
BATCHED_LORA = HERE.parent / "pipelines" / "serve" / "batched_lora.py"
_spec = importlib.util.spec_from_file_location("batched_lora", BATCHED_LORA)
batched_lora = sys.modules["batched_lora"] = importlib.util.module_from_spec(_spec)  # torch.compile imports it
_spec.loader.exec_module(batched_lora)

SHAPES = {
    "tiny": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 688,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
    },
    "smollm2-135m": {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },  # the model this CPU serves
    "llama-1b": {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },  # Llama 3.2 1B: a rank-16 adapter is 0.9 % of it
    "llama-8b": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
    },
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPE = torch.bfloat16 if CUDA else torch.float32
PAD = 0


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def free() -> None:
    gc.collect()
    sync()
    if CUDA:
        torch.cuda.empty_cache()


def build_base(shape: str, seed: int) -> torch.nn.Module:
    cfg = LlamaConfig(**SHAPES[shape], pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(cfg, dtype=DTYPE)
    model.generation_config.pad_token_id = PAD
    return model.eval()


def adapter_state(model: torch.nn.Module, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """A PEFT-format LoRA state dict for every target projection: A ~ U(+-1/sqrt(in)) as PEFT initialises it,
    B ~ N(0, 0.01) so the adapter changes the answers."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear and name.rsplit(".", 1)[-1] in TARGETS:
            bound = 1 / math.sqrt(module.in_features)
            a = (torch.rand(rank, module.in_features, generator=gen) * 2 - 1) * bound
            b = torch.randn(module.out_features, rank, generator=gen) * 0.01
            state[f"base_model.model.{name}.lora_A.weight"] = a.to(DTYPE)  # kept on the host: never in a peak
            state[f"base_model.model.{name}.lora_B.weight"] = b.to(DTYPE)
    return state


def merged_model(args, state: dict[str, torch.Tensor], scale: float) -> torch.nn.Module:
    model = build_base(args.shape, args.seed)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for key, a in state.items():
            if ".lora_A." in key:
                name = key.removeprefix("base_model.model.").rsplit(".lora_A.", 1)[0]
                b = state[key.replace(".lora_A.", ".lora_B.")]
                modules[name].weight += (scale * (b.to(DEVICE).float() @ a.to(DEVICE).float())).to(DTYPE)
    return model


def peft_model(args, states: list[dict[str, torch.Tensor]]) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    config = LoraConfig(
        r=args.rank,
        lora_alpha=2 * args.rank,
        target_modules=TARGETS,
        lora_dropout=0.0,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(build_base(args.shape, args.seed), config, adapter_name="a0")
    for i, state in enumerate(states):
        if i:
            model.add_adapter(f"a{i}", config)
        set_peft_model_state_dict(model, state, adapter_name=f"a{i}")
    for p in model.parameters():
        p.data = p.data.to(DTYPE)
    return model.eval()


def generate(model, ids: torch.Tensor, args, graph: bool, **extra) -> None:
    kw = {"cache_implementation": "static"} if graph else {}
    if graph and not CUDA:
        kw["compile_config"] = transformers.CompileConfig(fullgraph=False)
        kw["compile_config"]._compile_all_devices = True
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
            pad_token_id=PAD,
            **kw,
            **extra,
        )
    if out.shape[1] != ids.shape[1] + args.new_tokens:
        raise RuntimeError(f"generated {out.shape[1] - ids.shape[1]} tokens, asked {args.new_tokens}")


def last_logits(model, ids: torch.Tensor, **extra) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids, **extra).logits[:, -1].float()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())
