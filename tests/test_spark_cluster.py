"""Cluster execution of the prep job: spark-submit to a Spark standalone master with one worker,
both on 127.0.0.1 (the same entry point a cluster's spark-submit runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import date
from pathlib import Path

import pytest
from ports import free_port

from pipelines import services
from pipelines.clients.spark import spark_submit_command, standalone_specs
from pipelines.config import load_settings
from pipelines.simulate.generator import GeneratorConfig, write_raw_logs

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
DAY = "2026-11-20"


def _master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as resp:  # noqa: S310
        return json.loads(resp.read())


def test_prep_runs_through_spark_submit_on_a_standalone_master(tmp_path: Path) -> None:
    root = tmp_path / "fw"
    root.mkdir()
    ports = [free_port() for _ in range(3)]
    specs = standalone_specs(*ports)
    try:
        for spec, port in zip(specs, (ports[0], ports[2])):
            services.start(str(root), spec, host="127.0.0.1", port=port, timeout_s=120)
        deadline = time.monotonic() + 60
        while _master_state(ports[1]).get("aliveworkers", 0) < 1 and time.monotonic() < deadline:
            time.sleep(1)
        assert _master_state(ports[1])["aliveworkers"] == 1
        write_raw_logs(GeneratorConfig(seed=5, records=2000, days=1, end_date=date.fromisoformat(DAY)), root / "raw")
        master = specs[0].url
        settings = load_settings(root=str(root), spark={"master": master})
        command = spark_submit_command(
            settings, str(REPO / "pipelines" / "prep" / "__main__.py"), ["--start", DAY, "--end", DAY]
        )
        env = {
            **os.environ,
            "FLYWHEEL_ROOT": str(root),
            "FLYWHEEL_SPARK__MASTER": master,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        prepared = json.loads(result.stdout.strip().splitlines()[-1])
        assert prepared["input_records"] == 2000
        assert prepared["clean"] + prepared["held"] + prepared["quarantined"] + prepared["duplicates"] == 2000
        apps = _master_state(ports[1])["completedapps"]
        assert [a["name"] for a in apps] == [settings.spark.app_name], "the job ran on the standalone master"
    finally:
        for spec in reversed(specs):
            services.stop(str(root), spec.name)
