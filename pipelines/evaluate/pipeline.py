"""Tool-calling evaluation: base zero-shot, base few-shot (MiniLM-retrieved examples) and LoRA-tuned
models side by side on the same requests, with quality, prompt tokens and latency for each.

Output: `report.json` and `report.html` (per-tool breakdown, confusion matrix) under
`<reports>/evaluation/<name>/`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pipelines.base_models import load_as_served, precision_of
from pipelines.config import DECODINGS, Settings
from pipelines.evaluate.results import TABLE_METRICS, ConditionResult, EvalReport  # noqa: F401 (re-exported)
from pipelines.logs.toolsets import registered_catalogue, tool_effects
from pipelines.prep.dataset import frame_from_logs, load_split
from pipelines.storage import makedirs, write_json, write_text
from pipelines.toolcall import score as metrics
from pipelines.toolcall.decode import generate
from pipelines.toolcall.examples import Example, grounded_tools, to_examples
from pipelines.toolcall.fewshot import shot_pool, with_shots

LOG = logging.getLogger("flywheel.evaluate")


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_model: str = "smollm2-135m-instruct"
    split: Literal["train", "val", "test"] = "test"
    logs: str | None = Field(default=None, description="evaluate on this log file instead of a split")
    examples: int | None = Field(default=48, ge=1, description="seeded sample of the split; None = all")
    seed: int = 0
    shots: int = Field(default=3, ge=0, description="in-context examples for the few-shot condition")
    shot_pool: int = Field(default=2000, ge=1, description="train examples the few-shot retrieval searches")
    max_new_tokens: int = Field(
        default=64, ge=8, description="generation budget per answer (evaluation.max_new_tokens)"
    )
    batch_size: int = Field(default=8, ge=1)
    latency_samples: int = Field(default=4, ge=0, description="requests also timed alone (batch 1) per condition")
    baselines: bool = Field(default=True, description="include base zero-shot and few-shot")
    constrained: Literal["off", "on", "both"] = Field(
        default="both",
        description="decode under the offered tools' grammar: off, on (rows named `<condition>_constrained`) "
        "or both rows for every condition",
    )
    window: str | None = Field(default=None, description="the training set's window label; None: the current manifest")
    sampling: Literal["random", "stratified"] = Field(
        default="stratified",
        description="how the requests are drawn: stratified by (tool, source), every tool the split "
        "has at least once while n allows, or a plain seeded random sample",
    )
    only: list[str] | None = Field(
        default=None,
        description="run only these conditions (e.g. the two the gate compares, "
        "when it asks for more requests); None: all",
    )
    grounded_ids: bool = Field(
        default=True,
        description="under the grammar, write ids only from the conversation "
        "(triton.grounded_ids: evaluated as served)",
    )


@dataclass
class Adapter:
    """A LoRA adapter to evaluate: its folder and the prompt style it was trained with."""

    label: str
    path: str
    prompt_style: Literal["full", "short", "names"] = "short"


CONSTRAINED = "_constrained"  # the suffix of a condition decoded under the tool-call grammar


def constrained_name(condition: str) -> str:
    return f"{condition}{CONSTRAINED}"


def as_served(text: str, tools_json: str) -> str:
    """`text` as the gateway passes it on: a call of a tool the grammar enforces only in part that breaks the
    tool's whole schema is no call (`toolcall.calls.schema_breach`); anything else unchanged. A redaction token
    where the grammar admits one is no breach: targets are redacted, and the gateway restores the real value."""
    import json

    from pipelines.toolcall.calls import parse_call, schema_breach

    call = parse_call(text)
    if not call or call.get("name") is None or not isinstance(call.get("arguments"), dict):
        return text
    try:
        offered = json.loads(tools_json or "[]")
    except json.JSONDecodeError:
        return text
    for tool in offered if isinstance(offered, list) else []:
        spec = tool.get("function", tool) if isinstance(tool, dict) else {}
        if spec.get("name") == call["name"]:
            breach = schema_breach(call["name"], call["arguments"], spec.get("parameters"), admit_tokens=True)
            return "" if breach else text
    return text


def score_condition(
    name: str,
    model_label: str,
    style: str,
    shots: int,
    examples: list[Example],
    texts: list[str],
    stats: dict[str, float],
    effects: Mapping[str, str] | None = None,
) -> ConditionResult:
    """`effects`: tool -> read/write (`logs.toolsets.tool_effects`); every wrong write is listed. Each answer
    is scored as served (`as_served`: a call the gateway would refuse after decoding counts as no call)."""
    scores = [metrics.score(as_served(t, e.tools), e.expected, effects) for t, e in zip(texts, examples)]
    samples = [
        {"record_id": e.record_id, "request": e.query, "expected": e.target, "output": t, "exact_match": s.exact_match}
        for e, t, s in zip(examples[:20], texts[:20], scores[:20])
    ]
    wrong = [
        {"record_id": e.record_id, "request": e.query, "expected": e.target, "output": t, "kind": s.wrong_write}
        for e, t, s in zip(examples, texts, scores)
        if s.wrong_write
    ]
    per_request = [
        {
            "record_id": e.record_id,
            "tool": s.tool,
            "exact_match": int(s.exact_match),
            "name_match": int(s.name_match),
            "arg_f1": s.arg_f1,
            "text_f1": s.text_f1,
            "wrong_write": s.wrong_write,
            "output": t,  # the answer as decoded (an offline shadow run's rejected side: `prep.pairs`)
        }
        for e, t, s in zip(examples, texts, scores)
    ]
    return ConditionResult(
        name,
        model_label,
        style,
        shots,
        metrics.summarize(scores),
        stats,
        metrics.per_tool(scores),
        metrics.confusion(scores),
        samples,
        wrong_writes=wrong,
        per_request=per_request,
    )


def is_tuned_reference(condition: str) -> bool:
    """A tuned condition a candidate is compared with: the champion, the SFT adapter a tune method started from
    (`tuned_sft`) or a registered version by number (`tuned_v<N>`, `flywheel eval --version N`)."""
    name = condition.removesuffix(CONSTRAINED)
    return name in ("tuned_champion", "tuned_sft") or (name.startswith("tuned_v") and name[7:].isdigit())


def comparisons(
    results: list[ConditionResult], judged_on: Mapping[str, str], min_tool_examples: int = 5
) -> list[dict[str, Any]]:
    """Each tuned condition against base few-shot (the strongest prompt), and each candidate (a tuned condition
    that is not a reference: `is_tuned_reference`) against the champion, `tuned_sft` (the SFT adapter a tune
    method trained further) and any registered version evaluated beside it, decoded the same way: every paired
    difference with its 95 % interval (evaluate.paired)."""
    from pipelines.stats import compare

    by = {r.condition: r for r in results}
    out = []
    for r in results:
        if not r.condition.startswith("tuned_"):
            continue
        suffix = CONSTRAINED if r.condition.endswith(CONSTRAINED) else ""
        refs = [f"base_few_shot{suffix}"]
        if not is_tuned_reference(r.condition.removesuffix(suffix)):  # a candidate: against what it would replace
            refs += sorted(
                (c for c in by if c.endswith(CONSTRAINED) == bool(suffix) and is_tuned_reference(c)),
                key=lambda c: (c != f"tuned_champion{suffix}", c != f"tuned_sft{suffix}", c),
            )
        for ref in refs:
            if ref in by and by[ref].per_request and r.per_request:
                out.append(
                    {
                        "condition": r.condition,
                        "reference": ref,
                        **compare(r.per_request, by[ref].per_request, judged_on, min_tool_examples=min_tool_examples),
                    }
                )
    return out


def evaluate(
    settings: Settings, cfg: EvalConfig, adapters: list[Adapter], name: str, console: Console | None = None
) -> EvalReport:
    started = time.perf_counter()
    context = "the training set's point-in-time customer context (the features stage)"
    if cfg.logs:
        frame, context = logs_frame(settings, cfg)
    else:
        frame = load_split(settings, cfg.split, cfg.examples, cfg.seed, cfg.window, sampling=cfg.sampling)
    dataset = cfg.logs or f"{settings.zone('curated')}/sft split={cfg.split}"
    effects = tool_effects(settings.zone("raw"))
    full = to_examples(frame, "full")
    results: list[ConditionResult] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        gen = {
            "max_new_tokens": cfg.max_new_tokens,
            "batch_size": cfg.batch_size,
            "latency_samples": cfg.latency_samples,
            "progress": progress,
            "share_prefix": settings.evaluation.share_prefix,
        }
        runner = _Conditions(settings, cfg, name, effects, gen, console, DECODINGS[cfg.constrained], results, {})
        if cfg.baselines:
            runner.baselines(full)
        runner.tuned(adapters, frame, full)
    report = EvalReport(
        name,
        dataset,
        len(frame),
        results,
        seconds=round(time.perf_counter() - started, 1),
        settings={
            **cfg.model_dump(),
            "customer_context": context,
            "precision": runner.precisions,  # each condition's model as served: `base_models.load_as_served`
        },
        comparisons=comparisons(results, settings.promotion.tool_metrics, settings.promotion.min_tool_examples),
    )
    return write_report(settings, report)


@dataclass(frozen=True)
class _Conditions:
    """Runs an evaluation's conditions: each decoded in every mode of `modes` (free, under the grammar) on
    the same requests, scored, and appended to `results`."""

    settings: Settings
    cfg: EvalConfig
    report_name: str
    effects: Mapping[str, str]
    gen: dict[str, Any]  # generate()'s budget, batch size, latency samples and progress bar
    console: Console | None
    modes: list[bool]  # DECODINGS[cfg.constrained]: for each row, whether it decodes under the grammar
    results: list[ConditionResult]
    precisions: dict[str, str]  # condition -> what its model computed in (`base_models.precision_of`)

    def baselines(self, full: list[Example]) -> None:
        """Base zero-shot and (with `cfg.shots`) base few-shot with retrieved examples, on one base model."""
        cfg = self.cfg
        wanted = cfg.only is None or any(c.startswith("base_") for c in cfg.only)
        model, tokenizer = load_as_served(cfg.base_model, self.settings, what="evaluation") if wanted else (None, None)
        self.run("base_zero_shot", cfg.base_model, "full", 0, model, tokenizer, full, [e.turns for e in full])
        if cfg.shots and (cfg.only is None or "base_few_shot" in cfg.only):
            pool = shot_pool(
                to_examples(load_split(self.settings, "train", cfg.shot_pool, cfg.seed, cfg.window), "full")
            )
            self.run(
                "base_few_shot",
                cfg.base_model,
                "full",
                cfg.shots,
                model,
                tokenizer,
                full,
                with_shots(full, pool, cfg.shots),
            )

    def tuned(self, adapters: list[Adapter], frame: Any, full: list[Example]) -> None:
        """Each adapter (of those `cfg.only` names) on the requests in the prompt style it was trained with."""
        for adapter in adapters:
            if self.cfg.only is not None and adapter.label not in self.cfg.only:
                continue
            model, tokenizer = load_as_served(self.cfg.base_model, self.settings, adapter.path, what="evaluation")
            chosen = full if adapter.prompt_style == "full" else to_examples(frame, adapter.prompt_style)
            self.run(
                adapter.label,
                adapter.path,
                adapter.prompt_style,
                0,
                model,
                tokenizer,
                chosen,
                [e.turns for e in chosen],
            )
            del model

    def run(
        self,
        condition: str,
        label: str,
        style: str,
        shots: int,
        model: Any,
        tokenizer: Any,
        chosen: list[Example],
        conversations: list[list[dict[str, str]]],
    ) -> None:
        """Decode and score one condition in every mode (nothing when `cfg.only` leaves it out)."""
        cfg, console = self.cfg, self.console
        if cfg.only is not None and condition not in cfg.only:
            return
        for constrained in self.modes:
            name = constrained_name(condition) if constrained else condition
            self.precisions[name] = precision_of(model)
            began = time.perf_counter()  # a line per condition: the task log shows progress (no bar there)
            LOG.info("evaluation %s: %s on %d requests ...", self.report_name, name, len(chosen))
            out = generate(
                model,
                tokenizer,
                conversations,
                label=name,
                **self.gen,
                tools=grounded_tools(chosen, self.effects, cfg.grounded_ids) if constrained else None,
            )
            result = score_condition(name, label, style, shots, chosen, out.texts, out.stats(), self.effects)
            result.constrained = constrained
            LOG.info(
                "evaluation %s: %s done in %.0f s (exact match %.3f)",
                self.report_name,
                name,
                time.perf_counter() - began,
                result.summary.get("exact_match") or 0.0,
            )
            if out.cut and console is not None:
                console.print(
                    f"warning: {name}: {out.cut} of {len(chosen)} answers stopped at max_new_tokens "
                    f"({cfg.max_new_tokens}) and may be cut short: raise evaluation.max_new_tokens "
                    f"(FLYWHEEL_EVALUATION__MAX_NEW_TOKENS)"
                )
            if self.settings.evaluation.judge_url:
                result.summary["judge_score"] = _judge_score(self.settings, chosen, out.texts)
            self.results.append(result)


def _judge_score(settings: Settings, chosen: list[Example], texts: list[str]) -> float | None:
    """The judge's mean grade of the answers (None when it graded none)."""
    from pipelines.evaluate.judge import judge_scores

    graded = [
        v for v in judge_scores(settings, [(e.query, e.target, t) for e, t in zip(chosen, texts)]) if v is not None
    ]
    return sum(graded) / len(graded) if graded else None


def logs_frame(settings: Settings, cfg: EvalConfig) -> tuple[Any, str]:
    """Requests from a log file (`cfg.logs`) as they would be served: sampled like a split (`cfg.sampling`,
    seeded) and each with its customer's context line from Feast's online store, the line the gateway puts
    in a tuned model's prompt. Returns the rows and where their context came from (for the report). The store
    holds the features up to the last window the flywheel ran: a log file from a day that window covers gets
    that day's features too, a slight look-ahead a point-in-time join would avoid (Feast's Dask store fails
    on requests with no earlier snapshot, so it is not used here)."""
    from pipelines.features.pipeline import online_contexts
    from pipelines.prep.dataset import sample_rows

    frame = sample_rows(
        frame_from_logs(cfg.logs, registered_catalogue(settings.zone("raw"))),  # type: ignore[arg-type]
        cfg.examples,
        cfg.seed,
        cfg.sampling,
    )
    try:
        contexts = online_contexts(frame["customer_id"].tolist(), settings)
    except Exception as exc:  # noqa: BLE001 (no features stage has run, or the store cannot answer: as the gateway)
        LOG.warning(
            "evaluation without customer context: the online store did not answer (%s: %s)",
            type(exc).__name__,
            str(exc)[:200],
        )
        return frame, f"none: the online store did not answer ({type(exc).__name__}), as the gateway then serves"
    frame = frame.assign(context=frame["customer_id"].map(contexts).fillna(""))
    known = int((frame["context"] != "").sum())
    return frame, f"the online store, as served ({known} of {len(frame)} requests' customers have a context line)"


def write_report(settings: Settings, report: EvalReport) -> EvalReport:
    from pipelines.evaluate.report import render_html

    folder = f"{settings.zone('reports')}/evaluation/{report.name}"
    makedirs(folder)
    report.json_uri, report.html_uri = f"{folder}/report.json", f"{folder}/report.html"
    write_json(report.json_uri, report.to_dict())
    write_text(report.html_uri, render_html(report))
    return report
