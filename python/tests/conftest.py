"""Shared helpers for ghtier's Python tests (run with `python -m pytest python/tests`)."""
import os
import subprocess
import sys

import pytest


def run_python(code, env=None, timeout=300):
    """Run `code` in a fresh interpreter (nothing imported, CUDA untouched); returns the result."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


@pytest.fixture
def python():
    return run_python
