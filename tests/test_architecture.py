"""The house's rules, read from the code: no import cycle under `pipelines/`, no stage importing a stage above
it (lazy imports inside functions and TYPE_CHECKING imports count too), and no file past ~450 lines."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"

# Low to high: a module may import its own layer and the layers below it, never one above.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the foundation every stage stands on: settings, storage, errors, statistics, the hardware table, one thin
    # client per external system, the local servers' processes
    (
        "__init__",
        "errors",
        "storage",
        "config",
        "config_sections",
        "window",
        "reports",
        "embeddings",
        "security",
        "services",
        "stats",
        "hardware",
        "api_errors",
        "clients",
        "stack",
    ),
    ("logs", "redact"),  # the log format, the tool catalogue and effects, toolsets; PII redaction
    ("simulate",),  # traffic that is not the agent's: the generator, tau-bench replay, importers
    ("toolcall",),  # the tool-call contract: prompt styles, call text, grammar, decoding, scoring
    ("base_models",),  # the base-model catalogue: load, prepare, context window
    ("prep",),  # raw -> curated, and the curated data read back (prep.dataset)
    ("quality", "features"),
    ("train",),
    ("evaluate",),
    ("registry",),
    ("triton_backend",),  # runs inside Triton's Python backend (imports nothing from pipelines)
    ("serve",),  # Triton: model repository writers, deploy / rollback / canary, the client
    ("admission",),  # per-project quotas and usage, fair turns at the shared model, the replicas' exchange
    ("projects",),  # AI projects: the registry (members, keys, quotas), MLflow / Airflow access, showback
    ("livegate",),  # route modes and the live statistical gate against the teacher
    ("gateway",),  # the OpenAI-compatible front door (reaches models through serve.client)
    ("drift",),
    ("bench",),
    ("cluster",),  # every Kubernetes manifest and Helm values the platform writes
    ("tasks", "airflow_tasks", "schedules", "demo", "cli"),  # wiring: the DAGs' tasks, schedules, demo, CLI
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py", modules)


def imports_in(source: str, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """Every `pipelines` module the source of module `name` imports, anywhere in it (a name imported from a
    package counts as its submodule when there is one)."""
    package = name if is_package else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pipelines"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("pipelines"):
                continue
            found.add(source)
            found.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules)
    return {m for m in found if m in modules and m != name}


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph() -> dict[str, set[str]]:
    files = sorted(PIPELINES.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b} ({stage_of(a)} imports {stage_of(b)}, a layer above it)"
        for a, targets in edges.items()
        for b in targets
        if RANK[stage_of(b)] > RANK[stage_of(a)]
    )


def test_every_stage_has_a_layer() -> None:
    unplaced = {stage_of(m) for m in graph()} - set(RANK)
    assert not unplaced, f"place these in LAYERS: {sorted(unplaced)}"


def test_no_import_cycle_under_pipelines() -> None:
    assert cycles(graph()) == []


def test_no_stage_imports_a_stage_above_it() -> None:
    assert upward(graph()) == []


def test_the_checks_find_what_they_guard() -> None:
    """The walker and both checks on a made-up graph: a loop and an upward import are found."""
    edges: dict[str, set[str]] = defaultdict(set)
    edges["pipelines.toolcall.score"] = {"pipelines.evaluate.pipeline"}
    edges["pipelines.evaluate.pipeline"] = {"pipelines.evaluate.report"}
    edges["pipelines.evaluate.report"] = {"pipelines.evaluate.pipeline"}
    assert cycles(edges) == [["pipelines.evaluate.pipeline", "pipelines.evaluate.report"]]
    assert upward(edges) == [
        "pipelines.toolcall.score -> pipelines.evaluate.pipeline (toolcall imports evaluate, a layer above it)"
    ]


def test_lazy_and_type_checking_imports_are_walked() -> None:
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipelines.evaluate import report\n"
        "def f():\n    from pipelines.serve.client import TritonClient\n    from . import metrics\n"
    )
    found = imports_in(
        source,
        "pipelines.toolcall.probe",
        False,
        {"pipelines.evaluate.report", "pipelines.serve.client", "pipelines.toolcall.metrics", "pipelines.toolcall"},
    )
    assert found == {
        "pipelines.evaluate.report",
        "pipelines.serve.client",
        "pipelines.toolcall",
        "pipelines.toolcall.metrics",
    }


@pytest.mark.parametrize("path", sorted(PIPELINES.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_is_a_big_room(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines (split it by concern)"


@pytest.mark.parametrize(
    "path",
    [
        "pipelines/toolcall/grammar.py",
        "pipelines/triton_backend/model.py",
        "pipelines/triton_backend/lora_cache.py",
        "pipelines/triton_backend/batched_lora.py",
    ],
)
def test_what_the_triton_model_runs_imports_nothing_from_pipelines(path: str) -> None:
    """Copied into the model repository and run in the serving venv: an import of `pipelines` there fails (the
    files copied beside each other may import each other: `from . import batched_lora` in a package's tests)."""
    modules = {module_name(f) for f in PIPELINES.rglob("*.py")} | {"pipelines"}
    copied_together = {"pipelines.triton_backend", "pipelines.triton_backend.batched_lora"}
    assert imports_of(ROOT / path, modules) - copied_together == set()
    assert "import pipelines" not in (ROOT / path).read_text() and "from pipelines" not in (ROOT / path).read_text()
