# Triton on the cluster (pipelines/serve/kubernetes.py): the official image plus what our Python
# backend model (pipelines/serve/triton_model.py) imports. Locally the same packages live in
# .venv-serve (requirements/serve.in); here they are in the image, so `triton.execution_env` is unset.
#   docker build -f docker/triton.Dockerfile -t <registry>/flywheel-triton:<tag> .
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.10-py3
FROM ${TRITON_IMAGE}
COPY requirements/serve.in /tmp/serve.in
# serve.in pins the CPU torch wheel for this repo's machines; the image takes the CUDA build.
RUN grep -v '^torch' /tmp/serve.in > /tmp/serve-gpu.in \
 && pip install --no-cache-dir "torch==2.13.0" -r /tmp/serve-gpu.in
USER triton-server
