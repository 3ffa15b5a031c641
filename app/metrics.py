"""Prometheus metrics, read from the database at each scrape.

Jobs are run by worker processes, so the API process sees no job start or end: every number
here is read from the database, which also keeps several API replicas in agreement. Job counts,
queue depths and the duration histograms come from the tallies database triggers keep as jobs
and epochs are recorded (app/tallies.py), so a scrape's cost does not grow with the jobs stored.

Who sees what: an admin key and a scrape key (`trainhub keys create --scrape`) get the
service-wide families below, the API process's own and retention's; a user key gets the same
job families over its own jobs only (and workers online, which GET /workers shows it anyway),
so no tenant learns another's numbers.

- trainhub_jobs{status}                          gauge: jobs in each status
- trainhub_queue_depth{queue}                    gauge: queued jobs per `<hardware>.<framework>`
- trainhub_workers_online{hardware}              gauge: workers with a recent heartbeat
- trainhub_job_duration_seconds{framework,hardware,status}   histogram: started -> finished
- trainhub_epoch_duration_seconds{framework,hardware}        histogram: each epoch's training time
- trainhub_api_db_connections{state}             gauge: this API process's pooled database
  connections, `in_use` (checked out) or `idle`
- trainhub_api_event_streams                     gauge: event streams this API process has open
- trainhub_retention_deleted_{jobs,comparisons,sweeps,files,bytes}_total   counters: what retention
  deleted (app/retention.py), kept in the `counters` table (app/counters.py)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from app import counters, heartbeats, notify, retention, tallies
from app.db import get_engine, session_scope
from app.status import JobStatus

STATUSES = tuple(status.value for status in JobStatus)
# Upper bounds in seconds: a job takes seconds (digits on a CPU) to days; an epoch, from tens
# of milliseconds (digits) to minutes.
JOB_BUCKETS = tallies.JOB_BOUNDS
EPOCH_BUCKETS = tallies.EPOCH_BOUNDS


def histogram(
    name: str, documentation: str, label_names: list[str], rows: Iterable[Sequence], buckets: tuple
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=label_names)
    for row in rows:
        labels, (count, total, *cumulative) = row[: len(label_names)], row[len(label_names) :]
        pairs = [(_bound(b), float(c or 0)) for b, c in zip(buckets, cumulative)] + [("+Inf", float(count))]
        family.add_metric(list(labels), pairs, sum_value=float(total))
    return family


def _bound(value: float) -> str:
    return str(float(value))


class TrainhubCollector(Collector):
    """Collects the metrics of the module docstring from the database at each scrape: of every
    job, or with `owner_id` of that key's jobs only."""

    def __init__(self, owner_id: str | None = None) -> None:
        self.owner_id = owner_id

    def collect(self) -> Iterator[Metric]:
        with session_scope() as session:
            yield from self._collect(session)

    def _collect(self, session: Session) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("trainhub_jobs", "Jobs in each status.", labels=["status"])
        counts = tallies.jobs_by_status(session, self.owner_id)
        for status in sorted(set(STATUSES) | set(counts)):
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs

        depth = GaugeMetricFamily(
            "trainhub_queue_depth", "Queued jobs per queue <hardware>.<framework>.", labels=["queue"]
        )
        for queue, count in sorted(heartbeats.queue_depths(session, self.owner_id).items()):
            depth.add_metric([queue], count)
        yield depth

        online = GaugeMetricFamily("trainhub_workers_online", "Workers whose heartbeat is recent.", labels=["hardware"])
        per_hardware = dict.fromkeys(heartbeats.HARDWARE, 0)
        for worker in heartbeats.online_workers(session):
            per_hardware[worker.hardware] = per_hardware.get(worker.hardware, 0) + 1
        for hardware, count in sorted(per_hardware.items()):
            online.add_metric([hardware], count)
        yield online

        job_labels = ["framework", "hardware", "status"]
        yield histogram(
            "trainhub_job_duration_seconds",
            "Jobs from start to end (finished jobs that started).",
            job_labels,
            tallies.histogram_rows(session, "job", job_labels, self.owner_id),
            JOB_BUCKETS,
        )
        epoch_labels = ["framework", "hardware"]
        yield histogram(
            "trainhub_epoch_duration_seconds",
            "Training time of each epoch (evaluation excluded).",
            epoch_labels,
            tallies.histogram_rows(session, "epoch", epoch_labels, self.owner_id),
            EPOCH_BUCKETS,
        )

        if self.owner_id is None:
            yield from retention_counters(session)


RETENTION_HELP = {
    retention.DELETED_JOBS: "Finished jobs deleted by retention, with their metrics and artifacts.",
    retention.DELETED_COMPARISONS: "Comparisons deleted by retention with both their jobs.",
    retention.DELETED_SWEEPS: "Sweeps deleted by retention with all their trials and their study.",
    retention.DELETED_FILES: "Files (artifacts, checkpoints; local or S3) deleted by retention.",
    retention.DELETED_BYTES: "Bytes of the files deleted by retention.",
}


def retention_counters(session: Session) -> Iterator[Metric]:
    """trainhub_<counter>_total for each of retention's counters (one query)."""
    for name, value in counters.read(session, RETENTION_HELP).items():
        yield CounterMetricFamily(f"trainhub_{name}", RETENTION_HELP[name], value=value)


class ApiProcessCollector(Collector):
    """What this API process holds: its database pool and its open event streams (a stream
    waiting for its job's next change holds no connection)."""

    def collect(self) -> Iterator[Metric]:
        pool = get_engine().pool
        connections = GaugeMetricFamily(
            "trainhub_api_db_connections", "This API process's pooled database connections.", labels=["state"]
        )
        connections.add_metric(["in_use"], getattr(pool, "checkedout", lambda: 0)())
        connections.add_metric(["idle"], getattr(pool, "checkedin", lambda: 0)())
        yield connections
        yield GaugeMetricFamily(
            "trainhub_api_event_streams", "Event streams this API process has open.", value=notify.open_streams()
        )


registry = CollectorRegistry(auto_describe=False)
registry.register(TrainhubCollector())
registry.register(ApiProcessCollector())
ProcessCollector(namespace="trainhub_api", registry=registry)


def render(owner_id: str | None = None) -> bytes:
    """The Prometheus text format of every metric, service-wide; with `owner_id`, the job
    families of that key's jobs only (see the module docstring)."""
    if owner_id is None:
        return generate_latest(registry)
    own = CollectorRegistry(auto_describe=False)
    own.register(TrainhubCollector(owner_id))
    return generate_latest(own)
