"""What the gateway does with one request: answer it by its route's mode (`routes.py`), capture the turn,
and compare a candidate with the teacher off the request path.

`serve`: the asked alias answers. `shadow`: the teacher answers the caller (its answer is the captured
label); the candidate answers a copy in a background worker, and the agreement is recorded. `canary`:
the route's share goes to the candidate (the rest to the asked alias); the teacher answers a copy of the
candidate's requests off the path. Comparisons go to `<serving zone>/gateway/agreement/dt=<day>/`
(appended durably, as captures are); the live gate (`routes.decide`) runs after each one. A queue of
`gateway.shadow_queue` pending comparisons at most: beyond it a comparison is skipped and counted, never
slowing the caller.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.config import Settings
from pipelines.gateway import openai_api as api
from pipelines.gateway.capture import CaptureWriter, capture_record
from pipelines.livegate import routes as rt
from pipelines.livegate.comparisons import agreement_zone, tally_of

LOG = logging.getLogger("flywheel.gateway")
ROUTES_TTL_S = 1.0


@dataclass(frozen=True)
class Outcome:
    """One arm's side of a comparison, as `Traffic._record` writes it: the two calls (the reference's and the
    arm's answer), the arm's error, both latencies, and whether it was skipped (not counted) and why."""

    arm: str
    reference: dict[str, Any] | None = None
    answer: dict[str, Any] | None = None
    error: str | None = None
    candidate_ms: float | None = None
    reference_ms: float | None = None
    skipped: bool = False
    note: str | None = None


class Traffic:
    def __init__(self, settings: Settings, router: Any, capture: CaptureWriter | None, spool: Path):
        self.settings = settings
        self.router = router
        self.capture = capture
        g = settings.gateway
        self.comparisons = CaptureWriter(
            agreement_zone(settings), g.capture_rotate_bytes, spool / "agreement", g.capture_upload_every_s
        )
        self.unusable = CaptureWriter(
            f"{settings.zone('serving')}/gateway/unusable",
            g.capture_rotate_bytes,
            spool / "unusable",
            g.capture_upload_every_s,
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shadow")
        self._pending = threading.BoundedSemaphore(settings.gateway.shadow_queue)
        self._lock = threading.Lock()
        self._routes: tuple[float, dict[str, Any]] = (0.0, {"routes": {}})
        self._tallies: dict[tuple[str, str], rt.Tally] = {}
        self._credit: dict[tuple[str, str], float] = {}
        self._warned_teacher = 0.0
        self.defaults = {
            "country": settings.gateway.country,
            "currency": settings.gateway.currency,
            "channel": settings.gateway.channel,
        }

    # routes -----------------------------------------------------------------------------------
    def route(self, model: str) -> dict[str, Any]:
        at, data = self._routes
        if time.monotonic() - at > ROUTES_TTL_S:
            try:
                data = rt.read_routes(self.settings)
            except rt.RouteError as exc:
                LOG.warning("%s: every route serves", exc)
                data = {"routes": {}}
            self._routes = (time.monotonic(), data)
        route = rt.route_of(data, model)
        g = self.settings.gateway
        if route["mode"] != "serve" and not g.teacher_url and not g.base_as_teacher:
            # a shadow or canary set before a teacher was required: the route serves (nothing to compare with)
            if time.monotonic() - self._warned_teacher > 60:
                self._warned_teacher = time.monotonic()
                LOG.warning(
                    "route %s is in %s but no teacher is configured (gateway.teacher_url): it serves",
                    model,
                    route["mode"],
                )
            return {"mode": "serve"}
        return route

    def _tally(self, model: str, route: dict[str, Any]) -> rt.Tally:
        """The route's tally since its mode began (read from the recorded files once, outside the lock)."""
        key = (model, route.get("since", ""))
        with self._lock:
            known = self._tallies.get(key)
        if known is not None:
            return known
        loaded = tally_of(self.settings, model, route)
        with self._lock:
            return self._tallies.setdefault(key, loaded)

    def _to_candidate(self, model: str, route: dict[str, Any]) -> bool:
        """Smooth weighted split: each request adds `share` to the route's credit and a full credit sends
        one to the candidate, so over any run of requests the candidate gets the share to within one."""
        key = (model, route.get("since", ""))
        with self._lock:
            credit = self._credit.get(key, 0.0) + route["share"]
            chosen = credit >= 1.0 - 1e-9
            self._credit[key] = credit - 1.0 if chosen else credit
            return chosen

    # answering --------------------------------------------------------------------------------
    def handle(
        self,
        parsed: api.ChatCompletionRequest,
        on_text: Callable[[str], None] | None = None,
        served: api.Served | None = None,
    ) -> dict[str, Any]:
        """The caller's answer (OpenAI body); `on_text` gets the answering model's text as it grows, its
        whole text last (not called when the teacher answers: its answer comes whole); `served`: the
        request's row and ids when the caller made them already (a stream announces the id first)."""
        started = api.now_ms()
        served = served or api.request_row(parsed)
        route = self.route(parsed.model)
        if parsed.tool_choice == "none":  # the caller allows no call: no model answers, nothing to capture
            return api.completion(
                served,
                parsed.model,
                {"message": {"role": "assistant", "content": ""}, "finish_reason": "stop"},
                0,
                0,
                None,
            )
        if route["mode"] == "shadow":
            body, by = self.teacher(parsed, served)
            self._off_path(parsed, served, route, body, candidate_answers=True)
        elif route["mode"] == "canary" and self._to_candidate(parsed.model, route):
            streamed: list[str] = []

            def candidate_text(text: str) -> None:
                streamed.append(text)
                on_text(text)  # type: ignore[misc]

            try:
                body, by = self.local(route["candidate"], parsed, served, candidate_text if on_text else None)
                self._off_path(parsed, served, route, body, candidate_answers=False)
            except api.ApiError as exc:  # counted against the candidate; the champion answers (or refuses) instead
                self._record(parsed, served, route, Outcome("candidate", error=exc.message))
                if streamed:  # the caller holds part of the candidate's answer: no other model may finish it
                    raise
                body, by = self.local(parsed.model, parsed, served, on_text)
        else:
            body, by = self.local(parsed.model, parsed, served, on_text)
            if route["mode"] == "canary":
                self._record(parsed, served, route, Outcome("champion", candidate_ms=0.0, reference_ms=0.0))
        if self.capture is not None:
            record = capture_record(
                parsed, served, body, latency_ms=api.now_ms() - started, defaults=self.defaults, served_by=by
            )
            # a call or an explicit "no tool" is a label; a cut or free-text answer is kept apart, never trained on
            if api.is_label(body):
                self.capture.write(record)  # the raw zone: prep redacts it on its way to training
            else:  # kept for inspection only: redacted at rest, and expired after gateway.retention_days
                self.unusable.write(
                    {**record, "request": _redacted(record["request"]), "response": _redacted(record["response"])}
                )
        return body

    def local(
        self,
        alias: str,
        parsed: api.ChatCompletionRequest,
        served: api.Served,
        on_text: Callable[[str], None] | None = None,
    ) -> tuple[dict[str, Any], str]:
        """One of our aliases answers: (the OpenAI body, the Triton model that answered)."""
        from pipelines.serve.prompts import offered_tools
        from pipelines.toolcall.grammar import GrammarError, grammar_for

        target = self.router.resolve(alias)
        turns = self.router.turns(target, served.row)
        client = self.router.client()
        try:
            tools = offered_tools(self.settings, [served.row], client, target.name)
        except GrammarError as exc:  # e.g. a call is required, but every offered write needs an id nobody stated
            raise api.ApiError(
                400, f"constrained decoding: {exc}", param="tools", code="unsupported_tool_schema"
            ) from None
        must_call = parsed.tool_choice == "required" or isinstance(parsed.tool_choice, dict)
        if must_call and not tools:
            raise api.ApiError(
                400,
                f"tool_choice {json.dumps(parsed.tool_choice)} needs constrained decoding, which "
                f"{target.name} does not do here (triton.constrained off, or a model folder built "
                f"before the TOOLS input)",
                param="tool_choice",
            )
        if tools and must_call:
            tools = [json.dumps({"tools": json.loads(tools[0]), "abstain": False})]  # a call is required
        if tools:
            try:
                grammar_for(tools[0])  # what the model would refuse, refused here with the reason
            except GrammarError as exc:
                raise api.ApiError(
                    400, f"constrained decoding: {exc}", param="tools", code="unsupported_tool_schema"
                ) from None
        reply = client.infer_one(target.name, turns, tools[0] if tools else None, on_text=on_text)
        if reply.error is not None:
            error = api.model_error(target.name, reply.error)
            if error.status == 503 and not any(
                w in reply.error.lower() for w in ("deadline", "timed out", "timeout", "queue", "busy")
            ):
                self.router.invalidate()  # Triton restarted or the model unloaded (not a full queue): look again
            raise error
        if on_text is not None:
            on_text(reply.text or "")
        cut = reply.cut
        body = api.completion(
            served,
            parsed.model,
            api.answer(
                reply.text or "", served.specs, cut=cut, response_id=served.response_id, stated=api.stated_texts(served)
            ),
            reply.prompt_tokens,
            reply.output_tokens,
            target.name,
        )
        return body, target.name

    def teacher(self, parsed: api.ChatCompletionRequest, served: api.Served) -> tuple[dict[str, Any], str]:
        """The reference model answers: the upstream in `gateway.teacher_url`; our `base` route only with
        `gateway.base_as_teacher` (plumbing tests: the model a candidate was trained to beat is no teacher)."""
        g = self.settings.gateway
        if not g.teacher_url:
            if not g.base_as_teacher:
                raise api.ApiError(
                    503,
                    "no teacher is configured (gateway.teacher_url)",
                    kind="server_error",
                    code="teacher_unavailable",
                )
            return self.local("base", parsed, served)
        from pipelines.clients.teacher import TeacherClient, TeacherError

        try:  # only what the teacher needs (the client sends nothing else): never the customer id or metadata
            reply = TeacherClient.from_settings(self.settings).complete(
                served.messages, served.specs, parsed.tool_choice
            )
        except TeacherError as exc:
            raise api.ApiError(exc.status, str(exc), kind="server_error", code=exc.code) from None
        body = api.completion(
            served,
            parsed.model,
            {"message": reply.message, "finish_reason": reply.finish_reason},
            reply.prompt_tokens,
            reply.completion_tokens,
            reply.model,
        )
        return body, f"teacher:{reply.model}"

    # comparing --------------------------------------------------------------------------------
    def _off_path(
        self,
        parsed: api.ChatCompletionRequest,
        served: api.Served,
        route: dict[str, Any],
        body: dict[str, Any],
        *,
        candidate_answers: bool,
    ) -> None:
        """Shadow: the candidate answers a copy (the caller had the teacher's). Canary: the teacher answers
        a copy of a request the candidate served. Skipped (recorded) when the queue is full."""
        if not self._pending.acquire(blocking=False):
            full = Outcome(
                "candidate", error="skipped: comparison queue full", candidate_ms=0, reference_ms=0, skipped=True
            )
            self._record(parsed, served, route, full)
            return

        def compare() -> None:
            try:
                t0 = api.now_ms()
                try:
                    other, by = (
                        self.local(route["candidate"], parsed, served)
                        if candidate_answers
                        else self.teacher(parsed, served)
                    )
                    error = None
                except api.ApiError as exc:
                    other, by, error = None, None, exc.message
                took = api.now_ms() - t0
                if not candidate_answers and other is not None:
                    self._capture_teacher_copy(parsed, served, other, body, took, by)
                first = rt.call_of(body["choices"][0]["message"])
                second = rt.call_of(other["choices"][0]["message"]) if other else None
                reference, answer = (first, second) if candidate_answers else (second, first)
                candidate_ms, reference_ms = (took, None) if candidate_answers else (None, took)
                if not candidate_answers and error is not None:  # the teacher failed: not the candidate's error
                    outcome = Outcome(
                        "candidate",
                        answer=answer,
                        candidate_ms=candidate_ms,
                        reference_ms=reference_ms,
                        skipped=True,
                        note=f"teacher: {error}",
                    )
                    self._record(parsed, served, route, outcome)
                    return
                outcome = Outcome("candidate", reference, answer, error, candidate_ms, reference_ms)
                self._record(parsed, served, route, outcome)
            except Exception:  # noqa: BLE001 (off the request path: logged, never raised at the caller)
                LOG.exception("shadow comparison failed")
            finally:
                self._pending.release()

        self._pool.submit(compare)

    def _capture_teacher_copy(
        self,
        parsed: api.ChatCompletionRequest,
        served: api.Served,
        body: dict[str, Any],
        served_body: dict[str, Any],
        took: float,
        by: str | None,
    ) -> None:
        """A canary's teacher copy where the teacher disagreed with the candidate, captured as the teacher's own
        record (`<id>-teacher`, the served turn's session): a label prep trains on like any teacher answer, and
        the chosen side of a canary pair (`prep.pairs`). Only a label (a call or an explicit "no tool") that
        differs from what the caller got is kept: a copy of the served answer would train it even where the
        caller rated it down (ratings name the served turn). A failed write is logged, never raised: the
        comparison is recorded after it."""
        from pipelines.logs.schema import TEACHER_COPY_SUFFIX

        if self.capture is None or not api.is_label(body):
            return
        teacher, answer = rt.call_of(body["choices"][0]["message"]), rt.call_of(served_body["choices"][0]["message"])
        if rt.agreement(teacher, answer)["exact"]:  # the live gate's own comparison: the same call
            return
        record = capture_record(parsed, served, body, latency_ms=took, defaults=self.defaults, served_by=by)
        copy_id = f"{served.response_id}{TEACHER_COPY_SUFFIX}"
        try:
            self.capture.write({**record, "record_id": copy_id, "response": {**record["response"], "id": copy_id}})
        except Exception:  # noqa: BLE001 (off the request path: a closed writer at shutdown, a full disk)
            LOG.exception("the canary's teacher copy %s was not captured", copy_id)

    def _effects(self) -> dict[str, str]:
        """Tool -> read/write (catalogue and registered toolsets), re-read at most once a minute: the same
        cache grounding uses (`toolcall.grounding.registered_effects`)."""
        from pipelines.toolcall.grounding import registered_effects

        return registered_effects(self.settings.zone("raw"))

    def _record(
        self,
        parsed: api.ChatCompletionRequest,
        served: api.Served,
        route: dict[str, Any],
        outcome: Outcome,
    ) -> None:
        # live traffic vetoes on declared writes (catalogue, toolsets; `judged_effects` says how an unregistered
        # tool counts)
        from pipelines.toolcall.grounding import judged_effects

        effects = judged_effects([s["function"]["name"] for s in api.offered(parsed)], self._effects())
        reference, answer = outcome.reference, outcome.answer
        agreed = rt.agreement(reference, answer, effects) if reference is not None and answer is not None else None
        if outcome.arm == "candidate" and outcome.error is None and agreed is None and not outcome.skipped:
            agreed = {"name": False, "exact": False, "arg_f1": 0.0}
        counted = outcome.arm == "candidate" and not outcome.skipped
        tally = self._tally(parsed.model, route) if counted else None  # before the write: the files hold it after
        self.comparisons.write(
            {
                "record_id": served.response_id,
                "timestamp": datetime.now(UTC).isoformat(timespec="microseconds"),
                "route": parsed.model,
                "mode": route["mode"],
                "arm": outcome.arm,
                "candidate": route.get("candidate"),
                # the calls' values redacted at rest (agreement is computed above, on the real values)
                "reference": _redacted(reference),
                "answer": _redacted(answer),
                "agreement": agreed,
                "error": outcome.error,
                "skipped": outcome.skipped,
                "note": outcome.note,
                "candidate_latency_ms": outcome.candidate_ms,
                "reference_latency_ms": outcome.reference_ms,
            }
        )
        if tally is None:
            return
        with self._lock:
            tally.add(agreed, outcome.error is not None)
            move = rt.decide(self.settings, route, tally)
        if move is not None:
            changed = rt.set_route(
                self.settings,
                parsed.model,
                move[0],
                candidate=route["candidate"],
                share=route.get("share"),
                reason=move[1],
                expect=route["mode"],
            )
            LOG.warning("route %s: %s -> %s (%s)", parsed.model, route["mode"], changed["mode"], move[1])
            self._routes = (0.0, {"routes": {}})  # re-read at the next request

    def close(self) -> list[str]:
        """Comparisons not started are dropped and the running one is not waited for (they are off the request
        path: a teacher that hangs never holds a stop past its grace period); the stores closed."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        return self.comparisons.close() + self.unusable.close()


def _redacted(value: Any) -> Any:
    """`value` with prep's PII redaction applied to every string in it (what the gateway keeps at rest outside
    the raw zone: unusable answers and the live comparisons)."""
    if value is None:
        return None
    from collections import Counter

    from pipelines.redact import redact_value

    return redact_value(value, Counter())
