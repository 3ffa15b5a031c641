"""The JAX trainer: a pure, jit-compiled train step scanned over the epoch's batches.

The run reads like the seeds' loop, made fast:

- the data is put on the device once and each batch is gathered there by index;
- `train_step(state, batch, key)` is pure; `jax.lax.scan` runs CHUNK_STEPS of them per call,
  so Python dispatches one program per chunk instead of one per step, and `should_stop`
  is asked between chunks; when steps are slow, a call runs only the steps that fit in
  CHUNK_TARGET_S and skips the rest, so a cancel never waits for minutes of steps;
- the chunk program is compiled ahead of time for one fixed shape. The epoch's steps are
  spread evenly over its chunks and the last chunk is padded with skipped steps, so an epoch
  of any length reuses that one program;
- the state is donated, so XLA updates params and opt_state in place;
- the host stays one call ahead of the device: it waits for the call before the one it just
  dispatched, so the device never idles between calls and a cancel is not queued behind many;
- the programs of a run (its chunk and eval programs, with the model and optimizer they close
  over) are kept in the process, keyed by everything that changes them (program_key), so a
  worker's next job of the same shape compiles nothing, not even from the persistent cache;
- a run handed back between two chunks (preempted, or its worker shutting down) checkpoints
  there, and the next run continues the epoch from that step: a step's batch and dropout key
  are functions of (seed, epoch, step), and the running totals are carried through the scan
  step after step, so where the chunks are cut does not change a single bit.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.serialization import to_bytes
from flax.training.train_state import TrainState
from jax.experimental.compilation_cache import compilation_cache
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainers import jax_checkpoint
from trainers.base import (
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
    summarize_epoch,
    target_variance,
    test_metrics,
    write_common_artifacts,
)
from trainers.data import load_dataset
from trainers.jax_models import (
    LayerModel,
    UserModule,
    build,
    eval_metrics,
    losses,
    user_weights,
    variables_from_weights,
    weights_from_params,
    with_user_weights,
)
from trainers.spec import JobSpec
from trainers.user_code import UserModel, shared_init

if TYPE_CHECKING:  # for annotations only: no import at run time
    from jax.stages import Compiled

log = logging.getLogger(__name__)

CHUNK_STEPS = 50  # steps per compiled call: long enough to hide dispatch, short enough to stop promptly
# ...unless steps are slow (a large model): then a call runs only the steps that fit in this
# many seconds, so a cancel or max_runtime_s is honoured within about that (see steps_per_chunk).
CHUNK_TARGET_S = 1.0
PARAMS_FILE = "params.msgpack"


def fit(spec: JobSpec, workdir: Path, report: Report, should_stop: ShouldStop, options: RunOptions) -> FitResult:
    """Train `spec` with JAX on `spec.hardware`, reporting each epoch; write artifacts to `workdir`.

    Raises HardwareMismatch when jax's default backend is not spec.hardware, DataNotFound
    when the dataset is missing, and lets StopTraining from `report`/`should_stop` propagate
    (the metrics already reported stand; no artifacts are written; with a reason of
    HAND_BACK_REASONS, a checkpoint of the steps done in the epoch is written first).
    """
    start = time.perf_counter()
    _check_backend(spec.hardware)
    _use_compile_cache(options.compile_cache_dir, options.compile_cache_max_bytes)
    run = prepare(spec, options)
    setup_s = time.perf_counter() - start

    # Every program built from here on counts: the loop below must build none of its own.
    programs_before = _programs_built
    compile_start = time.perf_counter()
    if run.programs.run_chunk is None:  # not compiled by an earlier run of this worker
        run.programs.run_chunk = _compile_chunk(
            run.state, run.data.x_train, run.data.y_train, run.key, run.chunk_steps, spec.batch_size, run.step_options
        )
    run_chunk = run.programs.run_chunk
    compile_s = time.perf_counter() - compile_start

    state, metrics, first_step_loss, progress = resume(workdir, run.state, report)
    checkpoints = Checkpoints(workdir)
    pace = Pace(run.chunk_steps)
    for epoch in range(len(metrics) + 1, spec.epochs + 1):
        resumed = progress if progress is not None and progress.epoch == epoch else None
        hand_back = partial(checkpoints.save, metrics, first_step_loss)  # (state, progress)
        state, (loss_sum, correct, step0_loss), epoch_time_s = train_epoch(
            run, run_chunk, state, epoch, pace, should_stop, resumed, hand_back
        )
        first_step_loss = step0_loss if epoch == 1 else first_step_loss
        test, eval_time_s = evaluate(run, state)
        epoch_metrics = summarize_epoch(
            epoch,
            loss_sum=loss_sum,
            correct=correct,
            steps=run.steps,
            batch_size=spec.batch_size,
            test=test,
            epoch_time_s=epoch_time_s,
            eval_time_s=eval_time_s,
            learning_rate=run.learning_rate((epoch - 1) * run.steps),
            task=run.task,
        )
        metrics.append(epoch_metrics)
        # After the last epoch the weights are stored as artifacts: a run killed before that
        # trains the last epoch again from the checkpoint before it, to the same result.
        if epoch < spec.epochs:
            checkpoints.save(metrics, first_step_loss, state)
        report(epoch, epoch_metrics)

    compilations = _programs_built - programs_before - checkpoints.programs
    return FitResult(
        metrics=metrics,
        timings={**fit_timings(setup_s, compile_s, compilations, metrics), "checkpoint_s": checkpoints.seconds},
        result=final_result(metrics[-1], first_step_loss),
        artifacts=save_artifacts(workdir, spec, state, metrics, run.preprocessing),
        device=_device_info(run.mesh),
    )


class DeviceData(NamedTuple):
    """The dataset on the device (replicated over the mesh): x float32 [N, D], y [N] (int32
    classes, or float32 regression targets)."""

    x_train: jax.Array
    y_train: jax.Array
    x_test: jax.Array
    y_test: jax.Array


@dataclass
class Run:
    """What `prepare` sets up for a run: the mesh, the data on the device, the initial state and
    the pieces of its train step, which `fit` then compiles and loops over."""

    mesh: Mesh
    data: DeviceData
    state: TrainState
    key: jax.Array
    learning_rate: Callable[[int], float]
    step_options: StepOptions
    evaluate: Callable
    seed: int
    batch_size: int
    steps: int  # optimizer steps per epoch
    chunk_steps: int  # steps per compiled call
    task: str = "classification"
    target_variance: float = 0.0  # of the test targets (regression's R^2)
    preprocessing: Preprocessing | None = None
    programs: Programs = None  # type: ignore[assignment]  # set by prepare


@dataclass
class Programs:
    """What a run compiles, kept for the runs after it with the same program_key: the model and
    optimizer (the state's static fields: a compiled program accepts only a state whose treedef,
    these included, is the one it was built for), the learning rate of each step, the state's
    init, the eval program and the chunk program (None until fit compiles it)."""

    model: LayerModel | UserModule
    optimizer: optax.GradientTransformation
    learning_rate: Callable[[int], float]
    create_state: Callable
    evaluate: Any = None
    run_chunk: Compiled | None = None


# The programs of the last few program keys (a worker runs one job at a time; a sweep or a
# stream of small jobs mostly repeats one spec). Least recently used first.
_programs: OrderedDict[str, Programs] = OrderedDict()
PROGRAMS_KEPT = 8
# Spec fields that never change a compiled program: the seed is the init's and the PRNG key's
# value (an argument), the rest is bookkeeping. Any other field is in the key, which costs at
# worst a compile that could have been skipped, never a wrong program.
_NOT_IN_PROGRAM = {"seed", "name", "labels", "max_runtime_s", "priority"}


def program_key(spec: JobSpec, data: DeviceData, steps: int, task: str, user_model: UserModel | None) -> str | None:
    """What the compiled programs of a run depend on, as a string: the spec without
    _NOT_IN_PROGRAM, the data's shapes, dtypes and placement, the steps per epoch (schedules count
    them) and the task. None for user code: its module and loss are the user's Python objects."""
    if user_model is not None or spec.model.user_code:
        return None
    arrays = [(a.shape, str(a.dtype), str(a.sharding)) for a in data]
    return json.dumps(
        [spec.model_dump(mode="json", exclude=_NOT_IN_PROGRAM), arrays, steps, task], sort_keys=True, default=str
    )


def programs_for(key: str | None, build: Callable[[], Programs]) -> Programs:
    """The kept Programs of `key`, else `build()`'s (kept when key is not None)."""
    if key is not None and key in _programs:
        _programs.move_to_end(key)
        return _programs[key]
    programs = build()
    if key is not None:
        _programs[key] = programs
        while len(_programs) > PROGRAMS_KEPT:
            _programs.popitem(last=False)
    return programs


def forget_programs() -> None:
    """Drop every kept Programs: the next run of any spec compiles (or loads from the persistent
    cache) as a fresh worker's would."""
    _programs.clear()


def prepare(spec: JobSpec, options: RunOptions) -> Run:
    """The mesh, the data on the device, the model's initial TrainState and the eval program."""
    # Data parallel: a one-axis mesh over the job's devices. The data and the state are
    # replicated, each step's batch is split along "data", and XLA reduces the gradients.
    mesh = _mesh(spec.devices, spec.hardware)
    replicated = NamedSharding(mesh, PartitionSpec())
    dataset = load_dataset(spec.dataset, options.data_dir, options.dataset_file)
    # The data goes to the device once; batches are gathered there by index.
    data = DeviceData(
        *(
            jax.device_put(array, replicated)
            for array in (dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test)
        )
    )
    steps = len(dataset.x_train) // spec.batch_size

    def build_programs() -> Programs:
        model = build_model(spec, dataset.outputs, dataset.input_shape, options.user_model)
        optimizer, learning_rate = make_optimizer(spec, steps)
        return Programs(model, optimizer, learning_rate, state_init(model, optimizer, replicated))

    key = program_key(spec, data, steps, dataset.task, options.user_model) if options.keep_programs else None
    programs = programs_for(key, build_programs)
    variables = initial_variables(spec, programs.model, dataset.input_shape, dataset.outputs)
    state = programs.create_state(variables)
    if programs.evaluate is None:
        programs.evaluate = (
            jax.jit(partial(eval_metrics, programs.model, task=dataset.task))
            .lower(_eval_variables(state), data.x_test, data.y_test)
            .compile()
        )
    step_options = StepOptions(
        batch_sharding=NamedSharding(mesh, PartitionSpec("data")) if spec.devices > 1 else None,
        privacy_clip_norm=spec.privacy.clip_norm if spec.privacy else None,
        privacy_noise_multiplier=spec.privacy.noise_multiplier if spec.privacy else 0.0,
        task=dataset.task,
        loss=options.user_model.loss if options.user_model is not None else None,
    )
    return Run(
        mesh=mesh,
        data=data,
        state=state,
        key=jax.random.PRNGKey(spec.seed),
        learning_rate=programs.learning_rate,
        step_options=step_options,
        evaluate=programs.evaluate,
        seed=spec.seed,
        batch_size=spec.batch_size,
        steps=steps,
        chunk_steps=_chunk_steps(steps),
        task=dataset.task,
        target_variance=target_variance(dataset.y_test),
        preprocessing=Preprocessing.of(dataset),
        programs=programs,
    )


def build_model(
    spec: JobSpec, outputs: int, input_shape: tuple[int, ...] = (), user_model: UserModel | None = None
) -> LayerModel | UserModule:
    """The flax module (user code: the entrypoint's, built with the input shape and outputs); bf16:
    params and optimizer state stay float32, the model computes in bfloat16."""
    dtype = jnp.bfloat16 if spec.precision == "bf16" else jnp.float32
    if user_model is not None:
        return UserModule.of(user_model.build(tuple(input_shape), outputs), dtype)
    return build(spec.model, outputs, dtype, input_shape or None)


def state_init(
    model: LayerModel | UserModule, optimizer: optax.GradientTransformation, sharding: NamedSharding
) -> Callable[[dict], TrainState]:
    """variables -> the initial TrainState of `model` (BatchNormTrainState with batch norm), placed
    with `sharding`; jitted once, so the runs that share it trace it once."""

    def create(params: Any, batch_stats: Any) -> TrainState:
        if batch_stats is not None:
            return BatchNormTrainState.create(
                apply_fn=model.apply, tx=optimizer, params=params, batch_stats=batch_stats
            )
        return TrainState.create(apply_fn=model.apply, tx=optimizer, params=params)

    jitted = jax.jit(create, out_shardings=sharding)
    return lambda variables: jitted(variables["params"], variables.get("batch_stats"))


def initial_variables(
    spec: JobSpec, model: LayerModel | UserModule, input_shape: int | tuple[int, ...], outputs: int
) -> dict:
    """The model's initial flax variables: from common.init_weights; user code: its own init from
    PRNGKey(seed), or with init "shared" user_code.shared_init's (by PyTorch-style names)."""
    if not isinstance(model, UserModule):
        return variables_from_weights(init_weights(spec.model, input_shape, outputs, spec.seed))
    variables = model.init(spec.seed, input_shape if isinstance(input_shape, tuple) else (input_shape,))
    variables = {c: variables[c] for c in ("params", "batch_stats") if c in variables}
    if spec.model.init == "shared":
        shapes = {name: tuple(w.shape) for name, w in user_weights(variables).items()}
        variables = with_user_weights(variables, shared_init(shapes, spec.seed))
    return variables


def resume(
    workdir: Path, state: TrainState, report: Report
) -> tuple[TrainState, list[EpochMetrics], float, jax_checkpoint.Progress | None]:
    """(state, metrics, first step's loss, where the next epoch stands) from the last checkpoint
    of a job picked up again (handed back, or after its worker died: its epochs are reported
    again, since the worker may have died before it stored them); else the initial state, no
    metrics, NaN and None. The progress is None when the checkpoint was taken at an epoch's end."""
    if resumed := jax_checkpoint.restore(workdir, state):
        state, metrics, first_step_loss, progress = resumed
        log.info("resuming from the checkpoint of epoch %d in %s", len(metrics), workdir)
        for done in metrics:
            report(done.epoch, done)
        return state, metrics, first_step_loss, progress
    return state, [], float("nan"), None


def train_epoch(
    run: Run,
    run_chunk: Compiled,
    state: TrainState,
    epoch: int,
    pace: Pace,
    should_stop: ShouldStop,
    resumed: jax_checkpoint.Progress | None = None,
    hand_back: Callable[[TrainState, jax_checkpoint.Progress], None] | None = None,
) -> tuple[TrainState, tuple[float, ...], float]:
    """One epoch of `run.steps` steps in compiled chunks, asking `should_stop` between chunks;
    from the step and with the totals of `resumed` when given (a checkpoint taken mid-epoch).

    When should_stop raises StopTraining with a reason of HAND_BACK_REASONS after this call ran
    some steps, `hand_back(state, progress)` is called with where the epoch stands (to checkpoint
    it) before the exception propagates.

    Returns the state, (sum of the batch losses, correct predictions, the loss of step 0) and the
    epoch's time in seconds, waited for on the device (with the time `resumed` had spent)."""
    batches = epoch_batches(run.seed, epoch, len(run.data.x_train), run.batch_size)
    epoch_start = time.perf_counter()
    # summed batch losses, correct predictions, step 0's loss
    totals = np.array(resumed.totals if resumed else (0.0, 0.0, 0.0), np.float32)
    start = first = resumed.step if resumed else 0
    spent_s = resumed.elapsed_s if resumed else 0.0
    while first < run.steps:
        try:
            should_stop()
        except StopTraining as stop:
            if stop.reason in HAND_BACK_REASONS and first > start and hand_back is not None:
                jax.block_until_ready(state)
                loss_sum, correct, step0_loss = (float(v) for v in jax.device_get(totals))
                elapsed_s = spent_s + time.perf_counter() - epoch_start
                hand_back(state, jax_checkpoint.Progress(epoch, first, (loss_sum, correct, step0_loss), elapsed_s))
            raise
        count = pace.steps()
        batch_idx, step_ids, valid = _chunk(batches, first, count, run.chunk_steps)
        call_start, previous = time.perf_counter(), totals
        state, totals = run_chunk(
            state, previous, run.data.x_train, run.data.y_train, batch_idx, step_ids, valid, run.key, np.int32(epoch)
        )
        if pace.probing:  # a step alone: wait for it, and time it
            jax.block_until_ready(totals)
            pace.timed(time.perf_counter() - call_start)
        jax.block_until_ready(previous)  # the call before this one is done: the host stays one call ahead
        first += count
    # The clock stops once the device is done.
    jax.block_until_ready(state)
    sums = tuple(float(v) for v in jax.device_get(totals))
    run_s = time.perf_counter() - epoch_start
    pace.timed(run_s / (run.steps - start))
    return state, sums, spent_s + run_s


def evaluate(run: Run, state: TrainState) -> tuple[dict[str, float | None], float]:
    """(the test metrics of `state`, common.test_metrics, and the seconds they took)."""
    eval_start = time.perf_counter()
    loss, score = (
        float(v) for v in jax.device_get(run.evaluate(_eval_variables(state), run.data.x_test, run.data.y_test))
    )
    return test_metrics(run.task, loss, score, run.target_variance), time.perf_counter() - eval_start


class Checkpoints:
    """Saves the state after each epoch, or mid-epoch when the run is handed back
    (jax_checkpoint), counting the time it takes and the small programs Orbax builds to save
    replicated (multi-device) arrays: they are not the train step, so they are not counted as
    its compilations."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.seconds, self.programs = workdir, 0.0, 0

    def save(
        self,
        metrics: list[EpochMetrics],
        first_step_loss: float,
        state: TrainState,
        progress: jax_checkpoint.Progress | None = None,
    ) -> None:
        start, programs_before = time.perf_counter(), _programs_built
        jax_checkpoint.save(self.workdir, state, metrics, first_step_loss, progress)
        self.seconds += time.perf_counter() - start
        self.programs += _programs_built - programs_before


def save_artifacts(
    workdir: Path,
    spec: JobSpec,
    state: TrainState,
    metrics: list[EpochMetrics],
    preprocessing: Preprocessing | None = None,
) -> list[str]:
    """weights.safetensors, metrics.json, spec.json (common.write_common_artifacts, with
    preprocessing.json when the inputs were standardized) and params.msgpack: every collection
    the model needs, laid out as model.init returns them."""
    batch_stats = getattr(state, "batch_stats", None)
    if spec.model.user_code:  # its own names, in PyTorch's conventions (jax_models.user_weights)
        weights = user_weights({"params": state.params, **({"batch_stats": batch_stats} if batch_stats else {})})
    else:
        weights = weights_from_params(state.params, batch_stats)
    artifacts = write_common_artifacts(workdir, weights, metrics, spec, preprocessing)
    variables = {"params": state.params, **({"batch_stats": batch_stats} if batch_stats else {})}
    (workdir / PARAMS_FILE).write_bytes(to_bytes(jax.device_get(variables)))
    return [*artifacts, PARAMS_FILE]


class BatchNormTrainState(TrainState):
    """TrainState plus the models' batch-norm running statistics (flax's `batch_stats`)."""

    batch_stats: dict = flax.struct.field(default_factory=dict)


@dataclass(frozen=True)
class StepOptions:
    """Static settings of the train step (hashable: they are part of the compiled program).

    batch_sharding: data parallel, the batch's split over the mesh (None: one device).
    privacy_clip_norm: DP-SGD per-example clipping bound (None: ordinary mini-batch gradients);
    privacy_noise_multiplier: the noise's standard deviation in units of privacy_clip_norm.
    """

    batch_sharding: NamedSharding | None = None
    privacy_clip_norm: float | None = None
    privacy_noise_multiplier: float = 0.0
    task: str = "classification"
    loss: Callable[[jax.Array, jax.Array], jax.Array] | None = None  # user code's loss(logits, y)


def train_step(
    state: TrainState, batch: tuple[jax.Array, jax.Array], key: jax.Array, options: StepOptions = StepOptions()
) -> tuple[TrainState, tuple[jax.Array, jax.Array]]:
    """One optimizer step on batch (x [B, D] float32, y [B]: int32 classes or float32 targets);
    `key` drives dropout (and the privacy noise, from key folded with 1).

    Returns the new state and (the batch's mean loss, its summed score: jax_models.losses).
    """
    x, y = batch
    if options.batch_sharding is not None:
        # Split the batch over the devices; params are replicated, so XLA all-reduces the grads.
        x = jax.lax.with_sharding_constraint(x, options.batch_sharding)
        y = jax.lax.with_sharding_constraint(y, options.batch_sharding)
    if options.privacy_clip_norm is not None:
        return _private_step(state, x, y, key, options)
    batch_norm = isinstance(state, BatchNormTrainState)

    def loss_fn(params: Any) -> tuple[jax.Array, tuple[jax.Array, Any]]:
        if batch_norm:
            logits, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats},  # type: ignore[attr-defined]  # batch_norm
                x,
                train=True,
                rngs={"dropout": key},
                mutable=["batch_stats"],
            )
        else:
            logits, updates = state.apply_fn({"params": params}, x, train=True, rngs={"dropout": key}), None
        per_example, score = losses(logits, y, options.task)
        loss = per_example.mean() if options.loss is None else options.loss(logits, y)
        return loss, (score, updates)

    (loss, (score, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    correct = jnp.sum(score)
    state = state.apply_gradients(grads=grads)
    if batch_norm:
        state = state.replace(batch_stats=updates["batch_stats"])
    return state, (loss, correct)


def _private_step(
    state: TrainState, x: jax.Array, y: jax.Array, key: jax.Array, options: StepOptions
) -> tuple[TrainState, tuple[jax.Array, jax.Array]]:
    """DP-SGD: per-example gradients (vmap of grad), each clipped to L2 norm C, summed, plus
    N(0, (noise_multiplier * C)^2) per coordinate, divided by the batch size."""
    clip, batch = options.privacy_clip_norm, x.shape[0]
    assert clip is not None  # train_step takes this path only when privacy_clip_norm is set

    def example_loss(params: Any, x1: jax.Array, y1: jax.Array, dropout_key: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = state.apply_fn({"params": params}, x1[None], train=True, rngs={"dropout": dropout_key})
        loss, score = losses(logits, y1[None], options.task)
        return loss[0], score[0]

    dropout_keys = jax.random.split(key, batch)
    (example_losses, scores), grads = jax.vmap(jax.value_and_grad(example_loss, has_aux=True), in_axes=(None, 0, 0, 0))(
        state.params, x, y, dropout_keys
    )
    norms = jnp.sqrt(sum(jnp.sum(g.reshape(batch, -1) ** 2, axis=1) for g in jax.tree.leaves(grads)))
    factors = 1.0 / jnp.maximum(1.0, norms / clip)  # clip(g) = g * min(1, C / |g|)
    leaves, treedef = jax.tree.flatten(grads)
    noise_keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
    noised = [
        (
            jnp.tensordot(factors, g, axes=1)
            + options.privacy_noise_multiplier * clip * jax.random.normal(k, g.shape[1:], g.dtype)
        )
        / batch
        for g, k in zip(leaves, noise_keys)
    ]
    state = state.apply_gradients(grads=jax.tree.unflatten(treedef, noised))
    return state, (example_losses.mean(), jnp.sum(scores))


def make_optimizer(spec: JobSpec, steps_per_epoch: int) -> tuple[optax.GradientTransformation, Callable[[int], float]]:
    """(optax transformation, learning_rate(step) -> float) for spec.optimizer.

    Schedules count optimizer steps (optax's own count in opt_state), as OptimizerSpec defines
    them; the seeds' default is exactly optax.adam(1e-3).
    """
    opt = spec.optimizer
    total = spec.epochs * steps_per_epoch
    if opt.schedule == "constant":
        schedule = opt.learning_rate
    elif opt.schedule == "cosine" or opt.warmup_epochs == 0:
        schedule = optax.cosine_decay_schedule(opt.learning_rate, decay_steps=total)
    else:
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, opt.learning_rate, warmup_steps=opt.warmup_epochs * steps_per_epoch, decay_steps=total
        )
    if opt.name == "adamw":
        core = optax.adamw(schedule, weight_decay=opt.weight_decay)
    elif opt.name == "sgd":
        core = optax.sgd(schedule, momentum=opt.momentum or None, nesterov=opt.nesterov)
    else:
        core = optax.adam(schedule)
    chain = []
    if opt.clip_norm is not None:
        chain.append(optax.clip_by_global_norm(opt.clip_norm))
    if opt.weight_decay and opt.name != "adamw":  # L2 on the gradient, as torch's Adam and SGD do
        chain.append(optax.add_decayed_weights(opt.weight_decay))
    tx = optax.chain(*chain, core) if chain else core
    return tx, (lambda step: float(schedule(step)) if callable(schedule) else float(schedule))


def _eval_variables(state: TrainState) -> Mapping[str, Any]:
    """What eval_metrics applies the model to: the params, with the running statistics if any."""
    if isinstance(state, BatchNormTrainState):
        return {"params": state.params, "batch_stats": state.batch_stats}
    return state.params


def _mesh(devices: int, hardware: str) -> Mesh:
    """A one-axis ("data") mesh over the first `devices` devices; HardwareMismatch when fewer."""
    found = jax.devices()
    if len(found) < devices:
        raise HardwareMismatch(f"{devices} {hardware} devices", f"{len(found)} {jax.default_backend()} devices", "jax")
    return Mesh(np.array(found[:devices]), ("data",))


def train_chunk(
    state: TrainState,
    totals: jax.Array,
    x_train: jax.Array,
    y_train: jax.Array,
    batch_idx: jax.Array,
    step_ids: jax.Array,
    valid: jax.Array,
    key: jax.Array,
    epoch: jax.Array,
    options: StepOptions = StepOptions(),
) -> tuple[TrainState, jax.Array]:
    """Run the chunk's steps in order with `jax.lax.scan`; padded steps (valid False) are skipped.

    batch_idx int32 [C, B] indexes x_train/y_train; step_ids int32 [C] numbers the steps within
    the epoch; totals float32 [3] accumulates (sum of batch losses, correct predictions, the loss
    of the epoch's step 0 — the parity check of a comparison looks at the run's first step).
    Each step's dropout key is key folded with the epoch, then with the step.
    """
    epoch_key = jax.random.fold_in(key, epoch)

    def step(carry: tuple[TrainState, jax.Array], xs: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[Any, None]:
        idx, step_id, is_valid = xs

        def run(carry: tuple[TrainState, jax.Array]) -> tuple[TrainState, jax.Array]:
            state, totals = carry
            batch = (x_train[idx], y_train[idx])
            state, (loss, correct) = train_step(state, batch, jax.random.fold_in(epoch_key, step_id), options)
            step0_loss = jnp.where(step_id == 0, loss, 0.0)
            return state, totals + jnp.stack([loss, correct.astype(jnp.float32), step0_loss])

        # A real branch, not a select: a select would run padded steps and then copy every
        # param (~8% slower an epoch on CPU). The pass-through is the false branch, XLA's branch
        # 0, the one whose carry copy older XLA elides (jax-ml/jax#5986).
        return jax.lax.cond(is_valid, run, lambda carry: carry, carry), None

    (state, totals), _ = jax.lax.scan(step, (state, totals), (batch_idx, step_ids, valid))
    return state, totals


def _compile_chunk(
    state: TrainState,
    x_train: jax.Array,
    y_train: jax.Array,
    key: jax.Array,
    chunk_steps: int,
    batch_size: int,
    options: StepOptions = StepOptions(),
) -> Compiled:
    """Trace and compile train_chunk ahead of time for [chunk_steps, batch_size] batches.

    The compiled program only accepts exactly these shapes, so it cannot silently recompile.
    """
    batch_idx = np.zeros((chunk_steps, batch_size), np.int32)
    step_ids = np.zeros(chunk_steps, np.int32)
    valid = np.zeros(chunk_steps, bool)
    totals = np.zeros(3, np.float32)
    shardings: dict[str, Any] = {}  # jax.jit's keyword arguments
    if options.batch_sharding is not None:
        # Outputs replicated like the inputs, so the next chunk takes them as they are (else XLA
        # may pick other layouts, and every call would reshard them with programs of its own).
        replicated = NamedSharding(options.batch_sharding.mesh, PartitionSpec())
        shardings = {"out_shardings": (replicated, replicated)}
        totals = jax.device_put(totals, replicated)
    # The state is updated in place; totals is not donated: the host waits on the one a call
    # was given (the call before's) to stay one call ahead of the device.
    jitted = jax.jit(partial(train_chunk, options=options), donate_argnums=0, **shardings)
    lowered = jitted.lower(state, totals, x_train, y_train, batch_idx, step_ids, valid, key, np.int32(1))
    return lowered.compile()


def _chunk_steps(steps: int) -> int:
    """Steps per chunk: at most CHUNK_STEPS, spread evenly so the last chunk needs little padding."""
    chunks = -(-steps // CHUNK_STEPS)
    return -(-steps // chunks)


def steps_per_chunk(step_s: float, chunk_steps: int) -> int:
    """Steps to run in one call: all `chunk_steps` when they take under CHUNK_TARGET_S together,
    else as many as fit in it (at least one). The other steps of the call are skipped."""
    return max(1, min(chunk_steps, int(CHUNK_TARGET_S / step_s))) if step_s > 0 else chunk_steps


class Pace:
    """How many steps each call runs, so that should_stop is asked about every CHUNK_TARGET_S
    however slow a step is (with the host one call ahead of the device, a cancel waits for at
    most two calls). The run's first steps run one per call and are timed (the second counts:
    the first call also warms up); after that, each epoch's time per step."""

    PROBES = 2

    def __init__(self, chunk_steps: int) -> None:
        self.chunk_steps, self.step_s, self.probes_left = chunk_steps, 0.0, self.PROBES

    @property
    def probing(self) -> bool:
        return self.probes_left > 0

    def steps(self) -> int:
        return 1 if self.probing else steps_per_chunk(self.step_s, self.chunk_steps)

    def timed(self, step_s: float) -> None:
        """A step took `step_s` seconds (one run alone, or an epoch's average)."""
        self.step_s, self.probes_left = step_s, max(0, self.probes_left - 1)


def _chunk(batches: np.ndarray, first: int, count: int, chunk_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch_idx [C, B], step_ids [C], valid [C]) for the epoch's steps first..first+count-1
    (fewer at the epoch's end), padded to C = chunk_steps with skipped steps."""
    count = min(count, len(batches) - first)
    batch_idx = np.zeros((chunk_steps, batches.shape[1]), np.int32)
    batch_idx[:count] = batches[first : first + count]
    step_ids = np.arange(first, first + chunk_steps, dtype=np.int32)
    return batch_idx, step_ids, np.arange(chunk_steps) < count


def _check_backend(hardware: str) -> None:
    backend = jax.default_backend()
    if backend != hardware:
        raise HardwareMismatch(hardware, backend, "jax")


def _use_compile_cache(directory: Path | None, max_bytes: int) -> None:
    """Keep compiled programs in `directory`, when given, across worker restarts, within
    `max_bytes` (JAX's LRU cache removes the least recently used programs beyond it)."""
    cache_dir = str(directory) if directory else None
    # jax.config reads its flags as attributes, which its stub does not declare.
    config = jax.config
    if not cache_dir or (
        config.jax_compilation_cache_dir == cache_dir  # type: ignore[attr-defined]
        and config.jax_compilation_cache_max_size == max_bytes  # type: ignore[attr-defined]
    ):
        return
    jax.config.update("jax_compilation_cache_max_size", max_bytes)  # read when the cache is made
    _add_access_times(Path(cache_dir))
    compilation_cache.set_cache_dir(cache_dir)
    # A compile before this one may have settled "no cache" for the process: start afresh.
    compilation_cache.reset_cache()
    # The defaults skip programs that compile in under a second; an MLP step is one of those.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def _add_access_times(directory: Path) -> None:
    """Give each entry of JAX's cache in `directory` that has none its access-time file, as if used
    now. JAX's bounded cache keeps `<key>-atime` beside each `<key>-cache` and fails every later
    write (with a warning only) while an entry lacks one: entries written unbounded (by an older
    worker) or by a worker killed between the two writes would stop the cache taking programs."""
    now = time.time_ns().to_bytes(8, "little")  # (JAX's own format: lru_cache.LRUCache)
    for entry in directory.glob("*-cache") if directory.is_dir() else ():
        access_time = entry.with_name(entry.name.removesuffix("-cache") + "-atime")
        if not access_time.exists():
            try:
                access_time.write_bytes(now)
            except OSError as exc:  # another user's cache: JAX reports what it cannot write itself
                log.warning("compile cache entry %s has no access time and none could be written: %s", entry, exc)


_programs_built = 0  # XLA programs compiled or loaded from the persistent cache, process-wide


def _count_program(event: str, duration_s: float, **kwargs: str | int) -> None:
    global _programs_built
    if event == "/jax/core/compile/backend_compile_duration":  # one per program, cache hits too
        _programs_built += 1


# jax offers no public way to unregister a listener, so one is registered for the process.
# jax calls listeners positionally; its Protocol also names the second parameter, duration_secs.
jax.monitoring.register_event_duration_secs_listener(_count_program)  # type: ignore[arg-type]


def _device_info(mesh: Mesh) -> dict:
    return {
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.id}" for d in mesh.devices.flat],
        "versions": {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__},
    }
