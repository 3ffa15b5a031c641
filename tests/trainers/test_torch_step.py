"""The compiled whole step (trainers.torch_step) and its hashed dropout masks (trainers.torch_masks):
the masks are a function of the key and keep the drop rate; the written-out update is
torch.optim's; a compiled run trains as eagerly, is reproducible, and covers schedules,
clipping and every optimizer."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from trainers import JobSpec, fit, torch_step
from trainers.spec import OptimizerSpec
from trainers.torch_masks import UniformDropout, hash32, hashed_dropout, uniform_dropouts
from trainers.torch_models import build, task_loss


def key(value: int) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int32)


def test_a_mask_is_a_function_of_its_key():
    x = torch.ones(128, 256)

    assert torch.equal(hashed_dropout(x, 0.2, key(7)), hashed_dropout(x, 0.2, key(7)))
    assert not torch.equal(hashed_dropout(x, 0.2, key(7)), hashed_dropout(x, 0.2, key(8)))


@pytest.mark.parametrize("rate", [0.1, 0.2, 0.5])
def test_a_mask_drops_the_rate_and_scales_what_it_keeps(rate):
    out = hashed_dropout(torch.ones(1000, 1000), rate, key(12345))

    assert (out == 0).float().mean().item() == pytest.approx(rate, abs=0.002)
    assert torch.unique(out[out != 0]).tolist() == [pytest.approx(1 / (1 - rate))]
    # Neighbouring keys (the layers of one step) and neighbouring elements are independent.
    other = hashed_dropout(torch.ones(1000, 1000), rate, key(12346))
    both = ((out == 0) & (other == 0)).float().mean().item()
    assert both == pytest.approx(rate * rate, abs=0.002)


@pytest.mark.parametrize("inplace", [False, True])
def test_a_users_dropout_gets_uniform_masks_of_the_same_rate(inplace):
    class Custom(torch.nn.Dropout):  # a subclass keeps its own code
        pass

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.3, inplace=inplace), Custom(0.5))
    state_dict = model.state_dict()

    assert uniform_dropouts(model) == 1
    assert type(model[1]) is UniformDropout and type(model[2]) is Custom
    assert model[1].p == 0.3 and model[1].inplace == inplace
    assert model.state_dict().keys() == state_dict.keys()
    x = torch.ones(1000, 1000)
    out = model[1](x)
    assert (out is x) == inplace
    assert (out == 0).float().mean().item() == pytest.approx(0.3, abs=0.002)
    assert torch.unique(out[out != 0]).tolist() == [pytest.approx(1 / 0.7)]
    model.eval()
    assert torch.equal(model[1](torch.ones(3, 3)), torch.ones(3, 3))


def test_a_user_module_trained_eagerly_on_the_cpu_gets_uniform_dropout(digits_spec):
    from torch import nn

    from trainers.base import RunOptions
    from trainers.torch_trainer import OneDevice, prepare
    from trainers.user_code import UserModel

    def build(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Dropout(0.2), nn.Linear(8, num_classes))

    model = {"code": "code_" + "0" * 32, "entrypoint": "m:build"}
    options = RunOptions(user_model=UserModel(build))
    cpu = OneDevice(torch.device("cpu"))
    eager = prepare(digits_spec("pytorch", model=model), cpu, options)
    compiled = prepare(digits_spec("pytorch", model=model, compile=True), cpu, options)
    assert type(eager.model[2]) is UniformDropout
    assert type(compiled.model[2]) is torch.nn.Dropout  # compiled: Inductor draws its own masks


def test_the_hash_is_a_bijection_on_a_range():
    values = hash32(torch.arange(-(2**16), 2**16, dtype=torch.int32))
    assert torch.unique(values).numel() == 2**17


def test_compiled_masks_equal_eager_ones():
    x = torch.randn(64, 32)
    compiled = torch.compile(hashed_dropout, fullgraph=True, dynamic=False)

    assert torch.equal(compiled(x, 0.2, key(99)), hashed_dropout(x, 0.2, key(99)))


OPTIMIZERS = [
    {"name": "adam"},
    {"name": "adam", "weight_decay": 0.01, "clip_norm": 0.5},
    {"name": "adamw", "weight_decay": 0.1},
    {"name": "sgd", "learning_rate": 0.1},
    {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01, "clip_norm": 1.0},
]


@pytest.mark.parametrize("options", OPTIMIZERS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_the_written_out_update_is_torch_optims(options):
    """whole_step (run eagerly here) takes the steps optimizer.step() takes, to float rounding."""
    opt = OptimizerSpec(**options)
    torch.manual_seed(0)
    x, y = torch.randn(32, 20), torch.randint(0, 5, (32,))
    ours, theirs = build_model(), build_model()
    theirs.load_state_dict(ours.state_dict())
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[opt.name]
    extra = {"momentum": opt.momentum, "nesterov": opt.nesterov} if opt.name == "sgd" else {}
    reference = cls(theirs.parameters(), lr=opt.learning_rate, weight_decay=opt.weight_decay, **extra)
    optimizer = cls(ours.parameters(), lr=opt.learning_rate, weight_decay=opt.weight_decay, **extra)
    params, state = [p.detach() for p in ours.parameters()], torch_step.optimizer_state(opt, optimizer)
    names = [name for name, _ in ours.named_parameters()]
    for t in range(1, 4):
        rates = torch.tensor(torch_step.rates_at(opt.learning_rate, t))
        loss, _ = torch_step.whole_step(ours, names, opt, nullcontext, "classification",
                                        params, state, x, y, key(0), rates)
        reference.zero_grad()
        expected = task_loss(theirs(x), y, "classification")
        expected.backward()
        if opt.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(theirs.parameters(), opt.clip_norm)
        reference.step()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for mine, want in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-6)
    # The state is torch.optim's own: checkpoints (optimizer.state_dict()) carry it.
    for p in ours.parameters():
        assert optimizer.state[p].keys() == reference.state[next(iter(theirs.parameters()))].keys()


def build_model():
    from trainers.spec import ModelSpec

    return build(ModelSpec(hidden_sizes=[16]), 20, 5)


@pytest.mark.parametrize("overrides", [
    {"model": {"dropout": 0.2}, "optimizer": {"schedule": "cosine", "clip_norm": 1.0}},
    {"optimizer": {"name": "sgd", "learning_rate": 0.05, "momentum": 0.9}},
    {"optimizer": {"name": "adamw", "weight_decay": 0.05}},
])
def test_a_compiled_run_trains_as_an_eager_one(overrides, digits_spec, tmp_path):
    eager = fit(digits_spec("pytorch", epochs=2, **overrides), tmp_path / "eager", lambda e, m: None)
    compiled = fit(digits_spec("pytorch", epochs=2, compile=True, **overrides), tmp_path / "compiled",
                   lambda e, m: None)
    again = fit(digits_spec("pytorch", epochs=2, compile=True, **overrides), tmp_path / "again",
                lambda e, m: None)

    assert compiled.timings["compilations"] == 1 and again.timings["compilations"] == 0
    assert compiled.result["test_accuracy"] == pytest.approx(eager.result["test_accuracy"], abs=0.03)
    assert compiled.metrics[-1].train_loss == pytest.approx(eager.metrics[-1].train_loss, rel=0.15)
    assert [m.learning_rate for m in compiled.metrics] == [m.learning_rate for m in eager.metrics]
    assert again.result == compiled.result  # reproducible from the spec


def test_batch_norm_and_user_code_keep_the_module_path(digits_spec):
    from trainers.torch_models import build as build_module

    spec = digits_spec("pytorch", compile=True, model={"batch_norm": True})
    assert not torch_step.supported(spec, build_module(spec.model, 64, 10), 1, False)
    plain = digits_spec("pytorch", compile=True)
    model = build_module(plain.model, 64, 10)
    assert torch_step.supported(plain, model, 1, False)
    assert not torch_step.supported(plain, model, 1, True)  # user code
    assert not torch_step.supported(plain, model, 2, False)  # data parallel
    assert not torch_step.supported(JobSpec(framework="pytorch"), model, 1, False)  # eager
    assert not torch_step.supported(JobSpec(framework="pytorch", compile=True, hardware="gpu"), model, 1, False)
