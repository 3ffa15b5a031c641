"""Export a job's weights.safetensors in either framework's own format.

`state_dict.pt` loads with `torch.load(path, weights_only=True)` into trainers.torch_models.MLP;
`params.msgpack` holds the flax variables as `model.init` lays them out (`{"params": ...}`, and
`"batch_stats"` for a model with batch norm): `flax.serialization.msgpack_restore` reads it.
The framework is imported only when its format is asked for.
"""

from __future__ import annotations

from pathlib import Path

from trainers.common import read_weights

FORMATS = {"pytorch": "state_dict.pt", "jax": "params.msgpack"}


def export(weights_path: Path, framework: str, out_dir: Path) -> Path:
    """Write `weights_path` (PyTorch-named tensors) as `framework`'s format in `out_dir`.

    Returns the written file. Raises ValueError for an unknown framework or foreign tensor names.
    """
    if framework not in FORMATS:
        raise ValueError(f"framework must be one of {', '.join(FORMATS)}, not {framework!r}")
    weights = read_weights(weights_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FORMATS[framework]
    if framework == "pytorch":
        import torch

        torch.save({name: torch.from_numpy(array.copy()) for name, array in weights.items()}, path)
    else:
        import jax
        from flax.serialization import to_bytes

        from trainers.jax_models import variables_from_weights

        path.write_bytes(to_bytes(jax.device_get(variables_from_weights(weights))))
    return path
