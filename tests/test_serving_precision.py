"""Serving precision (issue 52, item 2): the Triton model's `auto` precision runs a batch of `bf16_min_rows` or more on
its bf16 copy and a smaller one on fp32; the benchmark's comparison pairs each precision's answers with fp32's. The
same through the real Triton server: `tests/test_serve.py::test_multi_lora_serves_every_version_as_an_adapter_on_one_
loaded_base` (the benchmark's copies at fp32, bf16 and auto, loaded, timed and unloaded)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types

import numpy as np
import pytest

from pipelines.bench.results import precision_comparison
from pipelines.config import load_settings


def _stub_pb_utils() -> types.ModuleType:
    """A stand-in for Triton's Python stub module (only tritonserver provides it; the real one runs the same model.py
    in tests/test_serve.py)."""
    stub = types.ModuleType("triton_python_backend_utils")
    stub.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    stub.TritonError = lambda message: ("error", message)
    stub.InferenceResponse = lambda output_tensors, error=None: {"tensors": output_tensors, "error": error}
    stub.Tensor = lambda name, value: (name, value)
    stub.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    stub.Logger = types.SimpleNamespace(log_info=lambda _: None, log_warn=lambda _: None)
    return stub


class _Tensor:
    def __init__(self, value: object) -> None:
        self.value = value

    def as_numpy(self) -> np.ndarray:
        return np.array([[self.value]], dtype=np.object_)


class _Request:
    """A stand-in for a decoupled request (real: the test_serve.py tests above): its input and its sent responses."""

    def __init__(self, text: str) -> None:
        turns = [{"role": "user", "content": text}]
        self.inputs = {"CONVERSATION": _Tensor(json.dumps(turns).encode())}
        self.sent: list[tuple[dict, int]] = []

    def get_response_sender(self) -> _Request:
        return self

    def send(self, response: dict, flags: int = 0) -> None:
        self.sent.append((response, flags))


@pytest.fixture(scope="module")
def auto_model(tmp_path_factory: pytest.TempPathFactory):
    """The Triton model (model.py as a deploy writes it) on the tiny base, initialised at precision auto."""
    from pipelines.base_models import prepare_base
    from pipelines.serve import repository

    root = tmp_path_factory.mktemp("precision")
    settings = load_settings(root=str(root), triton={"precision": "auto", "bf16_min_rows": 3})
    base = prepare_base("tiny-llama", settings)
    folder, _ = repository.write_model(
        settings,
        root,
        "probe",
        base,
        None,
        {"registry_version": "1", "base_model": "tiny-llama", "prompt_style": "short", "model": "probe"},
        limits=(256, 8),
    )
    config = (folder / "config.pbtxt").read_text()
    params = dict(re.findall(r'key: "(\w+)" value: \{ string_value: ("[^"]*") \}', config))
    assert params["precision"] == '"auto"' and params["bf16_min_rows"] == '"3"'  # the settings reach the folder
    sys.modules["triton_python_backend_utils"] = _stub_pb_utils()
    spec = importlib.util.spec_from_file_location("probe_model", folder / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the dispatch is this test's subject, on any CPU: the backend's own bf16 check (tests/test_hardware.py) is
    # answered yes here, and `test_auto_precision_serves_fp32_on_a_cpu_without_bf16_units` answers it no
    module._cpu_has_bf16 = lambda: True
    model = module.TritonPythonModel()
    model.initialize(_initialize_args(folder, params))
    model.probe = (module, folder, params)  # to load it again
    yield model
    sys.modules.pop("triton_python_backend_utils", None)


def _initialize_args(folder, params: dict[str, str]) -> dict:
    model_config = {"parameters": {k: {"string_value": json.loads(v)} for k, v in params.items()}}
    return {
        "model_config": json.dumps(model_config),
        "model_repository": str(folder),
        "model_version": "1",
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
        "model_name": "probe",
    }


def test_auto_precision_runs_a_batch_from_bf16_min_rows_on_bf16_and_a_smaller_one_on_fp32(auto_model) -> None:
    """Mutations tried: `_model_for` always returning the fp32 model, and its `>=` as `>`: each fails."""
    import torch

    assert auto_model.model.dtype == torch.float32 and auto_model.model_bf16.dtype == torch.bfloat16
    ran = []
    real = auto_model._run

    def run(model, valid, kwargs):
        ran.append((len(valid), model.dtype))
        return real(model, valid, kwargs)

    auto_model._run = run
    try:
        for n in (1, 2, 3, 5):
            requests = [_Request(f"where is order {i}?") for i in range(n)]
            auto_model.execute(requests)
            for request in requests:  # every request answered once, finally, without an error
                finals = [r for r, flags in request.sent if flags == 1]
                assert len(finals) == 1 and finals[0]["error"] is None, request.sent
    finally:
        auto_model._run = real
    assert ran == [(1, torch.float32), (2, torch.float32), (3, torch.bfloat16), (5, torch.bfloat16)]


def test_auto_precision_serves_fp32_on_a_cpu_without_bf16_units(auto_model) -> None:
    """Without bf16 units torch emulates bf16 many times slower than fp32: `auto` keeps no bf16 copy and every batch
    runs fp32. Mutation tried: the fallback removed from `initialize`: it fails."""
    import torch

    module, folder, params = auto_model.probe
    module._cpu_has_bf16 = lambda: False
    try:
        model = type(auto_model)()
        model.initialize(_initialize_args(folder, params))
    finally:
        module._cpu_has_bf16 = lambda: True
    assert model.precision == "fp32" and model.model_bf16 is None and model.model.dtype == torch.float32
    assert model._model_for(8) is model.model


def test_an_unknown_precision_is_the_model_loads_error(auto_model) -> None:
    model = type(auto_model)()
    config = {"parameters": {"base_model_path": {"string_value": "unused"}, "precision": {"string_value": "fp8"}}}
    with pytest.raises(ValueError, match="precision: expected one of fp32, bf16, auto, got 'fp8'"):
        model.initialize({"model_config": json.dumps(config), "model_repository": "/nonexistent", "model_version": "1"})


def _run(concurrency: int, exact: list[int], tokens_per_s: float, itl: float, wrong: int = 0) -> dict:
    return {
        "concurrency": concurrency,
        "exact": exact,
        "output_tokens_per_s": tokens_per_s,
        "requests_per_s": tokens_per_s / 10,
        "ttft_ms": 100.0,
        "itl_ms": itl,
        "wrong_writes": wrong,
        "errors": 0,
    }


def test_the_precision_comparison_pairs_each_request_with_fp32s_at_the_same_concurrency() -> None:
    """The same answers on both sides: paired, quality held (an unpaired interval of two halves right is far wider);
    as accurate overall but each request answered the other way: not held. Mutations tried: exact match compared
    unpaired (two independent resamples) and the reference taken from another concurrency level: each fails."""
    right = [1, 0] * 48
    shifted = [0, 1] * 48
    found = precision_comparison(
        {
            "fp32": [_run(1, right, 100.0, 20.0), _run(4, right, 200.0, 30.0)],
            "bf16": [_run(1, right, 90.0, 22.0), _run(4, shifted, 400.0, 15.0, wrong=1)],
        }
    )
    rows = {(r["precision"], r["concurrency"]): r for r in found["rows"]}
    assert set(rows) == {("bf16", 1), ("bf16", 4)} and found["reference"] == "fp32"
    same, moved = rows[("bf16", 1)], rows[("bf16", 4)]
    assert same["output_tokens_per_s_ratio"] == 0.9 and same["itl_ratio"] == 1.1
    assert moved["output_tokens_per_s_ratio"] == 2.0 and moved["itl_ratio"] == 0.5
    assert same["exact_match_diff"]["diff"] == 0 and same["quality_held"]
    assert moved["exact_match_diff"]["diff"] == 0  # the same mean ...
    assert moved["exact_match_diff"]["low"] < -0.15 and not moved["quality_held"]  # ... but paired, far from held
    assert moved["wrong_writes"] == {"bf16": 1, "fp32": 0} and moved["exact_match_diff"]["n"] == 96
    assert precision_comparison({"bf16": [_run(1, right, 1.0, 1.0)]}) == {}  # nothing to compare with


@pytest.mark.parametrize(
    ("triton", "units", "expected"),
    [
        ({"precision": "bf16"}, True, "bf16"),
        ({"precision": "fp32"}, True, "fp32"),
        ({"precision": "auto"}, True, "fp32"),  # a single request runs on auto's fp32 copy
        ({"precision": "auto", "bf16_min_rows": 1}, True, "bf16"),  # ... unless one row is enough for bf16
        ({"precision": "auto", "bf16_min_rows": 1, "multi_lora": True}, True, "fp32"),  # a shared base: auto is fp32
        ({"precision": "bf16"}, False, "fp32"),  # no bf16 units: fp32 whatever the setting says
    ],
)
def test_load_as_served_loads_at_the_precision_a_single_request_is_served_at(
    tmp_path, monkeypatch, triton: dict, units: bool, expected: str
) -> None:
    """`base_models.load_as_served`, what evaluation, the sweep's validation, the benchmark's direct rows and the
    episodes run decode with: the precision the Triton model (`triton_backend/model.py`) serves one request at."""
    import torch

    from pipelines import hardware
    from pipelines.base_models import load_as_served, precision_of, served_precision

    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: units)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    settings = load_settings(root=str(tmp_path), triton=triton)
    model, _ = load_as_served("tiny-llama", settings)
    assert precision_of(model) == served_precision(settings, "the test") == expected


def test_every_decoder_that_claims_to_decode_as_served_loads_as_served() -> None:
    """Evaluation, the sweep's validation, the benchmark's direct rows and the episodes run load through
    `load_as_served` (a `load_model` there would decode fp32 while Triton serves bf16)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "pipelines"
    for path in ("evaluate/pipeline.py", "evaluate/episode_run.py", "train/sweep_results.py", "bench/serving.py"):
        text = (root / path).read_text()
        assert "load_as_served(" in text and "load_model(" not in text, path
