# ipamgc: one image for every component (`ipamgc watch | work | lead | sim serve | health`).
#   docker build -t ipamgc .
# Runs as an unprivileged user (uid 10001) and writes nothing but /tmp, so it also runs with a read-only
# root filesystem (deploy/).  /shared is where `ipamgc sim serve --kubeconfig-out` leaves a kubeconfig for
# the other containers (compose/): it is owned by the user so that a named volume mounted there is too.
FROM python:3.11-slim
# Optional extras, e.g. `--build-arg EXTRAS=[dashboard]` for compose's rq-dashboard image.
ARG EXTRAS=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /build
COPY pyproject.toml README.md constraints.txt ./
COPY shared ./shared
COPY redisio ./redisio
COPY kubeio ./kubeio
COPY producer ./producer
COPY workers ./workers
COPY ipamgc ./ipamgc
COPY lab ./lab
RUN pip install -c constraints.txt ".${EXTRAS}" \
    && rm -rf /build \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin ipamgc \
    && mkdir -p /shared \
    && chown 10001:10001 /shared

WORKDIR /
USER 10001:10001
# Prometheus metrics (Calico's port).
EXPOSE 9094
ENTRYPOINT ["ipamgc"]
CMD ["--help"]
