"""ghtier: memory tiering for training across GPU memory (hbm) and host memory (host).

`import ghtier` needs neither PyTorch nor a GPU. PyTorch support lives in `ghtier.torch`
(imported on demand): the pluggable CUDA allocator, scoped placement and an AdamW whose state
lives in host memory.

    import ghtier
    ghtier.__version__
    ghtier.memory_stats()          # the allocator's per-tier and per-class usage and budgets
    ghtier.plan(["--config", "configs/small.toml"])   # runs `ght plan --json`
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any, Optional, Sequence

try:
    from importlib.metadata import PackageNotFoundError, version as _dist_version

    try:
        __version__ = _dist_version("ghtier")
    except PackageNotFoundError:  # imported from a source tree
        __version__ = "0+unknown"
except ImportError:  # pragma: no cover
    __version__ = "0+unknown"

__all__ = ["__version__", "core", "memory_stats", "plan", "PlanError"]


def core():
    """The native extension ghtier._core (allocator C ABI and host AdamW).

    Raises ImportError with the way out when the package was not built (a source checkout on
    sys.path instead of `pip install .`)."""
    try:
        from . import _core
    except ImportError as e:
        raise ImportError(
            "ghtier's native extension ghtier._core is missing or failed to load "
            f"({e}); install the package with `pip install .` from the repository root "
            "(scripts/test-python.sh does it in .venv-py)") from e
    return _core


def memory_stats() -> dict:
    """ghtier's allocator statistics: per tier {current, peak, total, count, budget, ...}, per
    tensor class, and overall (the C ABI's ght_stats_json, parsed)."""
    return json.loads(core().stats_json())


def __getattr__(name: str):
    # `ghtier.torch` without an explicit import: imported (with PyTorch) on first use only.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'ghtier' has no attribute {name!r}")


class PlanError(RuntimeError):
    """`ght plan` could not be run, or it failed."""


def _find_ght() -> Optional[str]:
    env = os.environ.get("GHTIER_CLI")
    if env:
        return env
    found = shutil.which("ght")
    if found:
        return found
    # A build tree next to this package's source checkout.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for build in ("build", "build-rel"):
        cand = os.path.join(root, build, "bin", "ght")
        if os.access(cand, os.X_OK):
            return cand
    return None


def plan(args: Sequence[str] = (), *, timeout: float = 300) -> Any:
    """Run `ght plan --json [args...]` and return its parsed JSON.

    A thin wrapper: the planner is the C++ CLI `ght` (trainer/cli), found through $GHTIER_CLI,
    then PATH, then build/bin/ght of a source checkout. Raises PlanError naming what is missing
    (build it with `cmake --build build --target ght`, or point GHTIER_CLI at it) or the CLI's
    error output."""
    exe = _find_ght()
    if exe is None:
        raise PlanError(
            "ghtier.plan needs the `ght` command-line tool, which the Python package does not "
            "ship: build it (`cmake -S . -B build -G Ninja && cmake --build build --target ght`) "
            "and put build/bin on PATH, or set GHTIER_CLI=/path/to/ght")
    cmd = [exe, "plan", "--json", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PlanError(f"`{' '.join(cmd)}` could not run: {e}") from e
    if r.returncode != 0:
        raise PlanError(f"`{' '.join(cmd)}` exited with {r.returncode}: "
                        f"{(r.stderr or r.stdout).strip()}")
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError as e:
        raise PlanError(f"`{' '.join(cmd)}` printed no JSON ({e}); its output began: "
                        f"{r.stdout[:200]!r}") from e
