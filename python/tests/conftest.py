"""Shared fixtures: the repository's sample data and the hubnorm CLI, whose
outputs the package must reproduce."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "data-samples"


def cli_binary() -> str:
    """The CLI to compare with: $HUBNORM_BIN, else the build directory's, else PATH's."""
    candidates = [os.environ.get("HUBNORM_BIN")]
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    candidates += [os.path.join(target, p, "hubnorm") for p in ("debug", "release")]
    candidates.append(shutil.which("hubnorm"))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no hubnorm binary to compare with: set HUBNORM_BIN (cargo build makes one)")


@pytest.fixture(scope="session")
def cli():
    binary = cli_binary()

    def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done

    return run


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


@pytest.fixture
def s3(monkeypatch):
    """A bucket ``lake`` on a real S3-compatible server (moto, from
    $HUBNORM_MOTO_SERVER or the checkout's .venv-s3, as tests/object_storage.rs
    finds it) on 127.0.0.1, with the environment that points hubnorm at it;
    stopped by its process id after the test. Without moto the test is
    skipped, unless HUBNORM_REQUIRE_S3=1 (set by .ci/run)."""
    moto = os.environ.get("HUBNORM_MOTO_SERVER") or str(ROOT / ".venv-s3" / "bin" / "moto_server")
    if not os.access(moto, os.X_OK):
        if os.environ.get("HUBNORM_REQUIRE_S3") == "1":
            pytest.fail(f"HUBNORM_REQUIRE_S3=1 but {moto} is missing")
        pytest.skip(f"no {moto} (python3 -m venv .venv-s3 && .venv-s3/bin/pip install 'moto[server]')")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                request = urllib.request.Request(f"{endpoint}/lake", method="PUT")
                urllib.request.urlopen(request, timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail(f"moto did not start on {endpoint}")
                time.sleep(0.1)
        for key, value in {
            "AWS_ENDPOINT": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "hubnorm-test-key",
            "AWS_SECRET_ACCESS_KEY": "hubnorm-test-secret",
        }.items():
            monkeypatch.setenv(key, value)
        yield "s3://lake"
    finally:
        server.kill()
        server.wait()
