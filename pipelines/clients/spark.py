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

    from pipelines.services import ServiceSpec


def get_spark(settings: Settings) -> SparkSession:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(settings.spark.app_name)
    if not os.environ.get("SPARK_SUBMITTED"):  # spark-submit already set the master
        builder = builder.master(str(settings.spark.master))
    conf = {
        # a cluster pod binds its own interface (locally 127.0.0.1 only)
        "spark.driver.bindAddress": "127.0.0.1" if settings.is_local else "0.0.0.0",  # noqa: S104
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
    command = [_spark_bin("spark-submit"), "--master", str(settings.spark.master), "--name", settings.spark.app_name]
    for key, value in settings.spark.effective_conf().items():
        command += ["--conf", f"{key}={value}"]
    return [*command, module_file, *args]


def _spark_bin(name: str) -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", name)


def standalone_specs(
    master_port: int, master_ui_port: int, worker_ui_port: int, cores: int = 1, memory: str = "2g"
) -> list[ServiceSpec]:
    """A Spark standalone master and one worker on 127.0.0.1 (a tiny cluster to spark-submit to)."""
    from pipelines.services import ServiceSpec

    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}
    master = f"spark://127.0.0.1:{master_port}"
    return [
        ServiceSpec(
            "spark-master",
            [
                _spark_bin("spark-class"),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(master_port),
                "--webui-port",
                str(master_ui_port),
            ],
            env,
            f"http://127.0.0.1:{master_ui_port}/json/",
            master,
        ),
        ServiceSpec(
            "spark-worker",
            [
                _spark_bin("spark-class"),
                "org.apache.spark.deploy.worker.Worker",
                master,
                "--host",
                "127.0.0.1",
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(worker_ui_port),
            ],
            env,
            f"http://127.0.0.1:{worker_ui_port}/json/",
            master,
        ),
    ]
