"""The server's event loop: it polls its sockets for a moment before it sleeps.

A lone client that sends its next query as soon as the last one is answered (a retrieval
system translating one query vector at a time) finds the server asleep in ``epoll_wait``:
the kernel then wakes the thread, and on a virtual machine first the idle virtual CPU,
which costs 0.1-0.3 ms on the 2-core VM the benchmarks run on (``python -m bench.idle``).
:class:`BusyPollSelector` polls without blocking for up to ``LEAD_BUSY_POLL_US``
microseconds once no request is in flight, and only then blocks; a request that arrives
meanwhile is read at once. The same idea as Linux's ``SO_BUSY_POLL`` and the spinning
that Go's scheduler and .NET's thread pool do before they park a thread.

The cost is CPU: at most that many microseconds of one core after the last answer of each
burst of traffic; nothing while requests are in flight (a forward in another thread then
gets the GIL as it would without polling), nothing while no traffic comes (a wake-up by a
timer alone is no traffic: the next wait does not poll). Set 0 to turn
it off (then uvloop's loop, as uvicorn picks by default).

Used through uvicorn's ``--loop service.event_loop:new_event_loop`` (``scripts/serve.sh``,
the Docker image); the app tells the selector when requests are in flight
(:func:`watch_requests`).
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BusyPollEventLoop", "BusyPollSelector", "new_event_loop", "watch_requests"]


class BusyPollSelector(selectors.DefaultSelector):
    """A selector whose blocking :meth:`select` first polls for up to ``spin_s`` seconds
    while ``idle()`` is true.

    Parameters
    ----------
    spin_s : float
        The longest poll before blocking (seconds).
    """

    def __init__(self, spin_s: float) -> None:
        super().__init__()
        self.spin_s = spin_s
        #: Whether the server has no request in flight (the app sets it; until then, yes).
        self.idle: Callable[[], bool] = lambda: True
        # whether the last call found something: a wake-up by a timer alone (uvicorn's own
        # loop ticks every 0.1 s) is no traffic, and the next call does not poll
        self._active = True

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """:meth:`selectors.BaseSelector.select`; a blocking call polls first when idle."""
        if timeout is not None and timeout <= 0:
            return list(super().select(timeout))
        if self.spin_s <= 0 or not self._active or not self.idle():
            return self._blocking(timeout)
        spin = self.spin_s if timeout is None else min(self.spin_s, timeout)
        end = time.perf_counter() + spin
        while True:
            ready = super().select(0)
            if ready:
                return list(ready)
            if time.perf_counter() >= end:
                break
        return self._blocking(None if timeout is None else max(0.0, timeout - spin))

    def _blocking(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = list(super().select(timeout))
        self._active = bool(ready)
        return ready


class BusyPollEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop on a :class:`BusyPollSelector` (``busy_poll``)."""

    def __init__(self, spin_s: float) -> None:
        self.busy_poll = BusyPollSelector(spin_s)
        super().__init__(self.busy_poll)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The loop uvicorn runs the service on (``--loop service.event_loop:new_event_loop``):
    a :class:`BusyPollEventLoop` polling ``LEAD_BUSY_POLL_US`` microseconds, or uvloop's
    loop when that is 0 (asyncio's when uvloop is not installed).

    Raises
    ------
    pydantic.ValidationError
        If a ``LEAD_*`` setting is invalid (``service.settings_check`` reports it first).
    """
    from service.settings import Settings

    spin_us = Settings().busy_poll_us
    if spin_us > 0:
        return BusyPollEventLoop(spin_us / 1e6)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def watch_requests(in_flight: Callable[[], int]) -> None:
    """Tell the running loop's :class:`BusyPollSelector` (when it runs on one) how many
    requests are in flight: it polls only when there are none."""
    loop: Any = asyncio.get_running_loop()
    selector = getattr(loop, "busy_poll", None)
    if isinstance(selector, BusyPollSelector):
        selector.idle = lambda: in_flight() == 0
