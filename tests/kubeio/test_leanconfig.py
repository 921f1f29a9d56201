"""The components read a plain Kubernetes configuration without the `kubernetes` package (`kubeio.leanconfig`)
and hand anything else to the client's loader: what users rely on is that every configuration that worked
still works, with the same server, credentials and TLS settings, and that the watcher and the leader no
longer import `kubernetes` to start."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubeio import leanconfig
from kubeio.client import api_client
from kubeio.leanconfig import LeanApiClient, NotLean, from_kubeconfig, incluster


def _kubeconfig(tmp_path: Path, cluster: dict[str, object], user: dict[str, object]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "c", "context": {"cluster": "k", "user": "u"}},
            {"name": "other", "context": {}},
        ],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_token_and_ca_kubeconfig_is_read_lean_with_the_clients_settings(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA")
    path = _kubeconfig(
        tmp_path, {"server": "https://10.0.0.1:6443/", "certificate-authority": "ca.crt"}, {"token": "t0k"}
    )
    api = api_client(str(path), user_agent="ipamgc-test", pool_size=7)
    assert isinstance(api, LeanApiClient)
    cfg = api.configuration
    assert cfg.host == "https://10.0.0.1:6443" and cfg.verify_ssl
    assert cfg.ssl_ca_cert == str(tmp_path / "ca.crt")  # relative to the kubeconfig, as the client reads it
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer t0k"
    assert api.user_agent == "ipamgc-test"
    pool = api.rest_client.pool_manager.connection_from_url("https://10.0.0.1:6443")
    assert pool.pool is not None and pool.pool.maxsize == 7
    api.close()


def test_certificate_data_and_skip_verify_are_written_as_the_client_writes_them(tmp_path: Path) -> None:
    data = base64.b64encode(b"PEM").decode()
    path = _kubeconfig(
        tmp_path,
        {"server": "https://h:6443", "insecure-skip-tls-verify": True, "tls-server-name": "api.example"},
        {"client-certificate-data": data, "client-key-data": data},
    )
    cfg = from_kubeconfig(str(path), None)
    assert not cfg.verify_ssl and cfg.tls_server_name == "api.example"
    assert cfg.cert_file is not None and Path(cfg.cert_file).read_bytes() == b"PEM"
    assert cfg.auth_settings() == {}


def test_a_token_file_is_read_again_as_it_rotates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tok").write_text("one\n")
    cfg = from_kubeconfig(str(_kubeconfig(tmp_path, {"server": "http://h"}, {"tokenFile": "tok"})), None)
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer one"
    (tmp_path / "tok").write_text("two\n")
    clock = [1000.0]
    monkeypatch.setattr("kubeio.leanconfig.time.monotonic", lambda: clock[0])
    cfg._read = (clock[0], "one")
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer one"  # within the re-read period
    clock[0] += leanconfig.TOKEN_REREAD_SECONDS
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer two"


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("CA")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = incluster(tmp_path, env)
    assert cfg.host == "https://[fd00::1]:443" and cfg.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer sa-token"
    (tmp_path / "token").unlink()
    with pytest.raises(NotLean):  # the client's loader then says which file is missing
        incluster(tmp_path, env)


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}},
        {"auth-provider": {"name": "oidc"}},
        {"username": "a", "password": "b"},
    ],
    ids=["exec", "auth-provider", "basic"],
)
def test_anything_else_goes_to_the_clients_loader(tmp_path: Path, user: dict[str, object]) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://h:6443"}, user)
    with pytest.raises(NotLean):
        from_kubeconfig(str(path), None)
    with pytest.raises(NotLean):
        from_kubeconfig(
            str(_kubeconfig(tmp_path, {"server": "https://h", "proxy-url": "http://p"}, {})), None
        )
    with pytest.raises(NotLean):  # a context without a cluster
        from_kubeconfig(str(_kubeconfig(tmp_path, {"server": "https://h"}, {})), "other")


def test_basic_auth_still_works_through_the_clients_loader(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"server": "http://h:8080"}, {"username": "a", "password": "b"})
    api = api_client(str(path))
    assert not isinstance(api, LeanApiClient)
    assert api.configuration.host == "http://h:8080"
    assert api.configuration.auth_settings()["BearerToken"]["value"] == "Basic YTpi"  # a:b
    api.close()


def test_the_components_start_without_importing_kubernetes_or_yaml() -> None:
    """Neither the client's models (~23 MiB) nor YAML, which only a kubeconfig file needs: a component in
    a pod reads the in-cluster configuration."""
    code = (
        "import sys, ipamgc.commands.watch, ipamgc.commands.lead, ipamgc.commands.work;"
        "import ipamgc.commands.combined;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'yaml')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
