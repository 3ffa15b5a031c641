"""Models as layer lists: described once, as data, and built the same by numpy, JAX and PyTorch.

`model: {"layers": [...]}` is a sequence of layers, each an object with a `type` and its
arguments (the classes below). `plan` walks a list once, for an input shape, and gives what
every builder needs: each layer's input and output shape, its parameters' names and shapes
(PyTorch's names, as in weights.safetensors), its FLOPs; a layer that cannot take its input is
a LayerError naming the layer's index, its input shape and why.

Tensors. A model's input is flat: x float32 [B, D] (a table's features, or an image's values in
(row, column, channel) order). A spatial layer (conv2d, a pool) reads the input as the dataset's
image [H, W, C]; after one, the tensor is an image until `flatten` (which flattens it in
PyTorch's (channel, row, column) order) or `global_avg_pool` (the mean of each channel). A dense
layer takes a flat tensor (or the input itself: `flatten` of the input changes nothing); after a
spatial layer it needs a flatten first. Norms, activations and dropout keep the shape.

Parameter names, by kind and count (counted within each residual anew, under its prefix):
dense `layers.i`, conv2d `convs.i`, batch_norm on a flat tensor `norms.i` and on an image
`conv_norms.i`, layer_norm `layer_norms.i`, residual `residuals.i.` (its projection
`residuals.i.projection`). These are the names the `mlp` and `cnn` presets always had.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_UNITS = 16384
MAX_FILTERS = 1024
MAX_KERNEL = 11
MAX_LAYERS = 64
MAX_DEPTH = 4  # residuals within residuals

Activation = Literal["relu", "gelu", "tanh", "sigmoid", "silu"]
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "tanh", "sigmoid", "silu")


class _Layer(BaseModel):
    # Unknown fields are refused (a typo more often than not), types are strict, as in JobSpec.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    type: str


class DenseLayer(_Layer):
    """A fully connected layer: weight [units, in] (PyTorch's [out, in]), bias [units]."""

    type: Literal["dense"]
    units: Annotated[int, Field(ge=1, le=MAX_UNITS)]
    use_bias: bool = True


class ConvLayer(_Layer):
    """A 2-D convolution: weight [filters, in, k, k] (OIHW), bias [filters]. `same` padding keeps
    the image's size (strides 1 only, as PyTorch allows); `valid` has none."""

    type: Literal["conv2d"]
    filters: Annotated[int, Field(ge=1, le=MAX_FILTERS)]
    kernel_size: Annotated[int, Field(ge=1, le=MAX_KERNEL)] = 3
    strides: Annotated[int, Field(ge=1, le=MAX_KERNEL)] = 1
    padding: Literal["same", "valid"] = "same"
    use_bias: bool = True


class PoolLayer(_Layer):
    """Max or average over `window` x `window` patches, every `strides` (default: `window`),
    no padding (a partial patch at the edge is dropped, as PyTorch and flax do)."""

    type: Literal["max_pool", "avg_pool"]
    window: Annotated[int, Field(ge=1, le=MAX_KERNEL)] = 2
    strides: Annotated[int, Field(ge=1, le=MAX_KERNEL)] | None = None


class GlobalAvgPoolLayer(_Layer):
    """The mean of each channel over the image: [H, W, C] -> [C]."""

    type: Literal["global_avg_pool"]


class FlattenLayer(_Layer):
    """An image to a flat tensor in (channel, row, column) order; a flat tensor as it is."""

    type: Literal["flatten"]


class DropoutLayer(_Layer):
    """Zeroes each value with probability `rate` while training (scaling the rest by 1/(1-rate))."""

    type: Literal["dropout"]
    rate: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]


class BatchNormLayer(_Layer):
    """Batch norm over the batch (and the image's positions), per feature or channel; PyTorch's
    semantics: momentum 0.1, eps 1e-5, unbiased running variance."""

    type: Literal["batch_norm"]


class LayerNormLayer(_Layer):
    """Layer norm over the features of each example (an image: over the channels at each position),
    eps 1e-5, with a scale and a shift."""

    type: Literal["layer_norm"]


class ActivationLayer(_Layer):
    """An elementwise activation (gelu: the exact erf form, as PyTorch's default)."""

    type: Activation


class ResidualLayer(_Layer):
    """`layers` applied to the input, and the input added to their output; a projection (a 1x1
    convolution, or a dense layer for flat tensors) maps the input when the widths differ."""

    type: Literal["residual"]
    layers: Annotated[list[Layer], Field(min_length=1, max_length=MAX_LAYERS)]


Layer = Annotated[
    DenseLayer
    | ConvLayer
    | PoolLayer
    | GlobalAvgPoolLayer
    | FlattenLayer
    | DropoutLayer
    | BatchNormLayer
    | LayerNormLayer
    | ActivationLayer
    | ResidualLayer,
    Field(discriminator="type"),
]
ResidualLayer.model_rebuild()

SPATIAL = ("conv2d", "max_pool", "avg_pool", "global_avg_pool")


class LayerError(ValueError):
    """A layer cannot take its input: the message names the layer's index, its input and why."""


# A tensor's state as the layers see it: "input" (the model's flat input; an image dataset's
# examples may still be read as images), "flat" [D] or "image" [H, W, C].
State = Literal["input", "flat", "image"]


@dataclass(frozen=True)
class Op:
    """One layer of a plan: its kind, arguments, index path (e.g. "3" or "5.1" inside a residual),
    parameter prefix (None when it has no parameters), input and output shapes and states,
    parameters ((name, shape) pairs), FLOPs per example, and for a residual its body and
    projection's name. Hashable: models built from it are static arguments of compiled programs."""

    kind: str
    args: tuple[tuple[str, Any], ...]
    where: str
    name: str | None
    in_state: State
    in_shape: tuple[int, ...]
    out_state: State
    out_shape: tuple[int, ...]
    params: tuple[tuple[str, tuple[int, ...]], ...]
    flops: int
    body: tuple[Op, ...] = ()
    projection: str | None = None
    reshapes_input: bool = False  # it reads the model's (flat) input as the dataset's image first

    def arg(self, name: str) -> Any:
        return dict(self.args)[name]

    @property
    def local_name(self) -> str:
        """The name within its residual (or the model): `convs_1` for `residuals.0.convs.1`."""
        group, index = (self.name or "").split(".")[-2:]
        return f"{group}_{index}"


@dataclass(frozen=True)
class Plan:
    """A layer list walked for one input shape: `ops` in order, `input_shape` ([D] or [H, W, C]),
    the output width, parameter count and FLOPs per example (2 x multiply-adds of the dense and
    conv layers, plus one per value for the other layers)."""

    ops: tuple[Op, ...]
    input_shape: tuple[int, ...]
    outputs: int
    parameters: int
    flops: int

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter and batch-norm statistic, name -> shape, in the order they are drawn."""
        return {name: shape for op in walk(self.ops) for name, shape in op.params}


def all_layers(layers: Sequence[Layer]) -> list[Layer]:
    """Every layer of a list, those inside residuals included, in order."""
    out: list[Layer] = []
    for layer in layers:
        out.append(layer)
        if isinstance(layer, ResidualLayer):
            out.extend(all_layers(layer.layers))
    return out


def walk(ops: tuple[Op, ...]) -> list[Op]:
    """The ops in order, each residual's body after it (its projection's params are its own)."""
    out: list[Op] = []
    for op in ops:
        out.append(op)
        out.extend(walk(op.body))
    return out


def plan(layers: Sequence[Layer], input_shape: Sequence[int], outputs: int) -> Plan:
    """Walk `layers` for examples of `input_shape`; the last layer must give `outputs` values.

    Raises LayerError naming the layer (e.g. "model.layers[3] (conv2d)"), its input shape and why."""
    shape = tuple(input_shape)
    ops, state, shape = _walk(list(layers), "input", shape, prefix="", path="", depth=0)
    if state == "image":
        raise LayerError(
            f"model.layers ends with an image {list(shape)}: end with flatten or global_avg_pool and a "
            f"dense layer of {outputs} units"
        )
    width = math.prod(shape)
    if width != outputs:
        raise LayerError(
            f"model.layers gives {width} values per example but the dataset needs {outputs} "
            f"({'one per class' if outputs > 1 else 'one predicted value'}): end with a dense layer of "
            f"{outputs} units"
        )
    all_ops = walk(ops)
    parameters = sum(math.prod(s) for op in all_ops for n, s in op.params if not _is_statistic(n))
    return Plan(ops, tuple(input_shape), outputs, parameters, sum(op.flops for op in ops))


def plan_for(layers: Sequence[Layer], input_shape: int | Sequence[int], outputs: int) -> Plan:
    """`plan` for an input given as a shape, or as a feature count (what a weights file implies):
    flat, or for a model with spatial layers a square one-channel image (784 -> 28x28x1)."""
    if not isinstance(input_shape, int):
        return plan(layers, tuple(input_shape), outputs)
    spatial = any(getattr(layer, "type", "") in (*SPATIAL, "residual") for layer in layers)
    side = math.isqrt(input_shape)
    return plan(layers, (side, side, 1) if spatial else (input_shape,), outputs)


def _is_statistic(name: str) -> bool:
    return name.endswith(("running_mean", "running_var"))


class _Counters:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def next(self, group: str) -> int:
        self.counts[group] = self.counts.get(group, 0) + 1
        return self.counts[group] - 1


def _walk(
    layers: list[Layer], state: State, shape: tuple[int, ...], prefix: str, path: str, depth: int
) -> tuple[tuple[Op, ...], State, tuple[int, ...]]:
    counters, ops = _Counters(), []
    for index, layer in enumerate(layers):
        where = f"{path}{index}"
        op = _op(layer, where, state, shape, prefix, counters, depth)
        ops.append(op)
        state, shape = op.out_state, op.out_shape
    return tuple(ops), state, shape


def _label(where: str, layer: _Layer) -> str:
    indices = "".join(f"[{part}]" if i == 0 else f".layers[{part}]" for i, part in enumerate(where.split(".")))
    return f"model.layers{indices} ({getattr(layer, 'type', '?')})"


def _op(
    layer: _Layer, where: str, state: State, shape: tuple[int, ...], prefix: str, counters: _Counters, depth: int
) -> Op:
    label = f"{_label(where, layer)} with input {list(shape)}"
    kind = layer.type
    flat = math.prod(shape)
    args = tuple(sorted(layer.model_dump(exclude={"type", "layers"}).items()))

    def make(*, params: Mapping[str, tuple[int, ...]], **kw: Any) -> Op:
        image_out = kw["out_state"] == "image"
        return Op(
            kind=kind,
            args=args,
            where=where,
            in_state=state,
            in_shape=shape,
            params=tuple(params.items()),
            reshapes_input=state == "input" and (image_out or kind in SPATIAL),
            **kw,
        )

    if isinstance(layer, DenseLayer):
        if state == "image":
            raise LayerError(f"{label}: a dense layer needs a flat input; put flatten or global_avg_pool before it")
        name = f"{prefix}layers.{counters.next('layers')}"
        dense: dict[str, tuple[int, ...]] = {f"{name}.weight": (layer.units, flat)}
        dense |= {f"{name}.bias": (layer.units,)} if layer.use_bias else {}
        return make(name=name, out_state="flat", out_shape=(layer.units,), params=dense, flops=2 * flat * layer.units)
    if isinstance(layer, ConvLayer):
        height, width, channels = _image(label, state, shape)
        k, s = layer.kernel_size, layer.strides
        if layer.padding == "same":
            if s != 1:
                raise LayerError(f"{label}: padding same needs strides 1 (as in PyTorch); use padding valid")
            out_h, out_w = height, width
        else:
            if k > height or k > width:
                raise LayerError(f"{label}: a {k}x{k} kernel is larger than the {height}x{width} image")
            out_h, out_w = (height - k) // s + 1, (width - k) // s + 1
        name = f"{prefix}convs.{counters.next('convs')}"
        conv: dict[str, tuple[int, ...]] = {f"{name}.weight": (layer.filters, channels, k, k)}
        conv |= {f"{name}.bias": (layer.filters,)} if layer.use_bias else {}
        flops = 2 * k * k * channels * layer.filters * out_h * out_w
        return make(name=name, out_state="image", out_shape=(out_h, out_w, layer.filters), params=conv, flops=flops)
    if isinstance(layer, PoolLayer):
        height, width, channels = _image(label, state, shape)
        window, s = layer.window, layer.strides or layer.window
        if window > height or window > width:
            raise LayerError(f"{label}: a {window}x{window} pool is larger than the {height}x{width} image")
        out = ((height - window) // s + 1, (width - window) // s + 1, channels)
        return make(name=None, out_state="image", out_shape=out, params={}, flops=math.prod(out) * window * window)
    if isinstance(layer, GlobalAvgPoolLayer):
        height, width, channels = _image(label, state, shape)
        return make(name=None, out_state="flat", out_shape=(channels,), params={}, flops=height * width * channels)
    if isinstance(layer, FlattenLayer):
        return make(name=None, out_state="flat", out_shape=(flat,), params={}, flops=0)
    if isinstance(layer, BatchNormLayer | LayerNormLayer):
        # On an image (or an image dataset's input): per channel; else per feature.
        image = state == "image" or (state == "input" and len(shape) == 3)
        features = shape[-1] if image else flat
        is_batch = isinstance(layer, BatchNormLayer)
        if not is_batch and features < 2:
            raise LayerError(
                f"{label}: a layer norm over {features} value gives 0 for every input (each value minus "
                "its own mean); put it where there are at least 2 features or channels"
            )
        group = ("conv_norms" if image else "norms") if is_batch else "layer_norms"
        name = f"{prefix}{group}.{counters.next(group)}"
        kinds = ("weight", "bias", "running_mean", "running_var") if is_batch else ("weight", "bias")
        out_state: State = "image" if image else "flat"
        out_shape = shape if image else (flat,)
        params = {f"{name}.{kind}": (features,) for kind in kinds}
        return make(name=name, out_state=out_state, out_shape=out_shape, params=params, flops=4 * flat)
    if isinstance(layer, DropoutLayer | ActivationLayer):
        return Op(kind, args, where, None, state, shape, state, shape, (), flat)
    if isinstance(layer, ResidualLayer):
        return _residual(layer, where, label, state, shape, prefix, counters, depth)
    raise LayerError(f"{label}: unknown layer")


def _reads_image(layers: Sequence[Layer]) -> bool:
    """Whether a residual on the model's input reads it as an image: its first layer that is not
    elementwise is spatial or a norm (a nested residual: as its own first such layer)."""
    for inner in layers:
        if isinstance(inner, ResidualLayer):
            return _reads_image(inner.layers)
        if inner.type not in (*ACTIVATIONS, "dropout"):
            return inner.type in (*SPATIAL, "batch_norm", "layer_norm")
    return False


def _image(label: str, state: State, shape: tuple[int, ...]) -> tuple[int, int, int]:
    if state == "flat" or len(shape) != 3:
        raise LayerError(
            f"{label}: it needs an image [H, W, C], not a flat tensor; spatial layers come before flatten, "
            "on a dataset of images"
        )
    return shape[0], shape[1], shape[2]


def _residual(
    layer: ResidualLayer,
    where: str,
    label: str,
    state: State,
    shape: tuple[int, ...],
    prefix: str,
    counters: _Counters,
    depth: int,
) -> Op:
    if depth >= MAX_DEPTH:
        raise LayerError(f"{label}: residuals nest at most {MAX_DEPTH} deep")
    name = f"{prefix}residuals.{counters.next('residuals')}"
    reads_image = _reads_image(layer.layers)
    in_state: State = "image" if state == "image" or (state == "input" and reads_image and len(shape) == 3) else "flat"
    in_shape = shape if in_state == "image" else (math.prod(shape),)
    body, out_state, out_shape = _walk(layer.layers, in_state, in_shape, f"{name}.", f"{where}.", depth + 1)
    if out_state != in_state or out_shape[:-1] != in_shape[:-1]:
        raise LayerError(
            f"{label}: its layers turn {list(in_shape)} into {list(out_shape)}; a residual's output must keep "
            "its input's size (only the channels or width may change)"
        )
    params: dict[str, tuple[int, ...]] = {}
    projection, flops = None, 0
    if out_shape[-1] != in_shape[-1]:
        projection = f"{name}.projection"
        c_in, c_out = in_shape[-1], out_shape[-1]
        weight = (c_out, c_in, 1, 1) if in_state == "image" else (c_out, c_in)
        params = {f"{projection}.weight": weight, f"{projection}.bias": (c_out,)}
        flops = 2 * c_in * c_out * math.prod(out_shape[:-1])
    return Op(
        kind="residual",
        args=(),
        where=where,
        name=name,
        in_state=state,
        in_shape=shape,
        out_state=out_state,
        out_shape=out_shape,
        params=tuple(params.items()),
        flops=flops + sum(op.flops for op in body) + math.prod(out_shape),
        body=body,
        projection=projection,
        reshapes_input=state == "input" and in_state == "image",
    )
