"""ghtier.torch.AdamW against torch.optim.AdamW, its checkpoints in torch's format, clipping and
the non-finite skip, and its errors. CPU only; test_cuda.py covers CUDA parameters."""
import copy
import math

import pytest

torch = pytest.importorskip("torch")
import ghtier.torch as gt  # noqa: E402

# fp32 state against torch.optim.AdamW(foreach=False) on the CPU: the same formula, rounded
# differently in two places (ghtier multiplies by 1/sqrt(1-b2^t) where torch divides by
# sqrt(1-b2^t); b1*m + (1-b1)*g where torch uses lerp), so over 100 steps parameters and
# moments agree within rtol 1e-5, atol 1e-6 (measured worst: printed with -s).
RTOL, ATOL = 1e-5, 1e-6
HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def make_params(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 33), (33,), (7, 5, 3), (1,), (4096,)]  # odd sizes: SIMD tails
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.5 + 0.1).to(dtype)) for s in shapes]


def grads(params, step, seed=1):
    g = torch.Generator().manual_seed(seed * 100003 + step)
    return [torch.randn(p.shape, generator=g) * (0.1 + 0.01 * i) for i, p in enumerate(params)]


def run(opt, params, steps, start=0, skip_grad=None):
    for t in range(start, start + steps):
        for i, (p, g) in enumerate(zip(params, grads(params, t))):
            p.grad = None if skip_grad and skip_grad(t, i) else g.to(p.dtype)
        opt.step()


def worst(a, b):
    d = (a.double() - b.double()).abs()
    return d.max().item(), (d / (b.double().abs() + 1e-30)).max().item()


def assert_same(ght_params, ght_opt, ref_params, ref_opt, label):
    report = []
    for i, (p, q) in enumerate(zip(ght_params, ref_params)):
        s, r = ght_opt.state[p], ref_opt.state[q]
        assert float(s["step"]) == float(r["step"]), (label, i)
        for name, a, b in (("param", p.detach(), q.detach()), ("exp_avg", s["exp_avg"], r["exp_avg"]),
                           ("exp_avg_sq", s["exp_avg_sq"], r["exp_avg_sq"])):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{label}: {name} of param {i}")
            report.append((name, *worst(a, b)))
    absmax = max(r[1] for r in report)
    print(f"{label}: worst |diff| {absmax:.3g}")
    return absmax


def test_fp32_matches_torch_adamw_over_100_steps():
    a, b = make_params(), make_params()
    ght = gt.AdamW(a, **HYPER)
    ref = torch.optim.AdamW(b, foreach=False, **HYPER)
    # Parameter 3 skips every third step (no gradient: its step count lags, as in torch).
    run(ght, a, 100, skip_grad=lambda t, i: i == 3 and t % 3 == 0)
    run(ref, b, 100, skip_grad=lambda t, i: i == 3 and t % 3 == 0)
    assert float(ght.state[a[3]]["step"]) == 66
    assert_same(a, ght, b, ref, "100 steps")
    # Something happened: the parameters moved well beyond the tolerance.
    assert (a[0].detach() - make_params()[0]).abs().max() > 100 * ATOL


def test_param_groups_and_lr_changes():
    a, b = make_params(), make_params()
    groups = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0, "lr": 1e-2}]
    ght = gt.AdamW(groups(a), **HYPER)
    ref = torch.optim.AdamW(groups(b), foreach=False, **HYPER)
    for t in range(30):
        for opt in (ght, ref):
            opt.param_groups[0]["lr"] = 1e-3 * (1 + math.cos(t / 10))
        run(ght, a, 1, start=t)
        run(ref, b, 1, start=t)
    assert_same(a, ght, b, ref, "groups")


def test_state_dict_ght_to_torch_and_back():
    a, b = make_params(), make_params()
    ght = gt.AdamW(a, **HYPER)
    run(ght, a, 20)
    sd = ght.state_dict()
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert sd["state"][0]["exp_avg"].dtype == torch.float32 and sd["state"][0]["exp_avg"].shape == a[0].shape
    # ghtier -> torch: torch continues from ghtier's state.
    with torch.no_grad():
        for p, q in zip(a, b):
            q.copy_(p)
    ref = torch.optim.AdamW(b, foreach=False, **HYPER)
    ref.load_state_dict(copy.deepcopy(sd))
    assert ref.param_groups[0]["decoupled_weight_decay"] is True
    run(ght, a, 20, start=20)
    run(ref, b, 20, start=20)
    assert_same(a, ght, b, ref, "ghtier->torch")
    # torch -> ghtier: a fresh ghtier optimizer continues from torch's state.
    c = make_params()
    with torch.no_grad():
        for p, q in zip(c, b):
            p.copy_(q)
    ght2 = gt.AdamW(c, **HYPER)
    ght2.load_state_dict(copy.deepcopy(ref.state_dict()))
    run(ght2, c, 20, start=40)
    run(ref, b, 20, start=40)
    assert_same(c, ght2, b, ref, "torch->ghtier")


@pytest.mark.parametrize("state", ["bf16", "q8"])
def test_compact_state_round_trips_exactly(state):
    a = make_params()
    opt = gt.AdamW(a, state=state, **HYPER)
    run(opt, a, 10)
    sd = copy.deepcopy(opt.state_dict())  # as torch's, it refers to live step tensors
    for s, p in zip(sd["state"].values(), a):
        assert s["exp_avg"].dtype == torch.float32 and s["exp_avg"].shape == p.shape
    # Reloaded into a fresh optimizer of the same type, the stored state is the same bytes.
    b = make_params()
    with torch.no_grad():
        for p, q in zip(b, a):
            p.copy_(q)
    opt2 = gt.AdamW(b, state=state, **HYPER)
    opt2.load_state_dict(copy.deepcopy(sd))
    for p, q in zip(a, b):
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][k], opt2.state[q][k]), (state, k)
    run(opt, a, 5, start=10)
    run(opt2, b, 5, start=10)
    for p, q in zip(a, b):
        assert torch.equal(p, q), state
    # And the widened state loads into torch.optim.AdamW.
    ref = torch.optim.AdamW(make_params(), foreach=False, **HYPER)
    ref.load_state_dict(copy.deepcopy(sd))
    assert float(ref.state[ref.param_groups[0]["params"][0]]["step"]) == 10


@pytest.mark.parametrize("state", ["bf16", "q8"])
def test_compact_state_tracks_fp32(state):
    a, b = make_params(), make_params()
    opt, ref = gt.AdamW(a, state=state, **HYPER), gt.AdamW(b, **HYPER)
    run(opt, a, 50)
    run(ref, b, 50)
    moved = (b[0].detach() - make_params()[0]).abs().mean()
    off = (a[0].detach() - b[0].detach()).abs().mean()
    assert off < 0.1 * moved, (state, off.item(), moved.item())


def test_bf16_parameters_keep_an_fp32_master():
    a = make_params(dtype=torch.bfloat16)
    b = make_params()  # fp32 reference: the master follows it
    opt = gt.AdamW(a, **HYPER)
    ref = gt.AdamW(b, **HYPER)
    for t in range(20):
        for p, q, g in zip(a, b, grads(a, t)):
            p.grad, q.grad = g.to(torch.bfloat16), g.to(torch.bfloat16).float()
        opt.step()
        ref.step()
    for p, q in zip(a, b):
        master = opt.state[p]["master"]
        assert master.dtype == torch.float32
        torch.testing.assert_close(master, q.detach(), rtol=0, atol=2e-2)  # start rounded to bf16
        assert torch.equal(p.detach(), master.to(torch.bfloat16))
    assert "master" in opt.state_dict()["state"][0]


def test_clipping_matches_clip_grad_norm():
    a, b = make_params(), make_params()
    ght = gt.AdamW(a, max_grad_norm=0.5, **HYPER)
    ref = torch.optim.AdamW(b, foreach=False, **HYPER)
    for t in range(20):
        for p, q, g in zip(a, b, grads(a, t)):
            p.grad, q.grad = g.clone(), g.clone()
        ght.step()
        norm = torch.nn.utils.clip_grad_norm_(b, 0.5)
        ref.step()
        assert ght.last_step["clip_coef"] < 1
        assert ght.last_step["grad_norm"] == pytest.approx(norm.item(), rel=1e-5)
    assert_same(a, ght, b, ref, "clipped")


def test_nonfinite_gradient_skips_the_step():
    a = make_params()
    opt = gt.AdamW(a, skip_nonfinite=True, **HYPER)
    run(opt, a, 3)
    before = [p.detach().clone() for p in a]
    state = copy.deepcopy(opt.state_dict())
    for p, g in zip(a, grads(a, 3)):
        p.grad = g
    a[2].grad[0, 0, 0] = float("nan")
    opt.step()
    assert opt.last_step["taken"] is False and opt.steps_skipped_nonfinite == 1
    for p, q in zip(a, before):
        assert torch.equal(p.detach(), q)
    after = opt.state_dict()
    for i, s in state["state"].items():
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(after["state"][i][k], s[k]), k
    # Without the skip, a NaN gradient reaches the weights, as with torch.optim.AdamW.
    plain = gt.AdamW(make_params(), **HYPER)
    for p, g in zip(plain.param_groups[0]["params"], grads(a, 0)):
        p.grad = g
    plain.param_groups[0]["params"][0].grad[0, 0] = float("inf")
    plain.step()
    assert not torch.isfinite(plain.param_groups[0]["params"][0]).all()


def test_closure_and_zero_size_parameters():
    a = make_params() + [torch.nn.Parameter(torch.empty(0))]
    opt = gt.AdamW(a, **HYPER)

    def closure():
        for p, g in zip(a, grads(a, 0) + [torch.empty(0)]):
            p.grad = g
        return 1.5

    assert opt.step(closure) == 1.5
    assert float(opt.state[a[-1]]["step"]) == 1


def test_errors_name_the_way_out():
    p = make_params()
    # CPU parameters on a GPU path: refused, naming the path and the way out (a build without
    # CUDA refuses earlier, naming the build; test_cuda.py checks both).
    with pytest.raises((ValueError, RuntimeError), match="path='gpu_link'.*(CUDA parameters only|built with CUDA)"):
        gt.AdamW(p, path="gpu_link")
    with pytest.raises((ValueError, RuntimeError), match="path='device'.*path='cpu'"):
        gt.AdamW(p, path="device")
    with pytest.raises(ValueError, match="state 'fp8' is not one of fp32, bf16, q8"):
        gt.AdamW(p, state="fp8")
    with pytest.raises(ValueError, match="path 'gpu'"):
        gt.AdamW(p, path="gpu")
    with pytest.raises(ValueError, match="beta"):
        gt.AdamW(p, betas=(1.0, 0.9))
    opt = gt.AdamW(p, **HYPER)
    run(opt, p, 1)
    sd = opt.state_dict()
    sd["state"][0]["exp_avg"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"state\[0\]\['exp_avg'\] has shape \(3,\)"):
        gt.AdamW(make_params(), **HYPER).load_state_dict(sd)
    opt.param_groups[0]["amsgrad"] = True
    with pytest.raises(NotImplementedError, match="amsgrad"):
        run(opt, p, 1)


def test_step_in_backward_matches_backward_then_step():
    # A small two-layer model: each weight is updated in its post-accumulate-grad hook while the
    # backward goes on; the result equals backward() then step(), for every state type.
    for state in ("fp32", "bf16", "q8"):
        torch.manual_seed(0)
        w1, w2 = torch.randn(16, 8) * 0.3, torch.randn(4, 16) * 0.3
        a = [torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())]
        b = [torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())]
        oa, ob = gt.AdamW(a, state=state, **HYPER), gt.AdamW(b, state=state, **HYPER)
        for t in range(5):
            x = torch.randn(32, 8)
            with oa.step_in_backward():
                (torch.tanh(x @ a[0].T) @ a[1].T).square().mean().backward()
            oa.zero_grad()
            (torch.tanh(x @ b[0].T) @ b[1].T).square().mean().backward()
            ob.step()
            ob.zero_grad()
        for p, q in zip(a, b):
            assert torch.equal(p.detach(), q.detach()), state
        assert float(oa.state[a[0]]["step"]) == 5


def test_step_in_backward_updates_parameters_whose_hook_did_not_fire_and_refuses_clipping():
    p = make_params()
    opt = gt.AdamW(p, **HYPER)
    before = [q.detach().clone() for q in p]
    with opt.step_in_backward():
        for q, g in zip(p, grads(p, 0)):
            q.grad = g  # set by hand: no hook fires
    assert all(not torch.equal(q.detach(), b) for q, b in zip(p, before))
    with pytest.raises(ValueError, match="max_grad_norm and skip_nonfinite"):
        with gt.AdamW(p, max_grad_norm=1.0, **HYPER).step_in_backward():
            pass
