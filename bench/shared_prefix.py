"""Decoding requests that open alike (`evaluation.share_prefix`, `toolcall.decode.SharedPrefix`): every batch
decoded twice, with the opening its requests share computed once and with every request prefilled whole, on real
requests nobody here wrote: tau-bench retail's gold replays (`flywheel logs import-retail` of the dev tasks,
against its db.json), in the full prompt (the system prompt with every retail tool's schema), under the tool-call
grammar as served. The sample is sorted by prompt length and cut into batches, as `generate` batches it.

Paired per batch: the two passes of a batch run back to back, in alternating order. Reported per batch and as
the geometric mean speedup (whole seconds over shared seconds) with a 95 % t-interval of the mean log ratio over
the batches; the answers of the two passes compared one by one (identical, or not). Each timed pass includes its
own prefill of the opening its batch shares; evaluation shares what a whole condition's requests share, recorded
here too (`sample_shared_prefix_tokens`): a batch of turns from one task can share more than that. One untimed
request is decoded first (the grammar's tokenizer and the kernels warmed).

Usage: .venv/bin/python bench/shared_prefix.py [--requests 48] [--batch-size 8] [--data ../shared/data]
Writes bench/results/shared_prefix.json (commit, settings, seeds, n, machine with its bf16 units).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from real_data import DAY, commit  # noqa: E402 (the bench folder's own modules)
from slip import machine  # noqa: E402

BASE = "smollm2-135m-instruct"


def retail_examples(data: Path, raw: Path) -> tuple[list[Any], dict[str, str]]:
    """The dev tasks' gold replays as evaluation examples in the full prompt, and the tools' effects."""
    from pipelines.logs.toolsets import registered_catalogue, tool_effects
    from pipelines.prep.dataset import frame_from_logs
    from pipelines.simulate.importers import retail_to_raw
    from pipelines.toolcall.examples import to_examples

    retail = data / "retail_tools"
    retail_to_raw(
        retail / "tools_openai_schema.json",
        retail / "tasks_dev.jsonl",
        raw,
        date.fromisoformat(DAY),
        db_file=retail / "db.json",
    )
    tools = registered_catalogue(str(raw))
    files = sorted(p for p in raw.rglob("*.jsonl") if "toolsets" not in p.parts)
    examples = [e for f in files for e in to_examples(frame_from_logs(str(f), tools), "full")]
    return examples, tool_effects(str(raw))


def interval(ratios: list[float]) -> dict[str, Any]:
    """Geometric mean of the ratios with the 95 % t-interval of their mean log (n batches)."""
    from scipy import stats

    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    if n < 2:
        return {"n": n, "mean": round(math.exp(mean), 3), "low": None, "high": None, "level": 0.95}
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {
        "n": n,
        "mean": round(math.exp(mean), 3),
        "low": round(math.exp(mean - half), 3),
        "high": round(math.exp(mean + half), 3),
        "level": 0.95,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "shared_prefix.json")
    args = parser.parse_args()

    import torch
    import transformers

    from pipelines.base_models import answer_budget_of, load_as_served, precision_of
    from pipelines.config import load_settings
    from pipelines.storage import write_text
    from pipelines.toolcall.decode import generate, render_prompts, require_grammars, shared_prefix_length
    from pipelines.toolcall.examples import grounded_tools

    measured = commit()  # the code that runs, read before it runs
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flywheel-shared-prefix-") as work:
        settings = load_settings(root=work)
        examples, effects = retail_examples(args.data, Path(work) / "raw")
        chosen = random.Random(args.seed).sample(examples, min(args.requests, len(examples)))
        model, tokenizer = load_as_served(BASE, settings, what="bench/shared_prefix.py")
        budget = answer_budget_of(settings, BASE, [e.target for e in chosen])
        tools = grounded_tools(chosen, effects, settings.triton.grounded_ids)
        kwargs = {"max_new_tokens": budget, "batch_size": args.batch_size, "latency_samples": 0}
        require_grammars(set(tools))  # every grammar built before any timing (cached per tool set)
        for share in (False, True):  # warm-up of both paths, untimed
            generate(model, tokenizer, [e.turns for e in chosen[:2]], tools=tools[:2], share_prefix=share, **kwargs)
        prompts = render_prompts(tokenizer, [e.turns for e in chosen])
        rows = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
        order = sorted(range(len(chosen)), key=lambda j: len(rows[j]))  # the batches of evaluation's sorted pass
        chosen, tools = [chosen[j] for j in order], [tools[j] for j in order]
        batches = []
        for b, i in enumerate(range(0, len(chosen), args.batch_size)):
            part = chosen[i : i + args.batch_size]
            runs, took = {}, {}
            for share in (True, False) if b % 2 == 0 else (False, True):
                t0 = time.perf_counter()
                runs[share] = generate(model, tokenizer, [e.turns for e in part], tools=tools[i : i + len(part)],
                                       share_prefix=share, **kwargs)  # fmt: skip
                took[share] = time.perf_counter() - t0
            shared, whole = runs[True], runs[False]
            row = {
                "batch": b,
                "requests": len(part),
                "first": "shared" if b % 2 == 0 else "whole",
                "prompt_tokens_mean": round(sum(whole.prompt_tokens) / len(part), 1),
                "shared_prefix_tokens": shared.shared_prefix_tokens,
                "output_tokens": sum(whole.output_tokens),
                "seconds_whole": round(took[False], 6),
                "seconds_shared": round(took[True], 6),
                "speedup": round(took[False] / took[True], 3),
                "identical_answers": sum(a == w for a, w in zip(shared.texts, whole.texts)),
            }
            batches.append(row)
            print(json.dumps(row), flush=True)
    result = {
        "benchmark": "shared_prefix",
        "what": "batched decoding of real retail requests (full prompt, under the grammar as served), the opening "
        "they share computed once against every request prefilled whole: seconds per batch, paired",
        "commit": measured,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "argv": sys.argv,
        "settings": {
            "base_model": BASE,
            "requests": len(chosen),
            "batch_size": args.batch_size,
            "max_new_tokens": budget,
            "precision": precision_of(model),
            "prompt_style": "full",
            "constrained": True,
            "data": "tau-bench retail tasks_dev.jsonl, gold replays",
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },  # fmt: skip
        "seeds": {"request sample": args.seed},
        "n": len(chosen),
        "sample_shared_prefix_tokens": shared_prefix_length(rows),
        "batches": batches,
        "speedup": interval([r["seconds_whole"] / r["seconds_shared"] for r in batches]),
        "identical_answers": sum(r["identical_answers"] for r in batches),
        "seconds_whole": round(sum(r["seconds_whole"] for r in batches), 1),
        "seconds_shared": round(sum(r["seconds_shared"] for r in batches), 1),
        "seconds": round(time.perf_counter() - began, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(str(args.out), json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["speedup"]), f"identical {result['identical_answers']}/{len(chosen)}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
