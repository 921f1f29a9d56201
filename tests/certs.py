"""A self-signed certificate for 127.0.0.1, made by `openssl`, for the tests that speak TLS (Redis over
`rediss://`, the API server's kept connections)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def self_signed(directory: Path) -> tuple[Path, Path] | None:
    """(certificate, key) written in `directory`; None where no `openssl` can make them."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    made = subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=False, capture_output=True, timeout=60,
    )  # fmt: skip
    return (cert, key) if made.returncode == 0 else None
