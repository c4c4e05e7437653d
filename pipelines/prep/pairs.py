"""Preference pairs from signals the platform already collects (issue 51, item 1): the table DPO trains on.

Five sources, each joined to what prep curated, so a pair has had the same quarantine, PII redaction, dedupe
and split by session as an SFT example (its prompt and chosen side *are* that example, and its prompt renders in
any prompt style as the example's does):

- `correction`: a down-rated answer a person corrected (`flywheel labels accept`). Chosen: the person's call (the
  `human` example `<id>-review` prep curated); rejected: the original answer (prep's clean log of `<id>`, held
  from SFT as rated down).
- `relabel`: a down-rated answer of our own model the teacher answered again (`flywheel labels relabel`).
  Chosen: the teacher's call (the `teacher` example `<id>-review` prep curated, written as a reviewer's
  correction is); rejected: the original answer, as for `correction`.
- `shadow`: a shadow comparison where the candidate disagreed with the teacher (`<serving>/gateway/agreement/`,
  mode `shadow`, not exact). Chosen: the teacher's call (the `teacher` example prep curated from the capture);
  rejected: the candidate's call as the comparison recorded it (redacted, like the example). A candidate answer
  with no call is left out: the record does not tell an abstention from a text answer.
- `canary`: a canary comparison where the teacher, answering a copy of a request the candidate served,
  disagreed. Chosen: the teacher's copy (the gateway captures it as `<id>-teacher`, a `teacher` example prep
  curated in the served turn's session); rejected: the candidate's call as the comparison recorded it.

- `evaluation`: an offline shadow run: `flywheel eval` of one of our models on a split of the training set, where
  its answer was not the example's call. Chosen: the example's call (the teacher's, a person's or an import's
  gold); rejected: the model's answer as the report recorded it. An answer with no call is left out, as for
  `shadow`; reports of other data (`--logs`) are not read.

The label policy holds: a chosen side our own model wrote (label source `champion` or `verified`) never trains,
and a pair whose sides are equal or whose chosen call names a tool the prompt did not offer is dropped, each
counted by reason. A rejected side that cannot be parsed or names a tool the prompt did not offer is quarantined
with its reason. A pair is kept once per (prompt, chosen, rejected).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pipelines.logs.schema import TEACHER_COPY_SUFFIX
from pipelines.toolcall.calls import NO_TOOL, target_json

if TYPE_CHECKING:
    import pandas as pd

    from pipelines.config import Settings

SOURCES = ("correction", "relabel", "shadow", "canary", "evaluation")
OUR_MODEL = ("champion", "verified")  # label sources our own model wrote: never a chosen side
REVIEW_SUFFIX = "-review"  # prep.reviews: a correction's record id is the original's with this suffix
PROMPT_COLUMNS = [  # what a pair and a thumb carry of the turn: its prompt as SFT trains it, and its session's split
    "source",
    "record_id",
    "session_id",
    "split",
    "event_timestamp",
    "context",
    "system_prompt",
    "messages_json",
    "tools_json",
]
PAIR_COLUMNS = [
    "pair_id",
    *PROMPT_COLUMNS,
    "chosen_json",
    "rejected_json",
    "chosen_label_source",
]


def _canonical(call: Any) -> str | None:
    """A call ({name, arguments} or {name: null}) as the training target's JSON; None when it is no call."""
    if isinstance(call, str):
        try:
            call = json.loads(call)
        except json.JSONDecodeError:
            return None
    if not isinstance(call, dict) or "name" not in call:
        return None
    name, arguments = call["name"], call.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if name is not None and (not isinstance(name, str) or not isinstance(arguments, dict)):
        return None
    return target_json(name if name is not None else NO_TOOL, arguments)


def _offered(tools_json: str) -> set[str]:
    return {t["name"] for t in json.loads(tools_json or "[]")}


def build_pairs(
    examples: pd.DataFrame,
    originals: Mapping[str, dict[str, Any]],
    comparisons: Iterable[dict[str, Any]],
    evaluations: Iterable[dict[str, Any]] = (),
) -> tuple[pd.DataFrame, dict[str, int], list[dict[str, Any]]]:
    """(the pairs, one row per pair in `PAIR_COLUMNS`; the dropped pairs counted by reason; the quarantined ones
    with their reason). `examples`: prep's curated examples, every split; `originals`: record id -> prep's clean
    log row (`tool`, `arguments_json`, `label_source`); `comparisons`: the gateway's comparison records;
    `evaluations`: evaluation reports of the training set's splits (`conditions`, each with `per_request`
    answers)."""
    import pandas as pd

    by_id = {row["record_id"]: row for row in examples.to_dict("records")}
    dropped: Counter[str] = Counter()
    quarantined: list[dict[str, Any]] = []
    candidates = _correction_candidates(by_id, originals, dropped)
    candidates += _shadow_candidates(by_id, originals, comparisons, dropped)
    candidates += _evaluation_candidates(by_id, evaluations, dropped)
    pairs, seen = [], set()
    for source, row, rejected_side in candidates:
        offered = _offered(row["tools_json"])
        chosen, rejected = _canonical(row["target_json"]), _canonical(rejected_side)
        if row.get("label_source") in OUR_MODEL:
            dropped[f"{source}: chosen side written by our own model ({row['label_source']})"] += 1
            continue
        if chosen is None or (json.loads(chosen)["name"] not in offered | {None}):
            dropped[f"{source}: the chosen call is not one of the offered tools"] += 1
            continue
        if rejected is None:
            quarantined.append({"source": source, "record_id": row["record_id"], "reason": "unparseable_side"})
            continue
        if json.loads(rejected)["name"] not in offered | {None}:
            quarantined.append({"source": source, "record_id": row["record_id"], "reason": "unknown_tool"})
            continue
        if chosen == rejected:
            dropped[f"{source}: equal sides"] += 1
            continue
        key = (row["system_prompt"], row["messages_json"], chosen, rejected)
        if key in seen:
            dropped[f"{source}: duplicate"] += 1
            continue
        seen.add(key)
        pairs.append(
            {
                "pair_id": f"{source}:{row['record_id']}" + (f":{_digest(rejected)}" if source == "evaluation" else ""),
                "source": source,
                "record_id": row["record_id"],
                "session_id": row["session_id"],
                "split": row["split"],
                "event_timestamp": row.get("event_timestamp"),
                "context": row.get("context"),
                "system_prompt": row["system_prompt"],
                "messages_json": row["messages_json"],
                "tools_json": row["tools_json"],
                "chosen_json": chosen,
                "rejected_json": rejected,
                "chosen_label_source": row.get("label_source"),
            }
        )
    frame = pd.DataFrame(pairs, columns=PAIR_COLUMNS).sort_values("pair_id", ignore_index=True)
    return frame, dict(sorted(dropped.items())), quarantined


def _digest(rejected: str) -> str:
    """A short, stable name of a rejected answer: an evaluation pair's id whatever else the table holds."""
    return hashlib.sha256(rejected.encode()).hexdigest()[:12]


def _correction_candidates(
    by_id: Mapping[str, dict[str, Any]], originals: Mapping[str, dict[str, Any]], dropped: Counter[str]
) -> list[tuple[str, dict[str, Any], Any]]:
    """(source, the chosen example, the rejected side) of each reviewer's correction: the corrected example
    chosen over the answer the logs held."""
    out: list[tuple[str, dict[str, Any], Any]] = []
    for record_id, row in by_id.items():
        if record_id.endswith(REVIEW_SUFFIX):
            source = "relabel" if row.get("label_source") == "teacher" else "correction"
            original = originals.get(record_id.removesuffix(REVIEW_SUFFIX))
            if original is None:
                dropped[f"{source}: original answer not in the clean logs"] += 1
                continue
            tool = original.get("tool")
            answered = {"name": tool or None, "arguments": original.get("arguments_json") or "{}"}  # parsed later
            out.append((source, row, answered))
    return out


def _shadow_candidates(
    by_id: Mapping[str, dict[str, Any]],
    originals: Mapping[str, dict[str, Any]],
    comparisons: Iterable[dict[str, Any]],
    dropped: Counter[str],
) -> list[tuple[str, dict[str, Any], Any]]:
    """(source, the chosen example, the rejected side) of each shadow or canary comparison where the candidate
    and the teacher disagreed: the teacher's curated example (shadow: the served turn; canary: its teacher
    copy) chosen over the candidate's answer. A canary answer the caller rated up (its clean log row in
    `originals`) is no rejected side: a person confirmed it."""
    out: list[tuple[str, dict[str, Any], Any]] = []
    for comparison in comparisons:
        mode = comparison.get("mode")
        if mode not in ("shadow", "canary") or comparison.get("arm") not in (None, "candidate"):
            continue  # a canary request the champion answered compared nothing
        if comparison.get("skipped") or comparison.get("error"):
            continue
        if (comparison.get("agreement") or {}).get("exact"):
            continue  # they agreed: no preference
        if mode == "canary" and (originals.get(str(comparison.get("record_id"))) or {}).get("feedback") == "up":
            dropped["canary: a person rated the candidate's answer up"] += 1
            continue
        teacher_id = str(comparison.get("record_id")) + (TEACHER_COPY_SUFFIX if mode == "canary" else "")
        row = by_id.get(teacher_id)
        if row is None:
            dropped[f"{mode}: the teacher's answer is not a curated example"] += 1
            continue
        answer = comparison.get("answer")
        if isinstance(answer, dict) and answer.get("name") is None:  # the record cannot tell an abstention from
            dropped[f"{mode}: the candidate made no call (an abstention or text, not told apart)"] += 1  # a text
            continue
        if isinstance(answer, dict) and "<unparsed>" in (answer.get("arguments") or {}):
            answer = "unparsed"  # the gateway kept arguments it could not parse as they were: quarantined later
        out.append((str(mode), row, answer))
    return out


def _evaluation_candidates(
    by_id: Mapping[str, dict[str, Any]], evaluations: Iterable[dict[str, Any]], dropped: Counter[str]
) -> list[tuple[str, dict[str, Any], Any]]:
    """(source, the chosen example, the rejected answer) for every answer of one of our models (a `tuned_`
    condition) that was not its example's call, in evaluation reports of the training set's splits."""
    from pipelines.toolcall.calls import parse_call

    found: list[tuple[str, dict[str, Any], Any]] = []
    for report in evaluations:
        for condition in report.get("conditions") or []:
            if not str(condition.get("condition", "")).startswith("tuned_"):
                continue
            for answer in condition.get("per_request") or []:
                if answer.get("exact_match"):
                    continue
                if "output" not in answer:
                    dropped["evaluation: the report kept no answer (written before answers were kept)"] += 1
                    continue
                row = by_id.get(str(answer.get("record_id")))
                if row is None:
                    dropped["evaluation: the request is not a curated example"] += 1
                    continue
                call = parse_call(str(answer["output"] or ""))
                if call is None:
                    dropped["evaluation: the model made no call"] += 1
                    continue
                found.append(("evaluation", row, call))
    return found


def evaluation_reports(settings: Settings) -> list[dict[str, Any]]:
    """The project's evaluation reports of the training set's splits (an offline shadow run is one: `flywheel
    eval --split train`); reports of other data (`--logs`) are left out."""
    from pipelines.storage import glob, read_json

    reports = []
    for uri in sorted(glob(f"{settings.zone('reports')}/evaluation/*/report.json")):
        try:
            report = read_json(uri)
        except (OSError, ValueError) as exc:  # reports are written atomically: an unreadable one is damaged
            import logging

            logging.getLogger("flywheel").warning("labels pairs: %s left out, unreadable: %s", uri, exc)
            continue
        if not (report.get("settings") or {}).get("logs"):
            reports.append(report)
    return reports


def curated_examples(settings: Settings) -> pd.DataFrame:
    """Every split of the current training set's curated examples (a `split` column), empty without any."""
    import pandas as pd

    from pipelines.prep.dataset import SPLITS, DatasetMissing, load_split

    parts = []
    for split in SPLITS:
        try:
            part = load_split(settings, split)
        except DatasetMissing:
            continue
        parts.append(part.assign(split=split))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["record_id"])


def collect_pairs(settings: Settings) -> tuple[pd.DataFrame, dict[str, int], list[dict[str, Any]]]:
    """`build_pairs` over this project's zones: every split of the current training set's curated examples,
    prep's clean logs and the gateway's comparison records."""
    import pandas as pd

    from pipelines.prep.pipeline import zone_paths
    from pipelines.storage import glob, read_bytes

    examples = curated_examples(settings)
    comparisons = []
    for f in sorted(glob(f"{settings.zone('serving')}/gateway/agreement/dt=*/*.jsonl")):
        for line in read_bytes(f).decode("utf-8", errors="replace").splitlines():
            try:
                comparisons.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line of a file still being written: its record is read next time
    # only the rows pairs need are read, however long the clean-log history grows: the originals of accepted
    # corrections and relabels, and the served turns of canary disagreements (their rating)
    wanted = {r.removesuffix(REVIEW_SUFFIX) for r in examples["record_id"].astype(str) if r.endswith(REVIEW_SUFFIX)}
    wanted |= {str(c.get("record_id")) for c in comparisons if c.get("mode") == "canary" and c.get("agreement")}
    originals: dict[str, dict[str, Any]] = {}
    for f in glob(f"{zone_paths(settings)['clean_logs']}/dt=*/*.parquet") if wanted else []:
        cols = ["record_id", "tool", "arguments_json", "label_source", "feedback"]
        for row in pd.read_parquet(f, columns=cols, filters=[("record_id", "in", sorted(wanted))]).to_dict("records"):
            originals[row["record_id"]] = row
    return build_pairs(examples, originals, comparisons, evaluation_reports(settings))


def pair_summary(pairs: pd.DataFrame, dropped: dict[str, int], quarantined: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts a person reads: pairs by source and split, dropped by reason, quarantined by reason."""
    by = {s: {k: int(v) for k, v in pairs[pairs["source"] == s]["split"].value_counts().items()} for s in SOURCES}
    return {
        "pairs": len(pairs),
        "by_source": by,
        "dropped": dropped,
        "quarantined": dict(Counter(q["reason"] for q in quarantined)),
    }
