"""The results pages, rendered from the results files (never typed): docs/results/benchmarks.md and quality.md.

Every `*.json` under the results folder (bench/results/) becomes a section: what was measured, where it came
from (commit, date, machine, command, seeds; settings collapsed), its key figures with their n and, for a
comparison, the interval the file records (or the words "no interval recorded"), and plots where the data is a
curve (PNG files under docs/results/img/). A results file without a commit is refused (ResultsError).

Usage, from the repository root:
    .venv/bin/python -m docs.generate.results [--results bench/results] [--out docs/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docs.generate import multi_lora, projects, quality, serving, training
from docs.generate.md import Body, code, num, table
from docs.generate.provenance import ResultsError, lines, read, shown
from docs.generate.result import Result

__all__ = ["ResultsError", "main", "render"]

Renderer = Callable[[Result], Body]


@dataclass(frozen=True)
class Family:
    title: str
    page: str  # the page's file stem: "benchmarks" or "quality"
    render: Renderer


def generic(result: Result) -> Body:
    """A file no family knows: its provenance and its top-level scalar fields."""
    d = result.data
    what = next((d[k] for k in ("what", "benchmark", "bench", "note") if isinstance(d.get(k), str)), None)
    skip = {"commit", "commit_note", "settings", "argv", "command", "seeds"}
    scalars = [(code(k), v if isinstance(v, str) else num(v)) for k, v in d.items() if not_nested(v) and k not in skip]
    nested = [k for k, v in d.items() if not not_nested(v) and k not in skip]
    blocks = [table(["field", "value"], scalars)] if scalars else []
    if nested:
        blocks.append("Not rendered (nested; see the file): " + ", ".join(code(k) for k in nested) + ".")
    return Body(f"{what or result.stem} (no renderer for this kind of file: its top-level fields).", blocks)


def not_nested(value: Any) -> bool:
    return not isinstance(value, (dict, list))


PAGES = {"benchmarks": "Benchmark results", "quality": "Quality results"}
FAMILIES: dict[str, Family] = {
    "real_data": Family("Real-data evaluation", "quality", quality.real_data),
    "episodes": Family("Episodes against the retail environment", "quality", quality.episodes),
    "tune_slip": Family("Tuning from outcomes: an injected teacher slip", "quality", quality.tune_slip),
    "tune_retail": Family("Tuning after SFT on tau-bench retail", "quality", quality.tune_retail),
    "gateway": Family("Gateway against Triton direct", "benchmarks", serving.gateway),
    "aiperf": Family("AIPerf through the gateway", "benchmarks", serving.aiperf),
    "serving_precision": Family("Serving in bf16 and fp32 on the CPU", "benchmarks", serving.serving_precision),
    "triton_threads": Family("Triton instances and threads", "benchmarks", serving.triton_threads),
    "threads_under_load": Family("Torch threads under load", "benchmarks", serving.threads_under_load),
    "grammar": Family("Constrained decoding", "benchmarks", serving.grammar),
    "shared_prefix": Family("Decoding requests that open alike", "benchmarks", serving.shared_prefix),
    "overload": Family("Overload", "benchmarks", serving.overload),
    "multi_lora": Family("Multi-LoRA engine", "benchmarks", multi_lora.engine),
    "multi_lora_serving": Family("Multi-LoRA through Triton", "benchmarks", multi_lora.serving),
    "projects": Family("Projects: isolation and noisy neighbour", "benchmarks", projects.projects),
    "fair_replicas": Family("Fair turns across gateway replicas", "benchmarks", projects.fair_replicas),
    "prep": Family("Data preparation", "benchmarks", training.prep),
    "train": Family("Training backends", "benchmarks", training.train),
    "train_precision": Family("Training in bf16 and fp32 on the CPU", "benchmarks", training.train_precision),
    "tune_precision": Family("Tuning after SFT in bf16 and fp32 on the CPU", "benchmarks", training.train_precision),
    "demo": Family("`make demo` after the install", "benchmarks", training.demo),
    "drift_check": Family("The drift check, cold and incremental", "benchmarks", training.drift_check),
    "pods": Family("Training pods", "benchmarks", training.pods),
    "nemo_bf16": Family("NeMo AutoModel's bf16 steps on the CPU, by op", "benchmarks", training.nemo_bf16),
    "generic": Family("Other results", "benchmarks", generic),
}


def family_of(path: Path, data: dict[str, Any]) -> str:
    """The file's own `benchmark`/`bench` key, else the longest family name its file name starts with."""
    key = data.get("benchmark") or data.get("bench")
    if isinstance(key, str) and key in FAMILIES:
        return key
    prefixes = [k for k in FAMILIES if path.stem == k or path.stem.startswith(k + "_")]
    return max(prefixes, key=len) if prefixes else "generic"


def load(path: Path, img_dir: Path) -> Result:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ResultsError(f"{shown(path)}: not a readable JSON results file ({e})") from e
    if not isinstance(data, dict):
        raise ResultsError(f"{shown(path)}: not a results file (a JSON object expected)")
    return Result(path, data, read(data, path), img_dir)


def section(result: Result, family: Family) -> str:
    body = family.render(result)
    parts = [f"### {result.name}", body.what, *lines(result.prov, result.data), *body.blocks]
    return "\n\n".join(p for p in parts if p)


def page(title: str, results_dir: Path, by_family: dict[str, list[str]]) -> str:
    head = (
        f"# {title}\n\n"
        f"Rendered from `{shown(results_dir)}/*.json` by `python -m docs.generate.results` (`make docs`); "
        "do not edit: re-run a benchmark and render again. Each section names its commit, date and machine; "
        "an interval is shown where the file records one, and never computed here."
    )
    parts = [head] + [f"## {FAMILIES[f].title}\n\n" + "\n\n".join(s) for f, s in by_family.items() if s]
    return "\n\n".join(parts) + "\n"


def render(results_dir: Path, out_dir: Path) -> list[Path]:
    """Render every results file under `results_dir` into `out_dir`; the pages' paths (then the plots')."""
    files = sorted(results_dir.glob("*.json"))
    if not files:
        raise ResultsError(f"{shown(results_dir)}: no results files (*.json)")
    img_dir = out_dir / "img"
    results = [load(p, img_dir) for p in files]  # every file checked before anything is written
    for old in img_dir.glob("*.png"):
        old.unlink()
    sections: dict[str, dict[str, list[str]]] = {p: {f: [] for f in FAMILIES} for p in PAGES}
    for result in results:
        key = family_of(result.path, result.data)
        sections[FAMILIES[key].page][key].append(section(result, FAMILIES[key]))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, title in PAGES.items():
        target = out_dir / f"{stem}.md"
        target.write_text(page(title, results_dir, sections[stem]))
        written.append(target)
    return written + sorted(img_dir.glob("*.png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("bench/results"), help="folder of results files")
    parser.add_argument("--out", type=Path, default=Path("docs/results"), help="folder of the pages")
    args = parser.parse_args(argv)
    try:
        written = render(args.results, args.out)
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pages = [p for p in written if p.suffix == ".md"]
    print(f"wrote {', '.join(shown(p) for p in pages)} and {len(written) - len(pages)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
