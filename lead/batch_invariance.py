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
  run in one call, with one intra-op thread. The BLAS then never takes its matrix-vector
  path (one row) nor its small-matrix one, and every row goes through the same kernel and
  reduction order whatever the batch size and the row's position; one thread keeps MKL
  from splitting a long inner dimension between threads, which adds the partial sums in
  an order set by the thread count. Measured with MKL 2024.2 (torch 2.13's CPU wheel) on
  the bundled stitches: on one Xeon every quantum from 4 gave the same bits; on another
  (AVX-512 VNNI) fewer than 16 rows take a small-matrix kernel of their own, and with two
  threads the 2,048-wide hidden layer of the MLP stitches differed between a batch of 16
  and one of 1,024. ``tests/lead/test_batch_invariance.py`` checks it on the machine that
  runs the tests. Cost: a lone vector runs as 16 rows (+~0.03 ms for a 384 x 768 product
  on the second machine), and a large batch on one core;
* on CUDA, kernels (and split-K reductions) are chosen per shape by cuBLAS heuristics, so
  the rows run in fixed tiles of exactly :data:`CUDA_TILE` rows (the last one padded): one
  shape, one kernel, one reduction order. Each tile is replayed from a CUDA graph of the
  map where it can be (:mod:`lead.cuda_graphs`: the same kernels, launched at once).

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

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from lead.cuda_graphs import run_tiles

__all__ = [
    "CUDA_TILE",
    "ROW_INVARIANT",
    "ROW_QUANTUM",
    "QuantizedKeys",
    "fixed_order_sum",
    "forward_batch_invariant",
    "half_keys",
    "one_thread",
    "quantized_keys",
    "row_norms",
    "top_k_cosines",
]

#: CPU: rows are padded to a multiple of this (at and above it MKL keeps one kernel per shape).
ROW_QUANTUM = 16
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
#: A row that needs more candidates than this (many keys tied within the margin: vectors
#: orthogonal to the whole memory, near-duplicate keys) is scored again against every key.
_MAX_CANDIDATES = 256
#: The most float32 products one rescoring step holds (4 MiB): rescored in blocks, which
#: the allocator reuses (larger ones come fresh from the system, page faults included).
_RESCORE_FLOATS = 1 << 20
#: Candidates beyond ``k`` that :func:`top_k_cosines` first takes from a float scoring.
_SPARE = 2
#: Candidates it first takes from the int8 scoring: real queries need 14-53 of the bundled
#: 5,000-key MiniLM memory (10th-99th percentile, 100 SciFact test queries); with 32, one
#: query in seven went to the slower search by pairs (~0.07 ms more for a lone vector).
_INT8_TAKE = 64
#: The largest magnitude of an int8 code (symmetric: -128 is never used).
_INT8_LEVELS = 127
#: The smallest dimension scored in int8 (torch 2.13's CPU ``_int_mm`` returns garbage for
#: an inner dimension of 1; small dimensions gain nothing from it).
_INT8_MIN_DIM = 16
#: A row that needs more candidates than this from the int8 scoring (its margin is ~20
#: times float16's) is scored again in float32 or float16 first.
_INT8_CANDIDATES = 64
#: The most rows scored in int8 first at once. Larger batches are scored in float32: the
#: int8 product is faster, but its wider margin leaves each row ~20-60 candidates to rescore
#: in a fixed order against ~12 (the bundled MiniLM memories of 4,955 keys, one thread,
#: SciFact queries and documents: int8 0.33 / 0.93 ms against float 0.40 / 1.40 ms for 1 /
#: 12 rows, but 1.2 / 77 ms against 1.0 / 32 ms for 16 / 1,024). Both give the same bits.
_INT8_MAX_ROWS = 15
#: An upper bound on a memory key's norm (keys are unit rows within 1e-2).
_KEY_NORM = 1.01


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
    ``run`` has the attribute :data:`ROW_INVARIANT` set to True. A non-contiguous ``x``
    (a transposed or Fortran-order matrix, a column slice) is copied to row-major order
    first: the kernels pick their summation order by the memory layout too.
    """
    x = x.contiguous()
    n = x.shape[0]
    if n == 0 or (x.device.type == "cpu" and getattr(run, ROW_INVARIANT, False)):
        return run(x)
    if x.device.type == "cuda":
        graphed = run_tiles(run, x, CUDA_TILE)
        if graphed is not None:
            return graphed
        tiles = [
            run(_padded(x[i : i + CUDA_TILE], CUDA_TILE))[: min(CUDA_TILE, n - i)]
            for i in range(0, n, CUDA_TILE)
        ]
        return tiles[0] if len(tiles) == 1 else torch.cat(tiles)
    rows = -(-n // ROW_QUANTUM) * ROW_QUANTUM
    with one_thread():
        out = run(_padded(x, rows))
    return out if rows == n else out[:n]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one intra-op thread (the calling thread's setting, restored).

    MKL splits a product's inner dimension between threads when it is long (2,048, the
    bundled MLP stitches' hidden layer), and adds the partial sums in an order set by the
    thread count: with two threads a row differed between a batch of 1,024 and 16 (one
    thread: none; a Xeon with AVX-512 VNNI, torch 2.13's MKL 2024.2)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fixed_order_sum(p: Tensor, dim: int = -1, *, keepdim: bool = False) -> Tensor:
    """The sum over dimension ``dim``, added in an order fixed by that dimension's length.

    Pairwise halving with elementwise additions (the first half plus the second; an odd
    last entry joins the sums as it is), so every output is bit-identical whatever the
    other dimensions, the memory layout, ``dim`` itself and the thread count (a reduction
    kernel may pick its order by the shape). Each halving writes a fresh contiguous tensor:
    adding in place into ``p``'s own halves (strided views) measured 1.5 to 6 times slower.
    A halving is one split and one addition (and one ``cat`` at an odd length): a lone
    vector's forward runs a few dozen of them, and on the CPU each operator costs
    microseconds of dispatch, more than its arithmetic.

    Parameters
    ----------
    p : Tensor of shape (..., m, ...)
        Any floating dtype, ``m >= 1`` along ``dim``.
    dim : int, default -1
        The dimension summed over. Summing over a contiguous outer dimension (the
        neighbours of ``(n, k, d)`` rows) reads whole rows; over a transposed last one,
        strided columns.
    keepdim : bool, default False
        Keep ``dim``, of length 1.

    Returns
    -------
    Tensor
        ``p``'s shape without ``dim`` (or with it of length 1), ``p``'s dtype.
    """
    while (width := p.shape[dim]) > 1:
        half = width // 2
        if width % 2:
            first, second, last = p.split_with_sizes((half, half, 1), dim)
            p = torch.cat([first + second, last], dim=dim)
        else:
            first, second = p.split_with_sizes((half, half), dim)
            p = first + second
    return p if keepdim else p.squeeze(dim)


def row_norms(x: Tensor) -> Tensor:
    """The L2 norms of ``x``'s rows, each one's bits independent of the other rows.

    On the CPU, :func:`torch.linalg.vector_norm` (its kernel reduces each row alone, whatever
    the number of rows). Elsewhere the squares are added by :func:`fixed_order_sum`: a CUDA
    reduction kernel spreads one row over threads (and blocks) by the number of rows, so a
    row rescaled to unit length alone and among 120 others differed in the last bit (H200,
    ``tests/service/test_routing_paths.py::test_gpu_path_on_cuda``). Float16 and bfloat16
    rows are squared and added in float32, as torch's own norm accumulates them.

    Parameters
    ----------
    x : Tensor of shape (n, d)
        Any floating dtype, any device.

    Returns
    -------
    Tensor of shape (n, 1)
        ``x``'s dtype and device.
    """
    if x.device.type == "cpu":
        norms: Tensor = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        return norms
    return _fixed_order_norms(x)


def _fixed_order_norms(x: Tensor) -> Tensor:
    """:func:`row_norms` off the CPU: the squares added in a fixed order (float32 at least)."""
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    return fixed_order_sum(work * work, keepdim=True).sqrt().to(x.dtype)


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


class QuantizedKeys(NamedTuple):
    """Memory keys in int8 for :func:`top_k_cosines`' first scoring (:func:`quantized_keys`).

    Attributes
    ----------
    codes : Tensor of shape (m, d), int8
        ``round(key * 127 / max |key|)`` per key, in [-127, 127].
    step : Tensor of shape (m,), float32
        Each key's ``max |key| / 127``: ``codes * step`` approximates the keys.
    residual : float
        The largest ``||key - codes * step||`` over the keys (computed in float64).
    """

    codes: Tensor
    step: Tensor
    residual: float


def _int8_codes(x: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's symmetric int8 codes and step (``max |row| / 127``, shape (n, 1)), float32
    rows that are not all zero."""
    step = x.abs().amax(dim=1, keepdim=True) / _INT8_LEVELS
    codes = torch.round(x / step).clamp_(-_INT8_LEVELS, _INT8_LEVELS)
    return codes.to(torch.int8), step


def _int_mm_exact(a: Tensor, b: Tensor) -> bool:
    """Whether ``torch._int_mm(a, b.T)`` (int8 codes) equals the int64 products; False
    where it refuses these shapes."""
    try:
        got = torch._int_mm(a, b.T)
    except RuntimeError:  # not implemented for these shapes or on this build
        return False
    return torch.equal(got.long(), a.long() @ b.long().T)


@functools.cache
def _int8_products_exact() -> bool:
    """Whether ``torch._int_mm`` gives exact int32 products on this machine, also for the
    largest codes (CPUs without VNNI may sum pairs of int8 products in saturating int16)."""
    if getattr(torch, "_int_mm", None) is None:
        return False
    g = torch.Generator().manual_seed(0)
    for rows, d in ((1, 384), (8, 768), (64, 1024)):
        signs = torch.randint(0, 2, (rows + 96, d), generator=g) * 2 - 1
        codes = (signs * _INT8_LEVELS).to(torch.int8)  # the extremes: the largest pair sums
        codes[-1] = _INT8_LEVELS  # rows of one sign: the largest totals
        codes[-2] = -_INT8_LEVELS
        if not _int_mm_exact(codes[:rows], codes[rows:]):
            return False
    return True


def quantized_keys(keys: Tensor, k: int) -> QuantizedKeys | None:
    """``keys`` in int8 for :func:`top_k_cosines`' first scoring, or None where that
    scoring should not be used: off the CPU, without exact int8 products
    (``torch._int_mm``), or for a memory too crowded for it to prune.

    The int8 scoring of a 5,000-key memory of dimension 384 takes 0.03 ms for one row
    and 4.5 ms for 1,024 (float32: 0.15 and 48 ms; this machine, one thread). Its error
    is larger than float16's (a margin of ~0.04 instead of ~0.003): each row then keeps
    more candidates, ~20 for real queries of the bundled MiniLM and mpnet memories. In a
    memory whose cosines crowd together (multilingual-e5-small's, where most lie within a
    few hundredths), hundreds of keys would stay within that margin; this returns None
    when a sample of the keys themselves, searched as rows, needs more than
    :data:`_INT8_CANDIDATES` candidates for one in ten.

    Parameters
    ----------
    keys : Tensor of shape (m, d)
        Unit rows (within 1e-2), any floating dtype.
    k : int
        Neighbours per search.

    Returns
    -------
    QuantizedKeys or None
    """
    d = keys.shape[1]
    if (
        keys.device.type != "cpu"
        or not _INT8_MIN_DIM <= d < 2**31 // _INT8_LEVELS**2  # int32 sums must not overflow
        or not _int8_products_exact()
    ):
        return None
    with torch.no_grad():
        exact = keys.detach().float()
        if bool((exact.abs().amax(dim=1) == 0).any()):
            return None
        quantized = _quantized(exact)
        sample = exact[:: max(1, len(exact) // 256)]
        # torch._int_mm on these very shapes too, one row and several
        for rows in (sample[:1], sample):
            if not _int_mm_exact(_int8_codes(rows)[0], quantized.codes):
                return None
        scores, margin = _int8_first(sample, quantized)
        kth = scores.topk(min(k, len(exact)), dim=1).values[:, -1]
        needed = (scores >= (kth - margin).unsqueeze(1)).sum(dim=1).float()
    if float(needed.quantile(0.9)) > _INT8_CANDIDATES:
        return None
    return quantized


def _quantized(keys: Tensor) -> QuantizedKeys:
    """Float32 keys, none all zero, as :class:`QuantizedKeys`."""
    codes, step = _int8_codes(keys)
    residual = (keys.double() - codes.double() * step.double()).norm(dim=1)
    return QuantizedKeys(codes, step.squeeze(1), float(residual.max()))


def _int8_first(x: Tensor, quantized: QuantizedKeys) -> tuple[Tensor, Tensor]:
    r"""The int8 first scoring of float32 rows (none all zero) and each row's candidate
    margin: twice the sum of the scoring's error bound and the float32 rescoring's.

    The scores are exact int32 products of the codes, scaled by both steps. With
    :math:`\tilde x`, :math:`\tilde k` the dequantised codes,
    :math:`|x \cdot k - \tilde x \cdot \tilde k| \le \|x - \tilde x\| \|k\| +
    \|\tilde x\| \|k - \tilde k\|` (Cauchy-Schwarz); the scaling's float32 roundings
    (relative 2**-24, twice) and those of the bound itself are covered by the slack.
    """
    codes, step = _int8_codes(x)
    # int32 to float32 is exact below 2**24 (d <= 1,040) and rounds by 2**-24 above
    scores = torch._int_mm(codes, quantized.codes.T) * quantized.step
    scores.mul_(step)
    off = torch.linalg.vector_norm(x - codes.float().mul_(step), dim=1)
    slack = 1 + 1e-3
    per_off = 2 * slack * (_KEY_NORM + quantized.residual)
    fixed = 2 * (slack * quantized.residual + 1e-6 + _first_scoring_error(x.shape[1], False))
    return scores, off.mul_(per_off).add_(fixed)


def top_k_cosines(
    x: Tensor,
    keys: Tensor,
    k: int,
    *,
    half: Tensor | None = None,
    quantized: QuantizedKeys | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Each row's ``k`` nearest keys by cosine, the same bits whatever the batch.

    A first scoring by one matrix product (whatever kernel the BLAS picks for the shape:
    in int8 when ``quantized`` is given, in float16 when ``half`` is) keeps every key
    within a margin of the ``k``-th highest score; those candidates are scored again in
    float32 with :func:`fixed_order_sum` and ranked by that score, ties to the lower key
    index. A float32 dot product of two unit vectors of dimension ``d``, added in any
    order, is within :math:`\gamma_d = d u / (1 - d u)` (``u`` = 2**-24) of the exact value
    (Higham, 2002, section 3.1 [1]_), and the float16 scoring adds the rounding of its
    inputs and output (the int8 scoring: each row's bound from its own quantisation error,
    :func:`_int8_first`); a margin of twice the two scorings' bounds keeps every key of the
    fixed-order ranking's top ``k`` (ties included) among the candidates, so the result
    depends on neither the first scoring's kernel nor the batch. A row tied with more than
    :data:`_MAX_CANDIDATES` keys within the margin (a vector orthogonal to the whole memory,
    near-duplicate keys) is scored against every key, in blocks of bounded memory: slower
    (1.2-2 ms per row for 5,000 keys of dimension 384; 1,024 such rows raised the peak
    memory by ~90 MB), the same answer.

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
    quantized : QuantizedKeys, optional
        ``keys`` in int8 (:func:`quantized_keys`), for a first scoring ~10 times faster
        than float32's, used when ``x`` has at most :data:`_INT8_MAX_ROWS` non-zero rows
        (a larger batch spends more on rescoring its wider candidate lists than the int8
        product saves); a row that would need more than :data:`_INT8_CANDIDATES`
        candidates from it is scored again in float32 (float16 when alone and ``half`` is
        given).

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
    rows = x.ne(0).any(dim=1).nonzero().flatten()
    xs = x if len(rows) == n else x[rows]
    found: list[tuple[Tensor, Tensor, Tensor]] = []
    pending = torch.arange(len(rows), device=x.device)
    if quantized is not None and 0 < len(rows) <= _INT8_MAX_ROWS:
        scores, margin = _int8_first(xs, quantized)
        pending = _search(xs, keys, k, (pending, scores, margin), _INT8_CANDIDATES, found)
    if len(pending):
        # float16 for one row only: torch's float16 matrix-vector product is fast on the
        # CPU, its matrix-matrix one (without float16 hardware) several times slower
        some = xs if len(pending) == len(xs) else xs[pending]
        in_half = half is not None and len(pending) == 1
        scores = some.half() @ half.T if in_half and half is not None else some @ keys.T
        bound = 2 * (_first_scoring_error(d, in_half) + _first_scoring_error(d, False))
        first = (pending, scores, torch.tensor(bound))
        _search(xs, keys, k, first, _MAX_CANDIDATES, found, last=True)
    if len(found) == 1 and len(rows) == n:  # the usual case: every row at the first try
        return found[0][1], found[0][2]
    cosines = x.new_zeros((n, k))
    index = torch.arange(k, device=x.device).expand(n, k).clone()
    for at, top, near in found:
        cosines[rows[at]], index[rows[at]] = top, near
    return cosines, index


def _search(
    xs: Tensor,
    keys: Tensor,
    k: int,
    first: tuple[Tensor, Tensor, Tensor],
    limit: int,
    found: list[tuple[Tensor, Tensor, Tensor]],
    *,
    last: bool = False,
) -> Tensor:
    """Rescore rows of ``xs`` against their candidates from a first scoring: every key
    within the row's margin of its ``k``-th highest first score. Appends ``(rows,
    cosines, index)`` to ``found``; returns the rows with more than ``limit`` candidates
    (or, when ``last``, scores them against every key).

    ``first`` is ``(rows, scores, margin)``: positions in ``xs`` (ascending), their first
    scores against every key (one row each) and their margins (one each, or a scalar).
    Most rows need few candidates: the ``take`` highest first scores hold them all when
    the last of them is below the margin; the other rows take every key above it.
    """
    rows, scores, margin = first
    m = scores.shape[1]
    take = min(m, k + _SPARE if margin.ndim == 0 else max(k + _SPARE, _INT8_TAKE))
    top, candidates = scores.topk(take, dim=1)
    below = top[:, k - 1].float() - margin
    few = top[:, -1].float() < below
    if take == m or bool(few.all()):
        found.append((rows, *_rescored(_at(xs, rows), keys, candidates, k)))
        return rows[:0]
    if bool(few.any()):
        found.append((rows[few], *_rescored(_at(xs, rows[few]), keys, candidates[few], k)))
    many = ~few
    rows, below = rows[many], below[many]
    row, key = (scores[many] >= below.unsqueeze(1)).nonzero(as_tuple=True)
    counts = torch.bincount(row, minlength=len(rows))
    # fewer than k: a first score is NaN (input outside the contract; no crash, an answer)
    crowded = (counts > limit) | (counts < k)
    left = rows[:0]
    if bool(crowded.any()):
        keep = ~crowded
        kept = keep[row]
        # the kept rows' pairs, their rows numbered 0, 1, ... in order
        row, key = (keep.cumsum(0) - 1)[row[kept]], key[kept]
        left, rows, counts = rows[crowded], rows[keep], counts[keep]
        if last:  # a row tied with many keys (orthogonal to the memory, near-duplicates)
            found.append((left, *_rescored_all(xs[left], keys, k)))
            left = left[:0]
    if len(rows):
        found.append((rows, *_rescored_pairs(_at(xs, rows), keys, (row, key), counts, k)))
    return left


def _at(xs: Tensor, rows: Tensor) -> Tensor:
    """``xs[rows]`` for ascending ``rows`` (``xs`` itself when they are all of them)."""
    return xs if len(rows) == len(xs) else xs[rows]


def _rescored(x: Tensor, keys: Tensor, candidates: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` highest :func:`fixed_order_sum` cosines of each row of ``x`` among its
    candidate keys (one row of them each), ties to the lower key index; in blocks of rows
    that hold at most :data:`_RESCORE_FLOATS` products."""
    candidates = candidates.sort(dim=1).values  # key order: the stable sort keeps it for ties
    block = max(1, _RESCORE_FLOATS // (candidates.shape[1] * keys.shape[1]))
    if len(x) <= block:  # one block (a lone vector): no slicing, no outputs to fill
        return _rescored_block(x, keys, candidates, k)
    cosines, index = _top_k_outputs(x, k)
    for i in range(0, len(x), block):
        rows = slice(i, i + block)
        _rescored_block(x[rows], keys, candidates[rows], k, out=(cosines[rows], index[rows]))
    return cosines, index


def _rescored_block(
    x: Tensor, keys: Tensor, near: Tensor, k: int, out: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`_rescored` of one block of rows (``near``: their candidates, in key order),
    written into ``out`` when given."""
    chosen = keys.index_select(0, near.flatten()).view(*near.shape, keys.shape[1])
    exact = fixed_order_sum(chosen.mul_(x.unsqueeze(1)))
    order = exact.sort(dim=1, descending=True, stable=True).indices[:, :k]
    if out is None:
        return exact.gather(1, order), near.gather(1, order)
    torch.gather(exact, 1, order, out=out[0])
    torch.gather(near, 1, order, out=out[1])
    return out


def _top_k_outputs(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Empty ``(len(x), k)`` cosines and indices, written block by block (no small results
    kept between large temporaries: they fragmented the heap, ~6 GB for 1,024 rows on the
    all-keys path)."""
    n = len(x)
    return x.new_empty((n, k)), torch.empty((n, k), dtype=torch.long, device=x.device)


def _rescored_pairs(
    x: Tensor, keys: Tensor, pairs: tuple[Tensor, Tensor], counts: Tensor, k: int
) -> tuple[Tensor, Tensor]:
    """:func:`_rescored` for candidates given as ``(row, key)`` pairs, by row then key (as
    ``nonzero`` gives them), ``counts`` of them for each row; products in blocks of at
    most :data:`_RESCORE_FLOATS`."""
    row, key = pairs
    block = max(1, _RESCORE_FLOATS // keys.shape[1])
    parts = []
    for i in range(0, len(key), block):
        chosen = keys.index_select(0, key[i : i + block])  # a fresh copy
        products = chosen.mul_(x.index_select(0, row[i : i + block]))
        parts.append(fixed_order_sum(products))
    exact = parts[0] if len(parts) == 1 else torch.cat(parts)
    # one row of candidates each (padded), in key order: the stable sort keeps it for ties
    position = torch.arange(len(key), device=key.device) - (counts.cumsum(0) - counts)[row]
    dense = exact.new_full((len(x), int(counts.max())), -torch.inf)
    dense[row, position] = exact
    index = key.new_zeros(dense.shape)
    index[row, position] = key
    order = dense.sort(dim=1, descending=True, stable=True).indices[:, :k]
    return dense.gather(1, order), index.gather(1, order)


def _rescored_all(x: Tensor, keys: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` highest :func:`fixed_order_sum` cosines of each row of ``x`` against every
    key, ties to the lower key index; in blocks of rows that hold at most
    :data:`_RESCORE_FLOATS` products."""
    m, d = keys.shape
    block = max(1, _RESCORE_FLOATS // (m * d))
    cosines, index = _top_k_outputs(x, k)
    for i in range(0, len(x), block):
        exact = fixed_order_sum(keys.unsqueeze(0) * x[i : i + block].unsqueeze(1))
        order = exact.sort(dim=1, descending=True, stable=True).indices[:, :k]
        torch.gather(exact, 1, order, out=cosines[i : i + block])
        index[i : i + block] = order
    return cosines, index
