"""The job spec: what a user asks trainhub to train.

These are plain pydantic models with no framework imports, so the API, the workers and the
trainers share one definition. `app/schemas.py` re-exports `JobSpec` as the HTTP request body.

Defaults follow the seeds' MNIST MLP: 784-256-128-10, ReLU, Adam with learning rate 1e-3,
batch size 128, 10 epochs, seed 0.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from trainers.layers import DropoutLayer, Layer, LayerError, Plan, all_layers, plan, walk
from trainers.presets import layers_of

Framework = Literal["jax", "pytorch"]
Hardware = Literal["cpu", "gpu", "tpu"]
DatasetName = Literal["mnist", "fashion-mnist", "digits", "synthetic"]
# The one list of each, used by the API, the workers, the CLI and the dashboard.
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
HARDWARE: tuple[str, ...] = get_args(Hardware)
Priority = Literal["low", "normal", "high"]
PRIORITIES: tuple[str, ...] = get_args(Priority)  # lowest first: a job's level is its index

MAX_EPOCHS = 1000
MAX_BATCH_SIZE = 65536
MAX_HIDDEN_UNITS = 16384
MAX_HIDDEN_LAYERS = 16
MAX_EXAMPLES = 1_000_000  # per split: 1M x 784 float32 is 3 GB of host memory
MAX_PARAMETERS = 50_000_000  # 200 MB of fp32 weights, three times that with Adam's moments
MAX_RUNTIME_S = 7 * 24 * 3600  # the broker's visibility timeout (app/config.py) must exceed it
MAX_LABELS = 32
MAX_LABEL_KEY_CHARS = 64
MAX_LABEL_VALUE_CHARS = 256
MAX_RETENTION_DAYS = 36500  # 100 years: a bound that keeps date arithmetic far from overflow


class _Strict(BaseModel):
    # Unknown fields are a typo more often than not: refuse them rather than ignore them. Strict
    # types: "2", 2.5 or true for an int, or "0.01" for a float, are errors, not guesses.
    model_config = ConfigDict(extra="forbid", strict=True)


def _new(default: Any, **kwargs: Any) -> Any:
    """A field added after the first release: left out of the normalised spec while it holds its
    default, so specs that do not use it serialise (and hash, and replay) exactly as before."""
    return Field(default, exclude_if=lambda value: value == default, **kwargs)


MAX_CONV_LAYERS = 4
MAX_WEBHOOK_URL_CHARS = 2048
MAX_LAYERS = 64
MAX_CHANNELS = 1024
CONV_KERNEL = 3  # 3x3 convolutions, "same" padding, each followed by a 2x2 max pool


CODE_ID_PATTERN = r"^code_[0-9a-f]{32}$"
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
MAX_KWARGS_BYTES = 4096  # of the kwargs as JSON
MAX_KWARGS_DEPTH = 4


def _json_depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_json_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_json_depth, value), default=0)
    return 0


class ModelSpec(_Strict):
    """A preset by `name`, your own `layers`, or your own code (`code`, `entrypoint`, `kwargs`: see
    POST /code) built by `entrypoint(input_shape, num_classes, **kwargs)` and trained by our loop.

    A preset or your own `layers` (trainers/layers.py: dense, conv2d, pools,
    flatten, dropout, batch_norm, layer_norm, activations, residual), built the same by both
    trainers. The presets are layer lists too (GET /models/presets shows them expanded):

    `mlp`: flattened input -> hidden_sizes (ReLU) -> num_classes logits.

    `cnn`: the input as an image (784 -> 28x28x1, digits' 64 -> 8x8x1, an uploaded dataset's
    [H, W, C]), then per entry of `channels` a 3x3 convolution ("same" padding), ReLU and a 2x2
    max pool (each pool halves the side, rounding down), flattened in PyTorch's (channel, row,
    column) order, then the MLP head hidden_sizes -> num_classes. Defaults: two conv layers of 32
    and 64.

    `batch_norm` puts a batch norm (PyTorch's semantics: momentum 0.1, eps 1e-5, unbiased running
    variance) after every hidden dense and conv layer, before the ReLU; `dropout` follows the
    ReLU of every hidden dense layer. These knobs are for `mlp` and `cnn` only.

    `lenet5` (for 28x28 images) and `resnet8` (a small residual network for 28x28 and 32x32
    images) have no knobs.
    """

    name: Literal["mlp", "cnn", "lenet5", "resnet8"] | None = "mlp"
    hidden_sizes: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_HIDDEN_UNITS)]],
        Field(max_length=MAX_HIDDEN_LAYERS),
    ] = [256, 128]
    dropout: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = 0.0
    channels: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_CHANNELS)]], Field(min_length=1, max_length=MAX_CONV_LAYERS)
    ] = _new([32, 64], description="cnn only: output channels of each 3x3 conv layer.")
    batch_norm: bool = _new(False, description="Batch norm after each hidden layer, before its ReLU.")
    layers: Annotated[list[Layer], Field(min_length=1, max_length=MAX_LAYERS)] | None = _new(
        None, description="Your own model, layer by layer (leave name out); the last layer gives the outputs."
    )
    code: Annotated[str, Field(pattern=CODE_ID_PATTERN)] | None = _new(
        None, description="Uploaded model code (GET /code); with entrypoint, and leave name out."
    )
    entrypoint: Annotated[str, Field(pattern=ENTRYPOINT_PATTERN, max_length=200)] | None = _new(
        None, description="module:function of the code that returns the model (a torch.nn.Module, a flax module)."
    )
    entrypoints: (
        dict[Literal["jax", "pytorch"], Annotated[str, Field(pattern=ENTRYPOINT_PATTERN, max_length=200)]] | None
    ) = _new(
        None,
        description='Comparisons: the module:function of each framework ({"jax": ..., "pytorch": ...}), in one upload.',
    )
    kwargs: dict[Annotated[str, Field(max_length=100)], Any] | None = _new(
        None, description="JSON keyword arguments for the entrypoint (at most 4 KiB, nested at most 4 deep)."
    )
    init: Literal["module", "shared"] | None = _new(
        None,
        description=(
            "User code: 'module' keeps the module's own initialisation (a job's default); 'shared' sets "
            "every parameter from the seed by its PyTorch-style name and shape, so a JAX and a PyTorch "
            "module that name their parameters alike start from the same weights (a comparison's default)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _layers_or_name(cls, value: object) -> object:
        if isinstance(value, dict) and value.get("code") is not None:
            if value.get("name") is not None or value.get("layers") is not None:
                raise ValueError("give a preset's name, your own layers or your own code, not two of them")
            value = {**value, "name": None}
        if isinstance(value, dict) and value.get("layers") is not None:
            if value.get("name") is not None:
                raise ValueError("give a preset's name or your own layers, not both")
            value = {**value, "name": None}
        return value

    @model_validator(mode="after")
    def _knobs_fit_the_model(self) -> ModelSpec:
        if self.code is not None or self.entrypoint is not None or self.entrypoints is not None:
            self._check_user_code()
        elif self.kwargs is not None or self.init is not None:
            raise ValueError("kwargs and init are for your own code: give code and entrypoint too")
        if self.name is None and self.layers is None and self.code is None:
            raise ValueError("give a preset's name (mlp, cnn, lenet5, resnet8) or your own layers")
        knobs = [k for k in ("hidden_sizes", "dropout", "batch_norm", "channels") if k in self.model_fields_set]
        if self.name == "mlp" and "channels" in knobs:
            raise ValueError("channels is for model cnn only; remove it or set model.name to cnn")
        if self.name not in ("mlp", "cnn") and knobs:
            owner = "your layers" if self.layers is not None else f"preset {self.name}"
            verb = "is" if len(knobs) == 1 else "are"
            raise ValueError(f"{', '.join(knobs)} {verb} for presets mlp and cnn, not {owner}; remove them")
        return self

    def _check_user_code(self) -> None:
        if self.code is None or (self.entrypoint is None) == (self.entrypoints is None):
            raise ValueError(
                "user code needs code (an id from GET /code) and entrypoint (module:function; a comparison: "
                "entrypoints {jax, pytorch}), not both entrypoint and entrypoints"
            )
        knobs = [k for k in ("hidden_sizes", "dropout", "batch_norm", "channels") if k in self.model_fields_set]
        if knobs:
            raise ValueError(f"{', '.join(knobs)} are for presets mlp and cnn; pass them to your code in kwargs")
        try:
            size = len(json.dumps(self.kwargs or {}, allow_nan=False))
        except (TypeError, ValueError):
            raise ValueError("kwargs must be JSON values (no NaN or infinity)") from None
        if size > MAX_KWARGS_BYTES:
            raise ValueError(f"kwargs is {size:,} bytes of JSON, over the limit of {MAX_KWARGS_BYTES:,}")
        if _json_depth(self.kwargs or {}) > MAX_KWARGS_DEPTH:
            raise ValueError(f"kwargs is nested deeper than {MAX_KWARGS_DEPTH} levels")

    @property
    def user_code(self) -> bool:
        """Whether the model is the user's own code (no layer list: its shapes are known only once built)."""
        return self.code is not None

    @property
    def knobbed(self) -> bool:
        """Whether the model is a preset with knobs (mlp, cnn): messages name the knob, not a layer."""
        return self.layers is None and self.name in ("mlp", "cnn")

    @model_serializer(mode="wrap")
    def _only_what_applies(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A layer list is the whole model: the presets' knobs (and their defaults) would only mislead.
        data = handler(self)
        if self.layers is not None or self.code is not None or self.name in ("lenet5", "resnet8"):
            for knob in ("hidden_sizes", "dropout", "channels", "batch_norm"):
                data.pop(knob, None)
            if self.layers is not None or self.code is not None:
                data.pop("name", None)
        return data


Task = Literal["classification", "regression"]
SHA256_PATTERN = r"^[0-9a-f]{64}$"
DATASET_ID_PATTERN = r"^ds_[0-9a-f]{32}$"


class DatasetInfo(_Strict):
    """What an uploaded dataset is, as the server recorded it at upload: filled in by the API
    when a job names the dataset (a request may not set it), so the spec a worker runs and the
    `spec.json` a job writes say exactly what it trained on.

    input_shape: [D] (a table) or [H, W, C] (images); num_classes: 0 for regression;
    train_size/test_size: examples of each split as uploaded (test_size 0: no test split)."""

    sha256: Annotated[str, Field(pattern=SHA256_PATTERN)]
    task: Task
    input_shape: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1, max_length=3)]
    num_classes: Annotated[int, Field(ge=0)]
    train_size: Annotated[int, Field(ge=1)]
    test_size: Annotated[int, Field(ge=0)]


class DatasetSpec(_Strict):
    """Which data to train on: a built-in dataset by `name`, or an uploaded one by `id` (see
    POST /datasets), optionally limited to the first N examples of each split.

    `synthetic` draws `train_limit` (default 10000) and `test_limit` (default 2000) examples of
    784 features labelled by a fixed random linear teacher, for load and speed tests.

    `validation_split` holds out that fraction of the training split (a fixed shuffle, the same
    for every job) as the test split; a dataset uploaded without a test split needs it.
    `standardize` scales each feature by the training examples' mean and standard deviation
    (written to the job's preprocessing.json); on by default for uploaded datasets.
    """

    name: DatasetName | None = "fashion-mnist"
    id: Annotated[str, Field(pattern=DATASET_ID_PATTERN)] | None = _new(
        None, description="An uploaded dataset (GET /datasets); leave name out."
    )
    train_limit: Annotated[int, Field(ge=1, le=MAX_EXAMPLES)] | None = None
    test_limit: Annotated[int, Field(ge=1, le=MAX_EXAMPLES)] | None = None
    validation_split: Annotated[float, Field(gt=0.0, le=0.5, allow_inf_nan=False)] | None = _new(None)
    standardize: bool | None = _new(None, description="Default: on for uploaded datasets, off for built-in ones.")
    info: DatasetInfo | None = _new(None, description="Set by the server from the uploaded dataset's record.")

    @model_validator(mode="before")
    @classmethod
    def _id_or_name(cls, value: object) -> object:
        given = value if isinstance(value, dict) else {}
        name = given.get("name")
        if isinstance(name, str) and re.fullmatch(DATASET_ID_PATTERN, name) and given.get("id") is None:
            raise ValueError(f"{name} is an uploaded dataset's id: give it as dataset.id, not dataset.name")
        if isinstance(value, dict) and value.get("id") is not None:
            if value.get("name") is not None:
                raise ValueError("name a built-in dataset or give an uploaded dataset's id, not both")
            value = {**value, "name": None}
        return value

    @model_validator(mode="after")
    def _has_test_split(self) -> DatasetSpec:
        if self.name is None and self.id is None:
            raise ValueError("give a built-in dataset's name or an uploaded dataset's id")
        if self.info is not None and self.info.test_size == 0 and self.validation_split is None:
            raise ValueError(
                f"dataset {self.id} has no test split: set dataset.validation_split (e.g. 0.2) to hold out "
                "part of the training split"
            )
        return self

    @property
    def label(self) -> str:
        """How messages name the dataset: its built-in name or its id."""
        return self.name or self.id or ""

    @property
    def uses_standardize(self) -> bool:
        return self.standardize if self.standardize is not None else self.id is not None


class OptimizerSpec(_Strict):
    """The update rule, the same in both frameworks (optax for JAX, torch.optim for PyTorch).

    - `adam` (Kingma & Ba, 2015): betas (0.9, 0.999), eps 1e-8; `weight_decay` is L2 added to
      the gradient (torch.optim.Adam's weight_decay; optax.add_decayed_weights before adam).
    - `adamw` (Loshchilov & Hutter, 2019): the same Adam with decoupled weight decay,
      p -= lr * weight_decay * p (torch.optim.AdamW; optax.adamw).
    - `sgd`: with `momentum` (buf = momentum * buf + g, no dampening) and optionally `nesterov`;
      `weight_decay` as L2 on the gradient (torch.optim.SGD; optax.sgd).

    `clip_norm` scales the whole (mini-batch) gradient down to that global L2 norm before the
    update, weight decay included after it (torch.nn.utils.clip_grad_norm_;
    optax.clip_by_global_norm).

    `schedule` sets the learning rate per optimizer step, in both frameworks (optax counts
    steps; the PyTorch scheduler is stepped after every optimizer step), with T = epochs *
    steps per epoch and W = warmup_epochs * steps per epoch: `constant`; `cosine`
    lr * (1 + cos(pi * t / T)) / 2; `warmup_cosine` linear from 0 to lr over the first W steps,
    then cosine from lr to 0 over the remaining T - W. Each epoch's metrics report the rate of
    its first step as `learning_rate`.
    """

    name: Literal["adam", "adamw", "sgd"] = "adam"
    learning_rate: Annotated[float, Field(gt=0.0, le=1e4, allow_inf_nan=False)] = 1e-3
    momentum: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = _new(0.0, description="sgd only.")
    nesterov: bool = _new(False, description="sgd only; needs momentum > 0.")
    weight_decay: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = _new(0.0)
    clip_norm: Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)] | None = _new(None)
    schedule: Literal["constant", "cosine", "warmup_cosine"] = _new("constant")
    warmup_epochs: Annotated[int, Field(ge=0, le=MAX_EPOCHS)] = _new(0, description="warmup_cosine only.")

    @model_validator(mode="after")
    def _options_fit_the_optimizer(self) -> OptimizerSpec:
        if self.name != "sgd" and (self.momentum or self.nesterov):
            raise ValueError(f"momentum and nesterov are for optimizer sgd, not {self.name}")
        if self.nesterov and not self.momentum:
            raise ValueError("nesterov needs a momentum above 0")
        if self.warmup_epochs and self.schedule != "warmup_cosine":
            raise ValueError("warmup_epochs is for schedule warmup_cosine only")
        return self


class PrivacySpec(_Strict):
    """DP-SGD style training (Abadi et al., 2016): each example's gradient is clipped to L2 norm
    `clip_norm`, the clipped gradients are summed, Gaussian noise of standard deviation
    `noise_multiplier * clip_norm` is added to every coordinate, and the sum is divided by the
    batch size; the optimizer then takes that gradient. Per-example gradients come from
    jax.vmap(jax.grad) and torch.func.vmap(torch.func.grad). No privacy accounting is done.
    """

    clip_norm: Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)] = 1.0
    noise_multiplier: Annotated[float, Field(ge=0.0, le=1e3, allow_inf_nan=False)] = 1.0


MAX_DEVICES = 64


@dataclass(frozen=True)
class DataShape:
    """What a model needs to know of its data: the task, one example's shape ([D] or [H, W, C]),
    the classes (0 for regression) and the examples of each split after the dataset spec's
    validation_split and limits."""

    task: str
    input_shape: tuple[int, ...]
    num_classes: int
    train_size: int
    test_size: int

    @property
    def features(self) -> int:
        return math.prod(self.input_shape)

    @property
    def outputs(self) -> int:
        """The model's output units: a logit per class, or the one predicted value."""
        return self.num_classes if self.task == "classification" else 1


# The built-in datasets: images as the cnn sees them (synthetic's 784 features too), 10 classes,
# the examples of each split before the limits (digits is split 80/20).
BUILT_IN: dict[str, DataShape] = {
    "mnist": DataShape("classification", (28, 28, 1), 10, 60000, 10000),
    "fashion-mnist": DataShape("classification", (28, 28, 1), 10, 60000, 10000),
    "digits": DataShape("classification", (8, 8, 1), 10, 1437, 360),
    "synthetic": DataShape("classification", (28, 28, 1), 10, 10000, 2000),
}


def held_out(train_examples: int, validation_split: float) -> int:
    """Examples of a training split of `train_examples` held out by `validation_split`: at least 1,
    and at least 1 left to train on."""
    return min(max(1, int(train_examples * validation_split)), train_examples - 1)


def data_shape(dataset: DatasetSpec) -> DataShape | None:
    """The DataShape of `dataset`; None for an uploaded dataset whose info the server has not yet
    filled in (the API validates the spec again once it has)."""
    if dataset.name is not None:
        shape = BUILT_IN[dataset.name]
        if dataset.name == "synthetic":  # generated at exactly the requested size
            shape = replace(shape, train_size=dataset.train_limit or shape.train_size)
            shape = replace(shape, test_size=dataset.test_limit or shape.test_size)
    elif dataset.info is not None:
        info = dataset.info
        shape = DataShape(info.task, tuple(info.input_shape), info.num_classes, info.train_size, info.test_size)
    else:
        return None
    if dataset.validation_split is not None:
        held = held_out(shape.train_size, dataset.validation_split)
        shape = replace(shape, train_size=shape.train_size - held, test_size=held)
    return replace(
        shape,
        train_size=min(shape.train_size, dataset.train_limit or shape.train_size),
        test_size=min(shape.test_size, dataset.test_limit or shape.test_size),
    )


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
    labels: Annotated[
        dict[
            Annotated[str, Field(max_length=MAX_LABEL_KEY_CHARS)],
            Annotated[str, Field(max_length=MAX_LABEL_VALUE_CHARS)],
        ],
        Field(max_length=MAX_LABELS),
    ] = Field(default_factory=dict)
    privacy: PrivacySpec | None = _new(None, description="Per-example gradient clipping and noise (DP-SGD).")
    priority: Priority = _new(
        "normal",
        description="Its place in its queue: every high job before every normal one, normal before low (the "
        "keys' fair share applies within a level). A waiting high job may preempt a running low one.",
    )
    precision: Literal["fp32", "bf16"] = _new(
        "fp32", description="bf16: params and optimizer in fp32, the forward and backward in bfloat16 (gpu, tpu)."
    )
    devices: Annotated[int, Field(ge=1, le=MAX_DEVICES)] = _new(
        1,
        description="Data parallel over this many devices of the hardware (JAX: a sharded mesh; PyTorch: DDP, "
        "one process per device); batch_size is the global batch. The job waits in queue "
        "<hardware>.<framework>.x<N> until a worker owning N devices is online.",
    )
    retention_days: Annotated[int, Field(ge=1, le=MAX_RETENTION_DAYS)] | None = _new(
        None,
        description="Days the finished job (its metrics and artifacts) is kept before it is deleted: at most the "
        "server's TRAINHUB_RETENTION_DAYS. Unset: the server's retention (forever when it has none).",
    )
    webhook_url: Annotated[str, Field(min_length=1, max_length=MAX_WEBHOOK_URL_CHARS)] | None = _new(
        None,
        description="An http(s) URL the service POSTs the job to, signed, at each of its status changes (the "
        "key's default webhook when unset). Needs the key's signing secret (POST /webhooks/secret). URLs that "
        "reach loopback, link-local or private addresses are refused unless the server allows them.",
    )

    @model_validator(mode="after")
    def _model_fits(self) -> TrainingSpec:
        shape = data_shape(self.dataset)
        if shape is None or self.model.user_code:
            return self  # user code: its parameters are known once it is built (in the worker)
        name = self.model.name
        if name in ("cnn", "lenet5", "resnet8") and len(shape.input_shape) != 3:
            raise ValueError(
                f"model {name} needs images ([H, W, C]) but dataset {self.dataset.label} has "
                f"{shape.features} features per example; use model mlp"
            )
        try:
            count = model_plan(self).parameters
        except LayerError as exc:
            if name == "cnn":
                height, width, _ = shape.input_shape
                raise ValueError(
                    f"model.channels has {len(self.model.channels)} conv layers, each halving the "
                    f"{height}x{width} images of {self.dataset.label} to nothing; use fewer conv layers"
                ) from None
            if self.model.layers is None:
                raise ValueError(
                    f"model {name} does not fit the {list(shape.input_shape)} examples of {self.dataset.label} "
                    f"(its list, as GET /models/presets shows it: {exc}); use another model"
                ) from None
            raise ValueError(str(exc)) from None
        if count > MAX_PARAMETERS:
            field = "model.hidden_sizes" if name in ("mlp", "cnn") else "model.layers"
            raise ValueError(
                f"{field} gives {count:,} parameters, more than the limit of {MAX_PARAMETERS:,}; "
                "use fewer or smaller layers"
            )
        return self

    @model_validator(mode="after")
    def _options_fit_together(self) -> TrainingSpec:
        if self.optimizer.warmup_epochs >= self.epochs:
            raise ValueError(
                f"optimizer.warmup_epochs ({self.optimizer.warmup_epochs}) must be fewer than "
                f"the {self.epochs} epochs, leaving some for the cosine decay"
            )
        if self.privacy is not None and uses_batch_norm(self.model):
            fix = (
                "turn model.batch_norm off"
                if self.model.knobbed
                else "use a layer list without batch_norm layers (layer_norm normalises each example alone)"
            )
            raise ValueError(
                f"privacy needs per-example gradients, which batch_norm (mixing the examples of a batch) does not "
                f"have; {fix}"
            )
        if self.precision == "bf16" and self.hardware == "cpu":
            raise ValueError('precision "bf16" needs hardware gpu or tpu; on cpu use precision "fp32"')
        if self.batch_size % self.devices:
            raise ValueError(
                f"batch_size {self.batch_size} must be a multiple of devices ({self.devices}): "
                "each device takes an equal share of the global batch"
            )
        _check_batch_norm(self)
        return self

    @model_validator(mode="after")
    def _batch_fits_training_set(self) -> TrainingSpec:
        shape = data_shape(self.dataset)
        if shape is not None and self.batch_size > shape.train_size:
            raise ValueError(
                f"batch_size {self.batch_size} is larger than the training set ({shape.train_size} examples of "
                f"{self.dataset.label}); use a batch_size of at most {shape.train_size}"
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
    def _compile_where_supported(self) -> JobSpec:
        if self.compile and self.framework == "pytorch" and self.hardware == "tpu":
            raise ValueError(
                "compile is not available for PyTorch on tpu: torch_xla compiles every step "
                "already; leave compile false"
            )
        if self.framework == "pytorch":
            _check_ddp(self)
        if self.model.user_code and self.devices > 1 and self.framework == "pytorch":
            # DDP's processes talk over TCP, which the user-code sandbox takes away.
            raise ValueError(
                "devices above 1 for user code is available for jax only (PyTorch's DDP needs the network "
                "the sandbox takes away); use devices 1 or framework jax"
            )
        if self.model.entrypoints is not None:
            raise ValueError("model.entrypoints is for comparisons: a job names its one function as model.entrypoint")
        if self.devices > 1 and self.compile and self.framework == "pytorch":
            raise ValueError(
                "compile with devices above 1 is not available for pytorch (DDP runs eager); "
                "leave compile false or use devices 1"
            )
        return self


def _check_batch_norm(spec: TrainingSpec) -> None:
    """Raise ValueError when a batch norm layer would see a single value per channel in a
    training step: its batch variance is then 0/0 (PyTorch refuses it; JAX's unbiased running
    variance divides by zero). A layer sees (batch per device) x (its feature map's area)
    values per channel: the area is 1 after a dense layer, H x W on an image."""
    if not uses_batch_norm(spec.model) or data_shape(spec.dataset) is None:
        return
    per_device = spec.batch_size // spec.devices
    areas = [
        op.out_shape[0] * op.out_shape[1] if op.out_state == "image" else 1
        for op in walk(model_plan(spec).ops)
        if op.kind == "batch_norm"
    ]
    if per_device * min(areas) >= 2:
        return
    each = f" on each of the {spec.devices} devices" if spec.devices > 1 else ""
    least = f"use a batch_size of at least {2 * spec.devices}"
    if spec.model.knobbed:
        where = "a hidden dense layer" if min(areas) == 1 else "the last conv layer (1x1 feature maps)"
        raise ValueError(
            f"model.batch_norm needs at least 2 values per channel in a training step, but batch_size "
            f"{spec.batch_size} gives {where} only {per_device * min(areas)}{each}; {least}, or turn "
            "model.batch_norm off"
        )
    norms = [op for op in walk(model_plan(spec).ops) if op.kind == "batch_norm"]
    worst = min(norms, key=lambda op: op.out_shape[0] * op.out_shape[1] if op.out_state == "image" else 1)
    raise ValueError(
        f"the batch_norm at model.layers[{worst.where.replace('.', '].layers[')}] needs at least 2 values per "
        f"channel in a training step, but batch_size {spec.batch_size} gives it only {per_device * min(areas)}{each} "
        f"(its input is {list(worst.in_shape)}); {least}, or remove the layer"
    )


def _check_ddp(spec: TrainingSpec) -> None:
    """Raise ValueError for the data parallel PyTorch runs trainhub cannot do the same way as JAX."""
    if spec.devices == 1:
        return
    if spec.hardware == "tpu":
        raise ValueError(
            "devices above 1 for pytorch on tpu is not available (no torch_xla DDP here); "
            "use framework jax on tpu, or devices 1"
        )
    if uses_batch_norm(spec.model) and spec.hardware == "cpu":
        raise ValueError(
            "model.batch_norm with devices above 1 needs SyncBatchNorm, which PyTorch has on gpu "
            "only: on cpu use devices 1, or turn batch_norm off"
        )


class ComparisonSpec(TrainingSpec):
    """The same training run in JAX and in PyTorch: a JobSpec without `framework`."""

    @model_validator(mode="before")
    @classmethod
    def _no_framework(cls, value: object) -> object:
        if isinstance(value, dict) and "framework" in value:
            raise ValueError("a comparison trains both frameworks: remove 'framework' from the spec")
        return value

    @model_validator(mode="after")
    def _pytorch_can_run_it(self) -> ComparisonSpec:
        if self.model.user_code and set(self.model.entrypoints or {}) != set(FRAMEWORKS):
            raise ValueError(
                "a comparison of your code needs a function for each framework: model.entrypoints "
                '{"jax": "module:function", "pytorch": "module:function"} (in the same upload)'
            )
        _check_ddp(self)
        return self

    def for_framework(self, framework: str) -> JobSpec:
        """The comparison's job in `framework`; user code: that framework's entrypoint, with the
        comparison's init ("shared" unless it says "module")."""
        data = self.model_dump()
        if self.model.entrypoints is not None:
            model = {k: v for k, v in data["model"].items() if k != "entrypoints"}
            model |= {"entrypoint": self.model.entrypoints[framework], "init": self.model.init or "shared"}  # type: ignore[index]
            data["model"] = model
        # Callers pass a str from FRAMEWORKS; pydantic checks it is a Framework when it validates.
        return JobSpec(framework=framework, **data)  # type: ignore[arg-type]


def _shape(spec: TrainingSpec) -> DataShape:
    shape = data_shape(spec.dataset)
    if shape is None:
        raise ValueError(f"dataset {spec.dataset.label} has no info yet: the server fills it in")
    return shape


def model_plan(spec: TrainingSpec) -> Plan:
    """The model's layer list (a preset's, expanded) walked for the dataset's examples: shapes,
    parameters and FLOPs (trainers.layers.plan). Raises LayerError when a layer cannot take its input."""
    shape = _shape(spec)
    return _plan(_ModelKey(spec.model), shape.input_shape, shape.outputs)


class _ModelKey:
    """A model spec hashed by its repr, which shows every field (its lists have no hash; its JSON
    leaves out the knobs that do not apply), for the plan cache."""

    __slots__ = ("model", "text")

    def __init__(self, model: ModelSpec) -> None:
        self.model = model
        self.text = repr(model)

    def __hash__(self) -> int:
        return hash(self.text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ModelKey) and other.text == self.text


# A request validates its spec several times (the body, then with the server's limits and the
# dataset's info) and renders it once: the walk is the costly part, the same each time. Plans are
# frozen, so callers share them.
@functools.lru_cache(maxsize=1024)
def _plan(model: _ModelKey, input_shape: tuple[int, ...], outputs: int) -> Plan:
    return plan(layers_of(model.model, outputs), input_shape, outputs)


def model_dropout(model: ModelSpec) -> float:
    """The largest dropout rate of the model's layers (0: none): each framework draws its own
    masks, so with dropout two runs are compared by their predictions only."""
    return max((op.rate for op in all_layers(layers_of(model, 1)) if isinstance(op, DropoutLayer)), default=0.0)


def uses_batch_norm(model: ModelSpec) -> bool:
    """Whether any layer of the model is a batch norm (mixing the examples of a batch); False for
    user code (its source says nothing the spec can check)."""
    if model.user_code:
        return False
    return any(op.type == "batch_norm" for op in all_layers(layers_of(model, 1)))


def parameter_count(spec: TrainingSpec) -> int:
    """Trainable weights and biases of the model `spec` trains (batch norm: scale and shift)."""
    return model_plan(spec).parameters


def flops_per_example(spec: TrainingSpec) -> int:
    """The model's forward FLOPs for one example (2 x multiply-adds of dense and conv layers, one
    per value for the others); a training step costs about three times as much."""
    return model_plan(spec).flops


def train_size(dataset: DatasetSpec) -> int:
    """Examples in the training split after `validation_split` and `train_limit`."""
    shape = data_shape(dataset)
    return shape.train_size if shape else 0


def test_size(dataset: DatasetSpec) -> int:
    """Examples in the test split after `validation_split` and `test_limit`."""
    shape = data_shape(dataset)
    return shape.test_size if shape else 0


# Bytes per float32 value; what training holds besides the data (see memory_estimate).
FLOAT_BYTES = 4
# params, their gradients and two optimizer moments (Adam's; SGD with momentum holds one).
STATE_COPIES = 4
# Activations of one batch are kept for the backward pass, with their gradients and the
# framework's temporaries: about three times their size.
ACTIVATION_COPIES = 3
# The data is held twice: the host arrays and their copy on the device (CPU or accelerator).
DATA_COPIES = 2


def activation_count(spec: TrainingSpec) -> int:
    """Values the forward pass computes (and keeps for the backward pass) for one example: every
    layer's output, those inside residuals and each residual's sum included."""
    return sum(math.prod(op.out_shape) for op in walk(model_plan(spec).ops))


def memory_estimate(spec: TrainingSpec) -> dict[str, int]:
    """Bytes a run of `spec` holds at once, by part (each device of a data parallel run holds
    the state and its share of the batch; the estimate is for the whole run on one device):

    - data: the train and test splits, float32 features (DATA_COPIES: host and device);
    - state: params, gradients and optimizer moments (STATE_COPIES x parameter_count);
    - activations: one batch's forward values, kept for the backward pass (ACTIVATION_COPIES);
    - total: their sum. An estimate from the spec alone, to refuse a job that cannot fit before
      it is queued; the frameworks' own overheads (compiled programs, caches) come on top."""
    shape = _shape(spec)
    features, examples = shape.features, shape.train_size + shape.test_size
    parts = {
        "data": DATA_COPIES * examples * (features + 1) * FLOAT_BYTES,
        "state": STATE_COPIES * parameter_count(spec) * FLOAT_BYTES,
        "activations": ACTIVATION_COPIES * spec.batch_size * activation_count(spec) * FLOAT_BYTES,
    }
    return {**parts, "total": sum(parts.values())}
