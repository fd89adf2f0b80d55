"""The server's event loop: it polls before it sleeps only while no request is in flight,
returns what arrives, and is what uvicorn runs through ``scripts/serve.sh``'s ``--loop``."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading

import pytest

from service.event_loop import BusyPollEventLoop, BusyPollSelector, new_event_loop, watch_requests


class _Probe(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Counts the selector's own polls (what BusyPollSelector calls as ``super()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.polls: list[float | None] = []

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.polls.append(timeout)
        return list(super().select(timeout))


class _Counting(BusyPollSelector, _Probe):  # type: ignore[misc]
    pass


@pytest.fixture()
def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_an_idle_server_polls_then_blocks_and_a_busy_one_blocks_at_once(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    reader, _ = pair
    selector = _Counting(spin_s=0.005)
    selector.register(reader, selectors.EVENT_READ)
    assert selector.select(0.02) == []
    polls = selector.polls
    assert len(polls) > 2 and set(polls[:-1]) == {0}  # polled, then blocked for the rest
    assert polls[-1] is not None and 0 < polls[-1] <= 0.015
    selector.polls.clear()
    selector.idle = lambda: False  # a request in flight: no polling
    assert selector.select(0.01) == []
    assert selector.polls == [0.01]
    selector.polls.clear()
    assert selector.select(0) == [] and selector.polls == [0]  # never polls for a poll
    selector.polls.clear()
    selector.idle = lambda: True  # idle, but the last wait ended on a timer: no traffic
    assert selector.select(0.01) == [] and selector.polls == [0.01]
    selector.close()


def test_what_arrives_while_polling_or_blocked_is_returned(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    reader, writer = pair
    selector = BusyPollSelector(spin_s=0.05)
    key = selector.register(reader, selectors.EVENT_READ)
    for delay in (0.002, 0.1):  # during the poll; after it, while blocked
        timer = threading.Timer(delay, writer.send, args=(b"x",))
        timer.start()
        ready = selector.select(None)  # would block for ever if the data were missed
        assert [k.fd for k, _ in ready] == [key.fd]
        assert reader.recv(1) == b"x"
        timer.join()
    selector.close()


def test_the_loop_polls_only_while_no_request_is_in_flight() -> None:
    in_flight = 1

    async def check() -> tuple[bool, bool]:
        watch_requests(lambda: in_flight)
        loop = asyncio.get_running_loop()
        assert isinstance(loop, BusyPollEventLoop)
        busy = loop.busy_poll.idle()
        nonlocal in_flight
        in_flight = 0
        await asyncio.sleep(0.001)  # the loop runs on it, polling
        return busy, loop.busy_poll.idle()

    with asyncio.Runner(loop_factory=lambda: BusyPollEventLoop(0.001)) as runner:
        assert runner.run(check()) == (False, True)


def test_the_setting_chooses_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAD_BUSY_POLL_US", "250")
    loop = new_event_loop()
    assert isinstance(loop, BusyPollEventLoop) and loop.busy_poll.spin_s == 250e-6
    loop.close()
    monkeypatch.setenv("LEAD_BUSY_POLL_US", "0")  # off: uvloop's loop, as uvicorn picks
    loop = new_event_loop()
    assert not isinstance(loop, BusyPollEventLoop)
    assert type(loop).__module__.startswith("uvloop")
    loop.close()
    monkeypatch.setenv("LEAD_BUSY_POLL_US", "-1")
    with pytest.raises(ValueError, match="busy_poll_us"):
        new_event_loop()
