"""`make demo`'s side-by-side table (app/demo.py)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from app.demo import side_by_side


def test_the_table_names_the_dataset_trained_on_and_each_frameworks_figures():
    def job(framework: str, accuracy: float) -> dict:
        spec = {"framework": framework, "dataset": {"name": "fashion-mnist"}}
        return {"id": framework, "status": "succeeded", "spec": spec,
                "timings": {"compile_s": 0.5, "first_epoch_s": 1.25, "steady_epoch_s": 0.75},
                "result": {"test_accuracy": accuracy}}

    console = Console(record=True, width=200)
    console.print(side_by_side([job("jax", 0.875), job("pytorch", 0.8825)], {"jax": Path("w/jax")}))
    text = console.export_text()
    assert "The seeds' MLP on fashion-mnist" in text and "MNIST MLP" not in text
    assert "0.8750" in text and "0.8825" in text and "w/jax" in text
