"""Stitch modules: shapes, centring, normalisation, registry."""

from __future__ import annotations

import pytest
import torch

from lead.errors import ShapeMismatchError, UnknownArchitectureError
from lead.stitches import (
    STITCH_REGISTRY,
    AffineStitch,
    MLPStitch,
    OrthogonalStitch,
    StitchInfo,
    stitch_class,
)


def _randomise(stitch: torch.nn.Module, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in stitch.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))


@pytest.mark.parametrize("cls", [AffineStitch, OrthogonalStitch, MLPStitch])
def test_forward_maps_n_by_d_src_to_n_by_d_tgt(cls: type) -> None:
    stitch = cls(6, 4)
    _randomise(stitch)
    y = stitch(torch.randn(5, 6))
    assert y.shape == (5, 4) and y.dtype == torch.float32
    assert torch.isfinite(y).all()
    y64 = stitch.double()(torch.randn(3, 6, dtype=torch.float64))
    assert y64.dtype == torch.float64


def test_affine_stitch_computes_centred_affine_map() -> None:
    stitch = AffineStitch(3, 2)
    _randomise(stitch)
    x = torch.randn(4, 3)
    expected = (x - stitch.source_mean) @ stitch.weight.T + stitch.target_mean
    assert torch.allclose(stitch(x), expected)


def test_orthogonal_stitch_applies_per_dimension_scale() -> None:
    stitch = OrthogonalStitch(3, 3, scaling=True)
    _randomise(stitch)
    x = torch.randn(4, 3)
    expected = ((x - stitch.source_mean) @ stitch.weight.T) * stitch.scale + stitch.target_mean
    assert torch.allclose(stitch(x), expected)
    assert stitch.get_config() == {"scaling": True}


def test_untrained_mlp_stitch_equals_its_affine_part() -> None:
    mlp = MLPStitch(5, 3, hidden_dim=8, depth=2)
    affine = AffineStitch(5, 3)
    with torch.no_grad():
        w = torch.randn(3, 5)
        mlp.weight.copy_(w)
        affine.weight.copy_(w)
    x = torch.randn(7, 5)
    assert torch.allclose(mlp(x), affine(x))
    assert mlp.get_config() == {"hidden_dim": 8, "depth": 2}


def test_normalize_output_gives_unit_rows() -> None:
    stitch = AffineStitch(4, 4, normalize_output=True)
    _randomise(stitch)
    norms = stitch(torch.randn(6, 4)).norm(dim=1)
    assert torch.allclose(norms, torch.ones(6), atol=1e-6)


def test_forward_rejects_wrong_input_dimension() -> None:
    with pytest.raises(ShapeMismatchError) as info:
        AffineStitch(4, 2)(torch.randn(3, 5))
    assert info.value.expected == 4
    with pytest.raises(ShapeMismatchError):
        AffineStitch(4, 2)(torch.randn(4))


def test_forward_names_inputs_it_cannot_take_and_promotes_narrower_ones() -> None:
    """A NumPy array and a float64 tensor raised torch's TypeError / RuntimeError from deep
    in the map (an adversarial pass, on the bundled gated stitch)."""
    from lead.errors import InvalidInputError

    for cls in (AffineStitch, MLPStitch):
        stitch = cls(4, 2)
        _randomise(stitch)
        x = torch.randn(3, 4)
        for bad, message in [
            (x.numpy(), "takes a torch.Tensor, got ndarray; lead.apply_stitch takes arrays"),
            (x.double(), "the input is torch.float64 but the stitch computes in torch.float32"),
            (x.round().int(), "the input is torch.int32"),
        ]:
            with pytest.raises(InvalidInputError, match=message):
                stitch(bad)
        for narrow in (x.half(), x.bfloat16()):
            y = stitch(narrow)
            assert y.dtype == torch.float32 and y.shape == (3, 2)
            torch.testing.assert_close(y, stitch(narrow.float()), rtol=0, atol=0)
        assert stitch.double()(x.double()).dtype == torch.float64


@pytest.mark.parametrize(("d_src", "d_tgt"), [(0, 3), (3, 0)])
def test_dimensions_must_be_positive(d_src: int, d_tgt: int) -> None:
    with pytest.raises(ShapeMismatchError):
        AffineStitch(d_src, d_tgt)
    with pytest.raises(ShapeMismatchError):
        MLPStitch(3, 3, hidden_dim=0)


def test_registry_resolves_names_and_rejects_unknown_ones() -> None:
    assert set(STITCH_REGISTRY) == {"affine", "orthogonal", "mlp", "invertible", "local", "gated"}
    assert stitch_class("orthogonal") is OrthogonalStitch
    with pytest.raises(UnknownArchitectureError, match="known: affine"):
        stitch_class("lstm")


def test_stitch_info_defaults_and_dict() -> None:
    info = StitchInfo(source_model="a", target_model="b")
    assert info.to_dict()["fit"] == {} and info.scorecard is None
    assert AffineStitch(2, 2).info == StitchInfo()


def test_normalised_output_survives_a_norm_that_would_overflow() -> None:
    stitch = AffineStitch(3, 2, normalize_output=True)
    with torch.no_grad():
        stitch.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    x = torch.tensor([[3e30, 4e30, 0.0], [3.0, 4.0, 0.0], [0.0, 0.0, 1.0]])
    y = stitch(x)
    torch.testing.assert_close(y[0], torch.tensor([0.6, 0.8]))  # not zeros
    torch.testing.assert_close(y[1], torch.tensor([0.6, 0.8]))
    assert torch.equal(y[2], torch.zeros(2))  # a zero map stays zero, no NaN
    inf = stitch(torch.tensor([[float("inf"), 1.0, 0.0]]))
    assert not torch.isfinite(inf).all()  # an overflowing entry is still reported


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_normalising_a_zero_row_gives_zero_in_every_dtype(dtype: torch.dtype) -> None:
    stitch = AffineStitch(4, 4, normalize_output=True).to(dtype)
    x = torch.zeros(3, 4, dtype=dtype)
    x[1] = torch.tensor([1.0, 2.0, 0.0, 0.0], dtype=dtype)
    with torch.no_grad():
        stitch.weight.copy_(torch.eye(4, dtype=dtype))
        y = stitch(x)
    assert bool(torch.isfinite(y).all())
    assert torch.equal(y[0], torch.zeros(4, dtype=dtype))
    assert float(y[1].float().norm()) == pytest.approx(1.0, abs=1e-2)
