"""Killable worker processes for work whose cost a client chooses (templates, grammars): a job runs under an
address-space, a CPU-time and a wall-clock limit, and is killed at its deadline or when its caller gives up."""

from keel.sandbox.pool import Abandoned, Busy, JobFailed, LimitExceeded, WorkerError, WorkerLimits, WorkerPool

__all__ = ["Abandoned", "Busy", "JobFailed", "LimitExceeded", "WorkerError", "WorkerLimits", "WorkerPool"]
