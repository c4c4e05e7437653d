"""The teacher relabels our model's down-rated answers (issue 51, item 1: `flywheel labels relabel`), and the
teacher's client. The whole path (the gateway's capture, prep, the `relabel` pair, the CLI with a real teacher
endpoint) runs in tests/test_gateway.py::test_the_loop_trains_on_the_teacher_and_on_people_never_on_the_champion_alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from ports import free_port
from teacher_stub import MODEL as TEACHER_MODEL
from teacher_stub import Teacher

from pipelines.clients.teacher import TeacherAnswer, TeacherClient, TeacherError

DAY = "2026-11-20"
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("get_order",)]
ORDER = {"name": "get_order", "arguments": {"order_id": "ORD-123456"}}
OTHER = {"name": "get_order", "arguments": {"order_id": "ORD-999999"}}


class ScriptedTeacher:
    """A stand-in for the teacher's client (the real one, `TeacherClient`, runs against an HTTP endpoint below and
    in the gateway test named above): it answers each request's last user message with the call it is given, or
    with text when given None, and keeps what it was asked."""

    model = TEACHER_MODEL

    def __init__(self, answers: dict[str, dict[str, Any] | int | str | None]) -> None:
        self.answers, self.asked = answers, []

    def complete(self, messages: list[dict[str, Any]], tools: Any, tool_choice: Any = None) -> TeacherAnswer:
        text = messages[-1]["content"]
        self.asked.append(text)
        call = self.answers[text]
        if call == "down":  # no connection
            raise TeacherError("the teacher did not answer (ConnectError)", 503, "teacher_unavailable", None, False)
        if isinstance(call, int):  # the teacher answers this request with that HTTP status
            raise TeacherError(f"the teacher answered HTTP {call}", 502, "teacher_error", call)
        message: dict[str, Any] = {"role": "assistant", "content": "I cannot help with that"}
        if call is not None:
            function = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
            message = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": function}]}
        return TeacherAnswer(message, "tool_calls" if call else "stop", 10, 5, TEACHER_MODEL)


def _queue(settings: Any, turns: list[tuple[str, str, dict[str, Any], str]]) -> None:
    """Down-rated turns (record id, request, answer, label source) in the raw zone and in prep's clean logs."""
    from pipelines.prep.pipeline import zone_paths

    raw = Path(settings.zone("raw")) / f"dt={DAY}"
    raw.mkdir(parents=True)
    clean = Path(zone_paths(settings)["clean_logs"]) / f"dt={DAY}"
    clean.mkdir(parents=True)
    records, rows = [], []
    for n, (record_id, request, answer, source) in enumerate(turns):
        call = {"name": answer["name"], "arguments": json.dumps(answer["arguments"])}
        message = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": call}]}
        records.append(
            {
                "record_id": record_id,
                "label_source": source,
                "request": {"messages": [{"role": "user", "content": request}], "tools": TOOLS},
                "response": {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]},
            }
        )
        rows.append(
            {
                "record_id": record_id,
                "held": "rated down: waits for review",
                "event_timestamp": pd.Timestamp(f"{DAY}T10:00:0{n}Z"),
                "request_text": request,
                "tool": answer["name"],
                "arguments_json": json.dumps(answer["arguments"]),
                "label_source": source,
            }
        )
    (raw / "agent.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pd.DataFrame(rows).to_parquet(clean / "part-0.parquet")


def test_the_teacher_relabels_only_our_models_answers_and_leaves_the_doubtful_to_a_person(tmp_path: Path) -> None:
    """Mutations tried: the label-source filter removed (the teacher's own down-rated answer is asked); the
    same-answer check removed (the down-rated answer would train as the teacher's); the accepted label written
    as `human`; the markers not read (the same turns asked on every run): each fails here."""
    from pipelines.config import load_settings
    from pipelines.prep.reviews import queue, relabel

    settings = load_settings(root=str(tmp_path))
    _queue(
        settings,
        [
            ("q1", "where is my order ORD-123456?", {"name": "get_order", "arguments": {"order_id": "ORD-000001"}},
             "champion"),
            ("q2", "order ORD-999999 please", OTHER, "champion"),  # the teacher agrees with what was rated down
            ("q3", "hello", ORDER, "champion"),  # the teacher answers with text
            ("q4", "order x", ORDER, "champion"),  # the teacher's call breaks the schema
            ("q5", "teacher's own", ORDER, "teacher"),  # not our model's answer: a person decides
            ("q6", "a very long one", ORDER, "champion"),  # the teacher refuses this request (HTTP 400)
            ("q7", "when it is down", ORDER, "champion"),  # the teacher fails (HTTP 503): the run stops
            ("q8", "served in a canary", ORDER, "champion"),  # the teacher's canary copy of it is a label already
        ],
    )  # fmt: skip
    from pipelines.prep.pipeline import zone_paths

    copy = {
        "record_id": "q8-teacher",
        "held": None,
        "event_timestamp": pd.Timestamp(f"{DAY}T10:00:09Z"),
        "request_text": "served in a canary",
        "tool": "get_order",
        "arguments_json": "{}",
        "label_source": "teacher",
    }
    pd.DataFrame([copy]).to_parquet(Path(zone_paths(settings)["clean_logs"], f"dt={DAY}", "part-1.parquet"))
    teacher = ScriptedTeacher(
        {
            "where is my order ORD-123456?": ORDER,
            "order ORD-999999 please": OTHER,
            "hello": None,
            "order x": {"name": "get_order", "arguments": {"order_id": "x"}},
            "a very long one": 400,
            "when it is down": 503,
        }
    )
    result = relabel(settings, teacher, limit=2)  # the oldest two of ours
    assert (result["asked"], result["relabelled"]) == (2, 1) and len(teacher.asked) == 2
    with pytest.raises(TeacherError, match="HTTP 503"):  # not this request's fault: the run stops at once
        relabel(settings, teacher, limit=10)
    assert "teacher's own" not in teacher.asked
    assert teacher.asked[2:] == ["hello", "order x", "a very long one", "when it is down"]
    teacher.answers["when it is down"] = None
    result = relabel(settings, teacher, limit=10)  # what the teacher could not relabel is not asked again
    assert teacher.asked[6:] == ["when it is down"]
    assert (result["asked"], result["relabelled"]) == (2, 0)
    assert result["left_for_a_person"] == {
        "the teacher answered it already (a canary's teacher copy)": 1,  # and was not asked
        "the teacher made no call": 1,
    }
    assert relabel(settings, teacher, limit=10)["asked"] == 0
    tried = [json.loads(p.read_text())["reason"] for p in Path(settings.zone("raw"), "_reviews", "_relabel").glob("*")]
    assert sorted(tried) == [
        "the teacher answered it already (a canary's teacher copy)",
        "the teacher gave the answer that was rated down",
        "the teacher made no call",
        "the teacher made no call",
        "the teacher refused the request (HTTP 400)",
        "the teacher's call breaks its tool's schema",
    ]
    assert {r["record_id"] for r in queue(settings)} == {"q2", "q3", "q4", "q5", "q6", "q7", "q8"}  # q1 decided
    written = [json.loads(line) for f in Path(settings.zone("raw")).rglob("reviews-*.jsonl") for line in f.open()]
    assert len(written) == 1 and written[0]["record_id"] == "q1-review" and written[0]["label_source"] == "teacher"
    call = written[0]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == (ORDER["name"], ORDER["arguments"])
    decision = json.loads(next(Path(settings.zone("raw"), "_reviews").glob("*.json")).read_text())
    assert decision["reviewer"] == f"teacher:{TEACHER_MODEL}" and decision["accepted"]


def test_the_teachers_client_names_each_failure_in_one_line_without_its_key() -> None:
    """Mutation tried: the status check removed (a 401 body read as a completion): the second block fails."""
    with Teacher(ORDER) as teacher:
        answer = TeacherClient(teacher.url, "big", teacher.key, 30).complete([{"role": "user", "content": "hi"}], TOOLS)
        assert answer.message["tool_calls"][0]["function"]["name"] == "get_order"
        assert teacher.received[-1]["model"] == "big" and set(teacher.received[-1]) == {
            "model",
            "messages",
            "tools",
            "stream",
        }
        with pytest.raises(TeacherError) as refused:
            TeacherClient(teacher.url, "big", "wrong", 30).complete([{"role": "user", "content": "hi"}], TOOLS)
        assert refused.value.status == 502 and "HTTP 401" in str(refused.value)
    with pytest.raises(TeacherError) as down:
        TeacherClient(f"http://user:secret@127.0.0.1:{free_port()}/v1", "big", None, 5).complete([], None)
    assert down.value.status == 503 and down.value.code == "teacher_unavailable" and "secret" not in str(down.value)


def test_relabelling_is_refused_where_teacher_labels_do_not_train(tmp_path: Path) -> None:
    """A relabel would take the turn from a person's queue and train nothing: one line, nothing asked."""
    from pipelines.config import load_settings
    from pipelines.prep.reviews import ReviewError, queue, relabel

    settings = load_settings(root=str(tmp_path), quality={"train_label_sources": ["human", "import"]})
    _queue(settings, [("q1", "where is ORD-123456?", OTHER, "champion")])
    teacher = ScriptedTeacher({"where is ORD-123456?": ORDER})
    with pytest.raises(ReviewError, match="teacher labels do not train"):
        relabel(settings, teacher, limit=10)
    assert teacher.asked == [] and [r["record_id"] for r in queue(settings)] == ["q1"]


def test_a_teacher_that_refuses_everything_marks_nothing_and_a_turn_it_keeps_failing_goes_to_a_person(
    tmp_path: Path,
) -> None:
    """Refusals from the start of a run with no answer are the teacher's fault: the run stops, nothing is marked
    (mutation tried: refusals marked at once, and the turns are never asked again); a turn the teacher fails on
    `MAX_FAILURES` times is left for a person, so one bad turn cannot block every run (mutation tried: failures
    not counted)."""
    from pipelines.config import load_settings
    from pipelines.prep.reviews import MAX_FAILURES, relabel

    settings = load_settings(root=str(tmp_path))
    asks = [f"order ORD-00000{n} please" for n in range(4)]
    _queue(settings, [(f"q{n}", a, OTHER, "champion") for n, a in enumerate(asks)])
    teacher = ScriptedTeacher(dict.fromkeys(asks, 400))
    with pytest.raises(TeacherError, match="refused the first 3 requests and answered none"):
        relabel(settings, teacher, limit=10)
    assert not list(Path(settings.zone("raw"), "_reviews").rglob("*.json"))  # nothing marked, nothing decided
    teacher.answers[asks[0]] = "down"
    for _ in range(MAX_FAILURES):  # a teacher that is down counts against no turn (mutation: counted: fails)
        with pytest.raises(TeacherError, match="did not answer"):
            relabel(settings, teacher, limit=10)
    assert not list(Path(settings.zone("raw"), "_reviews").rglob("*.json"))
    teacher.answers.update({asks[0]: 503, asks[1]: ORDER, asks[2]: ORDER, asks[3]: ORDER})
    for _ in range(MAX_FAILURES):  # q0 fails every run, the runs stop there
        with pytest.raises(TeacherError, match="HTTP 503"):
            relabel(settings, teacher, limit=10)
    result = relabel(settings, teacher, limit=10)  # q0 is now a person's; the rest are reached
    assert result["relabelled"] == 3 and "q0" not in {d["record_id"] for d in result["decisions"]}
    marker = json.loads(next(Path(settings.zone("raw"), "_reviews", "_relabel").glob("*.json")).read_text())
    assert marker["record_id"] == "q0" and marker["reason"] == f"the teacher failed on it {MAX_FAILURES} times"
