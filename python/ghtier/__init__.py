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
import tempfile
import subprocess
from typing import Any, List, Optional, Sequence

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


# transformers' Qwen3-MoE config attribute -> ght's model field (trainer/model_config.hpp).
_HF_FIELDS = (("hidden_size", "d_model"), ("num_hidden_layers", "layers"),
              ("num_attention_heads", "heads"), ("num_key_value_heads", "kv_heads"),
              ("head_dim", "head_dim"), ("num_experts", "experts"),
              ("num_experts_per_tok", "top_k"), ("moe_intermediate_size", "expert_ffn"),
              ("norm_topk_prob", "norm_topk_prob"), ("rope_theta", "rope_theta"),
              ("vocab_size", "vocab"), ("tie_word_embeddings", "tied_embeddings"),
              ("rms_norm_eps", "rms_eps"))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def model_toml(config: Any, *, seq_len: int, micro_batch: int = 1, grad_accum: int = 1) -> str:
    """The `ght plan --model FILE.toml` text for a transformers Qwen3-MoE config (or a model with
    `.config`, or any object with the same attributes). Raises ValueError naming a missing one."""
    config = getattr(config, "config", config)
    lines = ["name = " + json.dumps(str(getattr(config, "model_type", "pytorch-model")))]
    for hf, field in _HF_FIELDS:
        value = getattr(config, hf, None)
        if value is None and hf == "head_dim":
            value = config.hidden_size // config.num_attention_heads
        if value is None:
            raise ValueError(f"ghtier.plan: the model's config has no {hf!r} (ghtier plans "
                             "Qwen3-MoE-shaped models: transformers' Qwen3MoeConfig fields)")
        lines.append(f"{field} = {_toml_value(value)}")
    lines += [f"seq_len = {int(seq_len)}", f"micro_batch = {int(micro_batch)}",
              f"grad_accum = {int(grad_accum)}"]
    return "\n".join(lines) + "\n"


def plan(model: Any = None, tokens_per_step: Optional[int] = None, *, seq_len: Optional[int] = None,
         micro_batch: int = 1, profile: Optional[str] = None, hbm: Optional[str] = None,
         host: Optional[str] = None, args: Sequence[str] = (), timeout: float = 300) -> Any:
    """What `ght plan` would decide for a model on this machine (or on `profile`), as JSON: the
    placement of every region, the precision and schedule chosen, the predicted step.

    model: a preset name ("seed-21b"), a model TOML path, a transformers Qwen3-MoE model or
      config (written to a TOML with `model_toml`), or None (the CLI's default); a list of
      strings is passed to the CLI as its arguments.
    tokens_per_step: tokens per optimizer step (`ght plan --tokens-per-step`: the
      gradient-accumulation steps are tokens_per_step / (seq_len x micro_batch), which must
      divide). seq_len defaults to a transformers config's max_position_embeddings.
    profile, hbm, host: `ght plan --profile/--hbm/--host` (plan for another machine or budget).

    The planner is the C++ CLI `ght` (trainer/cli), found through $GHTIER_CLI, then PATH, then
    build/bin/ght of a source checkout. Raises PlanError naming what is missing (build it with
    `cmake --build build --target ght`, or point GHTIER_CLI at it) or the CLI's error output."""
    cli: List[str] = []
    if isinstance(model, (list, tuple)):  # plan(["--model", "tiny"]): CLI arguments
        cli += [str(a) for a in model]
        model = None
    tmp = None
    try:
        if isinstance(model, (str, os.PathLike)):
            cli += ["--model", os.fspath(model)]
        elif model is not None:
            cfg = getattr(model, "config", model)
            seq = seq_len or getattr(cfg, "max_position_embeddings", None)
            if not seq:
                raise ValueError("ghtier.plan: give seq_len (the model's config has no max_position_embeddings)")
            fd, tmp = tempfile.mkstemp(prefix="ghtier-model-", suffix=".toml")
            with os.fdopen(fd, "w") as f:
                f.write(model_toml(cfg, seq_len=seq, micro_batch=micro_batch))
            cli += ["--model", tmp]
        if tokens_per_step is not None:
            cli += ["--tokens-per-step", str(int(tokens_per_step))]
        for flag, value in (("--profile", profile), ("--hbm", hbm), ("--host", host)):
            if value is not None:
                cli += [flag, str(value)]
        return _run_plan([*cli, *args], timeout)
    finally:
        if tmp:
            os.unlink(tmp)


def _run_plan(args: Sequence[str], timeout: float) -> Any:
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
