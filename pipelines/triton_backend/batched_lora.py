"""Many LoRA adapters on one loaded base model, batched: each adapter's weights sit in a slot of stacked
tensors, each row of a batch names its slot, and each adapted projection adds its rows' low-rank updates with
two batched matrix products (one `bmm`, one `baddbmm`) whatever the mix of adapters in the batch.

PEFT's mixed-batch forward (`adapter_names`) instead runs, in every adapted layer and for every adapter in the
batch, a sub-batch of four eager operations: its cost grows with the number of distinct adapters, and on a GPU
the launches dominate (the multi-LoRA results on the docs' benchmarks page, `bench/results/multi_lora_h200.json`).
Here the rows' weights are gathered once per batch (`select`), not once per token, so a decoding step costs two
small kernels per adapted projection for any mix. A batch whose rows all use one adapter reads that slot's
weights directly (no gathered copy); a mixed batch gathers its rows' weights into a working buffer sized to the
batch (rows x one adapter: the batch's working memory, like its KV cache); base rows gather zeros.

Slots are allocated as adapters arrive (never more than `slots`), at the largest rank loaded so far (smaller
ranks are padded with zeros; a larger one re-allocates every slot at that rank): the memory is the base plus the
adapters loaded at that rank, plus, while a batch mixes adapters, a copy of its rows' weights (rows x one
adapter). A layer that none of a batch's adapters adapts (an adapter trained on the top layers only) runs as
the base alone. What an adapter may be: an HF-PEFT LoRA adapter (`adapter_config.json` +
`adapter_model.safetensors`) whose target modules are `torch.nn.Linear` layers wrapped here, rank at most `rank`
when one is given, scale `lora_alpha / r` (or `/ sqrt(r)` with rsLoRA) folded into B. Refused with a clear error: DoRA,
`modules_to_save`, per-module rank or alpha patterns, LoRA biases, a weight for a module not wrapped here.

Copied verbatim beside the Triton model like `lora_cache.py`; imports torch (and safetensors to read a folder).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$")
UNSUPPORTED = {
    "use_dora": "DoRA",
    "modules_to_save": "modules_to_save",
    "rank_pattern": "per-module ranks",
    "alpha_pattern": "per-module alphas",
    "lora_bias": "LoRA biases",
}


class AdapterFormatError(ValueError):
    """This adapter cannot be put in a slot (its format, rank or modules): the slot is left as it was."""


class SlotLinear(torch.nn.Module):
    """A frozen `nn.Linear` plus `slots` low-rank updates; which one each row gets is set by `BatchedLoRA.select`."""

    # the buffers (registered in __init__) and the plain attributes set past nn.Module's __setattr__
    lora_a: torch.Tensor
    lora_b: torch.Tensor
    rows_a: torch.Tensor
    rows_b: torch.Tensor
    _params: dict[str, torch.nn.Parameter | None]
    _hooks: tuple[dict[int, Any], dict[int, Any]]

    def __init__(self, base: torch.nn.Linear) -> None:
        super().__init__()
        self.base = base
        device, dtype = base.weight.device, base.weight.dtype

        def zeros(*size: int) -> torch.Tensor:
            return torch.zeros(*size, device=device, dtype=dtype)

        self.register_buffer("lora_a", zeros(0, base.in_features, 0), persistent=False)
        self.register_buffer("lora_b", zeros(0, 0, base.out_features), persistent=False)
        self.register_buffer("rows_a", zeros(0, base.in_features, 0), persistent=False)
        self.register_buffer("rows_b", zeros(0, 0, base.out_features), persistent=False)
        self.mode = "off"  # off: the base alone; one: every row on slot `self.slot`; rows: per-row weights
        self.slot = 0
        # plain attributes read on every call (a module's own attribute lookup for parameters and buffers costs
        # microseconds a projection, hundreds of projections a token): the base's parameter and hook tables
        # (the same dicts: a weight replaced or a hook added is seen at once; nothing registered twice) and, in
        # mode `one`, views of that slot (set by `_refresh`, `grow` and `_apply`)
        object.__setattr__(self, "_params", base._parameters)
        object.__setattr__(self, "_hooks", (base._forward_pre_hooks, base._forward_hooks))
        self.one_a: torch.Tensor | None = None
        self.one_b: torch.Tensor | None = None
        self.filled: set[int] = set()  # the slots whose adapter adapts this layer (others leave it as the base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the base's product called directly (no second module call) and the update added in place into its
        # fresh output (no copy of it); bench/multi_lora.py measures what it changes for the whole model
        weight = self._params.get("weight")
        if weight is None or self._hooks[0] or self._hooks[1]:  # a computed weight (parametrized) or hooks: as is
            y = self.base(x)
        else:
            y = torch.nn.functional.linear(x, weight, self._params.get("bias"))
        if self.mode == "off":
            return y
        if self.mode == "one":
            one_a, one_b = self.one_a, self.one_b
            if one_a is None or one_b is None:  # set with the mode (`_views`)
                raise RuntimeError("mode `one` without the slot's views")
            y.view(-1, y.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]) @ one_a, one_b)
            return y
        rows = x.shape[0]
        if rows != self.rows_a.shape[0]:
            raise ValueError(f"a batch of {rows} rows; select() was given {self.rows_a.shape[0]}")
        low = torch.bmm(x.reshape(rows, -1, x.shape[-1]), self.rows_a)
        y.view(rows, -1, y.shape[-1]).baddbmm_(low, self.rows_b)
        return y

    def grow(self, slots: int, rank: int) -> None:
        """At least `slots` slots of rank at least `rank`, the loaded weights kept."""
        have, have_rank = self.lora_a.shape[0], self.lora_a.shape[2]
        if slots <= have and rank <= have_rank:
            return
        slots, rank = max(slots, have), max(rank, have_rank)
        a = self.lora_a.new_zeros(slots, self.base.in_features, rank)
        b = self.lora_b.new_zeros(slots, rank, self.base.out_features)
        a[:have, :, :have_rank] = self.lora_a
        b[:have, :have_rank, :] = self.lora_b
        self.lora_a, self.lora_b = a, b
        self._views()  # the selected slot in the new tensors (a gathered copy of rows stays valid)

    def _views(self) -> None:
        if self.mode == "one":
            self.one_a, self.one_b = self.lora_a[self.slot], self.lora_b[self.slot]
        else:
            self.one_a = self.one_b = None

    def _apply(self, fn: Any, recurse: bool = True) -> SlotLinear:  # .to(), .half(), .cuda(): new buffers
        out = super()._apply(fn, recurse)
        self._views()
        return out

    def gather(self, index: torch.Tensor, keep: torch.Tensor) -> None:
        """Row i gets slot index[i] where keep[i], zeros (the base) elsewhere. The working buffers are reused
        while the batch size holds (a captured graph keeps reading the same memory)."""
        rows = index.shape[0]
        if self.rows_a.shape[0] != rows or self.rows_a.shape[2] != self.lora_a.shape[2]:
            self.rows_a = self.lora_a.new_zeros(rows, *self.lora_a.shape[1:])
            self.rows_b = self.lora_b.new_zeros(rows, *self.lora_b.shape[1:])
        drop = ~keep.view(rows, 1, 1)  # base rows: zeros written, not products (0 x a NaN is a NaN)
        torch.index_select(self.lora_a, 0, index, out=self.rows_a).masked_fill_(drop, 0)
        torch.index_select(self.lora_b, 0, index, out=self.rows_b).masked_fill_(drop, 0)


class BatchedLoRA:
    """Puts `SlotLinear` in place of every `nn.Linear` of `model` whose name ends in one of `targets`, with
    at most `slots` adapter slots (of rank at most `rank`, when given). `load` fills a slot, `clear` empties it,
    `select` names each row's slot (None: the base) for the batches that follow."""

    def __init__(self, model: torch.nn.Module, targets: Iterable[str], slots: int, rank: int | None = None) -> None:
        if slots < 1 or (rank is not None and rank < 1):
            raise ValueError(f"slots and rank must be at least 1, got {slots} and {rank}")
        self.model, self.slots, self.rank = model, slots, rank
        wanted = set(targets)
        self.layers: dict[str, SlotLinear] = {}
        for name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if type(child) is torch.nn.Linear and child_name in wanted:
                    slot_linear = SlotLinear(child)
                    setattr(module, child_name, slot_linear)
                    self.layers[f"{name}.{child_name}" if name else child_name] = slot_linear
        if not self.layers:
            raise ValueError(f"no nn.Linear named {sorted(wanted)} in the model")
        self.selected: list[int | None] = []
        self.loaded: set[int] = set()  # the slots holding an adapter

    def _check_slot(self, slot: int) -> None:
        if type(slot) is not int or not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot!r} is not one of 0..{self.slots - 1}")

    def check(self, weights: Mapping[str, torch.Tensor], rank: int | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """The adapter's (A, B) per adapted layer, every key, pair and shape checked (and every pair of rank
        `rank`, when given): AdapterFormatError otherwise. Writes nothing."""
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in weights.items():
            found = KEY.match(key)
            if not found:
                raise AdapterFormatError(f"{key!r} is not a LoRA A or B weight")
            module = found["module"]
            if module not in self.layers:
                raise AdapterFormatError(f"the adapter adapts {module!r}, which is not an adapted layer here")
            pairs.setdefault(module, {})[found["which"]] = tensor
        if not pairs:
            raise AdapterFormatError("the adapter holds no LoRA weights")
        for module, pair in pairs.items():
            layer = self.layers[module]
            if set(pair) != {"A", "B"}:
                raise AdapterFormatError(f"{module!r} has lora_{''.join(pair)} without its other half")
            a, b = pair["A"], pair["B"]
            r = a.shape[0]
            expected_a, expected_b = (r, layer.base.in_features), (layer.base.out_features, r)
            if tuple(a.shape) != expected_a or tuple(b.shape) != expected_b:
                raise AdapterFormatError(
                    f"{module!r}: A {tuple(a.shape)} and B {tuple(b.shape)} do not fit a "
                    f"{layer.base.in_features}->{layer.base.out_features} layer"
                )
            if rank is not None and r != rank:
                raise AdapterFormatError(f"{module!r} has rank {r}; the adapter's config says {rank}")
            if self.rank is not None and r > self.rank:
                raise AdapterFormatError(f"rank {r} is over this model's adapter rank {self.rank}")
            if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
                raise AdapterFormatError(f"{module!r} holds NaN or infinite weights")
        return pairs

    def load(self, slot: int, weights: Mapping[str, torch.Tensor], scale: float) -> None:
        """Slot `slot` holds the adapter whose PEFT state dict is `weights` (keys `...<module>.lora_A.weight`
        [r, in] and `.lora_B.weight` [out, r]), scaled by `scale`. Checked whole, and every layer's room made,
        before the slot is written."""
        self.write(slot, self.check(weights), scale)

    def write(self, slot: int, pairs: Mapping[str, Mapping[str, torch.Tensor]], scale: float) -> None:
        """Slot `slot` holds the adapter whose pairs `check` (or `read_folder`) returned: every layer's room is
        made before the slot is written."""
        self._check_slot(slot)
        rank = max(pair["A"].shape[0] for pair in pairs.values())
        with torch.no_grad():
            for layer in self.layers.values():
                layer.grow(slot + 1, rank)
            try:
                for module, layer in self.layers.items():
                    layer.lora_a[slot].zero_()
                    layer.lora_b[slot].zero_()
                    layer.filled.discard(slot)
                    if module in pairs:
                        a, b = pairs[module]["A"], pairs[module]["B"]
                        r = a.shape[0]
                        layer.lora_a[slot, :, :r].copy_(a.t())
                        layer.lora_b[slot, :r, :].copy_(b.t().to(torch.float32).mul(scale))
                        layer.filled.add(slot)
            except BaseException:  # out of memory half-way: an empty slot, never half of two adapters
                self.clear(slot)
                raise
        self.loaded.add(slot)
        self._refresh()

    def read_folder(self, path: str) -> tuple[dict[str, dict[str, torch.Tensor]], float]:
        """(pairs, scale) of the HF-PEFT LoRA adapter in folder `path`, checked against this model (the pairs as
        `check` returns them, for `write`); every way
        it can be unfit is one AdapterFormatError (naming the folder, not the server's path). Writes nothing."""
        name = os.path.basename(os.path.normpath(path))
        try:
            with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as handle:
                config = json.load(handle)
            if not isinstance(config, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else exc  # an OSError's text holds the server's path
            raise AdapterFormatError(f"{name}: no readable adapter_config.json ({why})") from None
        if config.get("peft_type", "LORA") != "LORA":
            raise AdapterFormatError(f"{name}: a {config.get('peft_type')} adapter, not LoRA")
        for key, what in UNSUPPORTED.items():
            if config.get(key):
                raise AdapterFormatError(f"{name}: {what} are not supported by batched serving")
        try:
            r, alpha = int(config["r"]), float(config.get("lora_alpha", 8))  # PEFT's default alpha
            if r < 1:
                raise ValueError(f"r = {r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise AdapterFormatError(f"{name}: adapter_config.json has no usable rank r ({exc})") from None
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        first = next(iter(self.layers.values())).lora_a
        try:
            weights = load_file(os.path.join(path, "adapter_model.safetensors"), device=str(first.device))
        except (OSError, SafetensorError) as exc:
            cause = exc.strerror if isinstance(exc, OSError) else exc
            raise AdapterFormatError(f"{name}: no readable adapter_model.safetensors ({cause})") from None
        return self.check(weights, rank=r), scale

    def load_folder(self, slot: int, path: str) -> None:
        """Slot `slot` holds the HF-PEFT adapter in folder `path` (`read_folder`, then `write`)."""
        self.write(slot, *self.read_folder(path))

    def clear(self, slot: int) -> None:
        self._check_slot(slot)
        with torch.no_grad():
            for layer in self.layers.values():
                if slot < layer.lora_a.shape[0]:
                    layer.lora_a[slot].zero_()
                    layer.lora_b[slot].zero_()
                layer.filled.discard(slot)
        self.loaded.discard(slot)
        self.selected = [None if s == slot else s for s in self.selected]  # its rows fall back to the base
        self._refresh()

    def select(self, rows: list[int | None]) -> None:
        """Row i of the next batches runs on slot rows[i] (None: the base model alone); every slot named must
        hold an adapter."""
        for slot in rows:
            if slot is not None:
                self._check_slot(slot)
                if slot not in self.loaded:
                    raise ValueError(f"slot {slot} holds no adapter")
        self.selected = list(rows)
        self._refresh()

    def _refresh(self) -> None:
        """Apply `selected` to every layer (again after a load: a gathered copy would hold the old weights). A
        layer that none of the selected adapters adapts runs as the base alone."""
        rows = self.selected
        masks: dict[tuple[Any, ...], torch.Tensor] = {}  # per device (a model may be split over devices)
        indices: dict[Any, torch.Tensor] = {}
        for layer in self.layers.values():
            kept = tuple(s is not None and s in layer.filled for s in rows)
            slots = {s for s, k in zip(rows, kept) if k and s is not None}  # a kept row names a slot
            if not slots:
                layer.mode, layer.slot = "off", 0
            elif len(slots) == 1 and all(kept):
                layer.mode, layer.slot = "one", next(iter(slots))
            else:
                device = layer.lora_a.device
                if device not in indices:
                    indices[device] = torch.tensor([s or 0 for s in rows], device=device)
                if (device, kept) not in masks:
                    masks[device, kept] = torch.tensor(kept, device=device)
                layer.mode, layer.slot = "rows", 0
                layer.gather(indices[device], masks[device, kept])
            layer._views()

    def adapter_bytes(self) -> int:
        """Bytes one slot takes over every adapted layer (at the rank allocated now)."""
        return sum(
            (layer.base.in_features + layer.base.out_features) * layer.lora_a.shape[2] * layer.lora_a.element_size()
            for layer in self.layers.values()
        )
