"""Dynamic micro-batching: concurrent small translate requests share one forward.

At query time retrieval systems send one vector per request, many callers at once. Each
request's forward is tiny (~0.1 ms) next to the fixed cost of a torch call, so the
translate route hands small requests to a :class:`MicroBatcher` instead of running them
one by one: requests for the same route (stitches, direction, ``normalize``) that wait
together are concatenated, run in one forward and their rows split back.

* **No added latency for a lone request.** A request that finds the batcher idle runs at
  once. Batches form only from requests that arrive while a forward runs; a gathering wait
  (``batch_wait_ms``, at most ~1 ms) is spent only while other translate requests are
  known to be on their way (admitted, body or decode not finished yet), and ends early
  when they have all joined or the batch is full (``batch_max_vectors``).
* **Answers do not depend on other traffic.** :meth:`service.routing.Route.translate` is
  batch-invariant (:mod:`lead.batch_invariance`): a row's bytes are the same alone or
  among other callers' rows.
* **One bad request never harms the others.** When a batched forward raises a
  :class:`~lead.errors.LeadError` (an all-zero vector, a NaN output), each request of the
  batch runs again alone, so the error names the culprit's own ``input[i]`` and the others
  get their answers.
* **Forwards leave the event loop free.** Batches of more than ``inline_vectors`` rows run
  on one dedicated thread (torch releases the GIL), so the loop keeps reading and decoding
  the next requests meanwhile; smaller ones run on the loop (a thread hand-off would cost
  more than the forward).

The batch sizes go to ``/metrics`` (``lead_microbatch_vectors``,
``lead_microbatch_requests``). Single event loop only (state changes between awaits).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from lead.errors import LeadError
from service.observability import Metrics
from service.routing import Route, Translation

__all__ = ["MicroBatcher"]


@dataclass(eq=False)
class _Pending:
    route: Route
    x: np.ndarray
    normalize: bool
    future: asyncio.Future[Translation]
    key: tuple[object, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.key = (*map(id, self.route.stitches), self.route.inverse, self.normalize)


class MicroBatcher:
    """Gathers concurrent translate requests into shared forwards.

    Parameters
    ----------
    max_vectors : int
        The most rows in one gathered forward (a request is never split).
    max_wait_s : float
        The longest a forward waits for requests known to be on their way (seconds).
    inline_vectors : int
        Forwards of at most this many rows run on the event loop, larger ones on the
        forward thread.
    torch_threads : int
        ``torch.set_num_threads`` of the forward thread.
    metrics : Metrics, optional
        Where the batch sizes go.
    """

    def __init__(
        self,
        *,
        max_vectors: int,
        max_wait_s: float,
        inline_vectors: int = 16,
        torch_threads: int = 1,
        metrics: Metrics | None = None,
    ) -> None:
        self.max_vectors = max_vectors
        self.max_wait_s = max_wait_s
        self.inline_vectors = inline_vectors
        self._metrics = metrics
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="lead-forward",
            initializer=torch.set_num_threads,
            initargs=(torch_threads,),
        )
        self._pending: list[_Pending] = []
        self._arriving = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Mark a request as on its way (admitted, not submitted yet) for its duration."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1
            self._wake.set()  # a gathering wait for it ends now (it joined, or never will)

    async def translate(self, route: Route, x: np.ndarray, *, normalize: bool) -> np.ndarray:
        """``route.translate(x, normalize=normalize)``, possibly in a forward shared with
        concurrent requests; the same bytes either way.

        Raises
        ------
        LeadError
            What ``route.translate`` raises for ``x`` alone.
        """
        return (await self.run(route, x, normalize=normalize)).vectors

    async def run(self, route: Route, x: np.ndarray, *, normalize: bool) -> Translation:
        """``route.run(x, normalize=normalize)``: :meth:`translate`, with the rows of ``x``
        that were scaled to unit length.

        Raises
        ------
        LeadError
            What ``route.run`` raises for ``x`` alone.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (tests): start afresh
            self._loop, self._wake, self._pending = loop, asyncio.Event(), []
            self._worker = None
        future: asyncio.Future[Translation] = loop.create_future()
        self._pending.append(_Pending(route, x, normalize, future))
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run(), name="lead-microbatcher")
        return await future

    def close(self) -> None:
        """Stop the worker and the forward thread (pending requests are cancelled)."""
        if self._worker is not None:
            self._worker.cancel()
        for pending in self._pending:
            pending.future.cancel()
        self._pending = []
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._gather()
            batch = self._take()
            if batch:
                await self._execute(batch)

    def _rows_like_first(self) -> int:
        key = self._pending[0].key
        return sum(len(p.x) for p in self._pending if p.key == key)

    async def _gather(self) -> None:
        """Wait (at most ``max_wait_s``) while requests are on their way and the first
        request's batch has room."""
        deadline = time.monotonic() + self.max_wait_s
        while self._arriving > 0 and self._rows_like_first() < self.max_vectors:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)

    def _take(self) -> list[_Pending]:
        """The first live request and the later ones of its key that fit, in order."""
        self._pending = [p for p in self._pending if not p.future.done()]  # cancelled
        if not self._pending:
            return []
        key, rows = self._pending[0].key, 0
        batch: list[_Pending] = []
        rest: list[_Pending] = []
        for pending in self._pending:
            if pending.key == key and (not batch or rows + len(pending.x) <= self.max_vectors):
                batch.append(pending)
                rows += len(pending.x)
            else:
                rest.append(pending)
        self._pending = rest
        return batch

    async def _forward(self, route: Route, x: np.ndarray, normalize: bool) -> Translation:
        if len(x) <= self.inline_vectors:
            return route.run(x, normalize=normalize)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: route.run(x, normalize=normalize))

    async def _execute(self, batch: list[_Pending]) -> None:
        first = batch[0]
        x = first.x if len(batch) == 1 else np.concatenate([p.x for p in batch])
        if self._metrics is not None:
            self._metrics.batch_vectors.observe(len(x))
            self._metrics.batch_requests.observe(len(batch))
        try:
            answer = await self._forward(first.route, x, first.normalize)
        except LeadError as error:
            if len(batch) == 1:
                _settle(first, error=error)
                return
            for pending in batch:  # alone, so that an error names the request's own row
                try:
                    _settle(pending, await self._forward(pending.route, pending.x, first.normalize))
                except Exception as own:  # a bug too: this caller answers 500, the rest go on
                    _settle(pending, error=own)
            return
        except Exception as error:  # a bug: every caller answers 500, the worker lives on
            for pending in batch:
                _settle(pending, error=error)
            return
        start = 0
        for pending in batch:
            _settle(pending, answer.rows(start, start + len(pending.x)))
            start += len(pending.x)


def _settle(
    pending: _Pending, value: Translation | None = None, *, error: BaseException | None = None
) -> None:
    if pending.future.done():  # the caller went away
        return
    if error is not None:
        pending.future.set_exception(error)
    else:
        assert value is not None
        pending.future.set_result(value)
