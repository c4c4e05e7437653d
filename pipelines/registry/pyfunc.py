"""The registered model: an MLflow pyfunc that holds only the LoRA adapter, its tokenizer and a
reference to the base model (never a copy of the base), and answers chat requests with a tool call.

`mlflow.pyfunc.load_model("models:/commerce-tool-caller@champion")` gives a ready model:
`predict(pandas.DataFrame({"messages": [...], "tools_json": [...], "event_time": [...]}))`. Answers are
decoded under the offered tools' grammar (`toolcall.grammar`), as the served model does.
"""

from __future__ import annotations

import json
from typing import Any

from mlflow.pyfunc import PythonModel  # not `mlflow.pyfunc.PythonModel`: mlflow types its `pyfunc` as a LazyLoader


class ToolCallerModel(PythonModel):
    """Base model + LoRA adapter (merged at load), prompt built exactly as in training."""

    def load_context(self, context: Any) -> None:
        from pipelines.base_models import load_model
        from pipelines.config import load_settings

        with open(context.artifacts["flywheel"], encoding="utf-8") as fh:
            self.meta = json.load(fh)
        # MLflow loads this model in its own process: the settings come from that process's configuration
        self.model, self.tokenizer = load_model(self.meta["base_model"], load_settings(), context.artifacts["adapter"])

    def predict(self, context, model_input, params=None):  # untyped: MLflow validates typed signatures
        from pipelines.toolcall.decode import generate
        from pipelines.toolcall.prompt import chat_turns, system_for

        conversations = []
        for row in model_input.to_dict("records"):
            missing = {"messages", "tools_json", "event_time"} - set(row)
            if missing:
                raise ValueError(
                    f"missing input column(s) {sorted(missing)}: messages (the conversation as in "
                    "our logs), tools_json (offered tools), event_time (ISO date), context (optional)"
                )
            row.setdefault("context", "")
            if self.meta["prompt_style"] == "full" and not row.get("system_prompt"):
                raise ValueError("this model was trained with the full prompt: pass `system_prompt`")
            conversations.append(chat_turns(system_for(row, self.meta["prompt_style"]), row["messages"]))
        # the version's answer budget (its longest training call plus a margin; recorded in the model's metadata
        # since d2d507d); 96 for a version saved before it
        max_new = int((params or {}).get("max_new_tokens") or self.meta.get("answer_budget") or 96)
        return generate(
            self.model,
            self.tokenizer,
            conversations,
            max_new_tokens=max_new,
            latency_samples=0,
            tools=[str(t) for t in model_input["tools_json"]],
        ).texts
