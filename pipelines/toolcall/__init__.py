"""The tool-call contract, low in the layers: every stage that builds a prompt, writes, decodes, parses or
scores a call imports it from here, and it imports no stage (only `logs.tools`, the tool catalogue).

- `calls`: the answer format (`call_text`, `target_json`, `parse_call`, `NO_TOOL`)
- `prompt`: the prompt styles (full, short, names), chat turns, the customer context line
- `examples`: curated rows as chat examples in a prompt style
- `fewshot`: the base model's retrieved in-context examples
- `grammar`: the JSON-Schema grammar constrained decoding uses (imports nothing from `pipelines`:
  copied beside the Triton model); `answers`: an answer's length and whether it was cut (likewise)
- `decode`: batched greedy decoding under the grammar (evaluation and the sweep's validation)
- `score`: function-calling metrics of a call against the expected one
"""
