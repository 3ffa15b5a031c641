"""The JAX trainer: a pure, jit-compiled train step scanned over the epoch's batches.

The run reads like the seeds' loop, made fast:

- the data is put on the device once and each batch is gathered there by index;
- `train_step(state, batch, key)` is pure; `jax.lax.scan` runs CHUNK_STEPS of them per call,
  so Python dispatches one program per chunk instead of one per step, and `should_stop`
  is asked between chunks;
- the chunk program is compiled ahead of time for one fixed shape. The epoch's steps are
  spread evenly over its chunks and the last chunk is padded with skipped steps, so an epoch
  of any length reuses that one program;
- the state is donated, so XLA updates params and opt_state in place;
- the host waits for the device once per epoch (the loss and accuracy sums).
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.serialization import to_bytes
from flax.training.train_state import TrainState
from jax.experimental.compilation_cache import compilation_cache

from trainers import jax_checkpoint
from trainers.base import EpochMetrics, FitResult, HardwareMismatch, Report, ShouldStop
from trainers.common import epoch_batches, fit_timings, init_params, summarize_epoch, write_common_artifacts
from trainers.data import load_dataset
from trainers.jax_models import MLP, eval_metrics, params_from_weights, weights_from_params
from trainers.spec import JobSpec

CHUNK_STEPS = 50  # steps per compiled call: long enough to hide dispatch, short enough to stop promptly
PARAMS_FILE = "params.msgpack"


def fit(spec: JobSpec, workdir: Path, report: Report, should_stop: ShouldStop) -> FitResult:
    """Train `spec` with JAX on `spec.hardware`, reporting each epoch; write artifacts to `workdir`.

    Raises HardwareMismatch when jax's default backend is not spec.hardware, DataNotFound
    when the dataset is missing, and lets StopTraining from `report`/`should_stop` propagate
    (the metrics already reported stand; no artifacts are written).
    """
    start = time.perf_counter()
    _check_backend(spec.hardware)
    _use_compile_cache()
    data = load_dataset(spec.dataset)
    # The data goes to the device once; batches are gathered there by index.
    x_train, y_train = jax.device_put(data.x_train), jax.device_put(data.y_train)
    x_test, y_test = jax.device_put(data.x_test), jax.device_put(data.y_test)

    model = MLP(tuple(spec.model.hidden_sizes), data.num_classes, spec.model.dropout)
    # Initial weights come from numpy so a PyTorch job with this spec starts from the same ones.
    weights = init_params(data.in_features, spec.model.hidden_sizes, data.num_classes, spec.seed)
    params = params_from_weights(weights)
    optimizer = optax.adam(spec.optimizer.learning_rate)
    state = jax.jit(partial(TrainState.create, apply_fn=model.apply, tx=optimizer))(params=params)
    key = jax.random.PRNGKey(spec.seed)
    evaluate = jax.jit(partial(eval_metrics, model)).lower(state.params, x_test, y_test).compile()

    n, batch_size = len(data.x_train), spec.batch_size
    steps = n // batch_size
    chunk_steps = _chunk_steps(steps)
    setup_s = time.perf_counter() - start

    # Every program built from here on counts: the loop below must build none of its own.
    programs_before = _programs_built
    compile_start = time.perf_counter()
    run_chunk = _compile_chunk(state, x_train, y_train, key, chunk_steps, batch_size)
    compile_s = time.perf_counter() - compile_start

    # A job picked up again after its worker died goes on from its last finished epoch.
    metrics: list[EpochMetrics] = []
    first_step_loss = float("nan")
    if resumed := jax_checkpoint.restore(workdir, state):
        state, metrics, first_step_loss = resumed
        for done in metrics:  # re-reported: the worker may have died before it stored them
            report(done.epoch, done)
    checkpoint_s = 0.0
    for epoch in range(len(metrics) + 1, spec.epochs + 1):
        batches = epoch_batches(spec.seed, epoch, n, batch_size)
        epoch_start = time.perf_counter()
        totals = np.zeros(3, np.float32)  # summed batch losses, correct predictions, step 0's loss
        for batch_idx, step_ids, valid in _chunks(batches, chunk_steps):
            should_stop()
            state, totals = run_chunk(
                state, totals, x_train, y_train, batch_idx, step_ids, valid, key, np.int32(epoch)
            )
        # The only host sync of the epoch: the clock stops once the device is done.
        jax.block_until_ready(state)
        loss_sum, correct, step0_loss = (float(v) for v in jax.device_get(totals))
        first_step_loss = step0_loss if epoch == 1 else first_step_loss
        epoch_time_s = time.perf_counter() - epoch_start

        eval_start = time.perf_counter()
        test_loss, test_accuracy = (float(v) for v in jax.device_get(evaluate(state.params, x_test, y_test)))
        eval_time_s = time.perf_counter() - eval_start

        epoch_metrics = summarize_epoch(
            epoch, loss_sum=loss_sum, correct=correct, steps=steps, batch_size=batch_size, test_loss=test_loss,
            test_accuracy=test_accuracy, epoch_time_s=epoch_time_s, eval_time_s=eval_time_s,
        )
        metrics.append(epoch_metrics)
        checkpoint_start = time.perf_counter()
        jax_checkpoint.save(workdir, epoch, state, metrics, first_step_loss)
        checkpoint_s += time.perf_counter() - checkpoint_start
        report(epoch, epoch_metrics)

    compilations = _programs_built - programs_before
    artifacts = write_common_artifacts(workdir, weights_from_params(state.params), metrics, spec)
    (workdir / PARAMS_FILE).write_bytes(to_bytes(jax.device_get(state.params)))
    return FitResult(
        metrics=metrics,
        timings={**fit_timings(setup_s, compile_s, compilations, metrics), "checkpoint_s": checkpoint_s},
        result={"test_accuracy": metrics[-1].test_accuracy, "test_loss": metrics[-1].test_loss,
                "first_step_loss": first_step_loss},
        artifacts=[*artifacts, PARAMS_FILE],
        device=_device_info(),
    )


def train_step(
    state: TrainState, batch: tuple[jax.Array, jax.Array], key: jax.Array
) -> tuple[TrainState, tuple[jax.Array, jax.Array]]:
    """One Adam step on batch (x [B, D] float32, y [B] int32); `key` drives dropout.

    Returns the new state and (mean cross-entropy of the batch in nats, correct predictions).
    """
    x, y = batch

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, x, train=True, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    correct = jnp.sum(jnp.argmax(logits, axis=-1) == y)
    return state.apply_gradients(grads=grads), (loss, correct)


def train_chunk(state, totals, x_train, y_train, batch_idx, step_ids, valid, key, epoch):
    """Run the chunk's steps in order with `jax.lax.scan`; padded steps (valid False) are skipped.

    batch_idx int32 [C, B] indexes x_train/y_train; step_ids int32 [C] numbers the steps within
    the epoch; totals float32 [3] accumulates (sum of batch losses, correct predictions, the loss
    of the epoch's step 0 — the parity check of a comparison looks at the run's first step).
    Each step's dropout key is key folded with the epoch, then with the step.
    """
    epoch_key = jax.random.fold_in(key, epoch)

    def step(carry, xs):
        idx, step_id, is_valid = xs

        def run(carry):
            state, totals = carry
            batch = (x_train[idx], y_train[idx])
            state, (loss, correct) = train_step(state, batch, jax.random.fold_in(epoch_key, step_id))
            step0_loss = jnp.where(step_id == 0, loss, 0.0)
            return state, totals + jnp.stack([loss, correct.astype(jnp.float32), step0_loss])

        # A real branch, not a select: a select would run padded steps and then copy every
        # param (~8% slower an epoch on CPU). The pass-through is the false branch, XLA's branch
        # 0, the one whose carry copy older XLA elides (jax-ml/jax#5986).
        return jax.lax.cond(is_valid, run, lambda carry: carry, carry), None

    (state, totals), _ = jax.lax.scan(step, (state, totals), (batch_idx, step_ids, valid))
    return state, totals


def _compile_chunk(state, x_train, y_train, key, chunk_steps: int, batch_size: int):
    """Trace and compile train_chunk ahead of time for [chunk_steps, batch_size] batches.

    The compiled program only accepts exactly these shapes, so it cannot silently recompile.
    """
    batch_idx = np.zeros((chunk_steps, batch_size), np.int32)
    step_ids = np.zeros(chunk_steps, np.int32)
    valid = np.zeros(chunk_steps, bool)
    totals = np.zeros(3, np.float32)
    jitted = jax.jit(train_chunk, donate_argnums=(0, 1))  # state and totals are updated in place
    lowered = jitted.lower(state, totals, x_train, y_train, batch_idx, step_ids, valid, key, np.int32(1))
    return lowered.compile()


def _chunk_steps(steps: int) -> int:
    """Steps per chunk: at most CHUNK_STEPS, spread evenly so the last chunk needs little padding."""
    chunks = -(-steps // CHUNK_STEPS)
    return -(-steps // chunks)


def _chunks(batches: np.ndarray, chunk_steps: int):
    """Yield (batch_idx [C, B], step_ids [C], valid [C]) per chunk; the last one padded to C steps."""
    steps = len(batches)
    for first in range(0, steps, chunk_steps):
        count = min(chunk_steps, steps - first)
        batch_idx = np.zeros((chunk_steps, batches.shape[1]), np.int32)
        batch_idx[:count] = batches[first : first + count]
        step_ids = np.arange(first, first + chunk_steps, dtype=np.int32)
        yield batch_idx, step_ids, np.arange(chunk_steps) < count


def _check_backend(hardware: str) -> None:
    backend = jax.default_backend()
    if backend != hardware:
        raise HardwareMismatch(hardware, backend, "jax")


def _use_compile_cache() -> None:
    """Keep compiled programs in $TRAINHUB_COMPILE_CACHE_DIR, when set, across worker restarts."""
    cache_dir = os.environ.get("TRAINHUB_COMPILE_CACHE_DIR")
    if not cache_dir or jax.config.jax_compilation_cache_dir == cache_dir:
        return
    compilation_cache.set_cache_dir(cache_dir)
    # A compile before this one may have settled "no cache" for the process: start afresh.
    compilation_cache.reset_cache()
    # The defaults skip programs that compile in under a second; an MLP step is one of those.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


_programs_built = 0  # XLA programs compiled or loaded from the persistent cache, process-wide


def _count_program(event: str, duration_s: float, **kwargs) -> None:
    global _programs_built
    if event == "/jax/core/compile/backend_compile_duration":  # one per program, cache hits too
        _programs_built += 1


# jax offers no public way to unregister a listener, so one is registered for the process.
jax.monitoring.register_event_duration_secs_listener(_count_program)


def _device_info() -> dict:
    return {
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.id}" for d in jax.devices()],
        "versions": {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__},
    }
