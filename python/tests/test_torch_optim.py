"""dos.torch.Adam/AdamW against torch.optim.Adam/AdamW, on whatever torch is installed
(CI: Debian's 1.13). dos matches torch to torch.testing's float32 tolerance, as the C++
reference tests establish (its fused expression rounds differently from torch's chain
of tensor ops in the last bit), so trajectories are compared with assert_close;
backends of dos itself are compared bit for bit."""

import io
import math
import subprocess
import sys

import pytest
import torch

import dos
import dos.torch

PAIRS = {"AdamW": (torch.optim.AdamW, dos.torch.AdamW), "Adam": (torch.optim.Adam, dos.torch.Adam)}


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.LayerNorm(24), torch.nn.GELU(), torch.nn.Linear(24, 3))
    return m.to(dtype)


def batch(step, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(16, 12, generator=g).to(dtype), torch.randn(16, 3, generator=g).to(dtype)


def groups_of(model, lr, wd):
    # The usual LLM split: decay on matrices, none on biases and norms.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0, "lr": lr * 0.5}]


def loss_of(model, step):
    x, y = batch(step, next(model.parameters()).dtype)
    return ((model(x) - y) ** 2).mean()


def train(make_opt, steps=8, clip=None, seed=0, scheduler=None, closure=False, dtype=torch.float32):
    """Trains a small model; returns its parameters after every step and the optimizer."""
    model = make_model(seed, dtype)
    opt = make_opt(model)
    sched = scheduler(opt) if scheduler else None
    history = []
    for t in range(steps):
        def closure_fn():
            opt.zero_grad()
            loss = loss_of(model, t)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            return loss

        if closure:
            loss = opt.step(closure_fn)
            assert loss is not None and math.isfinite(loss.item())
        else:
            closure_fn()
            opt.step()
        if sched:
            sched.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history, opt, model


def assert_trajectories_close(a, b):
    for step, (pa, pb) in enumerate(zip(a, b)):
        for i, (x, y) in enumerate(zip(pa, pb)):
            torch.testing.assert_close(x, y, msg=lambda m: f"step {step}, parameter {i}: {m}")


OPTIONS = [
    dict(),
    dict(amsgrad=True),
    dict(maximize=True),
    dict(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
    dict(amsgrad=True, maximize=True, weight_decay=0.05),
]


@pytest.mark.parametrize("kind", PAIRS)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "defaults")
def test_trajectory_matches_torch(kind, options):
    ref, ours = PAIRS[kind]
    wd = options.get("weight_decay", 0.02)
    extra = {k: v for k, v in options.items() if k != "weight_decay"}
    sched = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)  # noqa: E731
    a, _, _ = train(lambda m: ref(groups_of(m, 3e-3, wd), lr=3e-3, **extra), scheduler=sched)
    b, opt, _ = train(lambda m: ours(groups_of(m, 3e-3, wd), lr=3e-3, threads=2, **extra), scheduler=sched)
    assert_trajectories_close(a, b)
    assert opt.last_report["step"] == 8
    # The scheduler reached dos: the last lr it set is the one the engine holds.
    assert opt.param_groups[0]["lr"] == pytest.approx(3e-3 * 0.5 ** 2)


def test_closure_and_cosine_schedule():
    sched = lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)  # noqa: E731
    a, _, _ = train(lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), scheduler=sched, closure=True)
    b, _, _ = train(lambda m: dos.torch.AdamW(m.parameters(), lr=1e-2), scheduler=sched, closure=True)
    assert_trajectories_close(a, b)


def test_defaults_are_torchs():
    p = [torch.nn.Parameter(torch.zeros(3))]
    for ref, ours in PAIRS.values():
        assert ours(p).defaults == {k: v for k, v in ref(p).defaults.items() if k in ours(p).defaults}


@pytest.mark.parametrize("kind", PAIRS)
def test_clipping_matches_clip_grad_norm(kind):
    ref, ours = PAIRS[kind]
    a, _, _ = train(lambda m: ref(m.parameters(), lr=1e-2), clip=0.05)
    b, opt, _ = train(lambda m: ours(m.parameters(), lr=1e-2, max_grad_norm=0.05))
    assert_trajectories_close(a, b)
    assert opt.last_report["clip_coef"] < 1  # the bound was active


def test_reported_norm_is_clip_grad_norms():
    model = make_model()
    opt = dos.torch.AdamW(model.parameters(), max_grad_norm=1e9)
    loss_of(model, 0).backward()
    expected = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
    opt.step()
    assert opt.last_report["grad_norm"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_parameters_keep_an_fp32_master(dtype):
    # torch.optim on 16-bit parameters keeps 16-bit state; dos keeps an fp32 master.
    # The reference is therefore torch on fp32 copies fed the same (16-bit) gradients:
    # dos's master must follow it, and the 16-bit value must be the master rounded.
    torch.manual_seed(3)
    shapes = [(33, 7), (101,), (5,)]
    p16 = [torch.nn.Parameter((torch.randn(s) * 0.5).to(dtype)) for s in shapes]
    p32 = [torch.nn.Parameter(p.detach().float()) for p in p16]
    ours = dos.torch.AdamW([{"params": p16[:2]}, {"params": p16[2:], "weight_decay": 0}], lr=1e-2)
    ref = torch.optim.AdamW([{"params": p32[:2]}, {"params": p32[2:], "weight_decay": 0}], lr=1e-2)
    for t in range(6):
        for a, b in zip(p16, p32):
            a.grad = torch.randn(a.shape).to(dtype)
            b.grad = a.grad.float()
        ours.step()
        ref.step()
        state = ours.state_dict()["state"]
        for i, (a, b) in enumerate(zip(p16, p32)):
            master = state[i]["master"].view(a.shape)
            torch.testing.assert_close(master, b.detach())
            assert torch.equal(a.detach(), master.to(dtype)), f"step {t}, parameter {i}"


@pytest.mark.parametrize("kind", PAIRS)
@pytest.mark.parametrize("amsgrad", [False, True])
def test_state_dict_torch_to_dos(kind, amsgrad):
    ref, ours = PAIRS[kind]
    model_a, model_b = make_model(), make_model()
    opt_a = ref(groups_of(model_a, 1e-2, 0.1), lr=1e-2, amsgrad=amsgrad)
    for t in range(3):
        opt_a.zero_grad()
        loss_of(model_a, t).backward()
        opt_a.step()
    buf = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "opt": opt_a.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf)
    model_b.load_state_dict(ckpt["model"])
    opt_b = ours(groups_of(model_b, 1e-2, 0.1), lr=1e-2, amsgrad=amsgrad)
    opt_b.load_state_dict(ckpt["opt"])
    for t in range(3, 6):
        for m, o in ((model_a, opt_a), (model_b, opt_b)):
            o.zero_grad()
            loss_of(m, t).backward()
            o.step()
    for x, y in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(x, y)
    sa, sb = opt_a.state_dict(), opt_b.state_dict()
    assert sb["state"].keys() == sa["state"].keys()
    for i in sa["state"]:
        assert float(sb["state"][i]["step"]) == float(sa["state"][i]["step"]) == 6
        for key in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ()):
            torch.testing.assert_close(sb["state"][i][key], sa["state"][i][key])


@pytest.mark.parametrize("kind", PAIRS)
@pytest.mark.parametrize("amsgrad", [False, True])
def test_state_dict_dos_to_torch(kind, amsgrad):
    ref, ours = PAIRS[kind]
    model_a, model_b = make_model(), make_model()
    opt_a = ours(groups_of(model_a, 1e-2, 0.1), lr=1e-2, amsgrad=amsgrad)
    sched = torch.optim.lr_scheduler.StepLR(opt_a, step_size=2, gamma=0.5)
    for t in range(3):
        opt_a.zero_grad()
        loss_of(model_a, t).backward()
        opt_a.step()
        sched.step()
    buf = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "opt": opt_a.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf)
    model_b.load_state_dict(ckpt["model"])
    opt_b = ref(groups_of(model_b, 1e-2, 0.1), lr=1e-2, amsgrad=amsgrad)
    opt_b.load_state_dict(ckpt["opt"])
    assert opt_b.param_groups[0]["lr"] == opt_a.param_groups[0]["lr"]  # the scheduled lr travelled
    for t in range(3, 6):
        for m, o in ((model_a, opt_a), (model_b, opt_b)):
            o.zero_grad()
            loss_of(m, t).backward()
            o.step()
    for x, y in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(x, y)


def test_state_dict_round_trip_dos_to_dos_is_exact():
    model_a, model_b = make_model(dtype=torch.bfloat16), make_model(dtype=torch.bfloat16)
    opt_a = dos.torch.AdamW(model_a.parameters(), lr=1e-2, amsgrad=True)
    for t in range(3):
        opt_a.zero_grad()
        loss_of(model_a, t).backward()
        opt_a.step()
    model_b.load_state_dict(model_a.state_dict())
    opt_b = dos.torch.AdamW(model_b.parameters(), lr=1e-2, amsgrad=True)
    opt_b.load_state_dict(opt_a.state_dict())
    for t in range(3, 5):
        for m, o in ((model_a, opt_a), (model_b, opt_b)):
            o.zero_grad()
            loss_of(m, t).backward()
            o.step()
    for x, y in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(x, y)  # the fp32 master travelled in the checkpoint


def test_fresh_state_dict_is_empty_like_torchs():
    model = make_model()
    assert dos.torch.AdamW(model.parameters()).state_dict()["state"] == {}
    assert torch.optim.AdamW(model.parameters()).state_dict()["state"] == {}


# ---- gradients reported during backward ----------------------------------------------


def backward_then_step(hooks, mutate=None, steps=3):
    model = make_model()
    opt = dos.torch.AdamW(model.parameters(), lr=1e-2, max_grad_norm=0.05, grad_hooks=hooks)
    norms, ready = [], []
    for t in range(steps):
        opt.zero_grad()
        before = opt._ready_calls
        loss_of(model, t).backward()
        ready.append(opt._ready_calls - before)
        if mutate:
            mutate(model)
        opt.step()
        norms.append(opt.last_report["grad_norm"])
    return norms, ready, [p.detach().clone() for p in model.parameters()]


def test_hooks_report_every_gradient_during_backward():
    n = len(list(make_model().parameters()))
    _, ready, _ = backward_then_step(hooks=True)
    assert ready == [n, n, n]
    _, ready, _ = backward_then_step(hooks=False)
    assert ready == [0, 0, 0]


def test_statistics_from_backward_equal_those_from_step():
    norms_hooks, _, params_hooks = backward_then_step(hooks=True)
    norms_step, _, params_step = backward_then_step(hooks=False)
    assert norms_hooks == norms_step  # the same sum, in the same order: bit-identical
    for x, y in zip(params_hooks, params_step):
        assert torch.equal(x, y)


def test_statistics_are_taken_during_backward():
    # Changing the gradients after backward shows when the norm was taken: with the
    # hooks it is the norm of backward's gradients; without, the norm at step().
    double = lambda m: [p.grad.mul_(2) for p in m.parameters()]  # noqa: E731
    with_hooks, _, _ = backward_then_step(hooks=True, mutate=double, steps=1)
    at_step, _, _ = backward_then_step(hooks=False, mutate=double, steps=1)
    plain, _, _ = backward_then_step(hooks=False, steps=1)
    assert with_hooks[0] == plain[0]
    assert at_step[0] == pytest.approx(2 * plain[0], rel=1e-6)


def test_hooks_registered_under_no_grad_still_fire():
    model = make_model()
    with torch.no_grad():
        opt = dos.torch.AdamW(model.parameters(), max_grad_norm=1.0)
    loss_of(model, 0).backward()
    assert opt._ready_calls == len(list(model.parameters()))


def test_hooks_are_on_by_default_only_when_they_pay():
    model = make_model()
    assert not dos.torch.AdamW(model.parameters())._use_hooks
    assert dos.torch.AdamW(model.parameters(), max_grad_norm=1.0)._use_hooks
    assert dos.torch.AdamW(model.parameters(), loss_scaling=True)._use_hooks


# ---- loss scaling ------------------------------------------------------------------


def test_loss_scaling_unscales_and_skips_overflow():
    # GradScaler on the CPU needs torch 2.x; the reference is its arithmetic by hand:
    # backward of loss * scale, gradients / scale, skip and halve on inf.
    model_a, model_b = make_model(), make_model()
    ref = torch.optim.AdamW(model_a.parameters(), lr=1e-2)
    ours = dos.torch.AdamW(model_b.parameters(), lr=1e-2, max_grad_norm=0.05,
                           loss_scaling=dict(init_scale=1024.0, growth_interval=3))
    scale = 1024.0
    for t in range(7):
        ref.zero_grad()
        ours.zero_grad()
        assert ours.loss_scale == scale
        # At t == 2 the loss overflows, so backward writes inf/NaN gradients: both skip
        # the step. (Made during backward: the hooks take the statistics then.)
        blow_up = 1e38 if t == 2 else 1.0
        (loss_of(model_a, t) * scale * blow_up).backward()
        (loss_of(model_b, t) * ours.loss_scale * blow_up).backward()
        grads = [p.grad for p in model_a.parameters()]
        if all(torch.isfinite(g).all() for g in grads):
            for g in grads:
                g.div_(scale)
            torch.nn.utils.clip_grad_norm_(model_a.parameters(), 0.05)
            ref.step()
        before = [p.detach().clone() for p in model_b.parameters()]
        ours.step()
        if t == 2:
            assert ours.last_report["overflow"] and not ours.last_report["applied"]
            assert all(torch.equal(x, y) for x, y in zip(before, model_b.parameters()))
            scale /= 2
            clean = 0
        else:
            clean = clean + 1 if t > 2 else t + 1
            if clean == 3:
                scale *= 2
                clean = 0
        for x, y in zip(model_a.parameters(), model_b.parameters()):
            torch.testing.assert_close(x, y)
    assert ours.loss_scale == scale


# ---- the emulated device ------------------------------------------------------------


@pytest.mark.parametrize("policy", ["fixed_stride:1", "fixed_stride:2", "automatic_stride", "static_fraction:0.5",
                                    "balanced", "all_cpu", "resident_then_stride:4:0.5", "resident_then_stride::0"])
def test_emulated_device_is_bit_identical_to_cpu(policy):
    def make(backend):
        # Small subgroups, so the policy has several to place.
        return lambda m: dos.torch.AdamW(groups_of(m, 1e-2, 0.1), lr=1e-2, amsgrad=True, backend=backend,
                                         subgroup_elements=128, policy=policy, max_grad_norm=0.05)

    a, opt_a, _ = train(make("cpu"), steps=5)
    b, opt_b, _ = train(make("emulated"), steps=5)
    for pa, pb in zip(a, b):
        for x, y in zip(pa, pb):
            assert torch.equal(x, y)
    sa, sb = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    for i in sa:
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            assert torch.equal(sa[i][key], sb[i][key])
    if policy == "fixed_stride:1":
        assert opt_b.last_report["device_subgroups"] > 0  # the device did take part


# ---- bad input -----------------------------------------------------------------------


def test_bad_hyperparameters_raise_valueerror_with_doss_message():
    p = [torch.nn.Parameter(torch.zeros(4))]
    with pytest.raises(ValueError, match=r"dos: .*lr must be finite and >= 0, got -1"):
        dos.torch.AdamW(p, lr=-1)
    with pytest.raises(ValueError, match="beta2 must be in"):
        dos.torch.Adam(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="eps"):
        dos.torch.Adam(p, eps=0)
    with pytest.raises(TypeError):
        dos.torch.Adam(p, lr="fast")
    with pytest.raises(ValueError, match="unknown backend"):
        dos.torch.AdamW(p, backend="tpu")
    for policy, message in [
        ("random", "unknown policy"),
        ("fixed_stride:0", "fixed_stride needs a whole number"),
        ("automatic_stride:1.5", "automatic_stride needs a whole number"),
        ("static_fraction:2", "policy fraction must be in"),
        ("resident_then_stride:8:1.5", r"resident_then_stride's fixed share must be in \[0, 1\], got 1.5"),
        ("fixed_stride:2:0.5", "policy fixed_stride takes at most one argument"),
        ("random::0.5", "unknown policy 'random'"),
        ("resident_then_stride:8:", "second argument is empty"),
        ("resident_then_stride:8:0.25:1", "at most two arguments"),
        ("resident_then_stride:8:quarter", "arguments must be numbers"),
    ]:
        with pytest.raises(ValueError, match=message):
            dos.torch.AdamW(p, backend="emulated", policy=policy)
    with pytest.raises(ValueError, match="threads must be >= 0"):
        dos.torch.AdamW(p, threads=-1)
    with pytest.raises(ValueError, match="subgroup_elements must be >= 1"):
        dos.torch.AdamW(p, subgroup_elements=0)
    with pytest.raises(TypeError, match="threads must be an int"):
        dos.torch.AdamW(p, threads=2.5)
    with pytest.raises(ValueError, match="max_grad_norm"):
        dos.torch.AdamW(p, max_grad_norm=-1)
    with pytest.raises(ValueError, match="power of two"):
        dos.torch.AdamW(p, loss_scaling=dict(init_scale=1000.0))
    with pytest.raises(ValueError, match="capturable"):
        dos.torch.AdamW(p, capturable=True)


def test_cuda_backend_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    # No toolkit at build time: ValueError (a choice this build cannot honour); a
    # toolkit but no device: the CUDA backend's RuntimeError, which says why.
    with pytest.raises(ValueError if not dos.has_cuda else RuntimeError, match="dos: .*(cuda|CUDA)"):
        dos.torch.AdamW([torch.nn.Parameter(torch.zeros(4))], backend="cuda")


def test_bad_parameters_raise():
    with pytest.raises(TypeError, match=r"dos: parameter 0 .* torch.float64"):
        dos.torch.AdamW([torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))])
    with pytest.raises(ValueError, match="not contiguous"):
        dos.torch.AdamW([torch.nn.Parameter(torch.zeros(4, 3).t())])
    with pytest.raises(ValueError, match="empty"):
        dos.torch.AdamW([{"params": []}])


def snapshot(model, opt):
    return [p.detach().clone() for p in model.parameters()], opt.state_dict()


def assert_unchanged(before, model, opt):
    params, sd = before
    assert all(torch.equal(x, y) for x, y in zip(params, model.parameters()))
    now = opt.state_dict()
    assert now["param_groups"] == sd["param_groups"]
    for i in sd["state"]:
        for k in sd["state"][i]:
            assert torch.equal(sd["state"][i][k], now["state"][i][k])


def test_a_none_gradient_skips_the_parameter_and_its_step_count():
    model = make_model()
    opt = dos.torch.AdamW(model.parameters(), lr=1e-2)
    loss_of(model, 0).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss_of(model, 1).backward()
    model[3].bias.grad = None
    kept = model[3].bias.detach().clone()
    state_before = {k: v.clone() for k, v in opt.state_dict()["state"][5].items()}
    opt.step()
    assert torch.equal(model[3].bias.detach(), kept)
    after = opt.state_dict()["state"]
    assert all(torch.equal(state_before[k], after[5][k]) for k in state_before)
    assert after[5]["step"].item() == 1.0 and after[0]["step"].item() == 2.0


def test_bad_gradient_is_caught_by_the_engine_and_changes_nothing():
    model = make_model()
    opt = dos.torch.AdamW(model.parameters(), lr=1e-2)
    loss_of(model, 0).backward()
    opt.step()
    before = snapshot(model, opt)
    loss_of(model, 1).backward()
    # torch lets `.data` be rebound to another size; the engine's per-step view check
    # stops it before anything is written.
    kept = model[0].bias.data
    model[0].bias.data = torch.zeros(5)
    with pytest.raises(ValueError, match="dos: parameter 1: value has 5 elements, but had 24 when the optimizer"):
        opt.step()
    model[0].bias.data = kept
    assert_unchanged(before, model, opt)


def test_bad_scheduled_lr_changes_nothing():
    model = make_model()
    opt = dos.torch.AdamW(groups_of(model, 1e-2, 0.1), lr=1e-2)
    loss_of(model, 0).backward()
    opt.step()
    before = snapshot(model, opt)
    opt.param_groups[1]["lr"] = -1.0
    opt.param_groups[0]["lr"] = 5e-3  # valid, but must not be applied either
    with pytest.raises(ValueError, match="parameter group 1: lr must be"):
        opt.step()
    assert all(torch.equal(x, y) for x, y in zip(before[0], model.parameters()))
    assert opt._engine.hyperparameters(0).lr == 1e-2
    opt.param_groups[1]["amsgrad"] = True
    opt.param_groups[1]["lr"] = 1e-2
    with pytest.raises(ValueError, match="amsgrad cannot change"):
        opt.step()


@pytest.mark.parametrize("late", [False, True], ids=["before-first-step", "after-first-step"])
def test_add_param_group_matches_torch(late):
    # Late: the new group's parameters start at step 0 while the others are at 2, as in
    # torch (dos moves its state over to a rebuilt engine).
    model_a, model_b = make_model(), make_model()
    ref = torch.optim.AdamW(list(model_a.parameters())[:2], lr=1e-2)
    ours = dos.torch.AdamW(list(model_b.parameters())[:2], lr=1e-2, loss_scaling={"init_scale": 256.0})
    for t in range(6):
        if t == (2 if late else 0):
            ref.add_param_group({"params": list(model_a.parameters())[2:], "lr": 3e-3})
            ours.add_param_group({"params": list(model_b.parameters())[2:], "lr": 3e-3})
        for m, o in ((model_a, ref), (model_b, ours)):
            o.zero_grad()
            (loss_of(m, t) * (o.loss_scale if o is ours else 1.0)).backward()
            o.step()
    for x, y in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(x, y)
    sa, sb = ref.state_dict()["state"], ours.state_dict()["state"]
    assert [float(sa[i]["step"]) for i in sorted(sa)] == [float(sb[i]["step"]) for i in sorted(sb)]
    assert ours.loss_scale == 256.0 and ours._engine.step_count() == 6
    with pytest.raises(ValueError):  # torch's own check: a parameter in two groups
        dos.torch.AdamW(list(model_b.parameters())[:2]).add_param_group({"params": list(model_b.parameters())[:1]})


def test_bad_checkpoints_change_nothing():
    model = make_model()
    opt = dos.torch.AdamW(groups_of(model, 1e-2, 0.1), lr=1e-2)
    loss_of(model, 0).backward()
    opt.step()
    good = opt.state_dict()
    before = snapshot(model, opt)

    one_group = {"state": good["state"], "param_groups": good["param_groups"][:1]}
    with pytest.raises(ValueError, match="different number of parameter groups"):
        opt.load_state_dict(one_group)

    fractional = {"state": dict(good["state"]), "param_groups": good["param_groups"]}
    fractional["state"][1] = dict(fractional["state"][1], step=torch.tensor(1.5))
    with pytest.raises(ValueError, match="not a count"):
        opt.load_state_dict(fractional)

    wrong_size = {"state": dict(good["state"]), "param_groups": good["param_groups"]}
    wrong_size["state"][0] = dict(wrong_size["state"][0], exp_avg=torch.zeros(3))
    with pytest.raises(ValueError, match="'exp_avg' of parameter"):
        opt.load_state_dict(wrong_size)

    amsgrad = {"state": good["state"], "param_groups": [dict(g, amsgrad=True) for g in good["param_groups"]]}
    with pytest.raises(ValueError, match="amsgrad cannot change"):
        opt.load_state_dict(amsgrad)

    bad_lr = {"state": good["state"], "param_groups": [dict(g, lr=-2.0) for g in good["param_groups"]]}
    with pytest.raises(ValueError, match="lr must be"):
        opt.load_state_dict(bad_lr)
    assert_unchanged(before, model, opt)


def test_zero_grad_and_pickling():
    model = make_model()
    opt = dos.torch.AdamW(model.parameters())
    loss_of(model, 0).backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(TypeError, match="state_dict"):
        torch.save(opt, io.BytesIO())


def test_import_dos_does_not_import_torch():
    # The extension links no framework; only dos.torch needs torch.
    code = "import sys, dos; assert 'torch' not in sys.modules, 'torch imported'; print(dos.has_cuda)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(dos.has_cuda)


# ---- parameters without a gradient (.grad is None), as torch skips them ----------


class Branches(torch.nn.Module):
    """Six parameters, each used by the loss only when chosen (an unused branch leaves
    its .grad None), and a frozen one."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(5 + 3 * i)) for i in range(6)])
        self.frozen = torch.nn.Parameter(torch.randn(4), requires_grad=False)

    def loss(self, step, used):
        total = torch.zeros(())
        for i, p in enumerate(self.ps):
            if used[i]:
                target = torch.sin(torch.arange(p.numel(), dtype=torch.float32) * (0.3 + 0.1 * step))
                total = total + ((p - target) ** 2 * (1.0 + i)).sum() + (p * self.frozen.sum()).sum()
        return total


def used_at(step, seed=7):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return (torch.rand(6, generator=g) < 0.6).tolist()


def train_branches(make_opt, steps, model=None, opt=None, first=0, clip=None):
    model = model or Branches()
    opt = opt or make_opt(model)
    history = []
    for t in range(first, first + steps):
        opt.zero_grad(set_to_none=True)
        used = used_at(t)
        if any(used):
            model.loss(t, used).backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history, opt, model


def torch_steps(opt, params):
    return [float(opt.state[p]["step"]) if p in opt.state else 0.0 for p in params]


def dos_steps(opt):
    sd = opt.state_dict()["state"]
    return [float(sd[i]["step"]) if i in sd else 0.0 for i in range(len(opt._flat))]


@pytest.mark.parametrize("kind", PAIRS)
@pytest.mark.parametrize("options", [dict(), dict(amsgrad=True, weight_decay=0.05), dict(maximize=True)],
                         ids=["defaults", "amsgrad", "maximize"])
@pytest.mark.parametrize("clip", [None, 0.5], ids=["no-clip", "clip"])
def test_none_gradients_at_random_steps_match_torch(kind, options, clip):
    ref, ours = PAIRS[kind]
    a, ra, ma = train_branches(lambda m: ref(m.parameters(), lr=1e-2, **options), 30, clip=clip)
    extra = dict(max_grad_norm=clip) if clip is not None else {}
    b, rb, mb = train_branches(lambda m: ours(m.parameters(), lr=1e-2, threads=2, **options, **extra), 30)
    assert_trajectories_close(a, b)
    assert torch_steps(ra, ma.parameters()) == dos_steps(rb)
    assert len(set(dos_steps(rb))) > 2  # the counts really differ
    assert torch.equal(mb.frozen, Branches().frozen)  # frozen: accepted, never stepped, no state
    assert len(rb.state_dict()["state"]) == 6


def test_none_gradients_with_hooks_and_the_emulated_device_are_bit_identical_to_cpu():
    a, _, _ = train_branches(lambda m: dos.torch.AdamW(m.parameters(), lr=1e-2, threads=2), 20)
    for kw in (dict(grad_hooks=True), dict(backend="emulated", policy="fixed_stride:2", subgroup_elements=8)):
        b, _, _ = train_branches(lambda m: dos.torch.AdamW(m.parameters(), lr=1e-2, threads=2, **kw), 20)
        for pa, pb in zip(a, b):
            assert all(torch.equal(x, y) for x, y in zip(pa, pb)), kw


def test_a_parameter_never_stepped_has_no_state_like_torch():
    model = Branches()
    opt = dos.torch.AdamW(model.parameters(), lr=1e-2)
    model.loss(0, [True] + [False] * 5).backward()
    opt.step()
    sd = opt.state_dict()["state"]
    first = [i for i, p in enumerate(model.parameters()) if p is model.ps[0]][0]  # the frozen one comes first
    assert list(sd) == [first] and float(sd[first]["step"]) == 1.0


def moved_and_continued(src, dst, steps_before, steps_after=10):
    """Trains `src` (an optimizer class) on Branches for `steps_before` steps, moves
    weights and optimizer state_dict into a fresh model under `dst`, and continues both
    `steps_after` steps. Returns both continuations and the two optimizers."""
    _, src_opt, src_model = train_branches(lambda m: src(m.parameters(), lr=1e-2), steps_before)
    dst_model = Branches()
    dst_model.load_state_dict(src_model.state_dict())
    dst_opt = dst(dst_model.parameters(), lr=1e-2)
    dst_opt.load_state_dict(src_opt.state_dict())
    a, _, _ = train_branches(None, steps_after, model=src_model, opt=src_opt, first=steps_before)
    b, _, _ = train_branches(None, steps_after, model=dst_model, opt=dst_opt, first=steps_before)
    return a, b, src_opt, dst_opt


def steps_of(opt):
    if isinstance(opt, (dos.torch.Adam, dos.torch.AdamW)):
        return dos_steps(opt)
    return torch_steps(opt, opt.param_groups[0]["params"])


@pytest.mark.parametrize("kind", PAIRS)
def test_state_dict_with_skipped_parameters_dos_to_torch_and_back(kind):
    ref, ours = PAIRS[kind]
    # dos -> torch: parameters at different steps, one never stepped (no state).
    full, _, _ = train_branches(lambda m: ref(m.parameters(), lr=1e-2), 22)
    d, t, dos_opt, torch_opt = moved_and_continued(ours, ref, 12)
    assert_trajectories_close(t, d)
    assert_trajectories_close(full[12:], d)
    assert steps_of(torch_opt) == steps_of(dos_opt)
    # torch -> dos: torch's state_dict loads, and dos continues as torch does.
    t, d, torch_opt, dos_opt = moved_and_continued(ref, ours, 3)
    assert_trajectories_close(t, d)
    assert steps_of(torch_opt) == steps_of(dos_opt)
    # dos -> dos: exact, per-parameter counts included.
    again = ours(Branches().parameters(), lr=1e-2)
    again.load_state_dict(dos_opt.state_dict())
    assert dos_steps(again) == dos_steps(dos_opt)
