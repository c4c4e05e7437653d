"""The curated SFT Parquet (features stage) read back: a window's manifest and its splits, seeded samples
stratified by (tool, source), a drift retrain's reference sample, and any log file as evaluation rows.

The rows become chat examples in `pipelines.toolcall.examples` (the prompt styles live there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pipelines.config import Settings
from pipelines.errors import DataProblem
from pipelines.logs.tools import NO_TOOL
from pipelines.storage import glob, read_json

if TYPE_CHECKING:
    import pandas as pd

SPLITS = ("train", "val", "test")


class DatasetMissing(DataProblem):
    """No curated training set yet (run the data path first), or an empty split."""


def manifest(settings: Settings, window: str | None = None) -> dict[str, Any]:
    """A window's manifest (`window`: its label, `START_END`), or the current one: the newest window
    whose training set was built (a backfill of an older window does not move it). It lists the
    training set's files and digest (lineage)."""
    curated = settings.zone("curated")
    uri = f"{curated}/manifests/{window}.json" if window else f"{curated}/manifest.json"
    try:
        data = read_json(uri)
    except FileNotFoundError:
        raise DatasetMissing(f"no manifest at {uri}: run the data path (flywheel run) first") from None
    if "training_set" not in data:
        raise DatasetMissing(f"{uri} has no training set: run `flywheel features build` first")
    return data


def source_of(record_id: str) -> str:
    """Where a record came from: its id's prefix (`webshop`, `retail`, ...; `rec` = our generated traffic)."""
    return record_id.split("_", 1)[0] if "_" in record_id else "unknown"


def _strata(frame: pd.DataFrame) -> pd.Series:
    return frame["tool"].fillna(NO_TOOL).astype(str) + "|" + frame["record_id"].map(source_of)


def balanced_sample(frame: pd.DataFrame, n: int, seed: int = 0, power: float = 0.0) -> pd.DataFrame:
    """`n` rows spread over (tool, source) strata in proportion to size**power: 0 gives every stratum an
    equal share, 0.5 (`sqrt`) a share that grows with the square root of its size (a large source keeps
    more than an equal share, a rare tool still gets far more than its random share), 1 the window's mix.
    A stratum smaller than its share gives all its rows and the others share the rest (water-filling);
    the last rows go by largest remainder (ties in stratum order)."""
    if len(frame) <= n:
        return frame
    groups = {k: g for k, g in frame.groupby(_strata(frame), sort=True)}  # noqa: C416 (groupby has .keys)
    quota = share_quotas({k: len(g) for k, g in groups.items()}, n, power)
    parts = [groups[k].sample(n=q, random_state=seed) for k, q in quota.items() if q]
    return pd_concat(parts).sort_values("record_id").reset_index(drop=True)


def share_quotas(sizes: dict[str, int], n: int, power: float) -> dict[str, int]:
    """Rows per stratum for `balanced_sample`: n split in proportion to size**power, capped at each size."""
    quota: dict[str, int] = {}
    open_, left = dict(sorted(sizes.items())), n
    while open_:
        weights = {k: size**power for k, size in open_.items()}
        total = sum(weights.values())
        full = [k for k, size in open_.items() if size <= left * weights[k] / total]
        if not full:
            exact = {k: left * w / total for k, w in weights.items()}
            quota.update({k: int(v) for k, v in exact.items()})
            rest = left - sum(int(v) for v in exact.values())
            for k in sorted(exact, key=lambda k: (int(exact[k]) - exact[k], k))[:rest]:
                quota[k] += 1
            break
        for k in full:
            quota[k] = open_.pop(k)
            left -= quota[k]
    return dict(sorted(quota.items()))


def stratified_sample(frame: pd.DataFrame, n: int, seed: int = 0) -> pd.DataFrame:
    """`n` rows in the proportions of the (tool, source) strata, every stratum at least once while `n`
    allows (largest remainders): a validation set that judges every tool and source the window has."""
    if len(frame) <= n:
        return frame
    strata = _strata(frame)
    sizes = strata.value_counts().sort_index()
    if n < len(sizes):  # fewer rows wanted than strata: one from each of the n largest
        largest = sizes.sort_values(ascending=False, kind="stable").index[:n]
        parts = [frame[strata == k].sample(n=1, random_state=seed) for k in sorted(largest)]
        return pd_concat(parts).sort_values("record_id").reset_index(drop=True)
    exact = sizes * n / len(frame)
    quota = exact.astype(int).clip(lower=1).clip(upper=sizes)
    while quota.sum() > n:  # the minimum of one per stratum overshot: take back from the largest
        quota[quota.idxmax()] -= 1
    for key in (exact - exact.astype(int)).sort_values(ascending=False).index:
        if quota.sum() >= n:
            break
        if quota[key] < sizes[key]:
            quota[key] += 1
    parts = [frame[strata == k].sample(n=int(q), random_state=seed) for k, q in quota.items() if q]
    return pd_concat(parts).sort_values("record_id").reset_index(drop=True)


def pd_concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    import pandas as pd

    return pd.concat(parts, ignore_index=True)


def load_split(
    settings: Settings,
    split: str,
    limit: int | None = None,
    seed: int = 0,
    window: str | None = None,
    sampling: Literal["random", "balanced", "sqrt", "stratified"] = "random",
) -> pd.DataFrame:
    """One split of a window's training set (default: the current manifest's), in record order;
    `limit` takes a seeded sample: random, `balanced` over (tool, source) or `stratified` by them."""
    import pandas as pd

    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    files = [f for f in manifest(settings, window)["training_set"]["files"] if f"split={split}/" in f]
    if not files and window is None:
        files = glob(f"{settings.zone('curated')}/sft/split={split}/dt=*/*.parquet")
    if not files:
        raise DatasetMissing(f"the training set has no {split!r} split")
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True).sort_values("record_id")
    return sample_rows(frame.reset_index(drop=True), limit, seed, sampling)


def sample_rows(
    frame: pd.DataFrame,
    limit: int | None,
    seed: int = 0,
    sampling: Literal["random", "balanced", "sqrt", "stratified"] = "random",
) -> pd.DataFrame:
    """`limit` rows of `frame` (all when it has no more), seeded, in record order: random, `balanced`/`sqrt`
    over (tool, source) strata or `stratified` by them."""
    if limit is None or len(frame) <= limit:
        return frame
    if sampling in ("balanced", "sqrt"):
        return balanced_sample(frame, limit, seed, power=0.5 if sampling == "sqrt" else 0.0)
    if sampling == "stratified":
        return stratified_sample(frame, limit, seed)
    return frame.sample(n=limit, random_state=seed).sort_values("record_id").reset_index(drop=True)


def with_reference_sample(
    settings: Settings, frame: pd.DataFrame, reference_days: list[str], share: float, seed: int = 0
) -> pd.DataFrame:
    """A drift retrain's training rows: the recent window plus a seeded sample of the reference window's
    train split, sized so it makes `share` of the result (the model keeps what it knew)."""
    import pandas as pd

    if share <= 0 or not reference_days:
        return frame
    files = [
        f for day in reference_days for f in glob(f"{settings.zone('curated')}/sft/split=train/dt={day}/*.parquet")
    ]
    if not files:
        return frame
    old = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    old = old[~old["record_id"].isin(frame["record_id"])]
    wanted = min(len(old), round(len(frame) * share / (1 - share))) if share < 1 else len(old)
    mixed = pd.concat([frame, old.sample(n=wanted, random_state=seed)], ignore_index=True)
    return mixed.sort_values("record_id").reset_index(drop=True)


def frame_from_logs(path: str, tools: Mapping[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """Any file in our log format (JSONL, optionally gzipped) as evaluation rows: the same prep
    function as the Spark job, with the same tools (`tools`: our catalogue plus the registered
    toolsets, see `registered_catalogue`); lines it would quarantine are counted and left out."""
    import gzip

    import pandas as pd

    from pipelines.prep.nodes import prepare_line

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        rows = [prepare_line(line, path, tools) for line in handle if line.strip()]
    clean = [r for r in rows if r["status"] == "clean"]
    if not clean:
        raise DatasetMissing(f"{path}: none of its {len(rows)} lines is a valid agent turn")
    return pd.DataFrame(clean).assign(context="").sort_values("record_id").reset_index(drop=True)
