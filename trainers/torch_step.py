"""The PyTorch trainer's compiled step: forward, backward, clipping and the optimizer update as
ONE graph compiled by AOTInductor, over the parameters and optimizer state as prebuilt tensor
lists; a fresh worker loads it from the compile cache with torch's C++ loader alone.

Why: compiling only the module (torch.compile(model)) made the step slower than eager on CPU.
That step is three compiled pieces and two eager ones per batch: the forward graph, AOTAutograd's
backward graph (each behind its own runtime wrapper and guards), autograd's engine between them,
then zero_grad and optimizer.step() in Python; and Inductor's dropout draws its masks with a
scalar (not vectorised) Philox loop on CPU. Here the whole step is one call: the gradients come
from torch.func.grad_and_value, the update is written out (Adam, AdamW, SGD as torch.optim does
them), and dropout masks come from an integer hash that Inductor vectorises (`hashed_dropout`).

The optimizer state lives where torch.optim keeps it (`optimizer.state[p]`, the same keys), so
checkpoints, resume and the learning rate scheduler work as they do with optimizer.step().

Covers the built-in models (trainers.torch_models.LayerModel) without buffers (no batch norm),
on one device, without privacy; the other cases keep torch_trainer's module-compiling path.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from functools import cache, partial
from pathlib import Path

import torch

from trainers.base import COMPILE_CACHE_MAX_BYTES
from trainers.spec import JobSpec, OptimizerSpec
from trainers.torch_models import LayerModel, score_sum, task_loss

log = logging.getLogger(__name__)

BETAS, EPS = (0.9, 0.999), 1e-8  # OptimizerSpec's Adam constants (torch.optim's defaults)

FusedStep = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def supported(spec: JobSpec, model: torch.nn.Module, world_size: int, user_code: bool) -> bool:
    """Whether the compiled whole step covers this run (else: torch_trainer's module-compiling path).

    Not for user code (its module is not described by the spec the compiled step is cached
    under, and takes no dropout key), batch norm (buffers updated in the forward pass), data
    parallel (DDP's hooks reduce the gradients during autograd's backward) or DP-SGD. CPU only
    for now: AOTInductor's loader crashed the process (a segfault, which no fallback catches) on
    the H200 under torch 2.11, and a crash would end the worker at every retry of the job; until
    a GPU run shows it safe, a gpu job compiles its module."""
    return (
        spec.compile
        and spec.hardware == "cpu"
        and not user_code
        and isinstance(model, LayerModel)
        and not list(model.buffers())
        and world_size == 1
        and spec.privacy is None
    )


def optimizer_state(opt: OptimizerSpec, optimizer: torch.optim.Optimizer) -> list[list[torch.Tensor]]:
    """The optimizer's state as lists parallel to its parameters, created in torch.optim's layout
    when the optimizer has not stepped yet (else the tensors restored from a checkpoint are used):
    Adam/AdamW [step (float32 0-dim, on the parameter's device), exp_avg, exp_avg_sq]; SGD with
    momentum [momentum_buffer] (zeros: torch.optim's first buffer is the gradient itself, which
    0 * momentum + g gives too); plain SGD none."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    names = {"adam": ("step", "exp_avg", "exp_avg_sq"), "adamw": ("step", "exp_avg", "exp_avg_sq")}
    keys = names.get(opt.name, ("momentum_buffer",) if opt.momentum else ())
    lists: list[list[torch.Tensor]] = [[] for _ in keys]
    for p in params:
        state = optimizer.state[p]
        for key, tensors in zip(keys, lists):
            if key == "step":  # one dtype and device whoever made it: the compiled step's inputs
                value = state.get(key, torch.zeros(()))
                state[key] = torch.as_tensor(value, dtype=torch.float32).to(p.device).clone()
            elif state.get(key) is None:
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
            tensors.append(state[key])
    return lists


def update(
    opt: OptimizerSpec,
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    state: list[list[torch.Tensor]],
    rates: torch.Tensor,
) -> None:
    """One in-place optimizer step of `params` by `grads` (torch.optim's update rules, written out
    so they are part of the compiled graph); `rates` is rates_at's float32 [3] for this step."""
    wd = opt.weight_decay
    lr = rates[0]
    if opt.name == "sgd":
        buffers = state[0] if state else [None] * len(params)
        for p, g, buf in zip(params, grads, buffers):
            g = g + wd * p if wd else g
            if buf is not None:
                buf.mul_(opt.momentum).add_(g)
                g = g + opt.momentum * buf if opt.nesterov else buf
            p.sub_(lr * g)
        return
    (beta1, beta2), (steps, exp_avgs, exp_avg_sqs) = BETAS, state
    for p, g, step, m, v in zip(params, grads, steps, exp_avgs, exp_avg_sqs):
        if opt.name == "adamw":
            p.mul_(1 - lr * wd)
        elif wd:
            g = g + wd * p
        step.add_(1)  # torch.optim's count, for checkpoints; the bias corrections come in `rates`
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = v.sqrt() / rates[2] + EPS
        p.sub_(rates[1] * m / denom)


def rates_at(lr: float, step: int) -> list[float]:
    """[lr, lr / (1 - beta1^t), sqrt(1 - beta2^t)] for optimizer step t (1-based): the rate and
    Adam's bias corrections, computed on the host in float64 as torch.optim.Adam does. (Computed
    in the graph from the step tensor, Inductor inlined the pow into every element's update.)"""
    beta1, beta2 = BETAS
    return [lr, lr / (1 - beta1**step), math.sqrt(1 - beta2**step)]


def clip_(grads: list[torch.Tensor], clip_norm: float) -> list[torch.Tensor]:
    """`grads` scaled down to global L2 norm `clip_norm` (torch.nn.utils.clip_grad_norm_'s rule)."""
    total = torch.stack([g.float().pow(2).sum() for g in grads]).sum().sqrt()
    factor = torch.clamp(clip_norm / (total + 1e-6), max=1.0)
    return [g * factor for g in grads]


def whole_step(
    model: torch.nn.Module,
    names: list[str],
    opt: OptimizerSpec,
    autocast: Callable[[], ContextManager],
    task: str,
    params: list[torch.Tensor],
    state: list[list[torch.Tensor]],
    x: torch.Tensor,
    y: torch.Tensor,
    key: torch.Tensor,
    rates: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One training step of `model` with `params` (updated in place, with `state`) on the batch
    x [B, D], y [B]: (mean loss, summed score (torch_models.score_sum)). Traced whole (make_fx)."""

    def loss_of(named: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast():
            logits = torch.func.functional_call(model, named, (x,), {"dropout_key": key})
            return task_loss(logits, y, task), logits

    grads, (loss, logits) = torch.func.grad_and_value(loss_of, has_aux=True)(dict(zip(names, params)))
    grad_list = [grads[name] for name in names]
    if opt.clip_norm is not None:
        grad_list = clip_(grad_list, opt.clip_norm)
    with torch.no_grad():
        update(opt, params, grad_list, state, rates)
    return loss.detach(), score_sum(logits.detach(), y, task)


_compiled: dict[tuple, Package] = {}  # the compiled whole steps of this process, by cache_key
_unbuildable: set[tuple] = set()  # the keys AOTInductor failed to compile in this process
MAX_LOADED = 32  # compiled steps a process keeps loaded (each ~2 MB of library and kernels)
compiled_ahead = 0  # whole steps this process compiled ahead of time (dynamo never sees them)


def cache_key(
    spec: JobSpec, model: torch.nn.Module, x_shape: tuple[int, ...], device: torch.device, task: str
) -> tuple:
    """What the compiled step's graph depends on: a later job with the same key reuses it, its
    inputs unchecked (make). The parameters' shapes are in it: the same spec on a dataset with
    other classes has another output layer; and the image shape the model reshapes its flat
    input to ([6, 10, 3] and [10, 6, 3] give a CNN the same parameters)."""
    return (
        spec.model.model_dump_json(),
        tuple(getattr(model, "input_shape", ())),
        # The rate and its schedule reach the step as a tensor (rates_at): a sweep's trials over
        # learning rates share one compiled step.
        spec.optimizer.model_dump_json(exclude={"learning_rate", "schedule", "warmup_epochs"}),
        spec.precision,
        x_shape,
        tuple((name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()),
        spec.batch_size,
        str(device),
        task,
    )


def compiled_step(
    key: tuple,
    model: torch.nn.Module,
    opt: OptimizerSpec,
    autocast: Callable[[], ContextManager],
    task: str,
    example: tuple,
    steps_dir: Path | None = None,
    steps_max_bytes: int = COMPILE_CACHE_MAX_BYTES,
) -> Package | None:
    """The compiled whole_step for `key`, made now or reused: from this process's earlier jobs,
    else from `steps_dir` (an earlier process's, see _load_or_compile); None where AOTInductor
    cannot compile it. A reused one is the first job's graph, which takes the parameters and
    state as inputs: same spec, same shapes, and the modules hold no buffers. `example` is
    whole_step's arguments after the partial, on which it is compiled."""
    path = steps_dir / artifact_name(key) if steps_dir else None
    if key in _unbuildable:
        return None
    if key in _compiled:
        if path is not None:
            _mark_used(path)  # in use on this worker: the last to leave the host's cache
        return _compiled[key]
    names = [name for name, _ in model.named_parameters()]
    step = partial(whole_step, model, names, opt, autocast, task)
    compiled = _load_or_compile(step, example, path, steps_max_bytes, made_for(key, example))
    if compiled is None:
        _unbuildable.add(key)  # not tried again by this process: it fails late, after seconds
        return None
    if len(_compiled) >= MAX_LOADED:  # a year of models: the first loaded goes (its library unloaded)
        del _compiled[next(iter(_compiled))]
    _compiled[key] = compiled
    return compiled


def artifact_name(key: tuple) -> str:
    """The file name of the compiled step of `key` between processes: from the key, the versions
    of Python and torch, the intra-op threads (Inductor writes their number into its kernels), the
    CPU's vector instructions (its kernels are built for this CPU's) and the trainers' source (a
    step compiled from older code is not reused)."""
    cpu = torch.backends.cpu.get_cpu_capability()
    named = (key, sys.version, torch.__version__, torch.get_num_threads(), cpu, _trainers_source())
    return f"{hashlib.sha256(repr(named).encode()).hexdigest()}{SUFFIX}"


SUFFIX = ".pt2"  # AOTInductor's package: a zip of the compiled graph's shared library


@cache
def _trainers_source() -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


class Package:
    """A whole step compiled by AOTInductor and loaded from its package: `package(params, state,
    x, y, key, rates) -> (loss, score)`, updating `params` and `state` in place as whole_step
    does. Loading one needs neither torch._dynamo nor Inductor's Python modules (~2 s of imports
    in a fresh process): only torch's C++ loader of the shared library inside."""

    def __init__(self, path: Path, made_for: str) -> None:
        # (device index -1: the CPU, the only device `supported` lets through)
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        saved = loader.get_metadata().get(MADE_FOR_KEY)
        if saved != made_for:  # the graph checks no shapes itself: a wrong file must not run
            raise ValueError(f"it was made for another step or other inputs: {saved}")
        self._run = loader.run

    def __call__(
        self, params: list[torch.Tensor], state: list[list[torch.Tensor]], *rest: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss, score = self._run(_flat(params, state, *rest))
        return loss, score


MADE_FOR_KEY = "trainhub_step"  # the package's metadata: the step it was made for (made_for)


def made_for(key: tuple, example: tuple) -> str:
    """The step's cache_key, and the shapes, dtypes and devices of whole_step's flattened inputs:
    what the graph is made for, kept in its package and checked at load."""
    inputs = [(tuple(t.shape), str(t.dtype), str(t.device)) for t in _flat(*example)]
    return repr((key, inputs))


def _flat(params: list, state: list[list], *rest: torch.Tensor) -> list[torch.Tensor]:
    return [*params, *(t for tensors in state for t in tensors), *rest]


def _load_or_compile(step: Callable, example: tuple, path: Path | None, max_bytes: int, wanted: str) -> Package | None:
    """`step` compiled ahead of time by AOTInductor into a package at `path` (a temporary file
    when None), or loaded from there when an earlier process saved it: a fresh worker skips
    tracing and lowering (seconds) and the imports of dynamo and Inductor. The package is what
    this service compiled, in the workers' compile cache; it is never taken from a user. Static
    shapes: every step has the same [batch_size, features] batch (the partial last batch is
    dropped). A file that fails to load, or was made for another step (`wanted`, made_for), is
    compiled again and replaced; where AOTInductor cannot compile the step, None (the caller
    compiles the module instead). A file loaded is marked used (its mtime); one saved is
    followed by evict_least_recent(max_bytes)."""
    global compiled_ahead
    if path is not None:
        try:
            loaded = Package(path, wanted)
            _mark_used(path)
            return loaded
        except Exception as exc:  # missing, damaged, or made by a torch this one cannot read
            if path.exists():
                log.warning("the compiled step at %s could not be used (%s); compiling it again", path, exc)
    with tempfile.TemporaryDirectory(prefix="trainhub-step-") as tmp:
        made = Path(tmp) / f"step{SUFFIX}"
        try:
            _compile_package(step, example, made, wanted)
            compiled = Package(made, wanted)
        except Exception:
            log.warning("AOTInductor could not compile the step; compiling the module instead", exc_info=True)
            return None
        compiled_ahead += 1
        if path is not None:
            _keep(made, path, max_bytes)
    return compiled


def _compile_package(step: Callable, example: tuple, package: Path, wanted: str) -> None:
    """Trace `step` on `example` (make_fx: torch.export cannot trace torch.func's gradients
    itself) into an aten graph with its in-place updates, export that, and compile it with
    AOTInductor into `package`, `wanted` (made_for) in the package's metadata."""
    from torch._inductor import aoti_compile_and_package
    from torch.fx.experimental.proxy_tensor import make_fx

    counts = [len(example[0]), *(len(tensors) for tensors in example[1])]

    class Flat(torch.nn.Module):  # whole_step over one flat list of tensors, as the loader passes them
        def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            lists, at = [], 0
            for count in counts:
                lists.append(list(flat[at : at + count]))
                at += count
            return step(lists[0], lists[1:], *flat[at:])

    inputs = tuple(_flat(*_copies(example)))
    graph = make_fx(Flat(), tracing_mode="fake")(*inputs)
    exported = torch.export.export(graph, inputs, strict=False)
    aoti_compile_and_package(
        exported, package_path=str(package), inductor_configs={"aot_inductor.metadata": {MADE_FOR_KEY: wanted}}
    )


def _keep(made: Path, path: Path, max_bytes: int) -> None:
    """Copy the package just compiled into the host's cache at `path` (whole, by a rename, so
    another worker never loads half of it), then evict_least_recent(max_bytes)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.is_file():
            raise IsADirectoryError(f"{path} is not a file: remove it")
        partial_path = path.with_name(f".{path.name}.{os.getpid()}")
        shutil.copyfile(made, partial_path)
        partial_path.chmod(0o644)  # a host's workers may run as other users
        partial_path.replace(path)
        evict_least_recent(path.parent, max_bytes, keep=path)
    except Exception:
        log.warning("the compiled step could not be saved at %s", path, exc_info=True)


def _mark_used(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # removed meanwhile by another worker's eviction, or a read-only cache: no matter
        pass


def evict_least_recent(directory: Path, max_bytes: int, keep: Path) -> int:
    """Remove the compiled steps of `directory` (its files, older formats' and copies a killed
    worker left included, not those being copied in) used least recently (by mtime: when saved
    or last used) until the rest fit in `max_bytes`, never `keep` (the one just saved) unless it
    is alone larger than the bound: then it goes, and the others stay. Returns how many were
    removed. Another worker of the host may be evicting or loading at the same time: a file gone
    already is skipped, and a worker whose file goes compiles its step again; a file this
    process may not remove (another user's) is left, and still counts."""
    others, kept = [], 0
    copying_since = time.time() - 3600  # a copy older than this was left by a killed worker
    for file in directory.iterdir():
        try:
            stat = file.stat()
        except FileNotFoundError:
            continue
        if file.name.startswith(".") and stat.st_mtime > copying_since:  # being copied in (_keep)
            continue
        if file == keep:
            kept = stat.st_size
        else:
            others.append((stat.st_mtime, stat.st_size, file))
    if kept > max_bytes:
        others, kept = [(0.0, kept, keep)], 0
    total, removed = kept + sum(size for _, size, _ in others), 0
    for _, size, file in sorted(others):
        if total <= max_bytes:
            break
        try:
            file.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove the compiled step %s from the cache: %s", file, exc)
            continue
        total -= size
    return removed


def _copies(example: tuple) -> tuple:
    """`example` with its tensors (and lists of them) copied: a call updates them in place."""

    def copy(value: object) -> object:
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, list):
            return [copy(item) for item in value]
        return value

    return tuple(copy(value) for value in example)


def reset() -> None:
    """Forget the compiled steps and failures of this process, as a new worker process would."""
    _compiled.clear()
    _unbuildable.clear()


def make(
    spec: JobSpec,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    autocast: Callable[[], ContextManager],
    task: str,
    key: tuple,
    steps_dir: Path | None = None,
    steps_max_bytes: int = COMPILE_CACHE_MAX_BYTES,
) -> FusedStep | None:
    """`step(x, y) -> (loss, score)`: the compiled whole step over `model`'s parameters and
    `optimizer`'s state (one optimizer step, as optimizer.step() would take it; the caller steps
    the scheduler). Compiled here, on a batch of the training shape run on copies of the
    parameters and state, so nothing the run trains changes and no epoch pays for it.

    Each step's dropout key is drawn from torch's generator of the device (the CPU's or CUDA's),
    which the trainer seeds per epoch from (seed, epoch) and checkpoints mid-epoch: the masks
    repeat in a resumed run. `steps_dir` keeps the compiled step for later processes (None: this
    process only), its files within `steps_max_bytes` (evict_least_recent). None where
    AOTInductor cannot compile the step."""
    opt = spec.optimizer
    params = [p.detach() for p in model.parameters()]  # aliases: updated in place, no autograd
    state = optimizer_state(opt, optimizer)
    group = optimizer.param_groups[0]
    device = params[0].device
    # Optimizer steps taken so far (Adam's count; SGD needs none), for the bias corrections.
    taken = [int(state[0][0].item()) if opt.name != "sgd" else 0]
    rates = torch.tensor(rates_at(group["lr"], taken[0] + 1), dtype=torch.float32, device=device)
    model.train()
    batch = torch.arange(spec.batch_size, device=x_train.device)
    example = (params, state, x_train[batch], y_train[batch], torch.zeros((), dtype=torch.int32, device=device), rates)
    compiled = compiled_step(key, model, opt, autocast, task, example, steps_dir, steps_max_bytes)
    if compiled is None:
        return None

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        taken[0] += 1
        rates.copy_(torch.tensor(rates_at(group["lr"], taken[0]), dtype=torch.float32))
        dropout_key = torch.randint(-(2**31), 2**31 - 1, (), dtype=torch.int32, device=device)
        return compiled(params, state, x, y, dropout_key, rates)

    # The scheduler warns when it steps before optimizer.step() ever ran: this step takes its steps.
    optimizer._opt_called = True  # type: ignore[attr-defined]
    return step


def fused_adam(optimizer: torch.optim.Optimizer) -> Callable[[], None] | None:
    """`step()`: what optimizer.step() of a fused torch.optim.Adam does (the same kernel, the same
    bits), over lists built once instead of regathered in Python every step; None where the
    optimizer is not one fused Adam over parameters of one device and dtype. A parameter left
    without a gradient falls back to optimizer.step(), which skips it."""
    groups = optimizer.param_groups
    if not isinstance(optimizer, torch.optim.Adam) or not groups[0].get("fused") or len(groups) > 1:
        return None
    group = groups[0]
    params: list[torch.Tensor] = group["params"]
    if (
        group["amsgrad"]
        or group["maximize"]
        or group["differentiable"]
        or len({(p.device, p.dtype) for p in params}) > 1
    ):
        return None
    steps, exp_avgs, exp_avg_sqs = optimizer_state(OptimizerSpec(name="adam"), optimizer)
    beta1, beta2 = group["betas"]

    def step() -> None:
        grads = [g for p in params if (g := p.grad) is not None]
        if len(grads) < len(params):
            optimizer.step()
            return
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
        )

    # The scheduler warns when it steps before optimizer.step() ever ran: this step takes its steps.
    optimizer._opt_called = True  # type: ignore[attr-defined]
    return step
