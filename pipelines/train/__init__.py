"""LoRA fine-tuning: base-model catalogue, training backends (NeMo AutoModel, HF PEFT), sweeps."""
