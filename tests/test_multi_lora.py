"""Many adapters on one base (issue 26, item 6): the shared base's adapter cache in process (every row of a mixed
batch answered by its own adapter, a bounded cache that evicts and reloads, names that are never paths), and the
same through the real Triton server (`tests/test_serve.py::test_multi_lora_*`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipelines.config import load_settings

CAPACITY = 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """The tiny base model and three strong random adapters of it (a1..a3) in one adapter root."""
    from pipelines.base_models import prepare_base
    from pipelines.bench.adapters import make_adapters

    root = tmp_path_factory.mktemp("multi-lora")
    settings = load_settings(root=str(root))
    base = prepare_base("tiny-llama", settings)
    adapters = make_adapters(base, root / "adapters", ["a1", "a2", "a3"], rank=4, alpha=8, scale=30.0)
    return {"root": root, "base": base, "adapters": adapters, "settings": settings}


def _inputs(base: str, n: int):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    prompts = [f"where is my order {i}{i}{i}?" for i in range(n)]
    return tok(prompts, return_tensors="pt", padding=True)


def _merged_logits(base: str, folder: Path | None, enc):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    if folder is not None:
        model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    with torch.inference_mode():
        return model.eval()(**enc).logits[:, -1]


def test_a_mixed_batch_answers_each_row_with_its_own_adapter_and_the_cache_stays_bounded(tiny):
    """Rows of one batch name different adapters (and none): each row's logits are those of its own adapter
    merged into its own copy of the base. Three adapters through a cache of two: the least recently used one is
    evicted and loads again when asked, still right; a batch of one adapter (its slot read directly) and one of
    the base alone too. Mutations tried: `route` putting base rows on slot 0, or every row on the first row's
    slot, or selecting nothing (the previous batch's selection left): each fails the per-row comparison; `ensure`
    never evicting fails the bound (no free slot: StopIteration)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.triton_backend.lora_cache import BASE, AdapterCache

    base = AutoModelForCausalLM.from_pretrained(tiny["base"], torch_dtype=torch.float32).eval()
    logs: list[str] = []
    cache = AdapterCache(base, str(tiny["root"] / "adapters"), CAPACITY, log=logs.append)
    enc = _inputs(tiny["base"], 4)
    expected = {
        name: _merged_logits(tiny["base"], tiny["adapters"].get(name), enc) for name in ("a1", "a2", "a3", BASE)
    }
    assert not torch.allclose(expected["a1"], expected["a2"], atol=1e-3)  # the adapters differ: the test can see

    def served(names: list[str]):
        cache.ensure(names)
        cache.route(names)
        with torch.inference_mode():
            return cache.model(**enc).logits[:, -1]

    for names in (
        ["a1", "a2", BASE, "a1"],
        ["a3", "a1", "a3", BASE],
        ["a2", "a2", "a3", "a3"],
        ["a2"] * 4,
        [BASE] * 4,
        ["a3"] * 4,
    ):
        got = served(names)
        for row, name in enumerate(names):
            assert torch.allclose(got[row], expected[name][row], atol=1e-4), (names, row, name)
        assert len(cache.loaded) <= CAPACITY
    assert cache.stats()["loads"] == 4 and cache.stats()["evictions"] == 2, cache.stats()  # a2 came back
    assert list(cache.loaded) == ["a2", "a3"]
    assert any("evicted" in line for line in logs)


def test_a_batch_with_more_adapters_than_the_cache_holds_is_split_into_parts_that_fit():
    from pipelines.triton_backend.lora_cache import BASE, AdapterCache

    cache = AdapterCache(object(), "/nonexistent", 2)
    parts = cache.plan(["a", "b", "c", BASE, "a", "d", "c"])
    assert parts == [[0, 1, 3, 4], [2, 5, 6]]
    assert all(len({["a", "b", "c", BASE, "a", "d", "c"][i] for i in p} - {BASE}) <= 2 for p in parts)
    assert cache.plan([]) == []


@pytest.mark.parametrize(
    "name, reason",
    [
        ("../a1", "not an adapter name"),
        ("a1/../a2", "not an adapter name"),
        ("A1", "not an adapter name"),
        ("a9", "unknown adapter"),
    ],
)
def test_an_adapter_name_is_never_a_path_and_an_unknown_one_is_refused(tiny, name, reason):
    """Mutation tried: `folder` without the NAME check lets `../a1` resolve (the adapters' parent holds a1's
    folder when asked from a sub-folder root) and the traversal cases fail."""
    from pipelines.triton_backend.lora_cache import AdapterCache, AdapterError

    root = tiny["root"] / "adapters" / "nested"
    root.mkdir(exist_ok=True)
    shutil.copytree(tiny["adapters"]["a2"], root / "a2", dirs_exist_ok=True)
    cache = AdapterCache(object(), str(root), 2)
    assert cache.folder("a2") == str(root / "a2")
    with pytest.raises(AdapterError, match=reason):
        cache.folder(name)


def test_a_replaced_adapter_folder_is_loaded_afresh_not_served_from_the_cache(tiny, tmp_path):
    """Other weights renamed into place under a cached adapter's name (a registry reset that reused a version
    number) are what the next request gets. Mutation tried: `ensure` trusting the cached name alone fails it."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.triton_backend.lora_cache import AdapterCache

    root = tmp_path / "adapters"
    shutil.copytree(tiny["adapters"]["a1"], root / "v1")
    base = AutoModelForCausalLM.from_pretrained(tiny["base"], torch_dtype=torch.float32).eval()
    cache = AdapterCache(base, str(root), CAPACITY, log=lambda _: None)
    enc = _inputs(tiny["base"], 2)

    def served():
        cache.ensure(["v1", "v1"])
        cache.route(["v1", "v1"])
        with torch.inference_mode():
            return cache.model(**enc).logits[:, -1]

    assert torch.allclose(served(), _merged_logits(tiny["base"], tiny["adapters"]["a1"], enc), atol=1e-4)
    shutil.copytree(tiny["adapters"]["a3"], tmp_path / "staged")
    (root / "v1").rename(tmp_path / "old")
    (tmp_path / "staged").rename(root / "v1")
    assert torch.allclose(served(), _merged_logits(tiny["base"], tiny["adapters"]["a3"], enc), atol=1e-4)
    assert list(cache.loaded) == ["v1"] and cache.slot == {"v1": 0}


def test_a_project_owns_only_its_own_model_names(tmp_path):
    """`own_version` decides what a project's deploy may unload or retire and what its routes list: another
    project whose name starts alike (`tool_router_eu`) is never the default project's. Mutation tried: a
    prefix match (`startswith`) fails it."""
    from pipelines.serve.shared_base import is_own, own_version

    default = load_settings(root=str(tmp_path))
    shop = load_settings(root=str(tmp_path), project="shop")
    assert own_version(default, "tool_router_v3") == "3"
    assert own_version(default, "lora__smollm2@tool_router_v12") == "12"
    assert own_version(default, "tool_router_eu__tool_router_v1") is None
    assert own_version(default, "tool_router_vx__tool_router_v1") is None
    assert own_version(default, "shop__tool_router_v2") is None and own_version(shop, "shop__tool_router_v2") == "2"
    assert is_own(default, "tool_router_base") and not is_own(default, "lora__smollm2")
    assert not is_own(shop, "tool_router_v1")


def test_a_broken_adapter_is_its_requests_error_and_leaves_the_base_serving(tiny, tmp_path):
    """The first adapter a base loads is broken (its weights file is not safetensors): that load fails and leaves
    nothing cached, so the next adapter loads and answers right; an adapter deployed for another shared base is
    refused. Mutation tried: `_ensure_one` recording the adapter before its weights are in (the broken one cached,
    holding a slot) fails the assertion right after it."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.triton_backend.lora_cache import AdapterCache, AdapterError

    root = tmp_path / "adapters"
    shutil.copytree(tiny["adapters"]["a1"], root / "broken")
    (root / "broken" / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    shutil.copytree(tiny["adapters"]["a2"], root / "good")
    for name, shared in (("broken", "lora__tiny"), ("good", "lora__tiny")):
        (root / name / "flywheel.json").write_text(json.dumps({"shared": shared}))
    shutil.copytree(tiny["adapters"]["a3"], root / "elsewhere")
    (root / "elsewhere" / "flywheel.json").write_text(json.dumps({"shared": "lora__other"}))
    base = AutoModelForCausalLM.from_pretrained(tiny["base"], torch_dtype=torch.float32).eval()
    cache = AdapterCache(base, str(root), CAPACITY, log=lambda _: None, shared="lora__tiny")
    from pipelines.triton_backend.batched_lora import AdapterFormatError

    with pytest.raises(AdapterFormatError, match="adapter_model.safetensors"):
        cache.ensure(["broken"])
    assert not cache.loaded and not cache.slot
    enc = _inputs(tiny["base"], 2)
    cache.ensure(["good"])
    cache.route(["good", "good"])
    with torch.inference_mode():
        got = cache.model(**enc).logits[:, -1]
    assert torch.allclose(got, _merged_logits(tiny["base"], tiny["adapters"]["a2"], enc), atol=1e-4)
    with pytest.raises(AdapterError, match="deployed on lora__other"):
        cache.folder("elsewhere")


def test_one_unfit_adapter_is_its_own_rows_error_and_evicts_nothing(tiny, tmp_path):
    """A batch naming a broken adapter beside cached good ones (the cache full): `ensure_each` reports the broken
    one alone, loads the others, and evicts nothing for it (its folder is read and checked before a slot is
    freed), so asking for it again and again never churns the cache. Mutation tried: evicting before reading
    (the old order) fails the `loaded` and eviction checks."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.triton_backend.lora_cache import AdapterCache

    root = tmp_path / "adapters"
    for name in ("a1", "a2"):
        shutil.copytree(tiny["adapters"][name], root / name)
    shutil.copytree(tiny["adapters"]["a3"], root / "dora")
    config = json.loads((root / "dora" / "adapter_config.json").read_text()) | {"use_dora": True}
    (root / "dora" / "adapter_config.json").write_text(json.dumps(config))
    base = AutoModelForCausalLM.from_pretrained(tiny["base"], torch_dtype=torch.float32).eval()
    cache = AdapterCache(base, str(root), CAPACITY, log=lambda _: None)
    cache.ensure(["a1", "a2"])
    for _ in range(3):
        failed = cache.ensure_each(["a1", "dora"])
        assert list(failed) == ["dora"] and "DoRA" in failed["dora"]
    assert list(cache.loaded) == ["a2", "a1"] and cache.evictions == 0 and cache.loads == 2


def test_the_triton_model_answers_a_batch_whose_one_adapter_is_unfit(tiny, tmp_path, monkeypatch):
    """`execute` (the Triton model's batch entry, with a stand-in for Triton's Python stub module): a batch of a
    good adapter, an unfit one (DoRA), the base and the good one again: the unfit row gets exactly one final
    error, the three others are generated together, each sender closed once. Mutation tried: `execute` failing
    the whole part when `ensure_each` reports a failure (the old behaviour) fails the answered rows check."""
    import importlib
    import json
    import sys
    import types

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.triton_backend.lora_cache import AdapterCache

    # a stand-in for Triton's Python stub module, which only tritonserver provides; the real module and model run in
    # tests/test_serve.py::test_multi_lora_serves_every_version_as_an_adapter_on_one_loaded_base
    stub = types.ModuleType("triton_python_backend_utils")
    stub.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    stub.TritonError = lambda message: ("error", message)
    stub.InferenceResponse = lambda output_tensors, error=None: {"tensors": output_tensors, "error": error}
    stub.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    monkeypatch.delitem(sys.modules, "pipelines.triton_backend.model", raising=False)
    triton_model = importlib.import_module("pipelines.triton_backend.model")

    class Tensor:
        """A stand-in for the stub module's `Tensor` (real: the same test_serve.py test)."""

        def __init__(self, value):
            self.value = value

        def as_numpy(self):
            return np.array([[self.value]], dtype=np.object_)

    class Sender:
        """A stand-in for a decoupled request's `InferenceResponseSender` (real: the same test_serve.py test)."""

        def __init__(self):
            self.sent = []

        def send(self, response, flags=0):
            self.sent.append((response, flags))

    class Request:
        """A stand-in for the stub module's `InferenceRequest` (real: the same test_serve.py test)."""

        def __init__(self, adapter):
            self.sender = Sender()
            self.inputs = {"CONVERSATION": Tensor(b"[]")} | ({"ADAPTER": Tensor(adapter.encode())} if adapter else {})

        def get_response_sender(self):
            return self.sender

    root = tmp_path / "adapters"
    shutil.copytree(tiny["adapters"]["a1"], root / "good")
    shutil.copytree(tiny["adapters"]["a3"], root / "dora")
    config = json.loads((root / "dora" / "adapter_config.json").read_text()) | {"use_dora": True}
    (root / "dora" / "adapter_config.json").write_text(json.dumps(config))
    model = triton_model.TritonPythonModel()
    base = AutoModelForCausalLM.from_pretrained(tiny["base"], torch_dtype=torch.float32).eval()
    model.lora = AdapterCache(base, str(root), CAPACITY, log=lambda _: None)
    # stand-ins for the model's tools and prompt from a request (real: the same test_serve.py test)
    model._tools = lambda request: None
    model._prompt = lambda raw: ("prompt", 1)
    generated = []

    def run(_model, rows, kwargs):
        """A stand-in for the model's generation (`_run`): one answer a row. The real generation runs in
        tests/test_serve.py::test_multi_lora_serves_every_version_as_an_adapter_on_one_loaded_base."""
        generated.append([row[5] for row in rows])
        for sender, *_ in rows:
            sender.send({"tensors": ["answer"], "error": None}, flags=1)

    model._run = run
    requests = [Request(name) for name in ("good", "dora", "", "good")]
    model.execute(requests)
    assert generated == [["good", "", "good"]]
    for request, name in zip(requests, ("good", "dora", "", "good")):
        assert len(request.sender.sent) == 1 and request.sender.sent[0][1] == 1, name
        error = request.sender.sent[0][0]["error"]
        assert (error is not None) == (name == "dora"), (name, error)
    assert "DoRA" in requests[1].sender.sent[0][0]["error"][1]


def test_a_rank_cap_refuses_larger_adapters_at_deploy_and_in_the_shared_base(tiny, tmp_path):
    """`triton.max_adapter_rank`: a version whose rank is over it is refused at deploy (nothing written under the
    adapter root) and, should one be there anyway, by the shared base as its own rows' error; adapters within it
    load at no more than the cap. (Mutations tried: the deploy check skipped writes the folder; the cache not
    passing its rank to the engine loads the rank-4 adapter.)"""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.config import ConfigError
    from pipelines.serve import shared_base
    from pipelines.triton_backend.lora_cache import AdapterCache

    capped = load_settings(root=str(tmp_path), triton={"multi_lora": True, "max_adapter_rank": 2})
    with pytest.raises(ConfigError, match="rank 4 is over triton.max_adapter_rank 2"):
        shared_base.write_adapter(capped, "tool_router_v1", str(tiny["adapters"]["a1"]), {"registry_version": "1"})
    root = shared_base.adapter_root(capped)
    assert not root.exists() or not list(root.iterdir())  # nothing put in place, no staging left
    assert shared_base.shared_params(capped, root)["max_adapter_rank"] == "2"
    roomy = capped.model_copy(update={"triton": capped.triton.model_copy(update={"max_adapter_rank": 4})})
    assert (
        shared_base.write_adapter(roomy, "tool_router_v1", str(tiny["adapters"]["a1"]), {}) / "adapter_config.json"
    ).is_file()

    base = AutoModelForCausalLM.from_pretrained(tiny["base"], torch_dtype=torch.float32).eval()
    cache = AdapterCache(base, str(tiny["root"] / "adapters"), CAPACITY, log=lambda _: None, rank=2)
    failed = cache.ensure_each(["a1", "a2"])
    assert set(failed) == {"a1", "a2"} and "rank 4 is over" in failed["a1"] and not cache.loaded
    base = AutoModelForCausalLM.from_pretrained(tiny["base"], torch_dtype=torch.float32).eval()
    cache = AdapterCache(base, str(tiny["root"] / "adapters"), CAPACITY, log=lambda _: None, rank=4)
    assert cache.ensure_each(["a1", "a2"]) == {}
    assert {layer.lora_a.shape[2] for layer in cache.engine.layers.values()} == {4}
