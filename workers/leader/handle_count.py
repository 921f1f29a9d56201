"""The IPAMHandle half of a release: decrement a handle's per-block count after its block was written.

Its own module because its failure policy is its own: the block write it completes was already made
under the leader's fence, so the decrement is never fenced again and never dropped lightly — a read that
fails, or a write the API refused unprocessed, is retried with back-off; an ambiguous write is not
repeated (a second decrement could under-count).  A count that does not match is Calico's
`decrementBlock` error: the handle is left as it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kubeio.errors import ApiUnavailable, Conflict, NotFound
from shared.model import sanitize_handle
from shared.names import handle_name
from shared.parse import parse_handle
from workers.leader.calico_objects import HANDLES, MAX_CAS_ATTEMPTS, ObjectApi, soft_delete_and_delete
from workers.leader.kube import JsonObj

log = logging.getLogger("workers.handle_count")  # its pre-split name (#37): log lines unchanged


class HandleCountMismatch(ValueError):
    """The handle has no entry for the block, or fewer addresses than released: Calico's library errors
    and leaves the handle as it is; so do we (the block write already happened)."""


# A decrement whose read failed, or whose write the API refused without processing it (429 throttled,
# 503 unavailable), is repeated a few times with back-off: given up at once, the handle would count the
# released IPs for good.  Any other failed write (500, 504, a dropped connection) may have been applied, so
# it is not repeated (a second decrement could under-count), only logged, as the library does.
UNPROCESSED_STATUSES = frozenset({429, 503})
TRANSIENT_RETRIES = 6
TRANSIENT_BACKOFF_SECONDS = 0.02  # doubled per retry: 1.3 s at most in all


def decrement_handle(
    api: ObjectApi,
    handle: str,
    cidr: str,
    n: int,
    attempts: int = MAX_CAS_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    *,
    read: JsonObj | None = None,
) -> None:
    """IPAMHandle `handle` holds `n` fewer addresses in `cidr`; deleted (soft, then preconditioned) when
    it holds none.  A missing or soft-deleted handle is tolerated (#3940); an entry missing or smaller
    than `n` raises HandleCountMismatch and leaves the handle untouched, as Calico's library does.
    `read`: the handle as read earlier in this pass, used for the first attempt instead of a GET (the
    write is conditional on its resourceVersion, so a handle changed since costs a 409 and a re-read)."""
    name = handle_name(sanitize_handle(handle))
    transient = 0
    for _ in range(attempts):
        try:
            obj = read if read is not None else api.get(HANDLES, name)
            read = None
        except NotFound:
            log.info("no IPAMHandle to decrement", extra={"handle": handle, "block": cidr})
            return
        except ApiUnavailable:
            if transient >= TRANSIENT_RETRIES:
                raise
            transient += 1
            sleep(TRANSIENT_BACKOFF_SECONDS * 2**transient)
            continue
        parse_handle(obj)  # MalformedObject (logged by the caller): never written from, left as it is
        spec: dict[str, Any] = dict(obj.get("spec") or {})
        if spec.get("deleted"):
            return
        counts = {str(k): int(v) for k, v in (spec.get("block") or {}).items()}
        left = counts.get(cidr, 0) - n
        if cidr not in counts or left < 0:
            # The library's decrementBlock: an error, the handle left as it is (logged by the caller).
            have = counts.get(cidr)
            raise HandleCountMismatch(f"IPAMHandle {name} holds {have} address(es) in {cidr}, not {n}")
        if left > 0:
            counts[cidr] = left
        else:
            counts.pop(cidr, None)
        body = {**obj, "spec": {**spec, "block": counts}}
        try:
            if counts:
                api.replace(HANDLES, body)
            else:
                soft_delete_and_delete(api, HANDLES, body, lambda: None)
            return
        except (Conflict, NotFound):
            continue
        except ApiUnavailable as exc:
            if exc.status not in UNPROCESSED_STATUSES or transient >= TRANSIENT_RETRIES:
                raise
            transient += 1
            sleep(TRANSIENT_BACKOFF_SECONDS * 2**transient)
    log.warning("IPAMHandle still conflicting after %s attempts", attempts, extra={"handle": handle})
