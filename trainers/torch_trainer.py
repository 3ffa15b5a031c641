"""The PyTorch trainer: the seeds' eager loop, with the data already on the device.

Batches are sliced from device tensors with the framework-neutral `epoch_batches` indices
(no DataLoader, no per-sample collation), and the running loss stays on the device until
the epoch ends, so the host waits for the device once per epoch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from trainers.base import EpochMetrics, FitResult, HardwareMismatch, Report, ShouldStop
from trainers.common import epoch_batches, fit_timings, init_params, write_common_artifacts
from trainers.data import load_dataset
from trainers.spec import JobSpec
from trainers.torch_models import MLP, evaluate, from_weights

STOP_CHECK_STEPS = 50  # ask should_stop every this many steps, as the JAX trainer does per chunk
STATE_DICT_FILE = "state_dict.pt"


def fit(spec: JobSpec, workdir: Path, report: Report, should_stop: ShouldStop) -> FitResult:
    """Train `spec` with PyTorch on `spec.hardware`, reporting each epoch; write artifacts to `workdir`.

    Raises HardwareMismatch when spec.hardware is gpu without CUDA or tpu without torch_xla,
    DataNotFound when the dataset is missing, and lets StopTraining from `report`/`should_stop`
    propagate (the metrics already reported stand; no artifacts are written).
    """
    start = time.perf_counter()
    device = _device_for(spec.hardware)
    # Use every core this process may run on (torch's default may count the host's cores).
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(spec.seed)  # dropout masks; the weights and batch order come from numpy
    data = load_dataset(spec.dataset)
    # The data goes to the device once; torch.tensor copies the read-only cached arrays.
    x_train = torch.tensor(data.x_train).to(device)
    y_train = torch.tensor(data.y_train).to(device, torch.int64)  # cross_entropy wants int64 targets
    x_test = torch.tensor(data.x_test).to(device)
    y_test = torch.tensor(data.y_test).to(device, torch.int64)

    # Initial weights come from numpy so a JAX job with this spec starts from the same ones.
    weights = init_params(data.in_features, spec.model.hidden_sizes, data.num_classes, spec.seed)
    model = from_weights(weights, spec.model.dropout).to(device)
    optimizer = _adam(model, spec.optimizer.learning_rate, device)
    n, batch_size = len(data.x_train), spec.batch_size
    steps = n // batch_size
    setup_s = time.perf_counter() - start

    metrics: list[EpochMetrics] = []
    first_step_loss = torch.full((), float("nan"), device=device)  # the parity check compares it
    for epoch in range(1, spec.epochs + 1):
        batches = torch.from_numpy(epoch_batches(spec.seed, epoch, n, batch_size)).to(device, torch.int64)
        epoch_start = time.perf_counter()
        model.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        for step, idx in enumerate(batches):
            if step % STOP_CHECK_STEPS == 0:
                should_stop()
            x, y = x_train[idx], y_train[idx]
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            optimizer.step()
            # Summed on the device: a .item() per step would wait for the device every step.
            loss_sum += loss.detach()
            if epoch == 1 and step == 0:
                first_step_loss = loss.detach().clone()
            correct += (logits.detach().argmax(dim=1) == y).sum()
            _end_step(device)
        train_loss, train_correct = loss_sum.item(), correct.item()  # the epoch's one host sync
        _wait_for(device)
        epoch_time_s = time.perf_counter() - epoch_start

        eval_start = time.perf_counter()
        test_loss, test_accuracy = evaluate(model, x_test, y_test)
        eval_time_s = time.perf_counter() - eval_start

        epoch_metrics = EpochMetrics(
            epoch=epoch,
            train_loss=train_loss / steps,
            train_accuracy=train_correct / (steps * batch_size),
            test_loss=test_loss,
            test_accuracy=test_accuracy,
            epoch_time_s=epoch_time_s,
            eval_time_s=eval_time_s,
            samples_per_s=steps * batch_size / epoch_time_s,
        )
        metrics.append(epoch_metrics)
        report(epoch, epoch_metrics)

    state_dict = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    weights = {name: tensor.numpy() for name, tensor in state_dict.items()}
    artifacts = write_common_artifacts(workdir, weights, metrics, spec)
    torch.save(state_dict, workdir / STATE_DICT_FILE)  # plain tensors: loads with weights_only=True
    return FitResult(
        metrics=metrics,
        timings=fit_timings(setup_s, 0.0, 0, metrics),  # eager: nothing is compiled
        result={"test_accuracy": metrics[-1].test_accuracy, "test_loss": metrics[-1].test_loss,
                "first_step_loss": first_step_loss.item()},
        artifacts=[*artifacts, STATE_DICT_FILE],
        device=_device_info(device),
    )


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


def _adam(model: MLP, learning_rate: float, device: torch.device) -> torch.optim.Adam:
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


def _device_info(device: torch.device) -> dict:
    return {
        "backend": device.type,
        "devices": [f"{device.type}:{device.index or 0}"],
        "versions": {"torch": torch.__version__},
    }
