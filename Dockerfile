# One image for every part of sparkguard; the command picks the part:
#   sparkguard operator | sparkguard sidecar | sparkguard rollback ... | sparkguard bundle --dest DIR
# Built from the source alone: `docker build .` on a fresh clone builds the JVM layer's jar too
# (stages pyspark and jar), and .dockerignore keeps any jar built on the host out of the context.

# The PySpark that constraints.txt pins: the JVM layer is compiled against its jars, the runtime
# that loads it (scripts/build-jvm.sh reads the Spark, Scala and Hadoop versions from them).
FROM python:3.11-slim-bookworm AS pyspark
ENV PYTHONSAFEPATH=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY constraints.txt ./
COPY scripts/image-install.sh scripts/image-install.sh
RUN scripts/image-install.sh pyspark /opt/pyspark /src

# The JVM layer's jar: Java 17 and Maven live in this stage only.
FROM maven:3.9-eclipse-temurin-17 AS jar
WORKDIR /src
COPY --from=pyspark /opt/pyspark/pyspark/jars /opt/pyspark/pyspark/jars
COPY constraints.txt ./
COPY scripts/build-jvm.sh scripts/image-build-jar.sh scripts/
COPY spark_lib/jvm/ spark_lib/jvm/
RUN scripts/image-build-jar.sh /opt/pyspark/pyspark/jars /src

FROM python:3.11-slim-bookworm AS build
ENV PYTHONSAFEPATH=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first: this layer changes only when pyproject.toml or constraints.txt change.
COPY pyproject.toml constraints.txt ./
COPY scripts/image-install.sh scripts/image-install.sh
RUN scripts/image-install.sh deps /opt/sparkguard/venv /src
# Then the source, and the jar from the jar stage (package data of sparkguard.spark_lib.jars);
# image-install.sh app refuses to install without it.
COPY README.md ./
# src/sparkguard/ holds relative symlinks to the three folders below (COPY keeps them).
COPY src/ src/
COPY spark_lib/ spark_lib/
COPY --from=jar /src/spark_lib/jars/sparkguard-spark.jar spark_lib/jars/
COPY sidecar/ sidecar/
COPY operator/ operator/
# It ends with `image-install.sh perms`: every file readable (and executable where needed) by
# any UID in group 0, writable by root only (the final image runs read-only as any UID).
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
# Owned by root:0 and not writable by others: the user below, or any UID a platform assigns
# (OpenShift: arbitrary, in group 0), reads and runs it; nothing writes outside mounted volumes
# (PYTHONDONTWRITEBYTECODE; the injected containers get an emptyDir at /tmp) and HOME is unused.
COPY --from=build /opt/sparkguard/venv /opt/sparkguard/venv
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["sparkguard"]
CMD ["--help"]
