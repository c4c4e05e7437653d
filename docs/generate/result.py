"""One results file as the renderers see it: its path, its data, its provenance and where its plots go."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docs.generate.provenance import Provenance


@dataclass(frozen=True)
class Result:
    path: Path
    data: dict[str, Any]
    prov: Provenance
    img_dir: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def stem(self) -> str:
        return self.path.stem
