"""Greedy generation of tool calls, batched, with prompt-token counts and per-request latency.

Requests of one call usually open alike (the system prompt and, in the full prompt, every offered tool's schema).
The batched pass decodes the requests in order of prompt length (alike lengths in a batch: little padding) and
answers in the caller's order. Where the caller asks (`share_prefix`), it computes that shared opening once
(`SharedPrefix`) and decodes every batch from a copy of its cache; the single-request latency sample never does (it
measures one request as served).
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from rich.progress import Progress

from pipelines.errors import DataProblem


class ToolsNotEnforceable(DataProblem):
    """An offered tool's schema cannot be turned into a grammar: constrained decoding refuses it (one line
    naming the tool) rather than decode that turn unconstrained."""


@dataclass
class Generations:
    texts: list[str]
    prompt_tokens: list[int]
    output_tokens: list[int]
    seconds: float  # wall time of the batched pass over all requests
    latency_ms: list[float]  # single-request (batch 1) latencies of a seeded random sample of the requests
    ended: list[bool] = field(default_factory=list)  # per answer: whether it ended with the end token
    shared_prefix_tokens: int = 0  # opening tokens every prompt shared, computed once for the batched pass

    @property
    def cut(self) -> int:
        """Answers that stopped at the budget without their end token (cut short)."""
        return self.ended.count(False)

    def stats(self) -> dict[str, float]:
        n = max(1, len(self.texts))
        return {
            "prompt_tokens_mean": round(sum(self.prompt_tokens) / n, 1),
            "output_tokens_mean": round(sum(self.output_tokens) / n, 1),
            "cut_at_max_new_tokens": self.cut,
            "latency_ms_p50": round(statistics.median(self.latency_ms), 1) if self.latency_ms else float("nan"),
            "latency_samples": len(self.latency_ms),  # n of the latency: a seeded random sample, batch 1
            "seconds_per_request_batched": round(self.seconds / n, 3),
            "shared_prefix_tokens": self.shared_prefix_tokens,
        }


def require_grammars(
    tool_sets: set[str],
    what: str = "constrained decoding",
    instead: str = "decode without the grammar instead (evaluation.constrained: off, "
    "`flywheel eval --constrained off`)",
) -> None:
    """Every tool set compiles to a grammar, or one ToolsNotEnforceable line naming the tool, before any work."""
    from pipelines.toolcall.grammar import GrammarError, grammar_for

    for tools in sorted(tool_sets):
        try:
            grammar_for(tools)
        except GrammarError as exc:
            raise ToolsNotEnforceable(f"{what}: {exc}; {instead}") from None


# sampling from the whole distribution: no cut the checkpoint's generation config would otherwise apply
WHOLE = {"top_k": 0, "top_p": 1.0, "min_p": None, "typical_p": 1.0, "repetition_penalty": 1.0}


MIN_SHARED_PREFIX = 32  # tokens: a shorter shared opening is left to the batch's own prefill


def shared_prefix_length(rows: list[list[int]]) -> int:
    """How many opening tokens every row shares, leaving each row at least one token of its own (the
    generation starts from a row's own last token). The common opening of all rows is that of the first and the
    last in sorted order."""
    if len(rows) < 2:
        return 0
    low, high = min(rows), max(rows)
    limit = min(len(r) for r in rows) - 1
    same = next((i for i, (a, b) in enumerate(zip(low, high)) if a != b), min(len(low), len(high)))
    return max(min(same, limit), 0)


def _plain_cache(model: Any, cache: Any) -> bool:
    """Whether a prefilled cache can be copied per batch with padding after it: plain per-token key-value layers
    (no sliding window, whose slots the padding would use up; no recurrent state the padding would enter) and no
    cache `generate` would build itself."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    implementation = getattr(getattr(model, "generation_config", None), "cache_implementation", None)
    layers = getattr(cache, "layers", None) or []
    return type(cache) is DynamicCache and implementation is None and all(type(x) is DynamicLayer for x in layers)


class SharedPrefix:
    """The opening every prompt of a call shares, prefilled once (batch 1): each batch then decodes from a copy of
    its key-value cache, and only the rows' own tokens are prefilled per batch. The rows are laid out as the shared
    tokens, then each row's own tokens left-padded: the padding sits between the two, masked, and `generate`
    numbers positions from the mask, so every token keeps the position it has in the unshared prompt. A model
    whose cache is not plain (`_plain_cache`) or a short opening (under `minimum` tokens) shares nothing."""

    def __init__(self, model: Any, rows: list[list[int]], minimum: int = MIN_SHARED_PREFIX):
        import torch

        self.length = shared_prefix_length(rows)
        self.cache: Any = None
        self.device = getattr(model, "device", "cpu")
        if self.length < minimum:
            self.length = 0
            return
        self.tokens = rows[0][: self.length]
        keep = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}  # not the vocabulary per token
        with torch.inference_mode():
            cache = model(input_ids=torch.tensor([self.tokens], device=self.device), use_cache=True, **keep)
        if _plain_cache(model, cache.past_key_values):
            self.cache = cache.past_key_values
        else:
            self.length = 0

    def inputs(self, rows: list[list[int]], pad: int) -> dict[str, Any]:
        """`generate`'s inputs for these rows (each starting with the shared tokens) from a fresh copy of the cache."""
        import torch

        own = [r[self.length :] for r in rows]
        width = self.length + max(len(o) for o in own)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        ids[:, : self.length] = torch.tensor(self.tokens)
        mask[:, : self.length] = 1
        for i, o in enumerate(own):
            ids[i, width - len(o) :] = torch.tensor(o)
            mask[i, width - len(o) :] = 1
        cache = copy.deepcopy(self.cache)  # repeated per batch: the prefilled one stays batch 1
        cache.batch_repeat_interleave(len(rows))
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device), "past_key_values": cache}

    def batch(self, tokenizer: Any, rows: list[list[int]], prompts: list[str]) -> Any:
        """A batch's inputs: from the shared cache, or the prompts left-padded whole where nothing is shared."""
        if self.length:
            return self.inputs(rows, tokenizer.pad_token_id)
        return tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)


def render_prompts(tokenizer: Any, conversations: list[list[dict[str, str]]]) -> list[str]:
    return [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]


def _prompts(
    tokenizer: Any, conversations: list[list[dict[str, str]]], tools: list[str] | None
) -> tuple[list[str], list[list[int]]]:
    """The rendered prompts and their tokens (the tokenizer set to pad left); every tool set checked first."""
    prompts = render_prompts(tokenizer, conversations)
    if tools is not None:
        if len(tools) != len(prompts):
            raise ValueError(f"{len(tools)} tool sets for {len(prompts)} conversations")
        require_grammars(set(tools))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return prompts, [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]


def generate(
    model: Any,
    tokenizer: Any,
    conversations: list[list[dict[str, str]]],
    *,
    max_new_tokens: int = 96,
    batch_size: int = 8,
    latency_samples: int = 4,
    progress: Progress | None = None,
    label: str = "generating",
    tools: list[str] | None = None,
    temperature: float | None = None,
    seed: int = 0,
    share_prefix: bool = False,
) -> Generations:
    """Greedy decoding (deterministic) of every conversation's next assistant turn; with `temperature`,
    sampled from the whole distribution at that temperature (no top-k or top-p cut), seeded per batch from
    `seed`. With `tools` (one
    offered-tools JSON per conversation) each answer is decoded under its turn's tool-call grammar
    (`toolcall.grammar`); a tool set the grammar cannot express raises ToolsNotEnforceable (one line
    naming the tool) before any work. With `share_prefix`, the opening all prompts share is computed once
    (`SharedPrefix`); the latency sample never shares it."""
    import torch
    from transformers import LogitsProcessorList

    from pipelines.toolcall.grammar import ToolCallConstraint, answer_length

    prompts, token_ids = _prompts(tokenizer, conversations, tools)
    model.eval()
    texts: list[str] = [""] * len(prompts)
    prompt_tokens = [len(ids) for ids in token_ids]
    output_tokens = [0] * len(prompts)
    ended = [False] * len(prompts)
    task = progress.add_task(label, total=len(prompts)) if progress else None

    def run(
        batch: list[int], batch_tools: list[str] | None, shared: SharedPrefix
    ) -> tuple[list[str], list[int], list[bool]]:
        enc = shared.batch(tokenizer, [token_ids[j] for j in batch], [prompts[j] for j in batch])
        extra = (
            {"logits_processor": LogitsProcessorList([ToolCallConstraint(tokenizer, batch_tools)])}
            if batch_tools is not None
            else {}
        )
        sampling = {"do_sample": True, "temperature": temperature, **WHOLE} if temperature else {"do_sample": False}
        with torch.inference_mode():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                **sampling,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **extra,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        lengths = [answer_length(row, tokenizer.eos_token_id) for row in new.tolist()]
        return (
            tokenizer.batch_decode(new, skip_special_tokens=True),
            [n for n, _ in lengths],
            [ended for _, ended in lengths],
        )

    started = time.perf_counter()
    shared = SharedPrefix(model, token_ids if share_prefix else [])
    order = sorted(range(len(prompts)), key=lambda j: len(token_ids[j]))  # alike lengths batched: little padding
    for i in range(0, len(order), batch_size):
        if temperature:
            torch.manual_seed(seed * 100_003 + i)
        batch = order[i : i + batch_size]
        decoded, counts, done = run(batch, [tools[j] for j in batch] if tools is not None else None, shared)
        for j, text, n, end in zip(batch, decoded, counts, done):
            texts[j], output_tokens[j], ended[j] = text, n, end
        if progress is not None and task is not None:
            progress.advance(task, len(decoded))
    seconds = time.perf_counter() - started
    alone = SharedPrefix(model, [])  # one request as served: nothing shared
    latency = []
    timed = sorted(random.Random(0).sample(range(len(prompts)), min(latency_samples, len(prompts))))
    for j in timed:  # a stated random sample (seed 0), not the first requests in record order
        t0 = time.perf_counter()
        run([j], [tools[j]] if tools is not None else None, alone)
        latency.append((time.perf_counter() - t0) * 1000)
    return Generations(texts, prompt_tokens, output_tokens, round(seconds, 2), latency, ended, shared.length)


def target_logprobs(
    model: Any,
    tokenizer: Any,
    conversations: list[list[dict[str, str]]],
    targets: list[str],
    *,
    temperature: float = 1.0,
    batch_size: int = 4,
) -> list[float]:
    """log P(target, then the end token | conversation) under the model's next-token distribution at
    `temperature`, without the grammar: a lower bound on the probability under it, which only renormalizes
    over the answers it admits (a target the grammar admits keeps all of its mass)."""
    import torch

    prompts = render_prompts(tokenizer, conversations)
    out: list[float] = []
    model.eval()
    for i in range(0, len(prompts), batch_size):
        rows = []
        for p, t in zip(prompts[i : i + batch_size], targets[i : i + batch_size]):
            head = tokenizer(p, add_special_tokens=False).input_ids
            tail = tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            rows.append((head, tail))
        width = max(len(h) + len(t) for h, t in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (h, t) in enumerate(rows):  # left padding: every row ends at the last column
            seq = h + t
            ids[r, width - len(seq) :] = torch.tensor(seq)
            mask[r, width - len(seq) :] = 1
        with torch.inference_mode():
            positions_of = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
            device = getattr(model, "device", "cpu")
            logits = model(
                input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions_of.to(device)
            ).logits
        last = max(len(t) for _, t in rows) + 1  # only the answers' positions: not [rows, width, vocabulary] in fp32
        logp = torch.log_softmax(logits[:, -last:].float() / temperature, dim=-1).cpu()
        for r, (_, t) in enumerate(rows):
            n = len(t)
            positions = torch.arange(last - n - 1, last - 1)
            picked = logp[r, positions, torch.tensor(t)]
            out.append(float(picked.sum()))
    return out
