"""Shared fixtures: the repository's sample data and the hubnorm CLI, whose
outputs the package must reproduce."""

from __future__ import annotations

import os
import shutil
import subprocess
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
