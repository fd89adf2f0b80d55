"""The serve-time part of a per-vector confidence: :class:`ConfidenceHead` (private module).

Only torch and the batch-invariant forward: :mod:`lead.stitches` types its
``confidence_head`` with it, and :mod:`lead.confidence` fits it (the protocol is in that
module's docstring) and re-exports it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lead.batch_invariance import forward_batch_invariant
from lead.errors import InvalidInputError, ShapeMismatchError, StitchFormatError

__all__ = [
    "CONFIDENCE_METHOD",
    "CONFIDENCE_VERSION",
    "MAX_STITCH_FEATURES",
    "N_FEATURES",
    "READABLE_VERSIONS",
    "ConfidenceHead",
    "check_head",
    "current_report",
    "head_from_config",
]

CONFIDENCE_METHOD = "bootstrap-ridge-disagreement+isotonic"
#: Version 2 adds the stitch's own features (``stitch_features``); version 3 scores a
#: stitch's output before its final L2 normalisation (``normalize_output``), whose norm
#: unit rows lose; version 4 also flags an input whose length lies outside the training
#: rows' (``input_norm_range``: an all-zero or rescaled vector, for a stitch fitted on
#: vectors that are not of unit length). Older heads are still read, and scored as they
#: were fitted.
CONFIDENCE_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
#: Number of the scalar features (see :mod:`lead.confidence`).
N_FEATURES = 5
#: Most stitch features a head takes (:meth:`lead.stitches.Stitch.confidence_features`).
MAX_STITCH_FEATURES = 16
#: Most calibration knots (at most one per held-out row; bounds what a file can allocate).
MAX_KNOTS = 1_000_000
#: Report keys of version-1 heads, read under their current names.
_RENAMED_REPORT_KEYS = {
    "spearman_in_domain": "in_domain_spearman_score",
    "spearman_raw": "uncalibrated_spearman_score",
}
_TINY = 1e-12


class ConfidenceHead(nn.Module):
    """Calibrated per-row confidence and an out-of-distribution flag (buffers only, float32).

    Parameters
    ----------
    d_src, d_tgt : int
        The stitch's dimensions.
    rank : int
        Columns of the disagreement factor and of the principal basis (``<= d_src + 1``).
    knots : int
        Number of calibration knots (``>= 2``).
    stitch_features : int, default 0
        Number of the stitch's own per-row features
        (:meth:`lead.stitches.Stitch.confidence_features`, e.g. a gated stitch's nearest
        memory cosine), ``0 <= stitch_features <=`` :data:`MAX_STITCH_FEATURES`.
    version : int, default CONFIDENCE_VERSION
        The protocol the head was fitted with (one of :data:`READABLE_VERSIONS`): from 3
        on, ``y_pred`` is the stitch's output before its final L2 normalisation
        (:attr:`scores_unnormalized`); from 4 on, the head holds ``input_norm_range``.

    Notes
    -----
    Buffers (names as saved, after the ``confidence.`` prefix), float32 whatever dtype the
    stitch is moved to: ``source_mean`` (d_src,), ``target_mean`` (d_tgt,),
    ``projection`` (d_src, 2 rank + 1) holding ``[G_x | P | beta_x]`` (disagreement factor,
    whitened least-variance axes, linear term in ``x``), ``disagreement_offset`` (rank,)
    the intercept row of ``G``, ``feature_weight`` (N_FEATURES + stitch_features,),
    ``bias`` (1,),
    ``knots_x`` / ``knots_y`` (knots,), ``ood_threshold`` (1,) and, from version 4,
    ``input_norm_range`` (2,): the lowest and highest input L2 norm not flagged.

    With ``xc = x - source_mean``, ``p = xc @ projection``:
    ``disagreement = |p[:, :k] + disagreement_offset|^2``, ``distance = |p[:, k:2k]|^2``,
    ``raw = log(features) @ feature_weight[:N_FEATURES] + extra @
    feature_weight[N_FEATURES:] + p[:, 2k] + bias`` (``extra``: the stitch's features),
    ``out_of_distribution = distance > ood_threshold`` (or, from version 4, ``|x|`` outside
    ``input_norm_range``) and
    ``confidence = clip(interp(raw, knots_x, knots_y), 0, 1)``, or 0 where out of
    distribution.
    """

    def __init__(
        self,
        d_src: int,
        d_tgt: int,
        *,
        rank: int,
        knots: int,
        stitch_features: int = 0,
        version: int = CONFIDENCE_VERSION,
    ) -> None:
        super().__init__()
        if version not in READABLE_VERSIONS or (version < 2 and stitch_features):
            raise InvalidInputError(
                f"unsupported confidence head version {version!r} with {stitch_features} "
                f"stitch features (this lead reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}; stitch features need version 2)",
                param="version",
            )
        if (
            min(d_src, d_tgt, rank) < 1
            or not 2 <= knots <= MAX_KNOTS
            or rank > d_src + 1
            or not 0 <= stitch_features <= MAX_STITCH_FEATURES
        ):
            raise ShapeMismatchError(
                f"need positive dimensions, 1 <= rank <= d_src + 1, 2 <= knots <= {MAX_KNOTS} "
                f"and 0 <= stitch_features <= {MAX_STITCH_FEATURES}, got d_src={d_src}, "
                f"d_tgt={d_tgt}, "
                f"rank={rank}, knots={knots}, stitch_features={stitch_features}",
                expected="valid head dimensions",
                got=(d_src, d_tgt, rank, knots, stitch_features),
            )
        self.d_src, self.d_tgt, self.rank, self.knots = int(d_src), int(d_tgt), rank, knots
        self.stitch_features = int(stitch_features)
        self.version = int(version)
        #: the calibration report (config.json ``confidence.report``)
        self.report: dict[str, Any] = {}
        shapes = {
            "source_mean": (d_src,),
            "target_mean": (d_tgt,),
            "projection": (d_src, 2 * rank + 1),
            "disagreement_offset": (rank,),
            "feature_weight": (N_FEATURES + stitch_features,),
            "bias": (1,),
            "knots_x": (knots,),
            "knots_y": (knots,),
            "ood_threshold": (1,),
        }
        if version >= 4:
            shapes["input_norm_range"] = (2,)
        for name, shape in shapes.items():
            self.register_buffer(name, torch.zeros(shape))
        self.knots_x.copy_(torch.arange(knots, dtype=torch.float32))
        if version >= 4:  # no length flagged until fitted
            self.input_norm_range.copy_(torch.tensor([0.0, torch.inf]))

    source_mean: Tensor
    target_mean: Tensor
    projection: Tensor
    disagreement_offset: Tensor
    feature_weight: Tensor
    bias: Tensor
    knots_x: Tensor
    knots_y: Tensor
    ood_threshold: Tensor
    input_norm_range: Tensor

    def _apply(self, fn: Any, recurse: bool = True) -> ConfidenceHead:
        """Follow the stitch's device but stay float32 whatever dtype it moves to."""
        device = fn(torch.zeros(1)).device
        for name, buffer in self._buffers.items():
            if buffer is not None:
                self._buffers[name] = buffer.to(device=device, dtype=torch.float32)
        return self

    @property
    def scores_unnormalized(self) -> bool:
        """Whether ``y_pred`` is the stitch's output before its final L2 normalisation
        (version 3 and later), not the output itself. The same for a stitch without
        ``normalize_output``; for one with it, the norm of the unnormalised output (how far
        the map shrank the row towards the target mean) ranks the translations that unit
        rows cannot (``models/README.md``, *Confidence*)."""
        return self.version >= 3

    def get_config(self) -> dict[str, Any]:
        """What ``config.json`` records under ``"confidence"`` (the head's own version: a
        head read from an older file is saved as it was fitted)."""
        return {
            "method": CONFIDENCE_METHOD,
            "version": self.version,
            "rank": self.rank,
            "knots": self.knots,
            "stitch_features": self.stitch_features,
            "report": self.report,
        }

    def _raw(self, x: Tensor, y_pred: Tensor, extra: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(prediction before calibration, Mahalanobis distance, input norm), float32, row
        by row."""
        k = self.rank
        xc = x - self.source_mean.float()
        proj = xc @ self.projection.float()
        disagreement = (proj[:, :k] + self.disagreement_offset.float()).square().sum(dim=1)
        distance = proj[:, k : 2 * k].square().sum(dim=1)
        centred_sq = xc.square().sum(dim=1)
        yc = y_pred - self.target_mean.float()
        features = torch.stack(
            [
                disagreement,
                distance,
                centred_sq,
                yc.square().sum(dim=1),
                y_pred.square().sum(dim=1),
            ],
            dim=1,
        )
        weight = self.feature_weight.float()
        raw = torch.log(features + _TINY) @ weight[:N_FEATURES] + proj[:, 2 * k]
        if self.stitch_features:
            raw = raw + extra @ weight[N_FEATURES:]
        raw = raw + self.bias.float()
        return raw, distance, x.square().sum(dim=1).sqrt()

    def _rows(self, packed: Tensor) -> Tensor:
        split = self.d_src + self.d_tgt
        raw, distance, norm = self._raw(
            packed[:, : self.d_src], packed[:, self.d_src : split], packed[:, split:]
        )
        return torch.stack([raw, distance, norm], dim=1)

    def score(
        self, x: Tensor, y_pred: Tensor, extra: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Confidence and out-of-distribution flag of each translated row.

        Parameters
        ----------
        x : Tensor of shape (n, d_src)
            Exactly what the stitch's forward received (after the unit scaling of
            :func:`lead.unit_input.normalize_input`), any floating dtype.
        y_pred : Tensor of shape (n, d_tgt)
            The stitch's output for ``x``; for a head that :attr:`scores_unnormalized`,
            before the stitch's final L2 normalisation
            (:meth:`lead.stitches.Stitch.forward_unnormalized`;
            :meth:`~lead.stitches.Stitch.score_confidence` passes the right one).
        extra : Tensor of shape (n, stitch_features), optional
            The stitch's own features of ``x``
            (:meth:`lead.stitches.Stitch.confidence_features`); required when the head
            has ``stitch_features``.

        Returns
        -------
        confidence : Tensor of shape (n,), float32 in [0, 1]
            Calibrated estimate of ``cos(translation, native target vector)``; higher is
            more trustworthy. 0 for a row out of distribution (the calibration cannot
            vouch for it).
        out_of_distribution : Tensor of shape (n,), bool
            True where the input is far outside the stitch's training inputs: its
            Mahalanobis distance over ``ood_threshold`` or (version 4) its L2 norm outside
            ``input_norm_range``, or a NaN score.

        Raises
        ------
        ShapeMismatchError
            If the shapes do not match the head's dimensions.

        Notes
        -----
        Batch-invariant: row ``i``'s answer is bit-identical whatever the other rows
        (:func:`lead.batch_invariance.forward_batch_invariant`).
        """
        if extra is None:
            extra = x.new_zeros((x.shape[0] if x.ndim else 0, 0))
        if (
            x.ndim != 2
            or y_pred.ndim != 2
            or x.shape[1] != self.d_src
            or y_pred.shape != (x.shape[0], self.d_tgt)
            or extra.shape != (x.shape[0], self.stitch_features)
        ):
            raise ShapeMismatchError(
                f"expected x (n, {self.d_src}), y_pred (n, {self.d_tgt}) and extra (n, "
                f"{self.stitch_features}), got {tuple(x.shape)}, {tuple(y_pred.shape)} and "
                f"{tuple(extra.shape)}",
                expected=(self.d_src, self.d_tgt, self.stitch_features),
                got=(tuple(x.shape), tuple(y_pred.shape), tuple(extra.shape)),
            )
        packed = torch.cat([x.float(), y_pred.float(), extra.float()], dim=1)
        out = forward_batch_invariant(self._rows, packed)
        knots_x, knots_y = self.knots_x.float(), self.knots_y.float()
        confidence = _interp(out[:, 0], knots_x, knots_y).clamp(0.0, 1.0)
        ood = ~(out[:, 1] <= self.ood_threshold.float())  # NaN counts as out of distribution
        if self.version >= 4:
            low, high = self.input_norm_range.float()
            ood |= ~((out[:, 2] >= low) & (out[:, 2] <= high))
        # the calibration never saw such inputs, so it cannot vouch for them: 0, which also
        # puts them first in a lowest-confidence-first re-embedding order
        confidence = torch.where(ood, 0.0, torch.nan_to_num(confidence, nan=0.0))
        return confidence, ood


def _interp(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """``np.interp`` in torch: piecewise linear through ``(xp, fp)``, constant outside."""
    idx = torch.searchsorted(xp, x.contiguous()).clamp(1, xp.shape[0] - 1)
    x0, x1, y0, y1 = xp[idx - 1], xp[idx], fp[idx - 1], fp[idx]
    t = ((x - x0) / (x1 - x0).clamp_min(1e-12)).clamp(0.0, 1.0)
    return y0 + t * (y1 - y0)


def current_report(report: dict[Any, Any]) -> dict[str, Any]:
    """A head's ``report`` with the keys of version-1 heads under their current names
    (``spearman_in_domain`` -> ``in_domain_spearman_score``, ...)."""
    return {_RENAMED_REPORT_KEYS.get(str(key), str(key)): value for key, value in report.items()}


def head_from_config(config: Any, d_src: int, d_tgt: int) -> ConfidenceHead:
    """An empty head shaped as a ``config.json`` ``"confidence"`` block says.

    Raises
    ------
    StitchFormatError
        If the block is not an object with this method, a version this lead reads, and
        integer ``rank``, ``knots`` (and, version 2, ``stitch_features``) that fit the
        stitch.
    """
    if not isinstance(config, dict):
        raise StitchFormatError("config 'confidence' must be an object")
    version = config.get("version")
    if (
        config.get("method") != CONFIDENCE_METHOD
        or type(version) is not int
        or version not in READABLE_VERSIONS
    ):
        raise StitchFormatError(
            f"unsupported confidence method {config.get('method')!r} version "
            f"{version!r} (this lead reads {CONFIDENCE_METHOD!r} versions "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        )
    if version < 2 and "stitch_features" in config:
        raise StitchFormatError("config confidence.stitch_features needs version 2")
    sizes = {"rank": config.get("rank"), "knots": config.get("knots")}
    sizes["stitch_features"] = config.get("stitch_features") if version >= 2 else 0
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise StitchFormatError(f"config confidence.{name} must be an integer, got {value!r}")
    report = config.get("report", {})
    if not isinstance(report, dict):
        raise StitchFormatError("config confidence.report must be an object")
    try:
        head = ConfidenceHead(d_src, d_tgt, **sizes, version=version)  # type: ignore[arg-type]
    except ShapeMismatchError as error:
        raise StitchFormatError(f"bad confidence block: {error}") from None
    head.report = current_report(report)
    return head


def check_head(head: ConfidenceHead) -> None:
    """Check loaded buffers: the calibration is increasing and the threshold a distance.

    Raises
    ------
    StitchFormatError
        If ``knots_x`` is not strictly increasing, ``knots_y`` decreases or leaves
        [-1, 1] (cosines), ``ood_threshold`` is negative, or ``input_norm_range`` is not
        ``0 <= low <= high``.
    """
    if not bool((head.knots_x[1:] > head.knots_x[:-1]).all()):
        raise StitchFormatError("tensor 'confidence.knots_x' must be strictly increasing")
    knots_y = head.knots_y
    if not bool((knots_y[1:] >= knots_y[:-1]).all()) or float(knots_y.abs().max()) > 1.0:
        raise StitchFormatError(
            "tensor 'confidence.knots_y' must be non-decreasing cosines in [-1, 1]"
        )
    if not float(head.ood_threshold[0]) >= 0.0:
        raise StitchFormatError("tensor 'confidence.ood_threshold' must be at least 0")
    if head.version >= 4:
        low, high = (float(v) for v in head.input_norm_range)
        if not 0.0 <= low <= high:
            raise StitchFormatError(
                "tensor 'confidence.input_norm_range' must be [low, high] with 0 <= low <= high"
            )
