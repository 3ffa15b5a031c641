"""Models through the API (no worker): layer lists are checked at submit, naming the layer; a job
answers with its model's parameters and FLOPs; the presets are listed expanded."""

from __future__ import annotations

FASHION = {"dataset": {"name": "fashion-mnist", "train_limit": 512, "test_limit": 128}}


def test_a_layer_list_job_answers_with_its_parameters_and_flops(api, auth):
    layers = [{"type": "conv2d", "filters": 4, "kernel_size": 3}, {"type": "relu"}, {"type": "max_pool"},
              {"type": "flatten"}, {"type": "dense", "units": 10}]
    created = api.post("/jobs", json={"framework": "jax", "model": {"layers": layers}, **FASHION}, headers=auth)
    assert created.status_code == 201, created.text
    job = created.json()
    # conv: 4 x (1 x 3 x 3) + 4; dense: 10 x (14 x 14 x 4) + 10
    assert job["model"]["parameters"] == 40 + 7850
    assert job["model"]["flops_per_example"] > 2 * 9 * 4 * 28 * 28
    assert job["spec"]["model"] == {"layers": [{**layers[0], "strides": 1, "padding": "same", "use_bias": True},
                                               layers[1], {"type": "max_pool", "window": 2, "strides": None},
                                               layers[3], {**layers[4], "use_bias": True}]}
    preset = api.post("/jobs", json={"framework": "jax", **FASHION}, headers=auth).json()
    assert preset["model"]["parameters"] == 784 * 256 + 256 + 256 * 128 + 128 + 1290
    assert preset["spec"]["model"] == {"name": "mlp", "hidden_sizes": [256, 128], "dropout": 0.0}


def test_a_layer_that_cannot_take_its_input_is_a_422_naming_it(api, auth):
    bad = [{"type": "conv2d", "filters": 4}, {"type": "max_pool", "window": 8}, {"type": "max_pool", "window": 8},
           {"type": "flatten"}, {"type": "dense", "units": 10}]
    refused = api.post("/jobs", json={"framework": "jax", "model": {"layers": bad}, **FASHION}, headers=auth)
    assert refused.status_code == 422
    assert "model.layers[2] (max_pool) with input [3, 3, 4]" in refused.text and "larger than" in refused.text
    wrong_end = [{"type": "flatten"}, {"type": "dense", "units": 3}]
    refused = api.post("/jobs", json={"framework": "jax", "model": {"layers": wrong_end}, **FASHION}, headers=auth)
    assert refused.status_code == 422 and "needs 10" in refused.text
    unknown = api.post("/jobs", json={"framework": "jax", "model": {"layers": [{"type": "lstm"}]}, **FASHION},
                       headers=auth)
    assert unknown.status_code == 422
    assert unknown.json()["detail"][0]["loc"][:4] == ["body", "model", "layers", 0]
    both = api.post("/jobs", json={"framework": "jax", "model": {"name": "cnn", "layers": wrong_end}}, headers=auth)
    assert both.status_code == 422 and "not both" in both.text
    knobs = api.post("/jobs", json={"framework": "jax", "model": {"name": "resnet8", "hidden_sizes": [3]}},
                     headers=auth)
    assert knobs.status_code == 422 and "hidden_sizes" in knobs.text


def test_privacy_refuses_batch_norm_anywhere_in_the_list(api, auth):
    layers = [{"type": "residual", "layers": [{"type": "dense", "units": 8}, {"type": "batch_norm"}]},
              {"type": "dense", "units": 10}]
    refused = api.post("/jobs", json={"framework": "jax", "model": {"layers": layers}, "privacy": {}, **FASHION},
                       headers=auth)
    assert refused.status_code == 422 and "batch_norm" in refused.text


def test_the_presets_are_listed_expanded(api, auth):
    listed = api.get("/models/presets", headers=auth)
    assert listed.status_code == 200
    presets = {item["name"]: item for item in listed.json()["items"]}
    assert set(presets) == {"mlp", "cnn", "lenet5", "resnet8"}
    assert presets["mlp"]["parameters"] == 784 * 256 + 256 + 256 * 128 + 128 + 1290
    assert sum(layer["type"] == "residual" for layer in presets["resnet8"]["layers"]) == 3
    # The expanded list is accepted as is and is the same model.
    job = api.post("/jobs", json={"framework": "pytorch", "model": {"layers": presets["lenet5"]["layers"]},
                                  **FASHION}, headers=auth).json()
    assert job["model"]["parameters"] == presets["lenet5"]["parameters"]
    assert api.get("/models/presets").status_code == 401
