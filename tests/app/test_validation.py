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


# --- hostile requests: every one 4xx with a message that says what is wrong, none stored ---------

J = "application/json"
DEEP = "[" * 100 + "]" * 100


def body(**fields) -> str:
    """A JobSpec body (framework jax unless given) as JSON text."""
    import json

    return json.dumps({"framework": "jax", **fields})


# (id, content, content type, status, words the message must contain). `content` is sent as is.
BAD_REQUESTS = [
    # wrong types
    ("epochs-string", body(epochs="ten"), J, 422, "epochs"),
    ("batch-size-list", body(batch_size=[128]), J, 422, "batch_size"),
    ("hidden-sizes-object", body(model={"hidden_sizes": {"a": 1}}), J, 422, "model.hidden_sizes"),
    ("labels-list", body(labels=["a"]), J, 422, "labels"),
    ("label-value-number", body(labels={"a": 1}), J, 422, "labels.a"),
    ("framework-number", '{"framework": 1}', J, 422, "framework"),
    ("optimizer-string", body(optimizer="adam"), J, 422, "optimizer"),
    ("dataset-null", body(dataset=None), J, 422, "dataset"),
    ("compile-string", body(compile="yes"), J, 422, "compile"),
    ("seed-float", body(seed=1.5), J, 422, "seed"),
    # huge numbers
    ("epochs-huge", body(epochs=10**30), J, 422, "epochs"),
    ("seed-2-to-64", body(seed=2**64), J, 422, "seed"),
    ("learning-rate-overflows", '{"framework": "jax", "optimizer": {"learning_rate": 1e999}}', J, 422,
     "optimizer.learning_rate"),
    ("max-runtime-huge", body(max_runtime_s=1e12), J, 422, "max_runtime_s"),
    ("hidden-units-huge", body(model={"hidden_sizes": [10**6]}), J, 422, "model.hidden_sizes"),
    ("train-limit-huge", body(dataset={"name": "synthetic", "train_limit": 10**12}), J, 422, "dataset.train_limit"),
    ("number-of-5000-digits", '{"framework": "jax", "epochs": ' + "9" * 5000 + "}", J, 422, "digits"),
    # negative values
    ("epochs-negative", body(epochs=-1), J, 422, "epochs"),
    ("batch-size-negative", body(batch_size=-128), J, 422, "batch_size"),
    ("seed-negative", body(seed=-5), J, 422, "seed"),
    ("learning-rate-negative", body(optimizer={"learning_rate": -1e-3}), J, 422, "optimizer.learning_rate"),
    ("dropout-negative", body(model={"dropout": -0.1}), J, 422, "model.dropout"),
    ("max-runtime-negative", body(max_runtime_s=-10), J, 422, "max_runtime_s"),
    ("train-limit-negative", body(dataset={"name": "digits", "train_limit": -1}), J, 422, "dataset.train_limit"),
    # NaN and Infinity (not JSON, but Python's parser takes them)
    ("learning-rate-nan", '{"framework": "jax", "optimizer": {"learning_rate": NaN}}', J, 422, "optimizer.learning_rate"),
    ("dropout-nan", '{"framework": "jax", "model": {"dropout": NaN}}', J, 422, "model.dropout"),
    ("max-runtime-infinity", '{"framework": "jax", "max_runtime_s": Infinity}', J, 422, "max_runtime_s"),
    ("learning-rate-minus-infinity", '{"framework": "jax", "optimizer": {"learning_rate": -Infinity}}', J, 422,
     "optimizer.learning_rate"),
    ("epochs-nan", '{"framework": "jax", "epochs": NaN}', J, 422, "epochs"),
    # unknown enum values
    ("framework-tensorflow", body(framework="tensorflow"), J, 422, "framework"),
    ("framework-upper-case", body(framework="JAX"), J, 422, "framework"),
    ("hardware-quantum", body(hardware="quantum"), J, 422, "hardware"),
    ("dataset-imagenet", body(dataset={"name": "imagenet"}), J, 422, "dataset.name"),
    ("optimizer-unknown", body(optimizer={"name": "rmsprop"}), J, 422, "optimizer.name"),  # sgd is valid since issue 9
    ("model-resnet", body(model={"name": "resnet"}), J, 422, "model.name"),
    ("unknown-field", body(learning_rate=0.1), J, 422, "learning_rate"),
    # deep or oversized bodies
    ("deep-labels", '{"framework": "jax", "labels": ' + DEEP + "}", J, 422, "TRAINHUB_MAX_JSON_DEPTH"),
    ("deep-array-body", DEEP, J, 422, "TRAINHUB_MAX_JSON_DEPTH"),
    ("deep-object-body", '{"a": ' * 1000 + "1" + "}" * 1000, J, 422, "TRAINHUB_MAX_JSON_DEPTH"),
    ("body-of-300-kb", body(name="x" * 300_000), J, 413, "TRAINHUB_MAX_BODY_BYTES"),
    ("33-labels", body(labels={f"k{i}": "v" for i in range(33)}), J, 422, "labels"),
    ("name-of-201-chars", body(name="n" * 201), J, 422, "name"),
    ("label-key-of-65-chars", body(labels={"k" * 65: "v"}), J, 422, "labels"),
    ("label-value-of-257-chars", body(labels={"k": "v" * 257}), J, 422, "labels.k"),
    # unicode refused cleanly where it would corrupt terminals, logs or pages
    ("name-with-nul", body(name="a\u0000b"), J, 422, "name"),
    ("name-with-rtl-override", body(name="evil\u202etxt.exe"), J, 422, "name"),
    ("name-with-ansi-escape", body(name="\u001b[31mred"), J, 422, "name"),
    ("name-with-newline", body(name="two\nlines"), J, 422, "name"),
    ("label-key-with-newline", body(labels={"a\nb": "c"}), J, 422, "labels"),
    ("label-key-blank", body(labels={" ": "c"}), J, 422, "labels"),
    ("name-lone-surrogate", '{"framework": "jax", "name": "\\ud800"}', J, 422, "name"),
    # empty bodies, wrong content types, not-a-spec JSON
    ("empty-body", "", J, 422, "no body: send a JSON object"),
    ("empty-body-no-content-type", "", None, 422, "no body: send a JSON object"),
    ("json-as-text-plain", body(), "text/plain", 422, "Content-Type: application/json (got 'text/plain')"),
    ("form-urlencoded", "framework=jax", "application/x-www-form-urlencoded", 422, "Content-Type: application/json"),
    ("xml", "<job><framework>jax</framework></job>", "application/xml", 422, "Content-Type: application/json"),
    ("multipart", "--x\r\nContent-Disposition: form-data; name=framework\r\n\r\njax\r\n--x--\r\n",
     "multipart/form-data; boundary=x", 422, "Content-Type: application/json"),
    ("json-null", "null", J, 422, "the body must be a JSON object"),
    ("json-array", "[]", J, 422, "the body must be a JSON object"),
    ("json-string", '"jax"', J, 422, "the body must be a JSON object"),
    ("truncated-json", '{"framework": "jax"', J, 422, "JSON"),
    ("not-utf-8", b'{"framework": "\xff\xfe"}', J, 422, "UTF-8"),
]


def described(detail) -> str:
    """The error as a person reads it: each item's field and message."""
    if isinstance(detail, str):
        return detail
    return "\n".join(".".join(str(p) for p in item.get("loc", [])[1:]) + ": " + item["msg"] for item in detail)


@pytest.mark.parametrize("content,content_type,status,words", [r[1:] for r in BAD_REQUESTS],
                         ids=[r[0] for r in BAD_REQUESTS])
def test_hostile_requests_are_4xx_with_a_useful_message_and_store_nothing(api, auth, content, content_type,
                                                                          status, words):
    from sqlalchemy import func, select

    from app.db import session_scope
    from app.models import Job

    def jobs() -> int:
        with session_scope() as session:
            return session.scalar(select(func.count()).select_from(Job))

    before = jobs()
    headers = {**auth, **({"Content-Type": content_type} if content_type else {})}
    response = api.post("/jobs", content=content, headers=headers)
    assert response.status_code == status, response.text[:500]
    message = described(response.json()["detail"])
    assert words in message, message[:500]
    assert len(response.content) < 20_000  # a bad input is not echoed back whole
    assert jobs() == before


def test_the_table_covers_the_issue(api):
    assert len(BAD_REQUESTS) >= 40
    assert len({r[0] for r in BAD_REQUESTS}) == len(BAD_REQUESTS)


@pytest.mark.parametrize("name", ["模型 🚀 très bien", "Ελληνικά", "مرحبا", "emoji 👩‍🔬", "tab-free ünïcödé"])
def test_unicode_names_and_labels_are_accepted_and_come_back_unchanged(api, auth, name):
    response = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}, "name": name,
                                       "labels": {name[:10]: name}}, headers=auth)
    assert response.status_code == 201, response.text
    job = api.get(f"/jobs/{response.json()['id']}", headers=auth).json()
    assert job["spec"]["name"] == name and job["spec"]["labels"] == {name[:10]: name}


def test_bf16_on_cpu_is_refused_with_a_clear_message(api, auth):
    """Issue 9: mixed precision needs gpu or tpu hardware."""
    response = api.post("/jobs", json={"framework": "jax", "hardware": "cpu", "precision": "bf16"}, headers=auth)
    assert response.status_code == 422
    assert "bf16" in response.text and "gpu or tpu" in response.text


@pytest.mark.parametrize("spec, loc", [
    ({"framework": "pytorch", "devices": 2, "batch_size": 127}, ["body", "batch_size"]),
    ({"framework": "pytorch", "devices": 2, "model": {"batch_norm": True}}, ["body", "model", "batch_norm"]),
    ({"framework": "pytorch", "devices": 2, "compile": True}, ["body", "compile"]),
    ({"framework": "jax", "precision": "bf16"}, ["body", "precision"]),
    ({"framework": "jax", "epochs": 2, "optimizer": {"schedule": "warmup_cosine", "warmup_epochs": 2}},
     ["body", "optimizer", "warmup_epochs"]),
    ({"framework": "jax", "model": {"name": "mlp", "channels": [8]}}, ["body", "model", "channels"]),
    ({"framework": "jax", "optimizer": {"name": "adam", "momentum": 0.9}}, ["body", "optimizer", "momentum"]),
])
def test_a_cross_field_check_points_at_the_field_to_change(api, auth, spec, loc):
    response = api.post("/jobs", json={"dataset": {"name": "digits"}, **spec}, headers=auth)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == loc, error


# Issue 16, item 13: every error names the fix.

def test_an_unknown_field_names_the_nearest_one(api, auth):
    response = api.post("/jobs", json={"framework": "jax", "epoch": 3, "model": {"hiden_sizes": [8]}}, headers=auth)
    assert response.status_code == 422
    messages = {tuple(e["loc"]): e["msg"] for e in response.json()["detail"]}
    assert "did you mean 'epochs'?" in messages[("body", "epoch")]
    assert "did you mean 'hidden_sizes'?" in messages[("body", "model", "hiden_sizes")]
    far = api.post("/jobs", json={"framework": "jax", "zzz": 1}, headers=auth).json()["detail"][0]["msg"]
    assert "the fields here are" in far and "batch_size" in far


def test_an_uploaded_datasets_id_given_as_its_name_is_told_to_use_id(api, auth):
    uploaded = "ds_" + "0" * 32
    response = api.post("/jobs", json={"framework": "jax", "dataset": {"name": uploaded}}, headers=auth)
    assert response.status_code == 422
    messages = [e["msg"] for e in response.json()["detail"]]
    assert any("give it as dataset.id" in m for m in messages), messages


def test_a_string_where_an_object_belongs_shows_the_object(api, auth):
    response = api.post("/jobs", json={"framework": "jax", "dataset": "digits"}, headers=auth)
    assert response.status_code == 422
    assert """write {"name": "digits"}""" in response.json()["detail"][0]["msg"]


def test_a_key_without_its_scheme_is_told_to_add_bearer(api, make_key):
    key = make_key("nobearer")
    response = api.get("/jobs", headers={"Authorization": key})
    assert response.status_code == 401
    assert "without 'Bearer ' before it" in response.json()["detail"] and key not in response.json()["detail"]
    other = api.get("/jobs", headers={"Authorization": f"Token {key}"}).json()["detail"]
    assert "must be Bearer, not 'Token'" in other and key not in other  # the secret is never echoed


def test_a_wrong_path_and_a_short_id_say_what_to_do(api, auth):
    response = api.get("/job/123", headers=auth)
    assert response.status_code == 404 and "/docs" in response.json()["detail"]
    short = api.get("/jobs/ab12", headers=auth)
    assert short.status_code == 404 and "first 8 characters" in short.json()["detail"]
    assert "first 8" not in api.get("/jobs/ab12ab12", headers=auth).json()["detail"]


# Issue 16, item 6: names and label keys must show something; invisible characters are refused.

@pytest.mark.parametrize("invisible", ["\u3164", "\u2800", "\u200b", "\u2060", "\ufeff", "\u180e",
                                       "\u3164\u3164", "\u200b\u200d", " \u00a0"])
def test_a_label_key_of_invisible_characters_is_refused(api, auth, invisible):
    response = api.post("/jobs", json={"framework": "jax", "labels": {invisible: "v"}}, headers=auth)
    assert response.status_code == 422, (repr(invisible), response.text)
    assert "visible" in response.text


@pytest.mark.parametrize("name", ["run\u200fone", "run\u061cone", "run\U000e0041one", "\u3164", "a\u2060b",
                                  "first\u2028second", "first\u2029second"])
def test_a_name_with_invisible_format_characters_is_refused(api, auth, name):
    response = api.post("/jobs", json={"framework": "jax", "name": name}, headers=auth)
    assert response.status_code == 422, (repr(name), response.text)


@pytest.mark.parametrize("name", ["résumé", "训练", "mlp 🧪", "👩\u200d🔬 run", "Ελληνικά"])
def test_visible_unicode_names_are_welcome(api, auth, name):
    response = api.post("/jobs", json={"framework": "jax", "name": name, "labels": {name: name}}, headers=auth)
    assert response.status_code == 201, response.text


# Issue 16, item 3: an invalid body's answer, and the work it causes, are bounded.

def test_a_body_of_thousands_of_keys_is_refused_before_validation(api, auth):
    import json as _json

    body = _json.dumps({"framework": "jax", **{f"k{i}": 1 for i in range(20000)}})
    response = api.post("/jobs", content=body, headers={**auth, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_too_many_keys" and len(response.content) < 1000


def test_a_422_lists_at_most_twenty_errors_and_says_how_many_it_left_out(api, auth):
    body = {"framework": "jax", **{f"unknown_{i}": 1 for i in range(200)}}
    response = api.post("/jobs", json=body, headers=auth)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert len(detail) == 21 and detail[-1]["type"] == "too_many_errors"
    assert detail[-1]["msg"].startswith("180 more errors left out")


def test_a_body_that_is_not_an_object_gets_no_name_hint(api, auth):
    response = api.post("/jobs", content='"hello"', headers={**auth, "Content-Type": "application/json"})
    assert response.status_code == 422 and '{"name"' not in response.text
    form = api.post("/jobs", content="framework=jax", headers={**auth, "Content-Type": "text/plain"})
    assert form.status_code == 422 and "Content-Type" in form.text and '{"name"' not in form.text
