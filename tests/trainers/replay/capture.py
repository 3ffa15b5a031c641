"""Write replay.json: the metrics of stored preset specs, trained here, for test_replay.py.

Run it only to record a new baseline on purpose (a change that is meant to change the numbers):
    .venv/bin/python -m tests.trainers.replay.capture
"""

from __future__ import annotations

import json
import platform
import tempfile
from pathlib import Path

from trainers import JobSpec, fit

# Old-style specs (model by name), as jobs stored before layer lists were stored them.
SPECS = {
    "mlp": {"dataset": {"name": "digits"}, "model": {"hidden_sizes": [32]}, "epochs": 2, "batch_size": 32},
    "mlp-batch-norm-dropout": {"dataset": {"name": "digits"}, "epochs": 2, "batch_size": 32,
                               "model": {"hidden_sizes": [32, 16], "batch_norm": True, "dropout": 0.2}},
    "cnn": {"dataset": {"name": "digits", "train_limit": 512}, "epochs": 2, "batch_size": 64,
            "model": {"name": "cnn", "channels": [4, 8], "hidden_sizes": [16]}},
    "cnn-batch-norm": {"dataset": {"name": "digits", "train_limit": 512}, "epochs": 2, "batch_size": 64,
                       "model": {"name": "cnn", "channels": [4], "hidden_sizes": [16], "batch_norm": True}},
    "mlp-privacy": {"dataset": {"name": "digits"}, "model": {"hidden_sizes": [16]}, "epochs": 1, "batch_size": 32,
                    "privacy": {"clip_norm": 1.0, "noise_multiplier": 0.5}},
}
FIELDS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")
OUT = Path(__file__).with_name("replay.json")


def run(framework: str, spec: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as workdir:
        result = fit(JobSpec(framework=framework, **spec), Path(workdir), lambda epoch, metrics: None)
    return [{name: getattr(m, name) for name in FIELDS} for m in result.metrics]


def main() -> None:
    runs = {f"{name}/{fw}": run(fw, spec) for name, spec in SPECS.items() for fw in ("jax", "pytorch")}
    OUT.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "specs": SPECS,
                               "metrics": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
