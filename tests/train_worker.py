"""Runs one tiny LoRA training in a subprocess (so a test can kill it mid-run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from train_data import examples, tiny_config, tiny_loader

if __name__ == "__main__":
    out, root, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    from pipelines.train.hf_backend import train_lora

    result = train_lora(examples(), tiny_config(max_steps=steps), out, tiny_loader(root))
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")
