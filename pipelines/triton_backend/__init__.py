"""What runs inside Triton's Python backend, copied verbatim into the model repository (imports nothing from
`pipelines`): the model, the adapter cache, batched LoRA."""
