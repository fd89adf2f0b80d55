"""Training jobs: durable records (SQLite), datasets, and a process runner.

See :mod:`service.jobs.manager` for the life cycle and :mod:`service.jobs.runner` for how
jobs run outside the event loop.
"""

from service.jobs.manager import JobManager
from service.jobs.runner import ProcessRunner, Runner
from service.jobs.store import DatasetRecord, JobRecord, JobStore

__all__ = ["DatasetRecord", "JobManager", "JobRecord", "JobStore", "ProcessRunner", "Runner"]
