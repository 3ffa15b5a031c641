"""Bad job specs: 422 naming the field, and no row stored."""

from __future__ import annotations

import pytest

BAD_SPECS = [
    ({"framework": "tensorflow"}, "framework"),
    ({"framework": "jax", "hardware": "quantum"}, "hardware"),
    ({"framework": "jax", "model": {"name": "transformer"}}, "model.name"),
    ({"framework": "jax", "dataset": {"name": "imagenet"}}, "dataset.name"),
    ({"framework": "jax", "epochs": 0}, "epochs"),
    ({"framework": "jax", "epochs": -3}, "epochs"),
    ({"framework": "jax", "epochs": 10**9}, "epochs"),
    ({"framework": "jax", "epochs": 2.5}, "epochs"),
    ({"framework": "jax", "epochs": "ten"}, "epochs"),
    ({"framework": "jax", "batch_size": 0}, "batch_size"),
    ({"framework": "jax", "batch_size": 10**8}, "batch_size"),
    ({"framework": "jax", "dataset": {"name": "digits"}, "batch_size": 5000}, "batch_size"),
    ({"framework": "jax", "dataset": {"name": "fashion-mnist", "train_limit": 100}, "batch_size": 128}, "batch_size"),
    ({"framework": "jax", "optimizer": {"learning_rate": 0}}, "optimizer.learning_rate"),
    ({"framework": "jax", "optimizer": {"learning_rate": -0.1}}, "optimizer.learning_rate"),
    ({"framework": "jax", "optimizer": {"learning_rate": "fast"}}, "optimizer.learning_rate"),
    ({"framework": "jax", "optimizer": {"name": "rmsprop"}}, "optimizer.name"),
    ({"framework": "jax", "model": {"hidden_sizes": [0]}}, "model.hidden_sizes"),
    ({"framework": "jax", "model": {"hidden_sizes": "big"}}, "model.hidden_sizes"),
    ({"framework": "jax", "model": {"dropout": 1.5}}, "model.dropout"),
    ({"framework": "jax", "seed": -1}, "seed"),
    ({"framework": "jax", "labels": "x"}, "labels"),
    ({"framework": "jax", "learning_rate": 0.01}, "learning_rate"),
    ({"framework": "jax", "model": {"layers": 3}}, "model.layers"),
    ({"hardware": "cpu"}, "framework"),
    ({"framework": "jax", "max_runtime_s": 0}, "max_runtime_s"),
    ({"framework": "jax", "epochs": True}, "epochs"),
    ({"framework": "jax", "epochs": "2"}, "epochs"),
    ({"framework": "jax", "optimizer": {"learning_rate": "0.01"}}, "optimizer.learning_rate"),
    ({"framework": "jax", "optimizer": {"learning_rate": True}}, "optimizer.learning_rate"),
    ({"framework": "jax", "name": 5}, "name"),
    ({"framework": "jax", "model": {"hidden_sizes": [16384] * 16}}, "model.hidden_sizes"),
    ({"framework": "jax", "dataset": {"name": "synthetic", "train_limit": 10_000_000}}, "dataset.train_limit"),
]


def names_field(error: dict, field: str) -> bool:
    """The error's location is the field (or inside it), or its message names the field."""
    loc = ".".join(str(p) for p in error["loc"][1:] if not isinstance(p, int))
    return loc == field or loc.startswith(field + ".") or field in error["msg"]


@pytest.mark.parametrize("spec,field", BAD_SPECS, ids=[f for _, f in BAD_SPECS])
def test_bad_spec_is_422_naming_the_field(api, auth, spec, field):
    response = api.post("/jobs", json=spec, headers=auth)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(names_field(item, field) for item in detail), detail
    assert api.get("/jobs", headers=auth).json()["items"] == []


@pytest.mark.parametrize("body,content_type", [
    ("", "application/json"),
    ("{not json", "application/json"),
    ('{"framework": "jax", "optimizer": {"learning_rate": NaN}}', "application/json"),
    ('{"framework": "jax", "optimizer": {"learning_rate": Infinity}}', "application/json"),
    ("[]", "application/json"),
    ("framework=jax", "application/x-www-form-urlencoded"),
])
def test_malformed_bodies_are_422(api, auth, body, content_type):
    response = api.post("/jobs", content=body, headers={**auth, "Content-Type": content_type})
    assert response.status_code == 422, response.text
    assert api.get("/jobs", headers=auth).json()["items"] == []


def test_batch_size_message_says_the_fix(api, auth):
    response = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}, "batch_size": 5000},
                        headers=auth)
    message = response.json()["detail"][0]["msg"]
    assert "1437" in message and "batch_size" in message
