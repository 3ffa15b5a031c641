"""Is a JAX run and a PyTorch run of the same spec the same training? (numpy only)

Both runs start from the same weights (`common.init_params`) and see the same batches
(`common.epoch_batches`), so with dropout off they differ only by float32 rounding: XLA and
ATen sum the matmuls in other orders. The check:

1. the first step's loss — the same weights on the same batch — agrees to FIRST_STEP_RTOL of its
   size (of 1 for a loss below 1). Deep nets round more: resnet8's first loss (4.24 on
   Fashion-MNIST) differed by 6e-6 of itself between XLA's Eigen convolutions and oneDNN's, the
   seeds' MLP by under 5e-6; a different model (padding, a norm's epsilon, a missing bias) moves it
   by far more;
2. each epoch's mean training loss agrees to EPOCH_LOSS_RTOL (relative). Rounding differences
   grow as training goes on: measured here on the seeds' MLP, 0.2% after one epoch of
   Fashion-MNIST and 0.36% after three, 0.04% after ten epochs of digits. 2% leaves room for
   longer runs while a real difference (another learning rate, a wrong loss, a missed
   zero_grad) shows up as tens of percent within the first epoch;
3. the two sets of final weights predict the same class for at least PREDICTION_AGREEMENT of
   the test set (measured: 97.9% after one epoch of Fashion-MNIST, 100% on digits); for
   regression, their predictions' RMS difference is at most PREDICTION_RMS_TOLERANCE of the
   test targets' standard deviation.

With dropout on, each framework draws its own masks, so only (3) is meaningful; (1) and (2)
are reported as not checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from trainers.common import forward
from trainers.layers import Layer

FIRST_STEP_RTOL = 2e-5
EPOCH_LOSS_RTOL = 0.02
PREDICTION_AGREEMENT = 0.95
PREDICTION_RMS_TOLERANCE = 0.05


def predict(
    weights: dict[str, np.ndarray],
    x: np.ndarray,
    input_shape: Sequence[int] | None = None,
    layers: Sequence[Layer] | None = None,
) -> np.ndarray:
    """Class predictions [N] of the model in `weights` (PyTorch names: layers.i.weight [out, in],
    convs.i.weight [out, in, k, k], ...; its `layers`, or the preset the names say) for flat
    inputs x [N, in_features] (image layers read them as `input_shape` [H, W, C])."""
    return forward(weights, x, input_shape, layers).argmax(axis=1)


def check(
    jax_run: dict,
    torch_run: dict,
    x_test: np.ndarray,
    dropout: float,
    *,
    y_test: np.ndarray | None = None,
    task: str = "classification",
    input_shape: Sequence[int] | None = None,
    layers: Sequence[Layer] | None = None,
) -> dict:
    """Compare two runs. Each run is {"first_step_loss": float, "train_losses": [float per epoch],
    "weights": {name: array}}; `x_test` [N, D] as the models see it (y_test [N]: the regression
    targets). Returns {"passed": bool, "checks": [...], "message": str}."""
    checks = []
    if dropout == 0:
        checks.append(_first_step_check(jax_run["first_step_loss"], torch_run["first_step_loss"]))
        rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(jax_run["train_losses"], torch_run["train_losses"])]
        checks.append(_check("epoch train loss", max(rel, default=0.0), EPOCH_LOSS_RTOL, "largest relative difference"))
    if task == "regression":
        checks.append(
            _regression_agreement(jax_run["weights"], torch_run["weights"], x_test, y_test, input_shape, layers)
        )
    else:
        same = predict(jax_run["weights"], x_test, input_shape, layers) == predict(
            torch_run["weights"], x_test, input_shape, layers
        )
        agreement = float(np.mean(same))
        checks.append(
            {
                "name": "test predictions agree",
                "value": agreement,
                "tolerance": PREDICTION_AGREEMENT,
                "measure": "fraction of the test set",
                "passed": agreement >= PREDICTION_AGREEMENT,
            }
        )
    failed = [c["name"] for c in checks if not c["passed"]]
    if failed:
        message = (
            f"the two runs disagree ({', '.join(failed)}): they did not train the same model, so "
            "their speed and accuracy are not comparable"
        )
    else:
        message = "both frameworks trained the same model" + (
            "" if dropout == 0 else " (dropout on: losses not compared step by step)"
        )
    return {"passed": not failed, "checks": checks, "message": message}


def _regression_agreement(
    jax_weights: dict,
    torch_weights: dict,
    x: np.ndarray,
    y: np.ndarray | None,
    input_shape: Sequence[int] | None,
    layers: Sequence[Layer] | None,
) -> dict:
    """RMS difference of the two models' predictions over the test targets' standard deviation."""
    predictions = [forward(weights, x, input_shape, layers)[:, 0] for weights in (jax_weights, torch_weights)]
    difference = predictions[0] - predictions[1]
    spread = float(np.std(y)) if y is not None and len(y) else 0.0
    value = float(np.sqrt(np.mean(difference.astype(np.float64) ** 2))) / (spread or 1.0)
    return _check(
        "test predictions agree",
        value,
        PREDICTION_RMS_TOLERANCE,
        "RMS difference of the predictions / standard deviation of the test targets",
    )


def _first_step_check(jax_loss: float, torch_loss: float) -> dict:
    difference = abs(jax_loss - torch_loss) / max(abs(torch_loss), 1.0)
    return _check("first step loss", difference, FIRST_STEP_RTOL, "difference relative to the loss (to 1 below 1)")


def _check(name: str, value: float, tolerance: float, measure: str) -> dict:
    passed = math.isfinite(value) and value <= tolerance
    # JSON has no NaN: a value that is not a number is stored as null (and fails the check).
    return {
        "name": name,
        "value": value if math.isfinite(value) else None,
        "tolerance": tolerance,
        "measure": measure,
        "passed": passed,
    }


# User code: the test metric both runs end with may differ by at most this (accuracy in [0, 1];
# for regression, test RMSE relative to the PyTorch run's). Agreeing on PREDICTION_AGREEMENT of
# the test set implies accuracies within 1 - PREDICTION_AGREEMENT, so this is the weaker check.
USER_ACCURACY_ATOL = 1 - PREDICTION_AGREEMENT
USER_RMSE_RTOL = 0.05


def names_compatible(jax_weights: dict[str, np.ndarray], torch_weights: dict[str, np.ndarray]) -> bool:
    """Whether the two weights files name the same tensors with the same shapes (PyTorch's
    conventions: the JAX side's are jax_models.user_weights'), so either loads into the other."""
    return {n: tuple(w.shape) for n, w in jax_weights.items()} == {n: tuple(w.shape) for n, w in torch_weights.items()}


def check_user_code(jax_run: dict, torch_run: dict, *, shared_init: bool, task: str = "classification") -> dict:
    """Compare two runs of user code ({"first_step_loss", "train_losses", "weights", "result"}).

    The service cannot run the user's modules outside their jobs' sandboxes, so the predictions
    are not compared; instead (3) becomes: the final test accuracy agrees to USER_ACCURACY_ATOL
    (regression: test RMSE to USER_RMSE_RTOL). (1) and (2) are checked, as for built-in models,
    only when both start from the same weights: init "shared" and compatible parameter names.
    Returns check's {"passed", "checks", "message"} and "export": {"compatible", "message"}."""
    compatible = names_compatible(jax_run["weights"], torch_run["weights"])
    checks = []
    same_start = shared_init and compatible
    if same_start:
        checks.append(_first_step_check(jax_run["first_step_loss"], torch_run["first_step_loss"]))
        rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(jax_run["train_losses"], torch_run["train_losses"])]
        checks.append(_check("epoch train loss", max(rel, default=0.0), EPOCH_LOSS_RTOL, "largest relative difference"))
    if task == "regression":
        a, b = jax_run["result"].get("test_rmse", math.nan), torch_run["result"].get("test_rmse", math.nan)
        value = abs(a - b) / max(abs(b), 1e-12)
        checks.append(_check("test rmse agrees", value, USER_RMSE_RTOL, "relative difference"))
    else:
        a, b = jax_run["result"].get("test_accuracy", math.nan), torch_run["result"].get("test_accuracy", math.nan)
        checks.append(_check("test accuracy agrees", abs(a - b), USER_ACCURACY_ATOL, "absolute difference"))
    failed = [c["name"] for c in checks if not c["passed"]]
    if failed:
        message = (
            f"the two runs disagree ({', '.join(failed)}): your two modules did not train the same model, so "
            "their speed and accuracy are not comparable"
        )
    elif same_start:
        message = "both frameworks trained the same model (your code, from the same initial weights)"
    else:
        why = "init is 'module'" if compatible else "their parameters are named differently"
        message = (
            f"both frameworks reached the same test {'rmse' if task == 'regression' else 'accuracy'}; the losses "
            f"were not compared step by step: the modules started from different weights ({why})"
        )
    if compatible:
        export = {
            "compatible": True,
            "message": "the two modules name their parameters alike: either's weights load into the other",
        }
    else:
        only = sorted(set(jax_run["weights"]) ^ set(torch_run["weights"]))[:6]
        export = {
            "compatible": False,
            "message": "cross-framework export skipped: the jax and pytorch modules name or shape their parameters "
            f"differently ({', '.join(only) or 'same names, other shapes'}); name them alike to load one's weights "
            "into the other",
        }
    return {"passed": not failed, "checks": checks, "message": message, "export": export}
