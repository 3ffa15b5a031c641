"""The workers' dataset cache: downloads verified by sha256, hits, LRU eviction, concurrent fetches.
No database or network: datasets come from a local artifact store or an in-memory stream."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from app.storage import ArtifactMissing, LocalStore
from workers.dataset_cache import PARTIAL_PREFIX, DatasetCorrupt, Fetched, fetch

LOCATION = "/artifacts/datasets/whatever.safetensors"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dataset_bytes(values: bytes) -> bytes:
    """A safetensors file holding `values` (cache hits check a file is whole by its header)."""
    return save({"x": np.frombuffer(values, dtype=np.uint8)})


class Source:
    """An `open_stream` serving `downloads[i]` on the i-th call (the last one from then on), in
    chunks of `chunk` bytes, and counting its calls."""

    def __init__(self, *downloads: bytes, chunk: int = 7) -> None:
        self.downloads = downloads
        self.chunk = chunk
        self.calls = 0

    def __call__(self, location: str) -> Iterator[bytes]:
        data = self.downloads[min(self.calls, len(self.downloads) - 1)]
        self.calls += 1
        for i in range(0, len(data), self.chunk):
            yield data[i : i + self.chunk]


def cached(cache_dir: Path, data: bytes, mtime: float) -> Path:
    """Put `data` in the cache as if last used at `mtime` (seconds since the epoch)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{sha(data)}.safetensors"
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def entries(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.iterdir())


def test_round_trip_from_local_store_then_hit(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    stored = root / "datasets" / "mnist.safetensors"
    stored.parent.mkdir(parents=True)
    data = dataset_bytes(os.urandom(3 * (1 << 20) + 123))  # several of the store's 1 MiB chunks
    stored.write_bytes(data)
    store = LocalStore(root)
    calls: list[str] = []

    def open_stream(location: str) -> Iterator[bytes]:
        calls.append(location)
        return store.stream(location)

    cache_dir = tmp_path / "cache" / "datasets"  # created on demand
    miss = fetch(sha(data), str(stored), cache_dir, max_bytes=1 << 30, open_stream=open_stream)
    assert isinstance(miss, Fetched)
    assert miss.hit is False
    assert miss.path == cache_dir / f"{sha(data)}.safetensors"
    assert miss.path.read_bytes() == data
    assert miss.seconds >= 0
    assert calls == [str(stored)]
    assert entries(cache_dir) == [miss.path.name]  # no partial file left

    os.utime(miss.path, (1_000_000, 1_000_000))
    hit = fetch(sha(data), str(stored), cache_dir, max_bytes=1 << 30, open_stream=open_stream)
    assert hit.hit is True
    assert hit.path == miss.path
    assert calls == [str(stored)]  # not downloaded again
    assert hit.path.stat().st_mtime > time.time() - 60  # touched: now the most recently used


def test_default_stream_reads_the_configured_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.config import get_settings

    root = tmp_path / "artifacts"
    stored = root / "datasets" / "d.safetensors"
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"stored bytes")
    monkeypatch.setenv("TRAINHUB_ARTIFACT_DIR", str(root))
    monkeypatch.setenv("TRAINHUB_ARTIFACT_STORE", "local")
    get_settings.cache_clear()
    try:
        got = fetch(sha(b"stored bytes"), str(stored), tmp_path / "cache", max_bytes=100)
    finally:
        get_settings.cache_clear()
    assert got.path.read_bytes() == b"stored bytes"
    assert got.hit is False


def test_hash_mismatch_retries_once_then_raises_and_leaves_nothing(tmp_path: Path) -> None:
    expected = sha(b"the real dataset")
    source = Source(b"garbage")
    with pytest.raises(DatasetCorrupt) as info:
        fetch(expected, LOCATION, tmp_path, max_bytes=1000, open_stream=source)
    assert source.calls == 2
    assert info.value.expected == expected
    assert info.value.got == sha(b"garbage")
    assert expected in str(info.value) and sha(b"garbage") in str(info.value)
    assert entries(tmp_path) == []


def test_corrupt_download_then_good_one_succeeds(tmp_path: Path) -> None:
    data = b"the real dataset"
    source = Source(b"truncated", data)
    got = fetch(sha(data), LOCATION, tmp_path, max_bytes=1000, open_stream=source)
    assert source.calls == 2
    assert got.hit is False
    assert got.path.read_bytes() == data
    assert entries(tmp_path) == [got.path.name]


def test_stream_error_propagates_and_leaves_no_partial(tmp_path: Path) -> None:
    def missing(location: str) -> Iterator[bytes]:
        yield b"some bytes first"
        raise ArtifactMissing(location)

    with pytest.raises(ArtifactMissing):
        fetch(sha(b"x"), LOCATION, tmp_path, max_bytes=1000, open_stream=missing)
    assert entries(tmp_path) == []


def test_evicts_least_recently_used_first(tmp_path: Path) -> None:
    oldest = cached(tmp_path, b"a" * 10, mtime=1_000)
    middle = cached(tmp_path, b"b" * 10, mtime=2_000)
    newest = cached(tmp_path, b"c" * 10, mtime=3_000)
    data = b"d" * 10
    got = fetch(sha(data), LOCATION, tmp_path, max_bytes=25, open_stream=Source(data))  # 40 bytes -> 20
    assert not oldest.exists()
    assert not middle.exists()
    assert newest.exists()
    assert got.path.exists()


def test_hit_refreshes_lru_order(tmp_path: Path) -> None:
    a, b, data = (dataset_bytes(fill * 10) for fill in (b"a", b"b", b"c"))
    first = cached(tmp_path, a, mtime=1_000)
    second = cached(tmp_path, b, mtime=2_000)
    assert fetch(sha(a), LOCATION, tmp_path, max_bytes=3 * len(a), open_stream=Source(b"")).hit
    fetch(sha(data), LOCATION, tmp_path, max_bytes=2 * len(a), open_stream=Source(data))
    assert first.exists()  # used just now
    assert not second.exists()


def test_a_damaged_cache_entry_is_fetched_again(tmp_path: Path) -> None:
    data = dataset_bytes(b"d" * 100)
    entry = cached(tmp_path, data, mtime=1_000)
    entry.write_bytes(data[:-10])  # cut short, as a full disk or a crash may leave it
    source = Source(data)
    again = fetch(sha(data), LOCATION, tmp_path, max_bytes=10_000, open_stream=source)
    assert again.hit is False and source.calls == 1
    assert again.path.read_bytes() == data


def test_just_fetched_file_is_never_evicted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    other = cached(tmp_path, b"a" * 10, mtime=time.time() + 3600)  # even one that looks newer
    data = b"big" * 10
    with caplog.at_level(logging.WARNING, logger="workers.dataset_cache"):
        got = fetch(sha(data), LOCATION, tmp_path, max_bytes=5, open_stream=Source(data))
    assert got.path.read_bytes() == data
    assert not other.exists()
    assert entries(tmp_path) == [got.path.name]
    assert any("exceeds the cache limit" in r.getMessage() for r in caplog.records)


def test_within_limit_evicts_nothing(tmp_path: Path) -> None:
    kept = cached(tmp_path, b"a" * 10, mtime=1_000)
    data = b"b" * 10
    fetch(sha(data), LOCATION, tmp_path, max_bytes=20, open_stream=Source(data))
    assert kept.exists()


def test_removes_stale_partials_only(tmp_path: Path) -> None:
    stale = tmp_path / f"{PARTIAL_PREFIX}dead"
    stale.write_bytes(b"half")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    live = tmp_path / f"{PARTIAL_PREFIX}downloading"
    live.write_bytes(b"half")
    data = b"dataset"
    got = fetch(sha(data), LOCATION, tmp_path, max_bytes=1000, open_stream=Source(data))
    assert entries(tmp_path) == sorted([live.name, got.path.name])


def test_concurrent_fetches_of_one_dataset_both_end_with_the_file(tmp_path: Path) -> None:
    data = os.urandom(64 * 1024)
    both_downloading = threading.Barrier(2, timeout=10)

    def open_stream(location: str) -> Iterator[bytes]:
        yield data[:1000]
        both_downloading.wait()  # both threads are mid-download: neither has placed the file yet
        for i in range(1000, len(data), 4096):
            yield data[i : i + 4096]

    results: list[Fetched] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(fetch(sha(data), LOCATION, tmp_path, max_bytes=1 << 20, open_stream=open_stream))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert [r.hit for r in results] == [False, False]
    assert {r.path for r in results} == {tmp_path / f"{sha(data)}.safetensors"}
    assert results[0].path.read_bytes() == data
    assert entries(tmp_path) == [results[0].path.name]


@pytest.mark.parametrize(
    "bad",
    ["", "abc", "A" * 64, "g" * 64, "a" * 63, "a" * 65, "../" + "a" * 61, "a" * 63 + "\n", " " + "a" * 63],
)
def test_invalid_sha256_is_value_error(tmp_path: Path, bad: str) -> None:
    source = Source(b"data")
    with pytest.raises(ValueError):
        fetch(bad, LOCATION, tmp_path / "cache", max_bytes=1000, open_stream=source)
    assert source.calls == 0
    assert not (tmp_path / "cache").exists()
