"""Object names Calico derives, byte for byte: handles, block affinities and the hostname-hash label."""

from __future__ import annotations

import base64
import hashlib

from shared.netaddr import IPNetwork, cidr_to_name

LABEL_HOSTNAME_HASH = "projectcalico.org/hostname-hash"
LABEL_AFFINITY_TYPE = "projectcalico.org/affinity-type"
LABEL_IP_VERSION = "projectcalico.org/ip-version"
_MAX_NAME = 253


def handle_name(handle_id: str) -> str:
    """IPAMHandle object name: the lower-cased handle id."""
    return handle_id.lower()


def hostname_hash(host: str) -> str:
    """`projectcalico.org/hostname-hash`: base32 (no padding) of SHA3-256 of the host name."""
    digest = hashlib.sha3_256(host.encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=")


def affinity_name(host: str, cidr: IPNetwork) -> str:
    """BlockAffinity object name `<host>-<blockname>`, shortened with a hash past 253 characters."""
    block = cidr_to_name(cidr)
    name = f"{host}-{block}"
    if len(name) < _MAX_NAME:
        return name
    keep = _MAX_NAME - 1 - len(block) - 13
    digest = hashlib.sha256(f"{host}+{block}".encode()).hexdigest()[:11]
    return f"{host[:keep]}-{block}-{digest}"


def affinity_labels(host: str, cidr: IPNetwork, kind: str = "host") -> dict[str, str]:
    return {
        LABEL_HOSTNAME_HASH: hostname_hash(host),
        LABEL_AFFINITY_TYPE: kind,
        LABEL_IP_VERSION: str(cidr.version),
    }
