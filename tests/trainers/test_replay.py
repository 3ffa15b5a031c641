"""Stored jobs replay to the same numbers: the preset specs of replay/replay.json (recorded with
the trainers as they were before uploaded datasets and layer lists) train to bit-identical
metrics in both frameworks. A change that means to change them records a new baseline with
`python -m tests.trainers.replay.capture`, and says so."""

from __future__ import annotations

import json

import pytest

from tests.trainers.replay.capture import OUT, run

RECORDED = json.loads(OUT.read_text())


@pytest.mark.parametrize("key", sorted(RECORDED["metrics"]))
def test_a_stored_spec_trains_to_the_recorded_metrics(key):
    name, framework = key.split("/")
    assert run(framework, RECORDED["specs"][name]) == RECORDED["metrics"][key]
