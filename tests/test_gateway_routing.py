"""The gateway's routing without servers: shadow and canary routes change atomically with their history and the
live gate decides by agreement, errors and wrong writes; the recorded tally; the routing table is rebuilt when a
deploy changes the serving state, not per request."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.gateway.capture import CaptureWriter


def test_routes_change_atomically_with_history_and_the_gate_decides_by_agreement_and_errors(tmp_path: Path) -> None:
    from pipelines.config import load_settings
    from pipelines.livegate import routes as rt

    settings = load_settings(
        root=str(tmp_path), gateway={"gate_requests": 4, "min_agreement": 0.75, "canary_max_error_share": 0.25}
    )
    with pytest.raises(rt.RouteError, match="none is configured: set gateway.teacher_url"):
        rt.set_route(settings, "champion", "shadow")  # the route a candidate was trained to beat is no teacher
    settings = load_settings(
        root=str(tmp_path),
        gateway={"gate_requests": 4, "min_agreement": 0.75, "canary_max_error_share": 0.25, "base_as_teacher": True},
    )
    assert rt.route_of(rt.read_routes(settings), "champion") == {"mode": "serve"}
    for bad, message in ((("canary",), "strictly between"), (("fast",), "mode:")):
        with pytest.raises(rt.RouteError, match=message):
            rt.set_route(settings, "champion", *bad, share=1.0)
    shadow = rt.set_route(settings, "champion", "shadow")
    yes, no = {"name": True, "exact": True, "arg_f1": 1.0}, {"name": False, "exact": False, "arg_f1": 0.0}

    def tally(*answers) -> rt.Tally:
        t = rt.Tally(shadow["since"])
        for a in answers:
            t.add(a if a != "error" else None, a == "error")
        return t

    assert rt.decide(settings, shadow, tally(yes, yes, no)) is None  # too few compared
    # a sequential test: 4 of 4 agreeing is a handful, not evidence (the always-valid interval spans 0.75) ...
    assert rt.decide(settings, shadow, tally(yes, yes, yes, yes)) is None
    # ... 60 of 60 is, and the reason states the interval and n
    moved = rt.decide(settings, shadow, tally(*[yes] * 60))
    assert moved[0] == "canary" and "always-valid 95% CI [0.8" in moved[1] and "n=60" in moved[1], moved
    assert rt.decide(settings, shadow, tally(*[no] * 60)) is None  # shadow never demotes: callers unaffected
    canary = rt.set_route(settings, "champion", "canary", share=0.3, reason="test")
    assert rt.decide(settings, canary, tally(*[yes] * 60)) is None
    assert rt.canary_ready(settings, canary, tally(*[yes] * 60))[0]
    waiting = rt.canary_ready(settings, canary, tally(yes, yes, yes, no))
    assert not waiting[0] and waiting[1].startswith("undecided"), waiting
    assert rt.decide(settings, canary, tally(yes, no, no, no)) is None, "one in four is not a failure yet either"
    failed = rt.decide(settings, canary, tally(yes, *[no] * 59))
    assert failed[0] == "serve" and "agreement" in failed[1]
    errored = rt.decide(settings, canary, tally(yes, yes, "error", "error"))
    assert errored[0] == "serve" and "errored" in errored[1]
    # the offline gate's veto, live: one write the reference did not make ends a shadow or a canary at once,
    # however well the rest agrees (and however few requests were compared)
    wrote = {"name": False, "exact": False, "arg_f1": 0.0, "wrong_write": "wrong_tool"}
    for route in (shadow, canary):
        vetoed = rt.decide(settings, route, tally(yes, wrote))
        assert vetoed[0] == "serve" and vetoed[1].startswith("refused: wrong writes 1 of 2"), vetoed
    assert not rt.canary_ready(settings, canary, tally(yes, yes, yes, yes, wrote))[0]
    lenient = load_settings(
        root=str(tmp_path), gateway={"gate_requests": 4, "min_agreement": 0.75}, promotion={"max_extra_wrong_writes": 1}
    )
    assert rt.decide(lenient, shadow, tally(yes, wrote)) is None
    assert (
        rt.agreement(
            {"name": "send_invoice", "arguments": {"invoice_id": "INV-0000001"}},
            {"name": "send_invoice", "arguments": {"invoice_id": "INV-0000002"}},
        )["wrong_write"]
        == "other_ids"
    )
    assert rt.set_route(settings, "champion", "serve", expect="shadow")["mode"] == "canary"  # moved meanwhile: kept
    history = rt.read_routes(settings)["history"]
    assert [(h["from"], h["to"]) for h in history] == [("serve", "shadow"), ("shadow", "canary")]
    (tmp_path / "serving" / "routes.json").write_text("{torn")
    with pytest.raises(rt.RouteError, match="not valid JSON"):
        rt.read_routes(settings)


def test_agreement_uses_the_evaluation_scoring() -> None:
    from pipelines.livegate.routes import agreement, call_of

    teacher = call_of({"tool_calls": [{"function": {"name": "get_order", "arguments": '{"order_id":"ORD-1"}'}}]})
    assert agreement(teacher, {"name": "get_order", "arguments": {"order_id": "ORD-1"}}) == {
        "name": True,
        "exact": True,
        "arg_f1": 1.0,
        "wrong_write": None,
    }
    assert agreement(teacher, {"name": "get_order", "arguments": {"order_id": "ORD-2"}})["exact"] is False
    assert agreement(teacher, {"name": None})["name"] is False
    assert call_of({"content": "no tool"}) == {"name": None}


def test_the_recorded_tally_skips_skipped_comparisons_and_a_canary_needs_comparisons_to_pass(tmp_path: Path) -> None:
    from pipelines.config import load_settings
    from pipelines.livegate import routes as rt
    from pipelines.livegate.comparisons import agreement_zone, tally_of

    settings = load_settings(
        root=str(tmp_path),
        gateway={"gate_requests": 3, "min_agreement": 0.5, "canary_max_error_share": 0.2, "base_as_teacher": True},
    )
    route = rt.set_route(settings, "champion", "canary", share=0.5)
    writer = CaptureWriter(agreement_zone(settings), 1 << 20)
    yes = {"name": True, "exact": True, "arg_f1": 1.0}

    def record(i: int, **fields) -> None:
        writer.write(
            {
                "record_id": f"c{i}",
                "timestamp": "2999-01-01T00:00:00+00:00",
                "route": "champion",
                "mode": "canary",
                "arm": "candidate",
                "agreement": None,
                "error": None,
                "skipped": False,
                **fields,
            }
        )

    for i in range(3):  # the teacher never answered: skipped, no evidence either way
        record(i, skipped=True, error="skipped: comparison queue full")
    record(3, arm="champion")
    writer.close()
    tally = tally_of(settings, "champion", route)
    assert (tally.candidate_requests, tally.candidate_errors, tally.compared) == (0, 0, 0)
    for _ in range(3):
        tally.add(None, False)  # answered by the candidate, never compared
    ready, why = rt.canary_ready(settings, route, tally)
    assert not ready and "compared" in why
    for _ in range(20):  # 20 of 20 agreeing: the always-valid interval lies above 0.5
        tally.add(yes, False)
    assert rt.canary_ready(settings, route, tally)[0]


def test_the_routing_table_is_rebuilt_when_a_deploy_changes_the_serving_state_not_per_request(
    tmp_path: Path, monkeypatch
) -> None:
    """Triton's loaded models and the serving state are read once, then again after a deploy rewrote the
    state (and the models' declared inputs are read afresh), after a model error, or on a timer."""
    from pipelines.config import load_settings
    from pipelines.gateway import router as routing
    from pipelines.serve import deploy
    from pipelines.storage import write_json

    settings = load_settings(root=str(tmp_path))
    v1, v2 = (f"{settings.triton.model_name}_v{n}" for n in (1, 2))

    class Triton:
        """A stand-in for Triton's client (`serve.client.TritonClient`) that counts how often the router lists
        its models. The real router on a real server runs in
        tests/test_gateway.py::test_the_openai_client_gets_tool_calls_sync_and_streamed."""

        listed, forgotten, models = 0, 0, [v1]

        def loaded(self) -> list[str]:
            Triton.listed += 1
            return list(Triton.models)

        def forget_inputs(self) -> None:
            Triton.forgotten += 1

    router = routing.Router(settings)
    router._client, router._candidate, router._styles = Triton(), (float("inf"), None), {v1: "names", v2: "names"}
    entry = {v: {"name": f"{settings.triton.model_name}_v{v}", "version": v, "prompt_style": "names"} for v in "12"}
    state_uri = f"{settings.zone('serving')}/state.json"
    write_json(state_uri, {"live": entry["1"], "previous": None, "history": []})
    assert router.targets()["champion"].version == "1"
    assert all(router.targets()["champion"].version == "1" for _ in range(50)) and Triton.listed == 1
    Triton.models = [v1, v2]
    write_json(state_uri, {"live": entry["2"], "previous": entry["1"], "history": []})  # a deploy
    found = router.targets()
    assert (found["champion"].version, found["previous"].version) == ("2", "1")
    assert Triton.listed == 2 and Triton.forgotten == 1
    router.invalidate()  # what a model error does
    router.targets()
    assert Triton.listed == 3
    monkeypatch.setattr(routing, "TARGETS_TTL_S", 0.0)  # and the timer
    router.targets()
    assert Triton.listed == 4 and deploy.state_stamp(settings) is not None
    assert router.readiness()["ready"] is True and Triton.listed == 5  # a probe looks now, never at the cache

    class Racing(Triton):
        def loaded(self) -> list[str]:
            router.invalidate()  # a model error while this rebuild runs: its table is out of date already
            return super().loaded()

    monkeypatch.setattr(routing, "TARGETS_TTL_S", 5.0)
    router._client = Racing()
    router.invalidate()
    router.targets()
    router._client = Triton()
    router.targets()
    router.targets()
    assert Triton.listed == 7  # rebuilt, rebuilt again (the invalidation during the first), then cached

    class Down(Triton):
        def loaded(self) -> list[str]:
            Triton.listed += 1
            raise ConnectionError("connection refused")

    monkeypatch.setattr(routing, "TARGETS_TTL_S", 0.0)
    monkeypatch.setattr(routing, "TARGETS_RETRY_S", 3600.0)  # no retry inside this test, however slow the machine
    router._client = Down()  # Triton went away: one try, then the last table serves until the retry
    assert router.targets()["champion"].version == "2" and Triton.listed == 8
    assert router.targets()["champion"].version == "2" and Triton.listed == 8
    assert router.readiness()["ready"] is False
    monkeypatch.setattr(routing, "TARGETS_STALE_S", 0.0)  # too old to trust while it cannot be rebuilt
    with pytest.raises(RuntimeError, match="did not answer a moment ago"):
        router.targets()
    monkeypatch.setattr(routing, "TARGETS_STALE_S", 60.0)
    write_json(state_uri, {"live": entry["1"], "previous": None, "history": []})  # a rollback while Triton is down
    with pytest.raises(RuntimeError, match="did not answer a moment ago"):
        router.targets()  # never the rolled-back champion from the old table
    fresh = routing.Router(settings)  # a gateway that never had a table fails, once per second, not per request
    fresh._client, fresh._candidate = Down(), (float("inf"), None)
    with pytest.raises(ConnectionError):
        fresh.targets()
    with pytest.raises(RuntimeError, match="did not answer a moment ago"):
        fresh.targets()
    assert Triton.listed == 10
