"""The verdicts of issue 3 and the printed tables, from the measurements in results.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.user_code import USER_CODE_RATIO

# The targets, as issue 3 states them.
JAX_VS_SEED = 0.6          # JAX trainer steady epoch <= 0.6 x the seeds' JAX loop
TORCH_EAGER_VS_SEED = 0.85  # PyTorch trainer, eager, <= 0.85 x the seeds' PyTorch loop
TORCH_COMPILE_VS_SEED = 0.5  # ... with "compile": true, <= 0.5 x
# Issue 23's targets against the floor (the epoch's FLOPs at the machine's matmul rate).
FLOOR_LIMITS = {"jax_trainer": 1.10, "torch_trainer": 2.0, "torch_compile": 1.4}
CNN_VS_FLOOR = 2.0         # the JAX trainer's CNN epoch within 2 x the CNN's floor
ACCURACY_TOLERANCE = 0.01  # same final test accuracy as the seed loop to within 0.01
SERVICE_OVERHEAD_S = 1.0   # submit-to-succeeded minus setup_s + train_s, warm worker
COMPILE_CACHE_FRACTION = 0.25  # second identical JAX job's compile_s <= 25% of the first's
LINEAR_FACTOR, LINEAR_TOLERANCE = 4.0, 0.10  # 4 x the samples costs 4 x (+-10%) per epoch
RSS_TOLERANCE = 0.10       # worker RSS after 20 jobs within 10% of after the first
POST_RATE = 150.0          # accepted POST /jobs per second, for 10 s
GET_RATE, GET_P99_MS = 200.0, 25.0  # GET /jobs/{id} offered at 200/s: p99 <= 25 ms
UPLOAD_RSS_MB = 100.0      # the API's resident memory grows by < 100 MB while a 1 GB upload streams
# Issue 21's scale row (bench/scale.py).
SCALE_P99_FACTOR = 1.5     # each endpoint's p99 at the largest size within 1.5 x its p99 at the smallest
STREAMS_SLACK_PER_S = 1.0  # transactions/s with the streams open <= with none (+1/s: counts reach
                           # pg_stat_database within a second of a backend going idle)
EVENT_DELAY_P99_MS = 100.0  # an epoch stored -> its `metrics` event at the client, p99
# Issue 23's small-jobs and cold-start rows (bench/small_jobs.py, bench/cold_start.py).
SMALL_JOBS_PER_S = 10.0    # one-epoch digits MLP jobs a second, one cpu worker, over 100 jobs
ONLINE_S = 3.0             # a fresh worker's heartbeat visible within 3 s of its start
FIRST_EPOCH_SLACK_S = 2.0  # the first job on a fresh worker: its first epoch within 2 s + its train time

# The seed each trainer loop is held against.
SEED_OF = {"jax_trainer": "jax_seed", "torch_trainer": "torch_seed", "torch_compile": "torch_seed",
           "torch_seed_tensor": "torch_seed"}
LOOP_TITLES = {
    "jax_seed": "seeds' JAX loop (jit step, Python loop)",
    "jax_trainer": "trainhub JAX trainer (scan, AOT)",
    "torch_seed": "seeds' PyTorch loop (DataLoader)",
    "torch_seed_tensor": "  same, over a TensorDataset (ref.)",
    "torch_trainer": "trainhub PyTorch trainer, eager",
    "torch_compile": "trainhub PyTorch trainer, compile",
}
CNN_TITLES = {"jax_cnn": "trainhub JAX trainer (flax, scan)", "torch_cnn": "trainhub PyTorch trainer, eager"}
RESNET_TITLES = {"jax_resnet8": "trainhub JAX trainer (flax, scan)",
                 "torch_resnet8": "trainhub PyTorch trainer, eager"}


@dataclass
class Criterion:
    """One target of the issue: passed is True/False, or None when it could not be measured."""

    name: str
    target: str
    measured: str
    passed: bool | None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def floor_criterion(label: str, steady_s: float | None, floor_s: float | None, limit: float,
                    note: str = "") -> Criterion:
    """A steady epoch (s) against a floor (s): passed when steady_s <= limit x floor_s."""
    if steady_s is None or not floor_s:
        return Criterion(label, f"<= {limit:g} x floor", "not measured", None)
    return Criterion(label, f"<= {limit:g} x floor",
                     f"{steady_s:.3f} s vs floor {floor_s:.3f} s = {steady_s / floor_s:.2f} x",
                     steady_s / floor_s <= limit, note)


def step_matmuls_s(results: dict) -> dict[str, float]:
    """{"torch"|"jax": seconds an epoch} of the MLP step's matmuls alone (bench.loops.step_matmuls_ms
    x the epoch's steps of 128); empty for a results file from before the probe."""
    step_ms = results.get("machine", {}).get("step_matmuls_ms") or {}
    steps = results.get("floor", {}).get("samples", 0) // 128
    return {fw: ms * steps / 1e3 for fw, ms in step_ms.items()}


def step_matmuls_line(results: dict) -> str:
    alone, floor_s = step_matmuls_s(results), results["floor"]["floor_s"]
    if not alone:
        return "the step's matmuls alone: not measured"
    return ("the step's matmuls alone (batch 128, bench.loops.step_matmuls_ms): " + ", ".join(
        f"{fw} {s:.3f} s/epoch = {s / floor_s:.2f} x floor" for fw, s in sorted(alone.items(), reverse=True)))


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def criteria(results: dict) -> list[Criterion]:
    """Judge every target from `results`; a target whose part was skipped has passed=None."""
    out: list[Criterion] = []
    loops = results.get("loops", {})
    floor_s = results.get("floor", {}).get("floor_s")

    def steady(name: str) -> float | None:
        return loops.get(name, {}).get("steady_s")

    def ratio_criterion(name: str, limit: float, label: str) -> None:
        mine, seed = steady(name), steady(SEED_OF[name])
        if mine is None or seed is None:
            out.append(Criterion(label, f"<= {limit} x seed", "not measured", None))
            return
        ratio = mine / seed
        note = ""
        reference = steady("torch_seed_tensor") if SEED_OF[name] == "torch_seed" else None
        if reference:
            note = (f"against the seed's loop over a TensorDataset instead ({reference:.3f} s): "
                    f"{mine / reference:.2f} x")
        out.append(Criterion(label, f"<= {limit} x seed", f"{mine:.3f} s vs {seed:.3f} s = {ratio:.2f} x",
                             ratio <= limit, note))

    ratio_criterion("jax_trainer", JAX_VS_SEED, "JAX trainer steady epoch vs seeds' JAX loop")
    ratio_criterion("torch_trainer", TORCH_EAGER_VS_SEED, "PyTorch trainer (eager) steady epoch vs seed")
    ratio_criterion("torch_compile", TORCH_COMPILE_VS_SEED, "PyTorch trainer (compile) steady epoch vs seed")
    alone = step_matmuls_s(results)
    for name, limit in FLOOR_LIMITS.items():
        framework = "jax" if name.startswith("jax") else "torch"
        mine = steady(name)
        note = "" if mine is None or framework not in alone else (
            f"the step's matmuls alone take {alone[framework]:.3f} s an epoch in {framework} "
            f"({alone[framework] / floor_s:.2f} x floor): this loop is {mine / alone[framework]:.2f} x them")
        out.append(floor_criterion(f"{LOOP_TITLES[name].removeprefix('trainhub ')} steady epoch vs floor",
                                   mine, floor_s, limit, note))
    eager, compiled = steady("torch_trainer"), steady("torch_compile")
    out.append(Criterion(
        "PyTorch trainer with compile faster than eager", "compile < eager",
        "not measured" if eager is None or compiled is None else
        f"{compiled:.3f} s vs {eager:.3f} s = {compiled / eager:.2f} x",
        None if eager is None or compiled is None else compiled < eager))
    cnn = results.get("cnn", {})
    out.append(floor_criterion("JAX trainer CNN steady epoch vs the CNN's floor",
                               cnn.get("loops", {}).get("jax_cnn", {}).get("steady_s"),
                               cnn.get("floor", {}).get("floor_s"), CNN_VS_FLOOR))

    for name in ("jax_trainer", "torch_trainer", "torch_compile"):
        mine, seed = loops.get(name, {}).get("test_accuracy"), loops.get(SEED_OF[name], {}).get("test_accuracy")
        label = f"final test accuracy, {LOOP_TITLES[name].removeprefix('trainhub ')} vs seed"
        if mine is None or seed is None:
            out.append(Criterion(label, f"|diff| <= {ACCURACY_TOLERANCE}", "not measured", None))
        else:
            out.append(Criterion(label, f"|diff| <= {ACCURACY_TOLERANCE}",
                                 f"{mine:.4f} vs {seed:.4f} (diff {mine - seed:+.4f})",
                                 abs(mine - seed) <= ACCURACY_TOLERANCE))

    service = results.get("service", {})
    warm = service.get("warm_jobs", {})
    if warm:
        for kind, job in warm.items():
            overhead = job.get("overhead_s")
            out.append(Criterion(
                f"service overhead, warm worker, {kind} job", f"<= {SERVICE_OVERHEAD_S} s",
                "job failed" if overhead is None else
                f"{job['submit_to_done_s']:.3f} s submit-to-succeeded - {job['timings']['setup_s']:.3f} setup_s "
                f"- {job['timings']['train_s']:.3f} train_s = {overhead:.3f} s",
                None if overhead is None else overhead <= SERVICE_OVERHEAD_S,
                note=job.get("breakdown", ""),
            ))
    else:
        out.append(Criterion("service overhead, warm worker", f"<= {SERVICE_OVERHEAD_S} s", "not measured", None,
                             note=service.get("skipped", "")))
    user = service.get("user_code")
    label = "user-code MLP's steady s/epoch, warm worker"
    if user:
        out.append(Criterion(
            label, f"<= {USER_CODE_RATIO:g} x the built-in pytorch job's",
            f"{user['steady_epoch_s']:.4f} s vs {user['builtin_steady_epoch_s']:.4f} s = {user['ratio']:.2f} x",
            user["ratio"] <= USER_CODE_RATIO,
            note=f"medians of {len(user.get('builtin_jobs', [])) or 1} pair(s) of jobs run in turn; child process "
                 f"start cost: {user['child_start_s']:.3f} s (its overhead_s minus the built-in job's)",
        ))
    else:
        out.append(Criterion(label, f"<= {USER_CODE_RATIO:g} x the built-in pytorch job's", "not measured", None,
                             note=service.get("skipped", "")))
    cache = service.get("compile_cache")
    if cache:
        first, second = cache["first_compile_s"], cache["second_compile_s"]
        out.append(Criterion("second identical JAX job's compile_s", f"<= {COMPILE_CACHE_FRACTION:.0%} of the first's",
                             f"{second:.3f} s vs {first:.3f} s = {second / first:.0%}",
                             second <= COMPILE_CACHE_FRACTION * first))
    else:
        out.append(Criterion("second identical JAX job's compile_s", f"<= {COMPILE_CACHE_FRACTION:.0%} of the first's",
                             "not measured", None, note=service.get("skipped", "")))

    for framework, lin in results.get("linearity", {}).items():
        ratio = lin.get("ratio")
        low, high = LINEAR_FACTOR * (1 - LINEAR_TOLERANCE), LINEAR_FACTOR * (1 + LINEAR_TOLERANCE)
        out.append(Criterion(
            f"cost linear in samples, {framework}", f"{LINEAR_FACTOR:g} x samples -> {low:.1f}..{high:.1f} x per epoch",
            "not measured" if ratio is None else
            f"{lin['small_s']:.3f} s ({lin['small_n']}) -> {lin['large_s']:.3f} s ({lin['large_n']}) at best; "
            f"each round {', '.join(f'{r:.2f}' for r in lin.get('round_ratios', [ratio]))} x: median {ratio:.2f} x",
            None if ratio is None else low <= ratio <= high))

    rss = service.get("rss")
    if rss:
        growth = rss["last_bytes"] / rss["first_bytes"] - 1
        out.append(Criterion(
            f"worker RSS after {rss['jobs']} consecutive jobs", f"within {RSS_TOLERANCE:.0%} of after the first",
            f"{rss['first_bytes'] / 2**20:.0f} MiB -> {rss['last_bytes'] / 2**20:.0f} MiB ({growth:+.1%})",
            abs(growth) <= RSS_TOLERANCE, note=rss.get("note", "")))
    else:
        out.append(Criterion("worker RSS after 20 consecutive jobs", f"within {RSS_TOLERANCE:.0%}", "not measured",
                             None, note=service.get("skipped", "")))

    out.append(upload_rss_criterion(results))
    out.extend(scale_criteria(results))

    api = results.get("api", {})
    post, integrity, get = api.get("post"), api.get("integrity"), api.get("get")
    if post and integrity:
        out.append(Criterion("POST /jobs accepted rate", f">= {POST_RATE:g}/s for {post['duration_s']:.0f} s",
                             f"{post['rate_per_s']:.0f}/s ({post['accepted']} in {post['duration_s']:.1f} s, "
                             f"p50 {_fmt(post['p50_ms'], 1)} ms, p99 {_fmt(post['p99_ms'], 1)} ms; "
                             f"statuses {post['statuses']})",
                             post["rate_per_s"] >= POST_RATE,
                             note="the bench raises the per-key quotas for this: "
                                  + ", ".join(f"{k}={v}" for k, v in api.get("quotas", {}).items())))
        out.append(Criterion("every accepted job stored and queued exactly once", "exactly once",
                             f"{integrity['accepted']} accepted, {integrity['stored']} stored, "
                             f"{integrity['queued_messages']} queued", integrity["exactly_once"]))
    else:
        out.append(Criterion("POST /jobs accepted rate", f">= {POST_RATE:g}/s", "not measured", None,
                             note=api.get("skipped", "")))
    if get and "p99_ms" in get:
        answered = get["statuses"] == {"200": get["requests"]}
        # Offered below the target's rate (--quick), the latency is not judged; the answers still are.
        judged = get["offered_rate_per_s"] >= GET_RATE
        out.append(Criterion(f"GET /jobs/{{id}} p99 at {get['offered_rate_per_s']:g}/s offered", f"<= {GET_P99_MS:g} ms",
                             f"p50 {_fmt(get['p50_ms'], 1)} ms, p99 {_fmt(get['p99_ms'], 1)} ms "
                             f"(sent {get['sent_rate_per_s']:.0f}/s, statuses {get['statuses']})",
                             (get["p99_ms"] is not None and get["p99_ms"] <= GET_P99_MS and answered) if judged
                             else (None if answered else False),
                             note="" if judged else f"latency not judged: offered under the target's "
                                                    f"{GET_RATE:g}/s (quick sizes)"
                                                    + ("" if answered else "; some answers were not 200")))
    else:
        out.append(Criterion(f"GET /jobs/{{id}} p99 at {GET_RATE:g}/s offered", f"<= {GET_P99_MS:g} ms",
                             "not measured", None, note=(get or {}).get("error") or api.get("skipped", "")))
    out.extend(small_jobs_criteria(results))
    return out


def scale_criteria(results: dict) -> list[Criterion]:
    """Issue 21's targets from the scale row: each endpoint's p99 at the largest size against the
    smallest, the database's transactions/s with the streams open and idle, the epoch-to-event delay."""
    from bench.scale import TARGETED

    scale = results.get("scale", {})
    sizes = scale.get("sizes", [])
    target = f"<= {SCALE_P99_FACTOR:g} x"
    out = []
    for name in TARGETED:
        label = f"scale: {name} p99 at the most jobs stored vs the fewest"
        if len(sizes) < 2:
            out.append(Criterion(label, target, "not measured", None, note=scale.get("skipped", "")))
            continue
        last = sizes[-1]
        # the reference, timed request by request alongside (a run before it had none: the first size's)
        at_first = (last.get("reference") or sizes[0]["endpoints"])[name]
        first_jobs = scale.get("config", {}).get("sizes", [sizes[0]["jobs"]])[0]
        at_last = last["endpoints"][name]
        small, large = at_first["p99_ms"], at_last["p99_ms"]
        out.append(Criterion(
            label.replace("the most jobs stored vs the fewest", f"{last['jobs']:,} jobs vs {first_jobs:,}"), target,
            f"{large:.1f} ms vs {small:.1f} ms = {large / small:.2f} x ({at_last['requests']} requests each, taking "
            f"turns; p50 {at_last['p50_ms']:.1f} vs {at_first['p50_ms']:.1f} ms)",
            large <= SCALE_P99_FACTOR * small))
    streams = scale.get("streams")
    label = "scale: database transactions/s with the streams open and idle"
    stream_target = f"<= with none open (+{STREAMS_SLACK_PER_S:g}/s)"
    delay_label, delay_target = "scale: epoch stored -> its metrics event at the client, p99", \
        f"< {EVENT_DELAY_P99_MS:g} ms"
    if not streams:
        note = scale.get("skipped") or scale.get("streams_error", "")
        return [*out, Criterion(label, stream_target, "not measured", None, note=note),
                Criterion(delay_label, delay_target, "not measured", None, note=note)]
    none_open, open_idle, opened = streams["none_open"]["per_s"], streams["open_idle"]["per_s"], streams["opened"]
    out.append(Criterion(
        label.replace("the streams", f"{opened['open']} of {streams['streams']} streams"), stream_target,
        f"{open_idle:.1f}/s open vs {none_open:.1f}/s none open ({streams['open_idle']['window_s']:.0f} s windows)",
        opened["open"] == streams["streams"] and open_idle <= none_open + STREAMS_SLACK_PER_S,
        note="xact_commit + xact_rollback of the service's database in pg_stat_database; every query of the API "
             "runs in a transaction, so this counts at least one per query round trip"))
    delay = streams["epoch_to_event"]
    out.append(Criterion(
        delay_label, delay_target,
        "n/a" if delay["p99_ms"] is None else
        f"p50 {delay['p50_ms']:.1f} ms, p99 {delay['p99_ms']:.1f} ms, max {delay['max_ms']:.1f} ms "
        f"({delay['received']} of {delay['stored']} epochs received, {opened['open']} streams open)",
        delay["p99_ms"] is not None and delay["received"] == delay["stored"] and delay["p99_ms"] < EVENT_DELAY_P99_MS))
    return out


def scale_table(results: dict) -> list[str]:
    """The scale row: each endpoint's p50/p99 (ms) at each size, the stream figures under it."""
    scale = results.get("scale", {})
    sizes = scale.get("sizes", [])
    if not sizes:
        return []
    from bench.scale import ENDPOINTS

    header = f"{'scale: jobs stored (10 epochs each)':<36}" + "".join(f"{row['jobs']:>20,}" for row in sizes)
    lines = [header, f"{'  p50 / p99 ms':<36}" + "".join(f"{'':>20}" for _ in sizes), "-" * len(header)]
    for part in ("endpoints", "reference"):
        if part == "reference":
            if not any(row.get("reference") for row in sizes):
                continue
            first = scale.get("config", {}).get("sizes", [sizes[0]["jobs"]])[0]
            lines.append(f"the {first:,}-job reference database, timed alongside each size (request by request):")
        for name in ENDPOINTS:
            cells = []
            for row in sizes:
                timing = (row.get(part) or {}).get(name)
                cells.append(f"{timing['p50_ms']:.1f} / {timing['p99_ms']:.1f}" if timing else "n/a")
            lines.append(f"{name:<36}" + "".join(f"{cell:>20}" for cell in cells))
    lines.append(f"{'bulk insert + tallies + vacuum, s':<36}"
                 + "".join(f"{row['growth']['total_s']:>20.0f}" for row in sizes))
    lines.append(f"{'database size, MB':<36}"
                 + "".join(f"{row['stored']['database_bytes'] / 1e6:>20.0f}" for row in sizes))
    if streams := scale.get("streams"):
        delay = streams["epoch_to_event"]
        lines.append(f"streams: {streams['opened']['open']} of {streams['streams']} open in "
                     f"{streams['opened']['open_s']:.1f} s; database transactions/s "
                     f"{streams['none_open']['per_s']:.1f} none open, {streams['open_idle']['per_s']:.1f} open and "
                     f"idle; epoch -> event p50 "
                     f"{_fmt(delay['p50_ms'], 1)} ms, p99 {_fmt(delay['p99_ms'], 1)} ms")
    return lines


def upload_rss_criterion(results: dict) -> Criterion:
    """The API's RSS growth while the large upload streamed; a FAIL flags an upload held in memory."""
    datasets = results.get("datasets", {})
    stream = datasets.get("stream")
    target = f"< {UPLOAD_RSS_MB:g} MB"
    if not stream:
        return Criterion("API RSS growth during a large upload", target, "not measured", None,
                         note=datasets.get("skipped", ""))
    growth_mb = stream["rss_growth_bytes"] / 1e6
    return Criterion(
        f"API RSS growth during a {stream['bytes'] / 1e6:.0f} MB upload", target,
        f"{growth_mb:+.1f} MB (the most any of the {stream['api_processes']} uvicorn processes grew, "
        f"worst of {stream['rounds']} upload(s))",
        growth_mb < UPLOAD_RSS_MB, note=stream["what"])


def datasets_table(results: dict) -> list[str]:
    """The upload rows (each rate against cp of the same file on the same disk, same run) and the
    dataset cache's cold and warm data_s."""
    datasets = results.get("datasets", {})
    stream, valid, cache = datasets.get("stream"), datasets.get("valid"), datasets.get("data_cache")
    if not (stream or valid or cache):
        return []
    header = (f"{'upload':<40} {'MB':>7} {'seconds':>8} {'MB/s':>7} {'cp MB/s':>8} {'x cp':>6} "
              f"{'API RSS +MB':>11}")
    lines = [header, "-" * len(header)]
    titles = (("stream", "body to disk + sha256 (422; no validation)"),
              ("valid", "valid CSV, end to end (201)"))
    for key, title in titles:
        if row := datasets.get(key):
            flag = " (over the limit)" if key == "stream" and row["rss_growth_bytes"] >= UPLOAD_RSS_MB * 1e6 else ""
            lines.append(f"{title:<40} {row['bytes'] / 1e6:>7.0f} {row['upload_s']:>8.2f} {row['rate_mb_s']:>7.0f} "
                         f"{row['cp_rate_mb_s']:>8.0f} {row['vs_cp']:>6.2f} {row['rss_growth_bytes'] / 1e6:>11.1f}"
                         f"{flag}")
    if stream:
        lines.append(f"x cp: the upload's rate over cp's of the same file into the API's upload folder, "
                     f"best of {stream['rounds']} each (same run)")
        lines.append(f"the first row: {stream['what']}")
    if cache:
        lines.append(f"dataset cache ({cache['dataset_bytes'] / 1e6:.1f} MB stored form): data_s cold (miss) "
                     f"{_fmt(cache['cold_data_s'], 4)} s, warm (hit) {_fmt(cache['warm_data_s'], 4)} s, "
                     f"warm/cold {_fmt(cache['warm_vs_cold'], 4)}; data_cache_hit {cache['hits']}")
    return lines


def _loop_header(first: str, ratio: str) -> list[str]:
    header = (f"{first:<38} {'compile s':>9} {'1st epoch':>9} {'steady s':>9} {'test acc':>8} "
              f"{ratio:>7} {'x floor':>7} {'compiles':>8}")
    return [header, "-" * len(header)]


def _loop_row(title: str, loop: dict, ratio: float | None, floor_s: float | None) -> str:
    return (f"{title:<38} {_fmt(loop.get('compile_s'), 2):>9} {loop['first_epoch_s']:>9.3f} {loop['steady_s']:>9.3f} "
            f"{loop['test_accuracy']:>8.4f} {_fmt(ratio, 2):>7} "
            f"{_fmt(loop['steady_s'] / floor_s if floor_s else None, 2):>7} {str(loop.get('compilations')):>8}")


def loop_table(results: dict) -> list[str]:
    loops = results.get("loops", {})
    floor_s = results.get("floor", {}).get("floor_s")
    lines = _loop_header("loop", "vs seed")
    for name, title in LOOP_TITLES.items():
        if loop := loops.get(name):
            seed = loops.get(SEED_OF.get(name, name), {})
            ratio = loop["steady_s"] / seed["steady_s"] if seed.get("steady_s") else None
            lines.append(_loop_row(title, loop, ratio, floor_s))
    return lines


def cnn_table(results: dict) -> list[str]:
    """The CNN rows: both trainers on the same CNN spec, each against the CNN's own floor (its
    FLOPs at the measured matmul rate), and each steady epoch over JAX's."""
    cnn = results.get("cnn", {})
    loops = cnn.get("loops", {})
    if not loops:
        return []
    floor_s = cnn.get("floor", {}).get("floor_s")
    jax_s = loops.get("jax_cnn", {}).get("steady_s")
    lines = [f"CNN {cnn['model']}, {cnn['samples']} samples, {cnn['epochs']} epochs; floor "
             f"{_fmt(floor_s)} s/epoch ({cnn['floor']['flops'] / 1e9:.0f} GFLOP)", *_loop_header("CNN loop", "x JAX")]
    for name, title in CNN_TITLES.items():
        if loop := loops.get(name):
            lines.append(_loop_row(title, loop, loop["steady_s"] / jax_s if jax_s else None, floor_s))
    return lines


def resnet_table(results: dict) -> list[str]:
    """The resnet8 rows: both trainers on the resnet8 preset, each against the model's own floor
    (3 x its forward FLOPs per example x samples, at the measured matmul rate), and each steady
    epoch over PyTorch's (the JAX row's is the JAX/PyTorch ratio)."""
    resnet = results.get("resnet8", {})
    loops = resnet.get("loops", {})
    if not loops:
        return []
    floor = resnet.get("floor", {})
    floor_s = floor.get("floor_s")
    torch_s = loops.get("torch_resnet8", {}).get("steady_s")
    forward = floor.get("forward_flops_per_example")
    lines = [f"resnet8 ({floor.get('parameters', 'n/a')} parameters), {resnet['samples']} samples, "
             f"{resnet['epochs']} epochs x {resnet.get('rounds', 1)} round(s); JAX/PyTorch "
             f"{_fmt(resnet.get('jax_over_pytorch'), 2)} x",
             f"floor {_fmt(floor_s)} s/epoch: {_fmt(floor['flops'] / 1e9 if floor.get('flops') else None, 1)} GFLOP "
             f"= 3 x {_fmt(forward / 1e6 if forward else None, 2)} MFLOP forward an example x {resnet['samples']}",
             *_loop_header("resnet8 loop", "x torch")]
    for name, title in RESNET_TITLES.items():
        if loop := loops.get(name):
            lines.append(_loop_row(title, loop, loop["steady_s"] / torch_s if torch_s else None, floor_s))
    return lines


def service_table(results: dict) -> list[str]:
    service = results.get("service", {})
    jobs = service.get("jobs", [])
    if not jobs:
        return []
    header = (f"{'service job':<24} {'compile_s':>9} {'setup_s':>8} {'train_s':>8} {'eval+ckpt':>9} "
              f"{'submit->done':>12} {'overhead':>8}")
    lines = [header, "-" * len(header)]
    for job in jobs:
        t = job.get("timings", {})
        lines.append(
            f"{job['label']:<24} {_fmt(t.get('compile_s'), 3):>9} {_fmt(t.get('setup_s'), 3):>8} "
            f"{_fmt(t.get('train_s'), 3):>8} {_fmt((t.get('eval_s') or 0) + (t.get('checkpoint_s') or 0), 3):>9} "
            f"{_fmt(job.get('submit_to_done_s'), 3):>12} {_fmt(job.get('overhead_s'), 3):>8}"
        )
    return lines


def criteria_lines(items: list[Criterion]) -> list[str]:
    lines = []
    for c in items:
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[c.passed]
        lines.append(f"[{verdict}] {c.name}: {c.measured} (target {c.target})")
        if c.note:
            lines.append(f"       {c.note}")
    return lines


def small_jobs_criteria(results: dict) -> list[Criterion]:
    """Issue 23's targets from part 9: jobs a second per framework (small-jobs); for each kind of
    first job on a fresh worker, the time to online, to the first epoch, and that the other
    framework was not imported (cold-start)."""
    from bench.small_jobs import FRAMEWORKS

    out = []
    small = results.get("small_jobs", {})
    for framework in FRAMEWORKS:
        label = f"small-jobs: one-epoch digits {framework} jobs a second, one cpu worker"
        target = f">= {SMALL_JOBS_PER_S:g}/s"
        row = small.get("frameworks", {}).get(framework)
        if not row:
            out.append(Criterion(label, target, "not measured", None, note=small.get("skipped", "")))
            continue
        m = row["means"]
        out.append(Criterion(
            label, target,
            f"{row['jobs_per_s']:.1f}/s ({row['jobs']} jobs in {row['span_s']:.2f} s; {row['per_job_s'] * 1e3:.0f} ms "
            f"a job, of which train {m['train_s'] * 1e3:.0f} ms, overhead {row['overhead_s'] * 1e3:.0f} ms)",
            row["jobs_per_s"] >= SMALL_JOBS_PER_S,
            note="per job, ms: " + ", ".join(f"{k.removesuffix('_s')} {v * 1e3:.1f}" for k, v in m.items())
                 + f", other {row['other_s'] * 1e3:.1f} (HTTP, broker, Celery, spec read, end writes)"))
    cold = results.get("cold_start", {})
    from bench.cold_start import KINDS, WARM_KINDS

    for kind, _, _ in (*KINDS, *WARM_KINDS):
        row = cold.get("kinds", {}).get(kind)
        names = (f"cold-start: a fresh worker online (heartbeat in GET /workers), then a {kind} job",
                 f"cold-start: the first {kind} job on a fresh worker, submit to its first epoch",
                 f"cold-start: the {kind} job's worker loaded only its own framework")
        targets = (f"<= {ONLINE_S:g} s", f"<= {FIRST_EPOCH_SLACK_S:g} s + its train time", "the other one not loaded")
        if not row:
            out.extend(Criterion(n, t, "not measured", None, note=cold.get("skipped", "")) for n, t in zip(names, targets))
            continue
        t = row["timings"]
        out.append(Criterion(names[0], targets[0], f"{row['online_s']:.2f} s", row["online_s"] <= ONLINE_S))
        out.append(Criterion(
            names[1], targets[1],
            f"{row['first_epoch_s']:.2f} s vs {FIRST_EPOCH_SLACK_S:g} + {row['epoch_time_s']:.3f} s "
            f"(beyond the train time {row['beyond_train_s']:.2f} s)",
            row["beyond_train_s"] <= FIRST_EPOCH_SLACK_S,
            note=f"the job's timings: queue_wait {_fmt(t.get('queue_wait_s'))}, import {_fmt(t.get('import_s'))}, "
                 f"data {_fmt(t.get('data_s'))}, setup {_fmt(t.get('setup_s'))}, compile {_fmt(t.get('compile_s'))}, "
                 f"first epoch's eval {_fmt(row['eval_time_s'])} s"))
        out.append(Criterion(names[2], targets[2],
                             "the other framework's library was mapped" if row["other_framework_loaded"] else
                             "only its own", not row["other_framework_loaded"]))
    return out


def small_jobs_table(results: dict) -> list[str]:
    """Part 9: the small-jobs rate and per-job breakdown (ms), then each fresh worker's figures."""
    lines = []
    small = results.get("small_jobs", {}).get("frameworks", {})
    if small:
        from bench.small_jobs import PARTS

        header = f"{'small jobs (ms a job)':<22} {'jobs/s':>7} {'per job':>8}" + "".join(
            f"{p.removesuffix('_s'):>11}" for p in PARTS) + f"{'other':>9}"
        lines += [header, "-" * len(header)]
        for framework, row in small.items():
            lines.append(f"{framework:<22} {row['jobs_per_s']:>7.1f} {row['per_job_s'] * 1e3:>8.1f}"
                         + "".join(f"{row['means'][p] * 1e3:>11.1f}" for p in PARTS) + f"{row['other_s'] * 1e3:>9.1f}")
    cold = results.get("cold_start", {}).get("kinds", {})
    if cold:
        if lines:
            lines.append("")
        header = f"{'cold start, first job':<22} {'online s':>9} {'1st epoch s':>12} {'train s':>8} {'beyond s':>9}"
        lines += [header, "-" * len(header)]
        for kind, row in cold.items():
            lines.append(f"{kind:<22} {row['online_s']:>9.2f} {row['first_epoch_s']:>12.2f} "
                         f"{row['epoch_time_s']:>8.3f} {row['beyond_train_s']:>9.2f}")
    return lines
