"""The layering rules, read from the code: no import cycle under `pipelines/`, no stage importing a stage above
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
        "locks",
        "config",
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
    ("prep",),  # raw -> curated, the curated data read back (prep.dataset), the preference pairs (prep.pairs)
    ("quality", "features"),
    ("train",),
    ("tune",),  # after SFT: DPO on the preference pairs (prep.pairs), GRPO on the scorer's reward
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
    # wiring: the DAGs' tasks and their progress, schedules, the demos, the CLI
    ("tasks", "airflow_tasks", "progress", "schedules", "demo", "demo_drift", "cli"),
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


# ---- functions a newcomer can read, state passed not hidden -------------------------------------------------
MAX_FUNCTION_LINES = 80
# The entry points, where settings are built from what the caller gave (command line, DAG, environment), and the
# settings loader itself: the only places that may read or write FLYWHEEL_* variables of the process.
ENTRY_POINTS = (
    "pipelines/config/__init__.py",
    "pipelines/cli/",
    "pipelines/airflow_tasks.py",
    "pipelines/gateway/__main__.py",
    "pipelines/prep/__main__.py",
    "pipelines/train/pod.py",
)
# What serves traffic never imports what trains: the catalogue, statistics and redaction it needs live low.
SERVING = ("serve", "gateway", "livegate", "admission", "triton_backend")
TRAINING_SIDE = ("train", "tune", "evaluate", "quality")


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function longer than `limit` lines, its docstring not counted."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines -= first.end_lineno - first.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def flywheel_env_uses(source: str) -> list[int]:
    """Lines that read or write a FLYWHEEL_* variable of the process environment: `os.environ[...]`, its
    get/pop/setdefault/update, `... in os.environ`, `os.getenv`/`putenv`/`unsetenv`; the key a literal, an
    f-string or a module-level constant."""
    tree = ast.parse(source)
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }

    def flywheel(key: ast.AST | None) -> bool:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value.startswith("FLYWHEEL_")
        if isinstance(key, ast.Name):
            return constants.get(key.id, "").startswith("FLYWHEEL_")
        if isinstance(key, ast.JoinedStr) and key.values:
            return flywheel(key.values[0])
        if isinstance(key, ast.Dict):
            return any(flywheel(k) for k in key.keys)
        return False

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" and getattr(node.value, "id", "") == "os"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value) and flywheel(node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target, name = node.func.value, node.func.attr
            env_method = is_environ(target) and name in ("get", "pop", "setdefault", "update", "__getitem__")
            os_call = getattr(target, "id", "") == "os" and name in ("getenv", "putenv", "unsetenv")
            if (env_method or os_call) and node.args and flywheel(node.args[0]):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators) and flywheel(node.left):
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize("path", sorted(PIPELINES.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_is_longer_than_a_screen_or_two(path: Path) -> None:
    assert long_functions(path.read_text()) == [], f"{path.relative_to(ROOT)}: split these into named steps"


def test_only_entry_points_and_the_settings_loader_touch_flywheel_variables() -> None:
    """The project and every setting reach the code as parameters: no stage reads or writes the environment."""
    found = {
        str(path.relative_to(ROOT)): flywheel_env_uses(path.read_text())
        for path in sorted(PIPELINES.rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(ENTRY_POINTS)
    }
    assert {f: lines for f, lines in found.items() if lines} == {}


def test_what_serves_traffic_imports_nothing_that_trains() -> None:
    edges = graph()
    found = sorted(
        f"{a} -> {b}"
        for a, targets in edges.items()
        if stage_of(a) in SERVING
        for b in targets
        if stage_of(b) in TRAINING_SIDE
    )
    assert found == []


def test_the_new_checks_find_what_they_guard() -> None:
    """Each check on a made-up source: a long function, every way of touching a FLYWHEEL_* variable."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    assert long_functions(f'def big():\n    """doc"""\n{body}\n') == [("big", MAX_FUNCTION_LINES + 2)]  # with `def`
    assert long_functions(f'def ok():\n    """doc\n    more"""\n{body[: body.rindex(chr(10))]}\n') == [
        ("ok", MAX_FUNCTION_LINES + 1)
    ]
    fits = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    assert long_functions(f'def fits():\n    """a docstring\n    of two lines"""\n{fits}\n') == []
    source = (
        "import os\nNAME = 'FLYWHEEL_PROJECT'\n"
        "os.environ['FLYWHEEL_ROOT'] = 'x'\n"  # 3
        "a = os.environ.get(NAME)\n"  # 4
        "b = os.getenv(f'FLYWHEEL_{a}')\n"  # 5
        "c = 'FLYWHEEL_X' in os.environ\n"  # 6
        "os.environ.pop('FLYWHEEL_Y', None)\n"  # 7
        "os.environ.update({'FLYWHEEL_Z': '1'})\n"  # 8
        "d = os.environ.get('HOME')\n"  # not ours
        "env = {'FLYWHEEL_ROOT': 'x'}\n"  # a child's environment, built explicitly: fine
    )
    assert flywheel_env_uses(source) == [3, 4, 5, 6, 7, 8]
