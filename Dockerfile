# tensorflow_elastic installed from its wheel next to TensorFlow (CPU): the image the
# Kubernetes manifests (deploy/kubernetes/) run, once a training script is added to it.
#
#   docker build -t tfelastic:0.1.0 .
#   docker build --build-arg TENSORFLOW_VERSION=2.20.0 -t tfelastic:0.1.0-tf2.20 .
#
# The build stage compiles the op library against the TensorFlow it installs (pip wheel .);
# the runtime stage installs the same TensorFlow and that wheel, with no compiler. The only
# downloads are from the registries: the base image, Debian's g++, PyPI's packages.
# A training image adds its script where the manifests expect it:
#   FROM tfelastic:0.1.0
#   COPY train.py /app/train.py

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TENSORFLOW_VERSION=2.21.0
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "tensorflow-cpu==${TENSORFLOW_VERSION}"
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && python -c "import json, zipfile, glob; \
wheel = zipfile.ZipFile(glob.glob('/wheels/*.whl')[0]); \
print(json.loads(wheel.read('tensorflow_elastic/_built_for.json')))"

FROM ${PYTHON_IMAGE}
ARG TENSORFLOW_VERSION=2.21.0
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "tensorflow-cpu==${TENSORFLOW_VERSION}" /wheels/*.whl \
    && rm -rf /wheels \
    && useradd --create-home --uid 1000 tfelastic \
    && mkdir -p /app /var/lib/tfelastic \
    && chown tfelastic: /app /var/lib/tfelastic \
    && python -c "import tensorflow_elastic.ops as ops; ops.load_binding(); print('tensorflow_elastic OK')"
ENV TF_CPP_MIN_LOG_LEVEL=2
USER 1000:1000
WORKDIR /app
CMD ["tfelastic-run", "--help"]
