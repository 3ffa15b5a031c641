"""The child process of a user-code job: run the trainer on the user's module, talk to the worker
over one pipe in JSON lines.

Started by workers/user_code.py as `python -I -m trainers.user_child REQUEST_JSON` in the job's
working directory, with a clean environment and the sandbox's limits. It sends, one JSON object
per line: {"type": "epoch", "epoch": N, "metrics": {...}} after each epoch, then
{"type": "result", "timings", "result", "artifacts", "device"} or {"type": "error", "kind",
"exception", "message", "traceback"}. Whatever the user's code prints goes to stdout/stderr,
which the worker captures (size-capped) as logs.txt.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from trainers import base, user_code
from trainers.base import EpochMetrics, RunOptions
from trainers.spec import JobSpec

# Exceptions of ours that keep their own error type (workers/runner.USER_ERRORS); any other is the
# user code's.
OWN_ERRORS = ("DataNotFound", "DatasetCorrupt", "HardwareMismatch", "NanLoss")


def main(argv: list[str]) -> int:
    request: dict[str, Any] = json.loads(argv[1])
    channel = os.fdopen(int(request["fd"]), "w", buffering=1)

    def send(message: dict[str, Any]) -> None:
        channel.write(json.dumps(message, allow_nan=False) + "\n")

    def report(epoch: int, metrics: EpochMetrics) -> None:
        send({"type": "epoch", "epoch": epoch, "metrics": metrics.to_dict()})

    workdir, code_dir = Path(request["workdir"]), Path(request["code_dir"])
    try:
        spec = JobSpec.model_validate(request["spec"])
        assert spec.model.entrypoint is not None
        model = user_code.load(code_dir, spec.model.entrypoint, spec.model.kwargs)
        options = RunOptions(
            data_dir=Path(request["data_dir"]) if request.get("data_dir") else None,
            dataset_file=Path(request["dataset_file"]) if request.get("dataset_file") else None,
            user_model=model,
        )
        result = base.fit(spec, workdir, report, options=options)
    except BaseException as exc:  # noqa: BLE001 - every failure is told to the worker
        described = user_code.describe(exc, code_dir)
        kind = described["exception"] if described["exception"] in OWN_ERRORS else "user_code_error"
        send({"type": "error", "kind": kind, **described})
        return 1
    send(
        {
            "type": "result",
            "timings": result.timings,
            "result": result.result,
            "artifacts": result.artifacts,
            "device": result.device,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
