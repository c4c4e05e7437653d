"""CPU adaptation for running NeMo AutoModel's fine-tuning recipe without a GPU (tests, laptops).

The recipe's LoRA, optimizer, scheduler, data and checkpoint components run on CPU; a few calls
assume CUDA (peak-memory statistics, `torch.cuda.*` bookkeeping). This shim turns those into
CPU no-ops and then runs the unmodified recipe module. On GPU nodes the recipe runs as is
(`torchrun -m nemo_automodel.recipes.llm.train_ft`). Runs inside the NeMo environment: it imports
only torch and nemo_automodel.
"""

from __future__ import annotations

import runpy
import sys

RECIPE = "nemo_automodel.recipes.llm.train_ft"


def patch_cuda_for_cpu() -> None:
    import torch

    if torch.cuda.is_available():
        return

    def returning(value: object):  # one function object per name: torch.compile's rule map needs them distinct
        return lambda *a, **k: value

    for name in (
        "reset_peak_memory_stats",
        "synchronize",
        "empty_cache",
        "set_device",
        "reset_accumulated_memory_stats",
    ):
        setattr(torch.cuda, name, returning(None))
    for name in (
        "max_memory_allocated",
        "max_memory_reserved",
        "memory_allocated",
        "memory_reserved",
        "current_device",
    ):
        setattr(torch.cuda, name, returning(0))
    torch.cuda.memory_stats = returning({})

    # The model builder passes torch.device("cuda", ...) to its infrastructure helpers: use the CPU.
    from nemo_automodel._transformers import auto_model

    for name in ("instantiate_infrastructure", "apply_model_infrastructure"):
        setattr(auto_model, name, _on_cpu(getattr(auto_model, name)))


def _on_cpu(fn):
    import functools

    import torch

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        return fn(*args, **kwargs)

    return wrapper


def main(argv: list[str]) -> None:
    patch_cuda_for_cpu()
    sys.argv = [RECIPE, *argv]
    runpy.run_module(RECIPE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
