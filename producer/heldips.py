"""The IPs a mirrored pod holds, as numbers the backstop's sweep compares allocations with.

Why a module: the watcher keeps them per pod in its memory (`producer/memory.py`, written by
`producer/mirror.py`) so that its periodic backstop (`producer/backstop.py`) can tell, without Redis or
the workers, which allocations are valid whatever else the rules read: a pod allocation whose IP the
mirrored pod reports (`shared/allocrules.py`).  A number, not the text: an int a pod (a string would be
larger), and an allocation's IP is its block's first number plus its ordinal.  Parsed with `inet_pton`
(`held_ips` took 0.14 s over 150,000 pods; a cold start parses every pod): an IP it refuses is "not
held" and left to the workers' rules, whose parser may accept it; one both parse is the same number.
"""

from __future__ import annotations

import socket

from shared.model import Pod
from shared.podips import pod_is_finished, reported_ip_texts

V6 = 1 << 128  # IPv6 numbers are kept above every IPv4 one, so the two never compare equal

# One number (most pods), several (dual stack), or None: no IP, finished, or one that does not parse:
# never plainly held, the workers decide.
HeldIPs = int | tuple[int, ...] | None


def ip_number(text: str) -> int | None:
    """An IP's number (IPv6 above `V6`), None if it does not parse."""
    try:
        return int.from_bytes(socket.inet_pton(socket.AF_INET, text), "big")
    except OSError:
        pass
    try:
        return int.from_bytes(socket.inet_pton(socket.AF_INET6, text), "big") | V6
    except OSError:
        return None


def held_ips(pod: Pod) -> HeldIPs:
    """The numbers of the IPs `pod` reports in the mirror's view (`shared.podips.pod_reported_ips`)."""
    texts = reported_ip_texts(pod)
    if not texts or pod_is_finished(pod, live=False):
        return None
    numbers: list[int] = []
    for t in texts:
        n = ip_number(t)
        if n is None:
            return None
        numbers.append(n)
    return numbers[0] if len(numbers) == 1 else tuple(numbers)
