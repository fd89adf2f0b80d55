"""Training jobs: durable records (SQLite, or PostgreSQL shared by replicas), datasets,
runners (spawned processes or Ray tasks) and the stitch store every replica watches.

See :mod:`service.jobs.manager` for the life cycle and :mod:`service.jobs.runner` for how
jobs are claimed, leased and run outside the event loop.
"""

from service.jobs.manager import JobManager
from service.jobs.process_runner import ProcessRunner
from service.jobs.ray_runner import RayRunner
from service.jobs.runner import Runner
from service.jobs.store import DatasetRecord, JobRecord, JobStore

__all__ = [
    "DatasetRecord",
    "JobManager",
    "JobRecord",
    "JobStore",
    "ProcessRunner",
    "RayRunner",
    "Runner",
]
