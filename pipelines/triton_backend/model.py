"""Triton Python-backend model: base model + merged LoRA adapter, greedy tool-call generation.

This file is copied verbatim into the model repository as `<model>/1/model.py` and runs inside
Triton's Python stub, in the serving environment (`make serve-env`, or the Triton container's
Python): it imports nothing from `pipelines`. Requests carry the chat turns the client built
exactly as the training set did; responses carry the tool call text and token counts. Dynamic
batching hands `execute` several requests at once: the valid ones are generated as one left-padded
batch; a malformed or oversize request gets its own error response and the others still succeed.
A request that also carries TOOLS (the offered tools, JSON) is decoded under their tool-call grammar
(`tool_grammar.py`, copied beside this file); tools the grammar cannot express are that request's error.

With the parameter `adapter_root` the model is a shared base: it merges nothing, and a request's optional ADAPTER
names one of the adapters deployed under that folder (`lora_cache.py` with `batched_lora.py`, copied beside this
file: loaded on first use into a slot of the one base, evicted least-recently-used past `max_adapters`); a request
without one is answered by the base model.

Precision (the parameter `precision`, from `triton.precision`; a GPU instance always serves bf16): `fp32`, `bf16` (the
weights in bf16: every step, prefill and decode, in bf16), or `auto`: an fp32 copy and a bf16 copy of the merged
model, and a batch of at least `bf16_min_rows` requests runs the bf16 one (on AMX/AVX-512 BF16 cores bf16 wins where
several rows meet a weight, and loses for one decoded row on a small matrix). A shared base serves `auto` as fp32:
one copy of the base in memory is its point.

The model is decoupled (gRPC streaming): every request gets its responses through its own sender, the last
one with FINAL true and the whole answer. A request with STREAM true also gets one response per decoding
step that grew its text (TOOL_CALL = the text so far, FINAL false), so a caller sees the first token as
soon as it exists; the others get the final response only. Each request ends with exactly one final
response, an error or the answer.
"""

import json
import os
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by the Triton stub

ROLES = {"system", "user", "assistant"}
PRECISIONS = ("fp32", "bf16", "auto")


def _cpu_has_bf16():
    """This CPU computes bf16 matmuls in hardware (AVX-512 BF16 or AMX); without them torch emulates bf16, many
    times slower than fp32. The backend imports nothing of the platform: `hardware.cpu_has_bf16` there is the
    same check, tested in tests/test_hardware.py."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = {w for line in f if line.startswith("flags") for w in line.split(":", 1)[-1].split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def _send(sender, response, flags=0):
    """Send one response; False when the caller is gone (cancelled, disconnected): that must never stop
    the other requests of the batch from getting theirs."""
    try:
        sender.send(response, flags=flags)
        return True
    except Exception as exc:  # noqa: BLE001 (pb_utils raises TritonModelException for a cancelled request)
        pb_utils.Logger.log_warn(f"a response could not be sent (the caller left?): {type(exc).__name__}: {exc}")
        return False


class TritonPythonModel:
    def initialize(self, args):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = f"{args['model_repository']}/{args['model_version']}"
        base = params["base_model_path"]
        adapter = params.get("adapter", "")
        adapter_root = params.get("adapter_root", "")
        self.max_input_tokens = int(params.get("max_input_tokens", "1024"))
        self.max_new_tokens = int(params.get("max_new_tokens", "96"))
        torch.set_num_threads(int(params.get("threads", "0")) or torch.get_num_threads())
        on_gpu = torch.cuda.is_available() and args.get("model_instance_kind") == "GPU"
        self.device = f"cuda:{args['model_instance_device_id']}" if on_gpu else "cpu"
        self.precision = "bf16" if on_gpu else params.get("precision", "fp32")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not on_gpu and self.precision != "fp32" and not _cpu_has_bf16():
            print(
                f"precision {self.precision}: this CPU has no bf16 units (AVX-512 BF16 or AMX); serving fp32",
                flush=True,
            )
            self.precision = "fp32"
        self.bf16_min_rows = int(params.get("bf16_min_rows", "4"))
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(base)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=dtype)
        if adapter and not adapter_root:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, f"{version_dir}/{adapter}").merge_and_unload()
        # transformers: PreTrainedModel.to is a functools.wraps wrapper, typed as the unbound function (self first)
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        self.model_bf16 = None  # `auto`: the bf16 copy that batches of bf16_min_rows or more run
        if self.precision == "auto" and not adapter_root:
            import copy

            self.model_bf16 = copy.deepcopy(self.model).to(torch.bfloat16).eval()
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import llguidance  # noqa: F401 (the constrained decoder: a model without it fails to load, clearly)
        import tool_grammar

        self.grammar = tool_grammar
        tool_grammar.prepare(self.tokenizer)  # about a second: at load, not on the first constrained request
        self.lora = None
        if adapter_root:
            import lora_cache

            cap = params.get("max_adapter_rank")
            self.lora = lora_cache.AdapterCache(
                self.model,
                adapter_root,
                int(params.get("max_adapters", "8")),
                log=pb_utils.Logger.log_info,
                shared=args["model_name"],
                rank=int(cap) if cap else None,
            )

    def _adapter(self, request):
        """The request's adapter name (lora_cache.BASE: none), checked against the deployed ones."""
        tensor = pb_utils.get_input_tensor_by_name(request, "ADAPTER")
        if tensor is None:
            return ""
        if self.lora is None:
            raise ValueError("this model serves one adapter: send no ADAPTER")
        values = tensor.as_numpy().reshape(-1)
        if values.size != 1:
            raise ValueError("send at most one ADAPTER per request")
        raw = values[0]
        name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if name:
            self.lora.folder(name)
        return name

    def _prompt(self, raw):
        """The rendered prompt of one request, or a ValueError saying what is wrong with it."""
        try:
            turns = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"CONVERSATION is not JSON: {exc}") from None
        if (
            not isinstance(turns, list)
            or not turns
            or not all(
                isinstance(t, dict) and t.get("role") in ROLES and isinstance(t.get("content"), str) for t in turns
            )
        ):
            raise ValueError("CONVERSATION must be a JSON list of {role: system|user|assistant, content: str}")
        if turns[-1]["role"] != "user":
            raise ValueError("the last turn must be the user's request")
        prompt = self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        n = len(self.tokenizer(prompt, add_special_tokens=False).input_ids)
        if n > self.max_input_tokens:
            raise ValueError(f"prompt is {n} tokens; this model accepts at most {self.max_input_tokens}")
        return prompt, n

    def _tools(self, request):
        """The request's offered tools (JSON) when it asks for constrained decoding, else None; raises
        ValueError (GrammarError) when they cannot be enforced."""
        tensor = pb_utils.get_input_tensor_by_name(request, "TOOLS")
        if tensor is None:
            return None
        values = tensor.as_numpy().reshape(-1)
        if values.size != 1:
            raise ValueError("send at most one TOOLS per request")
        raw = values[0]
        try:
            tools = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError as exc:
            raise ValueError(f"TOOLS is not UTF-8: {exc}") from None
        self.grammar.grammar_for(tools)
        return tools

    def _flag(self, request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return tensor is not None and bool(tensor.as_numpy().reshape(-1)[0])

    @staticmethod
    def _response(text, prompt_tokens, output_tokens, final, cut=False):
        """CUT: the final answer had no end token (`tool_grammar.answer_length`, the one definition)."""
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("TOOL_CALL", np.array([[text.encode("utf-8")]], dtype=np.object_)),
                pb_utils.Tensor("PROMPT_TOKENS", np.array([[prompt_tokens]], dtype=np.int32)),
                pb_utils.Tensor("OUTPUT_TOKENS", np.array([[output_tokens]], dtype=np.int32)),
                pb_utils.Tensor("FINAL", np.array([[final]], dtype=np.bool_)),
                pb_utils.Tensor("CUT", np.array([[cut]], dtype=np.bool_)),
            ]
        )

    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        valid = []  # (sender, prompt, prompt tokens, tools, stream, adapter)
        for request in requests:
            sender = request.get_response_sender()
            tensor = pb_utils.get_input_tensor_by_name(request, "CONVERSATION")
            try:
                values = tensor.as_numpy().reshape(-1)
                if values.size != 1:
                    raise ValueError("send exactly one CONVERSATION per request")
                raw = values[0]
                tools = self._tools(request)
                adapter = self._adapter(request)
                prompt, n = self._prompt(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
                valid.append((sender, prompt, n, tools, self._flag(request, "STREAM"), adapter))
            except Exception as exc:  # noqa: BLE001 (GrammarError and any other failure is this request's error)
                _send(
                    sender,
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                    flags=final,
                )
        if self.lora is None:
            if valid:
                self._run(self._model_for(len(valid)), valid, {})
            return None
        for part in self.lora.plan([v[5] for v in valid]):  # parts of at most max_adapters distinct adapters
            rows = [valid[i] for i in part]
            try:
                failed = self.lora.ensure_each([v[5] for v in rows])  # {adapter: why}: its rows' error alone
            except Exception as exc:  # noqa: BLE001 (never expected: the part's rows end with the reason)
                failed = {v[5]: f"{type(exc).__name__}: {exc}" for v in rows}
            for sender, *_, adapter in rows:
                if adapter in failed:
                    _send(
                        sender,
                        pb_utils.InferenceResponse(
                            output_tensors=[], error=pb_utils.TritonError(f"adapter: {failed[adapter]}")
                        ),
                        flags=final,
                    )
            rows = [v for v in rows if v[5] not in failed]
            if not rows:
                continue
            try:
                self.lora.route([v[5] for v in rows])
            except Exception as exc:  # noqa: BLE001
                for sender, *_ in rows:
                    _send(
                        sender,
                        pb_utils.InferenceResponse(
                            output_tensors=[], error=pb_utils.TritonError(f"adapter: {type(exc).__name__}: {exc}")
                        ),
                        flags=final,
                    )
                continue
            self._run(self.lora.model, rows, {})  # answers every row itself, an error included
        return None

    def _model_for(self, rows):
        """The merged model a batch of `rows` requests runs on (`auto`: the bf16 copy from bf16_min_rows on)."""
        if self.model_bf16 is not None and rows >= self.bf16_min_rows:
            return self.model_bf16
        return self.model

    def _run(self, model, valid, kwargs):
        """Generate the valid requests as one left-padded batch and answer each (its own error on failure)."""
        import torch

        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        steps = _Steps(self, valid)
        try:
            enc = self.tokenizer([v[1] for v in valid], return_tensors="pt", padding=True, add_special_tokens=False).to(
                self.device
            )
            tools = [v[3] for v in valid]
            extra: dict[str, Any] = {}
            if any(t is not None for t in tools):
                from transformers import LogitsProcessorList

                extra["logits_processor"] = LogitsProcessorList(
                    [self.grammar.ToolCallConstraint(self.tokenizer, tools)]
                )
            extra["streamer"] = steps
            with torch.inference_mode():
                out = model.generate(
                    **kwargs,
                    **enc,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=self.tokenizer.eos_token_id,
                    **extra,
                )
        except Exception as exc:  # noqa: BLE001 (every request of the batch still open ends, with the reason)
            for sender, *_ in (v for v, row in zip(valid, steps.rows) if not row["final"]):
                _send(
                    sender,
                    pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"generation failed: {type(exc).__name__}: {exc}")
                    ),
                    flags=final,
                )
            return None
        new = out[:, enc["input_ids"].shape[1] :]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        for (sender, _, n, *_), text, row, step in zip(valid, texts, new, steps.rows):
            if not step["final"]:  # no end token within max_new_tokens (a row that ended was answered then)
                generated, ended = self.grammar.answer_length(row.tolist(), steps.eos)
                _send(sender, self._response(text.strip(), n, generated, True, cut=not ended), flags=final)
        return None

    def finalize(self):
        self.model = self.model_bf16 = self.lora = None


class _Steps:
    """A `generate` streamer for a batch: after each decoding step, every streaming request whose text grew
    gets it (the text so far; a step that ends inside a multi-byte character waits for the next one), and a
    request whose answer ended (its end-of-sequence token) gets its final response at once, not when the
    longest answer of the batch is done."""

    def __init__(self, model, valid):
        self.model = model
        self.rows = [
            {"sender": v[0], "prompt": v[2], "stream": v[4], "ids": [], "final": False, "sent": ""} for v in valid
        ]
        self.prompt_seen = False
        eos = model.tokenizer.eos_token_id
        self.eos = set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def put(self, value):
        if not self.prompt_seen:  # the first call hands over the prompts
            self.prompt_seen = True
            return
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for row, token in zip(self.rows, value.reshape(-1).tolist()):
            if row["final"]:
                continue
            if token in self.eos:
                row["final"] = True
                text = self.model.tokenizer.decode(row["ids"], skip_special_tokens=True).strip()
                _send(row["sender"], self.model._response(text, row["prompt"], len(row["ids"]), True), flags=final)
                continue
            row["ids"].append(token)
            if not row["stream"]:
                continue
            text = self.model.tokenizer.decode(row["ids"], skip_special_tokens=True).lstrip()
            if text and text != row["sent"] and not text.endswith("\ufffd"):
                row["sent"] = text
                if not _send(row["sender"], self.model._response(text, row["prompt"], len(row["ids"]), False)):
                    row["stream"] = False  # the caller left: no more steps for it (its final send fails quietly)

    def end(self):
        pass
