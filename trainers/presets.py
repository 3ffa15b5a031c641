"""Named models as layer lists: `mlp` and `cnn` (with their knobs, as specs always had them),
`lenet5` and `resnet8`. A preset and its expanded list train identically: both trainers only
ever build the list."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from trainers.layers import Layer

if TYPE_CHECKING:
    from trainers.spec import ModelSpec

PRESETS = ("mlp", "cnn", "lenet5", "resnet8")
_LAYERS: TypeAdapter[list[Layer]] = TypeAdapter(list[Layer])


def layers_of(model: ModelSpec, outputs: int) -> list[Layer]:
    """The layer list `model` describes, ending in `outputs` units: its own `layers`, or its preset's.
    Raises ValueError for user code, which has no layer list."""
    if model.code is not None:
        raise ValueError("a model of user code has no layer list: its shapes are known once it is built")
    if model.layers is not None:
        return list(model.layers)
    return _LAYERS.validate_python(expand(model.name or "mlp", outputs, _knobs(model)))


def _knobs(model: ModelSpec) -> dict[str, Any]:
    return {
        "hidden_sizes": model.hidden_sizes,
        "dropout": model.dropout,
        "batch_norm": model.batch_norm,
        "channels": model.channels,
    }


def expand(name: str, outputs: int, knobs: dict[str, Any] | None = None) -> list[dict]:
    """The layer list (as JSON) of preset `name`. `mlp`: hidden_sizes dense layers, each followed
    by [batch_norm], relu, [dropout]; `cnn`: per channels entry a 3x3 conv, [batch_norm], relu and a
    2x2 max pool, then flatten and the mlp's head; `lenet5` (LeCun et al. 1998, with ReLU and
    max pools) for 28x28 images; `resnet8`: a 16-channel conv and three residual blocks of two
    3x3 convs with batch norm (16, 32, 64 channels; max pools between), then a global average
    pool, for 28x28 and 32x32 images."""
    defaults: dict[str, Any] = {"hidden_sizes": [256, 128], "dropout": 0.0, "batch_norm": False, "channels": [32, 64]}
    knobs = defaults | (knobs or {})
    if name == "mlp":
        return [*_head(knobs, outputs)]
    if name == "cnn":
        convs: list[dict] = []
        for channels in knobs["channels"]:
            convs += [{"type": "conv2d", "filters": channels, "kernel_size": 3}]
            convs += [{"type": "batch_norm"}] if knobs["batch_norm"] else []
            convs += [{"type": "relu"}, {"type": "max_pool", "window": 2}]
        return [*convs, {"type": "flatten"}, *_head(knobs, outputs)]
    if name == "lenet5":
        return [
            {"type": "conv2d", "filters": 6, "kernel_size": 5, "padding": "same"},
            {"type": "relu"},
            {"type": "max_pool", "window": 2},
            {"type": "conv2d", "filters": 16, "kernel_size": 5, "padding": "valid"},
            {"type": "relu"},
            {"type": "max_pool", "window": 2},
            {"type": "flatten"},
            {"type": "dense", "units": 120},
            {"type": "relu"},
            {"type": "dense", "units": 84},
            {"type": "relu"},
            {"type": "dense", "units": outputs},
        ]
    if name == "resnet8":
        return [
            {"type": "conv2d", "filters": 16, "kernel_size": 3, "use_bias": False},
            {"type": "batch_norm"},
            {"type": "relu"},
            *_block(16),
            {"type": "max_pool", "window": 2},
            *_block(32),
            {"type": "max_pool", "window": 2},
            *_block(64),
            {"type": "global_avg_pool"},
            {"type": "dense", "units": outputs},
        ]
    raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")


def _head(knobs: dict[str, Any], outputs: int) -> list[dict]:
    layers: list[dict] = []
    for units in knobs["hidden_sizes"]:
        layers += [{"type": "dense", "units": units}]
        layers += [{"type": "batch_norm"}] if knobs["batch_norm"] else []
        layers += [{"type": "relu"}]
        layers += [{"type": "dropout", "rate": knobs["dropout"]}] if knobs["dropout"] > 0 else []
    return [*layers, {"type": "dense", "units": outputs}]


def _block(channels: int) -> list[dict]:
    """Two 3x3 convs with batch norm, added to the input (projected when the channels change), then ReLU."""
    conv = {"type": "conv2d", "filters": channels, "kernel_size": 3, "use_bias": False}
    body = [conv, {"type": "batch_norm"}, {"type": "relu"}, conv, {"type": "batch_norm"}]
    return [{"type": "residual", "layers": body}, {"type": "relu"}]
