"""Fixtures shared by the tests that run the real Triton server (test_serve, test_faults_serving):
settings on free loopback ports, and two registered tiny-model versions (v1 champion, v2 candidate).
A test module uses them with `from serving_fixtures import registered  # noqa: F401`; the fixture is
module-scoped, so each module trains once and stops its own server at the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from ports import free_port
from train_data import write_training_set

from pipelines.config import load_settings

TINY = str(Path(__file__).resolve().parent.parent / "conf" / "sweeps" / "tiny.yaml")


def triton_settings(root: Path, **extra):
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    return load_settings(
        root=str(root),
        evaluation={"examples": 4, "shots": 0},
        triton={
            **ports,
            "smoke_requests": 3,
            "smoke_min_valid_json": 0.0,
            "max_new_tokens": 12,
            "max_input_tokens": 2048,
            **extra,
        },
    )


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory):
    """Two registered versions of tiny-model adapters: v1 champion, v2 candidate; a server on free ports."""
    from pipelines import tasks
    from pipelines.stack import triton as server

    root = tmp_path_factory.mktemp("serve-root")
    write_training_set(root)
    settings = triton_settings(root)
    rows = {
        "table": [
            {"condition": "base_few_shot", "exact_match": 0.2, "arg_f1": 0.2, "latency_ms_p50": 300},
            {"condition": "tuned_candidate", "exact_match": 0.5, "arg_f1": 0.5, "latency_ms_p50": 100},
        ]
    }
    first = tasks.register(settings, tasks.train(settings, {"sweep": TINY}), rows)
    tasks.promote(settings, first, rows, {})
    second = tasks.register(settings, tasks.train(settings, {"sweep": tiny_variant(root)}), rows)
    yield {"settings": settings, "v1": first["version"], "v2": second["version"]}
    server.down(settings)


def tiny_variant(root: Path) -> str:
    import yaml

    data = yaml.safe_load(Path(TINY).read_text())
    data.update(name="tiny-b", grid={"learning_rate": [2e-2]})
    path = root / "tiny-b.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)
