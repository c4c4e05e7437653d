"""Whole conversations against a live environment: teacher-forced steps and closed-loop episodes.

A task (a tau-bench task line: the customer's instruction and the gold write actions) is judged two ways:

- *teacher-forced*: every step of the gold trajectory (the environment's `gold_path`: identify the customer,
  read, then write) with the real results before it; each answer scored as one turn (`toolcall.score`), split
  by read and write, and the probability the model gives the gold call at each step, so the probability that k
  tries sampled from the unconstrained model all walk exactly the gold path follows (`teacher_forced_pass`);
- *closed loop*: the model acts from the customer's request until it answers in text (no call), hands over,
  or reaches `max_steps_factor` times the gold length; the episode succeeds when the final state's hash equals
  the gold replay's (any path to the gold state passes). pass^1 greedy, and pass^k from k sampled tries with
  tau-bench's estimator C(c, k) / C(n, k) over the n tries of which c succeeded (`pass_hat_k`).

A task whose gold actions fail against the database is skipped with its reason, never scored as a model
failure; a tool that raises ends its episode as failed with the error recorded; a run past its time budget
stops with the episodes it finished and says so.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pipelines.logs.tools import effect_of as tool_effect
from pipelines.simulate.environments import Environment, Step, ToolFailed, replay
from pipelines.toolcall.calls import call_text, parse_call, target_json
from pipelines.toolcall.pii import pass_on
from pipelines.toolcall.score import _ids, score

SKIPPED_ACTIONS = ("think",)  # a scratchpad, not a call on the shop


@dataclass(frozen=True)
class Task:
    task_id: str
    instruction: str
    actions: list[dict[str, Any]]  # the gold calls, in order ({"name", "arguments"})
    raw: dict[str, Any]  # the task line as read (the environment's gold_path reads what it needs)


@dataclass
class Gold:
    """A task's gold: the state its actions leave, and the trajectory a policy-following agent walks."""

    task: Task
    state_hash: str
    path: list[tuple[dict[str, Any], Step, str]]  # (call, the environment's answer, read or write)
    changes_state: bool


def load_tasks(path: Path) -> tuple[list[Task], list[dict[str, str]]]:
    """The task file's tasks and, for each line that is not one, `{"task_id", "reason"}`."""
    tasks, skipped = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        task_id = f"{path.stem}:{n}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            skipped.append({"task_id": task_id, "reason": f"not JSON ({exc.msg})"})
            continue
        actions = raw.get("actions") if isinstance(raw, dict) else None
        if not isinstance(actions, list) or not all(
            isinstance(a, dict) and isinstance(a.get("name"), str) and isinstance(a.get("arguments") or {}, dict)
            for a in actions
        ):
            skipped.append(
                {"task_id": task_id, "reason": "no `actions` list of calls (a name and an arguments object)"}
            )
            continue
        kept = [
            {"name": a["name"], "arguments": a.get("arguments") or {}}
            for a in actions
            if a["name"] not in SKIPPED_ACTIONS
        ]
        tasks.append(Task(task_id, " ".join(str(raw.get("instruction") or "").split()), kept, raw))
    return tasks, skipped


def replay_gold(env: Environment, task: Task, offered: set[str]) -> Gold | str:
    """The task's gold (`simulate.environments.replay`), or why the task cannot be scored."""
    gold = replay(env, task.raw, task.actions, offered)
    return gold if isinstance(gold, str) else Gold(task, gold.state_hash, gold.path, gold.changes_state)


def effect_of(env: Environment, name: str) -> str:
    return str(tool_effect(name, env.effects()))  # undeclared: a write (fail safe)


# -- scoring ----------------------------------------------------------------------------------------------------
def pass_hat_k(successes: int, tries: int, k: int) -> float | None:
    """tau-bench's pass^k: the chance that k tries drawn from the n made all succeed, C(c, k) / C(n, k)."""
    if tries < k or k < 1:
        return None
    return math.comb(successes, k) / math.comb(tries, k)


def teacher_forced_pass(step_probabilities: Sequence[float], k: int) -> float:
    """The chance that k independent sampled tries all walk the gold path: (prod p_step)^k. A lower bound on
    pass^k in the closed loop, where other paths to the gold state also pass."""
    return math.prod(step_probabilities) ** k


def wrong_write(call: dict[str, Any], gold_actions: list[dict[str, Any]], effect: str) -> bool:
    """A write no gold action makes: another tool, or the same tool on other ids (`toolcall.score._ids`)."""
    if effect != "write":
        return False
    ids = _ids(call.get("arguments") or {})
    return not any(a["name"] == call["name"] and _ids(a["arguments"]) == ids for a in gold_actions)


def state_diff(ours: Mapping[str, Any], gold: Mapping[str, Any], limit: int = 20) -> list[dict[str, Any]]:
    """Where the episode's final state differs from the gold's: table, key and the top-level fields."""
    out: list[dict[str, Any]] = []
    for table in sorted(set(ours) | set(gold)):
        a, b = ours.get(table) or {}, gold.get(table) or {}
        if not isinstance(a, dict) or not isinstance(b, dict):
            if a != b:
                out.append({"table": table, "key": None, "fields": []})
            continue
        for key in sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)):
            x, y = a.get(key), b.get(key)
            fields = (
                sorted(f for f in set(x) | set(y) if x.get(f) != y.get(f))
                if isinstance(x, dict) and isinstance(y, dict)
                else []
            )
            out.append({"table": table, "key": key, "fields": fields})
            if len(out) >= limit:
                return out
    return out


# -- running ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int


class PolicyFailed(RuntimeError):
    """The policy could not answer (a served model's error): its condition stops there, the rest is kept."""


class Policy(Protocol):
    """What acts in an episode: answers a batch of conversations (OpenAI messages) under the offered tools;
    `temperature` None is greedy, else sampled with `seed`."""

    label: str

    def answer(
        self, conversations: list[list[dict[str, Any]]], temperature: float | None = None, seed: int = 0
    ) -> list[Answer]: ...

    def gold_logprobs(
        self, conversations: list[list[dict[str, Any]]], targets: list[dict[str, Any]]
    ) -> Sequence[float | None]: ...  # None each: the policy cannot compute them (a served model's answers)


@dataclass
class Episode:
    task_id: str
    attempt: int  # -1: greedy; 0..k-1: the sampled tries
    steps: list[dict[str, Any]] = field(default_factory=list)
    end: str = ""  # answered, max_steps, handed_over, tool_error, time_budget
    error: str | None = None
    success: bool = False
    left_gold_at: int | None = None  # the first step that is not the gold trajectory's
    state_diff: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    seconds: float = 0.0
    talk: list[dict[str, Any]] | None = field(default=None, repr=False)  # a success's whole conversation

    @property
    def wrong_writes(self) -> int:
        return sum(1 for s in self.steps if s.get("wrong_write"))

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if k != "talk"}, "wrong_writes": self.wrong_writes}


def opening(system: str | None, task: Task) -> list[dict[str, Any]]:
    """The conversation an episode starts from: the customer's request, as the task states what they know."""
    return [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": task.instruction}]


def _call_message(call: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """A call and its (to be filled) result in the curated conversation format prompts are built from."""
    call_id = f"call_{n}"
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"name": call["name"], "arguments": call.get("arguments") or {}}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": None},
    ]


def as_passed_on(text: str, talk: list[dict[str, Any]]) -> str:
    """A redaction token in a call's arguments as the gateway handles it (`toolcall.pii.pass_on`, the one
    decision): filled from the customer's own turns in `talk`, or, where they state no one value for it, the
    gateway's text asking for it instead of the call. Any other answer comes back as it is (the gateway's
    schema check after decoding is not repeated: the environment refuses a call that breaks its tool)."""
    call = parse_call(text)
    if not call or call.get("name") is None:
        return text
    arguments = json.dumps(call["arguments"], separators=(",", ":"), ensure_ascii=False)
    stated = [m["content"] for m in talk if m.get("role") == "user" and isinstance(m.get("content"), str)]
    passed, is_call = pass_on(arguments, stated)
    if not is_call:
        return passed
    return text if passed == arguments else call_text(target_json(call["name"], json.loads(passed)))


def closed_loop(
    env: Environment,
    golds: list[Gold],
    policy: Policy,
    attempts: Sequence[int],
    *,
    temperature: float,
    max_steps_factor: float,
    deadline: float,
    batch: int = 8,
    progress: Any = None,
) -> tuple[list[Episode], bool]:
    """Every (task, attempt) episode, `batch` at a time advancing in lockstep (one batched answer per step);
    attempt -1 greedy, others sampled. Returns the finished episodes and whether the time budget cut the run."""
    work = [(g, a) for a in attempts for g in golds]
    done: list[Episode] = []
    for start in range(0, len(work), batch):
        if time.monotonic() > deadline:
            return done, True
        chunk = work[start : start + batch]
        envs = [env.fork() for _ in chunk]
        for e in envs:
            e.reset()
        episodes = [Episode(g.task.task_id, a) for g, a in chunk]
        talks = [opening(None, g.task) for g, _ in chunk]
        limits = [max(1, math.ceil(max_steps_factor * max(1, len(g.path)))) for g, _ in chunk]
        active = list(range(len(chunk)))
        began = time.perf_counter()
        while active:
            if time.monotonic() > deadline:
                for i in active:
                    episodes[i].end = "time_budget"
                break
            seed = start * 1000 + len(episodes[active[0]].steps)
            sampled = [i for i in active if chunk[i][1] >= 0]
            greedy = [i for i in active if chunk[i][1] < 0]
            answers: dict[int, Answer] = {}
            for group, temp in ((greedy, None), (sampled, temperature)):
                if group:
                    out = policy.answer([talks[i] for i in group], temp, seed)
                    answers.update(zip(group, out))
            still = [i for i in active if _advance(episodes[i], envs[i], chunk[i][0], answers[i], talks, i, limits[i])]
            active = still
        elapsed = time.perf_counter() - began
        for i, ep in enumerate(episodes):
            if ep.end == "time_budget":
                continue
            gold = chunk[i][0]
            ep.seconds = round(elapsed / len(chunk), 3)
            ep.success = ep.end != "tool_error" and envs[i].state_hash() == gold.state_hash
            ep.left_gold_at = _left_gold(ep, gold)
            if ep.success:
                ep.talk = talks[i]  # rejection sampling's training data (`evaluate.episode_data`)
            elif ep.attempt < 0:  # the report shows the greedy episodes' differences only
                ep.state_diff = state_diff(envs[i].snapshot(), _gold_state(env, gold))
            done.append(ep)
            if progress is not None:
                progress()
    return done, False


def _advance(
    ep: Episode, env: Environment, gold: Gold, ans: Answer, talks: list[list[dict[str, Any]]], i: int, limit: int
) -> bool:
    """One answer applied to its episode: the call run on the environment and its result appended to the
    conversation `talks[i]`. Returns whether the episode goes on."""
    ep.prompt_tokens += ans.prompt_tokens
    text = as_passed_on(ans.text, talks[i])
    call = parse_call(text)
    if not call or call.get("name") is None or not isinstance(call.get("arguments"), dict):
        ep.steps.append({"text": text, "call": None})
        ep.end = "answered"
        return False
    effect = effect_of(env, call["name"])
    try:
        step = env.step(call["name"], call["arguments"])
    except ToolFailed as exc:
        ep.steps.append({"text": text, "call": call, "effect": effect})
        ep.end, ep.error = "tool_error", str(exc)
        return False
    ep.steps.append(
        {
            "call": call,
            "effect": effect,
            "result": step.observation[:600],
            "error": step.error,
            "wrong_write": wrong_write(call, gold.task.actions, effect),
            "applied": effect == "write" and not step.error,
        }
    )
    messages = _call_message(call, len(ep.steps))
    messages[1]["content"] = step.observation
    talks[i] = talks[i] + messages
    if env.ends_episode(call["name"]):
        ep.end = "handed_over"
    elif len(ep.steps) >= limit:
        ep.end = "max_steps"
    else:
        return True
    return False


def _gold_state(env: Environment, gold: Gold) -> dict[str, Any]:
    fresh = env.fork()
    fresh.reset()
    for action in gold.task.actions:
        fresh.step(action["name"], action["arguments"])
    return fresh.snapshot()


def _left_gold(ep: Episode, gold: Gold) -> int | None:
    """The first step whose call is not the gold trajectory's at that position (None: it never left)."""
    calls = [s for s in ep.steps if s.get("call") is not None]  # a closing answer in text is no step off it
    for n, s in enumerate(calls):
        if n >= len(gold.path) or not score(json.dumps(s["call"]), gold.path[n][0]).exact_match:
            return n
    return None if len(calls) == len(gold.path) else len(calls)


def teacher_forced(
    golds: list[Gold], policy: Policy, effects: Mapping[str, str], deadline: float = math.inf, tasks_per_batch: int = 8
) -> tuple[list[dict[str, Any]], bool]:
    """Each gold step answered with the gold history and real results before it: exact match, read or write,
    wrong writes, and the probability of the gold call. One row per task, `tasks_per_batch` tasks at a time;
    returns the rows and whether the time budget (`deadline`, monotonic) cut the run."""
    rows: list[dict[str, Any]] = []
    for start in range(0, len(golds), tasks_per_batch):
        if time.monotonic() > deadline:
            return rows, True
        rows += _teacher_forced(golds[start : start + tasks_per_batch], policy, effects)
    return rows, False


def _teacher_forced(golds: list[Gold], policy: Policy, effects: Mapping[str, str]) -> list[dict[str, Any]]:
    conversations, targets, where = [], [], []
    for t, gold in enumerate(golds):
        talk = opening(None, gold.task)
        for n, (call, step, _) in enumerate(gold.path):
            conversations.append(talk)
            targets.append(call)
            where.append((t, n))
            messages = _call_message(call, n + 1)
            messages[1]["content"] = step.observation
            talk = talk + messages
    answers = policy.answer(conversations) if conversations else []
    logprobs = policy.gold_logprobs(conversations, targets) if conversations else []
    rows: list[dict[str, Any]] = [{"task_id": g.task.task_id, "steps": [], "prompt_tokens": 0} for g in golds]
    for (t, n), ans, lp, target, talk in zip(where, answers, logprobs, targets, conversations):
        output = as_passed_on(ans.text, talk)
        s = score(output, target, effects)
        rows[t]["prompt_tokens"] += ans.prompt_tokens
        rows[t]["steps"].append(
            {
                "expected": target,
                "output": output,
                "effect": golds[t].path[n][2],
                "exact_match": int(s.exact_match),
                "wrong_write": s.wrong_write,
                "gold_probability": None if lp is None else math.exp(lp),  # None: a served model's answer
            }
        )
    for row in rows:
        steps = row["steps"]
        row["all_steps_exact"] = int(all(s["exact_match"] for s in steps))
        tells = getattr(policy, "probabilities", True)  # a served model gives none: not even an empty path's 1.0
        known = [s["gold_probability"] for s in steps if s["gold_probability"] is not None]
        row["gold_path_probability"] = math.prod(known) if tells and len(known) == len(steps) else None
        row["wrong_writes"] = sum(1 for s in steps if s["wrong_write"])
    return rows
