"""Block names, ordinals and IP parsing exactly as Calico spells them."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.names import affinity_labels, affinity_name, handle_name, hostname_hash
from shared.netaddr import (
    AddressError,
    _parse_ip_text,
    canonical_ip,
    cidr_to_name,
    ip_to_ordinal,
    is_ip,
    name_to_cidr,
    ordinal_ip_text,
    ordinal_to_ip,
    parse_ip,
)


@pytest.mark.parametrize(
    ("cidr", "name"),
    [
        ("10.244.1.0/26", "10-244-1-0-26"),
        ("192.168.0.0/32", "192-168-0-0-32"),
        ("fd00:10:244::/122", "fd00-10-244---122"),
        ("fd80:24e2:f998:72d6::/122", "fd80-24e2-f998-72d6---122"),
        ("2001:db8:0:1:2:3:4:0/122", "2001-db8-0-1-2-3-4-0-122"),
    ],
)
def test_block_name_round_trip(cidr: str, name: str) -> None:
    assert cidr_to_name(cidr) == name
    assert name_to_cidr(name) == ipaddress.ip_network(cidr)


@pytest.mark.parametrize("bad", ["10-244-1-0", "10-244-1-0-x", "fd00-10-244---", "-26", "10-244-1-1-26"])
def test_bad_block_names(bad: str) -> None:
    with pytest.raises(AddressError):
        name_to_cidr(bad)


@given(st.integers(min_value=0, max_value=2**32 - 64).map(lambda i: i - i % 64))
def test_v4_block_names_round_trip(base: int) -> None:
    net = ipaddress.ip_network((base, 26))
    assert name_to_cidr(cidr_to_name(net)) == net


@given(st.integers(min_value=0, max_value=2**128 - 64).map(lambda i: i - i % 64))
def test_v6_block_names_round_trip(base: int) -> None:
    net = ipaddress.ip_network((base, 122))
    assert name_to_cidr(cidr_to_name(net)) == net


def test_ordinals_v4_and_v6() -> None:
    v4 = ipaddress.ip_network("10.244.1.0/26")
    v6 = ipaddress.ip_network("fd00:10:244::/122")
    assert str(ordinal_to_ip(v4, 2)) == "10.244.1.2"
    assert ip_to_ordinal(v4, "10.244.1.63") == 63
    assert str(ordinal_to_ip(v6, 63)) == "fd00:10:244::3f"
    assert ip_to_ordinal(v6, "FD00:10:244:0:0:0:0:3F") == 63
    with pytest.raises(AddressError):
        ordinal_to_ip(v4, 64)
    with pytest.raises(AddressError):
        ip_to_ordinal(v4, "10.244.2.0")
    with pytest.raises(AddressError):
        ip_to_ordinal(v4, "fd00:10:244::1")


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("10.244.1.2", "10.244.1.2"),
        ("10.244.1.2/32", "10.244.1.2"),
        (" 10.244.1.2 ", "10.244.1.2"),
        ("fd00:10:244:0:0:0:0:5", "fd00:10:244::5"),
        ("FD00:10:244::5/128", "fd00:10:244::5"),
        ("::ffff:10.244.1.2", "10.244.1.2"),
    ],
)
def test_ips_compare_parsed(text: str, canonical: str) -> None:
    assert canonical_ip(text) == canonical
    assert parse_ip(text) == parse_ip(canonical)


@pytest.mark.parametrize("bad", ["", "10.244.1", "10.244.1.256", "fe80::1%eth0", "not-an-ip", "10.0.0.1/33"])
def test_bad_ips(bad: str) -> None:
    with pytest.raises(AddressError):
        parse_ip(bad)


def test_names_calico_derives() -> None:
    # The example of calico-ipam-gc.md §1.4.
    assert hostname_hash("node-1") == "A3XPYDATRKB7Q4SM2O5FN4RXIHBFIL2PITFX26BAIP5XAB2X74CA"
    net = ipaddress.ip_network("10.244.1.0/26")
    assert affinity_name("node-1", net) == "node-1-10-244-1-0-26"
    long_host = "n" * 250
    long_name = affinity_name(long_host, net)
    assert len(long_name) == 252
    assert long_name.startswith("n" * (252 - len("10-244-1-0-26") - 13) + "-10-244-1-0-26-")
    assert handle_name("K8s-Pod-Network.ABC") == "k8s-pod-network.abc"
    assert affinity_labels("node-1", net) == {
        "projectcalico.org/hostname-hash": "A3XPYDATRKB7Q4SM2O5FN4RXIHBFIL2PITFX26BAIP5XAB2X74CA",
        "projectcalico.org/affinity-type": "host",
        "projectcalico.org/ip-version": "4",
    }


def _accepts(text: str) -> bool:
    try:
        parse_ip(text)
    except AddressError:
        return False
    return True


_ip_texts = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda ip: ip.exploded),
    st.ip_addresses(v=4).map(lambda ip: f"::ffff:{ip}"),
    st.ip_addresses().map(lambda ip: f"{ip}/{32 if ip.version == 4 else 128}"),
    st.ip_addresses(v=4).map(lambda ip: ".".join(f"0{o}" for o in str(ip).split("."))),
    st.text(alphabet="0123456789abcdefABCDEF.:/% \x00", max_size=45),
    st.text(max_size=20),
)


@given(_ip_texts)
def test_is_ip_answers_as_parse_ip(text: str) -> None:
    """The C-library fast path never accepts what `parse_ip` refuses, nor refuses what it accepts."""
    assert is_ip(text) == _accepts(text)


@given(_ip_texts)
def test_parse_ip_fast_path_answers_as_ipaddress(text: str) -> None:
    """Built from `inet_pton`'s bytes or parsed by `ipaddress`: the same address, the same refusals."""
    try:
        want = _parse_ip_text(text)
    except AddressError:
        with pytest.raises(AddressError):
            parse_ip(text)
        return
    got = parse_ip(text)
    assert (type(got), got) == (type(want), want)


@pytest.mark.parametrize("text", ["10.0.0.1", "fd00::1", "::ffff:10.0.0.1", " 10.0.0.1", "10.0.0.1/32"])
def test_is_ip_accepts_what_pods_carry(text: str) -> None:
    assert is_ip(text)


@pytest.mark.parametrize("text", ["", "010.0.0.1", "10.0.0.256", "fe80::1%eth0", "10.0.0", "x"])
def test_is_ip_refuses_what_parse_ip_refuses(text: str) -> None:
    assert not is_ip(text)


@given(
    net=st.one_of(
        st.ip_addresses(v=4).map(lambda ip: ipaddress.ip_network(f"{ip}/26", strict=False)),
        st.ip_addresses(v=4).map(lambda ip: ipaddress.ip_network(f"{ip}/32", strict=False)),
        st.ip_addresses(v=6).map(lambda ip: ipaddress.ip_network(f"{ip}/122", strict=False)),
    ),
    ordinal=st.integers(min_value=-2, max_value=70),
)
def test_ordinal_ip_text_is_the_ordinals_ip_as_ipaddress_writes_it(
    net: ipaddress.IPv4Network | ipaddress.IPv6Network, ordinal: int
) -> None:
    try:
        want: str | None = str(ordinal_to_ip(net, ordinal))
    except AddressError:
        want = None
    if want is None:
        with pytest.raises(AddressError):
            ordinal_ip_text(net, ordinal)
    else:
        assert ordinal_ip_text(net, ordinal) == want
