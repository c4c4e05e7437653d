"""Which constrained-decoding library: llguidance (what the platform uses) against xgrammar and
lm-format-enforcer on the same requests, the same model and the same tool-call schema.

Each library decodes SmolLM2-135M-Instruct zero-shot (the full prompt with every offered tool's schema,
the condition that needs a grammar most) under `tool_grammar.call_schema` of the offered tools; the
unconstrained decode is the reference. Reported per library: grammar build time, mean latency per
request (batch 1), per output token, and the share of answers that parse and validate against the
offered schema. Batch 1 isolates the per-token mask cost from batching effects.

Usage: .venv/bin/python bench/grammar.py [--requests 16] [--libs /tmp/grammar-libs]
  The platform ships llguidance only; to compare, install the others beside it, e.g.
  .venv/bin/pip install --no-deps --target /tmp/grammar-libs xgrammar apache-tvm-ffi lm-format-enforcer interegular
Writes bench/results/grammar.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def requests(n: int) -> list[dict[str, Any]]:
    from pipelines.prep.nodes import prepare_line
    from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator
    from pipelines.toolcall.prompt import chat_turns

    gen = TrafficGenerator(GeneratorConfig(seed=11, records=400, bad_share=0.0, end_date=date(2026, 11, 20)))
    rows = [prepare_line(line) for _, line, _ in gen.lines()]
    rows = [r for r in rows if r["status"] == "clean"][:n]
    return [{"turns": chat_turns(r["system_prompt"], r["messages_json"]), "tools": r["tools_json"]} for r in rows]


def valid(text: str, tools: str) -> bool:
    import jsonschema

    from pipelines.toolcall.grammar import call_schema

    try:
        jsonschema.validate(json.loads(text), call_schema(tools))
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def run(
    label: str,
    model: Any,
    tok: Any,
    reqs: list[dict[str, Any]],
    max_new_tokens: int,
    extra_for: Callable[[str], dict[str, Any]] | None,
) -> dict[str, Any]:
    import torch

    latencies, tokens, ok, build = [], 0, 0, 0.0
    for r in reqs:
        prompt = tok.apply_chat_template(r["turns"], tokenize=False, add_generation_prompt=True)
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
        t0 = time.perf_counter()
        extra = extra_for(r["tools"]) if extra_for else {}
        build += time.perf_counter() - t0
        with torch.inference_mode():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                **extra,
            )
        latencies.append((time.perf_counter() - t0) * 1000)
        new = out[0, enc["input_ids"].shape[1] :]
        tokens += int((new != tok.pad_token_id).sum())
        ok += valid(tok.decode(new, skip_special_tokens=True).strip(), r["tools"])
    n = len(reqs)
    row = {
        "decoder": label,
        "requests": n,
        "ms_per_request": round(sum(latencies) / n, 1),
        "ms_per_output_token": round(sum(latencies) / max(tokens, 1), 2),
        "output_tokens_mean": round(tokens / n, 1),
        "schema_valid": round(ok / n, 3),
        "grammar_build_ms_mean": round(build * 1000 / n, 2),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--libs", type=Path, default=Path("/tmp/grammar-libs"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "grammar.json")
    args = parser.parse_args()
    if args.libs.is_dir():
        sys.path.append(str(args.libs))
    import tempfile

    import torch
    from transformers import LogitsProcessorList

    from pipelines.base_models import load_base
    from pipelines.config import load_settings
    from pipelines.toolcall.grammar import ToolCallConstraint, call_schema

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as root:
        model, tok = load_base("smollm2-135m-instruct", load_settings(root=root))
    reqs = requests(args.requests)
    rows = [
        run("unconstrained", model, tok, reqs, args.max_new_tokens, None),
        run(
            "llguidance",
            model,
            tok,
            reqs,
            args.max_new_tokens,
            lambda tools: {"logits_processor": LogitsProcessorList([ToolCallConstraint(tok, [tools])])},
        ),
    ]
    try:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size)
        compiler = xgr.GrammarCompiler(info)
        rows.append(
            run(
                "xgrammar",
                model,
                tok,
                reqs,
                args.max_new_tokens,
                lambda tools: {
                    "logits_processor": LogitsProcessorList(
                        [
                            xgr.contrib.hf.LogitsProcessor(
                                compiler.compile_json_schema(json.dumps(call_schema(tools)), any_whitespace=False)
                            )
                        ]
                    )
                },
            )
        )
    except Exception as exc:  # noqa: BLE001 (a library that is missing or cannot run here is reported)
        rows.append({"decoder": "xgrammar", "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(json.dumps(rows[-1]), flush=True)
    try:
        from lmformatenforcer import JsonSchemaParser
        from lmformatenforcer.integrations.transformers import (
            build_token_enforcer_tokenizer_data,
            build_transformers_prefix_allowed_tokens_fn,
        )

        data = build_token_enforcer_tokenizer_data(tok)
        rows.append(
            run(
                "lm-format-enforcer",
                model,
                tok,
                reqs,
                args.max_new_tokens,
                lambda tools: {
                    "prefix_allowed_tokens_fn": build_transformers_prefix_allowed_tokens_fn(
                        data, JsonSchemaParser(call_schema(tools))
                    )
                },
            )
        )
    except Exception as exc:  # noqa: BLE001
        rows.append({"decoder": "lm-format-enforcer", "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": "smollm2-135m-instruct",
        "condition": "base zero-shot, full prompt, batch 1",
        "torch_threads": torch.get_num_threads(),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
