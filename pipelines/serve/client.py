"""Client of the served tool router: tritonclient over HTTP or gRPC.

It builds each request's chat turns exactly as the training set did (`pipelines.train.dataset.
system_for` + `chat_turns`), taking the customer context from Feast's online store, so the prompt a
model sees in production is the prompt it was trained on (tested).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pipelines.config import Settings
from pipelines.prep.prompt import chat_turns
from pipelines.train.dataset import system_for

Protocol = Literal["http", "grpc"]


@dataclass
class Reply:
    text: str | None
    prompt_tokens: int
    output_tokens: int
    latency_ms: float
    error: str | None = None


def conversation(row: dict[str, Any], style: str, settings: Settings | None = None) -> list[dict[str, str]]:
    """The chat turns for one request in our row format (tools_json, messages_json, event_time, customer_id).
    Without a `context` in the row, the customer's context comes from the online feature store."""
    if "context" not in row and settings is not None and row.get("customer_id"):
        from pipelines.features.pipeline import online_context

        row = {**row, "context": online_context(row["customer_id"], settings)}
    return chat_turns(system_for(row, style), row["messages_json"])  # type: ignore[arg-type]


def offered_tools(settings: Settings, rows: list[dict[str, Any]], client: TritonClient | None = None,
                  model: str | None = None) -> list[str] | None:
    """The rows' offered tools for constrained decoding when serving is constrained (`triton.constrained`)
    and the model takes them (a folder built before the TOOLS input existed and kept while in use does
    not: it is decoded as it was built, and deploy rebuilds it once it is no longer in use)."""
    if not settings.triton.constrained:
        return None
    if client is not None and model is not None and not client.accepts_tools(model):
        return None
    return [r["tools_json"] for r in rows]


def target(settings: Settings, protocol: Protocol = "http") -> tuple[str, bool]:
    """(host:port, ssl) of the server for this protocol: `triton.url` (the cluster's Service; scheme
    optional, https means TLS), gRPC on the same host at `triton.grpc_port`. Without a url, the
    local server at `triton.host`."""
    t = settings.triton
    url = (t.url or f"{t.host}:{t.http_port}").strip()
    scheme, _, rest = url.rpartition("://")
    address = rest.split("/", 1)[0]
    ssl = scheme.lower() == "https"
    if not address:
        raise ValueError(f"triton.url: expected host:port or http(s)://host:port, got {url!r}")
    host, _, port = address.rpartition(":") if not address.endswith("]") else ("", "", "")
    if not port.isdigit():  # no port given (a bracketed IPv6 address, or a plain host name)
        host, port = address, str(443 if ssl else 80)
    return f"{host}:{port if protocol == 'http' else t.grpc_port}", ssl


class TritonClient:
    """One connection to the server; `infer` sends one request per conversation, `concurrency` at a time.
    Every call is bounded by `timeout_s` (HTTP: the connection's connect and network timeouts; gRPC:
    each call's deadline)."""

    def __init__(self, settings: Settings, protocol: Protocol = "http", timeout_s: float = 600):
        self.settings = settings
        self.protocol = protocol
        self.timeout_s = timeout_s
        address, ssl = target(settings, protocol)
        if protocol == "http":
            import tritonclient.http as module

            self._client = module.InferenceServerClient(address, ssl=ssl, connection_timeout=timeout_s,
                                                        network_timeout=timeout_s)
            self._deadline: dict[str, float] = {}  # the HTTP client's timeouts are per connection
        else:
            import tritonclient.grpc as module

            self._client = module.InferenceServerClient(address, ssl=ssl)
            self._deadline = {"client_timeout": timeout_s}
        self._module = module
        self._tools_input: dict[str, bool] = {}

    # model control ------------------------------------------------------------------------------
    def load(self, name: str) -> None:
        self._client.load_model(name, **self._deadline)

    def unload(self, name: str, wait_s: float = 0) -> None:
        """Unload; with `wait_s`, wait (at most that long) until the server no longer reports it ready."""
        self._client.unload_model(name, **self._deadline)
        deadline = time.monotonic() + wait_s
        while wait_s and self.ready(name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} still ready {wait_s:.0f} s after its unload")
            time.sleep(0.2)

    def ready(self, name: str) -> bool:
        try:
            return bool(self._client.is_model_ready(name, **self._deadline))
        except Exception:  # noqa: BLE001 (an unknown model is simply not ready)
            return False

    def accepts_tools(self, name: str) -> bool:
        """Whether the model declares the optional TOOLS input (constrained decoding)."""
        if name not in self._tools_input:
            try:
                config = self._client.get_model_config(name, **self._deadline)
            except Exception:  # noqa: BLE001 (an unknown model takes nothing)
                return False
            inputs = config.get("input", []) if isinstance(config, dict) else config.config.input
            self._tools_input[name] = any((i.get("name") if isinstance(i, dict) else i.name) == "TOOLS"
                                          for i in inputs)
        return self._tools_input[name]

    def loaded(self) -> list[str]:
        index = self._client.get_model_repository_index(**self._deadline)
        rows = index if isinstance(index, list) else [{"name": m.name, "state": m.state} for m in index.models]
        return sorted(r["name"] for r in rows if r.get("state") == "READY")

    # inference ----------------------------------------------------------------------------------
    def _inputs(self, turns: list[dict[str, str]] | str, tools: str | None = None) -> list[Any]:
        raw = turns if isinstance(turns, str) else json.dumps(turns, ensure_ascii=False)
        tensors = []
        for name, value in (("CONVERSATION", raw), ("TOOLS", tools)):
            if value is None:
                continue
            tensor = self._module.InferInput(name, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[value.encode("utf-8")]], dtype=np.object_))
            tensors.append(tensor)
        return tensors

    def infer_one(self, model: str, turns: list[dict[str, str]] | str, tools: str | None = None) -> Reply:
        """One request; with `tools` (the offered tools' JSON) the server decodes under their grammar."""
        started = time.perf_counter()
        try:
            result = self._client.infer(model, self._inputs(turns, tools), **self._deadline)
        except Exception as exc:  # noqa: BLE001 (the server's message is the useful part)
            return Reply(None, 0, 0, (time.perf_counter() - started) * 1000, _message(exc))
        return _reply(result, (time.perf_counter() - started) * 1000)

    def infer(self, model: str, conversations: list[list[dict[str, str]]], concurrency: int = 1,
              tools: list[str] | None = None) -> list[Reply]:
        """Every conversation through the server with `concurrency` requests in flight; `tools`: one
        offered-tools JSON per conversation for constrained decoding."""
        offered: list[str | None] = list(tools) if tools is not None else [None] * len(conversations)
        if len(offered) != len(conversations):
            raise ValueError(f"{len(offered)} tool sets for {len(conversations)} conversations")
        if concurrency <= 1:
            return [self.infer_one(model, c, t) for c, t in zip(conversations, offered)]
        import threading
        from concurrent.futures import ThreadPoolExecutor

        local = threading.local()  # the HTTP client is not thread-safe: one connection per worker thread
        made: list[TritonClient] = []

        def one(job: tuple[list[dict[str, str]], str | None]) -> Reply:
            if not hasattr(local, "client"):
                local.client = TritonClient(self.settings, self.protocol, timeout_s=self.timeout_s)
                made.append(local.client)
            return local.client.infer_one(model, *job)

        try:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                return list(pool.map(one, zip(conversations, offered)))
        finally:
            for client in made:
                client.close()

    def close(self) -> None:
        self._client.close()


def _reply(result: Any, latency_ms: float) -> Reply:
    text = result.as_numpy("TOOL_CALL").reshape(-1)[0]
    return Reply(text.decode("utf-8") if isinstance(text, bytes) else str(text),
                 int(result.as_numpy("PROMPT_TOKENS").reshape(-1)[0]),
                 int(result.as_numpy("OUTPUT_TOKENS").reshape(-1)[0]), latency_ms)


def _message(exc: Exception) -> str:
    text = getattr(exc, "message", None)
    text = text() if callable(text) else text
    return str(text or exc)
