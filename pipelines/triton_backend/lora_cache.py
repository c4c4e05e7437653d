"""Many LoRA adapters on one loaded base model: the adapter is chosen per request, loaded on first use and
evicted least-recently-used past `capacity`, never by reloading the base.

Copied verbatim beside the Triton model (`<model>/1/lora_cache.py`) like `tool_grammar.py`: it runs in the
serving environment and imports nothing from `pipelines`. The adapters live in one folder (`adapter_root`),
one sub-folder per adapter named as its Triton model would be (`<project>__tool_router_v3`), each an HF-PEFT
adapter written there whole by `flywheel deploy` (staged, then renamed). An adapter whose folder is gone is
refused even while it is cached (an undeployed project stops answering at once).

The adapters live in slots of `batched_lora.py` (copied beside this file too): a batch may mix adapters and
the base, each row runs on its own adapter with two batched products per adapted projection whatever the mix
(PEFT's mixed-batch forward loops over the adapters of a batch in every layer; the two are compared in
`bench/results/multi_lora_batched_h200.json`, rendered on the docs' benchmarks page). A slot is
freed (least recently used first) before the next adapter loads into it. A batch with more distinct adapters
than the cache holds is split into parts that fit (`plan`).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

NAME = re.compile(r"^[a-z][a-z0-9_]{0,120}$")  # a Triton model name: never a path
BASE = ""  # a request without an adapter: the base model itself
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # what training adapts


class AdapterError(ValueError):
    """This request's adapter cannot be served (a bad name, not deployed): its error, the batch goes on."""


def _identity(path: str) -> tuple[int, int]:
    """Which files a folder holds now: a replaced folder (renamed into place) has another inode or time."""
    found = os.stat(os.path.join(path, "adapter_config.json"))
    return found.st_ino, found.st_mtime_ns


class AdapterCache:
    def __init__(
        self,
        model: Any,
        root: str,
        capacity: int,
        log: Callable[[str], None] = print,
        shared: str | None = None,
        rank: int | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"max_adapters must be at least 1, got {capacity}")
        self.rank = rank  # the largest LoRA rank served (max_adapter_rank; None: any)
        self.model = model  # the base model, its adapted projections batched-slot layers once an adapter loads
        self.root = root
        self.shared = shared  # this base's Triton name: an adapter written for another base is refused
        self.capacity = capacity
        self.log = log
        self.loaded: OrderedDict[str, tuple[int, int]] = OrderedDict()  # name -> its folder's identity, LRU first
        self.slot: dict[str, int] = {}  # name -> its slot in the engine
        self.engine: Any = None  # batched_lora.BatchedLoRA, made at the first load
        self.loads = 0
        self.evictions = 0

    def folder(self, name: str) -> str:
        """The deployed adapter's folder; AdapterError when the name is not one or nothing is deployed so."""
        if not isinstance(name, str) or not NAME.match(name):
            raise AdapterError(
                f"ADAPTER {name!r} is not an adapter name (lowercase letters, digits and _, starting with a letter)"
            )
        path = os.path.join(self.root, name)
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise AdapterError(f"unknown adapter {name!r}: it is not deployed on this model")
        if self.shared is not None:
            try:
                with open(os.path.join(path, "flywheel.json"), encoding="utf-8") as handle:
                    meant = json.load(handle).get("shared")
            except (OSError, ValueError, AttributeError):
                meant = None
            if meant != self.shared:
                raise AdapterError(f"adapter {name!r} is deployed on {meant}, not on this model ({self.shared})")
        return path

    def plan(self, names: list[str]) -> list[list[int]]:
        """The rows of a batch (one adapter name per row, BASE for none) in parts of at most `capacity`
        distinct adapters each, keeping the rows' order within a part."""
        parts: list[list[int]] = []
        seen: list[set[str]] = []
        for row, name in enumerate(names):
            for part, adapters in zip(parts, seen):
                if name == BASE or name in adapters or len(adapters) < self.capacity:
                    part.append(row)
                    if name != BASE:
                        adapters.add(name)
                    break
            else:
                parts.append([row])
                seen.append(set() if name == BASE else {name})
        return parts

    def ensure(self, names: list[str]) -> None:
        """Every adapter of `names` loaded (at most `capacity` distinct), the least recently used others evicted;
        the rows' order is the order of use. The first adapter that cannot load raises."""
        wanted = self._wanted(names)
        for name in wanted:
            self._ensure_one(name, wanted)

    def ensure_each(self, names: list[str]) -> dict[str, str]:
        """`ensure` adapter by adapter: {name: why} for those that cannot be served, the others loaded, so one
        broken adapter is its own rows' error and not its batch's."""
        wanted = self._wanted(names)
        failed: dict[str, str] = {}
        for name in wanted:
            try:
                self._ensure_one(name, wanted)
            except Exception as exc:  # noqa: BLE001 (a bad name, a folder gone, an unfit adapter: its rows' error)
                failed[name] = f"{type(exc).__name__}: {exc}"
        return failed

    def _wanted(self, names: list[str]) -> list[str]:
        """The distinct adapters of `names` in order of use; ValueError past the cache's capacity."""
        wanted = [n for n in dict.fromkeys(names) if n != BASE]
        if len(wanted) > self.capacity:
            raise ValueError(f"{len(wanted)} adapters in one part of a batch; the cache holds {self.capacity}")
        return wanted

    def _ensure_one(self, name: str, wanted: list[str]) -> None:
        path = self.folder(name)
        identity = _identity(path)
        if (
            name in self.loaded and self.loaded[name] == identity and self.slot[name] in self.engine.loaded
        ):  # the engine's own record too
            self.loaded.move_to_end(name)
            return
        started = time.perf_counter()
        if self.engine is None:  # the base's adapted projections wrapped once, on the first adapter
            import importlib

            # a package module when imported as one (tests); beside model.py in Triton, a top-level module
            batched_lora = importlib.import_module(f"{__package__}.batched_lora" if __package__ else "batched_lora")

            self.engine = batched_lora.BatchedLoRA(self.model, TARGETS, slots=self.capacity, rank=self.rank)
        pairs, scale = self.engine.read_folder(path)  # read and checked before anything is evicted
        if name in self.loaded:  # its folder was replaced (other weights under the name): load it afresh
            self._evict(name)
        while len(self.loaded) >= self.capacity:  # a slot freed first: the least recently used not wanted now
            self._evict(next(n for n in self.loaded if n not in wanted))
        taken = set(self.slot.values())
        free = next(s for s in range(self.capacity) if s not in taken)
        self.engine.write(free, pairs, scale)
        self.loaded[name] = identity
        self.slot[name] = free
        self.loads += 1
        self.log(
            f"adapter {name} loaded in {(time.perf_counter() - started) * 1000:.0f} ms into slot {free} "
            f"({len(self.loaded)}/{self.capacity} cached, {self.loads} loads, {self.evictions} evictions)"
        )

    def _evict(self, name: str) -> None:
        slot = self.slot.pop(name)  # the cache's records go first: a failing clear never leaves a name without
        del self.loaded[name]  # its weights
        self.engine.clear(slot)
        self.evictions += 1
        self.log(f"adapter {name} evicted (least recently used; {len(self.loaded)}/{self.capacity} cached)")

    def route(self, names: list[str]) -> None:
        """Run these rows on their adapters in the model's next batches: each row on its adapter's slot, base rows
        on the base alone (every name must be loaded: `ensure` first). Nothing to do before any adapter."""
        if self.engine is not None:
            self.engine.select([self.slot[n] if n != BASE else None for n in names])

    def stats(self) -> dict[str, Any]:
        return {
            "cached": list(self.loaded),
            "capacity": self.capacity,
            "loads": self.loads,
            "evictions": self.evictions,
        }
