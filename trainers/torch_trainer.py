"""The PyTorch trainer: the seeds' eager loop, with the data already on the device.

Batches are sliced from device tensors with the framework-neutral `epoch_batches` indices
(no DataLoader, no per-sample collation), and the running loss stays on the device until
the epoch ends, so the host waits for the device once per epoch.

A run handed back between two steps (preempted, or its worker shutting down; see
base.HAND_BACK_REASONS) checkpoints there, with the running sums and the RNG states, and the
next run continues the epoch from that step with the same numbers an uninterrupted run has. Not
with data parallel (torch_ddp) or on a TPU: those resume from their last epoch's checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainers import torch_checkpoint, torch_masks, torch_step
from trainers.base import (
    COMPILE_CACHE_MAX_BYTES,
    HAND_BACK_REASONS,
    EpochMetrics,
    FitResult,
    HardwareMismatch,
    Report,
    RunOptions,
    ShouldStop,
    StopTraining,
)
from trainers.common import (
    Preprocessing,
    epoch_batches,
    final_result,
    fit_timings,
    init_weights,
    learning_rate_at,
    summarize_epoch,
    target_variance,
    test_metrics,
    write_common_artifacts,
)
from trainers.data import load_dataset
from trainers.presets import layers_of
from trainers.spec import JobSpec, OptimizerSpec, flops_per_example
from trainers.torch_models import (
    evaluate,
    from_weights,
    score_sum,
    target_dtype,
    task_loss,
    weights_from_state_dict,
)
from trainers.user_code import shared_init

if TYPE_CHECKING:  # for annotations only: torch_ddp imports this module, and dynamo is heavy
    from torch._dynamo.callback import CallbackArgs

    from trainers.torch_ddp import Group

log = logging.getLogger(__name__)

STOP_CHECK_STEPS = 50  # ask should_stop every this many steps, as the JAX trainer does per chunk
# ...or, on one device, once this many seconds passed since the last ask (slow steps: a large model)
STOP_CHECK_S = 1.0
STATE_DICT_FILE = "state_dict.pt"


def fit(spec: JobSpec, workdir: Path, report: Report, should_stop: ShouldStop, options: RunOptions) -> FitResult:
    """Train `spec` with PyTorch on `spec.hardware`, reporting each epoch; write artifacts to `workdir`.

    Raises HardwareMismatch when spec.hardware is gpu without CUDA or tpu without torch_xla,
    DataNotFound when the dataset is missing, and lets StopTraining from `report`/`should_stop`
    propagate (the metrics already reported stand; no artifacts are written; with a reason of
    HAND_BACK_REASONS, on one cpu or cuda device, a checkpoint of the epoch's steps done so far
    is written first).
    """
    if spec.devices > 1:  # data parallel: DDP, one process per device, each running `train`
        from trainers import torch_ddp

        return torch_ddp.fit(spec, workdir, report, should_stop, options)
    start = time.perf_counter()
    device = _device_for(spec.hardware)
    torch.set_num_threads(threads_for(spec))
    return train(spec, workdir, report, should_stop, OneDevice(device), start, options)


# Below this many FLOPs a step, a step runs on one thread: splitting a matmul of a few MFLOP over
# cores costs more in waking and joining OpenMP threads than it saves (the digits MLP's step, ~39
# MFLOP, ran ~10x slower on 2 threads than on 1 on a 2-core machine shared with other work).
TINY_STEP_FLOPS = 50e6


def threads_for(spec: JobSpec) -> int:
    """Threads for the run's intra-op work: 1 for a tiny step (TINY_STEP_FLOPS, from the model's
    FLOPs an example x 3 for forward and backward x the batch), else every core this process may
    run on (torch's default may count the host's cores). Only the built-in MLP: oneDNN's
    one-thread convolutions round differently (a small CNN with batch norm drifted 1e-3 from the
    JAX trainer's test loss in 2 epochs). User code and shapes the spec cannot size (an uploaded
    dataset) count as large."""
    cores = len(os.sched_getaffinity(0))
    if spec.hardware != "cpu" or spec.model.user_code or spec.model.name != "mlp":
        return cores
    try:
        step_flops = 3 * flops_per_example(spec) * spec.batch_size
    except Exception:  # the plan needs the dataset's shape; an uploaded one is not known here
        return cores
    return 1 if step_flops < TINY_STEP_FLOPS else cores


class OneDevice:
    """The world of a run on one device: every batch whole, sums already global, no wrapping.

    trainers.torch_ddp.Group is the same interface over DDP's process group."""

    rank, size = 0, 1
    # should_stop may be asked after any step (DDP's ranks must agree on when: every STOP_CHECK_STEPS)
    timed_stop_checks = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as this world trains it (DDP: batch norm synchronised), before the optimizer."""
        return model

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the forward pass calls (DDP: the DistributedDataParallel wrapper)."""
        return model

    def shard(self, batches: torch.Tensor) -> torch.Tensor:
        """This device's part of each global batch: [steps, batch_size / size] indices."""
        return batches

    def total(self, *values: torch.Tensor) -> list[float]:
        """Sums over the devices, on the host (the epoch's one wait for the device)."""
        return [v.item() for v in values]

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the devices (in place), on the device."""
        return tensor

    def devices(self) -> list[str]:
        return [f"{self.device.type}:{self.device.index or 0}"]


def train(
    spec: JobSpec,
    workdir: Path,
    report: Report,
    should_stop: ShouldStop,
    world: OneDevice | Group,
    start: float,
    options: RunOptions,
) -> FitResult:
    """The training run of `fit` in `world` (OneDevice, or one rank of torch_ddp's group): the
    same steps on any number of devices, each device taking its share of every global batch.
    Only rank 0 checkpoints and writes artifacts; every rank reports (the caller decides who
    listens). `start` is the perf_counter the setup time counts from."""
    run = prepare(spec, world, options)
    setup_s = time.perf_counter() - start

    metrics, first_step_loss, progress = resume(workdir, run, report)
    # "compile": true: the step is compiled here, on one batch, so no epoch pays for it.
    graphs_before = _compilations()
    compile_start = time.perf_counter()
    step = make_train_step(spec, run, world)
    compile_s = time.perf_counter() - compile_start if spec.compile else 0.0
    # Mid-epoch checkpoints where the dropout RNG's state can be saved, by the only rank.
    can_hand_back = world.size == 1 and run.device.type in ("cpu", "cuda")
    checkpoint_s = 0.0
    for epoch in range(len(metrics) + 1, spec.epochs + 1):
        resumed = progress if progress is not None and progress.epoch == epoch else None
        # The rate of the epoch's first step.
        learning_rate = resumed.learning_rate if resumed else run.optimizer.param_groups[0]["lr"]
        hand_back = partial(_hand_back, workdir, run, metrics, first_step_loss) if can_hand_back else None
        train_loss, train_correct, epoch_time_s, step0_loss = train_epoch(
            spec, run, step, world, epoch, should_stop, resumed, hand_back, learning_rate
        )
        first_step_loss = step0_loss if step0_loss is not None else first_step_loss
        # Rank 0 reports and checkpoints; the other ranks' test metrics would go nowhere.
        no_test: dict[str, float | None] = {"test_loss": math.nan}
        test_results, eval_time_s = test(run) if world.rank == 0 else (no_test, 0.0)
        epoch_metrics = summarize_epoch(
            epoch,
            loss_sum=train_loss,
            correct=train_correct,
            steps=run.steps,
            batch_size=spec.batch_size,
            test=test_results,
            epoch_time_s=epoch_time_s,
            eval_time_s=eval_time_s,
            learning_rate=learning_rate,
            evaluated=world.rank == 0,
            task=run.task,
        )
        metrics.append(epoch_metrics)
        # After the last epoch the weights are stored as artifacts: a run killed before that
        # trains the last epoch again from the checkpoint before it, to the same result.
        if world.rank == 0 and epoch < spec.epochs:
            checkpoint_start = time.perf_counter()
            torch_checkpoint.save(
                workdir, epoch, run.model, run.optimizer, metrics, first_step_loss.item(), run.scheduler
            )
            checkpoint_s += time.perf_counter() - checkpoint_start
        report(epoch, epoch_metrics)

    if world.rank != 0:
        return FitResult(metrics=metrics, timings={}, result={}, artifacts=[])
    return FitResult(
        metrics=metrics,
        # Eager: nothing is compiled (0, 0.0). Compiled: the graphs torch.compile built in this
        # run, 1 for a new step and 0 for one this process compiled before; any more would be a
        # recompilation in the middle of training.
        timings={
            **fit_timings(setup_s, compile_s, _compilations() - graphs_before, metrics),
            "checkpoint_s": checkpoint_s,
        },
        result=final_result(metrics[-1], first_step_loss.item()),
        artifacts=save_artifacts(workdir, spec, run.model, metrics, run.preprocessing),
        device=_device_info(run.device, world.devices()),
    )


@dataclass
class Run:
    """What `prepare` sets up: the data on the device, the model, its optimizer and scheduler."""

    device: torch.device
    x_train: torch.Tensor  # float32 [N, D]
    y_train: torch.Tensor  # int64 [N] classes, or float32 [N] regression targets
    x_test: torch.Tensor
    y_test: torch.Tensor
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    autocast: Callable[[], ContextManager]
    steps: int  # optimizer steps per epoch
    task: str = "classification"
    target_variance: float = 0.0  # of the test targets (regression's R^2)
    preprocessing: Preprocessing | None = None
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # user code's loss(logits, y)
    user_code: bool = False  # the model is a user module (options.user_model)
    compile_cache_dir: Path | None = None  # options.compile_cache_dir: compiled steps kept between processes
    compile_cache_max_bytes: int = COMPILE_CACHE_MAX_BYTES  # options': the steps kept within it


def prepare(spec: JobSpec, world: OneDevice | Group, options: RunOptions) -> Run:
    """The data on the device, the model with its initial weights, the optimizer and scheduler."""
    device = world.device
    data = load_dataset(spec.dataset, options.data_dir, options.dataset_file)
    if options.user_model is not None:  # user code: its own module, torch's initialisation from the seed
        torch.manual_seed(spec.seed)
        model = options.user_model.build(tuple(data.input_shape), data.outputs)
        if spec.model.init == "shared":  # the weights a JAX module naming its parameters alike gets
            shapes = {name: tuple(w.shape) for name, w in weights_from_state_dict(model).items()}
            shared = shared_init(shapes, spec.seed)
            model.load_state_dict({name: torch.from_numpy(w) for name, w in shared.items()}, strict=False)
        if device.type == "cpu" and not spec.compile:  # the built-in models' eager dropout (its docstring)
            torch_masks.uniform_dropouts(model)
        model = world.prepare(model.to(device))
    else:
        # Initial weights come from numpy so a JAX job with this spec starts from the same ones.
        weights = init_weights(spec.model, data.input_shape, data.outputs, spec.seed)
        layers = layers_of(spec.model, data.outputs)
        model = world.prepare(from_weights(weights, input_shape=data.input_shape, layers=layers).to(device))
    steps = len(data.x_train) // spec.batch_size
    optimizer, scheduler = make_optimizer(spec, model, device, steps)
    return Run(
        device=device,
        # The data goes to the device once; torch.tensor copies the read-only cached arrays.
        x_train=torch.tensor(data.x_train).to(device),
        y_train=torch.tensor(data.y_train).to(device, target_dtype(data.task)),
        x_test=torch.tensor(data.x_test).to(device),
        y_test=torch.tensor(data.y_test).to(device, target_dtype(data.task)),
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        # bf16: params and optimizer state stay float32; autocast runs the forward in bfloat16.
        autocast=(lambda: torch.autocast(device.type, dtype=torch.bfloat16))
        if spec.precision == "bf16"
        else nullcontext,
        steps=steps,
        task=data.task,
        target_variance=target_variance(data.y_test),
        preprocessing=Preprocessing.of(data),
        loss=options.user_model.loss if options.user_model is not None else None,
        user_code=options.user_model is not None,
        compile_cache_dir=options.compile_cache_dir,
        compile_cache_max_bytes=options.compile_cache_max_bytes,
    )


def compile_model(spec: JobSpec, run: Run) -> torch.nn.Module:
    """The module the train step calls: `run.model` itself, or with "compile": true, its
    torch.compile'd forward and backward built now on one batch (see _compile)."""
    if not spec.compile:
        return run.model
    return _compile(run.model, run.x_train, run.y_train, spec.batch_size, spec, run.device, run.autocast, run.task)


def resume(
    workdir: Path, run: Run, report: Report
) -> tuple[list[EpochMetrics], torch.Tensor, torch_checkpoint.Progress | None]:
    """(metrics, the first step's loss on the device, where the next epoch stands) restored from
    the last checkpoint of a job picked up again (handed back, or after its worker died: its
    epochs are reported again, since the worker may have died before it stored them); else no
    metrics, NaN (the parity check compares it) and None. The progress is None when the
    checkpoint was taken at an epoch's end."""
    if resumed := torch_checkpoint.restore(workdir, run.model, run.optimizer, run.scheduler):
        metrics, first_loss, progress = resumed
        log.info("resuming from the checkpoint of epoch %d in %s", len(metrics), workdir)
        for done in metrics:
            report(done.epoch, done)
        return metrics, torch.tensor(first_loss, device=run.device), progress
    return [], torch.full((), float("nan"), device=run.device), None


TrainStep = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def make_train_step(spec: JobSpec, run: Run, world: OneDevice | Group) -> TrainStep:
    """`step(x, y) -> (loss, score)`: one optimizer step on a batch, as the seeds' loop takes it
    (zero_grad, backward, step), with the batch's mean loss and summed score (score_sum), both
    detached, on the device. With "compile": true it is compiled now, before it returns.

    Compiled, the whole step is one graph where trainers.torch_step covers the run (the built-in
    models without batch norm, on one CPU device, without privacy); otherwise the module is compiled
    (its forward and backward) and the optimizer steps eagerly, as it does without compile."""
    whole = _whole_step(spec, run) if torch_step.supported(spec, run.model, world.size, run.user_code) else None
    if whole is not None:
        return whole
    step = _module_step(spec, run, world.wrap(compile_model(spec, run)), world)

    def scored(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss, logits = step(x, y)
        return loss.detach(), score_sum(logits.detach(), y, run.task)

    return scored


def _whole_step(spec: JobSpec, run: Run) -> TrainStep | None:
    """torch_step's compiled whole step for `run`, the scheduler stepped after each step; None
    where AOTInductor cannot compile it."""
    key = ("whole", *torch_step.cache_key(spec, run.model, tuple(run.x_train.shape[1:]), run.device, run.task))
    steps_dir = run.compile_cache_dir / "torch-steps" if run.compile_cache_dir else None
    fused = torch_step.make(
        spec,
        run.model,
        run.optimizer,
        run.x_train,
        run.y_train,
        run.autocast,
        run.task,
        key,
        steps_dir,
        run.compile_cache_max_bytes,
    )
    if fused is None or run.scheduler is None:
        return fused
    scheduler = run.scheduler

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss, score = fused(x, y)
        scheduler.step()  # per optimizer step, as optax counts its schedules
        return loss, score

    return step


def _module_step(spec: JobSpec, run: Run, forward: torch.nn.Module, world: OneDevice | Group) -> Callable:
    """`step(x, y) -> (loss, logits)` of the module path: the gradients come from `forward` (the
    model, compiled or DDP-wrapped) or, with privacy, from DP-SGD's clipped and noised
    per-example gradients; clip_norm clips them; the scheduler steps per step."""
    if spec.privacy is not None:
        gradients = partial(
            _private_gradients,
            run.model,
            clip_norm=spec.privacy.clip_norm,
            noise_multiplier=spec.privacy.noise_multiplier,
            world=world,
            task=run.task,
        )
    else:
        gradients = partial(_gradients, forward, run.autocast, run.task, loss_fn=run.loss)
    clip_norm = spec.optimizer.clip_norm
    optimizer_step = torch_step.fused_adam(run.optimizer) or run.optimizer.step
    # zero_grad(set_to_none=True) over a list built once: Optimizer.zero_grad's profiler record
    # and hooks cost ~60 us a step (3% of the seeds' MLP step on 2 cores).
    params = [p for group in run.optimizer.param_groups for p in group["params"]]

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for p in params:
            p.grad = None
        loss, logits = gradients(x, y)
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), clip_norm)
        optimizer_step()
        if run.scheduler is not None:
            run.scheduler.step()  # per optimizer step, as optax counts its schedules
        return loss, logits

    return step


def _gradients(
    forward: torch.nn.Module,
    autocast: Callable[[], ContextManager],
    task: str,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mini-batch's mean loss (task_loss, or user code's `loss_fn(logits, y)`), backpropagated
    into each parameter's .grad; (loss, logits)."""
    with autocast():
        logits = forward(x)
        loss = task_loss(logits, y, task) if loss_fn is None else loss_fn(logits, y)
    loss.backward()
    return loss, logits


HandBack = Callable[[torch_checkpoint.Progress, torch.Tensor | None], None]
"""`hand_back(progress, step0_loss)`: checkpoint an epoch stopped at `progress` (train_epoch)."""


def train_epoch(
    spec: JobSpec,
    run: Run,
    step: TrainStep,
    world: OneDevice | Group,
    epoch: int,
    should_stop: ShouldStop,
    resumed: torch_checkpoint.Progress | None = None,
    hand_back: HandBack | None = None,
    learning_rate: float = math.nan,
) -> tuple[float, float, float, torch.Tensor | None]:
    """One epoch of `run.steps` steps over this device's share of each batch, asking
    `should_stop` every STOP_CHECK_STEPS steps (and every STOP_CHECK_S on one device); from the
    step, with the sums and RNG states of `resumed` when given (a checkpoint taken mid-epoch).

    When should_stop raises StopTraining with a reason of HAND_BACK_REASONS after this call ran
    some steps, `hand_back(progress, step0_loss)` is called with where the epoch stands (to
    checkpoint it, with `learning_rate`, the rate of the epoch's first step that its metrics
    report) before the exception propagates.

    Returns (mean batch loss summed over the steps, correct predictions, seconds waited for on the
    device (with the time `resumed` had spent), the first step's loss on the device when this
    call ran epoch 1's step 0, else None)."""
    device = run.device
    # Dropout masks from (seed, epoch), like the batch order, so a resumed run repeats them.
    torch.manual_seed(spec.seed * 100_003 + epoch + 7_919 * world.rank)
    order = epoch_batches(spec.seed, epoch, len(run.x_train), spec.batch_size)
    batches = world.shard(torch.from_numpy(order).to(device, torch.int64))
    start = resumed.step if resumed else 0
    spent_s = resumed.elapsed_s if resumed else 0.0
    if resumed:  # mid-epoch: the generators as they were after step `start - 1`
        torch.set_rng_state(resumed.cpu_rng)
        if device.type == "cuda" and resumed.cuda_rng is not None:
            torch.cuda.set_rng_state(resumed.cuda_rng, device)
    epoch_start = time.perf_counter()
    run.model.train()
    if resumed:
        loss_sum, correct = resumed.loss_sum.to(device, copy=True), resumed.correct.to(device, copy=True)
    else:
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=run.y_train.dtype, device=device)  # summed scores (score_sum)
    step0_loss, next_check = None, 0.0
    for i in range(start, len(batches)):
        idx = batches[i]
        if i % STOP_CHECK_STEPS == 0 or world.timed_stop_checks and time.perf_counter() > next_check:
            _wait_for(device)  # a GPU runs behind the host: the steps asked about are done
            try:
                should_stop()
            except StopTraining as stop:
                if stop.reason in HAND_BACK_REASONS and i > start and hand_back is not None:
                    rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
                    elapsed_s = spent_s + time.perf_counter() - epoch_start
                    cpu_rng = torch.get_rng_state()
                    progress = torch_checkpoint.Progress(
                        epoch, i, loss_sum, correct, elapsed_s, learning_rate, cpu_rng, rng
                    )
                    hand_back(progress, step0_loss)
                raise
            next_check = time.perf_counter() + STOP_CHECK_S
        loss, score = step(run.x_train.index_select(0, idx), run.y_train.index_select(0, idx))
        # Summed on the device: a .item() per step would wait for the device every step.
        loss_sum += loss
        if epoch == 1 and i == 0:
            step0_loss = torch.tensor(world.total(loss)[0] / world.size, device=device)
        correct += score
        _end_step(device)
    # The epoch's one host sync. Each device's loss is the mean over its share of the batch.
    loss_total, train_correct = world.total(loss_sum, correct)
    _wait_for(device)
    return loss_total / world.size, train_correct, spent_s + time.perf_counter() - epoch_start, step0_loss


def _hand_back(
    workdir: Path,
    run: Run,
    metrics: list[EpochMetrics],
    first_step_loss: torch.Tensor,
    progress: torch_checkpoint.Progress,
    step0_loss: torch.Tensor | None,
) -> None:
    """Checkpoint a run stopped at `progress`, after the epochs of `metrics` (train_epoch's HandBack)."""
    first = step0_loss if step0_loss is not None else first_step_loss  # stopped in epoch 1: its step 0
    torch_checkpoint.save(
        workdir, len(metrics), run.model, run.optimizer, metrics, first.item(), run.scheduler, progress
    )


def test(run: Run) -> tuple[dict[str, float | None], float]:
    """(the test metrics, common.test_metrics, and the seconds they took), under torch.no_grad."""
    eval_start = time.perf_counter()
    loss, score = evaluate(run.model, run.x_test, run.y_test, run.task)
    return test_metrics(run.task, loss, score, run.target_variance), time.perf_counter() - eval_start


def save_artifacts(
    workdir: Path,
    spec: JobSpec,
    model: torch.nn.Module,
    metrics: list[EpochMetrics],
    preprocessing: Preprocessing | None = None,
) -> list[str]:
    """weights.safetensors, metrics.json, spec.json (common.write_common_artifacts, with
    preprocessing.json when given) and state_dict.pt: plain tensors, so it loads with
    torch.load(weights_only=True)."""
    state_dict = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    artifacts = write_common_artifacts(workdir, weights_from_state_dict(model), metrics, spec, preprocessing)
    torch.save(state_dict, workdir / STATE_DICT_FILE)
    return [*artifacts, STATE_DICT_FILE]


def _compile(
    model: torch.nn.Module,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    batch_size: int,
    spec: JobSpec,
    device: torch.device,
    autocast: Callable[[], ContextManager] = nullcontext,
    task: str = "classification",
) -> torch.nn.Module:
    """`model` compiled with torch.compile (TorchInductor), its forward and backward built now.

    torch.compile is lazy: it traces and compiles on the first call, and the backward graph on
    the first backward. So one forward and backward pass on a batch of the training shape is run
    here (grads discarded, the optimizer untouched, the RNG restored: the run trains exactly as
    if this never happened) and the caller's clock puts that time in compile_s. Shapes are
    static (dynamic=False): every step has the same [batch_size, features] batch, since
    epoch_batches drops the partial last batch. The pass runs under the training steps'
    `autocast` context, which dynamo guards on. Evaluation keeps using the eager `model`, so
    model.eval() never triggers a second compilation. The returned module shares `model`'s
    parameters.
    """
    _start_compiling((spec.model.model_dump_json(), spec.precision, tuple(x_train.shape[1:]), batch_size, str(device)))
    compiled = torch.compile(model, dynamic=False)
    idx = torch.arange(batch_size, device=device)
    model.train()
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        with autocast():
            loss = task_loss(compiled(x_train[idx]), y_train[idx], task)
        loss.backward()
    model.zero_grad(set_to_none=True)
    _wait_for(device)
    # torch.compile of a Module returns an OptimizedModule (a Module); its stub says a plain callable.
    return compiled  # type: ignore[return-value]


def _start_compiling(key: tuple) -> None:
    """Before compiling the step of `key` (its model, shapes, device): dynamo keeps the steps
    compiled in this process, so a later job with the same key reuses its step; but after
    recompile_limit different ones it would quietly fall back to eager for good. Start afresh
    before that happens."""
    if key not in _compiled_steps and len(_compiled_steps) >= torch._dynamo.config.recompile_limit - 1:
        torch.compiler.reset()
        _compiled_steps.clear()
    _compiled_steps.add(key)
    _count_compilations()  # after any reset, which drops dynamo's callbacks


_compiled_steps: set[tuple] = set()  # the steps torch.compile holds for this process, by shape
_graphs_compiled = 0  # graphs torch.compile (dynamo) traced and compiled in this process


def _compilations() -> int:
    """Graphs compiled in this process so far: dynamo's as they ran, and whole steps compiled
    ahead of time (torch_step; one loaded from the disk is not compiled, and not counted)."""
    return _graphs_compiled + torch_step.compiled_ahead


def _count_graph(args: CallbackArgs) -> None:
    global _graphs_compiled
    from torch._dynamo.callback import CallbackTrigger

    if args.callback_trigger == CallbackTrigger.DYNAMO:  # not the lazily compiled backward of one
        _graphs_compiled += 1


def _count_compilations() -> None:
    """Have dynamo call _count_graph for each compilation it starts (torch.compiler.reset()
    unregisters it, so this is called before every compile)."""
    # Imported on first use: torch._dynamo is heavy, and eager jobs never need it.
    from torch._dynamo.callback import callback_handler

    if _count_graph not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_count_graph)


def _device_for(hardware: str) -> torch.device:
    """The torch device for spec.hardware; HardwareMismatch rather than a quiet CPU fallback."""
    if hardware == "cpu":
        return torch.device("cpu")
    if hardware == "gpu":
        if not torch.cuda.is_available():
            raise HardwareMismatch("gpu", "cpu", "torch (torch.cuda.is_available() is False)")
        return torch.device("cuda", torch.cuda.current_device())
    try:
        import torch_xla.core.xla_model as xm
    except ImportError as error:
        raise HardwareMismatch("tpu", "cpu", "torch (torch_xla is not installed)") from error
    return xm.xla_device()


def make_optimizer(
    spec: JobSpec, model: torch.nn.Module, device: torch.device, steps_per_epoch: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR | None]:
    """(torch.optim optimizer, LambdaLR scheduler or None) for spec.optimizer.

    The scheduler is stepped after every optimizer step, with the factor of
    common.learning_rate_at, so the rate changes per step exactly as optax's schedules do. The
    seeds' default (Adam, constant rate) is the fused Adam it always was, with no scheduler.
    Clipping (clip_grad_norm_) is done by the loop, before optimizer.step().
    """
    opt = spec.optimizer
    skip_dynamo_import()
    if opt.name == "adam" and not opt.weight_decay:
        optimizer = _adam(model, opt.learning_rate, device)
    else:
        cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[opt.name]
        extra = {"momentum": opt.momentum, "nesterov": opt.nesterov} if opt.name == "sgd" else {}
        optimizer = cls(model.parameters(), lr=opt.learning_rate, weight_decay=opt.weight_decay, **extra)
    if opt.schedule == "constant":
        return optimizer, None
    factor = partial(_schedule_factor, opt, steps_per_epoch, spec.epochs)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def skip_dynamo_import() -> None:
    """Let a run's optimizer be built, zeroed, saved and restored without importing
    torch._dynamo (~1.3 s, most of a fresh worker's first PyTorch job's setup). torch.optim wraps
    those Optimizer methods in torch._disable_dynamo, which imports dynamo at their first call to
    build the wrapper it then caches on the function (`__dynamo_disable`); outside a compiled
    region that wrapper only calls the function, so while dynamo is not loaded the function itself
    is cached instead. None of them runs inside a graph here: the compiled step (torch_step) writes
    its update out, and a compiled module never calls them. The seeds' Adam (fused, constant rate:
    torch_step.fused_adam) then never imports dynamo; Optimizer.step() still does (its
    _use_grad), so the other optimizers and schedules pay for it at their first step."""
    if "torch._dynamo" in sys.modules:
        return
    from torch.optim import Optimizer

    for method in (Optimizer.add_param_group, Optimizer.zero_grad, Optimizer.state_dict, Optimizer.load_state_dict):
        function = getattr(method, "__wrapped__", None)  # the plain function under the wrapper
        if function is not None and getattr(function, "__dynamo_disable", None) is None:
            setattr(function, "__dynamo_disable", function)  # what the wrapper calls from now on


def _schedule_factor(opt: OptimizerSpec, steps_per_epoch: int, epochs: int, step: int) -> float:
    return learning_rate_at(opt, step, steps_per_epoch, epochs) / opt.learning_rate


def _private_gradients(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip_norm: float,
    noise_multiplier: float,
    world: OneDevice | Group,
    task: str = "classification",
) -> tuple[torch.Tensor, torch.Tensor]:
    """DP-SGD gradients into each parameter's .grad: per-example gradients (torch.func.vmap of
    torch.func.grad), each clipped to L2 norm clip_norm, summed, plus N(0, (noise_multiplier *
    clip_norm)^2) per coordinate, divided by the batch size. Returns (mean loss, logits) of this
    device's examples. Over several devices the clipped sums are all-reduced and the noise is
    drawn once (by rank 0), so the step is the one a single device takes on the global batch."""
    from torch.func import functional_call, grad, vmap

    params = {name: p.detach() for name, p in model.named_parameters()}
    buffers = dict(model.named_buffers())

    def example_loss(
        params: dict[str, torch.Tensor], x1: torch.Tensor, y1: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        logits = functional_call(model, (params, buffers), (x1[None],))
        loss = task_loss(logits, y1[None], task)
        return loss, (loss.detach(), logits.detach()[0])

    grads, (losses, logits) = vmap(grad(example_loss, has_aux=True), in_dims=(None, 0, 0), randomness="different")(
        params, x, y
    )
    batch = len(x)
    norms = torch.sqrt(sum(g.reshape(batch, -1).pow(2).sum(dim=1) for g in grads.values()))
    factors = 1.0 / torch.clamp(norms / clip_norm, min=1.0)  # clip(g) = g * min(1, C / |g|)
    for name, p in model.named_parameters():
        summed = torch.tensordot(factors, grads[name], dims=1)
        if world.rank == 0:
            summed += noise_multiplier * clip_norm * torch.randn_like(summed)
        p.grad = world.all_sum(summed) / (batch * world.size)
    return losses.mean(), logits


def _adam(model: torch.nn.Module, learning_rate: float, device: torch.device) -> torch.optim.Adam:
    # Fused Adam (one kernel for all parameters) exists for CUDA and CPU, where it is ~15%
    # faster per step than the multi-tensor (foreach) path this MLP would otherwise take.
    if device.type in ("cuda", "cpu"):
        return torch.optim.Adam(model.parameters(), lr=learning_rate, fused=True)
    return torch.optim.Adam(model.parameters(), lr=learning_rate, foreach=True)


def _end_step(device: torch.device) -> None:
    # torch_xla records a lazy graph: cut it at each step or the epoch becomes one huge graph.
    if device.type == "xla":
        import torch_xla.core.xla_model as xm

        xm.mark_step()


def _wait_for(device: torch.device) -> None:
    """Wait until the device has run everything queued, so the clock measures the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xla":
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()


def _device_info(device: torch.device, devices: list[str]) -> dict:
    return {
        "backend": device.type,
        "devices": devices,
        "versions": {"torch": torch.__version__},
    }
