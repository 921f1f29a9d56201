"""compose/ and the Dockerfile, offline (no Docker engine here): the compose files validate against the
official Compose Specification schema (vendored in tests/deploy/schemas, see its README), and the
properties the local stack relies on are checked on the parsed files: scalable workers, two leaders,
`ipamgc health` checks, the shared kubeconfig of the simulated cluster, Prometheus scraping every
component, rq tools in their own images, and an image that installs every package as a non-root user."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from shared import metrics_names as m
from tests.deploy.conftest import COMPOSE, ROOT

SCHEMA = Path(__file__).parent / "schemas" / "compose-spec.json"
COMPONENTS = {"watcher": "watch", "worker": "work", "leader": "lead"}
IMAGE = "ipamgc:local"


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((COMPOSE / name).read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load("docker-compose.yml")


@pytest.mark.parametrize("name", ["docker-compose.yml", "cluster.override.yml"])
def test_compose_files_are_valid_against_the_compose_spec(name: str) -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = [
        f"{list(e.absolute_path)}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(load(name))
    ]
    assert errors == []


def test_the_schema_rejects_what_compose_would() -> None:
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    assert not validator.is_valid({"services": {"a": {"image": "x", "restrat": "always"}}})
    assert not validator.is_valid({"services": {"a": {"depends_on": {"b": {"condition": "healthy"}}}}})


def test_components_run_the_image_with_health_checks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"redis", "sim", *COMPONENTS, "rq-dashboard", "rq-exporter", "prometheus"}
    for name, verb in COMPONENTS.items():
        s = services[name]
        assert s["image"] == IMAGE and s["command"][0] == verb
        assert s["healthcheck"]["test"] == [
            "CMD",
            "python",
            "-m",
            "ipamgc.commands.health",
            "--component",
            name,
        ]
        assert s["read_only"] is True and "/tmp" in s["tmpfs"]
        assert s["environment"]["IPAMGC_METRICS_PORT"] == str(m.DEFAULT_METRICS_PORT)
        assert s["depends_on"]["redis"]["condition"] == "service_healthy"
        assert s["depends_on"]["sim"] == {"condition": "service_healthy", "required": False}
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker  # `--scale worker=N` must work
    assert services["leader"]["deploy"]["replicas"] == 2
    assert "container_name" not in services["leader"] and "ports" not in services["leader"]


def test_the_simulated_cluster_hands_its_kubeconfig_to_the_components(compose: dict[str, Any]) -> None:
    sim = compose["services"]["sim"]
    cmd = sim["command"]
    assert cmd[:2] == ["sim", "serve"]
    host = cmd[cmd.index("--host") + 1]
    assert host == sim["hostname"] == "sim"  # the kubeconfig names http://sim:<port>, reachable by others
    out = cmd[cmd.index("--kubeconfig-out") + 1]
    assert "kubeconfig:/shared" in sim["volumes"]
    for name in COMPONENTS:
        s = compose["services"][name]
        assert "kubeconfig:/shared:ro" in s["volumes"]
        assert s["environment"]["IPAMGC_KUBECONFIG"] == f"${{IPAMGC_KUBECONFIG:-{out}}}"


def test_prometheus_scrapes_every_component(compose: dict[str, Any]) -> None:
    prom = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    services = set(compose["services"])
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    for name in COMPONENTS:
        [sd] = jobs[f"ipamgc-{name}"]["dns_sd_configs"]
        assert sd["names"] == [name] and sd["type"] == "A" and sd["port"] == m.DEFAULT_METRICS_PORT
    for job in jobs.values():
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                assert target.split(":")[0] in services | {"localhost"}
    exporter = compose["services"]["rq-exporter"]
    assert jobs["rq-exporter"]["static_configs"][0]["targets"] == [
        f"rq-exporter:{exporter['environment']['RQ_EXPORTER_PORT']}"
    ]
    assert (
        "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in compose["services"]["prometheus"]["volumes"]
    )


def test_rq_tools_images(compose: dict[str, Any]) -> None:
    """rq-exporter in its own image (it pins rq<3); rq-dashboard in ipamgc's, with the `dashboard` extra
    (it needs the msgpack serializer; tests/deploy/test_rq_dashboard.py runs it)."""
    exporter = compose["services"]["rq-exporter"]
    assert exporter["image"] != IMAGE
    assert exporter["build"]["args"]["PACKAGE"].startswith("rq-exporter==")
    assert (COMPOSE / exporter["build"]["dockerfile"]).is_file()
    dashboard = compose["services"]["rq-dashboard"]
    assert dashboard["image"] != IMAGE  # its own tag: the extra makes it a different image
    assert dashboard["build"]["dockerfile"] == "Dockerfile" and dashboard["build"]["context"] == ".."


def test_the_image_installs_every_package_as_a_non_root_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    # the versions CI tested: the image installs with the same constraints file
    assert re.search(r'pip install -c constraints\.txt "\.\$\{EXTRAS\}"', text)
    assert re.search(r"^COPY .*\bconstraints\.txt\b", text, re.MULTILINE)
    assert re.search(r'^ARG EXTRAS=""$', text, re.MULTILINE)
    assert re.search(r"^USER 10001:10001$", text, re.MULTILINE)
    assert re.search(r'^ENTRYPOINT \["ipamgc"\]$', text, re.MULTILINE)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = set(re.findall(r"^COPY (\S+) \./\S+$", text, re.MULTILINE))
    assert set(packages) <= copied
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :].count("*") == 1  # everything excluded, then only what is needed
    # every file or directory a COPY line names is let into the build context (a COPY of an excluded file
    # fails the build)
    sources = {src for line in re.findall(r"^COPY (.+) \S+$", text, re.MULTILINE) for src in line.split()}
    assert {*packages, "pyproject.toml", project["project"]["readme"], "constraints.txt"} <= sources
    for needed in sorted(sources):
        assert f"!{needed}/" in ignore or f"!{needed}" in ignore, f"{needed} is not in the build context"


def test_the_health_probe_module_runs_on_its_own() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ipamgc.commands.health", "--help"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 0 and b"--component" in out.stdout
