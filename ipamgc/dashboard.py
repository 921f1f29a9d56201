"""rq-dashboard for ipamgc's queues: its msgpack jobs readable, and nothing writable.

Why this exists: rq-dashboard 0.9.0 run as is (`rq-dashboard --json`) reads jobs with RQ's pickle or JSON
serializer, so every job view of ipamgc's msgpack jobs answered 500; and its delete, empty, requeue and
compact buttons write to Redis.  `python -m ipamgc.dashboard` builds rq-dashboard's own Flask app with
- `redisio.shardqueue.jobs.MsgpackSerializer`: job payloads are decoded as data only, and the dashboard
  never runs a job, so it displays even a forged one safely;
- read-only in two layers: every request but GET/HEAD, and the GET that requeues
  (`/requeue/<queue>`), is answered 403 before rq-dashboard sees it (its own `DISABLE_DELETE` is set
  too, which hides the buttons but leaves requeue and compact live); and the Redis user it is given is
  the read-only `reader` of `shared/acl.py`, so Redis itself refuses any write;
- bound to 127.0.0.1 unless told otherwise (it has no authentication of its own);
- one Redis client for the app, built by ipamgc (`redisio.client.redis_client`: RESP2, no `CLIENT
  SETINFO`, whose refusal to the `reader` user Redis >= 7.2 and Valkey would log on every connection).
  rq-dashboard builds its clients from the URL with `redis_sentinel_url.connect`, a new one on every
  request of a `/<instance>/...` page; `make_app` answers those calls (`rq_dashboard.web.from_url`) with
  that one client instead.
It needs the `dashboard` extra (`pip install 'ipamgc[dashboard]'`: rq-dashboard and the `six` it imports
without declaring it).
"""

from __future__ import annotations

import os
from typing import Any

import click
import redis

from ipamgc.commands import refuse_placeholder_password
from ipamgc.commands.flags import Command
from redisio.client import redis_client
from redisio.shardqueue.jobs import MsgpackSerializer

# GET routes of rq-dashboard that write (everything else that writes is POST).
_WRITING_GETS = ("/requeue/",)


def make_app(redis_url: str, url_prefix: str = "") -> Any:
    """rq-dashboard's Flask app for `redis_url`, read-only, with the msgpack serializer."""
    from flask import abort, request  # noqa: PLC0415 - the optional `dashboard` extra
    from rq_dashboard import web  # noqa: PLC0415
    from rq_dashboard.cli import make_flask_app  # noqa: PLC0415

    client = redis_client(redis_url)

    def connect(url: str, **_options: Any) -> tuple[None, redis.Redis]:
        """What rq-dashboard calls to get a client for one of its configured URLs (it has only ours)."""
        if url != redis_url:
            raise LookupError("this dashboard serves one Redis only")
        return None, client

    web.from_url = connect
    web.config.serializer = MsgpackSerializer
    app = make_flask_app(None, None, None, url_prefix)
    app.config["RQ_DASHBOARD_REDIS_URL"] = redis_url
    app.config["RQ_DASHBOARD_DISABLE_DELETE"] = True
    app.config["DEPRECATED_OPTIONS"] = []

    def read_only() -> None:
        path = request.path.removeprefix(url_prefix)
        if request.method not in ("GET", "HEAD") or path.startswith(_WRITING_GETS):
            abort(403, description="this dashboard is read-only")

    app.before_request(read_only)

    web.setup_rq_connection(app)
    return app


@click.command(cls=Command, renamed={"--bind": ("--host",)})
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address (no auth: keep local).")
@click.option("--port", type=int, default=9181, show_default=True)
@click.option("--url-prefix", default="", help="Serve under this path (behind a proxy).")
@click.option(
    "--redis-url",
    default=None,
    help="The read-only user's URL (shared/acl.py `reader`). [env: IPAMGC_REDIS_URL, REDIS_URL]",
)
def main(host: str, port: int, url_prefix: str, redis_url: str | None) -> None:
    """rq-dashboard for ipamgc's queues, read-only (`python -m ipamgc.dashboard`)."""
    url = redis_url or os.environ.get("IPAMGC_REDIS_URL") or os.environ.get("REDIS_URL")
    if not url:
        raise click.UsageError("give --redis-url (the read-only user's) or set REDIS_URL")
    refuse_placeholder_password(url, "python -m ipamgc.dashboard")
    app = make_app(url, url_prefix)
    click.echo(f"rq-dashboard (read-only, msgpack) on http://{host}:{port}{url_prefix}/", err=True)
    app.run(host=host, port=port, debug=False)


if __name__ == "__main__":
    main()
