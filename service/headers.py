"""Reading HTTP header fields whose value is a comma-separated list (RFC 9110 §5.6.1)."""

from __future__ import annotations

from collections.abc import Iterable


def header_list(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[str]:
    """The elements of every ``name`` field in ``headers``, in order: stripped, lower case,
    empty ones dropped (a recipient must ignore them).

    Parameters
    ----------
    headers : iterable of (bytes, bytes)
        Field names in lower case (as ASGI and uvicorn give them) and raw values.
    name : bytes
        A lower-case field name, e.g. ``b"content-encoding"``.

    Returns
    -------
    list of str
        Non-ASCII bytes are escaped, not guessed (``b"gz\\xc3\\xa9ip"`` reads ``gz\\xc3\\xa9ip``;
        decoded as latin-1 it came back as mojibake), so a message can quote them as sent.
    """
    return [
        part.strip().lower()
        for field, value in headers
        if field == name
        for part in value.decode("ascii", "backslashreplace").split(",")
        if part.strip()
    ]
