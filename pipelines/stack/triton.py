"""The real `tritonserver` (2.51, shipped inside the `nvidia-pytriton` wheel) on 127.0.0.1.

Explicit model control: nothing loads at start; `deploy` loads and unloads models through the
model-control API. The Python backend's stub for this interpreter is put into a backend folder of
our own, and the bundled libraries plus this interpreter's libpython go on LD_LIBRARY_PATH (the
stub otherwise links the system's libpython against our stdlib). Each model's Python environment is
`EXECUTION_ENV_PATH` in its config (the stub ignores PYTHONPATH).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelines import services
from pipelines.config import Settings
from pipelines.errors import NotRetryable

SERVICE = "triton"


class TritonUnavailable(NotRetryable):
    """The Triton binary or the serving environment is missing, or the server did not come up."""


@dataclass(frozen=True)
class TritonEndpoints:
    http: str  # host:port for tritonclient.http
    grpc: str
    metrics: str


def endpoints(settings: Settings) -> TritonEndpoints:
    t = settings.triton
    return TritonEndpoints(
        f"{t.host}:{t.http_port}", f"{t.host}:{t.grpc_port}", f"http://{t.host}:{t.metrics_port}/metrics"
    )


def bundle_dir() -> Path:
    spec = importlib.util.find_spec("pytriton")  # located, never imported: only its files are used
    if spec is None or spec.origin is None:
        raise TritonUnavailable("nvidia-pytriton is not installed (make setup installs it)")
    return Path(spec.origin).parent / "tritonserver"


def _backend_dir(settings: Settings) -> Path:
    """backends/python with the bundled backend library and this Python's stub (copied once)."""
    bundle = bundle_dir()
    target = Path(str(settings.root)) / "serving" / "backends" / "python"
    stub = (
        bundle
        / "python_backend_stubs"
        / f"{sys.version_info.major}.{sys.version_info.minor}"
        / "triton_python_backend_stub"
    )
    if not stub.is_file():
        raise TritonUnavailable(f"no Triton Python stub for Python {sys.version_info.major}.{sys.version_info.minor}")
    target.mkdir(parents=True, exist_ok=True)
    for source in [*sorted((bundle / "backends" / "python").glob("*.*")), stub]:
        if source.is_file() and not (target / source.name).is_file():
            shutil.copy2(source, target / source.name)
    return target.parent


def server_spec(settings: Settings) -> services.ServiceSpec:
    t = settings.triton
    env_dir = Path(str(t.execution_env)) if t.execution_env else None
    if env_dir is not None and not (env_dir / "bin" / "python").exists():
        raise TritonUnavailable(f"no serving environment at {env_dir}: run `make serve-env`")
    bundle = bundle_dir()
    repository = Path(str(t.model_repository))
    repository.mkdir(parents=True, exist_ok=True)
    libs = [str(bundle.parent.parent / "nvidia_pytriton.libs"), str(Path(sys.base_prefix) / "lib")]
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [*libs, os.environ.get("LD_LIBRARY_PATH")]))}
    env.pop("PYTHONPATH", None)
    cache = Path(str(settings.root)) / "serving" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    command = [
        str(bundle / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        "--model-control-mode=explicit",
        f"--backend-directory={_backend_dir(settings)}",
        f"--cache-directory={cache}",
        "--exit-on-error=false",
        "--strict-readiness=true",
        f"--http-address={t.host}",
        f"--http-port={t.http_port}",
        f"--grpc-address={t.host}",
        f"--grpc-port={t.grpc_port}",
        "--allow-metrics=true",
        f"--metrics-address={t.host}",
        f"--metrics-port={t.metrics_port}",
        "--allow-gpu-metrics=false",
        "--log-verbose=0",
    ]
    url = f"http://{t.host}:{t.http_port}"
    return services.ServiceSpec(SERVICE, command, env, f"{url}/v2/health/live", url)


def up(settings: Settings) -> services.ServiceStatus:
    """Start the server (idempotent) and wait until it answers. On a cluster Kubernetes runs it
    (pipelines/cluster/triton.py): this only checks that `triton.url` is live."""
    if not settings.is_local:
        url = f"http://{settings.triton.url}".replace("http://http", "http")
        if not services.http_ok(f"{url}/v2/health/live"):
            raise TritonUnavailable(f"triton.url {url} is not live: apply the manifests of `flywheel serve manifests`")
        return services.ServiceStatus(SERVICE, None, True, True, url)
    spec = server_spec(settings)
    try:
        return services.start(
            str(settings.root),
            spec,
            host=settings.triton.host,
            port=settings.triton.http_port,
            timeout_s=settings.triton.startup_timeout_s,
        )
    except services.ServiceError as exc:
        raise TritonUnavailable(str(exc)) from None


def down(settings: Settings) -> bool:
    return services.stop(str(settings.root), SERVICE)


def status(settings: Settings) -> services.ServiceStatus:
    url = f"http://{settings.triton.host}:{settings.triton.http_port}"
    return services.status(str(settings.root), SERVICE, f"{url}/v2/health/live", url)
