"""Schema-constrained tool calls: every answer is decoded under a grammar built from the offered tools.

The grammar (llguidance, compiled from one JSON Schema) admits exactly the answers a tool call may be:
`{"name":"<an offered tool>","arguments":{...}}` whose arguments follow that tool's JSON Schema (names,
types, enums, required fields; no other argument), or `{"name":null}` when no tool fits. Objects are
compact and their keys come in the order the models were trained to write them (`name` first, the
arguments sorted), so the constraint never fights what the adapter learned.

This module imports nothing from `pipelines`: the Triton model (`triton_backend/model.py`) loads it from its own
folder, next to `model.py`, in the serving environment; evaluation and the smoke test use the same code. A
schema llguidance cannot express raises `GrammarError` naming the tool: never a silent unconstrained decode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions
# the answer format of the training targets (toolcall.calls.call_text): compact JSON, no whitespace, so each
# call has exactly one admitted serialization (and no model can pad an answer with blanks)
_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}

# prep's PII redaction tokens (pipelines/redact.py; a test keeps the two lists equal): a redacted argument in the logs
# is `<EMAIL>`, which an email's pattern would reject, so a constrained string also admits them (learned from logs)
REDACTION_TOKENS = ("<EMAIL>", "<CARD>", "<PHONE>", "<ADDRESS>")
MAX_TOOLS_BYTES = 65_536  # a request's offered tools; more is refused before anything is compiled


def answer_length(tokens: list[int], end_ids: set[int] | int) -> tuple[int, bool]:
    """The one definition of an answer's length and of a cut answer, for evaluation, the sweep's validation
    and the Triton model alike: its tokens before the first end token (padding follows it in a batch,
    whatever the pad token is), and whether it had one. An answer without an end token ran the whole
    budget: it is cut, and its text may be an unfinished call."""
    ends = {end_ids} if isinstance(end_ids, int) else set(end_ids)
    first = next((i for i, token in enumerate(tokens) if token in ends), None)
    return (len(tokens), False) if first is None else (first, True)


class GrammarError(ValueError):
    """The offered tools cannot be turned into a grammar (a schema feature llguidance does not support)."""


class GroundingTooLarge(GrammarError):
    """The offered tools with their grounded ids would exceed MAX_TOOLS_BYTES."""


def _tool_entries(tools: Any) -> list[dict[str, Any]]:
    """`tools` (parsed) as [{name, parameters}]: the prompt's compact tools list or OpenAI tool specs
    ({"type": "function", "function": {...}})."""
    if not isinstance(tools, list):
        raise GrammarError("the offered tools must be a JSON list (empty: only abstention is possible)")
    out = []
    for t in tools:
        spec = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise GrammarError(f"an offered tool has no name: {str(t)[:80]}")
        params = spec.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise GrammarError(f"tool {spec['name']}: parameters must be a JSON Schema object")
        out.append({"name": spec["name"], "parameters": params})
    return out


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """An object schema with its properties in sorted order (the trained order) and no other keys
    admitted, recursively; other schemas unchanged."""
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") == "string" and ("pattern" in schema or "format" in schema):
        return {"anyOf": [schema, {"enum": list(REDACTION_TOKENS)}]}
    out = dict(schema)
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _closed(schema["properties"][k]) for k in sorted(schema["properties"])}
        out.setdefault("additionalProperties", False)
    if isinstance(schema.get("items"), dict):
        out["items"] = _closed(schema["items"])
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            out[key] = [_closed(s) for s in schema[key]]
    for key in ("$defs", "definitions"):  # what `$ref`s point at is closed and ordered like the rest
        if isinstance(schema.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in schema[key].items()}
    return out


_LITERALS = ("const", "enum", "default", "examples")  # values, not schemas: never rewritten


def _refs_moved(node: Any, prefix: str, top: bool = True) -> Any:
    """`node` with every local JSON-pointer `$ref` (`#` or `#/...`) moved under `prefix` (literal values
    untouched). The tool's own `$id` is dropped (its pointers now resolve inside the answer schema); a nested
    schema with its own `$id` is its own resource and keeps its pointers; anchors (`#name`) stay as they are."""
    if isinstance(node, list):
        return [_refs_moved(x, prefix, False) for x in node]
    if not isinstance(node, dict):
        return node
    if not top and "$id" in node:
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$id" and top:
            continue
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            out[key] = f"#{prefix}{value[1:]}"
        elif key in _LITERALS:
            out[key] = value
        elif key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _refs_moved(sub, prefix, False) for name, sub in value.items()}
        else:
            out[key] = _refs_moved(value, prefix, False)
    return out


def _arguments(index: int, params: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The `arguments` schema of the offered tool number `index`: its parameters closed and ordered. A schema
    with `$ref`s (to its `$defs`/`definitions`, or anywhere inside it) moves whole into the answer schema's
    `$defs` as `t<index>`, its pointers rewritten to match, so each resolves inside its own tool whatever
    the tools are named and however they name their definitions."""
    closed = _closed(params)
    if '"$ref"' not in json.dumps(params):
        return closed
    defs[f"t{index}"] = _refs_moved(closed, f"/$defs/t{index}")
    return {"$ref": f"#/$defs/t{index}"}


def _offer(tools: Any) -> tuple[list[dict[str, Any]], bool]:
    """(the offered tools, whether "no tool fits" is an answer). `tools` is a tools list (JSON or parsed), or
    `{"tools": [...], "abstain": false}` when a call is required (OpenAI's `tool_choice: required` or a named tool)."""
    if isinstance(tools, str):
        if len(tools.encode("utf-8")) > MAX_TOOLS_BYTES:
            raise GrammarError(f"the offered tools are {len(tools.encode('utf-8'))} bytes; at most {MAX_TOOLS_BYTES}")
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"the offered tools are not JSON: {exc}") from None
    if isinstance(tools, dict) and "tools" in tools:
        if not isinstance(tools.get("abstain", True), bool):
            raise GrammarError("`abstain` must be true or false")
        entries, abstain = _tool_entries(tools["tools"]), tools.get("abstain", True)
        if not entries and not abstain:
            raise GrammarError("a call is required but no tool is offered")
        return entries, abstain
    return _tool_entries(tools), True


def call_schema(tools: Any) -> dict[str, Any]:
    """The JSON Schema of one answer to a turn offering `tools` (see `_offer`)."""
    entries, abstain = _offer(tools)
    defs: dict[str, Any] = {}
    branches = [
        {
            "type": "object",
            "properties": {"name": {"const": t["name"]}, "arguments": _arguments(i, t["parameters"], defs)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, t in enumerate(entries)
    ]
    if abstain:
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"type": "null"}},
                "required": ["name"],
                "additionalProperties": False,
            }
        )
    return {"anyOf": branches, **({"$defs": defs} if defs else {})}


_STRING_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
_WORD = re.compile(r"[#\w][\w#\-./@+:]*")
MAX_GROUNDED_VALUES = 500  # the values one id argument may take; a longer conversation keeps the latest ones


def _id_like(word: str) -> bool:
    """A word that can be an identifier: one token (no blank) with a digit or a separator (`#W6067464`,
    `credit_card_4190576`, `P-PRO-ANNUAL`); plain words (`cancel`, `order`) and phrases (an address, a
    product variant's description) are not offered as ids."""
    return 0 < len(word) <= 64 and not any(c.isspace() for c in word) and any(c.isdigit() or c in "#_-" for c in word)


def conversation_values(texts: Iterable[str]) -> list[str]:
    """Every value a conversation states: the JSON string literals in its texts (a tool result's values, at
    any depth) and its id-like words (`#W6067464`, `credit_card_4190576`, `ORD-7F3K2`), trailing punctuation
    off; in order of appearance. Only id-like values (a digit or a separator): statuses, colours and names
    in a tool result are no ids, and would only bloat the grammar."""
    values: dict[str, None] = {}
    for text in texts:
        if not isinstance(text, str):
            continue
        for literal in _STRING_LITERAL.findall(text):
            try:
                value = json.loads(f'"{literal}"')
            except json.JSONDecodeError:
                continue
            if _id_like(value):
                values[value] = None
        for word in _WORD.findall(text):
            word = word.rstrip(".,;:!?)/")
            if word and _id_like(word):
                values[word] = None
    return list(values)


def _fits(value: str, schema: dict[str, Any]) -> bool:
    if "enum" in schema and value not in schema["enum"]:
        return False
    if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
        return False
    pattern = schema.get("pattern")
    try:
        return not pattern or re.search(pattern, value) is not None
    except re.error:
        return True  # a pattern Python cannot read: the grammar still enforces it


def _ground(params: dict[str, Any], arguments: Sequence[str], values: Sequence[str]) -> dict[str, Any] | None:
    """`params` with each id argument limited to the values the conversation states; None when a required
    id argument has none (the call would need an invented id)."""
    props = dict(params.get("properties") or {})
    required = set(params.get("required") or [])
    for arg in arguments:
        schema = props.get(arg)
        if not isinstance(schema, dict):
            continue
        many = schema.get("type") == "array" and isinstance(schema.get("items"), dict)
        scalar = schema["items"] if many else schema
        if scalar.get("type") not in ("string", None) or any(k in scalar for k in ("anyOf", "oneOf", "$ref")):
            continue  # not an id string: left as the schema says
        allowed = [v for v in values if _fits(v, scalar)][-MAX_GROUNDED_VALUES:]
        if not allowed:
            if arg in required:
                return None
            del props[arg]
            continue
        grounded = {"type": "string", "enum": allowed}
        props[arg] = {**schema, "items": grounded} if many else grounded
    return {**params, "properties": props}


def ground_ids(tools: Any, writes: Mapping[str, Sequence[str]], values: Sequence[str]) -> str:
    """The offered tools (as `_offer` takes them) with every identifier argument of a write tool (`writes`:
    tool -> its id arguments) limited to `values`, the ones the conversation states: under the grammar a
    write cannot target an order, invoice or item nobody mentioned. A write tool whose required id has no
    such value is not offered (no call to it can be right). Returns the same shape as JSON."""
    entries, abstain = _offer(tools)
    kept = []
    for t in entries:
        if t["name"] not in writes:
            kept.append(t)
            continue
        params = _ground(t["parameters"], writes[t["name"]], values)
        if params is not None:  # descriptions mean nothing to the grammar: left out of a per-turn tools JSON
            kept.append({"name": t["name"], "parameters": _without(params, {"description"})})
    if not kept and not abstain:
        raise GrammarError(
            "a call is required, but every offered write tool needs an id the conversation does not state"
        )
    out = json.dumps(
        {"tools": kept, "abstain": abstain} if not abstain or isinstance(tools, dict) else kept,
        separators=(",", ":"),
        sort_keys=True,
    )
    if len(out.encode("utf-8")) > MAX_TOOLS_BYTES:
        raise GroundingTooLarge(
            f"the offered tools with their grounded ids are {len(out.encode('utf-8'))} bytes; at most "
            f"{MAX_TOOLS_BYTES} (triton.grounded_ids: false decodes such conversations ungrounded)"
        )
    return out


_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")


def _without(schema: Any, keys: set[str]) -> Any:
    """`schema` with the keywords `keys` removed wherever they occur (property names are kept)."""
    if isinstance(schema, list):
        return [_without(s, keys) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in keys:
            continue
        if k in ("properties", "$defs", "definitions", "patternProperties") and isinstance(v, dict):
            out[k] = {name: _without(sub, keys) for name, sub in v.items()}
        else:
            out[k] = _without(v, keys)
    return out


@lru_cache(maxsize=1024)
def enforceable(parameters_json: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the largest part of a tool's parameters schema the grammar enforces, the keywords it leaves out):
    a keyword llguidance does not implement (`uniqueItems`, `not`, `contains`, `if`/`then`, ...) is dropped
    where it occurs and checked after decoding instead (the gateway validates every call against the whole
    schema). Raises GrammarError when the schema still cannot be compiled."""
    from llguidance import LLMatcher

    params = json.loads(parameters_json)
    dropped: list[str] = []
    for _ in range(8):
        try:  # a value llguidance cannot hold (an integer past 64 bits) is a ValueError: no grammar
            error = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(_closed(params), defaults=_OPTIONS))
        except ValueError as exc:
            raise GrammarError(" ".join(str(exc).split())) from None
        if not error:
            return params, tuple(sorted(dropped))
        found = _UNIMPLEMENTED.search(error)
        keys = {k.strip().strip('"') for k in found.group(1).split(",")} if found else set()
        keys -= {"type", "properties", "required", "items", "enum", "const", "anyOf"}
        if not keys:
            raise GrammarError(" ".join(error.split()))  # one line: llguidance's own message spans several
        dropped += sorted(keys)
        params = _without(params, keys)
    raise GrammarError(f"still not enforceable after leaving out {', '.join(dropped)}")


def partly_constrained(tools: Any) -> dict[str, list[str]]:
    """Offered tool -> the schema keywords the grammar leaves out (only tools with some)."""
    out = {}
    for t in _offer(tools)[0]:
        try:
            _, dropped = enforceable(json.dumps(t["parameters"], sort_keys=True))
        except GrammarError:
            continue
        if dropped:
            out[t["name"]] = list(dropped)
    return out


def constraint(name: str, parameters: dict[str, Any] | None) -> str:
    """How far the grammar constrains one tool's calls: `fully`, `partly (checked after decoding: ...)`, or
    `no: <why>` (a schema it cannot compile: a request offering the tool is refused). Compiled as a request
    offering it compiles it, inside the answer schema."""
    try:
        _, dropped = enforceable(json.dumps(parameters or {}, sort_keys=True))
        grammar_for(json.dumps([{"name": name, "parameters": parameters or {}}]))
    except (GrammarError, ValueError) as exc:  # ValueError: parameters that are no schema object at all
        return f"no: {exc}"
    return f"partly (checked after decoding: {', '.join(dropped)})" if dropped else "fully"


@lru_cache(maxsize=1024)
def grammar_for(tools_json: str) -> str:
    """The llguidance grammar of the answers to a turn offering these tools (cached per tool set). A
    keyword the grammar cannot express is left out of that tool's grammar (`enforceable`); a schema that
    still cannot be compiled raises GrammarError naming the tool."""
    from llguidance import LLMatcher

    entries, abstain = _offer(tools_json)
    relaxed = []
    for t in entries:  # each tool alone first, so the error names the schema at fault
        try:
            params, _ = enforceable(json.dumps(t["parameters"], sort_keys=True))
        except GrammarError as exc:
            raise GrammarError(f"tool {t['name']}: its parameters schema cannot be enforced: {exc}") from None
        relaxed.append({"name": t["name"], "parameters": params})
    grammar = LLMatcher.grammar_from_json_schema(call_schema({"tools": relaxed, "abstain": abstain}), defaults=_OPTIONS)
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(f"the offered tools cannot be enforced together: {error}")
    return grammar


def accepts(tokenizer: Any, tools_json: str, text: str) -> bool:
    """Whether `text` is a complete answer the grammar admits (tests and diagnostics)."""
    matcher = _matcher(_llg_tokenizer(tokenizer), grammar_for(tools_json))
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return matcher.consume_tokens(ids) and matcher.is_accepting()


_TOKENIZERS: list[tuple[Any, Any]] = []  # (HF tokenizer, its llguidance view): a process holds one or two


def _llg_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of a Hugging Face fast tokenizer (about a second to build: cached by identity;
    the cache holds the tokenizer itself, so an id is never reused for another vocabulary)."""
    for known, view in _TOKENIZERS:
        if known is tokenizer:
            return view
    import llguidance.hf

    view = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    _TOKENIZERS.append((tokenizer, view))
    del _TOKENIZERS[:-4]
    return view


def prepare(tokenizer: Any) -> None:
    """Build the tokenizer's llguidance view now (a server does it at load, not on its first request)."""
    _llg_tokenizer(tokenizer)


def _matcher(llg_tokenizer: Any, grammar: str) -> Any:
    from llguidance import LLMatcher

    matcher = LLMatcher(llg_tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise GrammarError(matcher.get_error())
    return matcher


class ToolCallConstraint:
    """A transformers logits processor that keeps each row of a (left-padded) batch inside its own
    turn's grammar: `tools` holds one tools JSON per row, or None for a row decoded freely. A row whose
    grammar is complete may only end (EOS); a row that already ended is left alone."""

    def __init__(self, tokenizer: Any, tools: Sequence[str | None]):
        llg = _llg_tokenizer(tokenizer)
        self.matchers = [_matcher(llg, grammar_for(t)) if t is not None else None for t in tools]
        self.eos = tokenizer.eos_token_id
        self.prompt_length: int | None = None
        self.done = [False] * len(tools)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np
        import torch

        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        fresh = input_ids.shape[1] > self.prompt_length
        vocab = scores.shape[1]
        for i, matcher in enumerate(self.matchers):
            if matcher is None or self.done[i]:
                continue
            if fresh:
                last = int(input_ids[i, -1])
                if last == self.eos or matcher.is_stopped():
                    self.done[i] = True
                    continue
                matcher.consume_token(last)
            allowed = np.zeros(vocab, dtype=bool)
            if matcher.is_error():  # cannot happen under the mask; end the row rather than decode freely
                self.done[i] = True
                allowed[self.eos] = True
            else:
                bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
                n = min(vocab, bits.size)
                allowed[:n] = bits[:n].astype(bool)
                if matcher.is_accepting():
                    allowed[self.eos] = True
            scores[i, torch.from_numpy(~allowed)] = float("-inf")
        return scores
