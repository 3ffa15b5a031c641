"""Stored jobs replay to the same numbers: the preset specs of replay/replay.json (recorded with
the trainers as they were before uploaded datasets and layer lists) train to the recorded
metrics in both frameworks. A change that means to change them records a new baseline with
`python -m tests.trainers.replay.capture`, and says so.

Bit-identical on the machine that recorded them. Another CPU's XLA kernels may round the
evaluation differently (seen: on an AMD EPYC, cnn-batch-norm/jax trains to the same losses but
its near-chance test logits give a test_loss of 2.342114 for the recorded 2.342087 and one of
the 360 test digits another class; on an Intel Xeon with AVX-512 the batch-norm specs' test_loss
lands up to 3e-4 apart in both frameworks while every train loss agrees bit for bit), so train
losses must agree to 1e-4 relative, test losses to 1e-3, and accuracies to one test example: far
below what a changed initialisation, batch order, layout or loss moves them."""

from __future__ import annotations

import json

import pytest

from tests.trainers.replay.capture import OUT, run

RECORDED = json.loads(OUT.read_text())


@pytest.mark.parametrize("key", sorted(RECORDED["metrics"]))
def test_a_stored_spec_trains_to_the_recorded_metrics(key):
    name, framework = key.split("/")
    spec = RECORDED["specs"][name]
    one_example = 1 / count_test_examples(spec)
    expected = [
        {field: pytest.approx(value, abs=one_example * 1.01) if "accuracy" in field
         else pytest.approx(value, rel=1e-3 if field.startswith("test") else 1e-4)
         for field, value in epoch.items()}
        for epoch in RECORDED["metrics"][key]
    ]
    assert run(framework, spec) == expected


def count_test_examples(spec: dict) -> int:
    from trainers.spec import DatasetSpec, data_shape

    return data_shape(DatasetSpec(**spec["dataset"])).test_size
