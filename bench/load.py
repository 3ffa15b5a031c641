"""The API load generator: a process of its own, so the load does not share the bench's interpreter.

    python -m bench.load post --url URL --key KEY --duration 10 --concurrency 16 --spec JSON
    python -m bench.load get  --url URL --key KEY --duration 10 --rate 200 --ids ID,ID,...

post: a closed loop of `concurrency` connections sending POST /jobs back to back for
`duration` seconds; counts the 201s (and every other status) and keeps the created ids.
get: an open loop offering GET /jobs/{id} at a steady `rate` per second for `duration` seconds,
whatever the answers' latency (requests are sent on schedule, not after the previous answer),
cycling over `ids`. Latency is measured from when a request is sent to its full answer; the
lag of each send behind its schedule is reported too, to show that the generator kept up.

Prints one line `BENCH_RESULT {json}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter

import aiohttp

RESULT_PREFIX = "BENCH_RESULT "


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by the nearest-rank method; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def _client(url: str, key: str, connections: int) -> aiohttp.ClientSession:
    # aiohttp rather than httpx: the load shares the machine's cores with the API it measures,
    # and httpx's client costs about 3 ms of CPU per request here, aiohttp's a fraction of it.
    return aiohttp.ClientSession(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 connector=aiohttp.TCPConnector(limit=connections),
                                 timeout=aiohttp.ClientTimeout(total=30))


async def post_load(url: str, key: str, duration_s: float, concurrency: int, spec: dict) -> dict:
    statuses: Counter[str] = Counter()
    ids: list[str] = []
    latencies: list[float] = []
    async with _client(url, key, concurrency) as client:
        start = time.perf_counter()
        deadline = start + duration_s

        async def connection() -> None:
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                try:
                    async with client.post("/jobs", json=spec) as response:
                        body = await response.read()
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    statuses[type(exc).__name__] += 1
                    continue
                latencies.append(time.perf_counter() - sent)
                statuses[str(response.status)] += 1
                if response.status == 201:
                    ids.append(json.loads(body)["id"])

        await asyncio.gather(*(connection() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {
        "mode": "post", "duration_s": elapsed, "concurrency": concurrency,
        "accepted": len(ids), "rate_per_s": len(ids) / elapsed, "statuses": dict(statuses),
        "p50_ms": _ms(percentile(latencies, 0.5)), "p99_ms": _ms(percentile(latencies, 0.99)), "ids": ids,
    }


async def get_load(url: str, key: str, duration_s: float, rate: float, ids: list[str]) -> dict:
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    lags: list[float] = []
    async with _client(url, key, 200) as client:

        async def get(job_id: str) -> int:
            async with client.get(f"/jobs/{job_id}") as response:
                await response.read()
                return response.status

        # A few requests first, so connections are open before the clock starts.
        await asyncio.gather(*(get(ids[i % len(ids)]) for i in range(8)))

        async def one(job_id: str, scheduled: float) -> None:
            sent = time.perf_counter()
            lags.append(sent - scheduled)
            try:
                status = await get(job_id)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                statuses[type(exc).__name__] += 1
                return
            latencies.append(time.perf_counter() - sent)
            statuses[str(status)] += 1

        total = int(duration_s * rate)
        tasks = []
        start = time.perf_counter()
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(ids[i % len(ids)], scheduled)))
        sending_s = time.perf_counter() - start
        await asyncio.gather(*tasks)
    return {
        "mode": "get", "offered_rate_per_s": rate, "requests": total, "sent_rate_per_s": total / sending_s,
        "statuses": dict(statuses),
        "p50_ms": _ms(percentile(latencies, 0.5)), "p90_ms": _ms(percentile(latencies, 0.9)),
        "p99_ms": _ms(percentile(latencies, 0.99)), "max_ms": _ms(max(latencies) if latencies else None),
        "send_lag_p99_ms": _ms(percentile(lags, 0.99)),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load")
    parser.add_argument("mode", choices=["post", "get"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--spec", default='{"framework": "jax"}')
    parser.add_argument("--ids", default="")
    args = parser.parse_args(argv)
    if args.mode == "post":
        result = asyncio.run(post_load(args.url, args.key, args.duration, args.concurrency, json.loads(args.spec)))
    else:
        ids = [i for i in args.ids.split(",") if i]
        if not ids:
            parser.error("get needs --ids")
        result = asyncio.run(get_load(args.url, args.key, args.duration, args.rate, ids))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
