"""LeadClient against answers no LEAD server sends (a proxy, another server on the port)
and against bad arguments: a LeadError each, never a raw ValueError, KeyError,
JSONDecodeError or UnicodeEncodeError (an adversarial pass found each of those)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from lead.client import LeadClient, _retry_after
from lead.errors import InvalidInputError, LeadError, OverloadedError
from tests._http import answering

#: path -> (status, headers, body) the fake server answers with
REPLIES: dict[str, tuple[int, dict[str, str], bytes]] = {
    "/v1/info": (200, {}, json.dumps({"limits": {"max_vectors_per_request": "many"}}).encode()),
    "/v1/jobs": (200, {}, b"<html>a proxy's page</html>"),
    "/v1/translate": (200, {}, json.dumps({"object": "list"}).encode()),
    "/v1/translate:junk": (200, {}, json.dumps({"data": [{"embedding": "!!!"}] * 2}).encode()),
    "/v1/jobs/j1": (200, {}, b"[1, 2]"),
    "/v1/stitches": (
        429,
        {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"},
        json.dumps({"error": {"code": "overloaded", "message": "busy"}}).encode(),
    ),
}


def _reply(method: str, path: str, headers: Any, sent: bytes) -> tuple[int, dict[str, str], bytes]:
    path = path.split("?")[0]
    if b'"stitch": "junk"' in sent or b'"stitch":"junk"' in sent:
        path += ":junk"
    return REPLIES[path]


@pytest.fixture(scope="module")
def not_lead() -> Iterator[str]:
    with answering(_reply) as url:
        yield url


def test_answers_that_are_not_lead_are_lead_errors(not_lead: str) -> None:
    x = np.ones((2, 4), np.float32)
    with LeadClient(not_lead) as client:
        with pytest.raises(LeadError, match="did not answer as a LEAD server: <html>"):
            client.list_jobs()
        with pytest.raises(LeadError, match="did not answer GET /v1/info as a LEAD server"):
            client.translate(x, stitch="s")
        with pytest.raises(LeadError, match="did not answer POST /v1/translate"):
            client.translate(x, stitch="s", batch_size=2)
        # invalid base64 decoded to an empty (2, 0) array, and a JSON array was a TypeError
        with pytest.raises(LeadError, match="did not answer POST /v1/translate"):
            client.translate(x, stitch="junk", batch_size=2)
        with pytest.raises(LeadError, match="a JSON list, not an object"):
            client.get_job("j1")
        with pytest.raises(OverloadedError) as caught:  # an HTTP date: in the past, 0 s
            client.list_stitches()
        assert caught.value.retry_after == 0


def test_retry_after_takes_seconds_and_dates() -> None:
    assert _retry_after("3") == 3 and _retry_after("1.5") == 2 and _retry_after(None) == 1
    assert _retry_after("soon") == 1 and _retry_after("nan") == 1
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0
    assert 3500 <= _retry_after(_in_an_hour()) <= 3600


def _in_an_hour() -> str:
    import datetime
    import email.utils

    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    return email.utils.format_datetime(moment, usegmt=True)


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda c: c.translate([["a", "b"]], stitch="s"), "2-D array of numbers"),
        (lambda c: c.translate([[1.0], [1.0, 2.0]], stitch="s"), "2-D array of numbers"),
        (lambda c: c.translate(np.ones((0, 4)), stitch="s"), "no rows"),
        (lambda c: c.translate(np.ones((2, 4)), stitch="s", retries=-1), "retries must be >= 0"),
        (lambda c: c.translate(np.ones((2, 4)), stitch="s", batch_size=2.5), "batch_size"),
        (lambda c: c.translate(np.ones((2, 4)), stitch="s", batch_size="2"), "batch_size"),
    ],
)
def test_bad_arguments_are_invalid_input(not_lead: str, call: Any, says: str) -> None:
    with LeadClient(not_lead) as client, pytest.raises(InvalidInputError, match=says):
        call(client)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"timeout": -1}, "timeout must be finite and > 0"),
        ({"base_url": "localhost:8843"}, "must be an http:// or https:// URL"),
        ({"timeout": float("nan")}, "timeout must be finite"),
        ({"api_key": "ключ"}, "printable ASCII"),
        ({"api_key": "two\nlines"}, "printable ASCII"),
    ],
)
def test_bad_client_settings_are_invalid_input(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidInputError, match=says):
        LeadClient(**{"base_url": "http://127.0.0.1:9", **kwargs})


def test_numpy_integers_upper_case_schemes_and_no_timeout_are_taken(not_lead: str) -> None:
    """A first version of the checks refused np.int64 batch sizes, HTTP:// and timeout=None,
    all of which worked before (a second adversarial pass)."""
    client = LeadClient(not_lead.replace("http://", "HTTP://"), timeout=None)
    with client, pytest.raises(LeadError, match="did not answer POST /v1/translate"):
        client.translate(
            np.ones((2, 4)), stitch="junk", batch_size=np.int64(2), retries=np.int64(0)
        )


def test_a_request_the_server_dropped_unanswered_is_sent_again_when_harmless() -> None:
    """A server closing a kept-alive connection as a request goes out (its keep-alive
    timeout) drops that request unanswered; a translation, a GET and a job with an
    Idempotency-Key are sent once more, a job without a key is not."""
    seen: list[str] = []

    def drop_each_first(method: str, path: str, headers: Any, sent: bytes) -> Any:
        path = path.split("?")[0]
        seen.append(f"{method} {path}")
        if seen.count(f"{method} {path}") % 2:  # every other time: no answer at all
            return None
        if path == "/v1/translate":
            vector = base64.b64encode(np.ones(3, "<f4").tobytes()).decode()
            return 200, {}, json.dumps({"data": [{"embedding": vector}] * 2}).encode()
        return 200, {}, b'{"object": "job", "id": "job_1"}'

    x = np.ones((2, 4), np.float32)
    with answering(drop_each_first) as url, LeadClient(url) as client:
        assert client.translate(x, stitch="s", batch_size=2).shape == (2, 3)
        assert client.get_job("job_1")["id"] == "job_1"
        job = client.submit_job("a", "b", dataset="ds_1", idempotency_key="k")
        assert job["id"] == "job_1"
        with pytest.raises(LeadError, match="Server disconnected without sending a response"):
            client.submit_job("a", "b", dataset="ds_1")
    assert seen == [
        "POST /v1/translate",
        "POST /v1/translate",
        "GET /v1/jobs/job_1",
        "GET /v1/jobs/job_1",
        "POST /v1/jobs",
        "POST /v1/jobs",
        "POST /v1/jobs",
    ]
