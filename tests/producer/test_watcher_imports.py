"""The watcher lists and watches through raw requests (`kubeio.http`), never the generated API classes:
`kubernetes.client.api.core_v1_api` alone took 0.37 s to import and 21 MiB of resident memory, and the
watcher used two of its methods (docs/benchmarks-history.md).  Checked in a fresh interpreter, since
other tests of this process import it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

GENERATED = ("kubernetes.client.api.core_v1_api", "kubernetes.client.api.custom_objects_api")


def test_the_watcher_imports_none_of_the_generated_api_classes() -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from kubernetes import client as k8s
        import ipamgc.commands.watch  # the watcher's entry point and all it imports
        from producer.kube import Kind, KubeApi
        import producer.watcher
        cfg = k8s.Configuration()
        cfg.host = "http://127.0.0.1:9"
        api = KubeApi(k8s.ApiClient(cfg))
        assert api.path(Kind.PODS) == "/api/v1/pods" and api.path(Kind.NODES) == "/api/v1/nodes"
        loaded = [m for m in {GENERATED!r} if m in sys.modules]
        print(",".join(loaded))
        """
    )
    argv = [sys.executable, "-c", script]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""
