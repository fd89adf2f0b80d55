"""Stitches: small ``torch.nn.Module`` maps from a source embedding space to a target one.

Every stitch maps a ``(n, d_src)`` tensor to a ``(n, d_tgt)`` tensor on any device and
dtype, stores its centring vectors (``source_mean``, ``target_mean``), declares the config
keys it saves (``config_keys``), and is looked up by name in :data:`STITCH_REGISTRY`,
never by importing a class path from a config file.

Matrices follow ``torch.nn.Linear``: ``weight`` has shape ``(d_tgt, d_src)``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch
from torch import Tensor, nn

from lead.batch_invariance import (
    ROW_INVARIANT,
    QuantizedKeys,
    fixed_order_sum,
    forward_batch_invariant,
    half_keys,
    one_thread,
    quantized_keys,
    row_norms,
    top_k_cosines,
)
from lead.errors import (
    InvalidInputError,
    NoConfidenceError,
    NotInvertibleError,
    ShapeMismatchError,
    UnknownArchitectureError,
)

if TYPE_CHECKING:
    from lead._confidence_head import ConfidenceHead

__all__ = [
    "STITCH_REGISTRY",
    "AffineStitch",
    "GatedStitch",
    "InvertibleStitch",
    "LocalStitch",
    "MLPStitch",
    "OrthogonalStitch",
    "ResidualMemory",
    "Stitch",
    "StitchInfo",
    "oriented",
    "stitch_class",
]


#: The most layers (MLP blocks, coupling layers) a stitch may declare: a config asking for
#: millions built them one module at a time, for minutes and gigabytes, before its weights
#: were read.
MAX_LAYERS = 256


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

    def __post_init__(self) -> None:
        """Refuse what ``config.json`` could not hold or load back (a saved stitch whose
        model is 5 would only fail at :func:`lead.load_stitch`).

        Raises
        ------
        InvalidInputError
            A model id that is not a non-empty string, a ``*_normalized`` that is not a
            bool, a revision that is not a string or None, a ``fit`` that is not a dict
            or a ``scorecard`` that is not a dict or None (``param`` names the field).
        """
        text = ("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))
        flag = ("true or false", lambda v: isinstance(v, bool))
        revision = ("a string or None", lambda v: v is None or isinstance(v, str))
        checks: dict[str, tuple[str, Callable[[Any], bool]]] = {
            "source_model": text,
            "target_model": text,
            "source_normalized": flag,
            "target_normalized": flag,
            "source_revision": revision,
            "target_revision": revision,
            "fit": ("a dict", lambda v: isinstance(v, dict)),
            "scorecard": ("a dict or None", lambda v: v is None or isinstance(v, dict)),
        }
        for name, (kind, valid) in checks.items():
            value = getattr(self, name)
            if not valid(value):
                raise InvalidInputError(
                    f"StitchInfo.{name} must be {kind}, got {value!r}"[:300], param=name
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Stitch(nn.Module):
    r"""Base class: centre, map, add the target mean, optionally L2-normalise.

    Parameters
    ----------
    d_src, d_tgt : int
        Source and target dimensions.
    normalize_output : bool
        L2-normalise every output row (for targets whose vectors are unit length).
    info : StitchInfo, optional
        Models and provenance; saved with the stitch.
    output_scale : bool, default False
        Hold a fitted scalar ``output_scale`` (tensor of shape (1,), starts at 1) that
        multiplies the mapped residual before the target mean is added:
        :math:`y = s\,g(x - \mu_x) + \mu_y` (:func:`lead.calibration.fit_output_scale`).
        Off, the stitch has no such tensor and computes exactly what it did without it;
        on, ``config.json`` says ``"output_scale": true``.
    """

    architecture: ClassVar[str] = ""
    #: Architecture parameters saved in ``config.json`` and passed back to ``__init__``.
    config_keys: ClassVar[tuple[str, ...]] = ()
    #: Architecture parameters added after the first artifacts were saved: saved like
    #: :attr:`config_keys`, and a config without one is built with the default given here.
    optional_config_keys: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        d_src: int,
        d_tgt: int,
        *,
        normalize_output: bool = False,
        info: StitchInfo | None = None,
        output_scale: bool = False,
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
        self.output_scale: nn.Parameter | None
        self.register_parameter(
            "output_scale",
            nn.Parameter(torch.ones(1), requires_grad=False) if output_scale else None,
        )

    #: The submodule name of :attr:`confidence_head` (its tensors are ``confidence.*``).
    CONFIDENCE: ClassVar[str] = "confidence"

    @property
    def confidence_head(self) -> ConfidenceHead | None:
        """The stitch's :class:`~lead.confidence.ConfidenceHead`, or None (the default).

        Stored as the submodule ``confidence``, so its buffers follow the stitch's device
        and are saved as ``confidence.*`` tensors (:func:`lead.artifacts.save_stitch`).
        """
        head = self._modules.get(self.CONFIDENCE)
        return head  # type: ignore[return-value]

    @confidence_head.setter
    def confidence_head(self, head: ConfidenceHead | None) -> None:
        self._modules.pop(self.CONFIDENCE, None)
        if head is not None:
            self.add_module(self.CONFIDENCE, head)

    def score_confidence(
        self,
        x: Tensor,
        y: Tensor,
        *,
        features: Tensor | None = None,
        unnormalized: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """:meth:`ConfidenceHead.score <lead.confidence.ConfidenceHead.score>` of this
        stitch's output ``y`` for its input ``x``.

        A head of version 3 or later scores the output *before* the stitch's final L2
        normalisation (``normalize_output``): how far the map shrank a row towards the
        target mean, which unit rows no longer show, is its best sign of doubt
        (:mod:`lead.confidence`). Older heads score the output itself; a ``y`` in a
        reduced precision is then scored in float32 and, for a stitch with unit outputs,
        back on the unit sphere (their features include the norm of a unit row, which
        bfloat16 rounding moves by ~4e-3: up to 0.30 of confidence on the bundled stitches
        before this; renormalised, at most 0.03).

        Parameters
        ----------
        x : Tensor of shape (n, d_src)
            What the forward received.
        y : Tensor of shape (n, d_tgt)
            The forward's output, any floating dtype.
        features : Tensor of shape (n, len(confidence_feature_names)), optional
            :meth:`confidence_features` of ``x`` when already at hand (computed here
            otherwise).
        unnormalized : Tensor of shape (n, d_tgt), optional
            :meth:`forward_unnormalized` of ``x`` when already at hand (computed here when
            the head needs it).

        Returns
        -------
        confidence : Tensor of shape (n,), float32 in [0, 1]
        out_of_distribution : Tensor of shape (n,), bool

        Raises
        ------
        NoConfidenceError
            If the stitch has no confidence head.
        """
        head = self.confidence_head
        if head is None:
            raise NoConfidenceError("this stitch has no confidence head", param="stitch")
        if head.scores_unnormalized and self.normalize_output:
            y = self.forward_unnormalized(x) if unnormalized is None else unnormalized
            y = y.float()
        elif y.dtype != torch.float32:
            y = unit_rows(y.float()) if self.normalize_output else y.float()
        if head.stitch_features and features is None:
            features = self._row_invariant_call(self.confidence_features, x)
        return head.score(x, y, features if head.stitch_features else None)

    def forward_scored(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The batch-invariant forward of ``x`` and its :meth:`score_confidence`: what the
        service, ``lead translate`` and :func:`lead.confidence.translate_with_confidence`
        compute for confidences. A stitch whose confidence features come out of its
        forward's own work (a gated stitch's memory search) does that work once, and the
        output before its L2 normalisation, which heads of version 3 score, comes out of
        the same forward.

        Parameters
        ----------
        x : Tensor of shape (n, d_src)
            What the forward receives (after :func:`lead.unit_input.normalize_input`).

        Returns
        -------
        y : Tensor of shape (n, d_tgt)
            ``forward_batch_invariant(self, x)``, bit for bit.
        confidence, out_of_distribution : Tensor of shape (n,)
            As :meth:`score_confidence` gives them for ``y``.

        Raises
        ------
        NoConfidenceError, ShapeMismatchError
            No confidence head; ``x`` not of shape (n, d_src).
        """
        head = self.confidence_head
        if head is None:
            raise NoConfidenceError("this stitch has no confidence head", param="stitch")
        if not (head.scores_unnormalized and self.normalize_output):
            y = forward_batch_invariant(self, x)
            return (y, *self.score_confidence(x, y))
        # one forward for both, in the padded shapes of forward_batch_invariant(self, x)
        both = self._row_invariant_call(self._output_and_unnormalized, x)
        y, raw = both[:, : self.d_tgt].contiguous(), both[:, self.d_tgt :].contiguous()
        return (y, *self.score_confidence(x, y, unnormalized=raw))

    def forward_unnormalized(self, x: Tensor) -> Tensor:
        """The forward before its final L2 normalisation: the same as the forward when
        ``normalize_output`` is off; batch-invariant
        (:func:`lead.batch_invariance.forward_batch_invariant`).

        Parameters
        ----------
        x : Tensor of shape (n, d_src)
            What the forward receives.

        Returns
        -------
        Tensor of shape (n, d_tgt)
            In ``x``'s dtype; its row norms are how far the map reached from the origin
            (a row shrunk towards the target mean is one the map is unsure of).

        Raises
        ------
        ShapeMismatchError
            If ``x`` is not two-dimensional with ``d_src`` columns.
        """
        return self._row_invariant_call(self._unnormalized_forward, x)

    def _unnormalized_forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return self._unnormalized(self._map(x - self.source_mean))

    def _output_and_unnormalized(self, x: Tensor) -> Tensor:
        """The forward's output and, beside it, the same before the L2 normalisation:
        shape (n, 2 d_tgt)."""
        raw = self._unnormalized_forward(x)
        return torch.cat([unit_rows(raw), raw], dim=1)

    def _row_invariant_call(self, run: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """``run(x)`` batch-invariantly: as it is on the CPU when the stitch is batch-invariant
        by itself (``row_invariant``), else through
        :func:`~lead.batch_invariance.forward_batch_invariant`."""
        if x.device.type == "cpu" and getattr(self, ROW_INVARIANT, False):
            return run(x)
        return forward_batch_invariant(run, x)

    #: Names of :meth:`confidence_features`' columns (none by default).
    confidence_feature_names: ClassVar[tuple[str, ...]] = ()

    def typical_inputs(self) -> Tensor | None:
        """Real inputs of the kind the stitch was fitted on, when it keeps some (shape
        (m, d_src), unit rows), else None (the default): e.g. for a probe that must land
        inside the training distribution, where a confidence head does not flag it."""
        return None

    def confidence_features(self, x: Tensor) -> Tensor:
        """The stitch's own per-row evidence of how well it translates ``x``, which its
        confidence head weighs beside its generic features (:mod:`lead.confidence`).

        Parameters
        ----------
        x : Tensor of shape (n, d_src)
            What the forward receives.

        Returns
        -------
        Tensor of shape (n, len(confidence_feature_names)), float32
            Row ``i`` depends on ``x[i]`` only. The base class has none: shape (n, 0).
        """
        return x.new_zeros((x.shape[0], 0), dtype=torch.float32)

    def __setattr__(self, name: str, value: Any) -> None:
        # nn.Module would register a module under the attribute's own name, bypassing the
        # property; route it through the property instead
        if name == "confidence_head":
            type(self).confidence_head.fset(self, value)  # type: ignore[attr-defined]
            return
        super().__setattr__(name, value)

    def get_config(self) -> dict[str, Any]:
        """Architecture parameters, the keys of :attr:`config_keys` and
        :attr:`optional_config_keys` (and ``output_scale: true`` when the stitch holds a
        fitted output scale)."""
        keys = (*self.config_keys, *self.optional_config_keys)
        config = {key: getattr(self, key) for key in keys}
        if self.output_scale is not None:
            config["output_scale"] = True
        return config

    def set_output_scale(self, scale: float) -> None:
        r"""Hold (or replace) the output scale ``s`` of :math:`y = s\,g(x - \mu_x) + \mu_y`.

        Raises
        ------
        InvalidInputError
            If ``scale`` is not a finite positive number.
        """
        value = float(scale)
        if not math.isfinite(value) or value <= 0:
            raise InvalidInputError(
                f"output scale must be finite and positive, got {scale}", param="output_scale"
            )
        tensor = torch.full((1,), value, dtype=self.target_mean.dtype)
        self.output_scale = nn.Parameter(tensor.to(self.target_mean.device), requires_grad=False)

    def check_loaded(self) -> None:
        """Check tensor values that shapes and finiteness do not cover, after loading a
        file: an output scale must be positive (:meth:`set_output_scale` refuses others).

        Raises
        ------
        InvalidInputError
            A value the stitch could not have been fitted with.
        """
        if self.output_scale is not None and not bool((self.output_scale > 0).all()):
            raise InvalidInputError("output_scale must be positive", param="output_scale")

    def freeze(self) -> Self:
        """Declare the stitch's tensors final, as a server does: the stitch may then keep
        what speeds up its forward (a local stitch: its memory keys in int8 and float16).
        The answers are the same bits either way.

        A later change of a tensor through torch (its in-place operations,
        ``load_state_dict``, ``.to()``, a new parameter) is noticed and drops what was kept;
        a write that bypasses torch's version counter (through ``.data`` or a NumPy view)
        is not: call :meth:`freeze` again after one.

        Returns
        -------
        Stitch
            ``self``.
        """
        for child in self.children():
            if isinstance(child, Stitch):
                child.freeze()
        return self

    def _map(self, x_centred: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Translate a batch: the map itself, on ``x`` as given.

        :func:`lead.apply_stitch` (and ``lead translate``, the service) first scales inputs
        to unit length when the stitch was fitted on unit-length vectors
        (``info.source_normalized``) and refuses zero vectors; call it for translations,
        and this method where ``x`` is known to be what the stitch was fitted on.

        Parameters
        ----------
        x : Tensor of shape (n, d_src)
            Source-model vectors on the stitch's device, in its dtype or a narrower
            floating one (float16 and bfloat16 are promoted). Not checked for NaN or
            infinity, which :func:`lead.apply_stitch` refuses.

        Returns
        -------
        Tensor of shape (n, d_tgt)
            Target-space vectors in the stitch's dtype; unit rows when ``normalize_output``.

        Raises
        ------
        ShapeMismatchError
            If ``x`` is not two-dimensional with ``d_src`` columns.
        InvalidInputError
            If ``x`` is not a tensor, not floating, or wider than the stitch's dtype
            (float64 into a float32 stitch).
        """
        self._check_input(x)
        return self._output(self._map(x - self.source_mean))

    def _check_input(self, x: Tensor, *, inverse: bool = False) -> None:
        """Refuse what the forward (or, ``inverse``, an invertible stitch's inverse) cannot
        take: not a tensor, not floating, wider than the stitch's dtype, or not of shape
        (n, d_src) ((n, d_tgt) for the inverse)."""
        name, dim, call = ("y", self.d_tgt, "inverse") if inverse else ("x", self.d_src, "forward")
        if not isinstance(x, Tensor):  # numpy's "unsupported operand type(s) for -"
            raise InvalidInputError(
                f"the {call} takes a torch.Tensor, got {type(x).__name__}; "
                "lead.apply_stitch takes arrays (and checks them)",
                param=name,
            )
        wider = torch.promote_types(x.dtype, self.source_mean.dtype)
        if not x.is_floating_point() or wider != self.source_mean.dtype:
            # torch's "expected m1 and m2 to have the same dtype" from deep in the map
            raise InvalidInputError(
                f"the input is {x.dtype} but the stitch computes in "
                f"{self.source_mean.dtype}: cast it ({name}.to({self.source_mean.dtype})), or "
                "call lead.apply_stitch, which does",
                param=name,
            )
        if x.ndim != 2 or x.shape[1] != dim:
            raise ShapeMismatchError(
                f"expected input of shape (n, {dim}), got {tuple(x.shape)}",
                expected=dim,
                got=tuple(x.shape),
            )

    def _output(self, residual: Tensor) -> Tensor:
        """The forward's output from its map's ``residual``: the output scale, the target
        mean, and unit rows when ``normalize_output``."""
        y = self._unnormalized(residual)
        return unit_rows(y) if self.normalize_output else y

    def _unnormalized(self, residual: Tensor) -> Tensor:
        """The output scale and the target mean applied to the map's ``residual``."""
        if self.output_scale is not None:
            residual = residual * self.output_scale
        return residual + self.target_mean


def unit_rows(y: Tensor) -> Tensor:
    """L2-normalise the rows of ``y`` (an all-zero row stays zero).

    Divides by the largest entry first, so that a row whose norm would overflow (finite
    entries above ~1e19 in float32) is normalised, not turned into zeros.
    """
    peak = y.detach().abs().amax(dim=1, keepdim=True)
    scaled = y / torch.where(peak > 0, peak, 1.0)
    # nn.functional.normalize(scaled, dim=1, eps=0.5) (on the CPU the same bits, in fewer
    # operators; elsewhere row_norms adds the squares in a fixed order, batch-invariantly).
    # After the division every non-zero row has norm >= 1, so 0.5 only keeps zero rows at
    # zero (normalize's default 1e-12 underflows to 0 in float16 and gives 0 / 0 = NaN)
    unit: Tensor = scaled / row_norms(scaled).clamp_min(0.5)
    return unit


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
        # a hidden_dim of 16.5 reached torch ("empty(): argument 'size' ... float")
        if (
            hidden_dim < 1
            or not 1 <= depth <= MAX_LAYERS
            or int(hidden_dim) != hidden_dim
            or int(depth) != depth
        ):
            raise ShapeMismatchError(
                f"hidden_dim must be a positive integer and depth in [1, {MAX_LAYERS}] an "
                f"integer, got {hidden_dim}, {depth}",
                expected=">= 1",
                got=(hidden_dim, depth),
            )
        self.hidden_dim = int(hidden_dim)
        self.depth = int(depth)
        self.weight = nn.Parameter(torch.zeros(d_tgt, d_src))
        layers: list[nn.Module] = []
        width = d_src
        for _ in range(self.depth):
            layers += [nn.Linear(width, self.hidden_dim), nn.GELU()]
            width = self.hidden_dim
        last = nn.Linear(width, d_tgt)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        layers.append(last)
        self.mlp = nn.Sequential(*layers)

    def _map(self, x_centred: Tensor) -> Tensor:
        residual: Tensor = self.mlp(x_centred)
        return x_centred @ self.weight.T + residual


class LocalStitch(Stitch):
    r"""A global linear map corrected by the residuals of the nearest training pairs.

    :math:`y = W x_c + \mu_y + \lambda \sum_{j \in N_k(x)} w_j r_j`, where
    :math:`N_k(x)` are the ``k`` memory rows whose source vectors (``keys``, unit rows) have
    the highest cosine :math:`s_j` to :math:`x`, :math:`r_j` their fitted residuals
    (``values``: target vector minus the global map's prediction) and
    :math:`w_j = e^{(s_j - 1)/T} / (\sum_{i \in N_k} e^{(s_i - 1)/T} + e^{(\sigma - 1)/T})`:
    a softmax with temperature ``T`` and a *sink* at cosine :math:`\sigma`, so an input
    far from every memory row (all :math:`s_j \ll \sigma`) keeps the global map's answer.
    Fitted by :func:`lead.local.fit_local`.

    Tensors: ``weight`` ``(d_tgt, d_src)``, ``keys`` ``(memory, d_src)``, ``values``
    ``(memory, d_tgt)``, ``source_mean``, ``target_mean``. The memory holds training
    vectors: a stitch saved with it carries (vectors of) its training data.

    References
    ----------
    .. [1] U. Khandelwal et al., "Generalization through Memorization: Nearest Neighbor
       Language Models", ICLR 2020, arXiv:1911.00172 (residual retrieval from a memory).
    """

    architecture = "local"
    config_keys = ("memory", "k", "temperature", "strength", "sink")
    #: Rows scored against the memory at once (bounds the (rows, memory) score matrix).
    CHUNK = 1024
    #: The smallest temperature: ``1 / temperature`` must stay far inside float32's range.
    MIN_TEMPERATURE = 1e-6
    #: The largest magnitude of ``temperature``, ``strength`` and ``sink`` (a cosine sink and
    #: a correction scale far beyond it mean nothing, and overflow float32).
    MAX_OPTION = 1e3
    #: How far a memory key's norm may be from 1 (float16 storage rounds to ~1e-3).
    KEY_NORM_TOLERANCE = 1e-2

    def __init__(
        self,
        d_src: int,
        d_tgt: int,
        *,
        memory: int = 1,
        k: int = 10,
        temperature: float = 0.05,
        strength: float = 0.5,
        sink: float = 0.6,
        **kwargs: Any,
    ) -> None:
        super().__init__(d_src, d_tgt, **kwargs)
        reals = (temperature, strength, sink)
        bounded = all(
            not isinstance(v, bool) and isinstance(v, int | float) and abs(v) <= self.MAX_OPTION
            for v in reals
        )
        if (
            memory < 1
            or not 1 <= k <= memory
            or int(k) != k
            or not bounded
            or not temperature >= self.MIN_TEMPERATURE
        ):
            raise ShapeMismatchError(
                f"need memory >= 1, an integer 1 <= k <= memory, {self.MIN_TEMPERATURE:g} <= "
                f"temperature and strength and sink real numbers within +-{self.MAX_OPTION:g}, "
                f"got memory={memory}, k={k}, temperature={temperature}, strength={strength}, "
                f"sink={sink}",
                expected="memory >= k >= 1",
                got=(memory, k),
            )
        self.memory, self.k = int(memory), int(k)
        self.temperature = float(temperature)
        self.strength, self.sink = float(strength), float(sink)
        self.weight = nn.Parameter(torch.zeros(d_tgt, d_src))
        self.keys = nn.Parameter(torch.zeros(memory, d_src))
        self.values = nn.Parameter(torch.zeros(memory, d_tgt))
        # (stamp of the keys, float16 keys, int8 keys, the keys' storage): see freeze()
        self._frozen: tuple[tuple[object, ...], Tensor | None, QuantizedKeys | None, object] | None
        self._frozen = None

    def check_loaded(self) -> None:
        """:meth:`Stitch.check_loaded`, and the memory keys must be unit rows (they are
        compared by cosine).

        Raises
        ------
        InvalidInputError
            A non-positive output scale, or a key that is not of unit length.
        """
        super().check_loaded()
        off = (self.keys.detach().float().norm(dim=1) - 1).abs()
        if bool((off > self.KEY_NORM_TOLERANCE).any()):
            raise InvalidInputError("the memory keys must be unit rows", param="keys")

    #: Batch-invariant by itself (:data:`lead.batch_invariance.ROW_INVARIANT`): only the
    #: global map's product is padded, the memory search runs on the real rows.
    row_invariant = True

    def _global(self, x_centred: Tensor) -> Tensor:
        return x_centred @ self.weight.T

    def _map(self, x_centred: Tensor) -> Tensor:
        if self.strength == 0:
            return forward_batch_invariant(self._global, x_centred)
        return self.map_and_neighbours(x_centred)[0]

    def map_and_neighbours(self, x_centred: Tensor) -> tuple[Tensor, Tensor]:
        """The map of centred rows, and each row's ``k`` highest cosines to the memory keys.

        Parameters
        ----------
        x_centred : Tensor of shape (n, d_src)
            Inputs minus ``source_mean``.

        Returns
        -------
        mapped : Tensor of shape (n, d_tgt)
            The global map plus the correction, in ``x_centred``'s dtype (before any output
            scale and the target mean).
        top : Tensor of shape (n, k), float32
            The ``k`` largest cosines of each (uncentred) row to the keys, in [-1, 1],
            largest first (:meth:`nearest_cosines`, the same bits).
        """
        base = forward_batch_invariant(self._global, x_centred)
        correction, top = self.correction(x_centred)
        return base + self.strength * correction.to(base.dtype), top

    def correction(self, x_centred: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`map_and_neighbours` without the global map and ``strength``: the
        softmax-weighted mean of each row's ``k`` nearest memory residuals (float32 of
        shape (n, d_tgt)) and the ``k`` highest cosines, in chunks of :attr:`CHUNK` rows."""
        parts = [
            self._correction(x_centred[i : i + self.CHUNK])
            for i in range(0, x_centred.shape[0], self.CHUNK)
        ]
        if not parts:
            empty = x_centred.new_zeros((0, self.d_tgt), dtype=torch.float32)
            return empty, x_centred.new_zeros((0, self.k), dtype=torch.float32)
        if len(parts) == 1:
            return parts[0]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def typical_inputs(self) -> Tensor:
        """The memory keys: training inputs (unit rows), shape (memory, d_src)."""
        return self.keys.detach()

    def nearest_cosines(self, x_centred: Tensor) -> Tensor:
        """Each row's ``k`` highest cosines to the memory keys, float32 of shape (n, k),
        largest first (of the uncentred rows, as :meth:`map_and_neighbours` scores them)."""
        parts = [
            self._neighbours(x_centred[i : i + self.CHUNK])[0]
            for i in range(0, x_centred.shape[0], self.CHUNK)
        ]
        if not parts:
            return x_centred.new_zeros((0, self.k), dtype=torch.float32)
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def freeze(self) -> Self:
        """:meth:`Stitch.freeze`: keeps the keys in int8 for the memory search's first
        scoring of small batches (:func:`lead.batch_invariance.quantized_keys`; ~10 times
        faster than float32) and in float16 for a lone vector's
        (:func:`~lead.batch_invariance.half_keys`; half the bytes), each where it applies."""
        super().freeze()
        stamp = self._keys_stamp()
        if stamp is not None:
            with torch.inference_mode(False), torch.no_grad():
                half, quantized = half_keys(self.keys), quantized_keys(self.keys, self.k)
                # holding the keys' storage keeps its address from being handed to new keys
                # (``.half().float()`` replaces ``.data`` and can get the same address back,
                # the version counter unchanged: found by an adversarial pass)
                self._frozen = (stamp, half, quantized, self.keys.untyped_storage())
        return self

    def _keys_stamp(self) -> tuple[object, ...] | None:
        keys = self.keys
        if keys.is_inference():  # no version counter to tell a change
            return None
        return (id(keys), keys.data_ptr(), keys._version, keys.shape, keys.stride(), keys.dtype)

    def _frozen_keys(self) -> tuple[Tensor | None, QuantizedKeys | None]:
        """The float16 and int8 keys kept by :meth:`freeze`, or None: not frozen, or the
        keys changed since (then float32 until frozen again)."""
        if self._frozen is not None and self._frozen[0] != self._keys_stamp():
            self._frozen = None
        return (None, None) if self._frozen is None else self._frozen[1:3]

    def _neighbours(self, x_centred: Tensor) -> tuple[Tensor, Tensor]:
        """The ``k`` highest cosines (sorted, largest first, ties to the lower row) and their
        memory rows, the same bits whatever the batch
        (:func:`lead.batch_invariance.top_k_cosines`)."""
        x = unit_rows(x_centred.float() + self.source_mean.float())
        if x.device.type != "cpu":
            # a GPU runs fixed tiles (lead.batch_invariance), and an exact search would read
            # back how many candidates each row needs: one synchronisation per forward more
            top, index = (x @ self.keys.float().T).topk(self.k, dim=1)
            return top, index
        half, quantized = self._frozen_keys()
        return top_k_cosines(x, self.keys.float(), self.k, half=half, quantized=quantized)

    def _correction(self, x_centred: Tensor) -> tuple[Tensor, Tensor]:
        top, index = self._neighbours(x_centred)  # sorted: top[:, 0] is the largest
        # On the CPU on one thread: with two, the weights of a 1,024-row chunk's first 512
        # rows came out different in the last bit on a process's first call, 3-4 times in 36
        # under load (never on one thread; the neighbours themselves were the same). An
        # adversarial pass saw apply_stitch give other bytes for the same input.
        with one_thread() if top.device.type == "cpu" else contextlib.nullcontext():
            return self._weighted(top, index), top

    def _weighted(self, top: Tensor, index: Tensor) -> Tensor:
        """The softmax-weighted mean of the rows' neighbours' residuals (float32, shape
        (n, d_tgt)), from their ``k`` highest cosines ``top`` and memory rows ``index``."""
        # the softmax shifted by each row's largest logit (neighbour or sink): no exponential
        # overflows (a sink far above 1) and one is 1, so the total never underflows to 0
        # (a small temperature far from the memory: 0 / 0)
        shift = top[:, :1].clamp_min(self.sink)
        inverse_t = 1.0 / self.temperature
        weights = torch.exp((top - shift) * inverse_t)
        sink = torch.exp((self.sink - shift) * inverse_t)
        weights = weights / (fixed_order_sum(weights, keepdim=True) + sink)
        # the weighted sum over the neighbours, added in a fixed order (a fresh copy)
        values = self.values.float()
        neighbours = values.index_select(0, index.flatten()).view(*index.shape, -1)
        weighted = neighbours.mul_(weights.unsqueeze(2))  # (n, k, d_tgt)
        return fixed_order_sum(weighted, dim=1)


class ResidualMemory(LocalStitch):
    r"""A :class:`LocalStitch`'s memory without its global map: for an input :math:`x`,
    :math:`\lambda \sum_{j \in N_k(x)} w_j r_j`, the softmax-weighted residuals of its ``k``
    nearest memory rows (with the sink), to be added to another map's answer. The general
    expert of a :class:`GatedStitch` adds it to its MLP's.

    Not a stitch by itself (no architecture name, not in :data:`STITCH_REGISTRY`).
    Tensors: ``keys`` ``(memory, d_src)`` (unit rows: training inputs, compared as they
    are), ``values`` ``(memory, d_tgt)`` (their residuals), and the zero ``source_mean`` and
    ``target_mean`` every stitch holds.
    """

    architecture = ""

    def __init__(self, d_src: int, d_tgt: int, **kwargs: Any) -> None:
        super().__init__(d_src, d_tgt, **kwargs)
        del self.weight  # no global map: nothing stored

    def _map(self, x_centred: Tensor) -> Tensor:
        return self.map_and_neighbours(x_centred)[0]  # with strength 0 too: no global map

    def map_and_neighbours(self, x_centred: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`LocalStitch.map_and_neighbours` without a global map: the correction
        times ``strength``, and the ``k`` highest cosines."""
        correction, top = self.correction(x_centred)
        return self.strength * correction.to(x_centred.dtype), top


class GatedStitch(Stitch):
    r"""A local stitch near its in-domain training inputs, a residual MLP elsewhere.

    :math:`y = a(x)\,y_{\text{local}}(x) + (1 - a(x))\,y_{\text{MLP}}(x)` (then L2-normalised
    when ``normalize_output``), with the gate
    :math:`a(x) = \operatorname{clip}((s(x) - g_{lo}) / (g_{hi} - g_{lo}), 0, 1)` and
    :math:`s(x)` the highest cosine of :math:`x` to the local stitch's memory keys: the
    in-domain training inputs (a team's own documents and queries). The local stitch
    (:class:`LocalStitch`, ``domain``) retrieves best on the domain it memorised; the MLP
    (:class:`MLPStitch`, ``general``, fitted on every pair) translates general text better.
    The gate's bounds come from the memory itself (:func:`lead.gated.fit_gated`): held-out
    in-domain inputs are nearly all above ``gate_high``, so the gate only hands inputs
    unlike anything in the domain to the MLP.

    The general expert may carry a residual memory (:class:`ResidualMemory`, ``residuals``,
    ``general_memory`` rows): the training pairs outside the domain (general-domain
    sentences) with the MLP's residuals, so that :math:`y_{\text{MLP}}(x)` gains the
    softmax-weighted residuals of its ``general_k`` nearest rows (:meth:`general_expert`).

    Tensors: ``domain.*`` (a :class:`LocalStitch`'s), ``general.*`` (an
    :class:`MLPStitch`'s; each expert may hold its own ``output_scale`` when
    ``expert_scales``), ``residuals.*`` when ``general_memory > 0``, and the stitch's own
    ``source_mean`` and ``target_mean``: the MLP's, the means of every training pair (each
    expert centres with its own means; the stitch's are what a caller reads as its training
    means, e.g. for the mean-estimator baseline).

    References
    ----------
    .. [1] R. A. Jacobs, M. I. Jordan, S. J. Nowlan, G. E. Hinton, "Adaptive Mixtures of
       Local Experts", Neural Computation 3(1), 79-87, 1991. doi:10.1162/neco.1991.3.1.79
    """

    architecture = "gated"
    config_keys = (
        *LocalStitch.config_keys,
        *MLPStitch.config_keys,
        "gate_low",
        "gate_high",
        "expert_scales",
    )
    #: The general expert's residual memory (:class:`ResidualMemory`, ``residuals``):
    #: ``general_memory`` rows (0: none, as in stitches saved before it), its ``k``,
    #: temperature, sink and strength.
    optional_config_keys: ClassVar[dict[str, Any]] = {
        "general_memory": 0,
        "general_k": 20,
        "general_temperature": 0.1,
        "general_sink": 0.4,
        "general_strength": 1.0,
    }
    domain: LocalStitch
    general: MLPStitch
    residuals: ResidualMemory | None
    #: Batch-invariant by itself (:data:`lead.batch_invariance.ROW_INVARIANT`): each
    #: expert pads its own dense products, the memory search runs on the real rows, and
    #: the MLP only on those it has a share of.
    row_invariant = True
    #: The widest gate bounds: a cosine lies in [-1, 1], a bound minus a width of 2 in [-3, 1].
    MAX_GATE = 3.0

    def __init__(
        self,
        d_src: int,
        d_tgt: int,
        *,
        memory: int = 1,
        k: int = 10,
        temperature: float = 0.05,
        strength: float = 0.5,
        sink: float = 0.6,
        hidden_dim: int = 512,
        depth: int = 1,
        gate_low: float = 0.4,
        gate_high: float = 0.5,
        expert_scales: bool = False,
        general_memory: int = optional_config_keys["general_memory"],
        general_k: int = optional_config_keys["general_k"],
        general_temperature: float = optional_config_keys["general_temperature"],
        general_sink: float = optional_config_keys["general_sink"],
        general_strength: float = optional_config_keys["general_strength"],
        **kwargs: Any,
    ) -> None:
        super().__init__(d_src, d_tgt, **kwargs)
        bounds = (gate_low, gate_high)
        real = all(not isinstance(v, bool) and isinstance(v, int | float) for v in bounds)
        if not (real and -self.MAX_GATE <= gate_low < gate_high <= self.MAX_GATE):
            raise ShapeMismatchError(
                f"need gate bounds -{self.MAX_GATE:g} <= gate_low < gate_high <= "
                f"{self.MAX_GATE:g}, got {gate_low!r}, {gate_high!r}",
                expected="gate_low < gate_high",
                got=(gate_low, gate_high),
            )
        if not isinstance(expert_scales, bool):
            raise ShapeMismatchError(
                f"expert_scales must be true or false, got {expert_scales!r}",
                expected="a boolean",
                got=expert_scales,
            )
        scales = expert_scales
        self.domain = LocalStitch(
            d_src,
            d_tgt,
            memory=memory,
            k=k,
            temperature=temperature,
            strength=strength,
            sink=sink,
            output_scale=scales,
        )
        self.general = MLPStitch(
            d_src, d_tgt, hidden_dim=hidden_dim, depth=depth, output_scale=scales
        )
        self.gate_low, self.gate_high = float(gate_low), float(gate_high)
        self.expert_scales = scales
        if (
            not isinstance(general_memory, int)
            or isinstance(general_memory, bool)
            or (general_memory < 0)
        ):
            raise ShapeMismatchError(
                f"general_memory must be a row count >= 0, got {general_memory!r}",
                expected=">= 0",
                got=general_memory,
            )
        residuals = None
        if general_memory:
            residuals = ResidualMemory(
                d_src,
                d_tgt,
                memory=general_memory,
                k=general_k,
                temperature=general_temperature,
                strength=general_strength,
                sink=general_sink,
            )
            general_k, general_memory = residuals.k, residuals.memory
        self.register_module("residuals", residuals)
        self.general_memory, self.general_k = int(general_memory), int(general_k)
        self.general_temperature = float(general_temperature)
        self.general_sink, self.general_strength = float(general_sink), float(general_strength)

    def __getattr__(self, name: str) -> Any:
        # the experts' architecture parameters, for get_config
        if name in LocalStitch.config_keys:
            return getattr(self._modules["domain"], name)
        if name in MLPStitch.config_keys:
            return getattr(self._modules["general"], name)
        return super().__getattr__(name)

    def check_loaded(self) -> None:
        """Each expert's :meth:`check_loaded`.

        Raises
        ------
        InvalidInputError
            As :meth:`LocalStitch.check_loaded`.
        """
        super().check_loaded()
        self.domain.check_loaded()
        self.general.check_loaded()
        if self.residuals is not None:
            self.residuals.check_loaded()

    def gate(self, nearest: Tensor) -> Tensor:
        """The local stitch's share :math:`a` for rows whose highest memory cosine is
        ``nearest`` (shape (n,)): 0 at ``gate_low`` and below, 1 at ``gate_high`` and above."""
        share: Tensor = (nearest - self.gate_low) / (self.gate_high - self.gate_low)
        return share.clamp(0.0, 1.0)

    confidence_feature_names = ("gated_nearest_cosine", "gate_share", "gated_mean_cosine")

    def typical_inputs(self) -> Tensor:
        """The local stitch's memory keys: in-domain training inputs (unit rows)."""
        return self.domain.typical_inputs()

    def confidence_features(self, x: Tensor) -> Tensor:
        """How the local stitch stands on each row, weighted by its share ``a`` of the
        answer: ``a`` times the highest memory cosine, ``a``, and ``a`` times the mean of
        the ``k`` highest. Near its memory the local stitch's translation is as good as
        the memory is close (Spearman of the highest cosine with the true cosine 0.54-0.80
        on the bundled stitches' held-out documents); where the MLP answers (``a = 0``)
        they are 0 and the head's generic features speak.

        Parameters
        ----------
        x : Tensor of shape (n, d_src)
            What the forward receives.

        Returns
        -------
        Tensor of shape (n, 3), float32
        """
        domain = self.domain
        return self._features(domain.nearest_cosines(x - domain.source_mean))

    def _features(self, top: Tensor) -> Tensor:
        """:meth:`confidence_features` from each row's ``k`` highest memory cosines (the
        mean added in a fixed order: the same bits in any batch)."""
        a = self.gate(top[:, 0])
        mean = fixed_order_sum(top) / top.shape[1]
        return torch.stack([a * top[:, 0], a, a * mean], dim=1)

    def forward_scored(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`Stitch.forward_scored`; on the CPU the confidence features come from the
        forward's own memory search (a second search cost ~0.6 of the forward)."""
        head = self.confidence_head
        if head is None or not head.stitch_features or x.device.type != "cpu":
            return super().forward_scored(x)
        self._check_input(x)  # unpadded: batch-invariant by itself (row_invariant)
        residual, top = self._map_and_top(x - self.source_mean)
        raw = self._unnormalized(residual)
        y = unit_rows(raw) if self.normalize_output else raw
        features = self._features(top)
        return (y, *self.score_confidence(x, y, features=features, unnormalized=raw))

    def _map(self, x_centred: Tensor) -> Tensor:
        return self._map_and_top(x_centred)[0]

    def _map_and_top(self, x_centred: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`_map`, and each row's ``k`` highest cosines to the local stitch's memory."""
        x = x_centred + self.source_mean  # the input: each expert centres it its own way
        domain = self.domain
        mapped, top = domain.map_and_neighbours(x - domain.source_mean)
        if domain.output_scale is not None:
            mapped = mapped * domain.output_scale
        y_domain = mapped + domain.target_mean
        a = self.gate(top[:, 0]).to(y_domain.dtype)
        # on the CPU the MLP only for the rows it has a share of (its normalize_output is
        # off: the full vector), a row the local stitch answers alone blending with zeros; on
        # a GPU for all (finding the rows would read them back: a synchronisation)
        general = (a < 1).nonzero().flatten() if a.device.type == "cpu" else None
        if general is not None and not len(general):
            # a = 1 everywhere (in-domain queries): the blend would add (1 - 1) * 0, which
            # changes nothing but a -0 into +0, and adding the target mean back (every
            # caller does) makes both +0
            return y_domain - self.target_mean, top
        if general is None or len(general) == len(a):
            y_general = self.general_expert(x)
        else:
            y_general = torch.zeros_like(y_domain)
            if len(general):
                y_general[general] = self.general_expert(x[general])
        a = a.unsqueeze(1)
        return a * y_domain + (1 - a) * y_general - self.target_mean, top

    def general_expert(self, x: Tensor) -> Tensor:
        """The general expert's answer: the MLP's full vector for inputs ``x`` (shape
        (n, d_src)), plus the correction of its residual memory when it has one; shape
        (n, d_tgt), before any L2 normalisation."""
        y: Tensor = forward_batch_invariant(self.general, x)
        if self.residuals is not None:
            # the memory's means are zero: it searches the inputs as they are
            y = y + self.residuals.map_and_neighbours(x)[0]
        return y


class _Coupling(nn.Module):
    """One affine coupling layer: the ``cond`` half sets a scale and shift of the other half."""

    def __init__(self, dim: int, hidden_dim: int, cond_first: bool, max_log_scale: float) -> None:
        super().__init__()
        half = dim // 2
        self.cond = slice(0, half) if cond_first else slice(half, dim)
        self.free = slice(half, dim) if cond_first else slice(0, half)
        d_cond = half if cond_first else dim - half
        d_free = dim - d_cond
        self.max_log_scale = max_log_scale
        last = nn.Linear(hidden_dim, 2 * d_free)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.net = nn.Sequential(nn.Linear(d_cond, hidden_dim), nn.GELU(), last)

    def _scale_shift(self, cond: Tensor) -> tuple[Tensor, Tensor]:
        raw_scale, shift = self.net(cond).chunk(2, dim=1)
        bound = self.max_log_scale
        return bound * torch.tanh(raw_scale / bound), shift

    def forward(self, z: Tensor) -> Tensor:
        log_scale, shift = self._scale_shift(z[:, self.cond])
        out = z.clone()
        out[:, self.free] = z[:, self.free] * torch.exp(log_scale) + shift
        return out

    def inverse(self, z: Tensor) -> Tensor:
        log_scale, shift = self._scale_shift(z[:, self.cond])
        out = z.clone()
        out[:, self.free] = (z[:, self.free] - shift) * torch.exp(-log_scale)
        return out


class InvertibleStitch(Stitch):
    r"""A bijective stitch: an invertible linear map, then affine coupling layers.

    In :math:`D = \max(d_{src}, d_{tgt})` dimensions,
    :math:`y = \pi_{tgt}(c_K \circ \dots \circ c_1(W\, \iota_{src}(x - \mu_x))) + \mu_y`,
    where :math:`\iota` pads with zeros to :math:`D` dimensions and :math:`\pi` keeps the
    first ones. :math:`W = P L U` is stored in LU form (Kingma & Dhariwal, 2018 [2]_):
    ``perm`` a fixed permutation matrix, ``lower`` (unit lower triangular part used),
    ``upper`` (strictly upper part used) and ``sign * exp(log_scale)`` on the diagonal of
    :math:`U`, so :math:`W` is invertible whatever the training does. Each coupling layer
    :math:`c_i` (RealNVP, Dinh et al., 2017 [1]_) keeps one half of the coordinates and
    maps the other half to :math:`z_b e^{s(z_a)} + t(z_a)`, with
    :math:`s = m \tanh(\cdot / m)` bounded by ``max_log_scale`` :math:`m`; the halves
    alternate. The last layer of every coupling network starts at zero, so an untrained
    stitch is its linear part.

    :meth:`inverse` maps target vectors back to the source space. For equal dimensions it
    is the exact inverse of the unnormalised map. When the dimensions differ (the
    documented projection): with :math:`d_{src} < d_{tgt}` the source is padded, so
    ``inverse(forward(x)) == x``, while ``forward(inverse(y))`` keeps only the part of
    ``y`` reachable from the source; with :math:`d_{src} > d_{tgt}` the forward map
    drops the last :math:`D - d_{tgt}` coordinates, and :meth:`inverse` pads ``y`` with
    zeros there, so a round trip loses what those coordinates held.

    Parameters
    ----------
    d_src, d_tgt : int
        Source and target dimensions.
    hidden_dim : int, default 256
        Width of each coupling network.
    coupling_layers : int, default 4
        Number of coupling layers (0 makes a purely linear invertible stitch).
    max_log_scale : float, default 2.0
        Bound on each coupling's log-scale.
    normalize_inverse_output : bool, default False
        L2-normalise the rows :meth:`inverse` returns (for unit-length source models).

    References
    ----------
    .. [1] Dinh, L., Sohl-Dickstein, J. and Bengio, S. (2017). Density estimation using Real
       NVP. ICLR. arXiv:1605.08803
    .. [2] Kingma, D. P. and Dhariwal, P. (2018). Glow: generative flow with invertible 1x1
       convolutions. NeurIPS. arXiv:1807.03039
    .. [3] Guo, Y. et al. (2023). All roads lead to Rome? Exploring the invariance of
       transformers' representations. arXiv:2305.14555
    """

    architecture = "invertible"
    config_keys = ("hidden_dim", "coupling_layers", "max_log_scale", "normalize_inverse_output")

    def __init__(
        self,
        d_src: int,
        d_tgt: int,
        *,
        hidden_dim: int = 256,
        coupling_layers: int = 4,
        max_log_scale: float = 2.0,
        normalize_inverse_output: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(d_src, d_tgt, **kwargs)
        if isinstance(hidden_dim, bool) or isinstance(coupling_layers, bool):
            raise ShapeMismatchError(
                "hidden_dim and coupling_layers must be integers",
                expected="int",
                got=(hidden_dim, coupling_layers),
            )
        if hidden_dim < 1 or not 0 <= coupling_layers <= MAX_LAYERS or not 0 < max_log_scale <= 10:
            raise ShapeMismatchError(
                f"need hidden_dim >= 1, 0 <= coupling_layers <= {MAX_LAYERS} and 0 < max_log_scale "
                "<= 10, got "
                f"{hidden_dim}, {coupling_layers}, {max_log_scale}",
                expected=">= 1, >= 0, (0, 10]",
                got=(hidden_dim, coupling_layers, max_log_scale),
            )
        if max(d_src, d_tgt) < 2 and coupling_layers > 0:
            raise ShapeMismatchError(
                "coupling layers need at least 2 dimensions", expected=">= 2", got=(d_src, d_tgt)
            )
        self.hidden_dim = int(hidden_dim)
        self.coupling_layers = int(coupling_layers)
        self.max_log_scale = float(max_log_scale)
        self.normalize_inverse_output = bool(normalize_inverse_output)
        dim = self.dim = max(d_src, d_tgt)
        self.perm = nn.Parameter(torch.eye(dim), requires_grad=False)
        self.lower = nn.Parameter(torch.zeros(dim, dim))
        self.upper = nn.Parameter(torch.zeros(dim, dim))
        self.log_scale = nn.Parameter(torch.zeros(dim))
        self.sign = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.couplings = nn.ModuleList(
            _Coupling(dim, self.hidden_dim, i % 2 == 0, self.max_log_scale)
            for i in range(self.coupling_layers)
        )
        self._cache: dict[str, tuple[tuple[Any, ...], Tensor]] = {}

    def _factors(self) -> tuple[Tensor, Tensor]:
        """The unit lower and the upper triangular factors of ``W = perm @ L @ U``."""
        eye = torch.eye(self.dim, dtype=self.lower.dtype, device=self.lower.device)
        L = torch.tril(self.lower, -1) + eye
        U = torch.triu(self.upper, 1) + torch.diag(self.sign * torch.exp(self.log_scale))
        return L, U

    def linear_weight(self) -> Tensor:
        """The invertible matrix ``W = perm @ L @ U`` of shape (D, D)."""
        return self._cached("weight", self._weight)

    def inverse_weight(self) -> Tensor:
        """``W⁻¹ = U⁻¹ L⁻¹ permᵀ`` of shape (D, D), from two triangular solves in float64.

        The inverse runs as one matrix product with it rather than as triangular solves per
        batch: the solves' kernels block over the batch, so a row's result would depend on
        its batch (:mod:`lead.batch_invariance`); and a float32 product with a float64
        inverse is closer to the exact preimage (5e-7 against 7e-6 for float32 solves on
        the bundled stitch).
        """
        return self._cached("inverse", self._inverse)

    def _weight(self) -> Tensor:
        L, U = self._factors()
        return self.perm @ L @ U

    def _inverse(self) -> Tensor:
        L, U = (f.double() for f in self._factors())
        eye_perm = self.perm.double().T
        inner = torch.linalg.solve_triangular(L, eye_perm, upper=False, unitriangular=True)
        inverse: Tensor = torch.linalg.solve_triangular(U, inner, upper=True)
        return inverse.to(self.lower.dtype)

    def _cached(self, name: str, compute: Callable[[], Tensor]) -> Tensor:
        """``compute()``, kept until a parameter changes (never while training)."""
        if torch.is_grad_enabled() and self.lower.requires_grad:  # training: no cache
            return compute()
        key = tuple(
            (p.data_ptr(), p._version)
            for p in (self.perm, self.lower, self.upper, self.log_scale, self.sign)
        )
        cached = self._cache.get(name)
        if cached is None or cached[0] != key:
            cached = self._cache[name] = (key, compute())
        return cached[1]

    def _pad(self, z: Tensor) -> Tensor:
        if z.shape[1] == self.dim:
            return z
        return nn.functional.pad(z, (0, self.dim - z.shape[1]))

    def _map(self, x_centred: Tensor) -> Tensor:
        z = self._pad(x_centred) @ self.linear_weight().T.to(x_centred.dtype)
        for coupling in self.couplings:
            z = coupling(z)
        return z[:, : self.d_tgt]

    def inverse(self, y: Tensor) -> Tensor:
        """Translate target-space vectors back into the source space.

        Parameters
        ----------
        y : Tensor of shape (n, d_tgt)
            Target-model vectors on the stitch's device, in its dtype or a narrower
            floating one (float16 and bfloat16 are promoted).

        Returns
        -------
        Tensor of shape (n, d_src)
            Source-space vectors in ``y``'s dtype; unit rows when
            ``normalize_inverse_output``.

        Raises
        ------
        ShapeMismatchError
            If ``y`` is not two-dimensional with ``d_tgt`` columns.
        InvalidInputError
            If ``y`` is not a tensor, not floating, or wider than the stitch's dtype
            (float64 into a float32 stitch; :func:`lead.apply_stitch` with ``inverse=True``
            takes arrays of any of them).
        """
        self._check_input(y, inverse=True)
        if self.normalize_output and self.normalize_inverse_output:
            x = self._inverse_on_ray(y)
        else:
            x = self.inverse_raw(y)
        return (unit_rows(x) if self.normalize_inverse_output else x).to(y.dtype)

    def _inverse_on_ray(self, y: Tensor, steps: int = 20) -> Tensor:
        """The unit-length preimage of the ray through each row of ``y`` (secant method).

        A normalised forward map forgets the length of its raw output, so a unit target
        vector stands for the ray ``c y``, ``c > 0``. Between unit-length spaces the
        inverse is the point of that ray whose preimage has unit length, searched from
        ``c = 1`` (training keeps raw output lengths near 1); a round trip through the
        normalised map then returns its input.
        """
        y = unit_rows(y)  # the ray does not depend on the length of y
        c0 = torch.ones(y.shape[0], 1, dtype=torch.float64, device=y.device)
        c1 = c0 * 1.02

        def gap(c: Tensor) -> Tensor:
            norm: Tensor = self.inverse_raw(y * c.to(y.dtype)).double().norm(dim=1, keepdim=True)
            return norm - 1

        g0, g1 = gap(c0), gap(c1)
        for _ in range(steps):
            slope = (g1 - g0) / (c1 - c0)
            move = torch.where(slope.abs() > 1e-12, g1 / slope, torch.zeros_like(g1))
            c0, g0 = c1, g1
            c1 = (c1 - move).clamp(0.05, 20.0)
            if bool((c1 == c0).all()):
                break
            g1 = gap(c1)
        return self.inverse_raw(y * c1.to(y.dtype))

    def inverse_raw(self, y: Tensor) -> Tensor:
        """:meth:`inverse` without the normalisation, in at least float32 (for training)."""
        z = self._pad(y - self.target_mean)
        if self.output_scale is not None:
            z = z / self.output_scale
        for coupling in reversed(self.couplings):
            assert isinstance(coupling, _Coupling)
            z = coupling.inverse(z)
        work = torch.promote_types(y.dtype, torch.float32)  # the inverse needs >= fp32
        x = z.to(work) @ self.inverse_weight().T.to(work)
        return x[:, : self.d_src] + self.source_mean.to(work)


def oriented(
    stitch: Stitch, *, inverse: bool = False, name: str | None = None, param: str = "inverse"
) -> tuple[Callable[[Tensor], Tensor], int, int]:
    """The map to run and its input and output dimensions, in the direction asked.

    Parameters
    ----------
    stitch : Stitch
        Any stitch.
    inverse : bool, default False
        Run an :class:`InvertibleStitch` backwards (target → source).
    name, param : str, optional
        How the error names the stitch (e.g. its id) and the offending argument.

    Returns
    -------
    tuple
        ``(run, d_in, d_out)``: ``stitch`` itself with ``(d_src, d_tgt)``, or with
        ``inverse`` its :meth:`InvertibleStitch.inverse` with ``(d_tgt, d_src)``.

    Raises
    ------
    NotInvertibleError
        If ``inverse`` and the stitch is not invertible.
    """
    if not inverse:
        return stitch, stitch.d_src, stitch.d_tgt
    if not isinstance(stitch, InvertibleStitch):
        which = f"stitch {name}" if name else "the stitch"
        raise NotInvertibleError(
            f"{which} is not invertible (architecture {stitch.architecture!r}): only an "
            "'invertible' stitch runs backwards",
            param=param,
        )
    return stitch.inverse, stitch.d_tgt, stitch.d_src


#: Architecture name → stitch class. The only way a config names a class.
STITCH_REGISTRY: dict[str, type[Stitch]] = {
    cls.architecture: cls
    for cls in (
        AffineStitch,
        OrthogonalStitch,
        MLPStitch,
        InvertibleStitch,
        LocalStitch,
        GatedStitch,
    )
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
