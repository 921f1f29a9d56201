"""`ipamgc redis-acl`: print (or write) the Redis ACL of ipamgc's four users (`shared/acl.py`).

Each component's user and password come from the Redis URL that component is given
(`redis://watcher:<password>@redis:6379/0`), so the ACL and the URLs cannot drift apart: the deploy/
Redis runs this as an init container on the very Secret the components read, and the compose file's
ACL is this command's output for the compose URLs (a test checks both).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ipamgc.commands.flags import Command
from shared.acl import COMPONENTS, Credential, credential_from_url, rules
from shared.keys import Keys


def _url_option(component: str) -> click.Option:
    return click.Option(
        [f"--{component}-url"],
        envvar=f"IPAMGC_REDIS_URL_{component.upper()}",
        required=True,
        metavar="URL",
        help=f"The {component}'s Redis URL, with its user and password. "
        f"[env: IPAMGC_REDIS_URL_{component.upper()}]",
    )


def _run(prefix: str, output: str, out: str | None, **urls: str) -> None:
    try:
        creds: dict[str, Credential] = {c: credential_from_url(c, urls[f"{c}_url"]) for c in COMPONENTS}
        lines = rules(Keys(prefix), creds)
    except ValueError as exc:
        click.echo(f"ipamgc redis-acl: error: {exc}", err=True)
        sys.exit(2)
    if output == "acl-file":
        text = "".join(f"user {name} {rule}\n" for name, rule in lines)
    else:  # for a Redis run by someone else: paste into redis-cli as its administrator
        # Not the default user: on a running server it may be the administrator's own (restrict it, or
        # turn it off, yourself once an administrator user exists).
        text = "".join(f"ACL SETUSER {name} {rule}\n" for name, rule in lines if name != "default")
    if out is None:
        click.echo(text, nl=False)
        return
    path = Path(out)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # Redis never reads a half-written file
    click.echo(f"wrote {len(lines)} users to {path}", err=True)


redis_acl = Command(
    "redis-acl",
    renamed={"--out": ("--output-file",)},
    callback=_run,
    help="Print the Redis ACL (one user per component: watcher, worker, leader, read-only reader) "
    "for the URLs the components use; `--output setuser` prints ACL SETUSER commands instead.",
    params=[
        click.Option(
            ["--prefix"], envvar="IPAMGC_PREFIX", default="ipamgc", show_default=True, help="Key prefix."
        ),
        click.Option(
            ["--output", "-o"],
            type=click.Choice(["acl-file", "setuser"]),
            default="acl-file",
            show_default=True,
        ),
        click.Option(["--output-file", "out"], metavar="PATH", default=None, help="Write here (atomically)."),
        *(_url_option(c) for c in COMPONENTS),
    ],
)


if __name__ == "__main__":
    redis_acl()
