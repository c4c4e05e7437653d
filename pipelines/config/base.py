"""What every settings section shares: strict fields (an unknown key is an error), validated assignment, and the
loopback address every local server binds."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"


class ConfigError(ValueError):
    """Configuration that cannot work; the message names the offending field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
