"""Decoding (pipelines.toolcall.decode): the opening a call's requests share, computed once."""

from __future__ import annotations

import pytest
from test_tool_grammar import BOUNDED

from pipelines.base_models import load_base
from pipelines.config import load_settings
from pipelines.toolcall.decode import generate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return load_base("tiny-llama", load_settings(root=str(tmp_path_factory.mktemp("decode"))))


def test_a_shared_opening_computed_once_decodes_what_each_whole_prompt_decodes(tiny) -> None:
    """The batched pass prefills the opening every prompt shares once and decodes each batch from a copy of its
    cache: the answers, token counts and cuts are the unshared pass's, free and under the grammar, in full
    batches and a short last one, with rows of different lengths (padding between the opening and a row).
    Sampled with the same seeds (an untrained model's greedy answers are all alike): a token drawn from a
    distribution that saw other positions or other tokens would differ."""
    from pipelines.toolcall.decode import MIN_SHARED_PREFIX, shared_prefix_length

    model, tok = tiny
    system = "You route requests to tools. " + " ".join(f"Tool {i} tracks parcel {i} by carrier." for i in range(12))
    asks = ("where is my parcel", "refund ORD-1234 please, it never came", "hello", "track it with dhl", "days 4")
    requests = [[{"role": "system", "content": system}, {"role": "user", "content": a}] for a in asks]
    for tools in (None, [BOUNDED] * len(requests)):
        kwargs = {"max_new_tokens": 24, "batch_size": 2, "latency_samples": 0, "tools": tools, "temperature": 1.0}
        whole = generate(model, tok, requests, share_prefix=False, **kwargs)
        shared = generate(model, tok, requests, share_prefix=True, **kwargs)
        assert shared.shared_prefix_tokens >= MIN_SHARED_PREFIX and whole.shared_prefix_tokens == 0
        assert shared.stats()["shared_prefix_tokens"] == shared.shared_prefix_tokens
        assert len(set(whole.texts)) > 1  # the answers depend on each row's own tokens
        assert (shared.texts, shared.output_tokens, shared.ended) == (whole.texts, whole.output_tokens, whole.ended)
        assert shared.prompt_tokens == whole.prompt_tokens
    # the next-token distributions themselves, step by step: those of the unshared batch
    import torch

    from pipelines.toolcall.decode import SharedPrefix, render_prompts

    prompts = render_prompts(tok, requests)
    rows = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    common = {"max_new_tokens": 4, "do_sample": False, "output_logits": True, "return_dict_in_generate": True}
    with torch.inference_mode():
        mine = model.generate(**SharedPrefix(model, rows).inputs(rows, tok.pad_token_id), **common)
        plain = model.generate(**tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False), **common)
    mine_logits, plain_logits = torch.stack(mine.logits), torch.stack(plain.logits)
    torch.testing.assert_close(mine_logits, plain_logits, atol=1e-5, rtol=1e-4)
    assert (plain_logits[0, 0] - plain_logits[0, 1]).abs().max() > 1e-3  # rows' own tokens move the distribution
    # a short common opening is left to each batch's prefill; every row keeps a token of its own
    short = generate(
        model,
        tok,
        [[{"role": "user", "content": a}] for a in asks],
        max_new_tokens=4,
        latency_samples=0,
        share_prefix=True,
    )
    assert short.shared_prefix_tokens == 0
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert shared_prefix_length([[1, 2, 3]]) == 0


def test_a_model_whose_cache_is_not_plain_shares_nothing_and_decodes_as_before(tiny) -> None:
    """A sliding window counts cache slots (the padding after the shared opening would use them up) and a cache
    `generate` builds itself cannot be handed in: such models prefill every request whole (mutation: the
    `_plain_cache` check answering True)."""
    from transformers import MistralConfig
    from transformers.cache_utils import DynamicCache

    from pipelines.toolcall.decode import SharedPrefix, _plain_cache

    model, tok = tiny
    window = MistralConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=128, sliding_window=16)  # fmt: skip
    assert not _plain_cache(model, DynamicCache(config=window))
    rows = [[1] * 40 + [2], [1] * 40 + [3, 4]]
    assert SharedPrefix(model, rows).length == 40
    before = model.generation_config.cache_implementation
    model.generation_config.cache_implementation = "static"
    try:
        assert SharedPrefix(model, rows).length == 0
    finally:
        model.generation_config.cache_implementation = before


def test_requests_are_batched_by_length_and_answered_in_the_callers_order(tiny) -> None:
    """The batched pass sorts the requests by prompt length; each answer still lands at its own request: every
    row may call only its own tool, so an answer put at another row names another row's tool (mutation: the
    answers written back in the sorted order)."""
    import json

    model, tok = tiny
    names = ["a", "lookup_the_order_now", "x_y", "find_all_of_the_products_here", "zz", "cancel"]  # unequal lengths
    tools = [json.dumps([{"name": n, "parameters": {"type": "object", "properties": {}}}]) for n in names]
    lengths = (9, 1, 14, 3, 6, 11)  # sorted: 1, 3, 6, 9, 11, 14 (every row moves)
    requests = [[{"role": "user", "content": " ".join(["word"] * k)}] for k in lengths]
    out = generate(model, tok, requests, max_new_tokens=24, batch_size=2, latency_samples=0, tools=tools)
    called = [json.loads(t)["name"] for t in out.texts]
    assert all(c in (None, own) for c, own in zip(called, names)), called
    assert sum(c is not None for c in called) >= 2, called  # the check is not vacuous: rows did call their tool
    # each request's own answer, length and end: those of the request decoded alone
    for request, offered, text, n, end in zip(requests, tools, out.texts, out.output_tokens, out.ended):
        alone = generate(model, tok, [request], max_new_tokens=24, latency_samples=0, tools=[offered])
        assert (alone.texts[0], alone.output_tokens[0], alone.ended[0]) == (text, n, end)


@pytest.mark.parametrize("share", [True, False])
def test_the_sweeps_validation_decodes_as_evaluation_share_prefix_says(tmp_path, monkeypatch, share: bool) -> None:
    """The sweep's validation passes `evaluation.share_prefix` to the decoder (mutation: the argument left out,
    so the decoder's default, off, applies whatever the setting says)."""
    from pipelines import base_models
    from pipelines.toolcall import decode
    from pipelines.toolcall.decode import Generations
    from pipelines.toolcall.examples import Example
    from pipelines.train.sweep_results import validation_metrics

    seen: list[bool] = []

    def decoder(model, tokenizer, conversations, **kwargs) -> Generations:
        seen.append(kwargs.get("share_prefix", False))
        return Generations(['{"name": null}'] * len(conversations), [1] * len(conversations), [1], 0.0, [])

    monkeypatch.setattr(base_models, "load_as_served", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(decode, "generate", decoder)
    settings = load_settings(root=str(tmp_path), evaluation={"share_prefix": share})
    val = [Example("r1", [{"role": "user", "content": "hi"}], '{"name": null}', "none", "hi", "[]")]
    metrics = validation_metrics(settings, "tiny-llama", str(tmp_path / "adapter"), val, 16)
    assert seen == [share] and metrics["val_exact_match"] == 1.0
