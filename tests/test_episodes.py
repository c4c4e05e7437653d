"""Episodes against the retail environment: the environment (tau-bench's tools on a per-episode copy), the
scoring floors (the gold replay passes every task, an empty episode passes exactly the tasks whose gold changes
nothing), pass^k against hand-worked numbers, the closed loop's endings, and the gate's episode rule.

The database, tools and tasks are generated here in tau-bench's shapes (no benchmark data is read)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from pipelines.evaluate.episode_data import episode_pairs
from pipelines.evaluate.episode_run import compare_conditions, prepare, summarize
from pipelines.evaluate.episodes import (
    Answer,
    Episode,
    closed_loop,
    load_tasks,
    pass_hat_k,
    teacher_forced,
    teacher_forced_pass,
)
from pipelines.simulate.retail_env import RetailEnvironment
from pipelines.toolcall.calls import call_text, target_json

ADDRESS = {"address1": "1 Elm St", "address2": "", "city": "Austin", "state": "TX", "country": "USA", "zip": "78701"}


def _db() -> dict[str, Any]:
    def order(oid: str, user: str, status: str, items: list[tuple[str, str, float]], method: str) -> dict[str, Any]:
        return {
            "order_id": oid,
            "user_id": user,
            "address": ADDRESS,
            "items": [
                {"name": "Lamp", "product_id": pid, "item_id": iid, "price": price, "options": {"color": "red"}}
                for pid, iid, price in items
            ],
            "status": status,
            "fulfillments": [],
            "payment_history": [
                {"transaction_type": "payment", "amount": sum(p for *_, p in items), "payment_method_id": method}
            ],
        }

    return {
        "products": {
            "100": {
                "name": "Lamp",
                "product_id": "100",
                "variants": {
                    "1001": {"item_id": "1001", "options": {"color": "red"}, "available": True, "price": 30.0},
                    "1002": {"item_id": "1002", "options": {"color": "blue"}, "available": True, "price": 35.5},
                    "1003": {"item_id": "1003", "options": {"color": "gold"}, "available": False, "price": 90.0},
                },
            }
        },
        "users": {
            "ana_lee_1": {
                "user_id": "ana_lee_1",
                "name": {"first_name": "Ana", "last_name": "Lee"},
                "address": ADDRESS,
                "email": "ana.lee@example.com",
                "payment_methods": {
                    "credit_card_1": {
                        "source": "credit_card",
                        "id": "credit_card_1",
                        "brand": "visa",
                        "last_four": "1",
                    },
                    "gift_card_1": {"source": "gift_card", "id": "gift_card_1", "balance": 10.0},
                },
                "orders": ["#W1", "#W2", "#W3"],
            }
        },
        "orders": {
            "#W1": order("#W1", "ana_lee_1", "pending", [("100", "1001", 30.0)], "gift_card_1"),
            "#W2": order("#W2", "ana_lee_1", "delivered", [("100", "1001", 30.0)], "credit_card_1"),
            "#W3": order("#W3", "ana_lee_1", "pending", [("100", "1001", 30.0)], "credit_card_1"),
        },
    }


TASKS = [
    {"user_id": "ana_lee_1", "instruction": "I am ana.lee@example.com, cancel #W1.", "actions": [
        {"name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "no longer needed"}}]},
    {"user_id": "ana_lee_1", "instruction": "I am ana.lee@example.com, return the lamp of #W2.", "actions": [
        {"name": "return_delivered_order_items",
         "arguments": {"order_id": "#W2", "item_ids": ["1001"], "payment_method_id": "credit_card_1"}}]},
    {"user_id": "ana_lee_1", "instruction": "I am Ana Lee, zip 78701: make the lamp of #W3 blue.", "actions": [
        {"name": "modify_pending_order_items", "arguments": {
            "order_id": "#W3", "item_ids": ["1001"], "new_item_ids": ["1002"], "payment_method_id": "credit_card_1"}}]},
    {"user_id": "ana_lee_1", "instruction": "I am ana.lee@example.com, just checking in.", "actions": []},
    {"user_id": "ana_lee_1", "instruction": "Cancel my delivered #W2.", "actions": [
        {"name": "cancel_pending_order", "arguments": {"order_id": "#W2", "reason": "no longer needed"}}]},
]  # fmt: skip
OFFERED = {
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_user_details",
    "get_order_details",
    "get_product_details",
    "cancel_pending_order",
    "return_delivered_order_items",
    "modify_pending_order_items",
}


@pytest.fixture
def env() -> RetailEnvironment:
    return RetailEnvironment(_db())


@pytest.fixture
def golds(env: RetailEnvironment, tmp_path: Path) -> tuple[list[Any], list[dict[str, str]]]:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join([*(json.dumps(t) for t in TASKS), "{not json"]) + "\n")
    tasks, unreadable = load_tasks(path)
    golds, skipped = prepare(env, tasks, OFFERED)
    return golds, unreadable + skipped


class Scripted:
    """A policy that answers from a script per task: the gold trajectory, nothing, or a given call list."""

    label = "scripted"
    batch_size = 2

    def __init__(self, script: dict[str, list[dict[str, Any] | None]]):
        self.script = script

    def _task(self, talk: list[dict[str, Any]]) -> tuple[str, int]:
        return talk[0]["content"], sum(1 for m in talk if m["role"] == "assistant")

    def answer(
        self, talks: list[list[dict[str, Any]]], temperature: float | None = None, seed: int = 0
    ) -> list[Answer]:
        out = []
        for talk in talks:
            request, n = self._task(talk)
            calls = self.script.get(request, [])
            call = calls[n] if n < len(calls) else None
            text = '{"name":null}' if call is None else call_text(target_json(call["name"], call["arguments"]))
            out.append(Answer(text, 10))
        return out

    def gold_logprobs(self, talks: list[list[dict[str, Any]]], targets: list[dict[str, Any]]) -> list[float]:
        return [0.0 if self.answer([t])[0].text == call_text(target_json(g["name"], g["arguments"])) else -1.0
                for t, g in zip(talks, targets)]  # fmt: skip


def _gold_script(golds: list[Any]) -> Scripted:
    return Scripted({g.task.instruction: [c for c, _, _ in g.path] for g in golds})


def _run(env: RetailEnvironment, golds: list[Any], policy: Any, attempts: list[int] | None = None) -> list[Episode]:
    eps, cut = closed_loop(
        env, golds, policy, attempts or [-1], temperature=1.0, max_steps_factor=2, deadline=time.monotonic() + 60
    )
    assert not cut
    return eps


# -- the environment ----------------------------------------------------------------------------------------------
def test_a_write_changes_the_state_and_a_refused_one_returns_the_benchmarks_error(env: RetailEnvironment) -> None:
    untouched = env.state_hash()
    step = env.step("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
    assert not step.error and env.data["orders"]["#W1"]["status"] == "cancelled"
    assert env.data["users"]["ana_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 40.0  # refunded at once
    assert env.state_hash() != untouched
    after = env.state_hash()
    for name, args, error in (
        ("cancel_pending_order", {"order_id": "#W9", "reason": "no longer needed"}, "Error: order not found"),
        ("cancel_pending_order", {"order_id": "#W2", "reason": "no longer needed"},
         "Error: non-pending order cannot be cancelled"),
        ("cancel_pending_order", {"order_id": "#W3", "reason": "bored"}, "Error: invalid reason"),
        ("return_delivered_order_items", {"order_id": "#W2", "item_ids": ["1001"], "payment_method_id": "paypal_9"},
         "Error: payment method not found"),
        ("modify_pending_order_items", {"order_id": "#W3", "item_ids": ["1001"], "new_item_ids": ["1003"],
                                        "payment_method_id": "credit_card_1"},
         "Error: new item 1003 not found or available"),
        ("get_user_details", {"user_id": "nobody"}, "Error: user not found"),
        ("get_order_details", {}, "Error: missing a required argument: 'order_id'"),
        ("launch_rocket", {}, "Unknown action launch_rocket"),
    ):  # fmt: skip
        step = env.step(name, args)
        assert step.error and step.result == error, (name, step.result)
    assert env.state_hash() == after  # a refused call changes nothing
    env.reset()
    assert env.state_hash() == untouched and env.data["orders"]["#W1"]["status"] == "pending"


def test_equal_states_hash_equal_whatever_the_order_of_the_writes(env: RetailEnvironment) -> None:
    a, b = env.fork(), env.fork()
    cancel = ("cancel_pending_order", {"order_id": "#W3", "reason": "ordered by mistake"})
    ret = (
        "return_delivered_order_items",
        {"order_id": "#W2", "item_ids": ["1001"], "payment_method_id": "gift_card_1"},
    )
    for name, args in (cancel, ret):
        a.step(name, args)
    for name, args in (ret, cancel):
        b.step(name, args)
    assert a.state_hash() == b.state_hash()
    a.data["orders"] = dict(reversed(list(a.data["orders"].items())))  # key order is not state
    assert a.state_hash() == b.state_hash()
    b.step("modify_user_address", {"user_id": "ana_lee_1", **ADDRESS, "zip": "78702"})
    assert a.state_hash() != b.state_hash()


def test_a_gift_card_pays_the_difference_of_an_item_swap(env: RetailEnvironment) -> None:
    step = env.step(
        "modify_pending_order_items",
        {"order_id": "#W1", "item_ids": ["1001"], "new_item_ids": ["1002"], "payment_method_id": "gift_card_1"},
    )
    assert not step.error
    order = env.data["orders"]["#W1"]
    assert order["status"] == "pending (item modified)" and order["items"][0]["item_id"] == "1002"
    assert env.data["users"]["ana_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 4.5
    assert json.loads(step.observation)["items"][0]["item_id"] == "1002"  # the brief the model is shown


# -- the floors ---------------------------------------------------------------------------------------------------
def test_a_task_whose_gold_fails_is_skipped_with_its_reason(golds: tuple[list[Any], list[dict[str, str]]]) -> None:
    scored, skipped = golds
    assert len(scored) == 4
    reasons = {s["task_id"]: s["reason"] for s in skipped}
    assert reasons["tasks:4"].startswith("gold action cancel_pending_order fails against the database")
    assert "non-pending order cannot be cancelled" in reasons["tasks:4"]
    assert reasons["tasks:5"].startswith("not JSON")


def test_the_gold_replay_passes_every_task_and_an_empty_episode_only_those_that_change_nothing(
    env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    scored, _ = golds
    assert [len(g.path) for g in scored] == [4, 4, 5, 2]  # identify, profile, read the order (and product), write
    gold = _run(env, scored, _gold_script(scored))
    assert [e.success for e in gold] == [True] * 4
    assert all(e.left_gold_at is None and e.wrong_writes == 0 and e.end == "answered" for e in gold)
    empty = _run(env, scored, Scripted({}))
    assert [e.success for e in empty] == [not g.changes_state for g in scored] == [False, False, False, True]
    fields = ["cancel_reason", "payment_history", "status"]
    assert empty[0].state_diff == [
        {"table": "orders", "key": "#W1", "fields": fields},
        {"table": "users", "key": "ana_lee_1", "fields": ["payment_methods"]},
    ]


def test_a_wrong_write_is_counted_and_the_episode_fails(
    env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    scored, _ = golds
    first = scored[0]
    wrong = {"name": "cancel_pending_order", "arguments": {"order_id": "#W3", "reason": "no longer needed"}}
    ep = _run(env, [first], Scripted({first.task.instruction: [wrong, *[c for c, _, _ in first.path]]}))[0]
    assert ep.wrong_writes == 1 and ep.steps[0]["applied"] and not ep.success and ep.left_gold_at == 0


def test_a_tool_that_raises_ends_the_episode_as_failed_with_its_error(
    env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    scored, _ = golds
    args = {"order_id": "#W3", "item_ids": 5, "new_item_ids": [], "payment_method_id": "credit_card_1"}
    bad = {"name": "modify_pending_order_items", "arguments": args}
    ep = _run(env, [scored[3]], Scripted({scored[3].task.instruction: [bad]}))[0]
    assert ep.end == "tool_error" and "modify_pending_order_items: TypeError" in (ep.error or "")
    assert not ep.success  # even though the state is the (unchanged) gold one


def test_a_run_past_its_time_budget_stops_with_what_it_finished(
    env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    scored, _ = golds
    eps, cut = closed_loop(env, scored, Scripted({}), [-1], temperature=1.0, max_steps_factor=2, deadline=0.0)
    assert cut and eps == []


def test_max_steps_ends_a_loop_at_twice_the_gold_length(
    env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    scored, _ = golds
    read = {"name": "get_order_details", "arguments": {"order_id": "#W1"}}
    ep = _run(env, [scored[3]], Scripted({scored[3].task.instruction: [read] * 50}))[0]
    assert ep.end == "max_steps" and len(ep.steps) == 4  # the gold path of a no-change task has 2 steps


def test_a_redaction_token_is_filled_from_the_customers_turns_as_the_gateway_does_or_asked_for(
    env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    """A tuned model writes prep's `<EMAIL>` where its training targets had one; as served, the gateway fills it
    from the customer's own turns or asks for it (`toolcall.pii`), and so does the episode. Mutation tried:
    `_advance` and `_teacher_forced` scoring the model's raw text: both assertions on the filled call fail."""
    scored, _ = golds
    stated, unstated = scored[0], scored[2]  # "I am ana.lee@example.com, ..." and "I am Ana Lee, zip 78701 ..."
    redacted = [
        {**c, "arguments": {**c["arguments"], "email": "<EMAIL>"}} if "email" in c["arguments"] else c
        for c, _, _ in stated.path
    ]
    assert redacted != [c for c, _, _ in stated.path]  # the gold identifies Ana by her email
    by_email = {"name": "find_user_id_by_email", "arguments": {"email": "<EMAIL>"}}
    script = Scripted({stated.task.instruction: redacted, unstated.task.instruction: [by_email]})
    filled, asked = _run(env, [stated, unstated], script)
    assert filled.success and filled.steps[0]["call"]["arguments"]["email"] == "ana.lee@example.com"
    assert asked.end == "answered" and asked.steps == [
        {"text": "I need the customer's email address to do that: the conversation does not state exactly one.",
         "call": None}
    ]  # fmt: skip
    rows, _ = teacher_forced([stated], script, env.effects())
    assert rows[0]["steps"][0]["exact_match"] == 1 and "ana.lee@example.com" in rows[0]["steps"][0]["output"]


# -- pass^k -------------------------------------------------------------------------------------------------------
def test_an_episode_candidate_is_paired_with_every_tuned_reference_beside_it_as_the_evaluation_pairs() -> None:
    """A tuned candidate is compared with the champion, the SFT adapter it was tuned from and a registered
    version; a reference only with the base prompts (the evaluation's `is_tuned_reference` rule)."""
    labels = ["base_zero_shot", "base_few_shot", "tuned_champion", "tuned_sft", "tuned_v3", "tuned_candidate"]
    pairs = episode_pairs(labels)
    assert [ref for cand, ref in pairs if cand == "tuned_candidate"] == [
        "tuned_champion", "tuned_sft", "tuned_v3", "base_few_shot", "base_zero_shot"
    ]  # fmt: skip
    assert [ref for cand, ref in pairs if cand == "tuned_sft"] == ["base_few_shot", "base_zero_shot"]
    assert episode_pairs(["base_few_shot", "tuned_candidate"]) == [("tuned_candidate", "base_few_shot")]


def test_pass_hat_k_against_a_hand_worked_example() -> None:
    # four tries, three succeed: pass^1 = 3/4; pass^2 = C(3,2)/C(4,2) = 3/6; pass^3 = 1/4; pass^4 = 0
    assert [pass_hat_k(3, 4, k) for k in (1, 2, 3, 4)] == [0.75, 0.5, 0.25, 0.0]
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(2, 3, 4) is None
    # teacher-forced: a gold path of two steps with probabilities 0.5 and 0.8 -> 0.4 per try, 0.16 for two
    assert teacher_forced_pass([0.5, 0.8], 1) == pytest.approx(0.4)
    assert teacher_forced_pass([0.5, 0.8], 2) == pytest.approx(0.16)


def test_summary_and_teacher_forced_rows(env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]) -> None:
    scored, _ = golds
    policy = _gold_script(scored)
    tf, cut = teacher_forced(scored, policy, env.effects(), tasks_per_batch=3)
    assert not cut and [r["task_id"] for r in tf] == [g.task.task_id for g in scored]
    assert [r["all_steps_exact"] for r in tf] == [1, 1, 1, 1] and all(r["gold_path_probability"] == 1.0 for r in tf)
    assert teacher_forced(scored, policy, env.effects(), deadline=0.0) == ([], True)  # past its budget: stops
    tries = _run(env, scored, policy, [0, 1, 2, 3])
    row = summarize("gold", tf, _run(env, scored, policy), tries, 4)
    assert row["closed_loop_pass^1"] == 1.0 and row["closed_loop_pass^4"] == 1.0
    assert row["teacher_forced_write_exact"] == 1.0 and row["wrong_writes"] == 0


# -- the gate's rule ----------------------------------------------------------------------------------------------
def _report(
    env: RetailEnvironment, scored: list[Any], candidate: Any, reference: Any, ref: str = "base_few_shot"
) -> dict[str, Any]:
    many = scored * 30  # the same four tasks under other ids: enough for an interval within the margin
    for n, g in enumerate(many):
        many[n] = type(g)(type(g.task)(f"t{n}", g.task.instruction, g.task.actions, g.task.raw), g.state_hash,
                          g.path, g.changes_state)  # fmt: skip
    results = {
        "tuned_candidate": summarize("tuned_candidate", None, _run(env, many, candidate), [], 4),
        ref: summarize(ref, None, _run(env, many, reference), [], 4),
    }
    return {"conditions": results, "comparisons": [compare_conditions(results, "tuned_candidate", ref, 4)]}


def test_the_gate_refuses_a_candidate_worse_on_episodes_and_passes_an_equal_one(
    env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]], flywheel_root: Path
) -> None:
    from pipelines.config import load_settings
    from pipelines.registry.episode_gate import episode_veto

    settings = load_settings()
    scored, _ = golds
    gold = _gold_script(scored)
    assert episode_veto(_report(env, scored, gold, gold), settings) is None
    worse = episode_veto(_report(env, scored, Scripted({}), gold), settings)
    assert worse is not None and worse.startswith("refused: closed-loop success -0.750")
    first = scored[0]
    wrong = {"name": "cancel_pending_order", "arguments": {"order_id": "#W3", "reason": "no longer needed"}}
    writer = Scripted({**gold.script, first.task.instruction: [wrong, *gold.script[first.task.instruction]]})
    veto = episode_veto(_report(env, scored, writer, gold), settings)
    assert veto is not None and veto.startswith("refused: wrong writes in episodes 30 vs 0")
    # without a few-shot pool the zero-shot prompt is the reference (mutation: only the champion checked)
    zero = episode_veto(_report(env, scored, Scripted({}), gold, "base_zero_shot"), settings)
    assert zero is not None and "vs base_zero_shot" in zero


# -- the model path -----------------------------------------------------------------------------------------------
def _tool(name: str, props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name.replace("_", " "),
            "parameters": {"type": "object", "properties": props, "required": sorted(props)},
        },
    }


def _tools() -> list[dict[str, Any]]:
    s, ids = {"type": "string"}, {"type": "array", "items": {"type": "string"}}
    return [
        _tool("find_user_id_by_email", {"email": s}),
        _tool("find_user_id_by_name_zip", {"first_name": s, "last_name": s, "zip": s}),
        _tool("get_user_details", {"user_id": s}),
        _tool("get_order_details", {"order_id": s}),
        _tool("get_product_details", {"product_id": s}),
        _tool("cancel_pending_order", {"order_id": s, "reason": {"type": "string", "enum": ["no longer needed",
                                                                                             "ordered by mistake"]}}),
        _tool("return_delivered_order_items", {"order_id": s, "item_ids": ids, "payment_method_id": s}),
        _tool("modify_pending_order_items",
              {"order_id": s, "item_ids": ids, "new_item_ids": ids, "payment_method_id": s}),
    ]  # fmt: skip


def test_the_gold_call_probability_is_the_same_alone_and_beside_a_longer_padded_row(flywheel_root: Path) -> None:
    import torch

    from pipelines.base_models import load_base
    from pipelines.config import load_settings
    from pipelines.toolcall.decode import target_logprobs

    torch.manual_seed(0)
    model, tokenizer = load_base("tiny-llama", load_settings())
    short = [{"role": "user", "content": "cancel #W1"}]
    long = [{"role": "user", "content": "please look up the order #W2 and the one after it " * 6}]
    target = call_text(target_json("get_order_details", {"order_id": "#W1"}))
    alone = target_logprobs(model, tokenizer, [short], [target])[0]
    padded = target_logprobs(model, tokenizer, [long, short], [target, target], batch_size=2)[1]
    assert alone < 0 and padded == pytest.approx(alone, abs=1e-3)  # the padding masked out


@pytest.mark.slow
def test_flywheel_eval_episodes_end_to_end_on_a_tiny_model(tmp_path: Path, flywheel_root: Path) -> None:
    from helpers import run_flywheel
    from ports import free_port

    db, tools, tasks = tmp_path / "db.json", tmp_path / "tools.json", tmp_path / "tasks.jsonl"
    db.write_text(json.dumps(_db()))
    tools.write_text(json.dumps(_tools()))
    tasks.write_text("\n".join(json.dumps(t) for t in TASKS[:2] + TASKS[4:]) + "\n")
    shots = tmp_path / "shots.jsonl"
    shots.write_text("\n".join(json.dumps(t) for t in TASKS[2:4]) + "\n")
    done = run_flywheel(
        "eval", "--episodes", str(tasks), "--db", str(db), "--tools", str(tools), "--base-model", "tiny-llama",
        "--shot-tasks", str(shots), "--name", "tiny", "--json", "--keep-successes",
        env={"FLYWHEEL_ROOT": str(flywheel_root), "FLYWHEEL_EPISODES__K": "2"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["tasks"] == 3 and report["scored"] == 2 and len(report["skipped"]) == 1
    assert set(report["conditions"]) == {"base_zero_shot", "base_few_shot"}
    row = report["conditions"]["base_zero_shot"]
    assert row["tasks"] == 2 and row["closed_loop_pass^2"] is not None and row["teacher_forced_step_exact"] is not None
    steps = report["teacher_forced"]["base_zero_shot"][0]["steps"]
    assert all(0.0 <= s["gold_probability"] <= 1.0 for s in steps)
    html = Path(report["html_uri"].removeprefix("file://")).read_text()
    assert "Episodes: tiny" in html and "left the gold path" in html and "<img" in html
    # rejection sampling ran over every condition (no adapter ran); what a kept file holds: the test below
    kept = report["kept"]
    assert kept["conditions"] == ["base_zero_shot", "base_few_shot"] and kept["label_source"] == "verified"
    overlap = run_flywheel("eval", "--episodes", str(tasks), "--db", str(db), "--tools", str(tools),
                           "--base-model", "tiny-llama", "--shot-tasks", str(tasks),
                           env={"FLYWHEEL_ROOT": str(flywheel_root)})  # fmt: skip
    assert overlap.returncode != 0 and "error:" in overlap.stderr and "also evaluated" in overlap.stderr
    missing = run_flywheel("eval", "--episodes", str(tasks), "--tools", str(tools),
                           env={"FLYWHEEL_ROOT": str(flywheel_root)})  # fmt: skip
    assert missing.returncode != 0 and "error:" in missing.stderr and "--db" in missing.stderr
    assert "Traceback" not in missing.stderr
    files = ("--episodes", str(tasks), "--db", str(db), "--tools", str(tools), "--base-model", "tiny-llama")
    for via, said in (("triton", "error: episodes through Triton: the server does not answer"),
                      ("elsewhere", "error: --via: process, or triton with --episodes")):  # fmt: skip
        nobody = {"FLYWHEEL_TRITON__HTTP_PORT": str(free_port()), "FLYWHEEL_TRITON__GRPC_PORT": str(free_port())}
        refused = run_flywheel("eval", *files, "--via", via, env={"FLYWHEEL_ROOT": str(flywheel_root), **nobody})
        assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith(said), refused.stderr


# -- training from episodes ---------------------------------------------------------------------------------------
def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    db, tools, tasks = tmp_path / "db.json", tmp_path / "tools.json", tmp_path / "tasks.jsonl"
    db.write_text(json.dumps(_db()))
    tools.write_text(json.dumps(_tools()))
    tasks.write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    return db, tools, tasks


def _sessions(file: Path) -> dict[str, list[dict[str, Any]]]:
    """raw records -> session id -> [the step's call, the result of every earlier call]."""
    out: dict[str, list[dict[str, Any]]] = {}
    for line in file.read_text().splitlines():
        r = json.loads(line)
        call = r["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
        results = [m["content"] for m in r["request"]["messages"] if m["role"] == "tool"]
        step = {"call": {"name": call["name"], "arguments": json.loads(call["arguments"])}, "results": results}
        out.setdefault(r["session_id"], []).append({**step, "label_source": r["label_source"], "model": r["model"]})
    return out


def test_the_importer_trains_on_the_gold_replay_the_episodes_judge_against(
    tmp_path: Path, env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    """Training from episodes: each task's imported session is its gold replay, step for step, every result the
    environment's answer as an episode shows it; a task whose gold the database refuses is skipped with its
    reason, never trained on."""
    from datetime import date

    from pipelines.simulate.importers import retail_to_raw

    db, tools, tasks = _files(tmp_path)
    result = retail_to_raw(tools, tasks, tmp_path / "raw", date(2026, 10, 2), db_file=db)
    assert result["tasks_skipped"] == 1 and "non-pending order cannot be cancelled" in result["skipped"][0]["reason"]
    sessions = list(_sessions(Path(result["file"])).values())
    scored, _ = golds
    assert len(sessions) == len(scored)
    for steps, gold in zip(sessions, scored):
        assert [s["call"] for s in steps] == [c for c, _, _ in gold.path]
        assert steps[-1]["results"] == [step.observation for _, step, _ in gold.path[:-1]]
        assert {s["label_source"] for s in steps} == {"import"}


def test_successful_episodes_become_verified_training_data_that_the_label_policy_holds_by_default(
    tmp_path: Path, env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    """Rejection sampling: a successful episode is written once per distinct trajectory (greedy and four tries
    walking the same path: one session), a failed one never; `verified` trains only when the policy names it."""
    from datetime import date

    from pipelines.evaluate.episode_data import verified_to_raw
    from pipelines.prep.labels import TRAINED_BY_DEFAULT, held_reason

    scored, _ = golds
    wrong = {"name": "cancel_pending_order", "arguments": {"order_id": "#W3", "reason": "no longer needed"}}
    script = _gold_script(scored)
    script.script[scored[0].task.instruction] = [wrong]  # task 0 fails in every try
    refused = {"name": "get_order_details", "arguments": {"order_id": "#W99"}}  # task 1 passes after a refused call
    script.script[scored[1].task.instruction] = [refused, *[c for c, _, _ in scored[1].path]]
    episodes = _run(env, scored, script, [-1, 0, 1, 2, 3])
    assert sum(e.success for e in episodes) == 15
    for failed in (e for e in episodes if not e.success):  # its conversation kept too: still never written
        failed.talk = [{"role": "user", "content": failed.task_id}, {"tool_calls": [wrong]}, {"content": "x"}]
    raw = tmp_path / "raw"
    kept = verified_to_raw({"tuned_x": episodes}, _tools(), env.effects(), (str(raw), "retail"), date(2026, 10, 2), "t")
    assert (kept["episodes_succeeded"], kept["trajectories"]) == (15, 2)  # no refused call ever a target
    sessions = list(_sessions(Path(kept["file"])).values())
    assert [[s["call"] for s in steps] for steps in sessions] == [[c for c, _, _ in g.path] for g in scored[2:]]
    assert {s["label_source"] for steps in sessions for s in steps} == {"verified"}
    assert {s["model"] for steps in sessions for s in steps} == {"flywheel:tuned_x"}  # the condition that wrote it
    assert (raw / "_toolsets" / "retail.json").is_file()
    # through the runner: only tasks whose gold changes the state (a no-change task passes whatever is read)
    from types import SimpleNamespace

    from pipelines.evaluate.episode_data import keep_successes

    run = SimpleNamespace(keep_successes=str(tmp_path / "raw2"), day="2026-10-02", name="t")
    ran = keep_successes(run, {"tuned_x": episodes, "base_zero_shot": []}, _tools(), env, scored)
    assert (ran["conditions"], ran["trajectories"], ran["models"]) == (["tuned_x"], 1, ["flywheel:tuned_x"])
    assert (
        held_reason("verified", "none", TRAINED_BY_DEFAULT)
        == "label source verified does not train (quality.train_label_sources)"
    )
    assert held_reason("verified", "none", (*TRAINED_BY_DEFAULT, "verified")) is None


def test_an_import_whose_every_gold_is_refused_is_one_error_line(tmp_path: Path) -> None:
    from helpers import run_flywheel

    db, tools, tasks = _files(tmp_path)
    tasks.write_text(json.dumps(TASKS[4]) + "\n")  # cancel a delivered order: the database refuses it
    done = run_flywheel("logs", "import-retail", str(tools), str(tasks), "--date", "2026-10-02", "--db", str(db),
                        "--out", str(tmp_path / "raw"), env={"FLYWHEEL_ROOT": str(tmp_path / "fw")})  # fmt: skip
    assert done.returncode != 0 and "error:" in done.stderr and "refuses every task" in done.stderr
    assert "Traceback" not in done.stderr
    left = [p for p in (tmp_path / "raw").rglob("*") if p.is_file()] if (tmp_path / "raw").exists() else []
    assert left == []  # refused before anything is written: no empty file, no toolset registered


def test_the_base_is_loaded_once_for_zero_shot_and_few_shot_and_an_adapter_loads_its_own() -> None:
    """Mutation tried: `hand_over` only releasing (each base condition loading the base again): it fails."""
    from pipelines.evaluate.episode_run import ModelPolicy, hand_over

    loads: list[str] = []

    def loader(name: str) -> Any:
        return lambda: loads.append(name) or (name, "tokenizer")

    base = loader("base")
    zero, few = ModelPolicy("base_zero_shot", base, "[]", "d"), ModelPolicy("base_few_shot", base, "[]", "d")
    tuned = ModelPolicy("tuned_x", loader("adapter"), "[]", "d")
    for n, policy in enumerate((zero, few, tuned)):
        assert policy.model in ("base", "adapter")
        hand_over(policy, (zero, few, tuned, None)[n + 1])
    assert loads == ["base", "adapter"] and zero._loaded is few._loaded is tuned._loaded is None


def test_a_failure_to_write_the_kept_episodes_is_recorded_not_raised(
    tmp_path: Path, env: RetailEnvironment, golds: tuple[list[Any], list[dict[str, str]]]
) -> None:
    from types import SimpleNamespace

    from pipelines.evaluate.episode_data import keep_successes

    scored, _ = golds
    episodes = _run(env, scored, _gold_script(scored))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    run = SimpleNamespace(keep_successes=str(blocked), day="2026-10-02", name="t")
    kept = keep_successes(run, {"tuned_x": episodes}, _tools(), env, scored)
    assert kept["conditions"] == ["tuned_x"] and "were not written" in kept["error"]


def test_successes_are_never_kept_from_the_gates_own_tasks(tmp_path: Path) -> None:
    """run_episodes refuses to keep successes of tasks sharing an instruction with `episodes.tasks`, before any
    policy runs (mutation: the check only in the CLI, or the overlap test inverted)."""
    from pipelines.config import load_settings
    from pipelines.errors import DataProblem
    from pipelines.evaluate.episode_run import EpisodeRun, run_episodes

    db, tools, tasks = _files(tmp_path)
    gate = tmp_path / "gate.jsonl"
    gate.write_text(json.dumps(TASKS[1]) + "\n")
    settings = load_settings(root=str(tmp_path / "root"), episodes={"tasks": str(gate), "tools": str(tools)})
    run = EpisodeRun(tasks, db, tools, "kept", keep_successes=str(tmp_path / "raw"))
    with pytest.raises(DataProblem, match="1 of these tasks share instructions with the gate's"):
        run_episodes(settings, run, [])
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(TASKS[0]) + "\n")
    from pipelines.evaluate.episode_data import refuse_gate_tasks
    from pipelines.evaluate.episodes import load_tasks

    refuse_gate_tasks(settings, load_tasks(other)[0])  # no shared instruction: nothing refused
    # a gate task file that cannot be read, or holds no task with an instruction, refuses too (fails closed;
    # mutations: return when it is missing; no check of an empty gate set; a blank instruction counted)
    (tmp_path / "junk.jsonl").write_text("not a task\n")
    (tmp_path / "blank.jsonl").write_text(json.dumps({**TASKS[1], "instruction": ""}) + "\n")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00task")
    (tmp_path / "folder.jsonl").mkdir()
    for name, why in [("gone.jsonl", "cannot be read"), ("folder.jsonl", "cannot be read"),
                      ("binary.jsonl", "cannot be read"), ("junk.jsonl", "hold no task"),
                      ("blank.jsonl", "hold no task")]:  # fmt: skip
        unreadable = load_settings(root=str(tmp_path / "root"), episodes={"tasks": str(tmp_path / name)})
        with pytest.raises(DataProblem, match=why):
            refuse_gate_tasks(unreadable, load_tasks(other)[0])


def test_a_condition_whose_model_fails_stops_and_the_report_keeps_what_finished(tmp_path: Path) -> None:
    """A served model's error (`PolicyFailed`) stops its condition only: its greedy episodes, the other conditions
    and the report are kept, and the report says why (mutation tried: the `except PolicyFailed` removed, and the
    run raises with no report)."""
    from pipelines.config import load_settings
    from pipelines.evaluate.episode_run import EpisodeRun, run_episodes
    from pipelines.evaluate.episodes import PolicyFailed

    class Served(Scripted):
        samples, served, load, _loaded = False, "a stand-in served model", None, None

        def __init__(self, label: str, script: dict[str, list[dict[str, Any] | None]], fails: bool) -> None:
            super().__init__(script)
            self.label, self.fails = label, fails

        def release(self) -> None:
            pass

        def gold_logprobs(self, talks: list[list[dict[str, Any]]], targets: list[dict[str, Any]]) -> list[float]:
            if self.fails:
                raise PolicyFailed("tool_router_v9 answered with an error: deadline exceeded")
            return super().gold_logprobs(talks, targets)

    db, tools, tasks = _files(tmp_path)
    env = RetailEnvironment(_db())
    tasks_file = tmp_path / "some.jsonl"
    tasks_file.write_text("\n".join(json.dumps(t) for t in TASKS[:2]) + "\n")
    golds, _ = prepare(env, load_tasks(tasks_file)[0], OFFERED)
    script = _gold_script(golds).script
    settings = load_settings(root=str(tmp_path / "root"))
    policies = [Served("tuned_a", script, fails=True), Served("tuned_b", script, fails=False)]
    report = run_episodes(settings, EpisodeRun(tasks_file, db, tools, "failing"), policies)
    assert report["failed"] == {"tuned_a": "tool_router_v9 answered with an error: deadline exceeded"}
    a, b = report["conditions"]["tuned_a"], report["conditions"]["tuned_b"]
    assert a["closed_loop_pass^1"] == 1.0 and a["teacher_forced_step_exact"] is None and a["error"]  # greedy kept
    assert b["error"] is None and b["teacher_forced_step_exact"] == 1.0
    assert Path(report["html_uri"].removeprefix("file://")).is_file()
