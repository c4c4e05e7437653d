"""The settings of the OpenAI-compatible gateway: its address and key, limits, capture, the teacher and the live
gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from pipelines.config.base import LOOPBACK, _Section


class GatewaySettings(_Section):
    """The OpenAI-compatible front door (`pipelines/gateway/`): what agents call."""

    host: str = Field(
        default=LOOPBACK,
        description="the address the gateway binds (127.0.0.1 only in the local profile; the pod binds its own "
        "interface)",
    )
    port: int = Field(
        default=8400, ge=1, le=65535, description="the gateway's port (the agent's base_url is http://<host>:<port>/v1)"
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="the bearer key callers send; default: one generated "
        "once per local root into <root>/runs/gateway.key (0600)",
    )
    replica: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]{1,63}$",
        description="this gateway process's name "
        "in the usage files (gateway/usage/<day>/<replica>.json); default: the host's name",
    )
    max_request_bytes: int = Field(default=1_000_000, ge=1024, description="larger request bodies are refused (413)")
    request_timeout_s: float = Field(default=120, gt=0, description="how long one request may wait for the model")
    max_concurrent_requests: int = Field(
        default=8,
        ge=1,
        description="completions in flight at once; more are refused at "
        "once with 429 and Retry-After (never queued until they time out)",
    )
    backend_slots: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="completions sent to the model servers at "
        "once while two or more projects send (a project alone is never held back); "
        "more wait in one queue per project and a freed slot goes to the waiting "
        "project with the fewest at the model (pipelines/admission/fair.py). Unset: "
        "triton.instances on CPU (a batch there answers no more per second than one "
        "request: README, Projects), instances x max_batch_size on GPU. 0: no queue "
        "(Triton's first come, first served)",
    )
    queue_timeout_s: float = Field(
        default=60,
        gt=0,
        description="how long a request may wait for its turn at the model; then a 429 with Retry-After",
    )
    fair_window_s: float = Field(
        default=10,
        gt=0,
        description="a project counts as sending for this long after its "
        "latest request was sent or answered; the turns at the model apply while two or more do",
    )
    turns_exchange_s: float = Field(
        default=5,
        ge=0,
        le=60,
        description="how often each gateway replica tells the others "
        "which projects send to it and its demand, and reads theirs "
        "(pipelines/admission/peers.py: the turns hold across replicas). 0: each "
        "replica keeps its turns alone; else at least 0.1",
    )
    few_shot: int = Field(default=3, ge=0, le=8, description="retrieved examples in the `base` model's prompt")
    capture: bool = Field(default=True, description="write every served turn into the raw zone as one log record")
    capture_rotate_bytes: int = Field(
        default=16_000_000, ge=1024, description="start a new capture file past this size"
    )
    capture_upload_every_s: float = Field(
        default=60,
        gt=0,
        description="a capture (and ratings) file older than this is closed and, with the raw zone on object "
        "storage, uploaded: an acknowledged turn leaves the replica's disk within about this long",
    )
    shutdown_grace_s: float = Field(
        default=50,
        ge=10,
        description="the longest a stop takes: draining requests, the captures' last upload, the usage (the pod's "
        "terminationGracePeriodSeconds is this plus 10 s)",
    )
    retention_days: int = Field(
        default=30,
        ge=1,
        description="days the gateway keeps its unusable answers and live "
        "comparisons (redacted at rest); older day partitions are deleted at its start",
    )
    country: str = Field(
        default="US",
        pattern=r"^[A-Z]{2}$",
        description="a captured turn's country when the request names none (metadata.country)",
    )
    currency: str = Field(
        default="USD",
        pattern=r"^[A-Z]{3}$",
        description="a captured turn's currency when the request names none (metadata.currency)",
    )
    channel: Literal["web", "mobile_app", "chat_widget", "voice", "api"] = Field(
        default="api", description="a captured turn's channel when the request names none (metadata.channel)"
    )
    teacher_url: str | None = Field(
        default=None,
        description="shadow/canary reference: an OpenAI-compatible base URL "
        "(the large model serving the agent today); needed for shadow and canary",
    )
    base_as_teacher: bool = Field(
        default=False,
        description="without teacher_url, compare with this gateway's own `base` "
        "route (plumbing tests only: the model a candidate was trained to beat is no teacher)",
    )
    teacher_model: str = Field(default="base", description="the model name sent to the teacher")
    teacher_api_key: SecretStr | None = Field(
        default=None, description="the bearer key sent to the teacher endpoint (teacher_url)"
    )
    canary_share: float = Field(
        default=0.2, gt=0, lt=1, description="share of a canary route's requests sent to the candidate"
    )
    agreement_metric: Literal["name", "exact", "arg_f1"] = Field(
        default="name",
        description="what the live gate compares with the teacher: the tool (name), the whole call (exact: "
        "name and arguments) or the arguments' F1 over (key, value) pairs; every comparison records all three. "
        "Whole calls need `min_agreement` set from the candidate's offline exact match (a tuned model at 0.79 "
        "exact match never passes 0.8)",
    )
    min_agreement: float = Field(
        default=0.8, ge=0, le=1, description="live agreement with the teacher a candidate needs"
    )
    gate_requests: int = Field(default=50, ge=1, description="compared requests before the live gate moves a route")
    canary_max_error_share: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="a canary route falls back to `serve` when more than this share of the candidate's answers are "
        "errors",
    )
    shadow_queue: int = Field(
        default=16,
        ge=1,
        description="off-path comparisons waiting at most; more are skipped "
        "(counted), so a slow candidate never slows the caller",
    )

    @field_validator("turns_exchange_s")
    @classmethod
    def _exchange_period(cls, seconds: float) -> float:
        if 0 < seconds < 0.1:
            raise ValueError("0 (off) or at least 0.1 s: each exchange writes a file")
        return seconds
