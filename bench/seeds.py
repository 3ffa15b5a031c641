"""The seeds' two training loops, as written in shared/seeds/, for the benchmark to compare against.

Nothing here is optimised: these are the baselines. They differ from trainhub's trainers on
purpose, exactly where the seeds differ:

- JAX seed: `init_params(key)` with He scale (`random.split(key, 3)`, `sqrt(2.0 / fan_in)`),
  a `@jax.jit` `train_step(params, opt_state, x, y)` with `jax.value_and_grad` and
  `optax.adam(1e-3)`, called from a Python loop over batches of 128 (the last one partial,
  so it compiles a second time in epoch 1) of a `random.permutation` drawn each epoch.
- PyTorch seed: `MNISTModel` (flatten, 784-256-128-10, ReLU, dropout 0.2), a
  `DataLoader(dataset, batch_size=128, shuffle=True)`, `nn.CrossEntropyLoss`,
  `torch.optim.Adam(lr=1e-3)`, `zero_grad()` / `backward()` / `step()` with PyTorch's default
  initialisation and thread count. The dataset is torchvision's `FashionMNIST(root,
  transform=ToTensor())`, as an introduction to PyTorch loads it (`for images, labels in
  train_loader`): each image is read as a PIL image and converted per sample. With
  `dataset="tensor"` it is a `TensorDataset` of the images already in memory instead, the
  fastest way a DataLoader can be fed: the benchmark shows that variant too, for reference.

Each epoch is timed over its training steps only, waited for on the device (the JAX loss is
blocked on; PyTorch on the CPU is synchronous). The test split is evaluated once, after the
last epoch, as the seeds do.
"""

from __future__ import annotations

import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BATCH_SIZE = 128
LEARNING_RATE = 1e-3


@dataclass
class LoopResult:
    """What a benchmarked loop produced: seconds per epoch (training only) and test accuracy."""

    epoch_times: list[float]
    test_accuracy: list[float]  # the seeds: one value, after the last epoch
    compile_s: float = 0.0
    compilations: int | None = None
    extra: dict = field(default_factory=dict)


def jax_seed(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
             epochs: int, seed: int = 0) -> LoopResult:
    """The seeds' JAX loop. x float32 [N, 784] in [0, 1], y int [N]."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax import random

    def init_params(key):
        k1, k2, k3 = random.split(key, 3)
        return {
            "w1": random.normal(k1, (784, 256)) * jnp.sqrt(2.0 / 784), "b1": jnp.zeros(256),
            "w2": random.normal(k2, (256, 128)) * jnp.sqrt(2.0 / 256), "b2": jnp.zeros(128),
            "w3": random.normal(k3, (128, 10)) * jnp.sqrt(2.0 / 128), "b3": jnp.zeros(10),
        }

    def forward(params, x):
        x = jax.nn.relu(x @ params["w1"] + params["b1"])
        x = jax.nn.relu(x @ params["w2"] + params["b2"])
        return x @ params["w3"] + params["b3"]

    def loss_fn(params, x, y):
        logits = forward(params, x)
        return -jnp.mean(jnp.sum(jax.nn.one_hot(y, 10) * jax.nn.log_softmax(logits), axis=-1))

    optimizer = optax.adam(learning_rate=LEARNING_RATE)

    @jax.jit
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    @jax.jit
    def accuracy(params, x, y):
        return jnp.mean(jnp.argmax(forward(params, x), axis=-1) == y)

    X_train, Y_train = jnp.asarray(x_train), jnp.asarray(y_train)
    X_test, Y_test = jnp.asarray(x_test), jnp.asarray(y_test)
    key = random.PRNGKey(seed)
    params = init_params(key)
    opt_state = optimizer.init(params)
    result = LoopResult([], [])
    for epoch in range(epochs):
        start = time.perf_counter()
        key, subkey = random.split(key)  # new key each epoch
        perm = random.permutation(subkey, len(X_train))
        for i in range(0, len(X_train), BATCH_SIZE):
            idx = perm[i : i + BATCH_SIZE]
            xb, yb = X_train[idx], Y_train[idx]
            params, opt_state, loss = train_step(params, opt_state, xb, yb)
        loss.block_until_ready()
        result.epoch_times.append(time.perf_counter() - start)
    result.test_accuracy.append(float(accuracy(params, X_test, Y_test)))
    result.compilations = train_step._cache_size()  # one per batch shape: 128, and the last batch's
    return result


def torch_seed(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
               epochs: int, seed: int = 0, dataset: str = "torchvision") -> LoopResult:
    """The seeds' PyTorch loop. x float32 [N, 784] in [0, 1], y int [N].

    dataset "torchvision": torchvision's FashionMNIST over IDX files written from x and y (so a
    train_limit applies), images converted per sample by ToTensor; "tensor": a TensorDataset
    of x as [N, 1, 28, 28] images.
    """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class MNISTModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.layers = nn.Sequential(
                nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.2),
                nn.Linear(256, 128), nn.ReLU(), nn.Dropout(0.2),
                nn.Linear(128, 10),
            )

        def forward(self, x):
            return self.layers(self.flatten(x))

    torch.manual_seed(seed)
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="bench-seed-data-") as root:
        if dataset == "torchvision":
            from torchvision import datasets, transforms

            write_fashion_mnist_idx(Path(root), x_train, y_train, x_test, y_test)
            train_data = datasets.FashionMNIST(root, train=True, download=False, transform=transforms.ToTensor())
            test_data = datasets.FashionMNIST(root, train=False, download=False, transform=transforms.ToTensor())
        else:
            train_data = TensorDataset(torch.tensor(x_train).view(-1, 1, 28, 28), torch.tensor(y_train, dtype=torch.int64))
            test_data = TensorDataset(torch.tensor(x_test).view(-1, 1, 28, 28), torch.tensor(y_test, dtype=torch.int64))
        train_loader = DataLoader(train_data, batch_size=BATCH_SIZE, shuffle=True)
        test_loader = DataLoader(test_data, batch_size=1000)

        model = MNISTModel().to(device)  # 784, 256, 128, 10
        criterion = nn.CrossEntropyLoss()  # takes raw logits
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        result = LoopResult([], [])
        for epoch in range(epochs):
            start = time.perf_counter()
            model.train()  # dropout on
            for images, labels in train_loader:
                images, labels = images.to(device), labels.to(device)
                optimizer.zero_grad()  # grads accumulate
                outputs = model(images)
                loss = criterion(outputs, labels)
                loss.backward()  # replays the tape
                optimizer.step()
            result.epoch_times.append(time.perf_counter() - start)

        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in test_loader:
                correct += (model(images.to(device)).argmax(dim=1) == labels.to(device)).sum().item()
        result.test_accuracy.append(correct / len(test_data))
    return result


def write_fashion_mnist_idx(root: Path, x_train, y_train, x_test, y_test) -> None:
    """Write the arrays as the raw IDX files torchvision's FashionMNIST reads from
    `root/FashionMNIST/raw/`: uint8 images [N, 28, 28] (x * 255, exact for MNIST-format data)
    and uint8 labels, each after a big-endian header (magic 0x0803 or 0x0801, then the dims)."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, x, y in (("train", x_train, y_train), ("t10k", x_test, y_test)):
        images = np.rint(np.asarray(x) * 255).astype(np.uint8).reshape(-1, 28, 28)
        labels = np.asarray(y).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 0x0803, *images.shape) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x0801, len(labels)) + labels.tobytes())
