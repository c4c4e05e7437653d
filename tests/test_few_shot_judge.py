"""The baseline's few shots (retrieved by similarity, later turns with their history, one shot per tool) and the
LLM judge through an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
from pathlib import Path


def test_few_shot_retrieval_picks_similar_requests() -> None:
    from pipelines.toolcall.examples import Example
    from pipelines.toolcall.fewshot import with_shots

    def ex(i: str, text: str, tool: str) -> Example:
        return Example(
            i,
            [{"role": "system", "content": "S"}, {"role": "user", "content": text}],
            json.dumps({"name": tool, "arguments": {}}),
            tool,
            text,
            "[]",
        )

    pool = [
        ex("a", "where is my parcel 1Z999 with UPS", "track_shipment"),
        ex("b", "cancel my subscription I-123", "cancel_subscription"),
        ex("c", "show red running shoes under 80 EUR", "search_products"),
    ]
    query = ex("q", "track package 1Z555 (UPS)", "track_shipment")
    conversation = with_shots([query], pool, 1)[0]
    assert [t["role"] for t in conversation] == ["system", "user", "assistant", "user"]
    assert conversation[1]["content"] == pool[0].query and conversation[-1]["content"] == query.query


def test_few_shot_pool_holds_later_turns_with_their_history_and_one_shot_per_tool() -> None:
    """The strongest baseline: a write that follows a lookup is a candidate shot (with the lookup and its
    result), and the k shots show k different tools rather than k copies of the nearest one."""
    from pipelines.toolcall.examples import Example
    from pipelines.toolcall.fewshot import shot_pool, with_shots

    system = {"role": "system", "content": "S"}
    ask = {"role": "user", "content": "Cancel order #W1, I no longer need it."}
    lookup_call = '{"name":"get_order_details","arguments":{"order_id":"#W1"}}'
    looked = [
        system,
        ask,
        {"role": "assistant", "content": lookup_call},
        {"role": "user", "content": 'Tool result: {"order_id":"#W1","status":"pending"}'},
    ]
    cancel = Example(
        "w1-1",
        looked,
        '{"name":"cancel_pending_order","arguments":{"order_id":"#W1"}}',
        "cancel_pending_order",
        looked[-1]["content"],
        "[]",
    )
    first = Example("w1-0", [system, ask], lookup_call, "get_order_details", ask["content"], "[]")
    other = Example(
        "w2-0",
        [system, {"role": "user", "content": "Cancel order #W2, no longer needed."}],
        '{"name":"get_order_details","arguments":{"order_id":"#W2"}}',
        "get_order_details",
        "Cancel order #W2, no longer needed.",
        "[]",
    )
    pool = shot_pool([first, cancel, other])
    assert cancel in pool, "a later turn (a write after its lookup) is a candidate"
    query = Example(
        "q",
        [system, {"role": "user", "content": "Please cancel #W7, I do not need it any more."}],
        "{}",
        "cancel_pending_order",
        "Please cancel #W7, I do not need it any more.",
        "[]",
    )
    conversation = with_shots([query], pool, 2)[0]
    calls = [t["content"] for t in conversation if t["role"] == "assistant"]
    named = [json.loads(c)["name"] for c in calls]
    assert sorted(set(named) - {"get_order_details"}) == ["cancel_pending_order"]
    assert named.count("get_order_details") == 2, "the cancel shot's own lookup, and one lookup shot (not two)"
    at = calls.index(cancel.target)
    assert calls[at - 1] == lookup_call, "the write's shot carries the lookup before it"


def test_llm_judge_scores_through_an_openai_compatible_endpoint(tmp_path: Path) -> None:
    """A local stand-in for a remote OpenAI-compatible endpoint (none can be reached here)."""
    import http.server
    import threading

    from pipelines.config import load_settings
    from pipelines.evaluate.judge import judge_scores

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        """The stand-in for the judge model's remote OpenAI-compatible `/v1/chat/completions`. No test reaches
        the real judge: a hosted model behind a cloud API cannot run here."""

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            answer = "8" if "get_order" in body["messages"][0]["content"].split("Predicted call:")[1] else "no idea"
            data = json.dumps({"choices": [{"message": {"content": answer}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        judged = load_settings(
            root=str(tmp_path),
            evaluation={
                "judge_url": f"http://127.0.0.1:{server.server_port}/v1",
                "judge_model": "m",
                "judge_api_key": "k",
            },
        )
        scores = judge_scores(
            judged,
            [
                ("where is ORD-1", '{"name":"get_order"}', '{"name":"get_order"}'),
                ("where is ORD-1", '{"name":"get_order"}', '{"name":"list_invoices"}'),
            ],
        )
    finally:
        server.shutdown()
    assert scores == [0.8, None]
    assert seen[0][0] == "/v1/chat/completions" and seen[0][1] == "Bearer k" and seen[0][2]["model"] == "m"
