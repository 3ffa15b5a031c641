"""A sweep's Optuna study: its storage, sampler and pruner, and the trial calls the service makes.

The study lives in the service's own database through Optuna's RDB storage: on PostgreSQL in
the `optuna` schema (its tables and its own alembic_version apart from ours; migration 0014
creates the schema), on the embedded SQLite in a file beside the service's database. So it
survives an API or worker restart, and every process sees the same trials.

Samplers and pruners keep no state of their own between calls (Optuna keeps it in the storage's
trials), so each call builds them from the sweep's spec. A sampler's seed is the sweep's seed and
the number of the trial it samples: reproducible, and a new draw for each trial.
"""

from __future__ import annotations

import fcntl
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from app import db
from app.config import get_settings
from app.sweeps.spec import Dimension, SweepSpec

if TYPE_CHECKING:  # optuna is imported when a sweep first needs it
    import optuna

log = logging.getLogger(__name__)

SCHEMA = "optuna"


def storage_url(database_url: str) -> tuple[str, dict[str, Any]]:
    """Optuna's storage URL and engine options for the service's database URL."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        db = Path(url.database or "trainhub.db")
        return str(url.set(database=str(db.with_name(f"{db.stem}-optuna{db.suffix or '.db'}")))), {}
    # Few connections per process: a study call is a handful of short statements.
    options = {"options": f"-c search_path={SCHEMA}"}
    return url.render_as_string(hide_password=False), {
        "connect_args": options,
        "pool_size": 2,
        "max_overflow": 4,
        "pool_pre_ping": True,
    }


_CREATING = threading.Lock()


@lru_cache
def get_storage() -> optuna.storages.RDBStorage:
    """The process's storage for studies (cached: it holds a connection pool). The first call in
    each process creates Optuna's tables where they are missing, one process at a time."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url, engine_kwargs = storage_url(get_settings().resolved_database_url())
    with _CREATING, _one_process_at_a_time(url):
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


@contextmanager
def _one_process_at_a_time(optuna_url: str) -> Iterator[None]:
    """Hold a lock shared by every process of the service: Optuna creates its tables and its
    version rows by looking first, so two processes opening a fresh storage at once both create
    them and one fails (a concurrent CREATE TABLE collides in PostgreSQL's catalog)."""
    url = make_url(optuna_url)
    if url.get_backend_name() == "sqlite":
        lock_path = Path(url.database or "trainhub-optuna.db").with_suffix(".lock")
        with lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield
        return
    with db.get_engine().begin() as connection:  # the lock ends with this transaction
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtextextended('trainhub:optuna-tables', 0))")
        yield


def distribution(dimension: Dimension) -> optuna.distributions.BaseDistribution:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    kind = dimension.kind
    if kind == "uniform":
        return FloatDistribution(*dimension.uniform)  # type: ignore[misc]
    if kind == "log_uniform":
        return FloatDistribution(*dimension.log_uniform, log=True)  # type: ignore[misc]
    if kind == "int_uniform":
        return IntDistribution(*dimension.int_uniform)  # type: ignore[misc]
    return CategoricalDistribution(dimension.values())  # type: ignore[arg-type]


def distributions(spec: SweepSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    return {path: distribution(dimension) for path, dimension in spec.space.items()}


def sampler(spec: SweepSpec, number: int) -> optuna.samplers.BaseSampler:
    """The sampler that draws trial `number` (grid: every combination once, in a seeded order)."""
    import optuna

    seed = spec.seed * 100_003 + number
    if spec.method == "grid":
        return optuna.samplers.GridSampler({p: d.values() for p, d in spec.space.items()}, seed=spec.seed)  # type: ignore[misc]
    if spec.method == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: running trials count as if they did badly, so parallel trials spread out
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=min(10, max(2, spec.max_trials // 3)), constant_liar=spec.parallelism > 1
    )


def pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    import optuna

    stopping = spec.early_stopping
    if stopping is None:
        return optuna.pruners.NopPruner()
    if stopping.method == "median":
        # Optuna's steps are our epochs: no trial is stopped before epoch min_epochs.
        startup = min(5, max(1, spec.max_trials // 4))
        return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=stopping.min_epochs - 1)
    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=stopping.min_epochs, reduction_factor=stopping.reduction_factor, min_early_stopping_rate=0
    )


def create(sweep_id: str, spec: SweepSpec) -> None:
    import optuna

    direction = (
        optuna.study.StudyDirection.MAXIMIZE
        if spec.objective.direction == "max"
        else optuna.study.StudyDirection.MINIMIZE
    )
    optuna.create_study(storage=get_storage(), study_name=sweep_id, direction=direction, load_if_exists=True)


def load(sweep_id: str, spec: SweepSpec, number: int | None = None) -> optuna.Study:
    """The sweep's study with its pruner, and the sampler that draws trial `number` (none given:
    a sampler that does nothing after a trial; GridSampler would stop the study once its grid
    is spent, which Optuna allows only inside `optimize`)."""
    import optuna

    draws = sampler(spec, number) if number is not None else optuna.samplers.RandomSampler()
    return optuna.load_study(study_name=sweep_id, storage=get_storage(), sampler=draws, pruner=pruner(spec))


def trials(sweep_id: str) -> list[optuna.trial.FrozenTrial]:
    import optuna

    return optuna.load_study(study_name=sweep_id, storage=get_storage()).get_trials(deepcopy=False)


def ask(sweep_id: str, spec: SweepSpec) -> tuple[int, dict[str, Any]]:
    """A new trial of the study: (its number, its params). The caller holds the sweep's turn, so
    the next number is the count of trials so far (the sampler's seed takes it)."""
    study = load(sweep_id, spec, len(trials(sweep_id)))
    trial = study.ask(distributions(spec))
    return trial.number, dict(trial.params)


def _trial_id(sweep_id: str, number: int) -> int:
    storage = get_storage()
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(sweep_id), number)


def report(sweep_id: str, spec: SweepSpec, number: int, epoch: int, value: float) -> bool:
    """Record trial `number`'s objective after `epoch`; whether the pruner stops it there."""
    import optuna

    study = load(sweep_id, spec)
    trial_id = _trial_id(sweep_id, number)
    if epoch not in get_storage().get_trial(trial_id).intermediate_values:  # (a resumed job reports again)
        get_storage().set_trial_intermediate_value(trial_id, epoch, value)
    return optuna.trial.Trial(study, trial_id).should_prune()


def tell(sweep_id: str, spec: SweepSpec, number: int, state: str, value: float | None = None) -> None:
    """End trial `number` in `state`, a TrialState name: "COMPLETE" (with its objective `value`),
    "PRUNED" or "FAIL". A trial already ended is left as it is."""
    from optuna.trial import TrialState

    ended = TrialState[state]
    complete = ended == TrialState.COMPLETE
    load(sweep_id, spec).tell(number, value if complete else None, state=ended, skip_if_finished=True)
