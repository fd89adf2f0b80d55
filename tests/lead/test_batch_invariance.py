"""A row's translation is bit-identical alone, in any batch, at any position, any thread count.

Checked on every bundled stitch (both directions of the invertible one) with real SciFact
embeddings, on the machine that runs the tests (the property rests on its BLAS kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from lead import apply_stitch, batch_invariance, load_stitch
from lead.batch_invariance import (
    _INT8_CANDIDATES,
    ROW_INVARIANT,
    ROW_QUANTUM,
    _fixed_order_norms,
    _int8_first,
    _quantized,
    fixed_order_sum,
    forward_batch_invariant,
    half_keys,
    quantized_keys,
    top_k_cosines,
)
from lead.stitches import LocalStitch, oriented, unit_rows

MODELS = Path(__file__).resolve().parents[2] / "models"
BUNDLED = sorted(p.name for p in MODELS.iterdir() if (p / "config.json").is_file())
DIRECTIONS = [(name, False) for name in BUNDLED] + [("minilm-to-pml3-invertible", True)]


@pytest.fixture
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _rows(scifact_small: Any, d: int, n: int = 1024) -> Tensor:
    """``n`` unit rows of dimension ``d`` from the real fixture embeddings: the rows
    themselves, then normalised sums of two of them (seeded)."""
    key = "mpnet" if d == 768 else "minilm"
    real = np.concatenate([scifact_small.corpus[key], scifact_small.queries[key]])
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, len(real), size=(2, n - len(real)))
    mixed = real[i] + real[j]
    rows = np.concatenate([real, mixed / np.linalg.norm(mixed, axis=1, keepdims=True)])
    return torch.from_numpy(rows.astype(np.float32))


needs_exact_int8 = pytest.mark.skipif(
    not batch_invariance._int8_products_exact(),
    reason="torch._int_mm is not exact on this CPU (no int8 first scoring here)",
)


def _run(name: str, inverse: bool) -> tuple[Callable[[Tensor], Tensor], int]:
    stitch = load_stitch(MODELS / name).eval()
    run, d_in, _ = oriented(stitch, inverse=inverse)
    return run, d_in


@pytest.mark.parametrize(("name", "inverse"), DIRECTIONS)
def test_rows_are_bit_identical_in_any_batch(
    name: str, inverse: bool, scifact_small: Any, restore_threads: None
) -> None:
    run, d_in = _run(name, inverse)
    x = _rows(scifact_small, d_in)
    with torch.inference_mode():
        torch.set_num_threads(1)
        alone = torch.cat([forward_batch_invariant(run, x[i : i + 1]) for i in range(256)])
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            whole = forward_batch_invariant(run, x)  # 1,024 rows, row i at position i
            assert torch.equal(whole[:256], alone), (threads, "batch of 1,024")
            shifted = forward_batch_invariant(run, x[5:261])  # row i at position i - 5
            assert torch.equal(shifted[:251], alone[5:]), (threads, "shifted")
            for size in (7, ROW_QUANTUM + 1, 100):
                parts = [forward_batch_invariant(run, x[i : i + size]) for i in range(0, 256, size)]
                assert torch.equal(torch.cat(parts)[:256], alone), (threads, size)


@pytest.mark.parametrize(
    ("name", "inverse"),
    [
        ("minilm-to-pml3-invertible", False),
        ("minilm-to-pml3-invertible", True),
        ("minilm-to-mpnet", False),
    ],
)
def test_apply_stitch_is_batch_invariant(name: str, inverse: bool, scifact_small: Any) -> None:
    """The library's :func:`lead.apply_stitch` gives every row the bits of the padded
    forward (the service's), whatever ``batch_size`` (a plain forward differs: above)."""
    stitch = load_stitch(MODELS / name).eval()
    run, d_in = _run(name, inverse)
    x = _rows(scifact_small, d_in)[:60]
    with torch.inference_mode():
        reference = forward_batch_invariant(run, x).double()
    for batch_size in (1, 7, 60):
        out = apply_stitch(stitch, x.numpy(), batch_size=batch_size, inverse=inverse)
        assert torch.equal(out, reference), batch_size
    # nor the memory layout: a Fortran-order array (np.load of one) or a transposed tensor
    for layout in (np.asfortranarray(x.numpy()), x.t().contiguous().t()):
        assert torch.equal(apply_stitch(stitch, layout, inverse=inverse), reference)


def test_a_plain_forward_is_not_batch_invariant(scifact_small: Any) -> None:
    """What the padding is for: without it the same rows differ across batch sizes (if this
    ever fails, the BLAS became invariant by itself and the padding could go)."""
    run, d_in = _run("minilm-to-pml3-invertible", False)
    assert not getattr(run, ROW_INVARIANT, False)
    x = _rows(scifact_small, d_in)
    with torch.inference_mode():
        alone = torch.cat([run(x[i : i + 1]) for i in range(64)])
        whole = run(x)[:64]
    assert not torch.equal(alone, whole)


@pytest.mark.parametrize("name", ["minilm-to-mpnet", "e5-to-minilm"])
def test_a_gated_stitch_is_batch_invariant_by_itself(
    name: str, scifact_small: Any, restore_threads: None
) -> None:
    """A gated stitch pads only its dense products; its plain forward, unpadded, gives
    every row the same bits alone and in a batch (its memory search is exact per row)."""
    run, d_in = _run(name, False)
    assert getattr(run, ROW_INVARIANT, False)
    x = _rows(scifact_small, d_in)[:200]
    with torch.inference_mode():
        torch.set_num_threads(1)
        alone = torch.cat([run(x[i : i + 1]) for i in range(0, 200, 3)])
        torch.set_num_threads(2)
        whole = run(x)[::3]
    assert torch.equal(alone, whole)


def test_output_matches_the_plain_forward_to_rounding(scifact_small: Any) -> None:
    run, d_in = _run("minilm-to-pml3-invertible", False)
    x = _rows(scifact_small, d_in)[:37]
    with torch.inference_mode():
        padded, plain = forward_batch_invariant(run, x), run(x)
    assert padded.shape == plain.shape == (37, 384)
    torch.testing.assert_close(padded, plain, rtol=0, atol=1e-6)


def test_an_empty_batch_goes_through() -> None:
    run, d_in = _run("minilm-to-pml3", False)
    with torch.inference_mode():
        out = forward_batch_invariant(run, torch.zeros((0, d_in)))
    assert out.shape == (0, 384)


def _near_ties(scifact_small: Any) -> tuple[Tensor, Tensor]:
    """Real MiniLM rows (16 queries, then 4 rows near document 0), and keys: 300 real
    documents, 40 tiny perturbations of document 0 (cosines to any row within ~1e-7 of
    each other) and 8 exact copies of document 5."""
    docs = torch.from_numpy(scifact_small.corpus["minilm"][:300].astype(np.float32))
    queries = torch.from_numpy(scifact_small.queries["minilm"][:16].astype(np.float32))
    g = torch.Generator().manual_seed(0)
    near = docs[:1] + 0.02 * torch.randn(4, docs.shape[1], generator=g)
    base = docs[:1].expand(40, -1) + 1e-7 * torch.randn(40, docs.shape[1], generator=g)
    keys = torch.cat([docs, base, docs[5:6].expand(8, -1)])
    return unit_rows(torch.cat([queries, near])), unit_rows(keys)


def test_top_k_cosines_does_not_depend_on_the_first_scoring(scifact_small: Any) -> None:
    """A float16 first scoring and a float32 one (different kernels, different roundings)
    pick the same neighbours with the same bits, also among near-ties and duplicates."""
    x, keys = _near_ties(scifact_small)
    exact = (x.double() @ keys.double().T).sort(dim=1, descending=True).values
    assert float((exact[-4:, 9] - exact[-4:, 10]).max()) < 1e-6  # near-ties at the 10th
    for k in (1, 10, 45):
        single = top_k_cosines(x, keys, k)
        half = top_k_cosines(x, keys, k, half=keys.half())
        assert torch.equal(single[0], half[0]) and torch.equal(single[1], half[1]), k
        alone = [top_k_cosines(x[i : i + 1], keys, k, half=keys.half()) for i in range(len(x))]
        assert torch.equal(torch.cat([a[0] for a in alone]), single[0])
        assert torch.equal(torch.cat([a[1] for a in alone]), single[1])


@needs_exact_int8
def test_an_int8_first_scoring_gives_the_same_answer(
    scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An int8 first scoring (a margin ~20 times wider) picks the same neighbours with the
    same bits as a float32 one, among near-ties and duplicates, alone and in a batch; and
    so do rows with too many int8 candidates, which are scored again in float32."""
    x, keys = _near_ties(scifact_small)
    quantized = _quantized(keys)
    for limit in (_INT8_CANDIDATES, 12):  # 12: most rows go on to the float32 scoring
        monkeypatch.setattr(batch_invariance, "_INT8_CANDIDATES", limit)
        for k in (1, 10, 45):
            single = top_k_cosines(x, keys, k)
            coarse = top_k_cosines(x, keys, k, quantized=quantized)
            assert torch.equal(single[0], coarse[0]) and torch.equal(single[1], coarse[1])
            for i in range(len(x)):
                alone = top_k_cosines(x[i : i + 1], keys, k, half=keys.half(), quantized=quantized)
                assert torch.equal(alone[0], single[0][i : i + 1]), (limit, k, i)
                assert torch.equal(alone[1], single[1][i : i + 1]), (limit, k, i)


@needs_exact_int8
def test_the_int8_margin_bounds_the_error(scifact_small: Any) -> None:
    """Every int8 first score lies within half its row's margin of the exact cosine (the
    margin's Cauchy-Schwarz bound, on real rows and keys, and on Gaussian rows)."""
    real = _rows(scifact_small, 384)
    keys, x = real[:600], real[600:]
    gaussian = unit_rows(torch.randn(64, 384, generator=torch.Generator().manual_seed(4)))
    quantized = _quantized(keys)
    for rows in (x, gaussian):
        scores, margin = _int8_first(rows, quantized)
        error = (scores.double() - rows.double() @ keys.double().T).abs().max(dim=1).values
        assert bool((error <= margin.double() / 2).all())
        assert float(margin.max()) < 0.1  # a bound that still prunes


@needs_exact_int8
def test_quantized_keys_only_for_a_memory_it_can_prune() -> None:
    """The bundled MiniLM memory gets int8 keys; multilingual-e5-small's, whose cosines
    crowd within a few hundredths, does not (hundreds of candidates a row)."""
    minilm = load_stitch(MODELS / "minilm-to-mpnet").domain
    e5 = load_stitch(MODELS / "e5-to-minilm").domain
    quantized = quantized_keys(minilm.keys, minilm.k)
    assert quantized is not None and quantized.codes.dtype == torch.int8
    assert int(quantized.codes.abs().max()) <= 127
    assert quantized_keys(e5.keys, e5.k) is None


def _saturating_int_mm(a: Tensor, b: Tensor) -> Tensor:
    """int8 products as CPUs without VNNI may form them: ``a`` shifted to uint8, pairs of
    products summed in saturating int16 (``vpmaddubsw``), the shift taken out after."""
    u = (a.long() + 128).unsqueeze(2)  # (n, d, 1)
    products = u * b.long().unsqueeze(0)  # (n, d, m)
    if products.shape[1] % 2:
        products = torch.cat([products, torch.zeros_like(products[:, :1])], dim=1)
    pairs = (products[:, 0::2] + products[:, 1::2]).clamp(-(2**15), 2**15 - 1)
    return (pairs.sum(dim=1) - 128 * b.long().sum(dim=0)).to(torch.int32)


def test_saturating_int8_products_are_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check behind the int8 scoring catches a kernel whose pair sums saturate (its
    extreme codes); such products would break the margin's bound."""
    a = torch.full((2, 8), 127, dtype=torch.int8)
    assert not torch.equal(_saturating_int_mm(a, a.T), (a.long() @ a.long().T).to(torch.int32))
    g = torch.Generator().manual_seed(0)
    small = torch.randint(-50, 50, (3, 8), dtype=torch.int8, generator=g)
    assert torch.equal(_saturating_int_mm(small, small.T), (small.long() @ small.long().T).int())
    monkeypatch.setattr(torch, "_int_mm", _saturating_int_mm)
    assert batch_invariance._int8_products_exact.__wrapped__() is False


def test_no_int8_first_scoring_without_exact_int8_products(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = unit_rows(torch.randn(50, 16, generator=torch.Generator().manual_seed(2)))
    assert quantized_keys(keys.to("meta"), 5) is None  # off the CPU
    monkeypatch.setattr(batch_invariance, "_int8_products_exact", lambda: False)
    assert quantized_keys(keys, 5) is None


def test_top_k_cosines_is_the_exact_ranking(scifact_small: Any) -> None:
    x, keys = _near_ties(scifact_small)
    cosines, index = top_k_cosines(x, keys, 10, half=keys.half())
    exact = x.double() @ keys.double().T
    assert torch.all(cosines[:, :-1] >= cosines[:, 1:])
    torch.testing.assert_close(cosines.double(), exact.gather(1, index), rtol=0, atol=1e-6)
    # nothing left out scores above the 10th by more than rounding
    rest = exact.scatter(1, index, -2.0)
    assert bool((rest.max(dim=1).values <= cosines[:, -1].double() + 1e-6).all())
    # duplicate keys: equal cosines, the lower index first
    dup = torch.arange(340, 348)
    both = top_k_cosines(keys[dup], keys, 8)
    assert torch.equal(both[1], torch.tensor([5, 340, 341, 342, 343, 344, 345, 346]).expand(8, 8))


def test_top_k_cosines_of_a_zero_row_is_the_first_keys(scifact_small: Any) -> None:
    x, keys = _near_ties(scifact_small)
    rows = torch.cat([x[:2], torch.zeros(1, x.shape[1]), x[2:3]])
    cosines, index = top_k_cosines(rows, keys, 4, half=keys.half())
    assert torch.equal(cosines[2], torch.zeros(4)) and torch.equal(index[2], torch.arange(4))
    alone = top_k_cosines(x[2:3], keys, 4)
    assert torch.equal(cosines[3:], alone[0]) and torch.equal(index[3:], alone[1])


def test_fixed_order_sum_is_the_same_bits_in_any_layout() -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.randn(64, 9, 385, generator=g)
    whole = fixed_order_sum(p)
    torch.testing.assert_close(whole.double(), p.double().sum(-1), rtol=0, atol=1e-4)
    assert torch.equal(fixed_order_sum(p[3:4, 2:3]), whole[3:4, 2:3])
    transposed = p.transpose(0, 1).contiguous().transpose(0, 1)  # other strides
    assert torch.equal(fixed_order_sum(transposed), whole)
    part = p[:, :, :200]  # a strided view
    assert torch.equal(fixed_order_sum(part), fixed_order_sum(part.contiguous()))
    assert torch.equal(fixed_order_sum(part.transpose(0, 1)).transpose(0, 1), fixed_order_sum(part))


def test_the_norms_off_the_cpu_are_the_same_bits_in_any_batch(scifact_small: Any) -> None:
    # the arithmetic a GPU runs (elementwise operations only), checked here on the CPU
    x = torch.from_numpy(scifact_small.corpus["minilm"][:120]).float() * 7.5
    whole = _fixed_order_norms(x)
    assert whole.shape == (120, 1) and whole.dtype == torch.float32
    torch.testing.assert_close(whole, torch.linalg.vector_norm(x, dim=1, keepdim=True))
    for i in range(32):
        assert torch.equal(_fixed_order_norms(x[i : i + 1]), whole[i : i + 1])
    assert torch.equal(_fixed_order_norms(x[5:12]), whole[5:12])
    assert torch.equal(_fixed_order_norms(torch.zeros(2, 384)), torch.zeros(2, 1))
    half = _fixed_order_norms(x.half())  # squared and added in float32
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), whole, rtol=1e-3, atol=0)


def test_a_frozen_stitch_gives_the_same_bits(scifact_small: Any) -> None:
    """freeze() keeps the keys in float16 for a lone vector's search and in int8 for the
    searches of small batches; the answers do not change."""
    plain = load_stitch(MODELS / "minilm-to-mpnet")
    frozen = load_stitch(MODELS / "minilm-to-mpnet").freeze()
    assert (
        plain.domain._frozen_keys() == (None, None) and frozen.domain._frozen_keys()[0] is not None
    )
    x = _rows(scifact_small, 384)
    with torch.inference_mode():
        for i in range(0, 40, 3):
            assert torch.equal(frozen(x[i : i + 1]), plain(x[i : i + 1]))
        for rows in (7, batch_invariance._INT8_MAX_ROWS, 16, 1024):
            assert torch.equal(frozen(x[:rows]), plain(x[:rows])), rows


@needs_exact_int8
def test_only_small_batches_are_scored_in_int8_first(
    scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen memory scores a lone vector and a small batch in int8 first, and a larger
    batch in float32: there the int8 scoring's wider candidate lists cost more to rescore
    than it saves (2.4 times slower for 1,024 SciFact documents, measured)."""
    memory = load_stitch(MODELS / "minilm-to-mpnet").domain.freeze()
    scored: list[int] = []
    first = batch_invariance._int8_first

    def counting(x: Tensor, quantized: Any) -> tuple[Tensor, Tensor]:
        scored.append(len(x))
        return first(x, quantized)

    monkeypatch.setattr(batch_invariance, "_int8_first", counting)
    x = _rows(scifact_small, 384)
    with torch.inference_mode():
        for rows in (1, 7, batch_invariance._INT8_MAX_ROWS, 16, 1024):
            memory(x[:rows])
    assert scored == [1, 7, batch_invariance._INT8_MAX_ROWS]


def test_the_half_keys_follow_the_keys(scifact_small: Any) -> None:
    """A change of the keys through torch after freeze() drops the float16 copy (found by an
    adversarial pass: a stale copy answered a lone vector from the old keys, and crashed
    with IndexError when the memory shrank)."""
    stitch = load_stitch(MODELS / "minilm-to-mpnet").domain.freeze()
    x = _rows(scifact_small, 384)[:8]
    with torch.inference_mode():
        before = stitch._neighbours(x[:1] - stitch.source_mean)[1]
    with torch.no_grad():
        stitch.keys.copy_(stitch.keys.flip(0))  # the same keys, in reverse order
    with torch.inference_mode():
        after = stitch._neighbours(x[:1] - stitch.source_mean)[1]
    assert torch.equal(after, stitch.memory - 1 - before)
    assert stitch._frozen_keys() == (None, None)  # float32 until frozen again
    stitch.freeze()
    keep = 1000  # a smaller memory: a new parameter, the same storage
    stitch.keys = torch.nn.Parameter(stitch.keys[:keep], requires_grad=False)
    stitch.values = torch.nn.Parameter(stitch.values[:keep], requires_grad=False)
    stitch.memory = keep
    with torch.inference_mode():
        alone = torch.cat([stitch._neighbours(x[i : i + 1])[1] for i in range(8)])
        assert torch.equal(alone, stitch._neighbours(x)[1])
        assert int(alone.max()) < keep


def test_no_float16_first_scoring_where_torch_may_accumulate_in_float16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first scoring's margin assumes float32 accumulation. torch accumulates float16
    products in float16 only when a user opts in (refused on CPUs without float16
    arithmetic, like this one), so the opted-in state is stood in for by its getter."""
    keys = unit_rows(torch.randn(50, 16, generator=torch.Generator().manual_seed(2)))
    half = half_keys(keys)
    assert half is not None and half.dtype == torch.float16
    getter = "_get_cpu_allow_fp16_reduced_precision_reduction"
    monkeypatch.setattr(torch._C, getter, lambda: True)
    assert half_keys(keys) is None
    monkeypatch.delattr(torch._C, getter)  # a torch without the switch: no float16 either
    assert half_keys(keys) is None


def test_rows_tied_with_the_whole_memory_are_rescored_against_every_key(
    scifact_small: Any,
) -> None:
    """Inputs orthogonal to every key have all cosines within the rounding margin: they are
    rescored against every key in bounded blocks (found by an adversarial pass: 256 such
    rows took 2.2 s and 1.9 GB; 6 ms at fcb1353), with the same exact answer alone and in
    a batch."""
    real = np.concatenate([scifact_small.corpus["minilm"], scifact_small.queries["minilm"]])
    real = unit_rows(torch.from_numpy(real.astype(np.float32)))  # 500 keys
    g = torch.Generator().manual_seed(3)
    basis = torch.linalg.qr(torch.randn(384, 8, generator=g)).Q
    keys = unit_rows(real - (real @ basis) @ basis.T)  # nothing along the 8 directions
    x = torch.cat([unit_rows(torch.randn(6, 8, generator=g) @ basis.T), real[:2]])
    exact = fixed_order_sum(keys.unsqueeze(0) * x.unsqueeze(1))  # (8, 500), fixed order
    assert float(exact[:6].abs().max()) < 1e-6  # every key tied within the margin
    order = exact.sort(dim=1, descending=True, stable=True).indices[:, :10]
    cosines, index = top_k_cosines(x, keys, 10)
    assert torch.equal(index, order) and torch.equal(cosines, exact.gather(1, order))
    quantized = _quantized(keys) if batch_invariance._int8_products_exact() else None
    assert torch.equal(top_k_cosines(x, keys, 10, quantized=quantized)[1], index)
    for i in range(len(x)):
        alone = top_k_cosines(x[i : i + 1], keys, 10, half=keys.half(), quantized=quantized)
        assert torch.equal(alone[0], cosines[i : i + 1])
        assert torch.equal(alone[1], index[i : i + 1])


@needs_exact_int8
def test_no_int8_keys_where_int8_products_go_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by an adversarial pass: torch 2.13's CPU ``_int_mm`` returns garbage for an
    inner dimension of 1, which the fixed-shape check did not probe, so a 1-d memory got
    wrong neighbours. Small dimensions get no int8 keys, and a memory's own shapes are
    checked against int64 products."""
    g = torch.Generator().manual_seed(5)
    for d in (1, 8):
        assert quantized_keys(unit_rows(torch.randn(60, d, generator=g)), 3) is None
    keys = unit_rows(torch.randn(60, 24, generator=g))
    product = torch._int_mm

    def wrong_for_24(a: Tensor, b: Tensor) -> Tensor:
        out = product(a, b)
        return out + 1 if a.shape[1] == 24 else out

    monkeypatch.setattr(torch, "_int_mm", wrong_for_24)
    assert batch_invariance._int8_products_exact.__wrapped__()  # the fixed shapes pass
    assert quantized_keys(keys, 3) is None


def test_a_nan_row_does_not_break_the_batch(scifact_small: Any) -> None:
    """Outside the contract (unit rows), a NaN row gets an answer instead of failing the
    whole batch (found by an adversarial pass: a ValueError for every row); the other rows
    keep their bits."""
    keys = _rows(scifact_small, 384)[:500]
    x = _rows(scifact_small, 384)[600:606].clone()
    x[2] = float("nan")
    quantized = _quantized(keys) if batch_invariance._int8_products_exact() else None
    for first in ({}, {"quantized": quantized}, {"half": keys.half()}):
        cosines, index = top_k_cosines(x, keys, 10, **first)
        assert torch.equal(index[2], torch.arange(10)) and bool(cosines[2].isnan().all())
        for i in (0, 1, 3, 4, 5):
            alone = top_k_cosines(x[i : i + 1], keys, 10)
            assert torch.equal(cosines[i : i + 1], alone[0])
            assert torch.equal(index[i : i + 1], alone[1])


def test_the_frozen_keys_follow_a_round_trip_through_float16() -> None:
    """Found by an adversarial pass: ``.half().float()`` replaces the keys' data, and the
    allocator can hand the new keys the old address with the version counter unchanged, so
    the int8 copy went on scoring the old keys. The memory below has key B first and 30
    copies of key A, A above B in float32 and equal in float16: after the round trip the
    lower index, B, is the nearest."""
    d, unit = 3000, 2.0**-24

    def key(n: int) -> Tensor:  # exactly representable in int8 codes
        k = torch.zeros(d)
        k[0], k[1] = 127 * n * unit, 10 * n * unit
        return k

    stitch = LocalStitch(d, 2, memory=31, k=1, temperature=0.05, strength=1.0, sink=-1.0)
    with torch.no_grad():
        stitch.keys.copy_(torch.stack([key(131685)] + [key(131749)] * 30))
    stitch.eval().freeze()
    x = torch.zeros(1, d)
    x[0, 0] = 1
    with torch.no_grad():
        assert int(stitch._neighbours(x)[1]) != 0  # A wins in float32
        stitch.half()
        stitch.float()
        assert int(stitch._neighbours(x)[1]) == 0  # tied in float16: B, the lower index
