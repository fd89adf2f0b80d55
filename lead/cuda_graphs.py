"""CUDA graphs of a map's forward on one fixed tile of rows.

On a GPU, :func:`lead.batch_invariance.forward_batch_invariant` runs the rows in tiles of
exactly :data:`~lead.batch_invariance.CUDA_TILE` rows. Run eagerly, each tile launches
every kernel of the map again from Python (a stitch's forward is a few dozen small
kernels), and at batch 8,192 the launches, not the arithmetic, set the time: measured on
an H200, a ridge 384 → 384 stitch's 8 tiles took 1.57 ms eagerly and 0.40 ms replayed as a
CUDA graph, the bundled ``minilm-to-pml3`` 26.3 ms and 9.0 ms, and a lone vector 0.18 ms and
0.07 ms, with the same bits (``bench/gpu.py`` reports the forward with and without).

:func:`run_tiles` captures the map once per (map, dtype, input width, device, tile) into a
graph (cuda graphs: NVIDIA, *CUDA C++ Programming Guide*, "CUDA Graphs"; torch's
:class:`torch.cuda.CUDAGraph`) and replays it for each tile: the tile is copied into the
graph's input, the graph replays the very kernels eager execution chose for that shape,
and the output is copied out. The answers are the eager tiles' bits: the capture replays
the first tile and compares it with the eager result, and keeps the graph only when they
are identical.

A map is graphed only when it can be replayed safely:

* it is an :class:`torch.nn.Module` or a method bound to one, in eval mode, called without
  autograd (``torch.no_grad`` or ``torch.inference_mode``) and not inside another capture;
* its capture succeeds: a map that reads a value back to the host (a data-dependent
  branch) cannot be captured, and runs eagerly from then on;
* it returns one tensor with a row per input row.

A graph reads the module's parameters and buffers at the addresses it was captured with:
it is captured again when any of them is replaced or changed in place (its address or
version counter changed), up to :data:`_MAX_CAPTURES` times, then the map runs eagerly.
Tensors the map reads that are neither (a plain attribute) must not change while it is
served.

Replays of one graph are serialised (its input and output buffers are shared) on a stream
of its own, ordered after the caller's current stream and before whatever the caller
queues next; nothing is synchronised with the host.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["graphable", "run_tiles"]

#: Captures of one key before it runs eagerly for good: a module whose parameters keep
#: changing between calls (a training loop's evaluations) would pay for a capture (a device
#: synchronisation, a garbage collection) at every call.
_MAX_CAPTURES = 4
#: Warm-up calls on the capture stream before a capture (lazy initialisation such as
#: cuBLAS's workspace must not happen inside it).
_WARMUP = 2


@dataclass
class _TileGraph:
    """One captured tile: the graph, its static input and output, its stream and lock."""

    graph: torch.cuda.CUDAGraph
    static_in: Tensor
    static_out: Tensor
    stream: torch.cuda.Stream
    signature: tuple[Any, ...]
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _ModuleGraphs:
    """A module's graphs: key → the captured tile, or None where the map runs eagerly (its
    capture failed or differed, or it was captured :data:`_MAX_CAPTURES` times); and how
    many times each key was captured."""

    tiles: dict[Hashable, _TileGraph | None] = field(default_factory=dict)
    captures: Counter[Hashable] = field(default_factory=Counter)


#: Per module, weakly held: a stitch that is unloaded takes its graphs with it.
_GRAPHS: weakref.WeakKeyDictionary[nn.Module, _ModuleGraphs] = weakref.WeakKeyDictionary()
#: One capture at a time in the process (re-entrant: a map's warm-up may capture a map it
#: calls, before its own capture starts).
_CAPTURE_LOCK = threading.RLock()


def _owner(run: Callable[[Tensor], Tensor]) -> tuple[nn.Module, Hashable] | None:
    """The module ``run`` belongs to and what identifies ``run`` on it, or None."""
    if isinstance(run, nn.Module):
        return run, "__call__"
    owner = getattr(run, "__self__", None)
    function = getattr(run, "__func__", None)
    if isinstance(owner, nn.Module) and function is not None:
        return owner, function
    return None


def graphable(run: Callable[[Tensor], Tensor], x: Tensor) -> bool:
    """Whether :func:`run_tiles` may replay ``run`` on ``x`` from a CUDA graph (see the module
    docstring): ``x`` on a CUDA device, no autograd, not inside a capture, and ``run`` a
    module (or its bound method) in eval mode."""
    if x.device.type != "cuda" or torch.is_grad_enabled():
        return False
    found = _owner(run)
    if found is None or found[0].training:
        return False
    return not torch.cuda.is_current_stream_capturing()


def _tensors(module: nn.Module) -> Iterator[Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def _signature(module: nn.Module) -> tuple[Any, ...]:
    """The addresses and version counters of the module's parameters and buffers."""
    return tuple((t.data_ptr(), None if t.is_inference() else t._version) for t in _tensors(module))


def _padded_into(buffer: Tensor, rows: Tensor) -> None:
    """Copy ``rows`` into the top of ``buffer`` and zero the rest."""
    m = rows.shape[0]
    buffer[:m].copy_(rows)
    if m < buffer.shape[0]:
        buffer[m:].zero_()


def _capture(run: Callable[[Tensor], Tensor], first: Tensor) -> tuple[_TileGraph | None, Tensor]:
    """Capture ``run`` on a tile shaped like ``first`` (a full, padded tile).

    Returns the graph (None when it cannot be captured or its replay differs from the eager
    answer) and ``run(first)`` computed eagerly. Errors of ``run`` itself (a shape it
    refuses) propagate from the eager call, before any capture.
    """
    module, _ = _owner(run) or (None, None)
    assert module is not None
    caller = torch.cuda.current_stream(first.device)
    stream = torch.cuda.Stream(first.device)  # type: ignore[no-untyped-call]
    stream.wait_stream(caller)
    with torch.cuda.stream(stream):
        static_in = first.clone()
        expected = run(static_in)
        if not isinstance(expected, Tensor) or expected.shape[:1] != first.shape[:1]:
            caller.wait_stream(stream)
            return None, expected
        for _ in range(_WARMUP - 1):
            run(static_in)
    caller.wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            static_out = run(static_in)
    except Exception:  # any capture failure (a read-back, an unsupported call): eager
        return None, expected
    with torch.cuda.stream(stream):
        graph.replay()
    caller.wait_stream(stream)
    if not isinstance(static_out, Tensor) or not torch.equal(static_out, expected):
        return None, expected
    tile = _TileGraph(graph, static_in, static_out, stream, _signature(module))
    return tile, expected


def run_tiles(run: Callable[[Tensor], Tensor], x: Tensor, tile: int) -> Tensor | None:
    """``run`` on ``x`` in tiles of exactly ``tile`` rows (the last one padded with zero
    rows), each replayed from a CUDA graph; None when ``run`` is not :func:`graphable`
    on ``x`` or its capture failed (then the caller runs the tiles eagerly).

    Parameters
    ----------
    run : callable
        A row-wise map ``(m, d_in) -> (m, d_out)``: an :class:`torch.nn.Module` or a method
        bound to one.
    x : Tensor of shape (n, d_in), n >= 1
        On a CUDA device, any floating dtype.
    tile : int
        Rows per tile.

    Returns
    -------
    Tensor of shape (n, d_out) or None
        The same bits as ``run`` called on each padded tile eagerly.

    Raises
    ------
    Exception
        Whatever ``run`` raises on the first tile of a new (dtype, width) (e.g.
        :class:`lead.errors.ShapeMismatchError`).
    """
    if not graphable(run, x):
        return None
    found = _owner(run)
    assert found is not None
    module, function = found
    key = (function, x.dtype, tuple(x.shape[1:]), x.device, tile)
    graphs = _GRAPHS.setdefault(module, _ModuleGraphs())
    entry = graphs.tiles.get(key)
    first_out: Tensor | None = None
    if key not in graphs.tiles or (entry is not None and entry.signature != _signature(module)):
        graphs.captures[key] += 1
        if graphs.captures[key] > _MAX_CAPTURES:
            graphs.tiles[key] = None
            return None
        first = x.new_zeros((tile, *x.shape[1:]))
        _padded_into(first, x[:tile])
        with _CAPTURE_LOCK:
            entry, first_out = _capture(run, first)
            graphs.tiles[key] = entry
    if entry is None:
        return None
    n = x.shape[0]
    out = x.new_empty((n, *entry.static_out.shape[1:]), dtype=entry.static_out.dtype)
    caller = torch.cuda.current_stream(x.device)
    with entry.lock:
        entry.stream.wait_stream(caller)
        with torch.cuda.stream(entry.stream):
            start = 0
            if first_out is not None:  # the capture already computed the first tile
                m = min(tile, n)
                out[:m].copy_(first_out[:m])
                start = tile
            for i in range(start, n, tile):
                m = min(tile, n - i)
                _padded_into(entry.static_in, x[i : i + m])
                entry.graph.replay()
                out[i : i + m].copy_(entry.static_out[:m])
        caller.wait_stream(entry.stream)
    return out
