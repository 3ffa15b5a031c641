"""The job spec: what a user asks trainhub to train.

These are plain pydantic models with no framework imports, so the API, the workers and the
trainers share one definition. `app/schemas.py` re-exports `JobSpec` as the HTTP request body.

Defaults follow the seeds' MNIST MLP: 784-256-128-10, ReLU, Adam with learning rate 1e-3,
batch size 128, 10 epochs, seed 0.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Framework = Literal["jax", "pytorch"]
Hardware = Literal["cpu", "gpu", "tpu"]
DatasetName = Literal["mnist", "fashion-mnist", "digits", "synthetic"]

MAX_EPOCHS = 1000
MAX_BATCH_SIZE = 65536
MAX_HIDDEN_UNITS = 16384
MAX_HIDDEN_LAYERS = 16
MAX_EXAMPLES = 1_000_000  # per split: 1M x 784 float32 is 3 GB of host memory
MAX_PARAMETERS = 50_000_000
MAX_RUNTIME_S = 7 * 24 * 3600  # the broker's visibility timeout (app/config.py) must exceed it
MAX_LABELS = 32
MAX_LABEL_KEY_CHARS = 64
MAX_LABEL_VALUE_CHARS = 256  # 200 MB of fp32 weights, three times that with Adam's moments


class _Strict(BaseModel):
    # Unknown fields are a typo more often than not: refuse them rather than ignore them. Strict
    # types: "2", 2.5 or true for an int, or "0.01" for a float, are errors, not guesses.
    model_config = ConfigDict(extra="forbid", strict=True)


class ModelSpec(_Strict):
    """A multi-layer perceptron: flattened input -> hidden_sizes (ReLU) -> num_classes logits."""

    name: Literal["mlp"] = "mlp"
    hidden_sizes: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_HIDDEN_UNITS)]],
        Field(max_length=MAX_HIDDEN_LAYERS),
    ] = [256, 128]
    dropout: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = 0.0


class DatasetSpec(_Strict):
    """Which data to train on, optionally limited to the first N examples of each split.

    `synthetic` draws `train_limit` (default 10000) and `test_limit` (default 2000) examples of
    784 features labelled by a fixed random linear teacher, for load and speed tests.
    """

    name: DatasetName = "fashion-mnist"
    train_limit: Annotated[int, Field(ge=1, le=MAX_EXAMPLES)] | None = None
    test_limit: Annotated[int, Field(ge=1, le=MAX_EXAMPLES)] | None = None


class OptimizerSpec(_Strict):
    """Adam (Kingma & Ba, 2015) with the default betas (0.9, 0.999) and eps 1e-8 in both frameworks."""

    name: Literal["adam"] = "adam"
    learning_rate: Annotated[float, Field(gt=0.0, le=1e4, allow_inf_nan=False)] = 1e-3


# Examples in the training split of each dataset, before train_limit. digits is split 80/20.
TRAIN_SIZES = {"mnist": 60000, "fashion-mnist": 60000, "digits": 1437, "synthetic": 10000}
TEST_SIZES = {"mnist": 10000, "fashion-mnist": 10000, "digits": 360, "synthetic": 2000}


# Input features and classes of each dataset (images are flattened: 28x28 -> 784, 8x8 -> 64).
INPUT_FEATURES = {"mnist": 784, "fashion-mnist": 784, "digits": 64, "synthetic": 784}
NUM_CLASSES = 10


class TrainingSpec(_Strict):
    """What to train, whichever framework trains it: the fields shared by jobs and comparisons."""

    hardware: Hardware = Field("cpu", description="Where it runs: cpu, gpu or tpu.")
    model: ModelSpec = Field(default_factory=ModelSpec)
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    epochs: Annotated[int, Field(ge=1, le=MAX_EPOCHS)] = 10
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)] = 128
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    max_runtime_s: Annotated[float, Field(gt=0, le=MAX_RUNTIME_S, allow_inf_nan=False)] | None = None
    name: Annotated[str, Field(max_length=200)] | None = None
    labels: Annotated[dict[Annotated[str, Field(max_length=MAX_LABEL_KEY_CHARS)],
                           Annotated[str, Field(max_length=MAX_LABEL_VALUE_CHARS)]],
                      Field(max_length=MAX_LABELS)] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _model_fits(self) -> "TrainingSpec":
        if (count := parameter_count(self)) > MAX_PARAMETERS:
            raise ValueError(
                f"model.hidden_sizes gives {count:,} parameters, more than the limit of {MAX_PARAMETERS:,}; "
                "use fewer or smaller hidden layers"
            )
        return self

    @model_validator(mode="after")
    def _batch_fits_training_set(self) -> "TrainingSpec":
        n = train_size(self.dataset)
        if self.batch_size > n:
            raise ValueError(
                f"batch_size {self.batch_size} is larger than the training set ({n} examples of "
                f"{self.dataset.name}); use a batch_size of at most {n}"
            )
        return self


class JobSpec(TrainingSpec):
    """A training job. Every field but `framework` has a default."""

    framework: Framework = Field(description="Which framework trains the model: jax or pytorch.")
    compile: bool = Field(
        False,
        description=(
            "PyTorch: compile the train step with torch.compile (TorchInductor) before the first "
            "epoch, on one batch; the time it takes is reported as timings.compile_s, apart from "
            "the epochs, and a worker reuses the compiled step for later jobs of the same model "
            "and batch size. Not on tpu (torch_xla compiles every step already). JAX jobs are "
            "always compiled (jax.jit, XLA), so it changes nothing for them."
        ),
    )

    @model_validator(mode="after")
    def _compile_where_supported(self) -> "JobSpec":
        if self.compile and self.framework == "pytorch" and self.hardware == "tpu":
            raise ValueError(
                "compile is not available for PyTorch on tpu: torch_xla compiles every step "
                "already; leave compile false"
            )
        return self


class ComparisonSpec(TrainingSpec):
    """The same training run in JAX and in PyTorch: a JobSpec without `framework`."""

    @model_validator(mode="before")
    @classmethod
    def _no_framework(cls, value: object) -> object:
        if isinstance(value, dict) and "framework" in value:
            raise ValueError("a comparison trains both frameworks: remove 'framework' from the spec")
        return value

    def for_framework(self, framework: str) -> JobSpec:
        return JobSpec(framework=framework, **self.model_dump())


def parameter_count(spec: TrainingSpec) -> int:
    """Weights and biases of the MLP that `spec` trains."""
    sizes = [INPUT_FEATURES[spec.dataset.name], *spec.model.hidden_sizes, NUM_CLASSES]
    return sum(n_in * n_out + n_out for n_in, n_out in zip(sizes, sizes[1:]))


def train_size(dataset: DatasetSpec) -> int:
    """Examples in the training split after `train_limit`."""
    n = TRAIN_SIZES[dataset.name]
    if dataset.name == "synthetic":
        return dataset.train_limit or n
    return min(n, dataset.train_limit) if dataset.train_limit else n


def test_size(dataset: DatasetSpec) -> int:
    """Examples in the test split after `test_limit`."""
    n = TEST_SIZES[dataset.name]
    if dataset.name == "synthetic":
        return dataset.test_limit or n
    return min(n, dataset.test_limit) if dataset.test_limit else n
