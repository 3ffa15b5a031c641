"""Input said twice is never silently resolved (issue 15, item 9): duplicate keys in a JSON body
are 422, CLI options given with a --spec file override its fields and say so."""

from __future__ import annotations

import json

import pytest
import typer

from app.cli import spec_from_options


@pytest.mark.parametrize("body", [
    '{"framework": "jax", "epochs": 2, "epochs": 3}',
    '{"framework": "jax", "model": {"dropout": 0.1, "dropout": 0.5}}',
    '{"framework": "jax", "framework": "pytorch"}',
])
def test_a_body_naming_a_key_twice_is_422(api, auth, body):
    response = api.post("/jobs", content=body, headers={**auth, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["type"] == "json_duplicate_key" and "appears twice" in error["msg"]
    assert api.get("/jobs", headers=auth).json()["items"] == []  # nothing stored


def test_a_comparison_body_naming_a_key_twice_is_422(api, auth):
    response = api.post("/comparisons", content='{"epochs": 1, "epochs": 2}',
                        headers={**auth, "Content-Type": "application/json"})
    assert response.status_code == 422 and "appears twice" in response.text


def test_options_given_with_a_spec_file_override_its_fields_and_say_so(tmp_path, capsys):
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps({"framework": "jax", "epochs": 5, "optimizer": {"name": "sgd", "learning_rate": 0.1},
                                     "dataset": {"name": "digits", "train_limit": 100}}))
    spec = spec_from_options(spec_file, framework="pytorch", epochs=3, learning_rate=0.05, dataset=None,
                             hidden_sizes="64,32", seed=None)
    assert spec == {"framework": "pytorch", "epochs": 3, "optimizer": {"name": "sgd", "learning_rate": 0.05},
                    "dataset": {"name": "digits", "train_limit": 100}, "model": {"hidden_sizes": [64, 32]}}
    said = capsys.readouterr().err
    assert "--epochs 3 overrides the spec file's epochs (5)" in " ".join(said.split())
    assert "--framework pytorch overrides" in " ".join(said.split())


def test_a_spec_file_naming_a_key_twice_is_refused(tmp_path):
    spec_file = tmp_path / "job.json"
    spec_file.write_text('{"framework": "jax", "epochs": 5, "epochs": 6}')
    with pytest.raises(typer.BadParameter, match="'epochs' twice"):
        spec_from_options(spec_file)


def test_without_a_spec_file_only_the_given_options_are_sent():
    assert spec_from_options(None, framework=None, epochs=2, dataset="digits", hidden_sizes=None) == {
        "epochs": 2, "dataset": {"name": "digits"}}
