"""Addresses as Calico spells them: block names, ordinals, and IPs compared the way Go compares them.

Calico derives an IPAMBlock's object name from its CIDR (`names.CIDRToName`); the encoding is load-bearing
because the name is how a block is fetched for a conditional write.  Pod IPs are compared parsed, as Go's
`net.IP.Equal` does: `/32` suffixes, IPv6 spellings and IPv4-mapped IPv6 forms all normalise.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4_NAME = re.compile(r"\d{1,3}-\d{1,3}-\d{1,3}-\d{1,3}")


class AddressError(ValueError):
    """Text that is not an IP address or CIDR in the form Calico writes."""


@functools.lru_cache(maxsize=65536)
def parse_network(text: str, *, strict: bool = True) -> IPNetwork:
    """Parse a CIDR; with `strict`, host bits must be zero (Calico stores masked block CIDRs).

    Cached: the same few thousand block CIDRs are parsed over and over (networks are immutable).
    """
    if "/" not in text:
        raise AddressError(f"{text!r} is not a CIDR (no prefix length)")
    try:
        return ipaddress.ip_network(text.strip(), strict=strict)
    except ValueError as exc:
        raise AddressError(f"{text!r}: {exc}") from exc


def parse_ip(text: str) -> IPAddress:
    """Parse an IP as Calico's pod conversion does: `/N` suffixes dropped, IPv4-mapped IPv6 → IPv4.
    A canonical spelling (what pods and blocks carry) is built from the C library's `inet_pton` bytes,
    ~2.5× (IPv4) to ~4× (IPv6) cheaper than `ipaddress` parsing the text (a microbenchmark); any other
    text takes `ipaddress`'s parse, so the answer is always the same (`_parse_ip_text`)."""
    family = socket.AF_INET6 if ":" in text else socket.AF_INET
    try:
        packed = socket.inet_pton(family, text)
        canonical = socket.inet_ntop(family, packed) == text
    except (OSError, ValueError):
        canonical = False
    if canonical:
        if family == socket.AF_INET:
            return ipaddress.IPv4Address(packed)
        v6 = ipaddress.IPv6Address(packed)
        return v6.ipv4_mapped or v6
    return _parse_ip_text(text)


def _parse_ip_text(text: str) -> IPAddress:
    """`parse_ip` by `ipaddress` alone (any spelling)."""
    s = text.strip()
    if not s or "%" in s:
        raise AddressError(f"{text!r} is not an IP address")
    try:
        ip: IPAddress = ipaddress.ip_interface(s).ip if "/" in s else ipaddress.ip_address(s)
    except ValueError as exc:
        raise AddressError(f"{text!r} is not an IP address") from exc
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_ip(text: str) -> bool:
    """`parse_ip(text)` would accept `text`.  A canonical dotted quad or RFC 5952 IPv6 (what pods carry)
    is recognised by the C library's `inet_pton`/`inet_ntop` round trip, ~10× cheaper than `ipaddress`;
    anything else is left to `parse_ip`, so the answer is always `parse_ip`'s."""
    family = socket.AF_INET6 if ":" in text else socket.AF_INET
    try:
        if socket.inet_ntop(family, socket.inet_pton(family, text)) == text:
            return True
    except (OSError, ValueError):
        pass
    try:
        parse_ip(text)
    except AddressError:
        return False
    return True


def canonical_ip(text: str) -> str:
    """The one spelling of an IP used in ids and Redis keys (RFC 5952 for IPv6)."""
    return str(parse_ip(text))


def cidr_to_name(cidr: IPNetwork | str) -> str:
    """Object name of the IPAMBlock for `cidr` (`10.244.1.0/26` → `10-244-1-0-26`)."""
    net = parse_network(cidr) if isinstance(cidr, str) else cidr
    text = str(net)
    return text.replace(".", "-", 3).replace(":", "-", 7).replace("/", "-", 1)


def name_to_cidr(name: str) -> IPNetwork:
    """Inverse of `cidr_to_name` (`fd00-10-244---122` → `fd00:10:244::/122`)."""
    addr, sep, prefix = name.rpartition("-")
    if not sep or not prefix.isdigit() or not addr:
        raise AddressError(f"{name!r} is not a block name")
    text = addr.replace("-", ".") if _V4_NAME.fullmatch(addr) else addr.replace("-", ":")
    net = parse_network(f"{text}/{prefix}")
    if cidr_to_name(net) != name:
        raise AddressError(f"{name!r} is not the canonical block name of {net}")
    return net


def block_size(net: IPNetwork) -> int:
    """Number of addresses (ordinals) in a block."""
    return int(net.num_addresses)


@functools.lru_cache(maxsize=65536)
def _v4_base(net: IPNetwork) -> tuple[int, int] | None:
    """An IPv4 network's first address and size as integers; None for IPv6."""
    if net.version != 4:
        return None
    return int(net.network_address), int(net.num_addresses)


def ordinal_ip_text(net: IPNetwork, ordinal: int) -> str:
    """`str(ordinal_to_ip(net, ordinal))`, an IPv4 one spelled by the C library (`inet_ntoa`: the same
    dotted quad, without `ipaddress`'s object and formatting per call)."""
    v4 = _v4_base(net)
    return str(ordinal_to_ip(net, ordinal)) if v4 is None else _v4_text(v4, ordinal, net)


@functools.lru_cache(maxsize=65536)
def _block_v4_base(cidr: str) -> tuple[int, int] | None:
    return _v4_base(parse_network(cidr))


def block_ip_text(cidr: str, ordinal: int) -> str:
    """`ordinal_ip_text` of a block named by its canonical CIDR text: the cache is keyed by the string
    (whose hash Python keeps), not by a network object (whose hash `ipaddress` computes on every call)."""
    v4 = _block_v4_base(cidr)
    return ordinal_ip_text(parse_network(cidr), ordinal) if v4 is None else _v4_text(v4, ordinal, cidr)


def _v4_text(v4: tuple[int, int], ordinal: int, block: object) -> str:
    base, size = v4
    if not 0 <= ordinal < size:
        raise AddressError(f"ordinal {ordinal} outside {block}")
    return socket.inet_ntoa((base + ordinal).to_bytes(4, "big"))


def ordinal_to_ip(net: IPNetwork, ordinal: int) -> IPAddress:
    if not 0 <= ordinal < net.num_addresses:
        raise AddressError(f"ordinal {ordinal} outside {net}")
    return net.network_address + ordinal


def ip_to_ordinal(net: IPNetwork, ip: IPAddress | str) -> int:
    addr = parse_ip(ip) if isinstance(ip, str) else ip
    if addr.version != net.version or addr not in net:
        raise AddressError(f"{addr} is not in {net}")
    return int(addr) - int(net.network_address)
