"""Episodes through Triton (`flywheel eval --episodes --via triton`): each condition answered by the Triton model
that serves it, so the episodes judge exactly what the gateway would send the agent: the served model's answer
budget, precision, batching and grammar (the `TOOLS` input), not an in-process copy of them.

The prompt is the condition's as in process (`evaluate.episode_run.ModelPolicy`: the style the version was
trained with, the base model's full prompt, few-shot examples from `--shot-tasks`), and each answer is decoded
under the offered tools grounded in the episode's own conversation, as the gateway grounds them. Triton's models
decode greedily and return no token probabilities, so through Triton an episode run measures the greedy closed
loop (pass^1) and the teacher-forced steps' exact match; the sampled tries (pass^k) and the gold call's
probability need the model in process, and the report says `sampled: false` and leaves those figures empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pipelines.config import Settings
from pipelines.errors import DataProblem
from pipelines.evaluate.episode_run import ModelPolicy
from pipelines.evaluate.episodes import Answer, PolicyFailed


class TritonUnavailable(DataProblem):
    """A condition's model is not loaded in Triton, or Triton answered with an error: one line."""


@dataclass
class TritonPolicy(ModelPolicy):
    """A condition answered by a Triton model (`served_as`) through `client` (`serve.client.TritonClient`)."""

    served_as: str = ""
    client: Any = None
    samples: ClassVar[bool] = False  # Triton's models decode greedily
    probabilities: ClassVar[bool] = False  # and return no token probabilities

    @property
    def served(self) -> str:
        return f"triton {self.served_as}"

    def answer(
        self, talks: list[list[dict[str, Any]]], temperature: float | None = None, seed: int = 0
    ) -> list[Answer]:
        if temperature is not None:
            raise DataProblem("episodes through Triton: its models decode greedily; sampled tries need --via process")
        replies = self.client.infer(
            self.served_as, self.conversations(talks), concurrency=self.batch_size, tools=self.offered(talks)
        )
        failed = next((r.error for r in replies if r.error is not None), None)
        if failed is not None:  # the condition stops here; the report keeps what finished and says why
            raise PolicyFailed(f"{self.served_as} answered with an error: {failed}")
        return [Answer(r.text or "", r.prompt_tokens) for r in replies]

    def gold_logprobs(self, talks: list[list[dict[str, Any]]], targets: list[dict[str, Any]]) -> list[None]:
        return [None] * len(talks)  # a served model returns no token probabilities

    def release(self) -> None:  # nothing in memory here: Triton holds the weights
        pass


def through_triton(settings: Settings, policies: list[ModelPolicy], versions: dict[str, str | None]) -> list[Any]:
    """The same conditions answered by Triton: the base conditions by the base model, each version's by its own
    model (`versions`: condition label -> registry version, None for the base). A condition whose model is not
    loaded is refused with one line, before any episode runs; an adapter folder (no version) cannot be served."""
    from pipelines.serve.client import TritonClient

    client = TritonClient(settings)
    try:
        return _served(settings, policies, versions, client)
    except TritonUnavailable:
        client.close()  # refused before any episode: nothing will use the connection
        raise


def _served(settings: Settings, policies: list[ModelPolicy], versions: dict[str, str | None], client: Any) -> list[Any]:
    from dataclasses import fields

    from pipelines.serve.repository import triton_name

    try:
        loaded = set(client.loaded())
    except Exception as exc:  # noqa: BLE001 (down, or not started: one line)
        raise TritonUnavailable(f"episodes through Triton: the server does not answer ({exc})") from None
    out: list[Any] = []
    for policy in policies:
        if policy.label not in versions:
            raise TritonUnavailable(
                f"episodes through Triton: {policy.label} is an adapter folder, which Triton does not serve; "
                "evaluate a registered --version, or run it --via process"
            )
        name = triton_name(settings, versions[policy.label])
        if name not in loaded:
            raise TritonUnavailable(
                f"episodes through Triton: {name} ({policy.label}) is not loaded; deploy it first "
                f"(loaded: {', '.join(sorted(loaded)) or 'none'})"
            )
        kept = {f.name: getattr(policy, f.name) for f in fields(policy) if f.init and not f.name.startswith("_")}
        out.append(TritonPolicy(**kept, served_as=name, client=client))
    return out
