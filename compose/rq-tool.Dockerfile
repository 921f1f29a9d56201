# A small image for an RQ tool that cannot share ipamgc's image: rq-exporter pins rq<3 (ipamgc runs
# rq 3) and needs none of ipamgc's code.  (rq-dashboard does need it, for the msgpack serializer: it is
# built from ../Dockerfile with the `dashboard` extra.)
#   docker build -f rq-tool.Dockerfile --build-arg PACKAGE=rq-exporter==3.1.0 .
FROM python:3.11-slim
ARG PACKAGE
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN test -n "$PACKAGE" \
    && pip install "$PACKAGE" \
    && useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin rq
USER 10001:10001
