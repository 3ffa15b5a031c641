"""Your model outside trainhub: a layer list (a job's spec.json `model.layers`, or a preset's from
GET /models/presets) built as a `torch.nn.Module` or a flax module that loads the job's
downloaded weights.safetensors::

    import json
    from trainers.models import build, load

    spec = json.load(open("spec.json"))
    model = load("weights.safetensors", spec, framework="pytorch")  # eval mode, weights loaded
    outputs = model(torch.from_numpy(x))                             # x float32 [N, D]

    module, variables = load("weights.safetensors", spec, framework="jax")
    outputs = module.apply(variables, x)

Inputs are flat float32 [N, D] (an image's values in (row, column, channel) order, after the
job's preprocessing.json when it has one); outputs [N, classes] logits, or [N, 1] for regression.
The framework is imported only when it is asked for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainers.layers import Layer, plan_for
from trainers.presets import layers_of
from trainers.spec import JobSpec, data_shape

FRAMEWORKS = ("pytorch", "jax")


def build(layers: Sequence[Layer | dict], input_shape: Sequence[int], outputs: int, framework: str = "pytorch") -> Any:
    """The module of `layers` (Layer objects, or their JSON) for examples of `input_shape` ([D] or
    [H, W, C]) with `outputs` units out, with fresh parameters: a torch.nn.Module (framework
    "pytorch") or a flax module (framework "jax"; its params come from `module.init` or `load`).
    Raises LayerError (naming the layer) when a layer cannot take its input."""
    from pydantic import TypeAdapter

    checked = TypeAdapter(list[Layer]).validate_python(
        [dict(layer) if isinstance(layer, dict) else layer for layer in layers]
    )
    model_plan = plan_for(checked, tuple(input_shape), outputs)
    if framework == "pytorch":
        from trainers.torch_models import LayerModel as TorchModel

        return TorchModel(model_plan.ops, model_plan.input_shape)
    if framework == "jax":
        from trainers.jax_models import build_layers

        return build_layers(checked, outputs, tuple(input_shape))
    raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, not {framework!r}")


def load(weights_path: Path | str, spec: dict | Path | str, framework: str = "pytorch") -> Any:
    """The job's model with its trained weights: a torch.nn.Module in eval mode, or (flax module,
    variables) for framework "jax". `spec` is the job's spec.json (a path or its parsed JSON)."""
    if not isinstance(spec, dict):
        spec = json.loads(Path(spec).read_text())
    job = JobSpec.model_validate(spec)
    shape = data_shape(job.dataset)
    if shape is None:
        raise ValueError("spec.json names an uploaded dataset without its info; use the job's own spec.json")
    layers = layers_of(job.model, shape.outputs)
    if framework == "pytorch":
        from trainers.torch_models import load_weights as load_torch

        return load_torch(Path(weights_path), input_shape=shape.input_shape, layers=layers)
    if framework == "jax":
        from trainers.jax_models import load_weights as load_jax

        return load_jax(Path(weights_path), input_shape=shape.input_shape, layers=layers)
    raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, not {framework!r}")
