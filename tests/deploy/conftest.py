"""Deployment fixtures: the manifests of `deploy/` as kustomize would assemble them.  (The RBAC test's
leader scenario and real Redis are tests/fixtures/'s, every test's.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "compose"

Obj = dict[str, Any]


def kustomization() -> Obj:
    doc = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def load_manifests() -> list[Obj]:
    """Every object of every file the kustomization lists, in order."""
    out: list[Obj] = []
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc is not None:
                out.append(doc)
    return out


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


@pytest.fixture(scope="session")
def manifests() -> list[Obj]:
    return load_manifests()
