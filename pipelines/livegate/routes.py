"""Traffic modes per gateway route, and the gate that moves a route between them.

A route is the model name an agent calls (`champion` by default). Its mode:
- `serve`: the route's own alias answers (the default for every name).
- `shadow`: the teacher (an OpenAI-compatible upstream in `gateway.teacher_url`, or locally the
  gateway's own `base` route) answers the caller; the route's candidate answers a copy off the
  request path; their agreement is recorded per request.
- `canary`: `share` of the requests go to the candidate, the rest to the route's alias; the
  candidate's answers are compared off the path with the teacher's.

State: `<serving zone>/routes.json`, every change written atomically under a lock and recorded in its
history. The gate (`decide`) is a sequential test: after at least `gateway.gate_requests` compared
requests it moves `shadow` -> `canary` as soon as the agreement's always-valid interval (it holds however
often the gate looks) lies above `gateway.min_agreement`, and a failing `canary` (the interval below it,
or errors above `gateway.canary_max_error_share`) back to `serve` by itself; `canary` -> `serve` with
the candidate deployed as champion is `flywheel gateway gate` (a deployment: smoke test, rollback).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pipelines.config import Settings
from pipelines.errors import NotRetryable
from pipelines.locks import shared_lock
from pipelines.storage import Busy, read_json, write_json

Mode = Literal["serve", "shadow", "canary"]
MODES: tuple[str, ...] = ("serve", "shadow", "canary")
METRICS = ("name", "exact", "arg_f1")


class RouteError(NotRetryable):
    """A route change that cannot be made (unknown mode, bad share, the state file locked or corrupt)."""


def routes_uri(settings: Settings) -> str:
    return f"{settings.zone('serving')}/routes.json"


def read_routes(settings: Settings) -> dict[str, Any]:
    try:
        data = read_json(routes_uri(settings))
    except FileNotFoundError:
        return {"routes": {}, "history": []}
    except ValueError as exc:
        raise RouteError(
            f"{routes_uri(settings)} is not valid JSON ({exc}): fix or delete it (every route then serves)"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("routes"), dict):
        raise RouteError(f"{routes_uri(settings)} is not a routes file ({{routes: {{...}}, history: [...]}})")
    return data


def route_of(routes: dict[str, Any], model: str) -> dict[str, Any]:
    return routes["routes"].get(model) or {"mode": "serve"}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def set_route(
    settings: Settings,
    model: str,
    mode: str,
    *,
    share: float | None = None,
    candidate: str = "candidate",
    reason: str = "set by hand",
    expect: str | None = None,
) -> dict[str, Any]:
    """Put route `model` in `mode` (recorded with `reason`); `expect`: change only if the route is still in
    that mode (the gate's moves never undo a change made meanwhile). Returns the route."""
    if mode not in MODES:
        raise RouteError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if mode == "canary":
        share = settings.gateway.canary_share if share is None else share
        if not 0 < share < 1:
            raise RouteError(f"--share: a canary sends a share of traffic strictly between 0 and 1, got {share}")
    if mode != "serve" and candidate == model:
        raise RouteError(f"route {model}: the candidate must be another alias than the route itself")
    if mode != "serve" and not settings.gateway.teacher_url and not settings.gateway.base_as_teacher:
        raise RouteError(
            f"route {model}: {mode} compares the candidate with a teacher, and none is configured: set "
            "gateway.teacher_url (the large model the agent used), or gateway.base_as_teacher for a "
            "plumbing test"
        )
    try:
        with shared_lock(routes_uri(settings), 30, "the gateway routes", settings.state_lock_uri):
            data = read_routes(settings)
            current = route_of(data, model)
            if expect is not None and current.get("mode") != expect:
                return current
            route = {
                "mode": mode,
                "since": _now(),
                **({"candidate": candidate} if mode != "serve" else {}),
                **({"share": share} if mode == "canary" else {}),
            }
            data["routes"][model] = route
            data["history"] = [
                *data.get("history", []),
                {"at": route["since"], "route": model, "from": current.get("mode"), "to": mode, "reason": reason},
            ][-200:]
            write_json(routes_uri(settings), data)
            return route
    except Busy:
        raise RouteError(f"{routes_uri(settings)} stayed locked for 30 s by another route change") from None


# ---- agreement ---------------------------------------------------------------------------------
def call_of(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI assistant message as our call ({"name", "arguments"}; {"name": None}: no tool)."""
    calls = message.get("tool_calls") or []
    if not calls:
        return {"name": None}
    function = calls[0]["function"]
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError:
        arguments = {"<unparsed>": function.get("arguments")}
    return {"name": function["name"], "arguments": arguments if isinstance(arguments, dict) else {}}


def agreement(
    reference: dict[str, Any], answer: dict[str, Any], effects: dict[str, str] | None = None
) -> dict[str, Any]:
    """How far an answer agrees with the reference call: the evaluation's own scoring, the reference
    taken as the expected call; `wrong_write`: the answer is a write the reference did not make (its kind)."""
    from pipelines.toolcall.score import score

    s = score(json.dumps(answer), reference, effects)
    return {"name": s.name_match, "exact": s.exact_match, "arg_f1": s.arg_f1, "wrong_write": s.wrong_write}


@dataclass
class Tally:
    """A route's comparisons since it entered its mode."""

    since: str
    compared: int = 0
    candidate_requests: int = 0
    candidate_errors: int = 0
    name: int = 0
    exact: int = 0
    arg_f1_sum: float = 0.0
    arg_f1_n: int = 0
    wrong_writes: int = 0  # compared answers that wrote what the reference did not (the offline gate's veto)

    def add(self, agreed: dict[str, Any] | None, error: bool) -> None:
        self.candidate_requests += 1
        self.candidate_errors += int(error)
        if agreed is not None:
            self.compared += 1
            self.wrong_writes += int(bool(agreed.get("wrong_write")))
            self.name += int(agreed["name"])
            self.exact += int(agreed["exact"])
            if agreed["arg_f1"] is not None:
                self.arg_f1_sum += agreed["arg_f1"]
                self.arg_f1_n += 1

    def rate(self, metric: str) -> float | None:
        if metric == "arg_f1":
            return self.arg_f1_sum / self.arg_f1_n if self.arg_f1_n else None
        return getattr(self, metric) / self.compared if self.compared else None

    def interval(self, metric: str, level: float) -> tuple[float, float]:
        """The agreement's always-valid interval (`evaluate.paired.always_valid`): it holds however often the
        gate looks, so the gate may decide after any request and never on a handful."""
        from pipelines.stats import always_valid

        if metric == "arg_f1":
            return always_valid(self.arg_f1_sum, self.arg_f1_n, level, binary=False)
        return always_valid(getattr(self, metric), self.compared, level)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            **{f"agreement_{m}": self.rate(m) for m in METRICS},
            **{f"agreement_{m}_interval": [round(v, 4) for v in self.interval(m, 0.95)] for m in METRICS},
        }


def _stated(tally: Tally, metric: str, level: float) -> str:
    low, high = tally.interval(metric, level)
    n = tally.arg_f1_n if metric == "arg_f1" else tally.compared
    return f"agreement ({metric}) {tally.rate(metric):.3f}, always-valid {level:.0%} CI [{low:.3f}, {high:.3f}], n={n}"


def decide(settings: Settings, route: dict[str, Any], tally: Tally) -> tuple[str, str] | None:
    """The gate's move for a route, if any: (new mode, reason)."""
    g = settings.gateway
    rate = tally.rate(g.agreement_metric)
    level = settings.promotion.confidence
    low, high = tally.interval(g.agreement_metric, level)
    allowed = settings.promotion.max_extra_wrong_writes
    if route["mode"] in ("shadow", "canary") and tally.wrong_writes > allowed:  # the same veto as the offline gate
        back = (
            "shadow ended, the champion serves alone" if route["mode"] == "shadow" else "traffic back to the champion"
        )
        return "serve", (
            f"refused: wrong writes {tally.wrong_writes} of {tally.compared} compared requests vs the "
            f"reference's calls (at most {allowed}); {back}"
        )
    if route["mode"] == "shadow" and tally.compared >= g.gate_requests and rate is not None and low >= g.min_agreement:
        return "canary", f"shadow passed: {_stated(tally, g.agreement_metric, level)} >= {g.min_agreement}"
    if route["mode"] == "canary" and tally.candidate_requests >= g.gate_requests:
        errors = tally.candidate_errors / tally.candidate_requests
        if errors > g.canary_max_error_share:
            return "serve", (
                f"canary failed: {errors:.1%} of the candidate's {tally.candidate_requests} requests "
                f"errored (max {g.canary_max_error_share:.1%}); traffic back to the champion"
            )
        if tally.compared >= g.gate_requests and rate is not None and high < g.min_agreement:
            return "serve", (
                f"canary failed: {_stated(tally, g.agreement_metric, level)} < {g.min_agreement}; "
                f"traffic back to the champion"
            )
    return None


def canary_ready(settings: Settings, route: dict[str, Any], tally: Tally) -> tuple[bool, str]:
    """Whether a canary may become `serve` with its candidate as champion (`flywheel gateway gate`)."""
    g = settings.gateway
    if route["mode"] != "canary":
        return False, f"the route is in {route['mode']}, not canary"
    if tally.candidate_requests < g.gate_requests:
        return (
            False,
            f"the candidate answered {tally.candidate_requests} of the {g.gate_requests} requests the gate needs",
        )
    failed = decide(settings, route, tally)
    if failed:
        return False, failed[1]
    rate = tally.rate(g.agreement_metric)
    if tally.compared < g.gate_requests or rate is None:
        return False, (
            f"only {tally.compared} of the candidate's requests were compared with the teacher "
            f"({g.gate_requests} needed): no evidence of agreement yet"
        )
    level = settings.promotion.confidence
    stated = _stated(tally, g.agreement_metric, level)
    if tally.interval(g.agreement_metric, level)[0] < g.min_agreement:
        return False, f"undecided: {stated} spans {g.min_agreement}: keep the canary running"
    return True, f"canary passed: {tally.candidate_requests} requests, {tally.candidate_errors} errors, {stated}"
