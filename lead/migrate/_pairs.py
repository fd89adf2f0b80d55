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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lead.errors import InvalidInputError, TooFewPairsError
from lead.migrate.stores import Source

__all__ = ["Paired", "paired_sample"]


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


def _fetch_all(stores: Sequence[Source], keys: Sequence[str]) -> list[np.ndarray] | None:
    """The vectors of ``keys`` in every store; None when a store lacks one of them."""
    out = []
    for store in stores:
        ids = _as_kind(keys, store.info.id_kind)
        if ids is None:
            return None
        try:
            out.append(store.fetch(ids))
        except InvalidInputError:  # an id missing or NULL there
            return None
    return out


def _every_key(store: Source, seed: int) -> list[str]:
    return _keys(store.sample_ids(store.info.rows, seed))


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
    """
    order = sorted(range(len(stores)), key=lambda k: stores[k].info.rows)
    smallest = stores[order[0]]
    rows = [s.info.rows for s in stores]
    skip = set(exclude)
    include = [k for k in dict.fromkeys(include) if k not in skip]
    drawn = [k for k in _keys(smallest.sample_ids(n + len(skip), seed)) if k not in skip]
    if len(drawn) > n:  # at most len(skip) were dropped: keep n of the rest at random
        pick = np.random.default_rng(seed).choice(len(drawn), size=n, replace=False)
        drawn = [drawn[i] for i in np.sort(pick)]
    wanted = list(drawn)
    if include:
        present = set(_every_key(smallest, seed))
        seen = set(drawn)
        wanted += [k for k in include if k in present and k not in seen]
    if len(wanted) >= minimum:
        vectors = _fetch_all(stores, wanted)
        if vectors is not None:
            return Paired(wanted, vectors, rows, None)
    # some id is missing somewhere: list every store's ids and intersect them
    shared = set(_every_key(stores[order[-1]], seed))
    for k in order[1:-1]:
        shared &= set(_every_key(stores[k], seed))
    common = [k for k in _every_key(smallest, seed) if k in shared and k not in skip]
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
    vectors = _fetch_all(stores, wanted)
    if vectors is None:  # the stores changed between the listing and the fetch
        raise InvalidInputError(
            "the stores changed while being sampled; run again", param=names[-1]
        )
    return Paired(wanted, vectors, rows, len(common))
