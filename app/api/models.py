"""Routes of the `models` resource: the presets, expanded into the layer lists they stand for."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from app.deps import CurrentUser
from app.errors import responses
from trainers.layers import plan_for
from trainers.presets import PRESETS, layers_of
from trainers.spec import ModelSpec

router = APIRouter(prefix="/models", tags=["models"], responses=responses(401))

# The presets are shown for Fashion-MNIST's examples: 28x28 grey images, 10 classes.
INPUT_SHAPE, OUTPUTS = (28, 28, 1), 10


@router.get("/presets")
def list_presets(user: CurrentUser) -> Response:
    """Each preset (`model: {"name": ...}`) as its layer list for 28x28x1 images and 10 classes,
    with its parameters and FLOPs per example: `model: {"layers": [...]}` with that list trains
    identically. mlp's and cnn's knobs (hidden_sizes, dropout, batch_norm, channels) change their lists."""
    items = []
    for name in PRESETS:
        layers = layers_of(ModelSpec(name=name), OUTPUTS)  # type: ignore[arg-type]  # a name from PRESETS
        walked = plan_for(layers, INPUT_SHAPE, OUTPUTS)
        items.append(
            {
                "name": name,
                "layers": [layer.model_dump(mode="json") for layer in layers],
                "parameters": walked.parameters,
                "flops_per_example": walked.flops,
            }
        )
    return JSONResponse({"shown_for": {"input_shape": list(INPUT_SHAPE), "outputs": OUTPUTS}, "items": items})
