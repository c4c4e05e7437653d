"""Hardware table: peak dense bf16 FLOP/s, memory bandwidth and an on-demand $/hour per device, each
price with its source and the date it was read (`price_source`, `price_date`; reports show both).

Peaks are datasheet figures (dense, no sparsity). Prices are list prices that change and differ per
contract and cloud: override any field with the setting `bench.hardware` (name -> fields, e.g. your
negotiated rate and where it comes from). Used to turn measured tokens/s into
utilization (MFU) and $ per million requests. On one device, cost per request is $/hour divided by
requests per hour: a cost change between two models on the same device restates their throughput
change; it differs only between devices (the GPU table).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_bf16_flops: float  # dense, FLOP/s
    memory_bandwidth: float  # bytes/s
    usd_per_hour: float
    price_source: str = "not stated"
    price_date: str = ""


_GPU_PRICE = (
    "per-GPU-hour list-price estimate for on-demand cloud capacity (no quote behind it); set your "
    "contract's rate with the setting bench.hardware"
)
DEFAULTS: dict[str, Hardware] = {
    # this 2-core Sapphire Rapids machine (AVX-512 BF16, AMX) priced as the nearest cloud instance with its
    # cores and memory class: AWS EC2 r7i.large (2 vCPU, 16 GiB), Linux on-demand, us-east-1
    "cpu-2core": Hardware(
        "cpu-2core", 0.2e12, 20e9, 0.1323, "AWS EC2 on-demand price list, r7i.large, Linux, us-east-1", "2025-06"
    ),
    "h100": Hardware("h100", 989e12, 3.35e12, 3.00, _GPU_PRICE, "2026-11"),  # H100 SXM 80 GB
    "h200": Hardware("h200", 989e12, 4.8e12, 3.80, _GPU_PRICE, "2026-11"),  # H200 SXM 141 GB
    "b200": Hardware("b200", 2250e12, 8.0e12, 6.00, _GPU_PRICE, "2026-11"),  # B200 180 GB
}


def table(overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Hardware]:
    """The defaults, with `overrides` (the setting `bench.hardware`: name -> fields) applied."""
    rows = dict(DEFAULTS)
    for name, fields in (overrides or {}).items():
        base = rows.get(name, Hardware(name, 0.0, 0.0, 0.0))
        rows[name] = replace(base, **fields)
    return rows


def detect(overrides: dict[str, dict[str, Any]] | None = None) -> Hardware:
    """The row for the accelerator this process sees (the GPU's name decides), else the CPU row."""
    rows = table(overrides)
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0).lower()
            for key in ("b200", "h200", "h100"):
                if key in name:
                    return rows[key]
            return Hardware(name, 0.0, 0.0, 0.0)
    except ImportError:
        pass
    return rows["cpu-2core"] if (os.cpu_count() or 1) <= 2 else Hardware(platform.machine(), 0.0, 0.0, 0.0)


def training_flops_per_token(non_embedding_params: int) -> float:
    """LoRA fine-tuning: forward (2N) plus the backward pass through the frozen weights for the activation
    gradients (2N); frozen weights need no weight gradients, and the adapters' own FLOPs are negligible."""
    return 4.0 * non_embedding_params


def mfu(tokens_per_s: float, flops_per_token: float, hardware: Hardware) -> float | None:
    """Model FLOPs utilization against the datasheet peak, or None where the peak is unknown."""
    if hardware.peak_bf16_flops <= 0:
        return None
    return tokens_per_s * flops_per_token / hardware.peak_bf16_flops


def usd_per_million(requests_per_s: float, hardware: Hardware) -> float | None:
    """Cost of a million requests at the measured throughput on one such device."""
    if requests_per_s <= 0 or hardware.usd_per_hour <= 0:
        return None
    return hardware.usd_per_hour / 3600.0 / requests_per_s * 1e6


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bf16 matmul units


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 matmuls in hardware (AVX-512 BF16 or AMX). Without them torch emulates
    bf16 on CPU, many times slower than fp32, so a `bf16` setting computes in fp32 there. Unreadable: False."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[-1].split()}
    return any(f in flags for f in BF16_FLAGS)


def bf16_usable(asked: str, what: str) -> bool:
    """Whether a bf16 setting (`asked`) computes in bf16 on this CPU; without bf16 units, one warning and fp32."""
    if cpu_has_bf16():
        return True
    import logging

    logging.getLogger("flywheel").warning(
        "%s: this CPU has no bf16 units (AVX-512 BF16 or AMX); %s in fp32 (emulated bf16 is many times slower)",
        asked,
        what,
    )
    return False


def release_freed_memory() -> bool:
    """Hand the memory the C heap holds but no longer uses back to the system (glibc's `malloc_trim`); False where
    there is no glibc. A training step on the CPU frees many mid-sized activation buffers of a different size each
    step: glibc keeps them, so without this a long preference run's resident memory grows until the system kills
    it (bench/tune_retail.py's DPO step on tau-bench retail was)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    """glibc's `malloc_trim` from the running process, resolved once; None without it (musl, macOS, no ctypes)."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def cpu_model() -> str:
    """The CPU's model name (`lscpu`), else the architecture: what a results file names as its machine."""
    import subprocess

    try:
        found = subprocess.run(["lscpu"], capture_output=True, text=True, check=False, timeout=10).stdout  # noqa: S607
    except (OSError, subprocess.SubprocessError):
        found = ""
    names = [line.split(":", 1)[1].strip() for line in found.splitlines() if line.startswith("Model name")]
    return names[0] if names else platform.machine()


def bf16_comparison_problem(precisions: Sequence[str]) -> str | None:
    """Why a side-by-side precision benchmark cannot run on this CPU, or None: without bf16 units every precision
    computes in fp32 (`bf16_usable`), so the comparison would time fp32 under a bf16 name."""
    asked = [p for p in precisions if p != "fp32"]
    if not asked or cpu_has_bf16():
        return None
    return (
        f"{','.join(asked)}: this CPU has no bf16 units (AVX-512 BF16 or AMX), so every precision would compute in "
        "fp32 and the comparison would time fp32 under a bf16 name; run it on a CPU with them or on a GPU"
    )
