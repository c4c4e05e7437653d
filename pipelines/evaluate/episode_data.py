"""Rejection sampling: the closed-loop episodes of our model that reached the gold state, as training data.

A successful episode (greedy or a sampled try) is written to the raw zone as one session, one record per step,
exactly as the importer writes a task's gold replay (`simulate.importers.SessionWriter`): the customer's request,
every earlier call with the environment's real answer, the step's call as the target. Its `label_source` is
`verified`: our own model wrote it and the environment judged it. The label policy decides whether it trains
(`quality.train_label_sources`; not by default). A trajectory is written once per task however many tries
walked it, and the same episodes again rewrite their own file (the name is a digest of what they hold).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Any

from pipelines.evaluate.episodes import Episode, Gold, load_tasks
from pipelines.logs.tools import effect_of
from pipelines.toolcall.examples import Example

LOG = logging.getLogger("flywheel.episodes")


def successful_trajectories(
    by_condition: Mapping[str, list[Episode]], effects: Mapping[str, str]
) -> list[tuple[str, str, list[Any], str]]:
    """[(task id, the customer's request, [(call, result, effect)], the condition that walked it)] of the
    successful episodes with no refused call and no wrong write, each distinct trajectory of a task once (the
    first condition's, its greedy episode first). An episode without a call has no step to train on."""
    seen: set[str] = set()
    out = []
    for label, episodes in by_condition.items():
        for ep in sorted(episodes, key=lambda e: (e.task_id, e.attempt)):
            clean = ep.wrong_writes == 0 and not any(s.get("error") for s in ep.steps)
            if not ep.success or not ep.talk or not clean:  # a refused call or a wrong write never becomes a target
                continue
            steps = []
            for message, result in zip(ep.talk[1::2], ep.talk[2::2]):
                call = message["tool_calls"][0]
                steps.append((call, str(result["content"]), effect_of(call["name"], effects)))
            key = json.dumps([ep.task_id, [c for c, _, _ in steps]], sort_keys=True)
            if steps and key not in seen:
                seen.add(key)
                out.append((ep.task_id, str(ep.talk[0]["content"]), steps, label))
    return out


def verified_to_raw(
    by_condition: Mapping[str, list[Episode]],
    tools: list[dict[str, Any]],
    effects: Mapping[str, str],
    where: tuple[str, str],
    day: date,
    name: str,
) -> dict[str, Any]:
    """The successful episodes' trajectories (per condition) -> `raw/dt=DAY/episodes-<digest>.jsonl` in the raw
    zone, local or on object storage (label_source `verified`, each record's `model` the condition that wrote
    it: `flywheel:<condition>`), the tools registered as the environment's toolset; `where`: the raw zone and
    that toolset's name. Returns what was written."""
    from pipelines import storage
    from pipelines.logs.toolsets import register_toolset, toolsets
    from pipelines.simulate.importers import SessionWriter

    raw_zone, toolset = where

    found = successful_trajectories(by_condition, effects)
    digest = hashlib.sha256(json.dumps([name, found], sort_keys=True, default=str).encode()).hexdigest()[:10]
    if toolset not in toolsets(raw_zone):  # an imported toolset of that name is kept as it was registered
        register_toolset(raw_zone, toolset, tools, dict(effects))
    writer = SessionWriter(day, 0, tools, f"episodes_{digest}", "verified")
    for n, (_, request, steps, label) in enumerate(found):
        writer.session(f"{n:05d}", request, steps, model=f"flywheel:{label}")
    target = f"{raw_zone.rstrip('/')}/dt={day.isoformat()}/episodes-{digest}.jsonl"
    if found:
        storage.write_bytes(target, writer.data())
    return {
        "episodes_succeeded": sum(1 for episodes in by_condition.values() for e in episodes if e.success),
        "trajectories": len(found),
        "records": writer.records,
        "file": target if found else None,
        "label_source": "verified",
        "models": sorted({f"flywheel:{label}" for *_, label in found}),
    }


def progress_line(console: Any, name: str, label: str) -> Any:
    """A callable the runs report to: a line per message, and one per `EVERY` episodes finished."""
    count = [0]

    def say(message: str | None = None) -> None:
        if message is None:
            count[0] += 1
            if count[0] % EVERY:
                return
            message = f"{count[0]} episodes finished"
        line = f"episodes {name}: {label}: {message}"
        if console is not None:
            console.print(line)
        LOG.info(line)

    return say


EVERY = 8


def keep_successes(run: Any, finished: dict[str, list[Any]], tools: list[Any], env: Any, golds: list[Any]) -> Any:
    """Rejection sampling: the tuned conditions' successful episodes (every condition's when no adapter ran)
    into the raw zone `run.keep_successes`, labelled `verified`. Only tasks whose gold changes the state count
    (on the others an episode that writes nothing passes, whatever it did). A failure to write is recorded in
    the report, never losing the run."""
    from pipelines.errors import DataProblem

    tuned = [label for label in finished if label.startswith("tuned_")] or list(finished)
    changing = {g.task.task_id for g in golds if g.changes_state}
    kept = {label: [ep for ep in finished[label] if ep.task_id in changing] for label in tuned}
    where = (str(run.keep_successes), env.name)
    try:
        written = verified_to_raw(kept, tools, env.effects(), where, date.fromisoformat(run.day), run.name)
    except (OSError, ValueError, DataProblem) as exc:
        return {"conditions": tuned, "error": f"the successful episodes were not written: {exc}"}
    return {"conditions": tuned, **written}


def refuse_gate_tasks(settings: Any, tasks: list[Any]) -> None:
    """Successes kept as training data never come from the gate's own tasks (`episodes.tasks`): they would train
    the candidates the gate judges on them. A task sharing an instruction with one of them: DataProblem."""
    from pipelines.errors import DataProblem

    gate_file = settings.episodes.tasks
    if not gate_file:
        return

    def refused(why: str) -> DataProblem:  # fail closed: the check cannot run, so nothing is kept
        return DataProblem(
            f"keep successes: the gate's tasks (episodes.tasks = {gate_file}) {why}, so kept successes cannot be "
            "checked against them; fix the setting or clear it"
        )

    try:
        gate = {t.instruction for t in load_tasks(Path(gate_file))[0]}
    except (OSError, ValueError) as exc:  # missing, a folder, not readable, not text (UnicodeDecodeError)
        raise refused("cannot be read") from exc
    if not gate - {""}:  # no task, or none with an instruction: the check would compare nothing
        raise refused("hold no task with an instruction")
    shared = [t for t in tasks if t.instruction in gate]
    if shared:
        raise DataProblem(
            f"keep successes: {len(shared)} of these tasks share instructions with the gate's (episodes.tasks): "
            "its own tasks would train the candidates it judges; keep successes of other tasks"
        )


def episode_pairs(labels: list[str]) -> list[tuple[str, str]]:
    """Which conditions an episode run compares: a candidate against every tuned reference beside it (the
    champion, `tuned_sft`, `tuned_vN`: the evaluation's own rule, `is_tuned_reference`), then each tuned
    condition against the base prompts."""
    from pipelines.evaluate.pipeline import is_tuned_reference

    pairs = []
    for cand in (lab for lab in labels if lab.startswith("tuned_")):
        refs = [] if is_tuned_reference(cand) else sorted(lab for lab in labels if is_tuned_reference(lab))
        pairs += [(cand, ref) for ref in (*refs, "base_few_shot", "base_zero_shot") if ref in labels and ref != cand]
    return pairs


def gold_pool(golds: list[Gold], tools: str) -> list[Example]:
    """Few-shot examples from other tasks' gold trajectories: every step with the real results before it."""
    from pipelines.evaluate.episodes import _call_message, opening
    from pipelines.toolcall.calls import call_text, target_json
    from pipelines.toolcall.prompt import chat_turns, system_prompt

    pool = []
    for g in golds:
        talk = opening(None, g.task)
        for n, (call, step, _) in enumerate(g.path):
            turns = chat_turns(system_prompt(tools, "2026-01-01"), json.dumps(talk))
            target = call_text(target_json(call["name"], call.get("arguments")))
            pool.append(Example(f"{g.task.task_id}:{n}", turns, target, call["name"], turns[-1]["content"], tools))
            messages = _call_message(call, n + 1)
            messages[1]["content"] = step.observation
            talk = talk + messages
    return pool
