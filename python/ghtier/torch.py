"""ghtier for PyTorch: the tiered CUDA allocator, scoped placement and an offloaded AdamW.

    import torch, ghtier.torch as gt
    gt.use_allocator()                      # before the first CUDA tensor (GPU machines)
    with gt.placement("host"):              # CUDA tensors made here live in host memory
        table = torch.empty(1 << 28, device="cuda")
    opt = gt.AdamW(model.parameters(), lr=3e-4, state="fp32")   # master, m, v in host memory
    gt.memory_stats()["tiers"]["host"]["current"]

Importing this module imports PyTorch; `import ghtier` alone does not.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

try:
    import torch
except ImportError as _e:  # pragma: no cover - exercised by the import test in a subprocess
    raise ImportError("ghtier.torch needs PyTorch (`pip install torch`); "
                      "`import ghtier` works without it") from _e

import ghtier as _ghtier
from ghtier._host_pipeline import HostUpdatePipeline

__all__ = ["use_allocator", "allocator_in_use", "placement", "current_placement", "memory_stats",
           "where", "AdamW"]

_TIERS = {"auto": -1, "hbm": 0, "host": 1}
_TIER_NAMES = {v: k for k, v in _TIERS.items()}

# --------------------------------------------------------------------------------------------
# The allocator
# --------------------------------------------------------------------------------------------
_allocator_path: Optional[str] = None
_allocator_lock = threading.Lock()


def use_allocator() -> str:
    """Make ghtier's tiered allocator PyTorch's CUDA allocator (CUDAPluggableAllocator over the
    libghtier_alloc.so this package ships, entry points ght_torch_malloc / ght_torch_free).

    Call it before the first CUDA tensor of the process; PyTorch cannot swap an allocator that
    has served memory. Works whether ghtier or torch was imported first. Idempotent. Where the
    tensors go: GHT_TORCH_TIER (hbm by default) or placement(). Returns the library's path.

    Raises RuntimeError when PyTorch sees no CUDA device, when this ghtier was built without
    CUDA, or when the CUDA allocator is already in use."""
    global _allocator_path
    with _allocator_lock:
        if _allocator_path is not None:
            return _allocator_path
        if not torch.cuda.is_available():
            cuda = torch.version.cuda
            raise RuntimeError(
                f"ghtier.torch.use_allocator: PyTorch {torch.__version__} sees no CUDA device"
                + ("" if cuda else " (a CPU-only build of PyTorch)")
                + "; ghtier's allocator serves CUDA tensors only. On a CPU-only machine skip "
                  "use_allocator(): AdamW and memory_stats() work without it")
        core = _ghtier.core()
        if not core.has_cuda:
            raise RuntimeError(
                "ghtier.torch.use_allocator: this ghtier was built without CUDA (no nvcc when "
                "`pip install .` ran); reinstall with the CUDA toolkit's nvcc on PATH")
        core.init()
        path = core.alloc_library_path()
        alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "ght_torch_malloc", "ght_torch_free")
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            raise RuntimeError(
                "ghtier.torch.use_allocator must run before the process's first CUDA tensor "
                f"(PyTorch: {e}); call it at the start of the program") from e
        _allocator_path = path
        return path


def allocator_in_use() -> bool:
    """Whether use_allocator() has installed ghtier's allocator in this process."""
    return _allocator_path is not None


# --------------------------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------------------------
class placement(contextlib.ContextDecorator):
    """Scope where the calling thread's new CUDA tensors go: "hbm" (device memory), "host"
    (pinned host memory, or coherent system memory on GH200, that kernels read over the link)
    or "auto" (GHT_TORCH_TIER decides). Usable as `with placement("host"):` and as a decorator;
    scopes nest and restore the previous setting on exit, exceptions included.

    It steers ghtier's allocator, so it acts on CUDA tensors once use_allocator() is in effect;
    CPU tensors and tensors that already exist are not moved. It is per thread: tensors that
    autograd's engine allocates on its own threads during backward follow GHT_TORCH_TIER."""

    def __init__(self, tier: str):
        if not isinstance(tier, str) or tier.lower() not in _TIERS:
            raise ValueError(f"ghtier.torch.placement: tier {tier!r} is not one of "
                             f"{', '.join(repr(t) for t in _TIERS)}")
        self.tier = tier.lower()
        self._local = threading.local()  # a stack of previous settings per thread

    def __enter__(self) -> "placement":
        prev = _ghtier.core().set_thread_tier(_TIERS[self.tier])
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(prev)
        return self

    def __exit__(self, *exc: Any) -> bool:
        _ghtier.core().set_thread_tier(self._local.stack.pop())
        return False

    def __repr__(self) -> str:
        return f"placement({self.tier!r})"


def current_placement() -> str:
    """The calling thread's placement: "hbm", "host", or "auto" outside any placement scope."""
    return _TIER_NAMES[_ghtier.core().thread_tier()]


def memory_stats() -> dict:
    """ghtier's allocator statistics and budgets: tiers.{hbm,host}.{current, peak, total, count,
    budget, ...}, classes.{weight, master, adam_m, adam_v, ...}, all. AdamW's state is counted
    under master / adam_m / adam_v; PyTorch's tensors (use_allocator) under other."""
    return _ghtier.memory_stats()


def where(t: "torch.Tensor") -> Optional[dict]:
    """Where ghtier placed the memory of tensor t ({tier, tensor_class, bytes, region,
    spilled}), or None when it is not ghtier's."""
    return _ghtier.core().where(t.data_ptr())


# --------------------------------------------------------------------------------------------
# AdamW with its state in host memory
# --------------------------------------------------------------------------------------------
_STATES = ("fp32", "bf16", "q8")
_PATHS = ("auto", "cpu", "gpu_link", "device")
# Group keys torch.optim.AdamW keeps, so that a state_dict of either loads into the other.
_TORCH_GROUP_KEYS = dict(amsgrad=False, maximize=False, foreach=None, capturable=False,
                         differentiable=False, fused=None, decoupled_weight_decay=True)


def _resolve_path(path: str, params: List[torch.Tensor], core: Any) -> str:
    """The update path: "cpu" (host AdamW), "gpu_link" (GPU kernel, state in host memory read
    over the link) or "device" (GPU kernel, state in HBM). "auto": gpu_link when every parameter
    is a CUDA tensor and ghtier was built with CUDA, else cpu."""
    if path not in _PATHS:
        raise ValueError(f"ghtier.torch.AdamW: path {path!r} is not one of {', '.join(_PATHS)}")
    on_cuda = [p.device.type == "cuda" for p in params]
    if path == "auto":
        fits = all(p.dtype in (torch.float32, torch.bfloat16) and p.is_contiguous() for p in params)
        return "gpu_link" if on_cuda and all(on_cuda) and fits and core.has_cuda else "cpu"
    if path in ("gpu_link", "device"):
        if not core.has_cuda:
            raise RuntimeError(f"ghtier.torch.AdamW(path={path!r}) needs ghtier built with CUDA "
                               "(nvcc at `pip install .`); use path='cpu'")
        bad = [i for i, cuda in enumerate(on_cuda) if not cuda]
        if bad:
            raise ValueError(f"ghtier.torch.AdamW(path={path!r}) updates CUDA parameters only; "
                             f"parameters {bad[:8]} are on the CPU (use path='cpu' for them)")
        bad = [i for i, p in enumerate(params)
               if p.dtype not in (torch.float32, torch.bfloat16) or not p.is_contiguous()]
        if bad:
            raise ValueError(f"ghtier.torch.AdamW(path={path!r}): parameters {bad[:8]} are not "
                             "contiguous float32 or bfloat16 tensors (the kernel writes them in place)")
    return path


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW whose fp32 master weights and moments live in host memory (ghtier's
    host tier: pinned where CUDA exists) and whose update is ghtier's host AdamW
    (optimizer/adamw_cpu.cpp, OpenMP over the host NUMA node's cores).

    Per step, for each parameter with a gradient: the gradient comes to host memory (a copy
    for CUDA tensors), the update runs on the host, and the new weights go back to the
    parameter (the bf16 weights the kernel writes, for bf16 parameters). The formula is
    torch.optim.AdamW's (decoupled weight decay, bias correction).

    Args (beyond torch's lr, betas, eps, weight_decay):
      state: element type of m and v: "fp32" (as torch), "bf16" (m rounded to nearest, v
        stochastically) or "q8" (8-bit blockwise codes); see optimizer/README.md.
      path: "cpu" runs the host AdamW (gradients copied to host memory, weights copied back);
        "gpu_link" runs ghtier's GPU kernel on CUDA parameters with master/m/v in host memory,
        read and written over the link by the kernel (no separate copies; asynchronous on the
        current stream); "device" runs the same kernel with the state in HBM; "auto" (default)
        is gpu_link for CUDA parameters in a CUDA build, else cpu.
      max_grad_norm: None (default, as torch: no clipping) or a float > 0: gradients are
        scaled by min(1, max_grad_norm / (norm + 1e-6)), norm being the global L2 norm over
        every parameter of this optimizer (as clip_grad_norm_ computes it, summed in double).
      skip_nonfinite: False (default, as torch: a NaN/Inf gradient poisons the weights) or True:
        a non-finite global norm skips the whole step (weights, state and step counts unchanged;
        `steps_skipped_nonfinite` counts it), ghtier's trainer rule.
      threads: host threads of the update (0: GHT_CPU_THREADS, else the host node's cores).
      link_mode: how the gpu_link kernel reaches host state: "zero_copy" (the kernel reads it
        directly: right on a coherent link), "dma" (chunks through three HBM slots on the copy
        engines, as ghtier's C++ optimizer does over PCIe; python/ghtier/_link_stage.py), "auto"
        (zero_copy on c2c, else dma).

    state_dict() is torch.optim.AdamW's format (state[i] = {"step", "exp_avg", "exp_avg_sq"},
    fp32 moments shaped like the parameter; plus "master" for non-fp32 parameters), so
    checkpoints load into torch.optim.AdamW and back.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, state: str = "fp32",
                 path: str = "auto", max_grad_norm: Optional[float] = None,
                 skip_nonfinite: bool = False, threads: int = 0, link_mode: str = "auto"):
        if not 0.0 <= float(lr):
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if state not in _STATES:
            raise ValueError(f"ghtier.torch.AdamW: state {state!r} is not one of {', '.join(_STATES)}")
        if link_mode not in ("auto", "zero_copy", "dma"):
            raise ValueError(f"ghtier.torch.AdamW: link_mode {link_mode!r} is not one of auto, zero_copy, dma")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"ghtier.torch.AdamW: max_grad_norm must be None or > 0, got {max_grad_norm}")
        self.state_type = state
        self.max_grad_norm = max_grad_norm
        self.skip_nonfinite = bool(skip_nonfinite)
        self.threads = int(threads)
        self.steps_skipped_nonfinite = 0
        self.last_step: Optional[Dict[str, Any]] = None
        self._core = _ghtier.core()
        self._bufs: Dict[torch.Tensor, Dict[str, torch.Tensor]] = {}
        self._uploads: List[Any] = []  # CUDA events of weight uploads still reading host buffers
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        **_TORCH_GROUP_KEYS)
        super().__init__(params, defaults)
        self.path = _resolve_path(path, self._flat_params(), self._core)
        if link_mode == "auto" and self.path == "gpu_link":
            link_mode = "zero_copy" if self._core.link_kind() == "c2c" else "dma"
        self.link_mode = link_mode if self.path == "gpu_link" else None
        self._stagers: Dict[torch.device, Any] = {}
        self._hook_handles: Optional[list] = None
        self._in_backward: Optional[Dict[str, Any]] = None  # step_in_backward's step while open
        self._worker: Optional[Any] = None  # the cpu path's update thread in step_in_backward
        self._side_streams: Dict[torch.device, Tuple[Any, Any]] = {}  # its copy and upload streams

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for k, v in _TORCH_GROUP_KEYS.items():
                group.setdefault(k, v)
            group["decoupled_weight_decay"] = True

    # ---- host memory -------------------------------------------------------------------------
    def _host(self, nbytes: int, cls: int) -> torch.Tensor:
        return self._core.host_tensor(max(int(nbytes), 1), cls)

    def _host_like(self, p: torch.Tensor, dtype: torch.dtype, cls: int) -> torch.Tensor:
        n = p.numel()
        size = torch.empty((), dtype=dtype).element_size()
        return self._host(n * size, cls)[: n * size].view(dtype).view(p.shape)

    def _state_bytes(self, p: torch.Tensor, nbytes: int, cls: int) -> torch.Tensor:
        """State storage where the path keeps it: HBM beside p (device), else ghtier's host
        tier, which the gpu_link kernel must be able to reach (pinned and mapped)."""
        if self.path == "device":
            return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=p.device)
        t = self._host(nbytes, cls)
        if self.path == "gpu_link" and not self._core.gpu_reachable(t.data_ptr()):
            raise RuntimeError("ghtier.torch.AdamW(path='gpu_link'): ghtier's host memory is not "
                               "pinned, so the GPU cannot read it; unset GHT_HOST_MEMORY (or set it "
                               "to 'pinned'), or use path='cpu'")
        return t

    def _state_like(self, p: torch.Tensor, dtype: torch.dtype, cls: int) -> torch.Tensor:
        n = p.numel()
        size = torch.empty((), dtype=dtype).element_size()
        return self._state_bytes(p, n * size, cls)[: n * size].view(dtype).view(p.shape)

    def _new_moment(self, p: torch.Tensor, is_v: bool) -> torch.Tensor:
        cls = self._core.CLASS_ADAM_V if is_v else self._core.CLASS_ADAM_M
        if self.state_type == "q8":
            rec = self._state_bytes(p, self._core.state_bytes("q8", p.numel()), cls)
            return rec.zero_()  # codes 0 with scale 0: every value 0
        dtype = torch.float32 if self.state_type == "fp32" else torch.bfloat16
        return self._state_like(p, dtype, cls).zero_()

    def _master_is_param(self, p: torch.Tensor) -> bool:
        where = "cuda" if self.path == "device" else "cpu"
        return p.device.type == where and p.dtype == torch.float32 and p.is_contiguous()

    def _ensure_bufs(self, p: torch.Tensor) -> Dict[str, torch.Tensor]:
        bufs = self._bufs.get(p)
        if bufs is not None:
            return bufs
        bufs: Dict[str, Any] = {"master": None}  # None: the parameter is its own master
        st = self.state[p]
        if self._master_is_param(p):
            pass
        elif "master" in st:
            bufs["master"] = st["master"]
        else:
            master = self._state_like(p, torch.float32, self._core.CLASS_MASTER)
            master.copy_(p.detach())
            bufs["master"] = master
            if p.dtype != torch.float32:
                st["master"] = master  # more precise than the parameter: checkpoints keep it
        self._bufs[p] = bufs
        return bufs

    def _state_bufs(self, p: torch.Tensor) -> Dict[str, torch.Tensor]:
        """p's buffers, its state created on first use."""
        if len(self.state[p]) == 0:
            self._init_state(p)
        return self._ensure_bufs(p)

    def _init_state(self, p: torch.Tensor) -> None:
        st = self.state[p]
        st["step"] = torch.tensor(0.0, dtype=torch.float32)
        st["exp_avg"] = self._new_moment(p, False)
        st["exp_avg_sq"] = self._new_moment(p, True)
        self._bufs.pop(p, None)
        self._ensure_bufs(p)

    def sync_master_from_params(self) -> None:
        """Copy every parameter into its fp32 master. Call it after changing parameters outside
        step() (loading weights into the model): for parameters that are not contiguous fp32 CPU
        tensors, the optimizer's master copy is what step() updates."""
        self._wait_uploads()
        with torch.no_grad():
            for p, bufs in self._bufs.items():
                if bufs["master"] is not None:
                    bufs["master"].copy_(p.detach())

    def _wait_uploads(self) -> None:
        """Wait for what still reads or writes the state: the cpu path's weight uploads, and the
        GPU paths' kernels (queued asynchronously), before the host touches master, m or v."""
        for ev in self._uploads:
            ev.synchronize()
        self._uploads.clear()
        if self.path != "cpu":
            for dev in {p.device for p in self._bufs}:
                torch.cuda.synchronize(dev)

    # ---- the step ----------------------------------------------------------------------------
    def _host_grad(self, p: torch.Tensor, bufs: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, str]:
        g = p.grad
        if g.is_sparse:
            raise RuntimeError("ghtier.torch.AdamW does not support sparse gradients")
        kind = "bf16" if g.dtype == torch.bfloat16 else "fp32"
        if g.device.type == "cpu" and g.dtype in (torch.float32, torch.bfloat16) and g.is_contiguous():
            return g, kind
        dtype = torch.bfloat16 if kind == "bf16" else torch.float32
        stage = bufs.get("grad")
        if stage is None or stage.dtype != dtype:
            stage = bufs["grad"] = self._host_like(p, dtype, self._core.CLASS_GRAD)
        stage.copy_(g, non_blocking=True)
        return stage, kind

    @staticmethod
    def _gpu_grad(p: torch.Tensor) -> Tuple[torch.Tensor, str]:
        g = p.grad
        if g.is_sparse:
            raise RuntimeError("ghtier.torch.AdamW does not support sparse gradients")
        if g.device != p.device:
            raise RuntimeError(f"ghtier.torch.AdamW: a gradient is on {g.device}, its parameter on {p.device}")
        if g.dtype not in (torch.float32, torch.bfloat16):
            g = g.float()
        return g.contiguous(), "bf16" if g.dtype == torch.bfloat16 else "fp32"

    def _grad_sumsq(self, work: list) -> float:
        """Sum of squares of every gradient, in double: on the host (deterministic for any thread
        count) for the cpu path, from per-tensor fp32 norms on the GPU for the GPU paths."""
        if self.path == "cpu":
            return sum(self._core.grad_sumsq(g.data_ptr(), kind, p.numel(), self.threads)
                       for _, p, _, g, kind in work)
        total = 0.0
        for dev in {p.device for _, p, _, _, _ in work}:
            grads = [g for _, p, _, g, _ in work if p.device == dev]
            norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
            total += float(torch.stack(norms).double().square().sum().item())
        return total

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None):
        """One AdamW step over every parameter with a gradient; returns closure()'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._wait_uploads()
        work = []  # (group, p, bufs, grad where the update reads it, grad kind)
        cuda_devices = set()
        for group in self.param_groups:
            if group.get("amsgrad") or group.get("maximize"):
                raise NotImplementedError("ghtier.torch.AdamW supports neither amsgrad nor maximize")
            for p in group["params"]:
                if p.grad is None:
                    continue
                bufs = self._state_bufs(p)
                g, kind = self._host_grad(p, bufs) if self.path == "cpu" else self._gpu_grad(p)
                if p.grad.device.type == "cuda":
                    cuda_devices.add(p.grad.device)
                work.append((group, p, bufs, g, kind))
        if self.path == "cpu":
            for dev in cuda_devices:
                torch.cuda.synchronize(dev)  # the gradients' copies to host memory are done

        clip = 1.0
        norm = None
        if self.max_grad_norm is not None or self.skip_nonfinite:
            total = self._grad_sumsq(work)
            norm = math.sqrt(total) if total >= 0 else float("nan")
            if not math.isfinite(norm):
                if self.skip_nonfinite:
                    self.steps_skipped_nonfinite += 1
                    self.last_step = dict(taken=False, grad_norm=norm, clip_coef=1.0)
                    return loss
            elif self.max_grad_norm is not None:
                clip = min(1.0, self.max_grad_norm / (norm + 1e-6))
        self.last_step = dict(taken=True, grad_norm=norm, clip_coef=clip)

        keys = self._round_keys()
        if self.link_mode == "dma":
            for dev in {p.device for _, p, _, _, _ in work}:
                self._stager(dev).begin_step()
        for group, p, bufs, g, kind in work:
            self._update(group, p, bufs, g, kind, clip, keys[p])
        return loss

    @contextlib.contextmanager
    def step_in_backward(self):
        """One AdamW step taken during backward(): each parameter is updated as soon as its
        gradient is final (torch's register_post_accumulate_grad_hook), so the update, and on
        the gpu_link path its link traffic, overlaps the rest of the backward. On the cpu path
        the gradient copies run on a copy stream and the host updates on a worker thread, so the
        backward does not wait for them (python/ghtier/_host_pipeline.py). Put it around the
        last backward of a step (after any gradient-accumulation micro-batches):

            with opt.step_in_backward():
                loss.backward()
            opt.zero_grad()

        Parameters with a gradient whose hook did not fire in the block are updated when it
        ends, so the step covers what step() would. Clipping and skipping need the global norm
        before the first update: with max_grad_norm or skip_nonfinite set it raises ValueError.
        """
        if self.max_grad_norm is not None or self.skip_nonfinite:
            raise ValueError("ghtier.torch.AdamW.step_in_backward: max_grad_norm and skip_nonfinite need "
                             "the global gradient norm before any update; call backward() then step()")
        if self._in_backward is not None:
            raise RuntimeError("ghtier.torch.AdamW.step_in_backward is already open")
        if self._hook_handles is None:
            self._hook_handles = [p.register_post_accumulate_grad_hook(self._grad_ready)
                                  for p in self._flat_params() if p.requires_grad]
        self._wait_uploads()
        groups = {p: g for g in self.param_groups for p in g["params"]}
        pipeline = None
        if self.path == "cpu":
            if self._worker is None:
                from concurrent.futures import ThreadPoolExecutor
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="ghtier-adamw")
            pipeline = HostUpdatePipeline(self._worker, self._side_streams)
        self._in_backward = dict(keys=self._round_keys(), group_of=groups, done=set(), pipeline=pipeline)
        if self.link_mode == "dma":
            for dev in {p.device for p in groups}:
                self._stager(dev).begin_step()
        try:
            yield self
        except BaseException:
            self._in_backward = None  # the backward failed: parameters already updated stay so
            if pipeline is not None:
                with contextlib.suppress(BaseException):
                    pipeline.finish()  # no update may still run once the caller sees the error
            raise
        ctx, self._in_backward = self._in_backward, None
        if pipeline is not None:
            pipeline.finish()
        with torch.no_grad():
            for p, group in groups.items():
                if p.grad is not None and p not in ctx["done"]:
                    self._update_one(group, p, ctx["keys"][p])
        self.last_step = dict(taken=True, grad_norm=None, clip_coef=1.0)

    def _grad_ready(self, p: torch.Tensor) -> None:
        ctx = self._in_backward
        if ctx is None or p in ctx["done"] or p.grad is None:
            return
        with torch.no_grad():
            if ctx["pipeline"] is not None:
                self._update_on_worker(ctx["pipeline"], ctx["group_of"][p], p, ctx["keys"][p])
            else:
                self._update_one(ctx["group_of"][p], p, ctx["keys"][p])
        ctx["done"].add(p)

    def _update_on_worker(self, pipeline: HostUpdatePipeline, group: dict, p: torch.Tensor, key: int) -> None:
        """The cpu path in backward: queue p's gradient copy, update on the worker thread."""
        bufs = self._state_bufs(p)
        got: Dict[str, Any] = {}

        def copy_grad() -> None:
            got["g"], got["kind"] = self._host_grad(p, bufs)

        def update(upload: Optional[tuple]) -> Optional[Any]:
            with torch.no_grad():  # grad mode is per thread
                return self._update(group, p, bufs, got["g"], got["kind"], 1.0, key, upload)

        pipeline.submit(p, copy_grad, update)

    def _update_one(self, group: dict, p: torch.Tensor, key: int) -> None:
        """Update one parameter now, unclipped (step_in_backward)."""
        bufs = self._state_bufs(p)
        if self.path == "cpu":
            g, kind = self._host_grad(p, bufs)
            if p.grad.device.type == "cuda":
                torch.cuda.current_stream(p.grad.device).synchronize()  # the copy to host is done
        else:
            g, kind = self._gpu_grad(p)
        self._update(group, p, bufs, g, kind, 1.0, key)

    def _round_keys(self) -> Dict[torch.Tensor, int]:
        # bf16 state's rounding stream: one key per parameter, from its position (stable across
        # checkpoint and resume of the same model).
        keys = {}
        i = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p not in keys:
                    keys[p] = self._core.round_key(f"param.{i}")
                i += 1
        return keys

    def _update(self, group: dict, p: torch.Tensor, bufs: Dict[str, torch.Tensor], g: torch.Tensor,
                kind: str, clip: float, key: int, upload: Optional[tuple] = None) -> Optional[Any]:
        """One parameter's update; on the cpu path the new weights go back to a CUDA parameter on
        its current stream, or with `upload` = (stream, event) on that stream after that event
        (step_in_backward's pipeline), and the upload's event is returned."""
        st = self.state[p]
        st["step"] += 1
        n = p.numel()
        if n == 0:
            return
        own_master = bufs["master"] is not None
        master = bufs["master"] if own_master else p
        m, v = st["exp_avg"], st["exp_avg_sq"]
        beta1, beta2 = group["betas"]
        hyper = (float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                 float(group["weight_decay"]), int(st["step"].item()), clip, key)
        if self.path != "cpu":
            self._update_on_gpu(p, master, m, v, g, kind, hyper)
            return
        weight = None
        if p.device.type == "cuda" and p.dtype == torch.bfloat16:
            weight = bufs.get("weight")
            if weight is None:
                weight = bufs["weight"] = self._host_like(p, torch.bfloat16, self._core.CLASS_WEIGHT)
        self._core.adamw(master.data_ptr(), m.data_ptr(), v.data_ptr(), g.data_ptr(), kind,
                         weight.data_ptr() if weight is not None else 0, n, self.state_type,
                         *hyper, self.threads)
        if not own_master:
            return
        src = weight if weight is not None else master
        if p.device.type != "cuda":
            p.copy_(src)
            return None
        stream = torch.cuda.current_stream(p.device)
        if upload is not None:
            stream, after = upload
            stream.wait_event(after)
        with torch.cuda.stream(stream):
            p.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        self._uploads.append(ev)
        return ev

    def _stager(self, dev: torch.device) -> Any:
        st = self._stagers.get(dev)
        if st is None:
            from ._link_stage import LinkStager
            st = self._stagers[dev] = LinkStager(self._core, dev, self.state_type)
        return st

    def _update_on_gpu(self, p: torch.Tensor, master: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                       g: torch.Tensor, kind: str, hyper: tuple) -> None:
        """ghtier's GPU kernel on p's current stream: it reads g, reads and writes master/m/v
        (in HBM, or in host memory over the link) and writes bf16 parameters in place. An fp32
        parameter whose master is in host memory gets the master copied in after the kernel."""
        writes_weight = p.dtype == torch.bfloat16
        with torch.cuda.device(p.device):
            stream = torch.cuda.current_stream(p.device)
            if self.link_mode == "dma":
                self._stager(p.device).update(p, master, m, v, g, kind, hyper, stream)
                return
            self._core.adamw_gpu(master.data_ptr(), m.data_ptr(), v.data_ptr(), g.data_ptr(), kind,
                                 p.data_ptr() if writes_weight else 0, p.numel(), self.state_type,
                                 *hyper, stream.cuda_stream)
            if not writes_weight and master.data_ptr() != p.data_ptr():
                p.copy_(master.view(p.shape), non_blocking=True)

    # ---- checkpoints in torch.optim.AdamW's format -------------------------------------------
    def _flat_params(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _moment_to_f32(self, p: torch.Tensor, t: torch.Tensor, is_v: bool) -> torch.Tensor:
        if self.state_type == "fp32":
            return t
        if self.state_type == "bf16":
            return t.float()
        out = torch.empty(p.shape, dtype=torch.float32)
        records = t.cpu() if t.device.type != "cpu" else t
        self._core.q8_dequantize(records.data_ptr(), p.numel(), out.data_ptr(), is_v)
        return out

    def _moment_from(self, p: torch.Tensor, value: torch.Tensor, is_v: bool, where: str) -> torch.Tensor:
        if not torch.is_tensor(value) or value.numel() != p.numel():
            got = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
            raise ValueError(f"ghtier.torch.AdamW.load_state_dict: {where} has shape {got}, the "
                             f"parameter {tuple(p.shape)}; is the checkpoint from another model?")
        src = value.detach().to("cpu", torch.float32).contiguous()
        dst = self._new_moment(p, is_v)
        if self.state_type == "q8":
            host = dst if dst.device.type == "cpu" else torch.empty_like(dst, device="cpu")
            self._core.q8_quantize(src.data_ptr(), p.numel(), host.data_ptr(), is_v)
            if host is not dst:
                dst.copy_(host)
        else:
            dst.copy_(src.view(p.shape))  # bf16: round to nearest even, as ghtier's load_state
        return dst

    def state_dict(self) -> Dict[str, Any]:
        """torch.optim.AdamW's state_dict: {"state": {i: {"step", "exp_avg", "exp_avg_sq"}},
        "param_groups": [...]}, moments as fp32 tensors shaped like their parameter (bf16 and
        q8 state widened / decoded), on the host."""
        self._wait_uploads()
        sd = super().state_dict()
        if self.state_type != "fp32":
            params = self._flat_params()
            sd["state"] = {
                i: {**s, "exp_avg": self._moment_to_f32(params[i], s["exp_avg"], False),
                    "exp_avg_sq": self._moment_to_f32(params[i], s["exp_avg_sq"], True)}
                for i, s in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a state_dict of this class or of torch.optim.AdamW (any device, any dtype):
        moments are copied into host memory in this optimizer's state type; the master is the
        checkpoint's "master" where there is one, else the parameter."""
        self._wait_uploads()
        saved = state_dict.get("state", {})
        super().load_state_dict({**state_dict, "state": {}})  # groups, hyper-parameters, checks
        params = self._flat_params()
        self._bufs.clear()
        for i, s in saved.items():
            if not isinstance(i, int) or not 0 <= i < len(params):
                raise ValueError(f"ghtier.torch.AdamW.load_state_dict: state index {i!r} names no "
                                 f"parameter (this optimizer has {len(params)})")
            p = params[i]
            for key in ("step", "exp_avg", "exp_avg_sq"):
                if key not in s:
                    raise ValueError(f"ghtier.torch.AdamW.load_state_dict: state[{i}] lacks {key!r} "
                                     "(not an Adam/AdamW checkpoint?)")
            st = self.state[p]
            step = s["step"]
            st["step"] = torch.tensor(float(step.item() if torch.is_tensor(step) else step),
                                      dtype=torch.float32)
            st["exp_avg"] = self._moment_from(p, s["exp_avg"], False, f"state[{i}]['exp_avg']")
            st["exp_avg_sq"] = self._moment_from(p, s["exp_avg_sq"], True, f"state[{i}]['exp_avg_sq']")
            if "master" in s and p.dtype != torch.float32:
                master = self._state_like(p, torch.float32, self._core.CLASS_MASTER)
                master.copy_(s["master"].detach().to(torch.float32).view(p.shape))
                st["master"] = master
            self._ensure_bufs(p)
