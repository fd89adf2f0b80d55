"""Batch-invariant forwards: a row's translation does not depend on its batch.

A matrix product computes every output row with the same arithmetic only when the kernel
does: BLAS libraries pick their kernels by the matrix shape (a single row goes through a
matrix-vector kernel, a batch of 7 leaves a remainder for an edge kernel, threads split the
work by the row count), so the same vector translated alone and inside a batch of 1,024 can
differ in the last bits (up to 1.9e-7 measured on the bundled stitches, 0 of 64 rows
identical). A service that micro-batches concurrent requests would make one caller's answer
depend on the others' traffic, and CI pipelines that compare outputs across runs would see
spurious changes.

:func:`forward_batch_invariant` removes the dependence by never showing the kernels a
shape that varies with the batch in a way that matters:

* on the CPU, the rows are padded with zero rows to a multiple of :data:`ROW_QUANTUM` and
  run in one call. The BLAS then never takes its matrix-vector path (one row) nor its
  small-remainder one, and every row goes through the same kernel and reduction order
  whatever the batch size, the row's position and the thread count. Measured with MKL
  (torch's CPU wheels) on the bundled stitches: a quantum of 2 still leaves rows that
  differ, 4 and more none (batches of 1-40, 64-2,048 rows, 1-16 threads); 8 leaves a
  margin for wider kernels. ``tests/lead/test_batch_invariance.py`` checks it on the
  machine that runs the tests. Cost: a lone vector runs as 8 rows (+0.15 ms on the bundled
  MLP stitches); a batch of 1,024 pads nothing;
* on CUDA, kernels (and split-K reductions) are chosen per shape by cuBLAS heuristics, so
  the rows run in fixed tiles of exactly :data:`CUDA_TILE` rows (the last one padded): one
  shape, one kernel, one reduction order.

Padding rows are zeros; every stitch maps rows independently (no batch statistics), so
they change nothing but the shape and are dropped from the result.

A stitch whose map is dominated by something other than small dense products (a memory
search over thousands of keys) can do better than padding all of its work: it sets
:data:`ROW_INVARIANT` (``row_invariant = True``), pads only its own dense products through
this function, and runs the rest on the real rows with operations whose arithmetic is fixed
per row: elementwise ones, :func:`fixed_order_sum`, and :func:`top_k_cosines`, a nearest-key
search that gives the same neighbours and the same bits whatever kernel scored the keys.
On the CPU such a stitch is then called on ``x`` as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "CUDA_TILE",
    "ROW_INVARIANT",
    "ROW_QUANTUM",
    "fixed_order_sum",
    "forward_batch_invariant",
    "half_keys",
    "top_k_cosines",
]

#: CPU: rows are padded to a multiple of this (a multiple of every BLAS micro-kernel height).
ROW_QUANTUM = 8
#: CUDA: rows run in tiles of exactly this many.
CUDA_TILE = 1024
#: The attribute (set to True) of a map that is batch-invariant on the CPU by itself.
ROW_INVARIANT = "row_invariant"
#: Unit roundoffs of float32 and float16, and half float16's smallest subnormal.
_FLOAT32_ROUNDOFF = 2.0**-24
_FLOAT16_ROUNDOFF = 2.0**-11
_FLOAT16_TINY = 2.0**-25
#: A bound on sum |x_i k_i| for a unit row and a key of norm within 1e-2 of 1.
_NORMS = 1.03
#: Candidates beyond ``k`` that :func:`top_k_cosines` takes from the first scoring.
_SPARE = 2
#: A row that needs more candidates than this (many keys tied within the margin: vectors
#: orthogonal to the whole memory, near-duplicate keys) is scored again against every key.
_MAX_CANDIDATES = 256
#: The most float32 products one rescoring step holds (32 MiB): rows are rescored in blocks.
_RESCORE_FLOATS = 1 << 23


def _padded(x: Tensor, rows: int) -> Tensor:
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


def forward_batch_invariant(run: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``run(x)``, computed so that each output row depends only on its input row.

    Parameters
    ----------
    run : callable
        A row-wise map (a stitch, or :meth:`~lead.stitches.InvertibleStitch.inverse`):
        ``(m, d_in) -> (m, d_out)`` for any ``m``, each output row a function of its input
        row only.
    x : Tensor of shape (n, d_in)
        Any floating dtype, on the CPU or a CUDA device (that of ``run``).

    Returns
    -------
    Tensor of shape (n, d_out)
        Row ``i`` is bit-identical whether ``x`` holds ``x[i]`` alone or among other rows,
        at any position, and (on the CPU) whatever ``torch.get_num_threads()``.

    Notes
    -----
    Caller's context applies (``torch.inference_mode()``, the device and dtype of ``x``).
    An empty ``x`` goes through ``run`` unchanged, and so does any ``x`` on the CPU when
    ``run`` has the attribute :data:`ROW_INVARIANT` set to True.
    """
    n = x.shape[0]
    if n == 0 or (x.device.type == "cpu" and getattr(run, ROW_INVARIANT, False)):
        return run(x)
    if x.device.type == "cuda":
        tiles = [
            run(_padded(x[i : i + CUDA_TILE], CUDA_TILE))[: min(CUDA_TILE, n - i)]
            for i in range(0, n, CUDA_TILE)
        ]
        return tiles[0] if len(tiles) == 1 else torch.cat(tiles)
    rows = -(-n // ROW_QUANTUM) * ROW_QUANTUM
    out = run(_padded(x, rows))
    return out if rows == n else out[:n]


def fixed_order_sum(p: Tensor, *, overwrite: bool = False) -> Tensor:
    """The sum over the last dimension, added in an order fixed by that dimension's length.

    Pairwise halving with elementwise additions, so every output is bit-identical whatever
    the other dimensions, the memory layout and the thread count (a reduction kernel may
    pick its order by the shape).

    Parameters
    ----------
    p : Tensor of shape (..., m)
        Any floating dtype, ``m >= 1``.
    overwrite : bool, default False
        Add in place into ``p`` (no allocation; ``p`` is left holding partial sums).

    Returns
    -------
    Tensor of shape (...), ``p``'s dtype
    """
    while p.shape[-1] > 1:
        width = p.shape[-1]
        half = width // 2
        if overwrite:
            p[..., :half] += p[..., half : 2 * half]
            summed = p[..., :half]
        else:
            summed = p[..., :half] + p[..., half : 2 * half]
        # an odd last column joins the sums as it is
        p = torch.cat([summed, p[..., 2 * half :]], dim=-1) if width % 2 else summed
    return p[..., 0]


def half_keys(keys: Tensor) -> Tensor | None:
    """``keys`` in float16 for :func:`top_k_cosines`' first scoring, or None where that
    scoring should stay in float32: off the CPU, or when torch may accumulate float16
    products in float16 (``torch._C._set_cpu_allow_fp16_reduced_precision_reduction``).

    On the CPU a float16 matrix-vector product (float32 accumulation) reads half the
    bytes: a single-vector search of a 5,000-key memory takes 0.19 ms instead of 0.49 ms
    when the keys are not in the cache (this machine), which is the usual case in a server.
    """
    # not in torch's type stubs; True only when a user opted in to float16 accumulation
    reduced = getattr(torch._C, "_get_cpu_allow_fp16_reduced_precision_reduction", None)
    if keys.device.type != "cpu" or reduced is None or reduced():
        return None
    return keys.detach().half()


def _first_scoring_error(d: int, half: bool) -> float:
    """A bound on how far a first scoring of two unit rows of dimension ``d`` (norms within
    1e-2) lies from the exact cosine: float32 accumulation, plus, for float16 inputs and
    output, their rounding (relative 2**-11, or 2**-25 absolute below float16's normal
    range)."""
    gamma = d * _FLOAT32_ROUNDOFF / (1 - d * _FLOAT32_ROUNDOFF)
    if not half:
        return gamma * _NORMS
    return (3 * _FLOAT16_ROUNDOFF + gamma) * _NORMS + 2 * d * _FLOAT16_TINY * _NORMS


def top_k_cosines(
    x: Tensor, keys: Tensor, k: int, *, half: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""Each row's ``k`` nearest keys by cosine, the same bits whatever the batch.

    A first scoring by one matrix product (whatever kernel the BLAS picks for the shape,
    in float16 when ``half`` is given) keeps every key within a margin of the ``k``-th
    highest score; those candidates are scored again in float32 with
    :func:`fixed_order_sum` and ranked by that score, ties to the lower key index. A
    float32 dot product of two unit vectors of dimension ``d``, added in any order, is
    within :math:`\gamma_d = d u / (1 - d u)` (``u`` = 2**-24) of the exact value
    (Higham, 2002, section 3.1 [1]_), and the float16 scoring adds the rounding of its
    inputs and output; a margin of twice the two scorings' bounds keeps every key of the
    fixed-order ranking's top ``k`` (ties included) among the candidates, so the result
    depends on neither the first scoring's kernel nor the batch. A row tied with more than
    :data:`_MAX_CANDIDATES` keys within the margin (a vector orthogonal to the whole memory,
    near-duplicate keys) is scored against every key, in blocks of bounded memory: slower
    (~2.7 ms per row for 5,000 keys of dimension 384), the same answer.

    Parameters
    ----------
    x : Tensor of shape (n, d), float32
        Unit rows, or all-zero rows (whose cosines are all 0: no search, the first ``k``
        keys).
    keys : Tensor of shape (m, d), float32
        Unit rows (within ``1e-2``), ``m >= k``.
    k : int
        Neighbours per row, ``1 <= k <= m``.
    half : Tensor of shape (m, d), float16, optional
        ``keys`` in float16 (:func:`half_keys`), for a first scoring that reads half the
        bytes when ``x`` has a single non-zero row (a float32 one otherwise).

    Returns
    -------
    cosines : Tensor of shape (n, k), float32
        Largest first.
    index : Tensor of shape (n, k), int64
        Their rows of ``keys``.

    References
    ----------
    .. [1] N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM,
       2002. doi:10.1137/1.9780898718027
    """
    n, d = x.shape
    m = keys.shape[0]
    rows = x.ne(0).any(dim=1).nonzero().flatten()
    xs = x if len(rows) == n else x[rows]
    # float16 for one row only: torch's float16 matrix-vector product is fast on the CPU,
    # its matrix-matrix one (without float16 hardware) several times slower than float32's
    half = half if len(rows) == 1 else None
    scores = xs @ keys.T if half is None else xs.half() @ half.T
    margin = 2 * (_first_scoring_error(d, half is not None) + _first_scoring_error(d, False))
    take = min(m, k + _SPARE)
    pending = torch.arange(len(rows), device=x.device)
    found: list[tuple[Tensor, Tensor, Tensor]] = []
    while len(pending):
        # each row takes more candidates until its last one falls below the margin: how
        # many depends on the row alone, and any superset gives the same answer
        every = len(pending) == len(rows)
        first, candidates = (scores if every else scores[pending]).topk(take, dim=1)
        done = first[:, -1].float() < first[:, k - 1].float() - margin
        if take == m or bool(done.all()):
            found.append((pending, *_rescored(xs if every else xs[pending], keys, candidates, k)))
            break
        if bool(done.any()):
            found.append((pending[done], *_rescored(xs[pending[done]], keys, candidates[done], k)))
        pending, take = pending[~done], min(m, 2 * take)
        if len(pending) and _MAX_CANDIDATES < take < m:  # every key is a candidate
            found.append((pending, *_rescored(xs[pending], keys, None, k)))
            break
    if len(found) == 1 and len(rows) == n:  # the usual case: every row at the first try
        return found[0][1], found[0][2]
    cosines = x.new_zeros((n, k))
    index = torch.arange(k, device=x.device).expand(n, k).clone()
    for at, top, near in found:
        cosines[rows[at]], index[rows[at]] = top, near
    return cosines, index


def _rescored(x: Tensor, keys: Tensor, candidates: Tensor | None, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` highest :func:`fixed_order_sum` cosines of each row of ``x`` among its
    candidate keys (all keys when None), ties to the lower key index; in blocks of rows
    that hold at most :data:`_RESCORE_FLOATS` products."""
    m, d = keys.shape
    if candidates is not None:  # key order: the stable sort below keeps it for ties
        candidates = candidates.sort(dim=1).values
    width = m if candidates is None else candidates.shape[1]
    block = max(1, _RESCORE_FLOATS // (width * d))
    tops, nears = [], []
    for i in range(0, len(x), block):
        rows = x[i : i + block]
        if candidates is None:
            products = keys.unsqueeze(0) * rows.unsqueeze(1)
        else:
            near = candidates[i : i + block]
            chosen = keys.index_select(0, near.flatten()).view(*near.shape, d)
            products = chosen.mul_(rows.unsqueeze(1))  # a fresh copy
        exact = fixed_order_sum(products, overwrite=True)
        order = exact.sort(dim=1, descending=True, stable=True).indices[:, :k]
        tops.append(exact.gather(1, order))
        nears.append(order if candidates is None else candidates[i : i + block].gather(1, order))
    if len(tops) == 1:
        return tops[0], nears[0]
    return torch.cat(tops), torch.cat(nears)
