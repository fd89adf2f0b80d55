"""Job metrics for ``/metrics``, read from the job store at each scrape.

The store is shared by every replica (PostgreSQL) or every worker process (SQLite), so these
gauges describe all jobs, whichever server is scraped; they are computed per scrape rather
than kept in process memory, so multiprocess mode needs nothing special for them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["STATUSES", "job_metrics"]

#: Every job status, reported even at zero so that a dashboard's series never vanish.
STATUSES = ("queued", "running", "cancelling", "succeeded", "failed", "cancelled")


class _Jobs(Collector):
    def __init__(self, counts: dict[str, int], restarted: int) -> None:
        self.counts, self.restarted = counts, restarted

    def collect(self) -> list[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "lead_jobs", "Training jobs in the job store, by status.", labels=["status"]
        )
        for status in STATUSES:
            jobs.add_metric([status], self.counts.get(status, 0))
        restarted = GaugeMetricFamily(
            "lead_jobs_restarted",
            "Jobs started more than once because their server or worker died "
            "(LEAD_JOB_MAX_ATTEMPTS).",
            value=self.restarted,
        )
        return [jobs, restarted]


def job_metrics(counts: dict[str, int], restarted: int) -> bytes:
    """The job gauges in Prometheus' text format.

    Parameters
    ----------
    counts : dict of str to int
        Jobs by status (:meth:`service.jobs.store.JobStore.job_counts`).
    restarted : int
        Jobs started more than once.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Jobs(counts, restarted))
    return generate_latest(registry)
