"""Many LoRA adapters on one loaded base model: the adapter is chosen per request, loaded on first use and
evicted least-recently-used past `capacity`, never by reloading the base.

Copied verbatim beside the Triton model (`<model>/1/lora_cache.py`) like `tool_grammar.py`: it runs in the
serving environment and imports nothing from `pipelines`. The adapters live in one folder (`adapter_root`),
one sub-folder per adapter named as its Triton model would be (`<project>__tool_router_v3`), each an HF-PEFT
adapter written there whole by `flywheel deploy` (staged, then renamed). An adapter whose folder is gone is
refused even while it is cached (an undeployed project stops answering at once).

A batch may mix adapters: PEFT's mixed-batch forward (`adapter_names`, one per row, `__base__` for the base
model) runs each LoRA layer once per adapter sub-batch over the shared base weights; a batch of one adapter
runs it as the active adapter (`route`). A batch with more
distinct adapters than the cache holds is split into parts that fit (`plan`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections import OrderedDict
from typing import Any, Callable

NAME = re.compile(r"^[a-z][a-z0-9_]{0,120}$")  # a Triton model name: never a path
BASE = ""  # a request without an adapter: the base model itself
PEFT_BASE = "__base__"  # PEFT's name for "no adapter" in a mixed batch


class AdapterError(ValueError):
    """This request's adapter cannot be served (a bad name, not deployed): its error, the batch goes on."""


def _identity(path: str) -> tuple[int, int]:
    """Which files a folder holds now: a replaced folder (renamed into place) has another inode or time."""
    found = os.stat(os.path.join(path, "adapter_config.json"))
    return found.st_ino, found.st_mtime_ns


class AdapterCache:
    def __init__(self, model: Any, root: str, capacity: int, log: Callable[[str], None] = print,
                 shared: str | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"max_adapters must be at least 1, got {capacity}")
        self.model = model  # the base model; a PeftModel around it once the first adapter is loaded
        self.root = root
        self.shared = shared  # this base's Triton name: an adapter written for another base is refused
        self.capacity = capacity
        self.log = log
        self.loaded: OrderedDict[str, tuple[int, int]] = OrderedDict()  # name -> its folder's identity, LRU first
        self.loads = 0
        self.evictions = 0
        self._layers: list[Any] | None = None  # the model's LoRA layers (found once per wrapping)
        self._active: str | None = None  # the adapter those layers run now

    def folder(self, name: str) -> str:
        """The deployed adapter's folder; AdapterError when the name is not one or nothing is deployed so."""
        if not isinstance(name, str) or not NAME.match(name):
            raise AdapterError(f"ADAPTER {name!r} is not an adapter name (lowercase letters, digits and _, "
                               "starting with a letter)")
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
        the rows' order is the order of use."""
        wanted = [n for n in dict.fromkeys(names) if n != BASE]
        if len(wanted) > self.capacity:
            raise ValueError(f"{len(wanted)} adapters in one part of a batch; the cache holds {self.capacity}")
        for name in wanted:
            path = self.folder(name)
            if name in self.loaded and self.loaded[name] == _identity(path):
                self.loaded.move_to_end(name)
                continue
            if name in self.loaded:  # its folder was replaced (other weights under the name): load it afresh
                self._evict(name)
            self._load(name, path)
            while len(self.loaded) > self.capacity:
                old = next(n for n in self.loaded if n not in wanted)
                self._evict(old)

    def _load(self, name: str, path: str) -> None:
        started = time.perf_counter()
        identity = _identity(path)
        if not hasattr(self.model, "peft_config"):
            from peft import PeftConfig, get_peft_model

            config = PeftConfig.from_pretrained(path)
            config.inference_mode = True
            wrapper = get_peft_model(self.model, config, adapter_name=name)  # LoRA layers put into the base in place
            try:
                wrapper.load_adapter(path, adapter_name=name)
            except Exception:
                self.model = wrapper.unload()  # the bare base back: a bad adapter never breaks the next request
                raise
            self.model = wrapper.eval()
        else:
            try:
                self.model.load_adapter(path, adapter_name=name)
            except Exception:
                if name in self.model.peft_config and len(self.model.peft_config) > 1:  # registered, then failed
                    self.model.delete_adapter(name)
                raise
        self.loaded[name] = identity
        self._layers = self._active = None
        self.loads += 1
        self.log(f"adapter {name} loaded in {(time.perf_counter() - started) * 1000:.0f} ms "
                 f"({len(self.loaded)}/{self.capacity} cached, {self.loads} loads, {self.evictions} evictions)")

    def _evict(self, name: str) -> None:
        if len(self.model.peft_config) > 1:
            self.model.delete_adapter(name)
            if self.model.active_adapter not in self.model.peft_config:  # PEFT repairs it only in some layouts
                self._point_at(next(iter(self.model.peft_config)))
        else:  # PEFT keeps at least one adapter: the bare base back (the next load wraps it afresh)
            self.model = self.model.unload()
        del self.loaded[name]
        self._layers = self._active = None
        self.evictions += 1
        self.log(f"adapter {name} evicted (least recently used; {len(self.loaded)}/{self.capacity} cached)")

    def route(self, names: list[str]) -> tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]:
        """(context, generate kwargs) that run these rows on their adapters: rows of one adapter make it the
        active one (PEFT's plain LoRA forward; the mixed-batch forward measured ~20 % slower per token here),
        base-only rows run with the adapters disabled, and rows of several adapters (or of adapters and the
        base) take the mixed batch (one adapter name per row). Nothing before any adapter was loaded."""
        if not hasattr(self.model, "peft_config"):
            return contextlib.nullcontext(), {}
        distinct = set(names)
        if distinct == {BASE}:
            return self.model.disable_adapter(), {}
        if len(distinct) == 1:
            self._activate(names[0])
            return contextlib.nullcontext(), {}
        return contextlib.nullcontext(), {"adapter_names": [n if n != BASE else PEFT_BASE for n in names]}

    def _activate(self, name: str) -> None:
        """Make `name` the adapter every LoRA layer runs. PEFT's `set_adapter` also sets requires_grad on every
        adapter's weights of every layer (139 ms with 16 adapters of SmolLM2 here, per batch); serving never
        trains, so only the layers' active adapter is set (what their forward reads)."""
        if self._active == name:
            return
        from peft.tuners.tuners_utils import BaseTunerLayer

        if self._layers is None:
            self._layers = [m for m in self.model.modules() if isinstance(m, BaseTunerLayer)]
        for layer in self._layers:
            layer._active_adapter = [name]
        self._point_at(name)
        self._active = name

    def _point_at(self, name: str) -> None:
        """The wrapper's own record of the active adapter (`generate` and `disable_adapter` read its config)."""
        self.model.active_adapter = name
        self.model.base_model.active_adapter = name

    def stats(self) -> dict[str, Any]:
        return {"cached": list(self.loaded), "capacity": self.capacity, "loads": self.loads,
                "evictions": self.evictions}
