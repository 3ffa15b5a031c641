"""Event streams held open, for the scale row: a process of its own, so the client does not share
the bench's interpreter.

    python -m bench.streams --url URL --key KEY --ids-file FILE --watch JOB_ID

Opens `GET /jobs/{id}/events` for every id of FILE (one a line) and for the watched job. When
every stream has sent its first event it prints `READY {"open", "failed", "open_s"}`, then
reads each stream (and discards what the idle ones send) until a line `stop` on stdin; then it
waits for the watched job's stream to end (after its final status; 30 s at most), closes the
rest and prints `BENCH_RESULT {json}`: when (time.time()) each `metrics` event of the watched
job arrived, by epoch, and how many streams were still open at the stop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time

import aiohttp

from bench.load import RESULT_PREFIX


async def read_stream(session: aiohttp.ClientSession, job_id: str, first: asyncio.Event,
                      on_event=None) -> None:
    """Read the job's stream until it ends; `first` is set at its first event. `on_event(id,
    event)` is called for each complete event."""
    async with session.get(f"/jobs/{job_id}/events") as response:
        response.raise_for_status()
        event_id, event = None, None
        async for raw in response.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("id:"):
                event_id = int(line[3:].strip())
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif not line and event is not None:  # the blank line that ends an event
                first.set()
                if on_event is not None:
                    on_event(event_id, event)
                event_id, event = None, None


async def run(url: str, key: str, ids: list[str], watch: str, ready_timeout_s: float) -> dict:
    arrived: dict[int, float] = {}

    def on_watched(event_id: int | None, event: str) -> None:
        if event == "metrics" and event_id is not None:
            arrived.setdefault(event_id - 1, time.time())  # metrics of epoch k have id 1 + k

    connector = aiohttp.TCPConnector(limit=0)  # every stream at once
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(base_url=url, headers={"Authorization": f"Bearer {key}"}, connector=connector,
                                     timeout=timeout) as session:
        started = time.perf_counter()
        firsts = [asyncio.Event() for _ in ids]
        watched_first = asyncio.Event()
        tasks = [asyncio.create_task(read_stream(session, job_id, first)) for job_id, first in zip(ids, firsts)]
        watched = asyncio.create_task(read_stream(session, watch, watched_first, on_watched))
        waiting = [asyncio.create_task(first.wait()) for first in [*firsts, watched_first]]
        await asyncio.wait(waiting, timeout=ready_timeout_s)
        open_s = time.perf_counter() - started
        failed = sum(1 for t in [*tasks, watched] if t.done() and t.exception() is not None)
        print("READY " + json.dumps({"open": sum(first.is_set() for first in firsts), "failed": failed,
                                     "watched_open": watched_first.is_set(), "open_s": open_s}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "stop"
        still_open = sum(1 for t in tasks if not t.done())
        try:
            await asyncio.wait_for(watched, timeout=30)
            watched_ended = True
        except (asyncio.TimeoutError, aiohttp.ClientError):
            watched_ended = False
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *waiting, return_exceptions=True)
    return {"streams": len(ids), "still_open_at_stop": still_open, "watched_ended": watched_ended,
            "metrics_arrived": arrived}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.streams")
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ids-file", required=True)
    parser.add_argument("--watch", required=True)
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    ids = [line.strip() for line in open(args.ids_file) if line.strip()]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket per stream
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, len(ids) + 256)), hard))
    result = asyncio.run(run(args.url, args.key, ids, args.watch, args.ready_timeout))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
