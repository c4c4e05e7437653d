"""The cluster's training path without Kubernetes: the DAG's plan (`train_pods`, one pod per sweep
variant), each pod's own command run as a process with the pod's environment (what the kubelet would
start in the training image), then the `train` task collecting the variants from MLflow. Prints each
variant's wall time, tokens/s and validation scores, and the collected best.

Usage: .venv/bin/python bench/pods.py [--model tiny-llama] [--backend hf|nemo] [--steps 4]
                                     [--batch-size 4] [--learning-rates 5e-3,1e-2] [--root DIR]
On a GPU machine: --model llama-8b-shape-random --backend nemo (the training image's path: NeMo
AutoModel under torchrun). Uses the test suite's small generated training set (tests/train_data.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from train_data import write_training_set  # noqa: E402

from pipelines import tasks  # noqa: E402
from pipelines.config import load_settings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--backend", choices=["hf", "nemo"], default="hf")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rates", default="5e-3,1e-2")
    parser.add_argument("--root", default=None, help="default: a temporary folder")
    args = parser.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="bench-pods-")).resolve()
    write_training_set(root, records=600)
    sweep = root / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "pods",
                "backend": args.backend,
                "method": "grid",
                "prompt_style": "short",
                "train_examples": 64,
                "val_examples": 4,
                "base": {
                    "base_model": args.model,
                    "warmup_steps": 1,
                    "lora_rank": 16,
                    "lora_alpha": 32,
                    "batch_size": args.batch_size,
                    "max_steps": args.steps,
                    "max_seq_len": 512,
                    "checkpoint_every": 1000,
                },
                "grid": {"learning_rate": [float(x) for x in args.learning_rates.split(",")]},
            }
        )
    )
    cluster = load_settings(root=str(root), train={"runner": "kubernetes"})
    pods = tasks.train_pods(cluster, {"sweep": str(sweep)})
    print(f"plan: {len(pods)} pods ({args.model}, {args.backend}, {args.steps} steps, batch {args.batch_size})")
    env = {
        **os.environ,
        "FLYWHEEL_ROOT": str(root),
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    for pod in pods:  # the container's env: the pod trains its own variant
        container = pod["spec"]["containers"][0]
        env.update({e["name"]: e["value"] for e in container["env"] if e["name"] != "FLYWHEEL_TRAIN__NEMO_PYTHON"})
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *container["command"][1:]],
            env=env,
            cwd=str(root),
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"{pod['metadata']['name']} failed:\n{done.stderr[-4000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        m = result["metrics"]
        print(
            f"{pod['metadata']['name']:<40} {result['status']:<9} wall {wall:7.1f} s  "
            f"{m.get('tokens_per_s', 0):9.1f} tokens/s  loss {m.get('final_loss', 0):.3f}  "
            f"val exact {m.get('val_exact_match', 0):.3f}"
        )
    started = time.perf_counter()
    trained = tasks.train(cluster, {"sweep": str(sweep)})
    print(
        f"collected in {time.perf_counter() - started:.1f} s: best run {trained['best_run_id']} "
        f"(val exact {trained['metrics'].get('val_exact_match', 0):.3f}), adapter {trained['adapter_dir']}"
    )


if __name__ == "__main__":
    main()
