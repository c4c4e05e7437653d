"""Unpaired thumbs (issue 51, item 2): the table KTO trains on, from ratings the platform already collects.

- `up`: an answer people rated up (desirable; our own model's answers too: a person confirmed them);
- `down`: an answer people rated down (undesirable), whoever wrote it;
- `correction`: a person's correction of a down-rated answer (`flywheel labels accept`; desirable), the `human`
  example `<id>-review` prep curated; or the teacher's relabel of one of our model's down-rated answers
  (`flywheel labels relabel`), the `teacher` example `<id>-review`.

The rated answers come from the features step's rated set (prep's `rated` table with the training prompts: the
same quarantine, PII redaction and split by session as an SFT example, and the same customer context; every
rating, a deduplicated turn's too), the corrections from the SFT set itself. The label policy holds: only a
person's rating or correction (or the teacher's relabel of a down-rated answer) makes an answer desirable (an
answer of our own model that nobody rated never enters), and an answer rated up whose label source the project
does not train (`quality.train_label_sources`) is left out, as SFT leaves it out. An answer that cannot be
parsed as a call or names a tool its prompt did not offer is quarantined with its reason; two identical answers
to one prompt rated both up and down are dropped (counted); a (prompt, answer, label) is kept once.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from pipelines.prep.pairs import PROMPT_COLUMNS, REVIEW_SUFFIX, _canonical, _offered

if TYPE_CHECKING:
    import pandas as pd

    from pipelines.config import Settings

SOURCES = ("up", "down", "correction")
LABEL_SOURCE_HELD = "label source"  # prep.labels.held_reason: a source the project does not train
THUMB_COLUMNS = [
    "thumb_id",
    *PROMPT_COLUMNS,
    "completion_json",
    "desirable",
    "label_source",
]


def build_thumbs(
    rated: pd.DataFrame, examples: pd.DataFrame
) -> tuple[pd.DataFrame, dict[str, int], list[dict[str, Any]]]:
    """(the thumbs, one row per rated answer in `THUMB_COLUMNS`; the dropped ones counted by reason; the
    quarantined ones with their reason). `rated`: the rated set (a `feedback` column, `up` or `down`), every
    split; `examples`: the SFT set, every split (its `<id>-review` rows are the corrections)."""
    import pandas as pd

    candidates: list[tuple[str, dict[str, Any]]] = []
    dropped: Counter[str] = Counter()
    for row in rated.to_dict("records"):
        if row.get("feedback") == "up" and str(row.get("held") or "").startswith(LABEL_SOURCE_HELD):
            dropped["up: its label source does not train (quality.train_label_sources)"] += 1
        elif row.get("feedback") in ("up", "down"):
            candidates.append((str(row["feedback"]), row))
    for row in examples.to_dict("records"):
        if str(row["record_id"]).endswith(REVIEW_SUFFIX):
            candidates.append(("correction", row))
    quarantined: list[dict[str, Any]] = []
    kept: dict[tuple[str, str, str], dict[str, Any]] = {}
    labels: dict[tuple[str, str], set[bool]] = {}  # (the conversation, the answer): any customer, any day
    for source, row in candidates:
        completion = _canonical(row.get("target_json"))
        if completion is None:
            quarantined.append({"source": source, "record_id": row["record_id"], "reason": "unparseable_side"})
            continue
        if json.loads(completion)["name"] not in _offered(row["tools_json"]) | {None}:
            quarantined.append({"source": source, "record_id": row["record_id"], "reason": "unknown_tool"})
            continue
        desirable = source != "down"
        answer = (row["system_prompt"], row["messages_json"], completion)
        labels.setdefault((row["messages_json"], completion), set()).add(desirable)  # any customer, any day
        key = (*answer[:2], f"{completion}|{desirable}")
        if key in kept:
            dropped[f"{source}: duplicate"] += 1
            continue
        kept[key] = {
            "thumb_id": f"{source}:{row['record_id']}",
            "source": source,
            "record_id": row["record_id"],
            "session_id": row["session_id"],
            "split": row["split"],
            "event_timestamp": row.get("event_timestamp"),
            "context": row.get("context"),
            "system_prompt": row["system_prompt"],
            "messages_json": row["messages_json"],
            "tools_json": row["tools_json"],
            "completion_json": completion,
            "desirable": desirable,
            "label_source": row.get("label_source"),
        }
    thumbs = []
    for key, row in kept.items():
        if len(labels[(key[1], row["completion_json"])]) > 1:
            dropped[f"{row['source']}: the same answer rated both up and down"] += 1
            continue
        thumbs.append(row)
    frame = pd.DataFrame(thumbs, columns=THUMB_COLUMNS).sort_values("thumb_id", ignore_index=True)
    return frame, dict(sorted(dropped.items())), quarantined


def rated_set(settings: Settings) -> pd.DataFrame:
    """The current training set's rated rows with their prompts (the features step's `sft_rated`), every split;
    empty when the set was built before rated rows were kept."""
    import pandas as pd

    from pipelines.prep.dataset import DatasetMissing, manifest

    try:
        files = manifest(settings)["training_set"].get("rated_files") or []
    except DatasetMissing:
        files = []
    parts = [pd.read_parquet(f).assign(split=f.split("split=", 1)[1].split("/", 1)[0]) for f in files]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["record_id", "feedback"])


def collect_thumbs(settings: Settings) -> tuple[pd.DataFrame, dict[str, int], list[dict[str, Any]]]:
    """`build_thumbs` over this project's current training set: its rated rows and its SFT examples."""
    from pipelines.prep.pairs import curated_examples

    return build_thumbs(rated_set(settings), curated_examples(settings))


def thumb_summary(thumbs: pd.DataFrame, dropped: dict[str, int], quarantined: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts a person reads: thumbs by source and split, desirable against undesirable in the training split,
    dropped by reason, quarantined by reason."""
    by = {s: {k: int(v) for k, v in thumbs[thumbs["source"] == s]["split"].value_counts().items()} for s in SOURCES}
    train = thumbs[thumbs["split"] == "train"]
    return {
        "thumbs": len(thumbs),
        "by_source": by,
        "train_desirable": int(train["desirable"].sum()),
        "train_undesirable": int((~train["desirable"].astype(bool)).sum()),
        "dropped": dropped,
        "quarantined": dict(Counter(q["reason"] for q in quarantined)),
    }
