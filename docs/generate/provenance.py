"""Where a results file came from, read from its own fields: commit, date, machine, command, seeds, settings.

The files are heterogeneous (a benchmark's own writer each): `commit` is a sha or {"sha": ...}; the date is
`utc`, `generated_at`, `date`, `started` (epoch seconds) or only `day` (the day the logs are dated). A file with
no commit is refused: a figure nobody can reproduce does not go on a page.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from docs.generate.md import code, details, mapping

NOTE_KEYS = ("note", "note_by_hand", "first_run_note", "code_at", "why", "conclusion")


class ResultsError(Exception):
    """A results file the renderer will not put on a page."""


@dataclass(frozen=True)
class Provenance:
    commit: str
    dirty: bool | None
    commit_note: str | None
    date: str
    machine: str
    command: str | None
    seeds: str | None

    @property
    def short(self) -> str:
        return self.commit[:7]

    def footer(self) -> str:
        """One line for a figure: commit, date, machine."""
        return f"commit {self.short} · date {self.date} · machine {self.machine}"


def shown(path: Path) -> str:
    """The path as a reader knows it: relative to the working directory where it lies under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def commit_of(data: dict[str, Any], path: Path) -> tuple[str, bool | None]:
    raw = data.get("commit")
    sha = raw.get("sha") if isinstance(raw, dict) else raw
    if not isinstance(sha, str) or not sha.strip():
        raise ResultsError(
            f"{shown(path)}: no commit recorded (every results file names the commit it measured: "
            'add "commit": "<sha>" or {"sha": "<sha>"})'
        )
    if isinstance(raw, dict):
        return sha.strip(), raw.get("dirty")
    # beside a `git_commit` (what git in the run saw), the top-level `dirty` is that one's
    return sha.strip(), None if "git_commit" in data else data.get("dirty")


def date_of(data: dict[str, Any]) -> str:
    for key in ("utc", "generated_at", "date"):
        if isinstance(data.get(key), str):
            return _readable(data[key])
    if isinstance(data.get("started"), (int, float)):
        return datetime.fromtimestamp(data["started"], UTC).strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(data.get("day"), str):
        return f"not recorded (`day` {data['day']}: the day its data is dated, not the run's)"
    return "not recorded"


def _readable(stamp: str) -> str:
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    if len(stamp) <= 10:
        return stamp
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def machine_of(data: dict[str, Any]) -> str:
    for key in ("machine", "device", "hardware"):
        value = data.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and "name" in value:
            return f"{value['name']} (hardware table entry)"
        if isinstance(value, dict) and value:
            return ", ".join(f"{k} {v}" for k, v in value.items())
    return "not recorded"


def command_of(data: dict[str, Any]) -> str | None:
    if isinstance(data.get("argv"), list):
        return shlex.join(str(a) for a in data["argv"])
    return data.get("command") if isinstance(data.get("command"), str) else None


def seeds_of(data: dict[str, Any]) -> str | None:
    seeds = data.get("seeds")
    if isinstance(seeds, dict):
        return ", ".join(f"{k} {code(v)}" for k, v in seeds.items())
    found = {"seed": data["seed"]} if "seed" in data else {}
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    found |= {k: v for k, v in settings.items() if "seed" in k and k not in found}
    return ", ".join(f"{k} {code(v)}" for k, v in found.items()) or None


def read(data: dict[str, Any], path: Path) -> Provenance:
    sha, dirty = commit_of(data, path)
    note = data.get("commit_note") or (data["commit"].get("what") if isinstance(data["commit"], dict) else None)
    return Provenance(sha, dirty, note, date_of(data), machine_of(data), command_of(data), seeds_of(data))


def lines(prov: Provenance, data: dict[str, Any]) -> list[str]:
    """The provenance block: a list, then the settings and the run's own notes collapsed."""
    dirty = {True: " (working tree dirty)", False: " (clean)"}.get(prov.dirty, "")
    commit = f"- **commit** `{prov.short}`{dirty}" + (f": {prov.commit_note}" if prov.commit_note else "")
    out = [commit, f"- **date** {prov.date}", f"- **machine** {prov.machine}"]
    if "git_commit" in data:
        seen = str(data["git_commit"])[:7]
        out.append(f"- **git in the run saw** `{seen}`" + (" (dirty)" if data.get("dirty") else ""))
    if prov.command:
        out.append(f"- **command** {code(prov.command)}")
    if prov.seeds:
        out.append(f"- **seeds** {prov.seeds}")
    blocks = ["\n".join(out)]
    if isinstance(data.get("settings"), dict) and data["settings"]:
        blocks.append(details("settings", mapping(data["settings"])))
    notes = {k: data[k] for k in NOTE_KEYS if isinstance(data.get(k), str)}
    if notes:
        blocks.append(details("notes recorded with the run", "\n\n".join(f"**{k}**: {v}" for k, v in notes.items())))
    return blocks
