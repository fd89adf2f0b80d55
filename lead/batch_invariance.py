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
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["CUDA_TILE", "ROW_QUANTUM", "forward_batch_invariant"]

#: CPU: rows are padded to a multiple of this (a multiple of every BLAS micro-kernel height).
ROW_QUANTUM = 8
#: CUDA: rows run in tiles of exactly this many.
CUDA_TILE = 1024


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
    An empty ``x`` goes through ``run`` unchanged.
    """
    n = x.shape[0]
    if n == 0:
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
