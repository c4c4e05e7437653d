"""Keeping secrets out of what the platform writes: URIs shown with their password masked, and a
scanner that looks for secrets in logs, reports and MLflow params/tags (used by the tests and by
`flywheel security scan`).

Secrets reach the platform only through the environment (FLYWHEEL_* variables, MLFLOW_TRACKING_*,
Airflow connections); anything printed, returned as XCom or logged goes through `redact_uri` first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# Shapes of credentials that must never be written anywhere, whatever their value.
PATTERNS: dict[str, re.Pattern[str]] = {
    "uri_with_password": re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s:/@'\"]+:(?!\*\*\*@)[^\s@/'\"]+@[^\s'\"]+", re.I),
    "aws_access_key_id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "private_key": re.compile(r"-----BEGIN (?:RSA |EC |OPENSSH )?PRIVATE KEY-----"),
    "bearer_token": re.compile(r"\bBearer\s+[A-Za-z0-9._~+/-]{20,}=*"),
}


def mask_uri_passwords(text: str) -> str:
    """Every `scheme://user:password@` in free text as `scheme://user:***@` (to the netloc's last @, so
    a password containing @ is masked whole)."""
    return re.sub(r"(://[^:/@\s]+:)[^/\s]*@", r"\1***@", text)


def redact_uri(uri: str | None) -> str | None:
    """`postgresql://user:secret@host/db` -> `postgresql://user:***@host/db`; other strings unchanged."""
    if not uri or "://" not in uri:
        return uri
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:{MASK}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@overload
def redact_settings(data: dict[str, Any]) -> dict[str, Any]: ...


@overload
def redact_settings(data: object) -> object: ...


def redact_settings(data: object) -> object:
    """A settings dump (nested dicts/lists) with every URI's password masked."""
    if isinstance(data, dict):
        return {k: redact_settings(v) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_settings(v) for v in data]
    return redact_uri(data) if isinstance(data, str) else data


@dataclass(frozen=True)
class Finding:
    where: str
    kind: str
    line: int

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.kind}"


def scan_text(text: str, where: str, secrets: Iterable[str] = ()) -> list[Finding]:
    """Known secret values (exact) and credential shapes (PATTERNS) in `text`; the finding names the
    place and the kind, never the value."""
    values = [s for s in secrets if s and len(s) >= 6]
    findings = []
    for number, line in enumerate(text.splitlines(), 1):
        findings += [Finding(where, "secret value", number) for s in values if s in line]
        findings += [Finding(where, kind, number) for kind, pattern in PATTERNS.items() if pattern.search(line)]
    return findings


def scan_files(paths: Iterable[Path], secrets: Iterable[str] = ()) -> list[Finding]:
    """Every file under `paths` (folders are walked); binary files are read as text, errors ignored."""
    secrets = list(secrets)
    findings: list[Finding] = []
    for path in paths:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            findings += scan_text(file.read_text(errors="ignore"), str(file), secrets)
    return findings


PAGE = 1000  # MLflow's pages: every run and version is read, page by page (never the first N only)


def pages(search: Any) -> Iterator[Any]:
    """Every item of a paged MLflow search (`search(page_token)` returns a PagedList with `.token`)."""
    token = None
    while True:
        page = search(token)
        yield from page
        token = getattr(page, "token", None)
        if not token:
            return


def scan_mlflow(client, experiment_ids: list[str], secrets: Iterable[str] = ()) -> list[Finding]:
    """Params and tags of every run in the experiments, and of every registered model version: all of them,
    page by page."""
    secrets = list(secrets)
    findings: list[Finding] = []
    runs = pages(lambda token: client.search_runs(experiment_ids, max_results=PAGE, page_token=token))
    for run in runs:
        for kind, values in (("param", run.data.params), ("tag", run.data.tags)):
            text = "\n".join(f"{k}={v}" for k, v in values.items())
            findings += scan_text(text, f"run {run.info.run_id} {kind}s", secrets)
    for version in pages(lambda token: client.search_model_versions(max_results=PAGE, page_token=token)):
        text = "\n".join(f"{k}={v}" for k, v in (version.tags or {}).items()) + f"\n{version.description or ''}"
        findings += scan_text(text, f"model {version.name} v{version.version}", secrets)
    return findings


def configured_secrets(settings) -> list[str]:
    """The secret values this configuration holds: passwords and keys, and the passwords inside URIs."""
    from pydantic import SecretStr

    values: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, SecretStr):
            values.append(node.get_secret_value())
        elif isinstance(node, str) and "://" in node:
            password = urlsplit(node).password
            if password:
                values.append(password)
        elif hasattr(node, "__dict__") and hasattr(node, "model_fields"):
            for name in type(node).model_fields:
                walk(getattr(node, name))
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(settings)
    return sorted(set(values))


def scan_platform(settings, generated_elsewhere: Iterable[str] = ()) -> list[Finding]:
    """Logs, reports and MLflow params/tags of this root, for the configured secrets, the generated ones (ours,
    and `generated_elsewhere`: Airflow's) and credential shapes."""
    from pipelines.clients.mlflow import client

    root = Path(str(settings.root))
    generated = [
        *sorted((root / "runs").glob("*.password")),
        *sorted((root / "runs" / "users").glob("*.password")),
        root / "runs" / "gateway.key",
    ]  # 0600 files, per root: ours and each project member's
    secrets = sorted(
        {
            *configured_secrets(settings),
            *(p.read_text().strip() for p in generated if p.is_file()),
            *generated_elsewhere,
        }
        - {""}
    )
    # every project's reports too (<root>/projects/<name>/reports), and the gateway's comparisons and unusable
    # answers kept at rest in each serving zone
    folders = [root / "logs", root / "airflow" / "logs", root / "reports", root / "serving" / "gateway"]
    projects = [*(root / "projects").glob("*"), *(root / "projects" / "_deleted").glob("*")]  # kept data too
    for project in sorted(p for p in projects if p.is_dir()):
        folders += [project / "reports", project / "serving" / "gateway"]
    findings = scan_files([f for f in folders if f.exists()], secrets)
    mlflow_client = client(settings)
    experiments = [e.experiment_id for e in pages(lambda t: mlflow_client.search_experiments(page_token=t))]
    return findings + scan_mlflow(mlflow_client, experiments, secrets)
