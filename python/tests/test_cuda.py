"""ghtier.torch on CUDA: the allocator in both import orders, placement of CUDA tensors, AdamW
with CUDA parameters; and the errors on a machine without CUDA. CUDA cases run in fresh
processes (PyTorch's allocator can only be swapped before the first CUDA tensor)."""
import textwrap

import pytest

torch = pytest.importorskip("torch")
import ghtier  # noqa: E402
import ghtier.torch as gt  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="PyTorch sees no CUDA device")
needs_cuda_build = pytest.mark.skipif(not ghtier.core().has_cuda,
                                      reason="ghtier was built without CUDA (no nvcc at install)")


@pytest.mark.skipif(HAS_CUDA, reason="checks the error on machines without CUDA")
def test_use_allocator_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match="sees no CUDA device.*skip use_allocator"):
        gt.use_allocator()
    assert not gt.allocator_in_use()


def test_auto_path_runs_on_the_host_without_a_gpu():
    assert gt.AdamW([torch.nn.Parameter(torch.zeros(3))], path="auto").path == "cpu"


PLACEMENT = """
order = ORDER
if order == "ghtier-first":
    import ghtier.torch as gt
    import torch
else:
    import torch
    import ghtier.torch as gt
gt.use_allocator()
assert gt.use_allocator() == gt.use_allocator()  # idempotent
a = torch.randn(256, 256, device="cuda")
assert gt.where(a)["tier"] == "hbm", gt.where(a)
with gt.placement("host"):
    b = torch.randn(256, 256, device="cuda")
assert gt.where(b)["tier"] == "host", gt.where(b)
c = a @ b
torch.testing.assert_close(c.cpu(), a.cpu() @ b.cpu(), rtol=1e-3, atol=1e-3)
assert gt.memory_stats()["classes"]["other"]["current"] >= 3 * 256 * 256 * 4
print("ok", order)
"""


@needs_cuda
@needs_cuda_build
@pytest.mark.parametrize("order", ["ghtier-first", "torch-first"])
def test_allocator_and_placement_on_cuda(python, order):
    r = python(PLACEMENT.replace("ORDER", repr(order)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ok {order}" in r.stdout


@needs_cuda
@needs_cuda_build
def test_use_allocator_after_cuda_use_explains(python):
    r = python(textwrap.dedent("""
        import torch, ghtier.torch as gt
        x = torch.ones(4, device="cuda")
        try:
            gt.use_allocator()
        except RuntimeError as e:
            print("error:", e)
    """))
    assert "must run before the process's first CUDA tensor" in r.stdout, r.stdout + r.stderr


ADAMW_CUDA = """
import torch, ghtier.torch as gt
H = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
torch.manual_seed(0)
init = [torch.randn(257, 65), torch.randn(1000)]
a = [torch.nn.Parameter(t.cuda()) for t in init]                   # fp32 CUDA parameters
h = [torch.nn.Parameter(t.cuda().to(torch.bfloat16)) for t in init]  # bf16 CUDA parameters
b = [torch.nn.Parameter(t.clone()) for t in init]                  # torch on the CPU
ga, gh, ref = gt.AdamW(a, **H), gt.AdamW(h, **H), torch.optim.AdamW(b, foreach=False, **H)
for t in range(50):
    gs = [torch.randn(x.shape) * 0.1 for x in init]
    for p, q, r, g in zip(a, h, b, gs):
        p.grad, q.grad, r.grad = g.cuda(), g.cuda().to(torch.bfloat16), g.clone()
    ga.step(); gh.step(); ref.step()
for p, q, r in zip(a, h, b):
    torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-6)
    assert ga.state[p]["exp_avg"].device.type == "cpu"
    assert gt.where(ga.state[p]["exp_avg"])["tier"] == "host"
    assert torch.equal(q.detach().cpu(), gh.state[q]["master"].to(torch.bfloat16))
print("ok adamw", gt.memory_stats()["classes"]["adam_v"]["current"])
"""


@needs_cuda
def test_adamw_with_cuda_parameters(python):
    r = python(ADAMW_CUDA)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok adamw" in r.stdout


ADAMW_GPU_PATHS = """
import torch, ghtier.torch as gt
H = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
torch.manual_seed(0)
init = [torch.randn(257, 65), torch.randn(1000), torch.randn(7)]
for state in ("fp32", "bf16", "q8"):
    for dtype in (torch.float32, torch.bfloat16):
        host = [torch.nn.Parameter(t.cuda().to(dtype)) for t in init]
        link = [torch.nn.Parameter(t.cuda().to(dtype)) for t in init]
        dma = [torch.nn.Parameter(t.cuda().to(dtype)) for t in init]
        dev = [torch.nn.Parameter(t.cuda().to(dtype)) for t in init]
        oh = gt.AdamW(host, state=state, path="cpu", **H)
        ol = gt.AdamW(link, state=state, path="gpu_link", link_mode="zero_copy", **H)
        # chunks of 512 parameters through the slots: several chunks per parameter, a partial last one
        oc = gt.AdamW(dma, state=state, path="gpu_link", link_mode="dma", **H)
        oc._stager(dma[0].device).chunk = 512
        od = gt.AdamW(dev, state=state, path="device", **H)
        assert gt.AdamW(link, **H).path == "gpu_link"  # auto, for CUDA parameters
        for t in range(20):
            gs = [torch.randn(x.shape) * 0.1 for x in init]
            for ps in (host, link, dma, dev):
                for p, g in zip(ps, gs):
                    p.grad = g.cuda().to(dtype)
            oh.step(); ol.step(); oc.step(); od.step()
        # The host and GPU kernels run the same operations (optimizer/adamw_kernels.hpp): with
        # bf16 and q8 state every operation is rounded on its own, the same bytes on every path;
        # with fp32 state the GPU may contract to FMA (within an fp32 ulp per operation).
        sh = oh.state_dict()
        for o, ps, name in ((ol, link, "zero_copy"), (oc, dma, "dma"), (od, dev, "device")):
            so = o.state_dict()
            for a, b in zip(host, ps):
                where = o.state[b]["exp_avg"]
                if name == "device":
                    assert where.device.type == "cuda"
                else:
                    assert gt.where(where)["tier"] == "host", gt.where(where)
                if state == "fp32":
                    ma = oh.state[a].get("master", a).float()
                    mb = o.state[b].get("master", b).float()
                    torch.testing.assert_close(mb.cpu(), ma.cpu(), rtol=1e-5, atol=1e-6)
                else:
                    assert torch.equal(b.detach(), a.detach()), (state, dtype, name)
            for i in sh["state"]:
                for k in ("exp_avg", "exp_avg_sq"):
                    x, y = so["state"][i][k].cpu(), sh["state"][i][k].cpu()
                    if state == "fp32":
                        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-8)
                    else:
                        assert torch.equal(x, y), (state, dtype, name, k)
        ref = torch.optim.AdamW([torch.nn.Parameter(t.clone()) for t in init], **H)
        ref.load_state_dict(od.state_dict())  # torch.optim.AdamW's format
        back = gt.AdamW(dev, state=state, path="device", **H)
        back.load_state_dict(ref.state_dict())
        assert back.state[dev[0]]["exp_avg"].device.type == "cuda"
        print("ok", state, dtype)

# Clipping: the GPU paths take the norm from fp32 per-tensor norms on the GPU, the cpu path from
# the host's double sum: the same coefficient to fp32 rounding.
ps = {path: [torch.nn.Parameter(t.cuda()) for t in init] for path in ("cpu", "gpu_link", "device")}
opts = {path: gt.AdamW(ps[path], path=path, max_grad_norm=1.0, **H) for path in ps}
gs = [torch.randn(x.shape) * 3.0 for x in init]
for path in ps:
    for p, g in zip(ps[path], gs):
        p.grad = g.cuda()
    opts[path].step()
c = opts["cpu"].last_step["clip_coef"]
assert c < 1.0, c
for path in ("gpu_link", "device"):
    assert abs(opts[path].last_step["clip_coef"] - c) <= 1e-6 * c, (path, opts[path].last_step, c)
print("ok gpu paths")
"""


@needs_cuda
@needs_cuda_build
def test_adamw_gpu_link_and_device_paths_match_the_host_path(python):
    r = python(ADAMW_GPU_PATHS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok gpu paths" in r.stdout


@pytest.mark.skipif(ghtier.core().has_cuda, reason="checks the error of a build without CUDA")
def test_gpu_paths_without_a_cuda_build_are_a_clear_error():
    with pytest.raises(RuntimeError, match="needs ghtier built with CUDA"):
        gt.AdamW([torch.nn.Parameter(torch.zeros(3))], path="gpu_link")


def test_gpu_paths_refuse_cpu_parameters():
    if not ghtier.core().has_cuda:
        pytest.skip("ghtier was built without CUDA: the paths refuse earlier (test above)")
    with pytest.raises(ValueError, match="CUDA parameters only"):
        gt.AdamW([torch.nn.Parameter(torch.zeros(3))], path="device")


STEP_IN_BACKWARD_CUDA = """
import torch, ghtier.torch as gt
H = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
for mode in ("zero_copy", "dma"):
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        w1, w2 = torch.randn(256, 64) * 0.3, torch.randn(32, 256) * 0.3
        a = [torch.nn.Parameter(w.cuda().to(dtype)) for w in (w1, w2)]
        b = [torch.nn.Parameter(w.cuda().to(dtype)) for w in (w1, w2)]
        oa = gt.AdamW(a, path="gpu_link", link_mode=mode, **H)
        ob = gt.AdamW(b, path="gpu_link", link_mode=mode, **H)
        if mode == "dma":
            oa._stager(a[0].device).chunk = ob._stager(b[0].device).chunk = 4096
        for t in range(5):
            x = torch.randn(128, 64, device="cuda", dtype=dtype)
            with oa.step_in_backward():
                (torch.tanh(x @ a[0].T) @ a[1].T).float().square().mean().backward()
            oa.zero_grad()
            (torch.tanh(x @ b[0].T) @ b[1].T).float().square().mean().backward()
            ob.step()
            ob.zero_grad()
        for p, q in zip(a, b):
            assert torch.equal(p.detach(), q.detach()), (mode, dtype)
print("ok step_in_backward")
"""


@needs_cuda
@needs_cuda_build
def test_step_in_backward_on_the_gpu_link_path(python):
    r = python(STEP_IN_BACKWARD_CUDA)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok step_in_backward" in r.stdout


STEP_IN_BACKWARD_CPU_PATH = """
import torch, ghtier.torch as gt
H = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
for state in ("fp32", "q8"):
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        ws = [torch.randn(512, 64) * 0.3, torch.randn(512, 512) * 0.05, torch.randn(32, 512) * 0.3]
        a = [torch.nn.Parameter(w.cuda().to(dtype)) for w in ws]
        b = [torch.nn.Parameter(w.cuda().to(dtype)) for w in ws]
        oa = gt.AdamW(a, path="cpu", state=state, **H)
        ob = gt.AdamW(b, path="cpu", state=state, **H)
        def loss(p, x):
            return (torch.tanh(torch.tanh(x @ p[0].T) @ p[1].T) @ p[2].T).float().square().mean()
        for t in range(6):
            x = torch.randn(256, 64, device="cuda", dtype=dtype)
            with oa.step_in_backward():
                loss(a, x).backward()
            oa.zero_grad(set_to_none=True)
            loss(b, x).backward()
            ob.step()
            ob.zero_grad(set_to_none=True)
        for p, q in zip(a, b):
            assert torch.equal(p.detach(), q.detach()), (state, dtype)
        assert oa._worker is not None and len(oa._side_streams) == 1
print("ok cpu path in backward")
"""


@needs_cuda
def test_step_in_backward_on_the_cpu_path_with_cuda_parameters(python):
    # Gradient copies on a copy stream, host updates on the worker thread, uploads ordered before
    # the next forward: the same weights as backward() then step(), bit for bit.
    r = python(STEP_IN_BACKWARD_CPU_PATH)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok cpu path in backward" in r.stdout
