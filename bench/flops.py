"""FLOPs of one training epoch of the bench's models, and the floor they give at a matmul rate.

The MLP and CNN follow issue 3's convention: 6 x multiply-adds x samples per epoch (2 for the
forward pass, 4 for the backward: the gradients of each layer's weights and of its inputs).
Other models (resnet8) take their forward FLOPs from the model itself (`trainers.spec.model_plan`:
2 x multiply-adds of dense and conv layers, one per value for the others) and count a training
step as 3 x that: the same 6 x multiply-adds for dense and conv layers.
"""

from __future__ import annotations

from trainers.spec import CONV_KERNEL, TrainingSpec, model_plan

# The seeds' MLP: 784-256-128-10.
MLP_LAYERS = [784, 256, 128, 10]
# The bench's CNN (bench.loops.trainer_spec): two 3x3 convs of 32 and 64 channels on 28x28x1,
# each followed by a 2x2 max pool, then dense 128 and the 10 logits.
CNN_CHANNELS, CNN_HIDDEN, IMAGE_SIDE, CLASSES = [32, 64], [128], 28, 10


def mlp_flops_per_epoch(samples: int, layers: list[int] = MLP_LAYERS) -> dict:
    """FLOPs of one epoch of the MLP, forward and backward.

    `flops` follows 6 x MACs x samples, the convention of the issue's 85 GFLOP. `flops_needed`
    leaves out the input gradient of the first layer, which nothing uses and both trainers skip;
    the floor uses `flops`, as the issue does.
    """
    macs = sum(a * b for a, b in zip(layers[:-1], layers[1:]))
    return {"macs_per_sample": macs, "samples": samples, "flops": 6 * macs * samples,
            "flops_needed": (6 * macs - 2 * layers[0] * layers[1]) * samples}


def cnn_macs_per_sample(channels: list[int] = CNN_CHANNELS, hidden: list[int] = CNN_HIDDEN,
                        side: int = IMAGE_SIDE, classes: int = CLASSES) -> int:
    """Multiply-adds of one example through the CNN: each "same" 3x3 conv costs
    side^2 x c_in x c_out x 9 at its input's side, which the pool after it halves."""
    macs, c_in = 0, 1
    for c_out in channels:
        macs += side * side * c_in * c_out * CONV_KERNEL * CONV_KERNEL
        c_in, side = c_out, side // 2
    sizes = [c_in * side * side, *hidden, classes]
    return macs + sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


def cnn_flops_per_epoch(samples: int) -> dict:
    """FLOPs of one epoch of the bench's CNN, 6 x MACs x samples (pooling and ReLU not counted)."""
    macs = cnn_macs_per_sample()
    return {"macs_per_sample": macs, "samples": samples, "flops": 6 * macs * samples}


# A training step costs the forward pass and a backward of about twice its FLOPs.
TRAIN_STEP_FACTOR = 3


def model_flops_per_epoch(spec: TrainingSpec, samples: int) -> dict:
    """FLOPs of one epoch of `samples` examples of the model `spec` trains (a TrainingSpec):
    TRAIN_STEP_FACTOR x its forward FLOPs per example (`trainers.spec.model_plan`) x samples."""
    plan = model_plan(spec)
    return {"forward_flops_per_example": plan.flops, "parameters": plan.parameters, "samples": samples,
            "flops": TRAIN_STEP_FACTOR * plan.flops * samples}


def floor_s(flops: float, gflops: float) -> float:
    """Seconds an epoch of `flops` takes if every FLOP ran at `gflops` (GFLOP/s)."""
    return flops / (gflops * 1e9)
