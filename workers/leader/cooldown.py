"""IP cooldown on the leader's side (Calico 3.33): the configured cooldown, and the cold-IP backstop.

Why a module: with `IPAMConfig.spec.ipCooldownSeconds` > 0 a release parks an ordinal (a handle-less
attribute `{"releasedAt": …}`, `shared.blockops`) instead of freeing it, and only a later write of the
block returns it to `unallocated`.  A block nobody assigns from again is never written, so its cooled IPs
would stay out of use for good: kube-controllers' `garbageCollectColdIPs` is the backstop, and this is
ours (spec §3.12).  It visits only the blocks the watcher's diff lists in `P:coldblocks`, only once their
earliest `releasedAt` is older than the cooldown (so a cluster without cooldown does nothing but one
HGETALL of an absent key; with a cooling block, one live read of the IPAM config a pass), reads each
block live, normalizes it as the library does and writes it back conditionally on the resourceVersion
read.  A conflict or a block gone is skipped (#13404): the watcher
delivers the new state, and the next pass looks again.  Nothing is validated here and no IP with a handle
is touched: only ordinals already released.

`read_ipam_config`: the live `IPAMConfig/default`, read once per pass that releases or collects, as the
library reads it on each `ReleaseIPs` and `ReleaseBlockAffinity` and the controller on each cold-IP pass
(a change is followed at the next pass).  The cold-IP pass uses the live cooldown alone, as Calico does.
The watcher also follows it (`P:state` `ip_cooldown`, `mirrored_cooldown`): a release writes with the
longer of the mirrored and the live cooldowns (`effective_cooldown`): the live read stays the final
guard, and a cooldown the watcher saw raised an instant before the live read did is not shortened (the
cold-IP pass returns such an IP once the live cooldown is over).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from kubeio.errors import Conflict, KubeError, NotFound
from shared import blockops
from shared.errors import MalformedObject
from shared.ipamconfig import CONFIG_NAME, DEFAULT, MAX_COOLDOWN_SECONDS, IPAMConfig, parse_ipam_config
from shared.keys import STATE_IP_COOLDOWN, Keys
from shared.netaddr import AddressError, cidr_to_name, parse_network
from shared.parse import parse_block
from workers.leader.calico_objects import BLOCKS, ObjectApi
from workers.leader.cleanup import Context

log = logging.getLogger("workers.cooldown")  # its pre-split name (#37): log lines unchanged

IPAM_CONFIGS = "ipamconfigs"


def read_ipam_config(api: ObjectApi) -> IPAMConfig:
    """The live `IPAMConfig/default` (Calico's defaults when there is none).  KubeError propagates."""
    try:
        raw = api.get(IPAM_CONFIGS, CONFIG_NAME)
    except NotFound:
        return DEFAULT
    config = parse_ipam_config(raw)
    if config.problem is not None:
        log.warning(
            "IPAMConfig/%s: %s; using a cooldown of %s s",
            CONFIG_NAME,
            config.problem,
            config.ip_cooldown_seconds,
        )
    return config


def mirrored_cooldown(client: redis.Redis, keys: Keys) -> int | None:
    """The cooldown the watcher mirrored (None: not mirrored; unreadable: the longest the schema allows)."""
    raw = client.hget(keys.state, STATE_IP_COOLDOWN)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_COOLDOWN_SECONDS:
        log.warning("unreadable mirrored IP cooldown %r; using %s s", raw, MAX_COOLDOWN_SECONDS)
        return MAX_COOLDOWN_SECONDS
    return value


def effective_cooldown(api: ObjectApi, mirrored: int | None) -> int:
    """The cooldown a write uses: the live one, or the mirrored one when it is longer.  KubeError (the
    live read failed) propagates: nothing is written on the mirror's word alone."""
    live = read_ipam_config(api).ip_cooldown_seconds
    return live if mirrored is None else max(live, mirrored)


@dataclass(slots=True)
class ColdStats:
    visited: int = 0  # blocks read because their earliest cooling IP was due
    written: int = 0  # blocks written back with cooled IPs returned to `unallocated`
    returned: int = 0  # ordinals returned
    skipped: int = 0  # conflicts, blocks gone or unreadable
    config_reads: int = 0  # live reads of the IPAM config


class ColdIPs:
    """The cold-IP backstop pass (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.stats = ColdStats()

    def run(self, now: float) -> None:
        entries = self.ctx.redis.hgetall(self.ctx.keys.coldblocks)
        if not entries:
            return  # nothing cools (Calico returns before reading the IPAM config, too)
        try:
            # Calico's `garbageCollectColdIPs`: the live config, read on every pass with a cooling block,
            # is the cooldown (the mirrored one may be stale: it neither skips a pass nor lengthens one).
            self.stats.config_reads += 1
            cooldown = read_ipam_config(self.ctx.api).ip_cooldown_seconds
        except KubeError as exc:
            log.warning("cold-IP pass skipped: IPAM config not readable: %s", exc)
            return
        for cidr in _due(entries, now, cooldown):
            self._collect(cidr, cooldown, now)

    def _collect(self, cidr: str, cooldown: int, now: float) -> None:
        extra = {"block": cidr}
        self.stats.visited += 1
        try:
            obj = self.ctx.api.get(BLOCKS, cidr_to_name(cidr))
            parse_block(obj)  # never written from an unreadable block
        except NotFound:
            self.stats.skipped += 1
            return
        except (KubeError, MalformedObject) as exc:
            log.warning("cold-IP pass: block not readable: %s", exc, extra=extra)
            self.stats.skipped += 1
            return
        if obj["spec"].get("deleted"):
            self.stats.skipped += 1
            return
        body = blockops.json_copy(obj)
        free_before = len(body["spec"].get("unallocated") or [])
        if not blockops.normalize(body["spec"], cooldown, now):
            return
        body["spec"]["sequenceNumber"] = int(body["spec"].get("sequenceNumber") or 0) + 1
        returned = len(body["spec"]["unallocated"]) - free_before
        if self.ctx.dry_run:
            log.info("dry run: would return %s cooled IP(s)", returned, extra=extra)
            return
        try:
            self.ctx.guard()
            self.ctx.api.replace(BLOCKS, body)
        except (Conflict, NotFound) as exc:
            log.info("cold-IP pass: block changed, skipped: %s", exc, extra=extra)
            self.stats.skipped += 1
            return
        except KubeError as exc:
            log.warning("cold-IP pass: block not written: %s", exc, extra=extra)
            self.stats.skipped += 1
            return
        self.stats.written += 1
        self.stats.returned += returned
        log.info("returned %s cooled IP(s) to unallocated", returned, extra=extra)


def _due(entries: Mapping[bytes | str, bytes | str], now: float, cooldown: int) -> list[str]:
    """Block CIDRs whose earliest cooling IP has cooled for `cooldown` seconds by `now`."""
    out: list[str] = []
    for raw_cidr, raw_since in entries.items():
        try:
            cidr = str(parse_network(_text(raw_cidr)))
            since = float(_text(raw_since))
        except (AddressError, ValueError):
            log.warning("unreadable cold-block entry %r: %r", raw_cidr, raw_since)
            continue
        if since + cooldown <= now:  # Calico skips while earliest + cooldown is after now
            out.append(cidr)
    return sorted(out)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
