# The training pods' image (train.runner=kubernetes): NeMo AutoModel's container plus this package,
# so a pod runs `python -m pipelines.train.pod` (see pipelines/train/kubernetes.py).
#   docker build -f docker/training.Dockerfile -t <registry>/flywheel-training:<tag> .
# <registry> is terraform output `cluster_profile.container_registry`; set the image in
# `kubernetes.training_image`.
ARG NEMO_IMAGE=nvcr.io/nvidia/nemo-automodel:25.11
FROM ${NEMO_IMAGE}
WORKDIR /opt/flywheel
COPY pyproject.toml README.md ./
COPY pipelines ./pipelines
COPY conf ./conf
# The container already has torch, transformers and peft in NeMo's versions; add only what our
# package itself needs to log, read data and talk to the stores.
RUN pip install --no-cache-dir --no-deps -e . \
 && pip install --no-cache-dir "mlflow-skinny==3.17.2" "pydantic-settings" "fsspec" "s3fs" "pyarrow" "rich" "typer" "orjson" "jsonschema"
USER 1000
WORKDIR /work
