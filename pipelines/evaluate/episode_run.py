"""`flywheel eval --episodes`: the conditions (base zero-shot, base few-shot, tuned adapters) as served, each run
teacher-forced and in the closed loop against the environment, with pass^k, paired comparisons and a report.

As served: the production prompt of the condition's style (`toolcall.prompt`), decoded under the offered tools'
grammar with write ids grounded in the conversation (`triton.constrained`, `triton.grounded_ids`) and the
answer budget the models were trained for. In process; the Triton path serves the same prompt and grammar.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, ClassVar

from pipelines.config import Settings
from pipelines.evaluate.episode_data import (
    episode_pairs,
    gold_pool,
    keep_successes,
    progress_line,
    refuse_gate_tasks,
)
from pipelines.evaluate.episodes import (
    Answer,
    Gold,
    PolicyFailed,
    Task,
    closed_loop,
    load_tasks,
    pass_hat_k,
    replay_gold,
    teacher_forced,
    teacher_forced_pass,
)
from pipelines.simulate.environments import Environment, load_environment
from pipelines.toolcall.calls import call_text, target_json
from pipelines.toolcall.examples import Example
from pipelines.toolcall.prompt import chat_turns, short_system_prompt, system_prompt, tools_json

LOG = logging.getLogger("flywheel.episodes")


@dataclass
class ModelPolicy:
    """A model answering episode turns as it is served: its prompt style, the grammar, its answer budget."""

    label: str
    load: Any  # () -> (model, tokenizer): called when the policy first answers, dropped by `release`
    tools: str  # tools_json of the offered tools
    day: str
    style: str = "full"  # full (base models), short or names (tuned adapters)
    constrained: bool = True
    grounded: bool = True
    effects: dict[str, str] | None = None
    max_new_tokens: int = 96
    batch_size: int = 8
    shots: int = 0
    pool: list[Example] | None = None
    temperature: float = 1.0  # of the gold-call probability (the sampled tries' temperature)
    share_prefix: bool = False  # the shared opening computed once per `answer` call (`evaluation.share_prefix`)
    _loaded: Any = field(default=None, repr=False)
    samples: ClassVar[bool] = True  # answers at a temperature (the sampled tries); `bench.episodes` does not

    @property
    def served(self) -> str:
        return "in process"

    @property
    def model(self) -> Any:
        return self._weights()[0]

    @property
    def tokenizer(self) -> Any:
        return self._weights()[1]

    def _weights(self) -> tuple[Any, Any]:
        if self._loaded is None:
            self._loaded = self.load()
        return self._loaded

    def release(self) -> None:
        """Drop the weights: one condition's model in memory at a time."""
        self._loaded = None

    def _turns(self, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
        if self.style == "full":
            system = system_prompt(self.tools, self.day)
        else:
            system = short_system_prompt(self.tools, self.day, signatures=self.style == "short")
        return chat_turns(system, json.dumps(messages))

    def conversations(self, talks: list[list[dict[str, Any]]]) -> list[list[dict[str, str]]]:
        turns = [self._turns(t) for t in talks]
        if not self.shots or not self.pool:
            return turns
        from pipelines.toolcall.fewshot import with_shots

        queries = [Example(f"q{i}", t, "", "", t[-1]["content"], self.tools) for i, t in enumerate(turns)]
        return with_shots(queries, self.pool, self.shots, self._pool_vectors())

    def _pool_vectors(self) -> Any:
        if not hasattr(self, "_vectors"):
            from pipelines.embeddings import embed
            from pipelines.toolcall.fewshot import retrieval_key

            self._vectors = embed([retrieval_key(p) for p in self.pool or []])
        return self._vectors

    def offered(self, talks: list[list[dict[str, Any]]]) -> list[str] | None:
        """The tools each answer is decoded under: grounded in the episode's own conversation (never a few-shot
        example's), the offered tools as they are, or None when decoding is free."""
        if not self.constrained:
            return None
        if not self.grounded:
            return [self.tools] * len(talks)
        from pipelines.toolcall.grounding import ground

        return [ground(self.tools, self._turns(t)[1:], self.effects or {}) for t in talks]

    def answer(
        self, talks: list[list[dict[str, Any]]], temperature: float | None = None, seed: int = 0
    ) -> list[Answer]:
        from pipelines.toolcall.decode import generate

        conversations, tools = self.conversations(talks), self.offered(talks)
        out = generate(self.model, self.tokenizer, conversations, max_new_tokens=self.max_new_tokens,
                       batch_size=self.batch_size, latency_samples=0, tools=tools, temperature=temperature,
                       seed=seed, share_prefix=self.share_prefix)  # fmt: skip
        return [Answer(t, n) for t, n in zip(out.texts, out.prompt_tokens)]

    def gold_logprobs(self, talks: list[list[dict[str, Any]]], targets: list[dict[str, Any]]) -> Sequence[float | None]:
        from pipelines.toolcall.decode import target_logprobs

        texts = [call_text(target_json(t["name"], t.get("arguments"))) for t in targets]
        return target_logprobs(
            self.model, self.tokenizer, self.conversations(talks), texts, temperature=self.temperature
        )


def prepare(env: Environment, tasks: list[Task], offered: set[str]) -> tuple[list[Gold], list[dict[str, str]]]:
    """Each task's gold, or a skip with its reason."""
    golds, skipped = [], []
    for task in tasks:
        gold = replay_gold(env, task, offered)
        if isinstance(gold, str):
            skipped.append({"task_id": task.task_id, "reason": gold})
        else:
            golds.append(gold)
    return golds, skipped


def summarize(
    name: str, tf_rows: list[dict[str, Any]] | None, greedy: list[Any], tries: list[Any], k: int
) -> dict[str, Any]:
    """One condition's numbers over tasks, and per task (the paired comparisons' input)."""
    per_task: dict[str, dict[str, Any]] = {}
    for ep in greedy:
        per_task.setdefault(ep.task_id, {})["success"] = int(ep.success)
        per_task[ep.task_id]["wrong_writes"] = ep.wrong_writes
        per_task[ep.task_id]["prompt_tokens"] = ep.prompt_tokens
        per_task[ep.task_id]["seconds"] = ep.seconds
    by_task: dict[str, list[bool]] = {}
    for ep in tries:
        by_task.setdefault(ep.task_id, []).append(ep.success)
    for task_id, results in by_task.items():
        per_task.setdefault(task_id, {})[f"pass^{k}"] = pass_hat_k(sum(results), len(results), k)
        per_task[task_id]["pass^1_sampled"] = pass_hat_k(sum(results), len(results), 1)
    for row in tf_rows or []:
        entry = per_task.setdefault(row["task_id"], {})
        entry["tf_all_steps_exact"] = row["all_steps_exact"]
        known = row["gold_path_probability"] is not None  # None: answered by a model that gives no probabilities
        entry[f"tf_pass^{k}"] = teacher_forced_pass([s["gold_probability"] for s in row["steps"]], k) if known else None
        entry["tf_pass^1"] = row["gold_path_probability"]
    steps = [s for row in tf_rows or [] for s in row["steps"]]

    def mean(values: list[Any]) -> float | None:
        kept = [float(v) for v in values if v is not None]
        return round(sum(kept) / len(kept), 4) if kept else None

    rows = list(per_task.values())
    return {
        "condition": name,
        "tasks": len(per_task),
        "closed_loop_pass^1": mean([r.get("success") for r in rows]),
        f"closed_loop_pass^{k}": mean([r.get(f"pass^{k}") for r in rows]),
        "teacher_forced_step_exact": mean([s["exact_match"] for s in steps]),
        "teacher_forced_read_exact": mean([s["exact_match"] for s in steps if s["effect"] == "read"]),
        "teacher_forced_write_exact": mean([s["exact_match"] for s in steps if s["effect"] == "write"]),
        "teacher_forced_pass^1": mean([r.get("tf_pass^1") for r in rows]),
        f"teacher_forced_pass^{k}": mean([r.get(f"tf_pass^{k}") for r in rows]),
        "wrong_writes": sum(ep.wrong_writes for ep in greedy),
        "wrong_writes_per_episode": mean([ep.wrong_writes for ep in greedy]),
        "episodes_with_wrong_writes": sum(1 for ep in greedy if ep.wrong_writes),
        "prompt_tokens_per_episode": mean([ep.prompt_tokens for ep in greedy]),
        "seconds_per_episode": mean([ep.seconds for ep in greedy]),
        "per_task": per_task,
    }


def compare_conditions(results: dict[str, dict[str, Any]], candidate: str, reference: str, k: int) -> dict[str, Any]:
    """The candidate against the reference on the tasks both ran: paired 95 % intervals per metric."""
    from pipelines.stats import interval, mcnemar

    ours, theirs = results[candidate]["per_task"], results[reference]["per_task"]
    shared = sorted(set(ours) & set(theirs))
    out: dict[str, Any] = {"condition": candidate, "reference": reference, "n": len(shared), "metrics": {}}
    for metric in ("success", f"pass^{k}", "tf_all_steps_exact", f"tf_pass^{k}"):
        a = [ours[t].get(metric) for t in shared]
        b = [theirs[t].get(metric) for t in shared]
        entry = interval(a, b)
        if metric in ("success", "tf_all_steps_exact"):
            entry["mcnemar"] = mcnemar(a, b)
        out["metrics"][metric] = entry
    out["wrong_writes"] = [sum(ours[t].get("wrong_writes") or 0 for t in shared),
                           sum(theirs[t].get("wrong_writes") or 0 for t in shared)]  # fmt: skip
    return out


@dataclass
class EpisodeRun:
    """What one `run_episodes` call was asked to do."""

    tasks_file: Path
    db_file: Path
    tools_file: Path
    name: str
    day: str = field(default_factory=lambda: date.today().isoformat())
    teacher_forced: bool = True
    closed_loop: bool = True
    sample_tries: bool = True
    few_shot_pool: Path | None = None  # tasks whose gold trajectories are the few-shot pool (not evaluated)
    keep_successes: str | None = None  # a raw zone: the tuned conditions' successful episodes written there


def run_episodes(
    settings: Settings, run: EpisodeRun, policies: list[ModelPolicy], console: Any = None
) -> dict[str, Any]:
    """Every policy on every task that has a gold; the report written as JSON and HTML under
    `<reports>/episodes/<name>/`. Returns the report."""
    e = settings.episodes
    started = time.perf_counter()
    deadline = time.monotonic() + e.time_budget_s
    env = load_environment(e.environment, run.db_file)
    tools = json.loads(run.tools_file.read_text(encoding="utf-8"))
    offered = {t["function"]["name"] for t in tools}
    tasks, unreadable = load_tasks(run.tasks_file)
    if run.keep_successes:
        refuse_gate_tasks(settings, tasks)
    golds, skipped = prepare(env, tasks, offered)
    results: dict[str, dict[str, Any]] = {}
    episodes: dict[str, list[dict[str, Any]]] = {}
    finished: dict[str, list[Any]] = {}
    cut_any, failed = False, {}
    for n, policy in enumerate(policies):
        # each condition an equal share of the budget left: a cut never starves the conditions after it
        mine = time.monotonic() + (deadline - time.monotonic()) / (len(policies) - n)
        say = progress_line(console, run.name, policy.label)
        say(f"{len(golds)} tasks")
        tf, cut = None, False
        greedy: list[Any] = []
        tries: list[Any] = []
        loop: dict[str, Any] = {"temperature": e.temperature, "max_steps_factor": e.max_steps_factor,
                                "deadline": mine, "batch": policy.batch_size}  # fmt: skip
        try:
            if run.closed_loop:
                greedy, cut = closed_loop(env, golds, policy, [-1], progress=say, **loop)
            if run.teacher_forced and not cut:
                say("teacher-forced steps")
                tf, cut = teacher_forced(golds, policy, env.effects(), deadline=mine)
            if run.closed_loop and run.sample_tries and policy.samples and not cut:
                tries, cut = closed_loop(env, golds, policy, list(range(e.k)), progress=say, **loop)
        except PolicyFailed as exc:  # the model could not answer (a served model's error): what finished is kept
            failed[policy.label] = str(exc)
            say(f"failed: {exc}")
        cut_any = cut_any or cut
        hand_over(policy, policies[n + 1] if n + 1 < len(policies) else None)
        results[policy.label] = {**summarize(policy.label, tf, greedy, tries, e.k), "cut_by_time_budget": cut,
                                 "served": policy.served, "sampled": bool(tries),
                                 "error": failed.get(policy.label)}  # fmt: skip
        episodes[policy.label] = [ep.to_dict() for ep in greedy]
        finished[policy.label] = greedy + tries
        if tf is not None:
            for row in tf:
                row["steps"] = row["steps"][:12]
            results[policy.label]["teacher_forced"] = tf
    ran = [p.label for p in policies if p.label in results]
    comparisons = [compare_conditions(results, cand, ref, e.k) for cand, ref in episode_pairs(ran)]
    report = {
        "name": run.name,
        "tasks_file": run.tasks_file.name,
        "environment": e.environment,
        "tasks": len(tasks),
        "scored": len(golds),
        "skipped": unreadable + skipped,
        "gold_changes_state": sum(1 for g in golds if g.changes_state),
        "cut_by_time_budget": cut_any,
        "failed": failed,  # condition -> why it stopped (the rest of the report is what finished)
        "settings": {**e.model_dump(), "day": run.day},
        "conditions": {k: {kk: vv for kk, vv in v.items() if kk != "teacher_forced"} for k, v in results.items()},
        "teacher_forced": {k: v.get("teacher_forced") for k, v in results.items()},
        "comparisons": comparisons,
        "episodes": episodes,
        "seconds": round(time.perf_counter() - started, 1),
        "kept": keep_successes(run, finished, tools, env, golds) if run.keep_successes else None,
    }
    if cut_any and console is not None:
        console.print(
            f"warning: episodes stopped at the time budget ({e.time_budget_s:.0f} s): the report holds what finished"
        )
    from pipelines.evaluate.episode_report import write_episode_report

    return write_episode_report(settings, report)


def hand_over(done: ModelPolicy, after: ModelPolicy | None) -> None:
    """Release a finished condition's weights; the next one with the same loader (the base model, zero-shot
    then few-shot) takes them as they are instead of loading them again inside its own time share."""
    if after is not None and after.load is done.load and after._loaded is None:
        after._loaded = done._loaded
    done.release()


def _as_served(settings: Settings, base_model: str, adapter: str | None) -> tuple[Any, Any]:
    """The model as an instance serves it (`base_models.load_as_served`)."""
    from pipelines.base_models import load_as_served

    return load_as_served(base_model, settings, adapter, what="episodes run")


def policies_for(
    settings: Settings,
    base_model: str,
    adapters: list[Any],
    tools_file: Path,
    *,
    effects: dict[str, str],
    day: str,
    baselines: bool = True,
    zero_shot: bool = True,
    shots: int = 3,
    pool: list[Example] | None = None,
    max_new_tokens: int = 96,
) -> list[ModelPolicy]:
    """The conditions as served: base zero-shot and few-shot (`pool`: other tasks' gold steps) on the base model,
    and each adapter (`evaluate.pipeline.Adapter`) in the prompt style it was trained with."""

    offered = tools_json(json.loads(tools_file.read_text(encoding="utf-8")))
    common: dict[str, Any] = {
        "tools": offered,
        "day": day,
        "constrained": settings.triton.constrained,
        "grounded": settings.triton.grounded_ids,
        "effects": effects,
        "max_new_tokens": max_new_tokens,
        "temperature": settings.episodes.temperature,
        "share_prefix": settings.evaluation.share_prefix,
    }

    def loader(adapter: str | None = None) -> Any:
        return functools.partial(_as_served, settings, base_model, adapter)

    out = []
    base = loader()
    if baselines:
        if zero_shot or not (shots and pool):
            out.append(ModelPolicy("base_zero_shot", base, **common))
        if shots and pool:
            out.append(ModelPolicy("base_few_shot", base, shots=shots, pool=pool, **common))
    for a in adapters:  # each loaded when its condition runs (`ModelPolicy.load`)
        out.append(ModelPolicy(a.label, loader(a.path), style=a.prompt_style, **common))
    return out


def settings_db(settings: Settings, given: Path | None) -> Path:
    """The environment's database: the one given, else `episodes.db`; one clear line when neither is set."""
    from pipelines.errors import DataProblem

    path = given or (Path(settings.episodes.db) if settings.episodes.db else None)
    if path is None:
        raise DataProblem("episodes: no database file: pass --db or set episodes.db (FLYWHEEL_EPISODES__DB)")
    return path


def gold_pool_from(
    settings: Settings, tasks_file: Path | None, db_file: Path, tools_file: Path, evaluated: Path
) -> list[Example]:
    """The few-shot pool: the gold trajectories of `tasks_file`, which must share no task (by its instruction)
    with the `evaluated` tasks: a shot would hold the answer."""
    if tasks_file is None:
        return []
    from pipelines.errors import DataProblem

    env = load_environment(settings.episodes.environment, db_file)
    tools = json.loads(tools_file.read_text(encoding="utf-8"))
    tasks, _ = load_tasks(tasks_file)
    shared = {t.instruction for t in tasks} & {t.instruction for t in load_tasks(evaluated)[0]}
    if shared:
        raise DataProblem(
            f"episodes: {len(shared)} few-shot task(s) of {tasks_file.name} are also evaluated in {evaluated.name} "
            "(same instruction): a few-shot example would hold the answer; use tasks never evaluated"
        )
    golds, _ = prepare(env, tasks, {t["function"]["name"] for t in tools})
    return gold_pool(golds, tools_json(tools))


def gate_episodes(
    settings: Settings, adapters: list[Any], base_model: str, max_new_tokens: int, name: str
) -> dict[str, Any] | None:
    """The episodes the gate's rule decides on (`episodes.tasks` set; None when unset): candidate, champion and
    base few-shot in the closed loop, greedy (`registry.episode_gate.episode_veto` reads the report)."""
    e = settings.episodes
    if not e.tasks:
        return None
    if not e.tools:
        from pipelines.errors import DataProblem

        raise DataProblem("episodes.tasks is set but episodes.tools is not: set the tools file the episodes offer")
    db, tools = settings_db(settings, None), Path(e.tools)
    pool = gold_pool_from(settings, Path(e.shot_tasks) if e.shot_tasks else None, db, tools, Path(e.tasks))
    policies = policies_for(
        settings, base_model, adapters, tools, effects=load_environment(e.environment, db).effects(),
        day=date.today().isoformat(), shots=settings.evaluation.shots, pool=pool, max_new_tokens=max_new_tokens,
        zero_shot=False,  # the rule reads base few-shot where there is a pool, zero-shot only without one
    )  # fmt: skip
    policies.sort(key=lambda p: p.label != "tuned_candidate")  # a time budget cut starves a reference, not it
    run = EpisodeRun(Path(e.tasks), db, tools, f"{name}-episodes", teacher_forced=False, sample_tries=False)
    return run_episodes(settings, run, policies)
