"""Per-vector confidence of a translation, and a flag for inputs far from the training data.

A :class:`ConfidenceHead` rides on a stitch (``stitch.confidence_head``) and answers, for
each translated row, an estimate in [0, 1] of the cosine between the translation and the
vector the target model itself would give, plus whether the input lies far outside the
stitch's training inputs. It holds buffers only and costs one small matrix product per
batch: no second forward of the stitch, no stored training rows.

Protocol of :func:`fit_confidence` (float64, on the rows as the stitch sees them, i.e.
after :func:`lead.unit_input.normalize_input`):

1. on the training rows: 5 bootstrap ridge maps ``[x - mu, 1] -> y``; their disagreement
   ``M = mean_b D_b D_b^T`` (``D_b`` = member minus the members' mean) is kept as a rank-k
   factor ``G`` (``x~^T M x~ ~= |x~ G|^2``); the Ledoit-Wolf-shrunk covariance of the
   training inputs gives a Mahalanobis distance along its k least-variance axes, where
   inputs unlike the training ones (garbage, another model's vectors) stand out;
2. features of a row: ``log`` of the disagreement, of the distance, of ``|x - mu|^2``, of
   ``|y_pred - target_mean|^2`` and of ``|y_pred|^2``, plus the centred ``x`` itself (a
   linear term; one in ``y_pred`` as well measured no better). ``y_pred`` is the stitch's
   output before its final L2 normalisation (:meth:`~lead.stitches.Stitch.forward_unnormalized`;
   version 3): a map shrinks the rows it is unsure of towards the target mean, and on the
   bundled stitches the norm of that output ranked 80 everyday sentences by their true
   cosine at 0.36-0.72 on its own, where the heads fitted on unit rows (version 2) reached
   0.15-0.69 (``models/README.md``, *Confidence*);
3. stage 1, on (up to 20,000) training rows: a ridge predictor of the cosine of a 5-fold
   cross-fitted ridge translation (the stitch's own are in-sample there) from the features
   and the linear term; stage 2, on the held-out rows (and the general rows, when given):
   a ridge predictor of the true ``cos(y_pred, y)`` from stage 1's score, the features and
   the centred ``x`` (penalties by leave-one-out, the scalar features barely penalised);
   stage 3, when the stitch has its own features
   (:meth:`lead.stitches.Stitch.confidence_features`: a gated stitch's gate share and
   closeness to its memory, in-sample on the training rows and so fitted here only): a
   ridge predictor from stage 2's out-of-fold score and those features, so that a row
   whose features are 0 keeps stage 2's ranking. On the bundled gated stitches they lifted
   the out-of-fold Spearman from 0.41-0.56 to 0.58-0.76 (``models/README.md``). All
   stages are linear, so the head stores one linear function. Stages 2 and 3 are
   cross-fitted over 5 folds of the held-out rows, and the reported Spearman is over
   those out-of-fold predictions;
4. isotonic regression (pool-adjacent-violators) of the true cosine on the out-of-fold
   predictions, kept as knots at the blocks' centroids and applied by linear interpolation
   (increasing, calibrated); clipped to [0, 1];
5. the OOD threshold: :data:`OOD_MARGIN` times the 99.9th percentile of the distance over
   the training rows (or over the held-out rows, when higher: few training rows make
   the training distances optimistic); and the range of input lengths (version 4): the
   0.1th percentile of the rows' L2 norms divided by :data:`OOD_MARGIN` to the 99.9th
   times it. The distance alone missed inputs of another length along the data's own
   directions: for a ridge stitch fitted on MiniLM vectors rescaled to lengths 5-15, an
   all-zero vector scored 0.63 and a vector three times too long 0.76, above its own
   0.73, neither flagged (for stitches fitted on unit-length rows, every input is
   scaled to length 1 first, and a zero vector refused).

References: bootstrap disagreement as an error estimate (Lakshminarayanan et al., 2017,
arXiv:1612.01474); Mahalanobis OOD scores (Lee et al., 2018, arXiv:1807.03888); isotonic
calibration (Zadrozny and Elkan, 2002).

>>> import torch
>>> head = ConfidenceHead(4, 3, rank=2, knots=2)
>>> confidence, ood = head.score(torch.eye(4)[:2], torch.ones(2, 3))
>>> confidence.shape, ood.dtype
(torch.Size([2]), torch.bool)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from lead._confidence_head import (
    _TINY,
    CONFIDENCE_METHOD,
    CONFIDENCE_VERSION,
    N_FEATURES,
    ConfidenceHead,
    check_head,
    head_from_config,
)
from lead._validation import check_column_spread
from lead.batch_invariance import forward_batch_invariant
from lead.errors import (
    IllConditionedError,
    InvalidInputError,
    NoConfidenceError,
    NonFiniteOutputError,
    ShapeMismatchError,
    TooFewPairsError,
)
from lead.metrics import spearman_score

if TYPE_CHECKING:
    from lead.stitches import Stitch

__all__ = [
    "CONFIDENCE_METHOD",
    "CONFIDENCE_VERSION",
    "MIN_HELD_OUT_ROWS",
    "ConfidenceHead",
    "attach_confidence",
    "check_head",
    "fit_confidence",
    "head_from_config",
    "head_rows_problem",
    "missing_head_message",
    "no_confidence_reason",
    "note_no_confidence",
    "translate_with_confidence",
]

#: Fewest held-out rows :func:`fit_confidence` calibrates on.
MIN_HELD_OUT_ROWS = 50
#: The OOD threshold is this times the 99.9th percentile of the training rows' distance.
OOD_MARGIN = 1.5
_BOOTSTRAPS = 5
_MEMBER_ALPHA = 0.1
_FOLDS = 5
#: Most training rows that stage 1 of the predictor uses.
_STAGE1_ROWS = 20000
#: Rows translated at a time while fitting.
_OUTPUT_ROWS = 4096


def _pav(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Isotonic (increasing) regression of ``y`` on ``x`` by pool-adjacent-violators.

    Returns the blocks' centroids in ``x`` and their fitted values, both increasing
    (blocks with equal values merged), at least two knots.
    """
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    values: list[float] = []
    weights: list[float] = []
    sums_x: list[float] = []
    for xi, yi in zip(xs, ys, strict=True):
        values.append(float(yi))
        weights.append(1.0)
        sums_x.append(float(xi))
        while len(values) > 1 and values[-2] >= values[-1]:
            w = weights[-2] + weights[-1]
            values[-2] = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w
            weights[-2] = w
            sums_x[-2] += sums_x[-1]
            del values[-1], weights[-1], sums_x[-1]
    knots_x = np.asarray(sums_x) / np.asarray(weights)
    knots_y = np.asarray(values)
    if len(knots_x) < 2:  # constant: two knots at the ends
        knots_x = np.array([xs[0], xs[-1] + 1e-6])
        knots_y = np.array([knots_y[0], knots_y[0]])
    return knots_x, knots_y


def _ridge(A: np.ndarray, t: np.ndarray, alpha: float) -> np.ndarray:
    """Ridge weights of ``t ~ A`` with penalty ``alpha`` on every column."""
    gram = A.T @ A + alpha * np.eye(A.shape[1])
    return np.asarray(np.linalg.solve(gram, A.T @ t))


#: Penalties tried for the predictor's linear terms (chosen by leave-one-out error).
_ALPHAS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
#: Relative penalty of the scalar features (barely penalised).
_FEATURE_PENALTY = 1e-3


def _predictor(
    A: np.ndarray, t: np.ndarray, features: int = N_FEATURES
) -> tuple[np.ndarray, float]:
    """Ridge predictor of ``t`` from ``A`` (features first), penalty by leave-one-out.

    The first ``features`` columns are penalised :data:`_FEATURE_PENALTY` times less than
    the others; the intercept is not penalised. Returns (weights, intercept).
    """
    a_mean, t_mean = A.mean(axis=0), float(t.mean())
    relative = np.ones(A.shape[1])
    relative[:features] = _FEATURE_PENALTY
    B = (A - a_mean) / np.sqrt(relative)
    tc = t - t_mean
    U, s, Vt = np.linalg.svd(B, full_matrices=False)
    Ut = U.T @ tc
    best, best_error = _ALPHAS[0], np.inf
    for alpha in _ALPHAS:
        shrink = s**2 / (s**2 + alpha)
        fitted = U @ (shrink * Ut)
        hat = (U**2 @ shrink) + 1.0 / len(t)
        error = float(np.mean(((tc - fitted) / np.clip(1 - hat, 1e-6, None)) ** 2))
        if error < best_error:
            best, best_error = alpha, error
    coef = Vt.T @ (s / (s**2 + best) * Ut) / np.sqrt(relative)
    return coef, t_mean - float(a_mean @ coef)


def _out_of_fold(
    A: np.ndarray, t: np.ndarray, folds: list[np.ndarray], features: int
) -> np.ndarray:
    """Out-of-fold predictions of :func:`_predictor` of ``t`` from ``A`` over ``folds``."""
    out = np.empty(len(A))
    for held in folds:
        keep = np.setdiff1d(np.arange(len(A)), held)
        coef, intercept = _predictor(A[keep], t[keep], features=features)
        out[held] = A[held] @ coef + intercept
    return out


def _crossfit_ridge(X: np.ndarray, Y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Out-of-fold ridge translations of the rows of ``X`` (:data:`_FOLDS` folds)."""
    out = np.empty((len(X), Y.shape[1]))
    for held in np.array_split(rng.permutation(len(X)), _FOLDS):
        keep = np.setdiff1d(np.arange(len(X)), held)
        mx, my = X[keep].mean(axis=0), Y[keep].mean(axis=0)
        W = _ridge(X[keep] - mx, Y[keep] - my, _MEMBER_ALPHA)
        out[held] = (X[held] - mx) @ W + my
    return out


def _shrunk_covariance(Xc: np.ndarray) -> np.ndarray:
    """Ledoit-Wolf shrinkage of the covariance of centred rows ``Xc`` (floor 1e-3).

    References
    ----------
    .. [1] Ledoit, O. and Wolf, M. (2004). A well-conditioned estimator for
       large-dimensional covariance matrices. Journal of Multivariate Analysis 88(2).
    """
    n, d = Xc.shape
    S = Xc.T @ Xc / n
    m = float(np.trace(S)) / d
    d2 = float(((S - m * np.eye(d)) ** 2).sum()) / d
    b_bar = float(((Xc**2).sum(axis=1) ** 2).sum() - n * (S**2).sum()) / (n**2 * d)
    shrink = min(max(min(b_bar, d2) / d2 if d2 > 0 else 1.0, 1e-3), 1.0)
    return np.asarray((1 - shrink) * S + shrink * m * np.eye(d))


class _Basis:
    """The fitted quadratic forms and the feature computation, in float64 (fit time)."""

    def __init__(self, X: np.ndarray, Y: np.ndarray, rank: int, seed: int) -> None:
        n, d = X.shape
        rng = np.random.default_rng(seed)
        self.mu = X.mean(axis=0)
        Xc = X - self.mu
        Xa = np.concatenate([Xc, np.ones((n, 1))], axis=1)
        Yc = Y - Y.mean(axis=0)
        members = []
        for _ in range(_BOOTSTRAPS):
            rows = rng.integers(0, n, n)
            members.append(_ridge(Xa[rows], Yc[rows], _MEMBER_ALPHA))
        W = np.stack(members)
        D = W - W.mean(axis=0)
        M = np.einsum("bij,bkj->ik", D, D) / _BOOTSTRAPS  # (d + 1, d + 1)
        values, vectors = np.linalg.eigh(M)
        top = np.argsort(values)[::-1][:rank]
        G = vectors[:, top] * np.sqrt(np.clip(values[top], 0, None))
        self.G, self.g0 = G[:d], G[d]
        # the Mahalanobis distance along the least-variance axes: where inputs unlike the
        # training ones stand out (garbage, another model's vectors)
        variances, axes = np.linalg.eigh(_shrunk_covariance(Xc))
        self.P = axes[:, :rank] / np.sqrt(variances[:rank])

    def features(self, X: np.ndarray, P: np.ndarray, target_mean: np.ndarray) -> np.ndarray:
        """(n, N_FEATURES) log features; the second is the log distance."""
        Xc = X - self.mu
        dis = ((Xc @ self.G + self.g0) ** 2).sum(axis=1)
        dist = ((Xc @ self.P) ** 2).sum(axis=1)
        centred = (Xc**2).sum(axis=1)
        pc = ((P - target_mean) ** 2).sum(axis=1)
        pn = (P**2).sum(axis=1)
        return np.log(np.stack([dis, dist, centred, pc, pn], axis=1) + _TINY)

    def distance(self, X: np.ndarray) -> np.ndarray:
        return np.asarray((((X - self.mu) @ self.P) ** 2).sum(axis=1))


def _design(feats: np.ndarray, Xc: np.ndarray, scale: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    mean, std = scale
    return np.concatenate([(feats - mean) / std, Xc], axis=1)


def _inputs(stitch: Stitch, X: Any, name: str) -> np.ndarray:
    """The rows as the stitch's forward sees them (unit scaling applied), float64 numpy."""
    from lead._apply import stitch_input

    return np.asarray(stitch_input(stitch, X, param=name).double().cpu().numpy())


def _outputs(stitch: Stitch, X: np.ndarray) -> np.ndarray:
    """The stitch's translations of rows already scaled, before its final L2 normalisation
    (what a head of this version scores: :meth:`~lead.stitches.Stitch.forward_unnormalized`),
    float64 numpy."""
    from lead._apply import run_rows

    param = next(stitch.parameters())
    x = torch.as_tensor(X, dtype=param.dtype, device=param.device)
    out = run_rows(stitch, stitch.forward_unnormalized, x, stitch.d_tgt, _OUTPUT_ROWS)
    return np.asarray(out.cpu().numpy())


def fit_confidence(
    stitch: Stitch,
    X_train: Any,
    Y_train: Any,
    X_held: Any,
    Y_held: Any,
    *,
    X_general: Any = None,
    Y_general: Any = None,
    seed: int = 0,
    rank: int = 64,
) -> dict[str, Any]:
    """Fit a :class:`ConfidenceHead` for ``stitch`` and attach it (``stitch.confidence_head``).

    Parameters
    ----------
    stitch : Stitch
        A fitted stitch (not changed except for its ``confidence_head``).
    X_train, Y_train : array or Tensor of shape (n, d_src) and (n, d_tgt)
        The rows the stitch was fitted on (bootstrap members, principal axes, OOD threshold).
    X_held, Y_held : array or Tensor of shape (m, d_src) and (m, d_tgt)
        Held-out pairs, ``m >= MIN_HELD_OUT_ROWS``: the predictor and its calibration are
        fitted on their true ``cos(stitch(x), y)``.
    X_general, Y_general : array or Tensor of shape (g, d_src) and (g, d_tgt), optional
        Held-out pairs of text outside the held-out rows' domain (general sentences for a
        stitch fitted on a team's documents), ``g >= MIN_HELD_OUT_ROWS``: calibrated on
        together with the held-out rows, so that the confidence also ranks such inputs,
        and reported apart (``out_of_domain_spearman_score``). On rows that neither the
        stitch nor the head saw (``bench.confidence``), gated stitches calibrated on SciFact
        documents alone ranked STS-B sentences at 0.77-0.84, calibrated on sentences as
        well at 0.82-0.87 (documents: 0.69-0.84 against 0.69-0.86).
    seed : int, default 0
        Seed of the bootstrap and of the folds.
    rank : int, default 64
        Rank of the disagreement factor and of the principal basis.

    Returns
    -------
    dict
        The report also stored in ``config.json``: ``method``, ``version``,
        ``in_domain_spearman_score`` (Spearman of the out-of-fold calibrated confidence with the
        true cosine over the held-out rows, higher is better, 1 best),
        ``out_of_domain_spearman_score`` (same over the general rows; only with them),
        ``uncalibrated_spearman_score`` (over the held-out rows, before calibration),
        ``generic_spearman_score`` (same, from the generic features alone:
        :meth:`~lead.stitches.Stitch.confidence_features` left out), ``held_out_rows``,
        ``general_rows``, ``train_rows``, ``ood_threshold``, ``input_norm_range`` (the
        lowest and highest input L2 norm not flagged), ``train_ood_fraction`` and
        ``held_out_ood_fraction`` (over the held-out and general rows).

    Raises
    ------
    TooFewPairsError
        Fewer than :data:`MIN_HELD_OUT_ROWS` held-out rows (or general rows, when given),
        or fewer training rows than ``rank + 2``.
    IllConditionedError
        Training rows that do not vary (or as :func:`lead._validation.check_column_spread`),
        or held-out rows that the stitch all translates equally well.
    ShapeMismatchError
        If the shapes do not match the stitch or each other.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidInputError(f"rank must be a positive integer, got {rank!r}", param="rank")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidInputError(f"seed must be an integer >= 0, got {seed!r}", param="seed")
    Xt = _inputs(stitch, X_train, "X_train")
    Xh = _inputs(stitch, X_held, "X_held")
    Ph = _outputs(stitch, Xh)
    Yt = _as_numpy(Y_train, "Y_train", len(Xt), stitch.d_tgt)
    Yh = _as_numpy(Y_held, "Y_held", len(Xh), stitch.d_tgt)
    in_domain = len(Xh)
    problem = head_rows_problem(len(Xt), in_domain, stitch.d_src, rank)
    if problem is not None:
        raise problem
    check_column_spread(torch.from_numpy(Xt), name="X_train")  # e.g. all rows the same
    if (X_general is None) != (Y_general is None):
        raise InvalidInputError("give both X_general and Y_general, or neither", param="X_general")
    if X_general is not None:
        Xg = _inputs(stitch, X_general, "X_general")
        Yg = _as_numpy(Y_general, "Y_general", len(Xg), stitch.d_tgt)
        if len(Xg) < MIN_HELD_OUT_ROWS:
            raise TooFewPairsError(
                f"the general rows of a confidence head must be at least {MIN_HELD_OUT_ROWS}, "
                f"got {len(Xg)}",
                minimum=MIN_HELD_OUT_ROWS,
                got=len(Xg),
                param="X_general",
            )
        Xh, Yh = np.concatenate([Xh, Xg]), np.concatenate([Yh, Yg])
        Ph = np.concatenate([Ph, _outputs(stitch, Xg)])
    rank = min(rank, stitch.d_src)
    basis = _Basis(Xt, Yt, rank, seed)
    target_mean = Yt.mean(axis=0)
    rng = np.random.default_rng(seed + 1)
    # stage 1, on the training rows: cross-fitted ridge translations stand in for the
    # stitch's (whose own are in-sample there); their cosines teach the linear terms
    rows = rng.permutation(len(Xt))[:_STAGE1_ROWS]
    proxy = _crossfit_ridge(Xt[rows], Yt[rows], rng)  # unnormalised, as the stitch's
    feats = basis.features(Xt[rows], proxy, target_mean)
    scale = (feats.mean(axis=0), feats.std(axis=0) + 1e-9)
    A1 = _design(feats, Xt[rows] - basis.mu, scale)
    stage1 = _predictor(A1, _cosines(proxy, Yt[rows]))
    # stage 2, on the held-out rows: the stitch's true cosines from stage 1's score and
    # the scalar features (out-of-fold, so that the report is honest)
    fh = basis.features(Xh, Ph, target_mean)
    first = _design(fh, Xh - basis.mu, scale) @ stage1[0] + stage1[1]
    A = np.concatenate([first[:, None], (fh - scale[0]) / scale[1], Xh - basis.mu], axis=1)
    truth = _cosines(Ph, Yh)
    if float(np.ptp(truth)) == 0:
        raise IllConditionedError(
            "the stitch translates every held-out row equally well (the same true cosine): "
            "nothing to rank or calibrate a confidence on; hold out rows that differ",
            param="X_held",
        )
    folds = np.array_split(rng.permutation(len(A)), _FOLDS)
    generic = _out_of_fold(A, truth, folds, N_FEATURES + 1)
    coef2, intercept2 = _predictor(A, truth, features=N_FEATURES + 1)
    # stage 3: the stitch's own features (in-sample on the training rows, so only here) on
    # top of stage 2's out-of-fold score; a row where they are 0 keeps stage 2's ranking
    eh = _stitch_features(stitch, Xh)
    extra_scale = (eh.mean(axis=0), eh.std(axis=0))
    extra_scale[1][extra_scale[1] < 1e-6] = 1.0  # a constant feature: centred to 0
    B = np.concatenate([generic[:, None], (eh - extra_scale[0]) / extra_scale[1]], axis=1)
    oof = _out_of_fold(B, truth, folds, B.shape[1]) if eh.shape[1] else generic
    coef3, intercept3 = (
        _predictor(B, truth, features=B.shape[1]) if eh.shape[1] else (np.ones(1), 0.0)
    )
    knots_x, knots_y = _pav(oof, truth)
    # fold the stages into one linear function of the (standardised) features, the
    # stitch's features and the linear terms
    beta = _Folded(
        features=coef3[0] * (stage1[0][:N_FEATURES] * coef2[0] + coef2[1 : N_FEATURES + 1]),
        stitch_features=coef3[1:],
        x=coef3[0] * (stage1[0][N_FEATURES:] * coef2[0] + coef2[N_FEATURES + 1 :]),
        intercept=coef3[0] * (intercept2 + coef2[0] * stage1[1]) + intercept3,
    )
    calibrated = np.clip(np.interp(oof, knots_x, knots_y), 0, 1)
    train_distance, held_distance = basis.distance(Xt), basis.distance(Xh)
    threshold = OOD_MARGIN * float(
        max(np.quantile(train_distance, 0.999), np.quantile(held_distance, 0.999))
    )
    train_norm, held_norm = np.linalg.norm(Xt, axis=1), np.linalg.norm(Xh, axis=1)
    norm_range = (
        float(min(np.quantile(train_norm, 0.001), np.quantile(held_norm, 0.001))) / OOD_MARGIN,
        float(max(np.quantile(train_norm, 0.999), np.quantile(held_norm, 0.999))) * OOD_MARGIN,
    )
    train_ood = (train_distance > threshold) | _outside(train_norm, norm_range)
    held_ood = (held_distance > threshold) | _outside(held_norm, norm_range)
    head = _head(
        stitch,
        basis,
        beta,
        (scale, extra_scale),
        target_mean,
        (knots_x, knots_y),
        (threshold, norm_range),
        rank,
    )
    general_rows = len(Xh) - in_domain
    domain, general = slice(0, in_domain), slice(in_domain, len(Xh))
    out_of_domain = spearman_score(calibrated[general], truth[general]) if general_rows else None
    head.report = {
        "method": CONFIDENCE_METHOD,
        "version": CONFIDENCE_VERSION,
        "in_domain_spearman_score": round(spearman_score(calibrated[domain], truth[domain]), 4),
        **(
            {"out_of_domain_spearman_score": round(out_of_domain, 4)}
            if out_of_domain is not None
            else {}
        ),
        "uncalibrated_spearman_score": round(spearman_score(oof[domain], truth[domain]), 4),
        "generic_spearman_score": round(spearman_score(generic[domain], truth[domain]), 4),
        "held_out_rows": in_domain,
        "general_rows": general_rows,
        "train_rows": len(Xt),
        "ood_threshold": threshold,
        "input_norm_range": list(norm_range),
        "train_ood_fraction": float(np.mean(train_ood)),
        "held_out_ood_fraction": float(np.mean(held_ood)),
        "folds": _FOLDS,
        "seed": seed,
    }
    stitch.confidence_head = head.to(next(stitch.parameters()).device)
    return dict(head.report)


def head_rows_problem(
    train_rows: int, held_rows: int, d_src: int, rank: int = 64
) -> TooFewPairsError | None:
    """Why :func:`fit_confidence` cannot fit a head on so many rows, or None when it can.

    Returns
    -------
    TooFewPairsError or None
        The error for fewer than :data:`MIN_HELD_OUT_ROWS` held-out rows, or fewer
        training rows than ``min(rank, d_src) + 2``.
    """
    if held_rows < MIN_HELD_OUT_ROWS:
        return TooFewPairsError(
            f"a confidence head needs at least {MIN_HELD_OUT_ROWS} held-out pairs, got {held_rows}",
            minimum=MIN_HELD_OUT_ROWS,
            got=held_rows,
        )
    needed = min(rank, d_src) + 2
    if train_rows < needed:
        return TooFewPairsError(
            f"a confidence head needs at least {needed} training pairs, got {train_rows}",
            minimum=needed,
            got=train_rows,
        )
    return None


def attach_confidence(
    stitch: Stitch,
    X_train: Any,
    Y_train: Any,
    X_held: Any,
    Y_held: Any,
    *,
    X_general: Any = None,
    Y_general: Any = None,
    seed: int = 0,
) -> dict[str, Any] | None:
    """:func:`fit_confidence` when there are enough rows, else no head and the reason in
    ``stitch.info.fit["no_confidence"]`` (saved in ``config.json``: the service's 422
    ``no_confidence`` quotes it). For jobs and ``lead migrate calibrate``.

    Returns
    -------
    dict or None
        The report, or None (and no head) with fewer than :data:`MIN_HELD_OUT_ROWS`
        held-out rows or too few training rows.

    Raises
    ------
    TooFewPairsError
        Fewer general rows than :data:`MIN_HELD_OUT_ROWS` (asked for, so not skipped).
    """
    try:
        report = fit_confidence(
            stitch,
            X_train,
            Y_train,
            X_held,
            Y_held,
            X_general=X_general,
            Y_general=Y_general,
            seed=seed,
        )
        stitch.info.fit.pop(NO_CONFIDENCE_KEY, None)
        return report
    except TooFewPairsError as error:
        if error.param == "X_general":
            raise
        note_no_confidence(stitch, str(error))
        return None


#: The key of ``StitchInfo.fit`` that says why a stitch has no confidence head.
NO_CONFIDENCE_KEY = "no_confidence"


def note_no_confidence(stitch: Stitch, reason: str) -> None:
    """Record in ``stitch.info.fit`` why it has no confidence head (``reason``, one
    sentence), and drop any head it had."""
    stitch.confidence_head = None
    stitch.info.fit[NO_CONFIDENCE_KEY] = reason


def missing_head_message(stitch: Stitch | None, name: str | None = None) -> str:
    """Why ``stitch`` (named ``name``, when it has one) cannot give confidences: the reason
    its fit recorded (:func:`no_confidence_reason`), else how to get a head."""
    subject = "this stitch" if name is None else f"stitch {name}"
    reason = None if stitch is None else no_confidence_reason(stitch)
    if reason is not None:
        return f"{subject} has no confidence head: {reason}"
    return (
        f"{subject} has no confidence head: refit it with held-out rows (lead fit "
        "attaches one by default) or attach one with lead.confidence.fit_confidence"
    )


def no_confidence_reason(stitch: Stitch) -> str | None:
    """Why ``stitch`` has no confidence head, as its fit recorded it, or None."""
    fit = stitch.info.fit
    reason = fit.get(NO_CONFIDENCE_KEY) if isinstance(fit, dict) else None
    return reason if isinstance(reason, str) else None


def _as_numpy(Y: Any, name: str, rows: int, dim: int) -> np.ndarray:
    from lead._validation import as_matrix

    out = as_matrix(Y, name=name, dtype=torch.float64).cpu().numpy()
    if out.shape != (rows, dim):
        raise ShapeMismatchError(
            f"{name} must have shape ({rows}, {dim}), got {tuple(out.shape)}",
            expected=(rows, dim),
            got=tuple(out.shape),
            param=name,
        )
    return np.asarray(out)


def _cosines(P: np.ndarray, Y: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(P, axis=1) * np.linalg.norm(Y, axis=1)
    return np.asarray((P * Y).sum(axis=1) / np.clip(norms, 1e-12, None))


class _Folded(NamedTuple):
    """The predictor as one linear function: weights of the standardised features and
    stitch features, of the centred input, and the intercept."""

    features: np.ndarray
    stitch_features: np.ndarray
    x: np.ndarray
    intercept: float


def _stitch_features(stitch: Stitch, X: np.ndarray) -> np.ndarray:
    """The stitch's own features of rows already scaled (float64 numpy, (n, m))."""
    param = next(stitch.parameters())
    with torch.inference_mode():
        x = torch.as_tensor(X, dtype=param.dtype, device=param.device)
        out = forward_batch_invariant(stitch.confidence_features, x)
    return np.asarray(out.double().cpu().numpy())


def _head(
    stitch: Stitch,
    basis: _Basis,
    beta: _Folded,
    scales: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    target_mean: np.ndarray,
    knots: tuple[np.ndarray, np.ndarray],
    ood: tuple[float, tuple[float, float]],
    rank: int,
) -> ConfidenceHead:
    (mean, std), (extra_mean, extra_std) = scales
    knots_x, knots_y = knots
    w_feat = beta.features / std
    w_extra = beta.stitch_features / extra_std
    bias = beta.intercept - float(w_feat @ mean) - float(w_extra @ extra_mean)
    head = ConfidenceHead(
        stitch.d_src, stitch.d_tgt, rank=rank, knots=len(knots_x), stitch_features=len(w_extra)
    )
    values = {
        "source_mean": basis.mu,
        "target_mean": target_mean,
        "projection": np.concatenate([basis.G, basis.P, beta.x[:, None]], axis=1),
        "disagreement_offset": basis.g0,
        "feature_weight": np.concatenate([w_feat, w_extra]),
        "bias": [bias],
        "knots_x": knots_x,
        "knots_y": knots_y,
        "ood_threshold": [ood[0]],
        "input_norm_range": ood[1],
    }
    for name, value in values.items():
        getattr(head, name).copy_(torch.as_tensor(np.asarray(value), dtype=torch.float32))
    head.knots_x.copy_(_strictly_increasing(head.knots_x))
    return head


def _outside(norms: np.ndarray, norm_range: tuple[float, float]) -> np.ndarray:
    """Where ``norms`` lie outside ``[low, high]`` (what the head flags), as bool."""
    return np.asarray((norms < norm_range[0]) | (norms > norm_range[1]))


def _strictly_increasing(knots: Tensor) -> Tensor:
    """Nudge float32 knots that rounding made equal so that they increase strictly."""
    out = knots.clone()
    for i in range(1, out.shape[0]):
        if out[i] <= out[i - 1]:
            out[i] = torch.nextafter(out[i - 1], torch.tensor(float("inf")))
    return out


def translate_with_confidence(stitch: Stitch, x: Any) -> tuple[Tensor, Tensor, Tensor]:
    """Translate ``x`` and score every row with the stitch's confidence head.

    Parameters
    ----------
    stitch : Stitch
        A stitch with a ``confidence_head`` (:func:`fit_confidence`).
    x : array or Tensor of shape (n, d_src)
        Source-model vectors (scaled to unit length first when the stitch was fitted on
        unit-length vectors).

    Returns
    -------
    y : Tensor of shape (n, d_tgt), float32, on the CPU
        Bit-identical to the translation ``lead translate`` and the service give.
    confidence : Tensor of shape (n,), float32 in [0, 1]
    out_of_distribution : Tensor of shape (n,), bool

    Raises
    ------
    NoConfidenceError
        If the stitch has no confidence head.
    ShapeMismatchError, NonFiniteError, ZeroVectorError, NonFiniteOutputError
        As :func:`lead.apply_stitch`.
    """
    from lead._apply import stitch_input

    head = stitch.confidence_head
    if head is None:
        raise NoConfidenceError(missing_head_message(stitch), param="stitch")
    with torch.inference_mode():
        source = stitch_input(stitch, x, param="x")
        y, confidence, ood = stitch.forward_scored(source)
        if not bool(torch.isfinite(y).all()):
            raise NonFiniteOutputError("the stitch produced NaN or infinity from finite input")
    return y.float().cpu(), confidence.cpu(), ood.cpu()
