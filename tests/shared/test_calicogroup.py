"""The Calico API group: chosen as libcalico-go's `UsingV3CRDs` chooses it, named as each group names its
resources, and the one field whose JSON type differs (BlockAffinity `spec.deleted`) converted both ways."""

from __future__ import annotations

from typing import Any

import pytest

from shared import calicogroup as cg
from shared.calicogroup import V1, V3
from shared.config import env_calico_group, from_env
from shared.errors import ConfigError
from shared.parse import parse_affinity


@pytest.mark.parametrize(
    ("configured", "served", "chosen"),
    [
        (None, ["apps", "projectcalico.org"], V3),  # v3 CRDs only: Calico 3.33 uses them
        (None, ["projectcalico.org", "crd.projectcalico.org"], V1),  # aggregated v3 over v1 CRDs
        (None, ["crd.projectcalico.org"], V1),
        (None, [], V1),  # neither: v1 (the lists then fail loudly with 404)
        (V1, ["projectcalico.org"], V1),  # the configured group wins over discovery
        (V3, ["crd.projectcalico.org"], V3),
    ],
)
def test_the_group_is_chosen_as_calico_does(
    configured: cg.CalicoGroup | None, served: list[str], chosen: cg.CalicoGroup
) -> None:
    assert cg.choose(configured, served) is chosen


@pytest.mark.parametrize(
    ("text", "group"),
    [
        ("projectcalico.org/v3", V3),
        ("ProjectCalico.org/V3", V3),  # Calico compares with strings.EqualFold
        (" crd.projectcalico.org/v1 ", V1),
    ],
)
def test_a_configured_group_is_read_case_insensitively(text: str, group: cg.CalicoGroup) -> None:
    assert cg.parse_group(text) is group


@pytest.mark.parametrize("text", ["projectcalico.org", "v3", "crd.projectcalico.org/v3", ""])
def test_any_other_configured_group_is_a_one_line_error(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        cg.parse_group(text)
    assert "\n" not in str(info.value)
    assert "expected projectcalico.org/v3 or crd.projectcalico.org/v1" in str(info.value)


def test_the_group_comes_from_ipamgc_then_calicos_environment_variable() -> None:
    assert from_env({}).calico_api_group is None
    assert from_env({"CALICO_API_GROUP": "projectcalico.org/v3"}).calico_api_group is V3
    env = {"IPAMGC_CALICO_API_GROUP": "crd.projectcalico.org/v1", "CALICO_API_GROUP": "projectcalico.org/v3"}
    assert from_env(env).calico_api_group is V1
    assert env_calico_group(env) is V1
    assert env_calico_group({"IPAMGC_PREFIX": "x"}) is None
    with pytest.raises(ConfigError, match="IPAMGC_CALICO_API_GROUP='v3'"):
        from_env({"IPAMGC_CALICO_API_GROUP": "v3"})
    with pytest.raises(ConfigError, match="CALICO_API_GROUP='nope'"):
        env_calico_group({"CALICO_API_GROUP": "nope"})


def test_each_group_names_its_resources() -> None:
    # v1 names are ipamgc's own; v3 renames only the IPAM configuration.
    assert [V1.plural(p) for p in cg.PLURALS] == list(cg.PLURALS)
    assert {p: V3.plural(p) for p in cg.PLURALS if V3.plural(p) != p} == {"ipamconfigs": "ipamconfigurations"}
    assert (V1.kind("ipamconfigs"), V3.kind("ipamconfigs")) == ("IPAMConfig", "IPAMConfiguration")
    assert V3.kind("blockaffinities") == V1.kind("blockaffinities") == "BlockAffinity"
    assert (V1.api_version, V3.api_version) == ("crd.projectcalico.org/v1", "projectcalico.org/v3")
    with pytest.raises(KeyError):
        V1.plural("pods")
    assert cg.plural_of_kind("IPAMConfiguration") == cg.plural_of_kind("IPAMConfig") == "ipamconfigs"
    assert cg.plural_of_kind("Pod") is None


def test_the_discovery_document_is_read_defensively() -> None:
    doc = {"kind": "APIGroupList", "groups": [{"name": "projectcalico.org"}, {"name": 3}, "x", {}]}
    assert cg.served_group_names(doc) == ["projectcalico.org"]
    for bad in ({}, {"groups": None}, [], "groups"):
        with pytest.raises(ValueError, match="no list of groups"):
            cg.served_group_names(bad)


def _affinity(group: cg.CalicoGroup, deleted: object) -> dict[str, Any]:
    return {
        "apiVersion": group.api_version,
        "kind": "BlockAffinity",
        "metadata": {"name": "node-1-10-0-0-0-26"},
        "spec": {"state": "confirmed", "node": "node-1", "cidr": "10.0.0.0/26", "deleted": deleted},
    }


@pytest.mark.parametrize(
    ("source", "deleted", "to", "expected"),
    [
        (V1, "true", V3, True),
        (V1, "false", V3, False),
        (V1, "", V3, False),  # empty reads as false, as in Calico's v1 → v3 conversion
        (V3, True, V1, "true"),
        (V3, False, V1, "false"),
        (V1, "true", V1, "true"),
        (V3, False, V3, False),
        (V1, "True", V3, "True"),  # not a value Calico writes: left as it is, for the reader to refuse
        (V3, 1, V1, 1),
    ],
)
def test_an_affinitys_deleted_is_converted_between_the_groups(
    source: cg.CalicoGroup, deleted: object, to: cg.CalicoGroup, expected: object
) -> None:
    raw = _affinity(source, deleted)
    out = cg.convert(raw, to)
    assert out["apiVersion"] == to.api_version
    assert out["spec"]["deleted"] == expected and type(out["spec"]["deleted"]) is type(expected)
    assert raw["spec"]["deleted"] == deleted  # the input is not changed
    if isinstance(expected, bool) or expected in ("true", "false"):
        # Both forms read the same (the parser of every ipamgc reader).
        assert parse_affinity(out).deleted is parse_affinity(raw).deleted is (expected in ("true", True))


def test_an_ipam_config_changes_kind_between_the_groups() -> None:
    raw = {"apiVersion": V1.api_version, "kind": "IPAMConfig", "metadata": {"name": "default"}}
    raw["spec"] = {"ipCooldownSeconds": 60, "strictAffinity": False}
    v3 = cg.convert(raw, V3)
    assert (v3["apiVersion"], v3["kind"], v3["spec"]) == (V3.api_version, "IPAMConfiguration", raw["spec"])
    back = cg.convert(v3, V1)
    assert back == raw
    assert cg.group_of(v3) is V3 and cg.group_of(back) is V1 and cg.group_of({"apiVersion": "v1"}) is None
    with pytest.raises(ValueError, match="not a Calico kind"):
        cg.convert({"kind": "Pod"}, V3)


def test_the_affinity_field_is_written_as_each_group_types_it() -> None:
    assert (V1.affinity_deleted(True), V1.affinity_deleted(False)) == ("true", "false")
    assert (V3.affinity_deleted(True), V3.affinity_deleted(False)) == (True, False)
