# syntax=docker/dockerfile:1
# The controller image: `make image` (Docker or Podman). Two stages: the build stage installs the
# runtime virtualenv from uv.lock only (no dev tools, `--frozen`: the lock is not re-resolved);
# the final stage gets that venv and nothing else, and runs as a numeric non-root user, as the
# chart's restricted securityContext requires (runAsUser 65532, read-only root filesystem).
#
# The base is pinned by digest. This digest was not pulled or verified on the machine this
# recipe was written on (it has no container engine and no registry access): check it with
# `docker buildx imagetools inspect python:3.11-slim-bookworm` and update it, or override it with
# `--build-arg PYTHON_IMAGE=...@sha256:...`.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${PYTHON_IMAGE} AS build
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir uv==0.13.8
WORKDIR /src
# Dependencies first (a layer that changes only with the lock), then the project itself.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project --no-editable
COPY projector ./projector
COPY deploy/helm/projector/crds ./deploy/helm/projector/crds
RUN uv sync --frozen --no-dev --no-editable

FROM ${PYTHON_IMAGE}
# No pip, setuptools or wheel at run time: nothing installs anything in a running controller.
RUN python -m pip uninstall -y -q pip setuptools wheel 2>/dev/null || true
COPY --from=build /app/.venv /app/.venv
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 8080 8443
ENTRYPOINT ["projector"]
CMD ["run"]
