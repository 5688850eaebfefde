# One image for every part of sparkguard; the command picks the part:
#   sparkguard operator | sparkguard sidecar | sparkguard rollback ... | sparkguard bundle --dest DIR
FROM python:3.11-slim-bookworm AS build
ENV PYTHONSAFEPATH=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first: this layer changes only when pyproject.toml or constraints.txt change.
COPY pyproject.toml constraints.txt ./
COPY scripts/image-install.sh scripts/image-install.sh
RUN scripts/image-install.sh deps /opt/sparkguard/venv /src
# Then the source. spark_lib/ must already hold the JVM layer's jar (spark_lib/jars/, built on the
# host by scripts/build-jvm.sh: this image has no JDK or Maven); image-install.sh app refuses
# to install without it.
COPY README.md ./
COPY sparkguard/ sparkguard/
COPY spark_lib/ spark_lib/
COPY sidecar/ sidecar/
COPY operator/ operator/
RUN scripts/image-install.sh app /opt/sparkguard/venv /src

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="sparkguard" \
      org.opencontainers.image.description="Exactly-once output for Spark on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/sparkguard/venv/bin:$PATH \
    PYTHONSAFEPATH=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 65532 sparkguard \
    && useradd --system --uid 65532 --gid sparkguard --no-create-home --shell /usr/sbin/nologin sparkguard
COPY --from=build /opt/sparkguard/venv /opt/sparkguard/venv
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["sparkguard"]
CMD ["--help"]
