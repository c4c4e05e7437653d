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
from datetime import date
from pathlib import Path
from typing import Any

from pipelines.evaluate.episodes import Episode

LOG = logging.getLogger("flywheel.episodes")


def successful_trajectories(episodes: list[Episode], effects: dict[str, str]) -> list[tuple[str, str, list[Any]]]:
    """[(task id, the customer's request, [(call, result, effect)])] of the successful episodes with no refused
    call and no wrong write, each distinct trajectory of a task once (the greedy one first). An episode without
    a call has no step to train on and is left out."""
    seen: set[str] = set()
    out = []
    for ep in sorted(episodes, key=lambda e: (e.task_id, e.attempt)):
        clean = ep.wrong_writes == 0 and not any(s.get("error") for s in ep.steps)
        if not ep.success or not ep.talk or not clean:  # a refused call or a wrong write never becomes a target
            continue
        steps = []
        for message, result in zip(ep.talk[1::2], ep.talk[2::2]):
            call = message["tool_calls"][0]
            steps.append((call, str(result["content"]), effects.get(call["name"], "write")))
        key = json.dumps([ep.task_id, [c for c, _, _ in steps]], sort_keys=True)
        if steps and key not in seen:
            seen.add(key)
            out.append((ep.task_id, str(ep.talk[0]["content"]), steps))
    return out


def verified_to_raw(
    episodes: list[Episode],
    tools: list[dict[str, Any]],
    effects: dict[str, str],
    where: tuple[str, str],
    day: date,
    name: str,
) -> dict[str, Any]:
    """The successful episodes' trajectories -> `raw/dt=DAY/episodes-<digest>.jsonl` (label_source `verified`),
    the tools registered as the environment's toolset; `where`: the raw zone and that toolset's name. Returns what
    was written."""
    from pipelines.logs.toolsets import register_toolset, toolsets
    from pipelines.simulate.generator import partition_dir
    from pipelines.simulate.importers import SessionWriter, write_atomically

    raw_zone, toolset = where

    found = successful_trajectories(episodes, effects)
    digest = hashlib.sha256(json.dumps([name, found], sort_keys=True, default=str).encode()).hexdigest()[:10]
    if toolset not in toolsets(raw_zone):  # an imported toolset of that name is kept as it was registered
        register_toolset(raw_zone, toolset, tools, effects)
    writer = SessionWriter(day, 0, tools, f"episodes_{digest}", "verified", model=f"flywheel:{name}")
    for n, (_, request, steps) in enumerate(found):
        writer.session(f"{n:05d}", request, steps)
    target = partition_dir(Path(raw_zone.removeprefix("file://")), day) / f"episodes-{digest}.jsonl"
    if found:
        write_atomically(target, writer.data())
    return {
        "episodes_succeeded": sum(1 for e in episodes if e.success),
        "trajectories": len(found),
        "records": writer.records,
        "file": str(target) if found else None,
        "label_source": "verified",
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
    kept = [ep for label in tuned for ep in finished[label] if ep.task_id in changing]
    where = (str(run.keep_successes), env.name)
    try:
        written = verified_to_raw(kept, tools, env.effects(), where, date.fromisoformat(run.day), run.name)
    except (OSError, ValueError, DataProblem) as exc:
        return {"conditions": tuned, "error": f"the successful episodes were not written: {exc}"}
    return {"conditions": tuned, "model": ",".join(tuned), **written}
