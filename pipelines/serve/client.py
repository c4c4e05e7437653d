"""Client of the served tool router: tritonclient (model control over HTTP or gRPC; inference over gRPC
streaming, since the model is decoupled: see `pipelines/triton_backend/model.py`).

What it sends (each request's chat turns and offered tools, built as the training set was) comes from
`serve.prompts`.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pipelines.config import Settings
from pipelines.serve import shared_base
from pipelines.serve.repository import SHARED_PREFIX, split_name
from pipelines.toolcall.budget import FALLBACK

Protocol = Literal["http", "grpc"]
OUTPUTS = ("TOOL_CALL", "PROMPT_TOKENS", "OUTPUT_TOKENS", "FINAL", "CUT")  # a response (CUT: newer folders only)


@dataclass
class Reply:
    text: str | None
    prompt_tokens: int
    output_tokens: int
    latency_ms: float
    error: str | None = None
    first_token_ms: float | None = None  # streamed requests: when the first text arrived
    cut: bool = False  # the answer had no end token within the model's budget (the model says so)

    @property
    def inter_token_ms(self) -> float | None:
        """Mean time between output tokens after the first (streamed requests with two tokens or more)."""
        if self.first_token_ms is None or self.output_tokens < 2:
            return None
        return (self.latency_ms - self.first_token_ms) / (self.output_tokens - 1)


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
    """One connection to the server for model control (`protocol`) and one gRPC stream connection for
    inference, each per calling thread: `infer_one` is safe to call from many threads, `infer` sends
    `concurrency` requests at a time. Every call is bounded by `timeout_s` (HTTP: the connection's connect
    and network timeouts; gRPC: each call's deadline; a streamed answer: the whole answer)."""

    def __init__(self, settings: Settings, protocol: Protocol = "http", timeout_s: float = 600):
        self.settings = settings
        self.protocol = protocol
        self.timeout_s = timeout_s
        if protocol == "http":
            import tritonclient.http as module

            self._deadline: dict[str, float] = {}  # the HTTP client's timeouts are per connection
        else:
            import tritonclient.grpc as module

            self._deadline = {"client_timeout": timeout_s}
        self._module = module
        self._inputs_of: dict[str, set[str | None]] = {}  # a model's declared inputs (None: one without a name)
        self._local = threading.local()
        self._controls: list[Any] = []  # every thread's control connection, closed by close()
        self._streams: list[tuple[threading.Thread, Any]] = []  # (the calling thread, its connection)
        self._streams_lock = threading.Lock()
        self._control_lock = threading.Lock()

    # model control ------------------------------------------------------------------------------
    def _control(self) -> Any:
        """This thread's control connection: tritonclient's HTTP client runs on gevent, whose connections
        cannot be used from another OS thread, so one client object shared by many threads (the gateway's
        workers, a pool of `infer` threads) keeps a control connection per calling thread."""
        client = getattr(self._local, "control", None)
        if client is None:
            address, ssl = target(self.settings, self.protocol)
            if self.protocol == "http":
                client = self._module.InferenceServerClient(
                    address, ssl=ssl, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
                )
            else:
                client = self._module.InferenceServerClient(address, ssl=ssl)
            self._local.control = client
            with self._streams_lock:
                self._controls.append(client)
        return client

    def load(self, name: str) -> None:
        """Load a model; an adapter (`lora__<base>@<adapter>`): load its shared base unless loaded (never reload
        it under the other adapters' traffic) and check the adapter is deployed (the base loads it on first use)."""
        model, adapter = split_name(name)
        if adapter:
            if not self._adapter_deployed(adapter):
                raise RuntimeError(
                    f"adapter {adapter} is not deployed (no folder under {shared_base.adapter_root(self.settings)})"
                )
            if self.ready(model):
                return
        with self._control_lock:
            self._control().load_model(model, **self._deadline)

    def _adapter_deployed(self, adapter: str) -> bool:
        return (shared_base.adapter_root(self.settings) / adapter / "adapter_config.json").is_file()

    def unload(self, name: str, wait_s: float = 0) -> None:
        """Unload; with `wait_s`, wait (at most that long) until the server no longer reports it ready. An adapter
        on a shared base is left to its cache (the base serves other adapters; `undeploy` removes its folder)."""
        if split_name(name)[1]:
            return
        with self._control_lock:
            self._control().unload_model(name, **self._deadline)
        deadline = time.monotonic() + wait_s
        while wait_s and self.ready(name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} still ready {wait_s:.0f} s after its unload")
            time.sleep(0.2)

    def ready(self, name: str) -> bool:
        model, adapter = split_name(name)
        if adapter and not self._adapter_deployed(adapter):
            return False
        try:
            with self._control_lock:
                return bool(self._control().is_model_ready(model, **self._deadline))
        except Exception:  # noqa: BLE001 (an unknown model is simply not ready)
            return False

    def declares(self, name: str, input_name: str) -> bool:
        """Whether the model declares an input (TOOLS: constrained decoding; STREAM: streamed answers, a
        model folder built before them and kept while in use lacks them)."""
        name = split_name(name)[0]
        with self._control_lock:
            if name not in self._inputs_of:
                try:
                    config = self._control().get_model_config(name, **self._deadline)
                except Exception:  # noqa: BLE001 (an unknown model takes nothing; not remembered)
                    return False
                inputs = config.get("input", []) if isinstance(config, dict) else config.config.input
                self._inputs_of[name] = {(i.get("name") if isinstance(i, dict) else i.name) for i in inputs}
            return input_name in self._inputs_of[name]

    def forget_inputs(self) -> None:
        """Read each model's declared inputs afresh on next use (after a deploy replaced a folder)."""
        with self._control_lock:
            self._inputs_of.clear()

    def accepts_tools(self, name: str) -> bool:
        """Whether the model declares the optional TOOLS input (constrained decoding)."""
        return self.declares(name, "TOOLS")

    def loaded(self) -> list[str]:
        with self._control_lock:
            index = self._control().get_model_repository_index(**self._deadline)
        rows = index if isinstance(index, list) else [{"name": m.name, "state": m.state} for m in index.models]
        names = {r["name"] for r in rows if r.get("state") == "READY"}
        if any(n.startswith(SHARED_PREFIX) for n in names):  # and each adapter a loaded shared base serves
            names |= {
                f"{meta['shared']}@{adapter}"
                for adapter, meta in shared_base.deployed_adapters(self.settings).items()
                if meta.get("shared") in names
            }
        return sorted(names)

    def statistics(self, name: str) -> dict[str, Any]:
        """Triton's own counters for one model (an adapter: its shared base's), as plain integers: inferences,
        executions (batches), each phase's nanoseconds summed over the requests, executions per batch size and
        `execution_ns` (compute summed over the executions: a batch counts once)."""
        extra = {} if self.protocol == "http" else {"as_json": True, **self._deadline}
        with self._control_lock:
            found = self._control().get_inference_statistics(model_name=name.split("@", 1)[0], **extra)
        stats = (found.get("model_stats") or [{}])[0]
        phases = stats.get("inference_stats") or {}
        return {
            "inference_count": int(stats.get("inference_count") or 0),
            "execution_count": int(stats.get("execution_count") or 0),
            **{
                f"{phase}_ns": int((phases.get(phase) or {}).get("ns") or 0)
                for phase in ("queue", "compute_input", "compute_infer", "compute_output")
            },
            "executions_by_batch_size": {
                int(b["batch_size"]): int((b.get("compute_infer") or {}).get("count") or 0)
                for b in stats.get("batch_stats") or []
            },
            "execution_ns": sum(
                int((b.get("compute_infer") or {}).get("ns") or 0) for b in stats.get("batch_stats") or []
            ),
        }

    # inference ----------------------------------------------------------------------------------
    def _stream_client(self) -> Any:
        """This thread's gRPC connection for streamed inference (a gRPC client holds one stream at a time)."""
        client = getattr(self._local, "grpc", None)
        if client is None:
            import tritonclient.grpc as grpc

            address, ssl = target(self.settings, "grpc")
            client = self._local.grpc = grpc.InferenceServerClient(address, ssl=ssl)
            with self._streams_lock:
                self._streams.append((threading.current_thread(), client))
        return client

    def infer_one(
        self,
        model: str,
        turns: list[dict[str, str]] | str,
        tools: str | None = None,
        *,
        stream: bool = False,
        on_text: Callable[[str], None] | None = None,
    ) -> Reply:
        """One request; with `tools` (the offered tools' JSON) the server decodes under their grammar. With
        `stream` (or `on_text`) the server sends the text as it grows: `on_text` gets the text so far each
        time, and the reply records when the first text came (`first_token_ms`). gRPC: a bidirectional
        stream; HTTP: Triton's generate endpoints (`generate_stream` as server-sent events)."""
        stream = (stream or on_text is not None) and self.declares(model, "STREAM")
        raw = turns if isinstance(turns, str) else json.dumps(turns, ensure_ascii=False)
        started = time.perf_counter()
        state: dict[str, float | None] = {"first": None}

        def step(event: dict[str, Any]) -> Reply | None:
            """One response of the model: the finished reply when it is the final one."""
            reply = Reply(
                str(event["TOOL_CALL"]),
                int(event["PROMPT_TOKENS"]),
                int(event["OUTPUT_TOKENS"]),
                (time.perf_counter() - started) * 1000,
            )
            if state["first"] is None and reply.text:
                state["first"] = reply.latency_ms
            if event.get("FINAL", True):  # a model built before streaming answers once
                reply.first_token_ms = state["first"] if stream else None
                # the model says whether its answer had no end token; a folder built before CUT is judged by its
                # budget (without an end token an answer runs exactly max_new_tokens)
                reply.cut = (
                    bool(event["CUT"])
                    if "CUT" in event
                    else reply.output_tokens >= (self.settings.triton.max_new_tokens or FALLBACK)
                )
                return reply
            if on_text is not None:
                on_text(reply.text or "")
            return None

        try:
            if self.protocol == "http":
                return self._generate(model, raw, tools, stream, step)
            return self._stream(model, raw, tools, stream, step)
        except Exception as exc:  # noqa: BLE001 (the server's message is the useful part)
            return Reply(None, 0, 0, (time.perf_counter() - started) * 1000, _message(exc))

    def _stream(
        self, model: str, raw: str, tools: str | None, stream: bool, step: Callable[[dict[str, Any]], Reply | None]
    ) -> Reply:
        import tritonclient.grpc as grpc

        model, adapter = split_name(model)
        inputs = []
        for name, value in (("CONVERSATION", raw), ("TOOLS", tools), ("ADAPTER", adapter)):
            if value is not None:
                tensor = grpc.InferInput(name, [1, 1], "BYTES")
                tensor.set_data_from_numpy(np.array([[value.encode("utf-8")]], dtype=np.object_))
                inputs.append(tensor)
        if stream:
            flag = grpc.InferInput("STREAM", [1, 1], "BOOL")
            flag.set_data_from_numpy(np.array([[True]], dtype=np.bool_))
            inputs.append(flag)
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = self._stream_client()
        try:
            client.start_stream(
                callback=lambda result, error: answers.put((result, error)), stream_timeout=self.timeout_s
            )
        except Exception:  # a stream left open by a failed call: this thread connects afresh next time
            self._drop_stream_client()
            raise
        deadline = time.perf_counter() + self.timeout_s
        try:
            client.async_stream_infer(model, inputs)
            while True:
                try:
                    result, error = answers.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    raise TimeoutError(f"no answer from {model} within {self.timeout_s:g} s") from None
                if error is not None:
                    raise error
                event = {k: v.reshape(-1)[0] for k in OUTPUTS if (v := result.as_numpy(k)) is not None}
                text = event["TOOL_CALL"]
                event["TOOL_CALL"] = text.decode("utf-8") if isinstance(text, bytes) else str(text)
                done = step(event)
                if done is not None:
                    return done
        finally:
            try:
                client.stop_stream(cancel_requests=True)
            except Exception:  # noqa: BLE001 (a broken stream: this thread connects afresh next time)
                self._drop_stream_client()

    def _generate(
        self, model: str, raw: str, tools: str | None, stream: bool, step: Callable[[dict[str, Any]], Reply | None]
    ) -> Reply:
        import httpx

        address, ssl = target(self.settings, "http")
        model, adapter = split_name(model)
        url = f"{'https' if ssl else 'http'}://{address}/v2/models/{model}/generate{'_stream' if stream else ''}"
        payload: dict[str, Any] = {
            "CONVERSATION": raw,
            **({"TOOLS": tools} if tools is not None else {}),
            **({"STREAM": True} if stream else {}),
            **({"ADAPTER": adapter} if adapter else {}),
        }
        client = getattr(self._local, "http", None)
        if client is None:
            client = self._local.http = httpx.Client(timeout=self.timeout_s)
            with self._streams_lock:
                self._streams.append((threading.current_thread(), client))
        deadline = time.perf_counter() + self.timeout_s
        with client.stream("POST", url, json=payload) as response:
            if response.status_code >= 400:  # Triton's reason, as JSON, whichever endpoint
                body = response.read()
                try:
                    reason = json.loads(body).get("error", body.decode("utf-8", "replace"))
                except (ValueError, AttributeError):
                    reason = body.decode("utf-8", "replace")
                raise RuntimeError(str(reason)[:500])
            if not stream:
                event = json.loads(response.read())
                if "error" in event:
                    raise RuntimeError(event["error"])
                done = step(event)
                if done is None:
                    raise RuntimeError(f"{model} answered without a final response")
                return done
            for line in response.iter_lines():
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"no answer from {model} within {self.timeout_s:g} s")
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise RuntimeError(event["error"])
                done = step(event)
                if done is not None:
                    return done
        raise RuntimeError(f"{model}'s stream ended before its final response")

    def _drop_stream_client(self) -> None:
        client = getattr(self._local, "grpc", None)
        self._local.grpc = None
        if client is not None:
            with self._streams_lock:
                self._streams = [(t, c) for t, c in self._streams if c is not client]
            try:
                client.close()
            except Exception:  # noqa: BLE001, S110 (closing a broken connection)
                pass

    def infer(
        self,
        model: str,
        conversations: list[list[dict[str, str]]],
        concurrency: int = 1,
        tools: list[str] | None = None,
        stream: bool = False,
    ) -> list[Reply]:
        """Every conversation through the server with `concurrency` requests in flight; `tools`: one
        offered-tools JSON per conversation for constrained decoding."""
        offered: list[str | None] = list(tools) if tools is not None else [None] * len(conversations)
        if len(offered) != len(conversations):
            raise ValueError(f"{len(offered)} tool sets for {len(conversations)} conversations")
        if concurrency <= 1:
            return [self.infer_one(model, c, t, stream=stream) for c, t in zip(conversations, offered)]
        from concurrent.futures import ThreadPoolExecutor

        try:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                return list(
                    pool.map(lambda job: self.infer_one(model, *job, stream=stream), zip(conversations, offered))
                )
        finally:
            self._close_streams(lambda thread: not thread.is_alive())  # the pool's threads are gone

    def _close_streams(self, which: Callable[[threading.Thread], bool]) -> None:
        with self._streams_lock:
            closing = [c for t, c in self._streams if which(t)]
            self._streams = [(t, c) for t, c in self._streams if not which(t)]
        for client in closing:
            try:
                client.close()
            except Exception:  # noqa: BLE001, S110 (closing a broken connection)
                pass

    def close(self) -> None:
        with self._streams_lock:
            controls, self._controls = self._controls, []
        for client in controls:
            with contextlib.suppress(Exception):  # a connection of a thread that is gone: nothing left to close
                client.close()
        self._close_streams(lambda thread: True)


def _message(exc: Exception) -> str:
    text = getattr(exc, "message", None)
    text = text() if callable(text) else text
    return str(text or exc)
