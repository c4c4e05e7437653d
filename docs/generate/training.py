"""Training and data renderers: bench/train.py runs (the backends, packing), bench/pods.py (the cluster's
training path without Kubernetes), bench/prep.py (Spark against DuckDB), the drift check and bench/demo.py (the
whole demo's time, by DAG task)."""

from __future__ import annotations

from typing import Any

from docs.generate.md import NO_INTERVAL, Body, columns, interval, num, pct, signed, table, text
from docs.generate.plots import Axes, Series, line
from docs.generate.result import Result


def train(result: Result) -> Body:
    d = result.data
    models = ", ".join(sorted({r["model"] for r in d["rows"]}))
    backends = ", ".join(sorted({r["backend"] for r in d["rows"]}))
    what = f"Training throughput, MFU and loss of the LoRA backends ({backends}) on {models}, the same steps each."
    spec = [
        ("backend", "backend", text),
        ("packed rows (tokens)", "packed_tokens", lambda x: "unpacked" if x is None else num(x)),
        ("rank", "rank", num),
        ("batch", "batch", num),
        ("n (steps)", "steps", num),
        ("seconds", "seconds", num),
        ("tokens/s", "tokens_per_s", num),
        ("MFU", "mfu", pct),
        ("loss first", "loss_first", num),
        ("loss last", "loss_last", num),
    ]
    if not any("packed_tokens" in r for r in d["rows"]):
        spec.pop(1)
    blocks = [columns(d["rows"], spec)]
    ratios = d.get("packed_over_unpacked_tokens_per_s") or {}
    if ratios:
        rows = [(k, v["packed_tokens"], num(v["ratio"]), NO_INTERVAL) for k, v in ratios.items()]
        blocks.append(table(["backend", "packed rows (tokens)", "tokens/s packed / unpacked", "interval"], rows))
    else:
        blocks.append(f"Backends compared by one run each: {NO_INTERVAL}.")
    if d.get("nemo_steps"):
        steps = [
            ("step", "step", num),
            ("loss", "loss", num),
            ("grad norm", "grad_norm", num),
            ("lr", "lr", num),
            ("memory GiB", "mem_gib", num),
            ("tokens/s", "tokens_per_s", num),
            ("label tokens", "num_label_tokens", num),
        ]
        blocks.append(f"{d.get('nemo_steps_note', 'nemo step lines')}:\n\n{columns(d['nemo_steps'], steps)}")
    if d.get("also_tried"):
        blocks.append(f"Also tried: {d['also_tried']}.")
    return Body(what, blocks)


def pods(result: Result) -> Body:
    d = result.data
    what = "The cluster's training path without Kubernetes: the DAG's plan, one process per planned pod, collected."
    spec = [
        ("pod", "pod", text),
        ("state", "state", text),
        ("wall s", "wall_s", num),
        ("tokens/s", "tokens_per_s", num),
        ("loss", "loss", num),
        ("validation exact match", "val_exact_match", pct),
    ]
    c = d.get("collected") or {}
    wall = ", ".join(f"{k} {v}" for k, v in d.get("time", {}).items())
    collected = (
        f"Collected in {num(c.get('seconds'))} s: best run `{c.get('best_run')}` (validation exact match "
        f"{pct(c.get('val_exact_match'))}). Wall time of the whole command: {wall}."
    )
    n = f"n = {len(d['rows'])} pods (the plan: {d.get('plan')})."
    return Body(what, [n, columns(d["rows"], spec), collected])


def prep(result: Result) -> Body:
    d = result.data
    what = d.get("what") or (
        "Feature preparation on Spark against DuckDB by record count (seconds and records/s), and a Great "
        "Expectations check over the prepared rows."
    )
    what = what.rstrip(".") + f". Spark's own start ({num(d.get('spark_start_s'))} s) is not counted."
    runs = [r for r in d["runs"] if "records" in r]
    spec = [
        ("n (records)", "records", num),
        ("raw MiB", "raw_mib", num),
        ("Spark s", "spark_s", num),
        ("DuckDB s", "duckdb_s", num),
        ("Spark records/s", "spark_records_per_s", num),
        ("DuckDB records/s", "duckdb_records_per_s", num),
        ("Spark / DuckDB throughput", "ratio_spark_over_duckdb", num),
        ("Spark peak PSS MiB (JVM)", "spark_peak_jvm_pss_mib", num),
        ("Spark peak PSS MiB (all)", "spark_peak_pss_mib", num),
        ("DuckDB peak PSS MiB", "duckdb_peak_pss_mib", num),
        ("Spark peak RSS MiB (JVM)", "spark_peak_jvm_rss_mib", num),
        ("Spark peak RSS MiB (all)", "spark_peak_rss_mib", num),
        ("DuckDB peak RSS MiB", "duckdb_peak_rss_mib", num),
        ("same kept rows", "same_kept_rows", num),
        ("Spark failed after s", "spark_failed_after_s", num),
        ("Spark's error", "spark_error", text),
    ]
    spec = [c for c in spec if any(c[1] in r for r in runs)]  # what this file recorded (older ones: less)
    blocks = [columns(runs, spec), f"One run per size: {NO_INTERVAL}."]
    if d.get("caveats"):
        blocks.append("What this run did not do like for like:\n\n" + "\n".join(f"- {c}" for c in d["caveats"]))
    growth = d.get("growth")
    if growth:
        blocks.append(
            f"From {num(growth['from'])} to {num(growth['to'])} records ({num(growth['records_ratio'])}x): Spark's "
            f"time grew {num(growth['spark_time_ratio'])}x, DuckDB's {num(growth['duckdb_time_ratio'])}x."
        )
    ge = [r for r in d["runs"] if "ge_rows" in r]
    if ge:
        blocks.append(
            columns(
                ge,
                [("n (rows checked)", "ge_rows", num), ("seconds", "ge_seconds", num), ("passed", "ge_success", num)],
            )
        )
    timed = [r for r in runs if "spark_records_per_s" in r]
    if len(timed) >= 2:
        xs = [r["records"] for r in timed]
        series = [
            Series("Spark", xs, [r["spark_records_per_s"] for r in timed]),
            Series("DuckDB", xs, [r["duckdb_records_per_s"] for r in timed]),
        ]
        axes = Axes("records", "records/s", log=10)
        blocks.append(line(result, "throughput", "Records/s against records", series, axes, "n = one run a point"))
    return Body(what, blocks)


def train_precision(result: Result) -> Body:
    """bench/train.py --precision: fp32 and bf16 side by side, the loss curves, exact match paired against fp32."""
    d = result.data
    what = d.get("what", "Training in each precision, side by side.")
    runs = d["runs"]
    rows = [
        (name, num(r["steps"]), num(r["seconds"]), num(r["tokens_per_s"]), num(r["losses"][0]), num(r["losses"][-1]))
        for name, r in runs.items()
    ]
    blocks = [table(["precision", "n (steps)", "seconds", "tokens/s", "loss first", "loss last"], rows)]
    for name, c in (d.get("comparisons") or {}).items():
        em = c.get("exact_match") or {}
        paired = interval(em.get("low"), em.get("high"), signed) if em else NO_INTERVAL
        blocks.append(
            table(
                [
                    "comparison",
                    "tokens/s ratio",
                    "loss relative difference, mean (max)",
                    "exact match difference",
                    "paired 95 %",
                    "n (requests)",
                ],
                [
                    (
                        name.replace("_", " "),
                        num(c["tokens_per_s_ratio"]),
                        f"{pct(c['loss_relative_difference_mean'])} ({pct(c['loss_relative_difference_max'])})",
                        signed(em.get("diff")),
                        paired,
                        num(c.get("n")),
                    )
                ],
            )
        )
    curves = [Series(name, list(range(1, len(r["losses"]) + 1)), r["losses"]) for name, r in runs.items()]
    steps = max(len(r["losses"]) for r in runs.values())
    blocks.append(line(result, "loss", "training loss per step", curves, Axes("step", "loss"), f"n = {steps} steps"))
    return Body(what, blocks)


def drift_check(result: Result) -> Body:
    """bench/drift.py --new-hour: the check cold, then after one new file (only it parsed)."""
    d = result.data
    rows = []
    for c in d["checks"]:
        seconds = c["seconds"]
        rows.append(
            (
                c["check"],
                num(c["lines"]),
                num(c.get("new_lines")),
                *(num(seconds[k]) for k in ("parse", "summarize", "embed", "compare")),
                num(sum(seconds.values())),
            )
        )
    headers = [
        "check",
        "n (lines in the window)",
        "new lines",
        "parse s",
        "summarize s",
        "embed s",
        "compare s",
        "total s",
    ]
    return Body(d.get("what", "The drift check."), [table(headers, rows), f"One run each: {NO_INTERVAL}."])


def nemo_bf16(result: Result) -> Body:
    """bench/nemo_bf16.py: NeMo AutoModel's CPU steps in fp32 and under FSDP2Config's default bf16 policy."""
    d = result.data
    arms = d.get("arms") or {}
    kinds = sorted({k for a in arms.values() for k in (a.get("self_ms_per_step_by_kind") or {})})
    header = ["arm", "median step s (profiled)", "n (profiled steps)", *(f"{k} ms/step" for k in kinds)]
    rows = []
    for name, a in arms.items():
        if "error" in a:
            rows.append([name, f"failed: {a['error']}", "n/a", *("n/a" for _ in kinds)])
            continue
        by_kind = a.get("self_ms_per_step_by_kind") or {}
        rows.append([name, num(a.get("median_profiled_step_s")), num(a.get("profiled_steps")),
                     *(num(by_kind.get(k)) for k in kinds)])  # fmt: skip
    blocks = [table(header, rows), f"One run per arm, {NO_INTERVAL}: self CPU time per profiled step by kind of op."]
    growth = d.get("growth") or {}
    if growth:
        ops = growth.get("ops_that_grew_most_ms_per_step") or []
        ratio, added = growth.get("step_ratio_bf16_over_fp32"), growth.get("added_ms_per_step_total")
        blocks.append(
            f"bf16 against fp32: step time ratio {num(ratio)}; the ops whose self time grew most (ms per step; all "
            f"ops together: {num(added)}):"
        )
        blocks.append(
            columns(
                ops,
                [
                    ("op", "op", text),
                    ("fp32", "fp32_ms", num),
                    ("bf16", "bf16_ms", num),
                    ("added", "added_ms", num),
                ],
            )  # fmt: skip
        )
    return Body(d.get("what", "NeMo AutoModel's training step by precision."), blocks)


def demo(result: Result) -> Body:
    """bench/demo.py: `flywheel demo` after the install, as a whole against its goal and by DAG task, in whole
    seconds (the parts add up as the reader sums them); a machine without bf16 units is said to be one."""
    d = result.data
    goal = (d.get("settings") or {}).get("goal_s")
    ran = "finished" if d.get("returncode") == 0 else f"failed (return code {d.get('returncode')})"
    if d.get("timed_out"):
        ran = f"timed out (stopped after {num((d.get('settings') or {}).get('timeout_s'))} s)"
    verdict = "met" if d.get("goal_met") else "not met"
    head = table(
        ["n (runs)", "seconds", "goal s", "goal", "the run", "seconds in DAG tasks", "outside them"],
        [(num(d.get("n")), _whole(d.get("seconds")), num(goal), verdict, ran,
          _whole(d.get("seconds_in_tasks")), _whole(d.get("seconds_outside_tasks")))],
    )  # fmt: skip
    rows = [(t["task"], _whole(t.get("seconds")), text(t.get("summary"))) for t in d.get("tasks") or []]
    notes = [f"One run: {NO_INTERVAL}."]
    if "bf16 units: no" in str(d.get("machine", "")):
        notes.append(
            "This machine has no bf16 units: every bf16 setting computed in fp32 (emulated bf16 is many times "
            "slower), so this time does not judge the goal, which is set for a machine with them."
        )
    return Body(
        d.get("what", "`flywheel demo` after the install."),
        [head, table(["DAG task", "seconds", "what it printed"], rows), *notes],
    )


def _whole(x: Any) -> str:
    """Seconds rounded to whole ones (`num` of the rounded number: thousands separated, n/a when absent)."""
    return num(round(x)) if isinstance(x, float) else num(x)
