"""The gate's episode rule for a multi-step toolset: the candidate's closed-loop success, paired per task against
the champion and against the base few-shot prompt (the zero-shot one where no few-shot pool is set), must be
non-inferior (the paired 95 % interval's low end above -`episodes.margin`), and it may make no more wrong writes
over the episodes than either reference (beyond `episodes.wrong_write_margin`), whatever its success rate.

Returns one line: None when the rule holds, else the refusal the registry records on the version.
"""

from __future__ import annotations

from typing import Any

from pipelines.config import Settings


def episode_veto(report: dict[str, Any], settings: Settings, candidate: str = "tuned_candidate") -> str | None:
    """The refusal line of the episode rule on an episode report (`evaluate.episode_run`), or None."""
    e = settings.episodes
    comparisons = {c["reference"]: c for c in report.get("comparisons") or [] if c["condition"] == candidate}
    if candidate not in (report.get("conditions") or {}):
        return "refused: the episode rule has no episodes of the candidate"
    prompt = "base_few_shot" if "base_few_shot" in comparisons else "base_zero_shot"  # the strongest prompt run
    references = [r for r in ("tuned_champion", prompt) if r in comparisons]
    for ref in references:
        c = comparisons[ref]
        ours, theirs = c["wrong_writes"]
        if ours > theirs + e.wrong_write_margin:
            return f"refused: wrong writes in episodes {ours} vs {theirs} for {ref} (n={c['n']} tasks)"
        success = c["metrics"]["success"]
        if success.get("low") is None:
            return f"refused: no episode paired with {ref}"
        if success["low"] <= -e.margin:
            return (
                f"refused: closed-loop success {success['diff']:+.3f} vs {ref}, 95% CI "
                f"[{success['low']:+.3f}, {success['high']:+.3f}], n={success['n']} tasks: inferiority beyond the "
                f"margin {e.margin} is not ruled out"
            )
    if not references:
        return "refused: the episode rule compared the candidate with no reference"
    return None
