"""In-context examples for the base model, chosen by MiniLM embedding similarity to the request.

The baseline must be the strongest prompt we can build, so the pool holds every turn of the training
conversations, not only single-turn ones: a retail agent's writes come after lookups, and a pool of first
turns would show the base model lookups only. A shot is its conversation's opening request, its latest
exchange (the call before and the tool result it answers) and its call. The k shots of a request are its k
most similar pool examples with k different expected tools (the nearest example of each tool), so the
model sees the neighbouring tools side by side, as the tuned model learned them.
"""

from __future__ import annotations

from typing import Any

from pipelines.toolcall.examples import Example

SHOT_HISTORY = 2  # turns of a shot's history kept after its opening request (its latest call and result)
SHOT_TURN_CHARS = 600  # a shot's history turn at most (a product's variants run to thousands: the prompt must fit)


def shot_pool(examples: list[Example]) -> list[Example]:
    """Pool candidates: every turn of the training conversations (first turns and later ones alike)."""
    return list(examples)


def retrieval_key(example: Example) -> str:
    """What a request is matched on: its opening user message and, in a later turn, its latest one."""
    users = [t["content"] for t in example.turns[1:] if t["role"] == "user"]
    if not users:
        return example.query
    return users[0] if len(users) == 1 else f"{users[0]}\n{users[-1]}"[:2000]


def shot_turns(example: Example) -> list[dict[str, str]]:
    """One demonstration: the opening request, the latest exchange before the call, then the call."""
    conversation = example.turns[1:]
    opening, rest = conversation[:1], conversation[1:]
    history = [
        {
            **t,
            "content": t["content"]
            if len(t["content"]) <= SHOT_TURN_CHARS
            else t["content"][:SHOT_TURN_CHARS] + " ...",
        }
        for t in rest[-SHOT_HISTORY:]
    ]
    return [*opening, *history, {"role": "assistant", "content": example.target}]


def pick(similarity: Any, pool: list[Example], query: Example, k: int) -> list[Example]:
    """The k most similar pool examples with k different expected tools (fewer when the pool has fewer)."""
    chosen: list[Example] = []
    tools: set[str] = set()
    for i in similarity.argsort()[::-1]:
        candidate = pool[int(i)]
        if candidate.record_id == query.record_id or candidate.tool in tools:
            continue
        chosen.append(candidate)
        tools.add(candidate.tool)
        if len(chosen) == k:
            break
    return chosen


def with_shots(
    queries: list[Example], pool: list[Example], k: int, pool_vectors: Any = None
) -> list[list[dict[str, str]]]:
    """Each query's conversation with its k shots inserted after the system prompt as earlier exchanges
    (the usual chat few-shot layout), the most similar next to the request. `pool_vectors`: the pool's
    embeddings when the caller keeps them (a server embeds its pool once, not per request)."""
    from pipelines.embeddings import embed

    if k <= 0 or not pool:
        return [q.turns for q in queries]
    if pool_vectors is None:
        pool_vectors = embed([retrieval_key(p) for p in pool])
    query_vectors = embed([retrieval_key(q) for q in queries])
    similarity = query_vectors @ pool_vectors.T
    conversations = []
    for q, row in zip(queries, similarity):
        shots = [turn for p in reversed(pick(row, pool, q, k)) for turn in shot_turns(p)]
        conversations.append([q.turns[0], *shots, *q.turns[1:]])
    return conversations
