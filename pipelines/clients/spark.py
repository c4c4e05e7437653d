"""Thin client for Spark: one session per process, configured only from `Settings.spark`.

Locally the master is `local[*]` bound to 127.0.0.1; on a cluster the same job runs under
spark-submit against the configured master and the session picks the submitted configuration up.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from pipelines.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def get_spark(settings: Settings) -> SparkSession:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(settings.spark.app_name)
    if not os.environ.get("SPARK_SUBMITTED"):  # spark-submit already set the master
        builder = builder.master(str(settings.spark.master))
    conf = {
        "spark.driver.bindAddress": "127.0.0.1" if settings.is_local else "0.0.0.0",
        "spark.driver.host": "127.0.0.1" if settings.is_local else os.environ.get("SPARK_DRIVER_HOST", ""),
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.driver.memory": "2g",
        **settings.spark.effective_conf(),
    }
    for key, value in conf.items():
        if value:
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def spark_submit_command(settings: Settings, module_file: str, args: list[str]) -> list[str]:
    """The spark-submit argv that runs a stage's entry point on the configured master (cluster mode)."""
    command = ["spark-submit", "--master", str(settings.spark.master), "--name", settings.spark.app_name]
    for key, value in settings.spark.effective_conf().items():
        command += ["--conf", f"{key}={value}"]
    return [*command, module_file, *args]
