"""Batched multi-LoRA (`pipelines/triton_backend/batched_lora.py`, issue 26 item 6): adapters in slots of one base,
every
row of a mixed batch answered by its own adapter with two batched products per projection. Compared with each
adapter merged into its own copy of the base (what PEFT's merge gives), on the tiny model, in fp32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelines.config import load_settings


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """The tiny base and adapters of it: a1, a2 of rank 4 and a3 of rank 2 (padded into rank-4 slots)."""
    from pipelines.base_models import prepare_base
    from pipelines.bench.adapters import make_adapters

    root = tmp_path_factory.mktemp("batched-lora")
    base = prepare_base("tiny-llama", load_settings(root=str(root)))
    adapters = make_adapters(base, root / "adapters", ["a1", "a2"], rank=4, alpha=8, scale=30.0)
    adapters |= make_adapters(base, root / "adapters", ["a3"], rank=2, alpha=8, seed=5, scale=30.0)
    return {"root": root, "base": base, "adapters": adapters}


def _inputs(base: str, n: int):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok([f"track parcel {i}{i} for order {i}?" for i in range(n)], return_tensors="pt", padding=True)


def _model(base: str, folder: Path | None = None):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    if folder is not None:
        model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    return model.eval()


def test_every_row_of_a_mixed_batch_gets_its_own_adapter(tiny):
    """Rows naming different slots (and none) give, row by row, the logits of their adapter merged into the base;
    a batch of one adapter (its direct path, no gathered copy) and of the base alone too; a reloaded slot serves
    its new adapter at once and a cleared one serves the base. Mutations tried: the scale not folded into B, base
    rows not zeroed in the gathered weights, the gathered copy not refreshed after a load, `one` mode reading slot
    0 whatever was selected, a larger rank re-allocating the slots without the loaded weights: each fails a
    comparison below."""
    import torch

    from pipelines.bench.adapters import TARGETS
    from pipelines.triton_backend.batched_lora import BatchedLoRA

    enc = _inputs(tiny["base"], 4)
    with torch.inference_mode():
        want = {
            name: _model(tiny["base"], tiny["adapters"].get(name))(**enc).logits[:, -1]
            for name in ("a1", "a2", "a3", None)
        }
    assert not torch.allclose(want["a1"], want["a2"], atol=1e-3)  # the adapters differ: the test can see it
    assert not torch.allclose(want["a1"], want[None], atol=1e-3)

    model = _model(tiny["base"])
    batched = BatchedLoRA(model, TARGETS, slots=3)
    slot = {"a3": 2, "a1": 0, "a2": 1}  # rank 2 first: the rank-4 ones re-allocate every slot, a3 kept
    for name, number in slot.items():
        batched.load_folder(number, str(tiny["adapters"][name]))

    def served(names: list[str | None]):
        batched.select([slot.get(n) if n else None for n in names])
        with torch.inference_mode():
            return model(**enc).logits[:, -1]

    for names in (["a1", "a2", None, "a3"], ["a3", "a3", "a1", None], ["a2"] * 4, ["a3"] * 4, [None] * 4):
        got = served(names)
        for row, name in enumerate(names):
            assert torch.allclose(got[row], want[name][row], atol=1e-4, rtol=1e-4), (names, row)

    batched.select([0, 1, None, 0])
    batched.load_folder(1, str(tiny["adapters"]["a3"]))  # slot 1 now holds a3, while that mix is selected
    with torch.inference_mode():
        got = model(**enc).logits[:, -1]
    for row, name in enumerate(["a1", "a3", None, "a1"]):
        assert torch.allclose(got[row], want[name][row], atol=1e-4, rtol=1e-4), row
    batched.clear(0)  # rows 0 and 3 named slot 0: the base from now on
    with torch.inference_mode():
        got = model(**enc).logits[:, -1]
    for row, name in enumerate([None, "a3", None, None]):
        assert torch.allclose(got[row], want[name][row], atol=1e-4, rtol=1e-4), row
    batched.select([2] * 4)  # one adapter for the whole batch (the direct path: views of that slot)
    batched.load_folder(2, str(tiny["adapters"]["a2"]))  # reloaded while selected: served at once
    with torch.inference_mode():
        got = model(**enc).logits[:, -1]
    assert all(layer.mode == "one" for layer in batched.layers.values())
    assert torch.allclose(got, want["a2"], atol=1e-4, rtol=1e-4)


def test_an_adapter_that_does_not_fit_is_refused_whole_and_the_slot_keeps_serving(tiny, tmp_path):
    """A rank over the slots', DoRA, a module not adapted here, half a pair: each one clear error, and the slot's
    old adapter still answers (nothing written before the whole adapter was checked). Mutation tried: the rank
    cap's check removed (the rank-4 adapter loads: DID NOT RAISE) fails."""
    import torch
    from safetensors.torch import load_file, save_file

    from pipelines.triton_backend.batched_lora import AdapterFormatError, BatchedLoRA

    enc = _inputs(tiny["base"], 2)
    model = _model(tiny["base"])
    batched = BatchedLoRA(
        model, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), slots=1, rank=2
    )
    batched.load_folder(0, str(tiny["adapters"]["a3"]))
    batched.select([0, 0])
    with torch.inference_mode():
        before = model(**enc).logits[:, -1].clone()

    with pytest.raises(AdapterFormatError, match="rank 4 is over"):
        batched.load_folder(0, str(tiny["adapters"]["a1"]))
    dora = tmp_path / "dora"
    shutil.copytree(tiny["adapters"]["a3"], dora)
    config = json.loads((dora / "adapter_config.json").read_text()) | {"use_dora": True}
    (dora / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterFormatError, match="DoRA"):
        batched.load_folder(0, str(dora))
    weights = load_file(str(tiny["adapters"]["a3"] / "adapter_model.safetensors"))
    stray = dict(weights) | {"base_model.model.lm_head.lora_A.weight": torch.zeros(2, 8)}
    with pytest.raises(AdapterFormatError, match="lm_head"):
        batched.load(0, stray, 1.0)
    half = {k: v for k, v in weights.items() if not k.endswith("down_proj.lora_B.weight")}
    with pytest.raises(AdapterFormatError, match="without its other half"):
        batched.load(0, half, 1.0)
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file(weights, str(broken / "adapter_model.safetensors"))
    with pytest.raises(AdapterFormatError, match="adapter_config.json"):
        batched.load_folder(0, str(broken))
    with pytest.raises(ValueError, match="slot 1"):
        batched.select([1, None])
    with torch.inference_mode():
        assert torch.equal(model(**enc).logits[:, -1], before)


def _variant(source: Path, folder: Path, config: dict, keep=lambda key: True) -> Path:
    """A copy of adapter `source` with `config` merged into its adapter_config.json and only the weights `keep`s."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    (folder / "adapter_config.json").write_text(
        json.dumps(json.loads((source / "adapter_config.json").read_text()) | config)
    )
    weights = load_file(str(source / "adapter_model.safetensors"))
    save_file({k: v for k, v in weights.items() if keep(k)}, str(folder / "adapter_model.safetensors"))
    return folder


def test_rslora_and_an_adapter_of_some_layers_match_peft_and_a_cleared_slot_serves_the_base_at_once(tiny, tmp_path):
    """An rsLoRA adapter (scale alpha / sqrt(r)) and one trained on layer 0 alone (`layers_to_transform`: the other
    layers run as the base, no zero products) answer as PEFT merges them; a slot cleared while a mixed batch names
    it serves its rows from the base with no new `select`. Mutations tried: the rsLoRA scale as alpha / r, and
    `clear` leaving the selection's gathered copy as it was: each fails a comparison below."""
    import torch

    from pipelines.bench.adapters import TARGETS
    from pipelines.triton_backend.batched_lora import BatchedLoRA

    a1 = tiny["adapters"]["a1"]
    rs = _variant(a1, tmp_path / "rs", {"use_rslora": True})
    low = _variant(a1, tmp_path / "low", {"layers_to_transform": [0]}, keep=lambda k: ".layers.0." in k)
    enc = _inputs(tiny["base"], 3)
    with torch.inference_mode():
        want = {
            name: _model(tiny["base"], folder)(**enc).logits[:, -1]
            for name, folder in (("rs", rs), ("low", low), ("a1", a1), (None, None))
        }
    assert not torch.allclose(want["rs"], want["a1"], atol=1e-3) and not torch.allclose(
        want["low"], want["a1"], atol=1e-3
    )
    model = _model(tiny["base"])
    batched = BatchedLoRA(model, TARGETS, slots=2)
    batched.load_folder(0, str(rs))
    batched.load_folder(1, str(low))
    batched.select([0, 1, None])
    with torch.inference_mode():
        got = model(**enc).logits[:, -1]
    for row, name in enumerate(["rs", "low", None]):
        assert torch.allclose(got[row], want[name][row], atol=1e-4, rtol=1e-4), name
    batched.select([1, 1, 1])
    assert {layer.mode for key, layer in batched.layers.items() if ".layers.0." not in key} == {"off"}
    batched.select([0, 1, 0])
    batched.clear(1)
    with torch.inference_mode():
        got = model(**enc).logits[:, -1]
    for row, name in enumerate(["rs", None, "rs"]):
        assert torch.allclose(got[row], want[name][row], atol=1e-4, rtol=1e-4), name
    with pytest.raises(ValueError, match="slot 1 holds no adapter"):
        batched.select([1, None, None])


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"peft_type": "IA3"}, "not LoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"alpha_pattern": {"q_proj": 4}}, "per-module alphas"),
        ({"lora_bias": True}, "LoRA biases"),
        ({"r": None}, "no usable rank"),
        ({"r": 3}, "the adapter's config says 3"),
        ("no-weights", "a1: no readable adapter_model.safetensors"),
        ("nan", "NaN or infinite"),
    ],
)
def test_each_unfit_adapter_folder_is_one_clear_error_and_the_slot_keeps_serving(tiny, tmp_path, change, reason):
    """Each refusal names the folder (never the server's path) and leaves the slot's adapter answering as before.
    Mutations tried: the UNSUPPORTED check removed (modules_to_save, alpha patterns, biases load: DID NOT RAISE),
    the rank-against-config check removed (r = 3 loads with a wrong scale), the finite check removed."""
    import torch
    from safetensors.torch import load_file, save_file

    from pipelines.bench.adapters import TARGETS
    from pipelines.triton_backend.batched_lora import AdapterFormatError, BatchedLoRA

    folder = _variant(tiny["adapters"]["a1"], tmp_path / "a1", change if isinstance(change, dict) else {})
    if change == "no-weights":
        (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")
    if change == "nan":
        weights = load_file(str(folder / "adapter_model.safetensors"))
        first = sorted(k for k in weights if "lora_B" in k)[0]
        weights[first][0, 0] = float("nan")
        save_file(weights, str(folder / "adapter_model.safetensors"))
    model = _model(tiny["base"])
    batched = BatchedLoRA(model, TARGETS, slots=1)
    batched.load_folder(0, str(tiny["adapters"]["a3"]))
    batched.select([0, 0])
    enc = _inputs(tiny["base"], 2)
    with torch.inference_mode():
        before = model(**enc).logits[:, -1].clone()
    with pytest.raises(AdapterFormatError, match=reason) as refused:
        batched.load_folder(0, str(folder))
    assert str(tmp_path) not in str(refused.value)
    with torch.inference_mode():
        assert torch.equal(model(**enc).logits[:, -1], before)


def test_a_slot_layer_follows_its_base_moved_replaced_or_hooked_and_its_slots_grown() -> None:
    """The direct path reads the base's own parameter table and the selected slot's views: a base with a bias,
    slots re-allocated for a larger rank while one adapter is selected, the model moved to float64, the base's
    weight replaced by a new Parameter, and a hook on the base each serve the merged answer (and the hook runs).
    Mutations tried: `_apply` not re-pointing the views (float64: a dtype error), the weight read from a stored
    reference (the replaced weight not served), the hooks not honoured (the hook never runs): each fails here."""
    import torch

    from pipelines.triton_backend.batched_lora import BatchedLoRA

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6, bias=True))
    base = model[0]

    def adapter(rank: int, seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {
            "0.lora_A.weight": torch.randn(rank, 8, generator=g),
            "0.lora_B.weight": torch.randn(6, rank, generator=g),
        }

    def merged(x: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        a, b = (weights[f"0.lora_{k}.weight"].to(base.weight.dtype) for k in "AB")
        return torch.nn.functional.linear(x, base.weight + 0.5 * b @ a, base.bias)

    batched = BatchedLoRA(model, ["0"], slots=3)
    small, large = adapter(2, 1), adapter(4, 2)
    batched.load(0, small, 0.5)
    batched.select([0, 0])  # one adapter for the batch: the direct path
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        assert torch.allclose(model(x), merged(x, small), atol=1e-5)
        batched.load(1, large, 0.5)  # rank 4: every slot re-allocated while slot 0 is selected
        assert batched.layers["0"].lora_a.shape[2] == 4 and torch.allclose(model(x), merged(x, small), atol=1e-5)
        model.double()
        assert torch.allclose(model(x.double()), merged(x.double(), small), atol=1e-9)
        base.weight = torch.nn.Parameter(torch.randn(6, 8, dtype=torch.float64))
        assert torch.allclose(model(x.double()), merged(x.double(), small), atol=1e-9)
        seen: list[int] = []
        base.register_forward_hook(lambda *_: seen.append(1))
        assert torch.allclose(model(x.double()), merged(x.double(), small), atol=1e-9) and seen == [1]
