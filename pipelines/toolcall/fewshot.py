"""In-context examples for the base model, chosen by MiniLM embedding similarity to the request."""

from __future__ import annotations

from typing import Any

from pipelines.toolcall.examples import Example


def single_turn(examples: list[Example]) -> list[Example]:
    """Pool candidates: one user message and its call (a short, self-contained demonstration)."""
    return [e for e in examples if len(e.turns) == 2]


def with_shots(queries: list[Example], pool: list[Example], k: int, pool_vectors: Any = None) -> list[list[dict[str, str]]]:
    """Each query's conversation with its k most similar pool examples inserted after the system prompt
    as earlier user/assistant exchanges (the usual chat few-shot layout). `pool_vectors`: the pool's
    embeddings when the caller keeps them (a server embeds its pool once, not per request)."""
    from pipelines.embeddings import embed

    if k <= 0 or not pool:
        return [q.turns for q in queries]
    if pool_vectors is None:
        pool_vectors = embed([p.query for p in pool])
    query_vectors = embed([q.query for q in queries])
    similarity = query_vectors @ pool_vectors.T
    conversations = []
    for q, row in zip(queries, similarity):
        chosen = [pool[i] for i in row.argsort()[::-1] if pool[i].record_id != q.record_id][:k]
        shots = [turn for p in reversed(chosen)  # the most similar example sits next to the request
                 for turn in ({"role": "user", "content": p.query}, {"role": "assistant", "content": p.target})]
        conversations.append([q.turns[0], *shots, *q.turns[1:]])
    return conversations
