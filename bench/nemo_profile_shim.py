"""Runs inside the NeMo environment for bench/nemo_bf16.py: NeMo AutoModel's fine-tuning recipe on CPU (the
`pipelines.train.nemo_cpu` adaptation), each optimizer step timed, the steps after the first `--skip` run under
torch.profiler; per-op CPU times summed over the profiled steps and written as JSON to `--out`.

Usage (bench/nemo_bf16.py builds it): python bench/nemo_profile_shim.py --out ops.json --skip 2 --config r.yaml
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> None:
    out, skip = argv[argv.index("--out") + 1], int(argv[argv.index("--skip") + 1])
    config = argv[argv.index("--config") + 1]
    from torch.profiler import ProfilerActivity, profile

    from pipelines.train.nemo_cpu import RECIPE, patch_cuda_for_cpu

    patch_cuda_for_cpu()
    from nemo_automodel.recipes.llm import train_ft

    recipe = train_ft.TrainFinetuneRecipeForNextTokenPrediction
    original = recipe._run_train_optim_step
    state: dict = {"step_seconds": [], "profiled_steps": 0, "ops": {}}

    def step(self, batches, max_grad_norm=None):  # noqa: ANN001, ANN202 (the recipe's own signature)
        if len(state["step_seconds"]) < skip:
            started = time.perf_counter()
            result = original(self, batches, max_grad_norm)
            state["step_seconds"].append(round(time.perf_counter() - started, 4))
            return result
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            result = original(self, batches, max_grad_norm)
            state["step_seconds"].append(round(time.perf_counter() - started, 4))  # the step, not the aggregation
        state["profiled_steps"] += 1
        for event in prof.key_averages():
            op = state["ops"].setdefault(event.key, {"self_us": 0.0, "total_us": 0.0, "calls": 0})
            op["self_us"] += event.self_cpu_time_total
            op["total_us"] += event.cpu_time_total
            op["calls"] += event.count
        return result

    recipe._run_train_optim_step = step
    sys.argv = [RECIPE, "--config", config]
    try:
        train_ft.main(config)
    finally:
        partial = f"{out}.{os.getpid()}.tmp"
        with open(partial, "w") as handle:
            json.dump(state, handle)
        os.replace(partial, out)


if __name__ == "__main__":
    main(sys.argv[1:])
