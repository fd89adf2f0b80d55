"""Stitches: small ``torch.nn.Module`` maps from a source embedding space to a target one.

Every stitch maps a ``(n, d_src)`` tensor to a ``(n, d_tgt)`` tensor on any device and
dtype, stores its centring vectors (``source_mean``, ``target_mean``), declares the config
keys it saves (``config_keys``), and is looked up by name in :data:`STITCH_REGISTRY`,
never by importing a class path from a config file.

Matrices follow ``torch.nn.Linear``: ``weight`` has shape ``(d_tgt, d_src)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lead.errors import ShapeMismatchError, UnknownArchitectureError

__all__ = [
    "STITCH_REGISTRY",
    "AffineStitch",
    "MLPStitch",
    "OrthogonalStitch",
    "Stitch",
    "StitchInfo",
    "stitch_class",
]


@dataclass
class StitchInfo:
    """What a stitch maps between and how it was made (saved in ``config.json``).

    Attributes
    ----------
    source_model, target_model : str
        Model ids of the source and target embedding models (Hub ids where they exist).
    source_normalized, target_normalized : bool
        Whether the models' vectors are L2-normalised.
    source_revision, target_revision : str or None
        Pinned model revisions, when known.
    fit : dict
        How the stitch was fitted: method, pair count, data description, seed, options.
    scorecard : dict or None
        The held-out alignment scorecard (:meth:`lead.Scorecard.to_dict`).
    """

    source_model: str = "unknown-source"
    target_model: str = "unknown-target"
    source_normalized: bool = True
    target_normalized: bool = True
    source_revision: str | None = None
    target_revision: str | None = None
    fit: dict[str, Any] = field(default_factory=dict)
    scorecard: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Stitch(nn.Module):
    """Base class: centre, map, add the target mean, optionally L2-normalise.

    Parameters
    ----------
    d_src, d_tgt : int
        Source and target dimensions.
    normalize_output : bool
        L2-normalise every output row (for targets whose vectors are unit length).
    info : StitchInfo, optional
        Models and provenance; saved with the stitch.
    """

    architecture: ClassVar[str] = ""
    #: Architecture parameters saved in ``config.json`` and passed back to ``__init__``.
    config_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        d_src: int,
        d_tgt: int,
        *,
        normalize_output: bool = False,
        info: StitchInfo | None = None,
    ) -> None:
        super().__init__()
        if d_src < 1 or d_tgt < 1:
            raise ShapeMismatchError(
                f"dimensions must be positive, got d_src={d_src}, d_tgt={d_tgt}",
                expected=">= 1",
                got=(d_src, d_tgt),
            )
        self.d_src = int(d_src)
        self.d_tgt = int(d_tgt)
        self.normalize_output = bool(normalize_output)
        self.info = info if info is not None else StitchInfo()
        self.source_mean = nn.Parameter(torch.zeros(d_src), requires_grad=False)
        self.target_mean = nn.Parameter(torch.zeros(d_tgt), requires_grad=False)

    def get_config(self) -> dict[str, Any]:
        """Architecture parameters, the keys of :attr:`config_keys`."""
        return {key: getattr(self, key) for key in self.config_keys}

    def _map(self, x_centred: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Translate a batch.

        Parameters
        ----------
        x : Tensor of shape (n, d_src)
            Source-model vectors, any floating dtype, on the stitch's device.

        Returns
        -------
        Tensor of shape (n, d_tgt)
            Target-space vectors in ``x``'s dtype; unit rows when ``normalize_output``.

        Raises
        ------
        ShapeMismatchError
            If ``x`` is not two-dimensional with ``d_src`` columns.
        """
        if x.ndim != 2 or x.shape[1] != self.d_src:
            raise ShapeMismatchError(
                f"expected input of shape (n, {self.d_src}), got {tuple(x.shape)}",
                expected=self.d_src,
                got=tuple(x.shape),
            )
        y = self._map(x - self.source_mean) + self.target_mean
        if self.normalize_output:
            # divide by the largest entry first, so that a row whose norm would overflow
            # (finite entries above ~1e19 in float32) is normalised, not turned into zeros
            peak = y.detach().abs().amax(dim=1, keepdim=True)
            y = nn.functional.normalize(y / torch.where(peak > 0, peak, 1.0), dim=1)
        return y


class AffineStitch(Stitch):
    r"""Affine map :math:`y = W (x - \mu_x) + \mu_y`, fitted by ridge least squares.

    Tensors: ``weight`` ``(d_tgt, d_src)``, ``source_mean`` ``(d_src,)``,
    ``target_mean`` ``(d_tgt,)``.
    """

    architecture = "affine"

    def __init__(self, d_src: int, d_tgt: int, **kwargs: Any) -> None:
        super().__init__(d_src, d_tgt, **kwargs)
        self.weight = nn.Parameter(torch.zeros(d_tgt, d_src))

    def _map(self, x_centred: Tensor) -> Tensor:
        return x_centred @ self.weight.T


class OrthogonalStitch(Stitch):
    r"""Centred orthogonal map :math:`y = s \odot (R (x - \mu_x)) + \mu_y`.

    ``weight`` ``(d_tgt, d_src)`` has orthonormal rows or columns (the smaller side; a
    zero-padded rotation when ``d_src != d_tgt``); ``scale`` ``(d_tgt,)`` is all ones
    unless the stitch was fitted with per-dimension scaling (``scaling=True``).
    """

    architecture = "orthogonal"
    config_keys = ("scaling",)

    def __init__(self, d_src: int, d_tgt: int, *, scaling: bool = False, **kwargs: Any) -> None:
        super().__init__(d_src, d_tgt, **kwargs)
        self.scaling = bool(scaling)
        self.weight = nn.Parameter(torch.zeros(d_tgt, d_src))
        self.scale = nn.Parameter(torch.ones(d_tgt))

    def _map(self, x_centred: Tensor) -> Tensor:
        return (x_centred @ self.weight.T) * self.scale


class MLPStitch(Stitch):
    r"""Affine map plus a residual MLP: :math:`y = W x_c + f(x_c) + \mu_y`, :math:`x_c = x - \mu_x`.

    ``f`` is ``depth`` blocks of Linear → GELU (width ``hidden_dim``) and a final Linear to
    ``d_tgt`` that starts at zero, so an untrained MLP stitch equals its affine part.
    Tensors: ``weight`` ``(d_tgt, d_src)``, ``mlp.{i}.weight`` / ``mlp.{i}.bias`` of
    ``nn.Linear`` layers, ``source_mean``, ``target_mean``.
    """

    architecture = "mlp"
    config_keys = ("hidden_dim", "depth")

    def __init__(
        self, d_src: int, d_tgt: int, *, hidden_dim: int = 512, depth: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(d_src, d_tgt, **kwargs)
        if hidden_dim < 1 or depth < 1:
            raise ShapeMismatchError(
                f"hidden_dim and depth must be positive, got {hidden_dim}, {depth}",
                expected=">= 1",
                got=(hidden_dim, depth),
            )
        self.hidden_dim = int(hidden_dim)
        self.depth = int(depth)
        self.weight = nn.Parameter(torch.zeros(d_tgt, d_src))
        layers: list[nn.Module] = []
        width = d_src
        for _ in range(depth):
            layers += [nn.Linear(width, hidden_dim), nn.GELU()]
            width = hidden_dim
        last = nn.Linear(width, d_tgt)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        layers.append(last)
        self.mlp = nn.Sequential(*layers)

    def _map(self, x_centred: Tensor) -> Tensor:
        residual: Tensor = self.mlp(x_centred)
        return x_centred @ self.weight.T + residual


#: Architecture name → stitch class. The only way a config names a class.
STITCH_REGISTRY: dict[str, type[Stitch]] = {
    cls.architecture: cls for cls in (AffineStitch, OrthogonalStitch, MLPStitch)
}


def stitch_class(architecture: str) -> type[Stitch]:
    """Look an architecture name up in :data:`STITCH_REGISTRY`.

    Raises
    ------
    UnknownArchitectureError
        If the name is not registered.
    """
    try:
        return STITCH_REGISTRY[architecture]
    except KeyError:
        known = ", ".join(sorted(STITCH_REGISTRY))
        raise UnknownArchitectureError(
            f"unknown stitch architecture {architecture!r}; known: {known}"
        ) from None
