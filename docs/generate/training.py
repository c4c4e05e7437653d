"""Training and data renderers: bench/train.py runs (the backends, packing), bench/pods.py (the cluster's
training path without Kubernetes) and bench/prep.py (Spark against DuckDB)."""

from __future__ import annotations

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
    what = (
        "Feature preparation on Spark against DuckDB by record count (seconds and records/s; Spark's own start "
        f"{num(d.get('spark_start_s'))} s), and a Great Expectations check over the prepared rows."
    )
    runs = [r for r in d["runs"] if "records" in r]
    spec = [
        ("n (records)", "records", num),
        ("Spark s", "spark_s", num),
        ("DuckDB s", "duckdb_s", num),
        ("Spark records/s", "spark_records_per_s", num),
        ("DuckDB records/s", "duckdb_records_per_s", num),
        ("Spark / DuckDB throughput", "ratio_spark_over_duckdb", num),
    ]
    blocks = [columns(runs, spec), f"One run per size: {NO_INTERVAL}."]
    ge = [r for r in d["runs"] if "ge_rows" in r]
    if ge:
        blocks.append(
            columns(
                ge,
                [("n (rows checked)", "ge_rows", num), ("seconds", "ge_seconds", num), ("passed", "ge_success", num)],
            )
        )
    if len(runs) >= 2:
        xs = [r["records"] for r in runs]
        series = [
            Series("Spark", xs, [r["spark_records_per_s"] for r in runs]),
            Series("DuckDB", xs, [r["duckdb_records_per_s"] for r in runs]),
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
