"""FastAPI dependencies: what routes get from the app (settings, registry, metrics, limiter)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from lead.errors import NotReadyError
from service.limits import ConcurrencyLimiter
from service.observability import Metrics
from service.registry import StitchRegistry
from service.settings import Settings

__all__ = [
    "LimiterDep",
    "MetricsDep",
    "RegistryDep",
    "SettingsDep",
    "get_limiter",
    "get_metrics",
    "get_registry",
    "get_settings",
]


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def get_limiter(request: Request) -> ConcurrencyLimiter:
    limiter: ConcurrencyLimiter = request.app.state.limiter
    return limiter


def get_registry(request: Request) -> StitchRegistry:
    """The registry built by the lifespan (503 if the lifespan has not run)."""
    registry: StitchRegistry | None = getattr(request.app.state, "registry", None)
    if registry is None:
        raise NotReadyError("the service is starting")
    return registry


SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
LimiterDep = Annotated[ConcurrencyLimiter, Depends(get_limiter)]
RegistryDep = Annotated[StitchRegistry, Depends(get_registry)]
