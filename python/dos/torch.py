"""``torch.optim.Adam`` and ``torch.optim.AdamW`` backed by dos's C++ engine.

    opt = dos.torch.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

Same constructor signature, defaults, ``step(closure)``, ``zero_grad``, LR
schedulers and ``state_dict`` layout as torch's, so a checkpoint moves between
``torch.optim.AdamW`` and ``dos.torch.AdamW`` both ways. A parameter whose ``.grad``
is None at a step (an unused branch, a frozen parameter) is skipped, as torch skips it,
and keeps its own step count (``state[p]["step"]``). torch is used only through
its public API: the engine gets raw views (data pointer, element count, dtype,
device), refreshed before every step, so this works with any torch from 1.13 on.
"""

import math
import weakref

import torch
from torch.optim import Optimizer

from . import _core

__all__ = ["Adam", "AdamW"]

# dtype and device codes of dos._core's raw views.
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
# Keys torch's own Adam/AdamW read from every group; a dos checkpoint carries them so
# that torch (whose __setstate__ does not default all of them) can load it.
_TORCH_GROUP_KEYS = {"foreach": None, "capturable": False, "differentiable": False, "fused": None}


def _raw(t):
    """(pointer, elements, dtype code, device code) of a contiguous tensor."""
    return (t.data_ptr(), t.numel(), _DTYPE_CODES[t.dtype], 0 if t.device.type == "cpu" else 1)


def _parse_policy(policy):
    """'name', 'name:arg' (fixed_stride:2, automatic_stride:8, static_fraction:0.25) or
    'resident_then_stride:max_k:fixed_share' (either may be left empty for its default):
    the name and up to two numbers, None where not given."""
    if not isinstance(policy, str):
        raise TypeError(f"dos: policy must be a string such as 'automatic_stride' or 'fixed_stride:2', got {policy!r}")
    name, _, rest = policy.partition(":")
    if not rest:
        return name, None, None
    parts = rest.split(":")
    if len(parts) > 2:
        raise ValueError(f"dos: policy takes at most two arguments, got {policy!r}")
    if len(parts) == 2 and parts[1] == "":
        raise ValueError(f"dos: policy's second argument is empty, got {policy!r}")
    try:
        args = [None if p == "" else float(p) for p in parts]
    except ValueError:
        raise ValueError(f"dos: policy arguments must be numbers, got {policy!r}") from None
    return name, args[0], args[1] if len(args) > 1 else None


class _DosAdamBase(Optimizer):
    _decoupled = True  # AdamW; Adam sets False

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad, *, maximize=False, foreach=None,
                 fused=None, capturable=False, differentiable=False, threads=0, subgroup_elements=100_000_000,
                 backend="cpu", policy="automatic_stride", staging_budget=0, max_grad_norm=0.0,
                 loss_scaling=False, skip_nonfinite=False, grad_hooks=None):
        # foreach and fused choose among torch's kernels; dos has its own, so they are
        # accepted (drop-in) and ignored. capturable/differentiable cannot be honoured.
        if capturable or differentiable:
            raise ValueError("dos: capturable and differentiable are not supported (dos updates outside autograd "
                             "and CUDA graphs)")
        self._engine = None
        self._hooks = []
        self._ready_calls = 0
        self.last_report = None
        self._options = self._engine_options(threads, subgroup_elements, backend, policy, staging_budget,
                                             max_grad_norm, loss_scaling, skip_nonfinite)
        needs_stats = max_grad_norm > 0 or bool(loss_scaling) or skip_nonfinite or backend != "cpu"
        # Hooks pay off only when step() would otherwise read every gradient again (norm,
        # overflow) or a device copy can start early; without those, they cost a read.
        self._use_hooks = needs_stats if grad_hooks is None else bool(grad_hooks)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
        self._check_config(defaults)
        super().__init__(params, defaults)
        self._build()

    # ---- construction ---------------------------------------------------------------

    @staticmethod
    def _engine_options(threads, subgroup_elements, backend, policy, staging_budget, max_grad_norm, loss_scaling,
                        skip_nonfinite):
        o = _core.EngineOptions()
        if backend not in ("cpu", "emulated", "cuda"):
            raise ValueError(f"dos: unknown backend {backend!r} (cpu, emulated, cuda)")
        if backend == "cuda" and not _core.has_cuda:
            raise ValueError("dos: backend 'cuda' is not available: this build of dos found no CUDA toolkit "
                             "(reinstall with nvcc on PATH), use 'cpu' or 'emulated'")
        o.backend = backend
        for name, value, least in (("threads", threads, 0), ("subgroup_elements", subgroup_elements, 1),
                                   ("staging_budget", staging_budget, 0)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"dos: {name} must be an int, got {value!r}")
            if value < least:
                raise ValueError(f"dos: {name} must be >= {least}, got {value}")
        o.threads = int(threads)
        o.subgroup_elements = int(subgroup_elements)
        o.max_grad_norm = float(max_grad_norm)
        o.skip_nonfinite = bool(skip_nonfinite)
        if loss_scaling:
            ls = dict(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)
            if isinstance(loss_scaling, dict):
                unknown = set(loss_scaling) - set(ls)
                if unknown:
                    raise TypeError(f"dos: unknown loss_scaling keys {sorted(unknown)} (known: {sorted(ls)})")
                ls.update(loss_scaling)
            o.loss_scaling = (float(ls["init_scale"]), float(ls["growth_factor"]), float(ls["backoff_factor"]),
                              int(ls["growth_interval"]))
        o.policy, o.policy_arg, o.policy_arg2 = _parse_policy(policy)
        o.staging_budget = int(staging_budget)
        if backend == "cuda" and torch.cuda.is_available():
            # dos waits for this stream (where backward wrote the gradients) before reading.
            o.stream = torch.cuda.current_stream().cuda_stream
        return o

    def _config(self, group):
        c = _core.AdamConfig()
        try:
            c.lr = float(group["lr"])
            c.beta1, c.beta2 = (float(b) for b in group["betas"])
            c.eps = float(group["eps"])
            c.weight_decay = float(group["weight_decay"])
        except (TypeError, ValueError) as e:
            raise TypeError(f"dos: lr, betas (two numbers), eps and weight_decay must be numbers: {e}") from None
        c.amsgrad = bool(group["amsgrad"])
        c.maximize = bool(group["maximize"])
        c.decoupled_weight_decay = self._decoupled
        return c

    def _check_config(self, group, index=None):
        c = self._config(group)
        _core.validate(c, index)  # std::invalid_argument -> ValueError, dos's message
        return c

    def add_param_group(self, param_group):
        if self._engine is None:  # torch's constructor adding its groups
            super().add_param_group(param_group)
            return
        # A new engine over every group; the state moves over as a state_dict (the new
        # group's parameters have none: step 0, as in torch), so nothing is lost.
        saved = self.state_dict() if self._stepped() else None
        scaler = (self._engine.loss_scale(), self._engine.loss_scale_growth_tracker(), self._engine.step_count())
        old_groups = list(self.param_groups)
        super().add_param_group(param_group)
        try:
            self._check_config(self.param_groups[-1], len(self.param_groups) - 1)
            self._build()
        except Exception:
            self.param_groups[:] = old_groups
            self._build()
            raise
        if saved is not None:
            first = sum(len(g["params"]) for g in old_groups)
            packed = {k: v for k, v in self.param_groups[-1].items() if k != "params"}
            packed["params"] = list(range(first, first + len(self.param_groups[-1]["params"])))
            saved["param_groups"].append(packed)
            self.load_state_dict(saved)
            # load_state_dict set the optimizer's own count to the largest: restore it
            # (set_step_count sets every parameter's too, so theirs go back after).
            counts = [self._engine.param_step_count(i) for i in range(len(self._flat))]
            self._engine.set_step_count(scaler[2])
            for i, t in enumerate(counts):
                self._engine.set_param_step_count(i, t)
        if self._options.loss_scaling is not None:
            self._engine.set_loss_scaler_state(scaler[0], scaler[1])

    def _stepped(self):
        return any(self._engine.param_step_count(i) > 0 for i in range(len(self._flat)))

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def _name(self, i):
        g, j = self._where[i]
        return f"parameter {i} (group {g}, index {j}, shape {tuple(self._flat[i].shape)})"

    def _check_param(self, i, p):
        if p.dtype not in _DTYPE_CODES:
            raise TypeError(f"dos: {self._name(i)} is {p.dtype}; dos optimises float32, bfloat16 and float16")
        if p.is_sparse or p.layout != torch.strided:
            raise TypeError(f"dos: {self._name(i)} is not a dense tensor")
        if not p.is_contiguous():
            raise ValueError(f"dos: {self._name(i)} is not contiguous; dos updates flat storage")

    def _build(self):
        self._flat = self._params()
        self._where = [(g, j) for g, group in enumerate(self.param_groups) for j in range(len(group["params"]))]
        for i, p in enumerate(self._flat):
            self._check_param(i, p)  # a frozen one (requires_grad False) is accepted: it never has a gradient
        configs = [self._check_config(g, k) for k, g in enumerate(self.param_groups)]
        engine = _core.Optimizer([_raw(p.detach()) for p in self._flat],
                                 [len(g["params"]) for g in self.param_groups], configs, self._options)
        for h in self._hooks:
            h.remove()
        self._hooks, self._grad_accs = [], []
        self._engine = engine
        self._configs = configs
        if self._use_hooks:
            self._register_hooks()

    # ---- gradients reported during backward -------------------------------------

    def _register_hooks(self):
        # A weak reference: the hooks live as long as the parameters, and must not keep
        # the optimizer (and its host state) alive.
        this = weakref.ref(self)

        def report(i, p):
            opt = this()
            if opt is None or opt._engine is None or p.grad is None:
                return  # None: step() finds it absent too and skips the parameter
            g = p.grad
            if g.is_sparse or not g.is_contiguous() or g.dtype not in _DTYPE_CODES:
                return  # step() raises with the reason
            opt._ready_calls += 1
            opt._engine.grad_ready(i, _raw(p.detach()), _raw(g))

        for i, p in enumerate(self._flat):
            if not p.requires_grad:
                continue
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch 2.1+
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda param, i=i: report(i, param)))
            else:
                # torch < 2.1: a post-hook on the parameter's AccumulateGrad node, which
                # runs once the gradient is accumulated into .grad. The node is cached
                # weakly by torch: keep it, or it is rebuilt without the hook.
                with torch.enable_grad():  # the optimizer may be built under no_grad()
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hooks.append(acc.register_hook(lambda grad_in, grad_out, i=i, p=p: report(i, p)))
                self._grad_accs.append(acc)

    # ---- the training loop ------------------------------------------------------------

    @property
    def loss_scale(self):
        """The factor to multiply the loss by before backward (1.0 without loss scaling)."""
        return self._engine.loss_scale()

    @property
    def threads(self):
        return self._engine.threads()

    def zero_grad(self, *args, **kwargs):
        super().zero_grad(*args, **kwargs)
        # A new backward pass starts: statistics reported for the old gradients must
        # not be reused (and a device backend plans the coming step now).
        self._engine.begin_backward()

    def _sync_hyperparameters(self):
        # Schedulers (and users) write group["lr"] and friends: read them every step.
        # All are checked before any is applied, so a bad value changes nothing.
        configs = [self._config(g) for g in self.param_groups]
        for k, (new, old) in enumerate(zip(configs, self._configs)):
            if _same(new, old):
                continue
            _core.validate(new, k)
            if new.amsgrad != old.amsgrad:
                raise ValueError(f"dos: parameter group {k}: amsgrad cannot change after construction")
        for k, (new, old) in enumerate(zip(configs, self._configs)):
            if not _same(new, old):
                self._engine.set_hyperparameters(k, new)
        self._configs = configs

    def _refresh_views(self):
        views = []
        for i, p in enumerate(self._flat):
            g = p.grad
            self._check_param(i, p)
            if g is None:
                # As torch does: skipped this step (value and state untouched), and its
                # own step count stays behind the others'.
                views.append((_raw(p.detach()), None))
                continue
            if g.is_sparse or g.layout != torch.strided:
                raise TypeError(f"dos: {self._name(i)} has a sparse gradient; dos needs dense gradients")
            if g.dtype not in _DTYPE_CODES:
                raise TypeError(f"dos: {self._name(i)} has a {g.dtype} gradient")
            if not g.is_contiguous():
                raise ValueError(f"dos: {self._name(i)}: its gradient is not contiguous")
            views.append((_raw(p.detach()), _raw(g)))
        for i, (v, g) in enumerate(views):
            self._engine.set_views(i, v, g)

    def step(self, closure=None):
        """One update of every parameter; returns the closure's loss, as torch does.
        The engine's report (grad_norm, overflow, timings) is in ``last_report``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._refresh_views()
        self._sync_hyperparameters()
        self.last_report = self._engine.step()
        return loss

    # ---- checkpoints in torch's layout --------------------------------------------

    def _refresh_values(self):
        # read_state/write_state check the value views: point them at the parameters as
        # they are now (a failed step may have left other views in the table).
        for i, p in enumerate(self._flat):
            self._check_param(i, p)
            self._engine.set_value(i, _raw(p.detach()))

    def _has_master(self, p):
        return p.dtype != torch.float32 or p.device.type != "cpu"

    def state_dict(self):
        """torch's layout: ``state[i] = {step, exp_avg, exp_avg_sq[, max_exp_avg_sq]}``
        (fp32), plus ``master``, the fp32 master weights, for 16-bit parameters. ``step``
        is the parameter's own count; like torch, a parameter never stepped (its grad
        was None at every step) has no entry."""
        groups = []
        index = 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for k, v in _TORCH_GROUP_KEYS.items():
                packed.setdefault(k, v)
            packed["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(packed)
        state = {}
        steps = [self._engine.param_step_count(i) for i in range(len(self._flat))]
        if any(steps):  # like torch, no state before a parameter's first update
            self._refresh_values()
            for i, p in enumerate(self._flat):
                if steps[i] == 0:
                    continue
                amsgrad = self.param_groups[self._where[i][0]]["amsgrad"]
                s = {"step": torch.tensor(float(steps[i]))}
                for key in _STATE_KEYS + ("master",):
                    if (key == "max_exp_avg_sq" and not amsgrad) or (key == "master" and not self._has_master(p)):
                        continue
                    out = torch.empty(p.shape, dtype=torch.float32)
                    self._engine.read_state(i, key, out.data_ptr(), out.numel())
                    s[key] = out
                state[i] = s
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads a dos or torch checkpoint. Everything is checked before anything
        changes. Each parameter resumes at its own ``step`` (parameters may differ, as
        torch's do after skipped steps); one without state starts at step 0 with zero
        moments. The master weights of 16-bit parameters come from the checkpoint's
        ``master`` if present, else from the parameters' current values."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("dos: loaded state dict has a different number of parameter groups "
                             f"({len(saved_groups)}, the optimizer has {len(self.param_groups)})")
        for k, (g, s) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(s["params"]):
                raise ValueError(f"dos: loaded state dict's group {k} has {len(s['params'])} parameters, "
                                 f"the optimizer's has {len(g['params'])}")
        new_groups = []
        for g, s in zip(self.param_groups, saved_groups):
            ng = dict(s)
            ng["params"] = g["params"]
            new_groups.append(ng)
        configs = []
        for k, (ng, old) in enumerate(zip(new_groups, self._configs)):
            c = self._check_config(ng, k)
            if c.amsgrad != old.amsgrad:
                raise ValueError(f"dos: parameter group {k}: the checkpoint has amsgrad={c.amsgrad}, the optimizer "
                                 f"amsgrad={old.amsgrad}; amsgrad cannot change after construction")
            configs.append(c)
        saved_ids = [i for s in saved_groups for i in s["params"]]
        saved_state = state_dict["state"]
        states = [saved_state.get(sid) for sid in saved_ids]
        present = [i for i, s in enumerate(states) if s]
        steps = [0] * len(states)
        for i in present:
            st = states[i].get("step")
            if st is None:
                raise ValueError(f"dos: the checkpoint's state of {self._name(i)} has no 'step'")
            st = float(st.item() if torch.is_tensor(st) else st)
            if st != math.floor(st) or st < 0 or st >= 2.0 ** 63 - 1:
                raise ValueError(f"dos: the checkpoint's step of {self._name(i)} is {st}, not a count")
            steps[i] = int(st)
            p, s = self._flat[i], states[i]
            keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if configs[self._where[i][0]].amsgrad else [])
            for key in keys + (["master"] if "master" in s else []):
                t = s.get(key)
                if t is None:
                    raise ValueError(f"dos: the checkpoint's state of {self._name(i)} has no '{key}'")
                if not torch.is_tensor(t) or t.numel() != p.numel():
                    raise ValueError(f"dos: the checkpoint's '{key}' of {self._name(i)} has "
                                     f"{t.numel() if torch.is_tensor(t) else type(t).__name__} elements, the "
                                     f"parameter {p.numel()}")
        self._refresh_values()
        # Checked; now write.
        for i, p in enumerate(self._flat):
            s = states[i] or {}
            for key in _STATE_KEYS:
                if key == "max_exp_avg_sq" and not configs[self._where[i][0]].amsgrad:
                    continue
                t = s.get(key)
                src = (torch.zeros(p.numel(), dtype=torch.float32) if t is None else
                       t.detach().to(device="cpu", dtype=torch.float32).contiguous().view(-1))
                self._engine.write_state(i, key, src.data_ptr(), src.numel())
            if self._has_master(p):
                m = s.get("master")
                src = (p.detach() if m is None else m.detach()).to(device="cpu", dtype=torch.float32)
                src = src.contiguous().view(-1)
                self._engine.write_state(i, "master", src.data_ptr(), src.numel())
        self._engine.set_step_count(max(steps, default=0))  # torch has no optimizer-wide count: the largest
        for i, t in enumerate(steps):
            self._engine.set_param_step_count(i, t)
        for k, c in enumerate(configs):
            self._engine.set_hyperparameters(k, c)
        self.param_groups[:] = new_groups
        self._configs = configs

    def __getstate__(self):
        raise TypeError("dos: an optimizer cannot be pickled (its state lives in C++); save state_dict() instead")


def _same(a, b):
    return (a.lr == b.lr and a.beta1 == b.beta1 and a.beta2 == b.beta2 and a.eps == b.eps
            and a.weight_decay == b.weight_decay and a.amsgrad == b.amsgrad and a.maximize == b.maximize)


class AdamW(_DosAdamBase):
    """``torch.optim.AdamW`` (decoupled weight decay), updated by dos.

    Beyond torch's arguments (``foreach`` and ``fused`` are accepted and ignored):
      threads: CPU threads for the update (0: every thread this process may use).
      subgroup_elements: elements per subgroup, the unit of CPU/device scheduling.
      backend: "cpu", "emulated" (a device made of host threads, for testing the
        interleaving engine) or "cuda" (builds with a CUDA toolkit only).
      policy: the CPU/device split, "name", "name:arg" or "name:arg:arg": all_cpu, static_fraction:0.25,
        fixed_stride:2, automatic_stride[:max_k] (default), balanced,
        resident_then_stride[:max_k[:fixed_share]] (the share whose resident count it
        compares too, 0.25 by default; 0 leaves it out).
      staging_budget: device bytes for staging (0: what is free).
      max_grad_norm: clip the global gradient norm as clip_grad_norm_ does (0: off).
      loss_scaling: True or a dict (init_scale, growth_factor, backoff_factor,
        growth_interval): GradScaler's dynamic scaling; multiply the loss by
        ``opt.loss_scale`` before backward.
      skip_nonfinite: skip a step whose gradients hold an inf or a NaN.
      grad_hooks: report gradients to the engine as backward finalises them (default:
        when clipping, loss scaling, skip_nonfinite or a device backend needs their norm).
    """

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, **kwargs):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **kwargs)


class Adam(_DosAdamBase):
    """``torch.optim.Adam`` (L2 weight decay, added to the gradient), updated by dos.
    The dos options are those of :class:`AdamW`."""

    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, **kwargs):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **kwargs)
