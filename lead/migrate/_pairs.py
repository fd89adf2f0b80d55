"""The ids present in several stores and their vectors, row-aligned (calibrate and verify).

Stores only promise :meth:`~lead.migrate.stores.Source.sample_ids` and
:meth:`~lead.migrate.stores.Source.fetch` (which refuses a missing id), so the pairing is
optimistic: draw the sample from the store with the fewest rows and fetch it from the
others; only when one of them lacks an id are the ids of every store listed and
intersected (one pass over each). Ids are matched by their text (``str(id)``), so a store
with integer ids pairs with one whose ids are the same numbers as text. Excluded ids (those
a stitch was fitted on, when verifying it) are never drawn: ``n + len(exclude)`` ids are
drawn, the excluded ones dropped and ``n`` of the rest kept at random, a uniform sample of
the ids that are not excluded.

Pairing by id needs each id once in a store, and a finite vector for it: an id drawn or
listed twice, or a fetched vector holding NaN or infinity, is refused naming the id and
the store (:func:`check_unique`, :func:`checked_vectors`). Only the rows read are checked;
the store's full check (:meth:`~lead.migrate.stores.Source.check`) is ``apply``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lead.errors import InvalidInputError, NonFiniteError, TooFewPairsError
from lead.migrate.stores import Source

__all__ = ["Paired", "check_unique", "checked_vectors", "paired_sample"]


@dataclass(frozen=True)
class Paired:
    """Vectors of the same ids in several stores.

    Attributes
    ----------
    ids : list of str
        The ids, as text, in row order.
    vectors : list of ndarray of shape (n, d_k), float32
        One matrix per store, in the order the stores were given; row ``i`` is ``ids[i]``.
    rows : list of int
        Rows in each store (NULL vectors included).
    common : int or None
        Ids with a vector in every store and not excluded, when they were counted (the slow
        path).
    """

    ids: list[str]
    vectors: list[np.ndarray]
    rows: list[int]
    common: int | None


def _keys(ids: np.ndarray) -> list[str]:
    return [str(x) for x in np.asarray(ids).tolist()]


def _as_kind(keys: Sequence[str], kind: str) -> np.ndarray | None:
    """``keys`` as a store's ids (int64 or text); None when one is not a number."""
    if kind != "int":
        return np.asarray(list(keys), dtype=object)
    try:
        return np.asarray([int(k) for k in keys], dtype=np.int64)
    except ValueError:
        return None


def check_unique(keys: Sequence[str], name: str, store: Source) -> None:
    """Refuse an id met twice among ``keys`` (drawn or listed from ``store``).

    Raises
    ------
    InvalidInputError
        Naming the first repeated id and the store.
    """
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise InvalidInputError(
                f"id {key} appears more than once in the {name} store {store.info.uri}; ids "
                "must be unique to pair vectors by id: remove the duplicates",
                param=name,
            )
        seen.add(key)


def checked_vectors(
    vectors: np.ndarray, keys: Sequence[str], name: str, store: Source
) -> np.ndarray:
    """``vectors`` fetched from ``store`` for ``keys``, one finite row per id.

    Parameters
    ----------
    vectors : ndarray of shape (n, d)
    keys : sequence of str, length n
        The ids asked for, in row order.

    Returns
    -------
    ndarray of shape (n, d)
        ``vectors`` itself.

    Raises
    ------
    NonFiniteError
        A row holding NaN or infinity, naming its id and the store.
    InvalidInputError
        Not one row per id (a store holding an id twice).
    """
    if vectors.ndim != 2 or vectors.shape[0] != len(keys):
        raise InvalidInputError(
            f"the {name} store {store.info.uri} returned {vectors.shape[0]} vectors for "
            f"{len(keys)} ids: does it hold an id more than once? ids must be unique",
            param=name,
        )
    bad = ~np.isfinite(vectors).all(axis=1)
    if bad.any():
        first = keys[int(np.argmax(bad))]
        raise NonFiniteError(
            f"the vector of id {first} in the {name} store {store.info.uri} holds NaN or "
            f"infinity ({int(bad.sum())} of the {len(keys)} sampled vectors do): fix or "
            "remove those rows",
            param=name,
        )
    return vectors


def _fetch_all(
    stores: Sequence[Source], names: Sequence[str], keys: Sequence[str]
) -> list[np.ndarray] | None:
    """The vectors of ``keys`` in every store; None when a store lacks one of them.

    Raises
    ------
    InvalidInputError, NonFiniteError
        As :func:`checked_vectors`.
    """
    out = []
    for store, name in zip(stores, names, strict=True):
        ids = _as_kind(keys, store.info.id_kind)
        if ids is None:
            return None
        try:
            vectors = store.fetch(ids)
        except NonFiniteError:
            raise
        except InvalidInputError:  # an id missing or NULL there
            return None
        out.append(checked_vectors(np.asarray(vectors), keys, name, store))
    return out


def _every_key(store: Source, name: str, seed: int) -> list[str]:
    """Every id of ``store`` with a vector (one pass); an id held twice is refused."""
    keys = _keys(store.sample_ids(store.info.rows, seed))
    check_unique(keys, name, store)
    return keys


def paired_sample(
    stores: Sequence[Source],
    names: Sequence[str],
    n: int,
    seed: int,
    *,
    minimum: int,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> Paired:
    """Up to ``n`` random ids with a vector in every store, plus the ``include`` ids found
    in all of them, none of the ``exclude`` ids, and their vectors.

    Parameters
    ----------
    stores : sequence of Source
        Two or three opened stores.
    names : sequence of str
        How errors name each store (``source``, ``native``, ...).
    n : int
        Random ids wanted (at least 1).
    seed : int
        Seed of the draw.
    minimum : int
        Fewest ids allowed in the sample.
    include : sequence of str
        Ids to add when every store holds them (the judged documents of a query set).
    exclude : sequence of str
        Ids never taken, neither drawn nor included (those a stitch was fitted on).

    Returns
    -------
    Paired

    Raises
    ------
    TooFewPairsError
        Fewer than ``minimum`` ids with a vector in every store and not excluded; the
        message names the rows of each store, the count in common and the count excluded.
    InvalidInputError
        An id drawn or listed twice from a store; a store that returns another number of
        vectors than ids asked for.
    NonFiniteError
        A fetched vector holding NaN or infinity (naming its id and store).
    """
    order = sorted(range(len(stores)), key=lambda k: stores[k].info.rows)
    smallest = stores[order[0]]
    rows = [s.info.rows for s in stores]
    skip = set(exclude)
    include = [k for k in dict.fromkeys(include) if k not in skip]
    drawn = _keys(smallest.sample_ids(n + len(skip), seed))
    check_unique(drawn, names[order[0]], smallest)
    drawn = [k for k in drawn if k not in skip]
    if len(drawn) > n:  # at most len(skip) were dropped: keep n of the rest at random
        pick = np.random.default_rng(seed).choice(len(drawn), size=n, replace=False)
        drawn = [drawn[i] for i in np.sort(pick)]
    wanted = list(drawn)
    if include:
        present = set(_every_key(smallest, names[order[0]], seed))
        seen = set(drawn)
        wanted += [k for k in include if k in present and k not in seen]
    if len(wanted) >= minimum:
        vectors = _fetch_all(stores, names, wanted)
        if vectors is not None:
            return Paired(wanted, vectors, rows, None)
    # some id is missing somewhere: list every store's ids and intersect them
    shared = set(_every_key(stores[order[-1]], names[order[-1]], seed))
    for k in order[1:-1]:
        shared &= set(_every_key(stores[k], names[k], seed))
    listed = _every_key(smallest, names[order[0]], seed)
    common = [k for k in listed if k in shared and k not in skip]
    if len(common) < minimum:
        counts = ", ".join(f"{name} {r} rows" for name, r in zip(names, rows, strict=True))
        besides, hint = "", "check that the stores use the same ids"
        if skip:
            besides = f" besides the {len(skip)} excluded"
            hint = "the stores need more ids in common than the excluded ones"
        raise TooFewPairsError(
            f"only {len(common)} ids{besides} have a vector in every store ({counts}); at "
            f"least {minimum} are needed: {hint}",
            minimum=minimum,
            got=len(common),
            param=names[-1],
        )
    judged = set(include) & set(common)
    rest = [k for k in common if k not in judged]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(rest), size=min(n, len(rest)), replace=False)
    wanted = [rest[i] for i in np.sort(pick)] + [k for k in common if k in judged]
    vectors = _fetch_all(stores, names, wanted)
    if vectors is None:  # the stores changed between the listing and the fetch
        raise InvalidInputError(
            "the stores changed while being sampled; run again", param=names[-1]
        )
    return Paired(wanted, vectors, rows, len(common))
