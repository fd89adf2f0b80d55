r"""Stitching without pairs: Gromov–Wasserstein matching, then iterated Procrustes.

The two models embedded two *unpaired* sets (the row order of ``Y`` says nothing about
``X``; the sets may even hold different texts). Within each space, the cosine distances
between texts are much alike across models, so an entropic Gromov–Wasserstein coupling
between samples of the two sets finds likely correspondences from the similarity
structure alone; its confident (mutually best) matches seed an orthogonal Procrustes map.
The map is then refined as in mini-vec2vec: every translated source vector is paired with
the mean of its nearest target vectors (and every target vector with the mean of its
nearest translated source vectors), the rotation is refitted on those pseudo-pairs, and
the neighbourhood shrinks round by round until it is the single nearest neighbour.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lead._options import check_float_option, check_int_option
from lead._validation import as_matrix
from lead.errors import FitError, TooFewPairsError
from lead.stitches import OrthogonalStitch

__all__ = ["MIN_UNPAIRED_ROWS", "fit_unsupervised"]

#: Fewest rows :func:`fit_unsupervised` accepts on each side.
MIN_UNPAIRED_ROWS = 8


def _unit_centred(Z: Tensor, mean: Tensor) -> Tensor:
    return torch.nn.functional.normalize(Z - mean, dim=1, eps=1e-12)


def _sample(n: int, size: int, rng: np.random.Generator) -> Tensor:
    rows = np.arange(n) if n <= size else np.sort(rng.choice(n, size, replace=False))
    return torch.from_numpy(rows)


def _neighbour_mean(neighbours: Tensor, Z: Tensor) -> Tensor:
    """Row ``i``: the mean of the rows ``neighbours[i]`` of ``Z`` (an averaging matmul)."""
    weights = torch.zeros(neighbours.shape[0], Z.shape[0], dtype=Z.dtype)
    weights.scatter_(1, neighbours, 1.0 / neighbours.shape[1])
    return torch.matmul(weights, Z)


def _mutual_best(S: Tensor) -> tuple[Tensor, Tensor]:
    """Row indices ``i`` and columns ``j`` where ``S[i, j]`` is best in its row and column."""
    best_col = S.argmax(dim=1)
    best_row = S.argmax(dim=0)
    rows = torch.nonzero(best_row[best_col] == torch.arange(S.shape[0])).flatten()
    return rows, best_col[rows]


def _rotation(P: Tensor, Q: Tensor) -> Tensor:
    """``R`` (d_tgt, d_src) with orthonormal rows or columns maximising ``tr(Qᵀ P Rᵀ)``."""
    try:
        U, _, Vh = torch.linalg.svd(Q.T @ P, full_matrices=False)
    except RuntimeError as error:  # torch.linalg.LinAlgError
        raise FitError(f"Procrustes SVD failed: {error}") from None
    return torch.matmul(U, Vh)


def _neighbour_schedule(neighbours: int, rounds: int, n: int) -> list[int]:
    """Neighbours averaged in each round: from ``neighbours`` down to 1, linearly."""
    top = min(neighbours, n)
    return [max(1, round(top * (1 - r / rounds))) for r in range(rounds)]


def _gromov_wasserstein(
    Xs: Tensor, Ys: Tensor, epsilon: float, max_iter: int
) -> tuple[Tensor, dict[str, Any]]:
    """Entropic GW coupling (n_x, n_y) between two unit-row samples, cosine distances."""
    import ot  # late import: POT (with scipy) takes ~0.7 s to import, only this needs it

    C1, C2 = 1.0 - Xs @ Xs.T, 1.0 - Ys @ Ys.T
    p = torch.full((C1.shape[0],), 1.0 / C1.shape[0], dtype=torch.float64)
    q = torch.full((C2.shape[0],), 1.0 / C2.shape[0], dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        T, log = ot.gromov.entropic_gromov_wasserstein(
            C1, C2, p, q, "square_loss", epsilon=epsilon, max_iter=max_iter, tol=1e-9, log=True
        )
    if not bool(torch.isfinite(T).all()) or float(T.sum()) <= 0:
        raise FitError(
            f"the Gromov–Wasserstein coupling is not finite (epsilon={epsilon:g} too small?)"
        )
    distance = float(log["gw_dist"])
    return T, {
        "gw_distance": distance if np.isfinite(distance) else None,
        "gw_solver_warnings": len(caught),
    }


#: Upper bounds of the options: a request can not make a fit run for days or fill memory
#: (Gromov-Wasserstein works on sample_size² matrices, refinement on refine_size²).
MAX_SAMPLE_SIZE, MAX_REFINE_SIZE, MAX_ROUNDS, MAX_GW_ITER, MAX_NEIGHBOURS = (
    2000,
    8000,
    200,
    2000,
    500,
)


def check_unsupervised_options(**options: Any) -> dict[str, Any]:
    """Validate the options of :func:`fit_unsupervised` (all keyword, all required here).

    Returns
    -------
    dict
        The options as plain ``int`` / ``float``.

    Raises
    ------
    InvalidInputError
        Naming the first option of the wrong type or out of range.
    """
    ints = {
        "sample_size": (MIN_UNPAIRED_ROWS, MAX_SAMPLE_SIZE),
        "gw_max_iter": (1, MAX_GW_ITER),
        "rounds": (0, MAX_ROUNDS),
        "neighbours": (1, MAX_NEIGHBOURS),
        "refine_size": (MIN_UNPAIRED_ROWS, MAX_REFINE_SIZE),
        "seed": (0, None),
    }
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name == "epsilon":
            out[name] = check_float_option(value, name, minimum=0.0, inclusive=False, maximum=2.0)
        else:
            low, high = ints[name]
            out[name] = check_int_option(value, name, minimum=low, maximum=high)
    return out


def fit_unsupervised(
    X: Any,
    Y: Any,
    *,
    sample_size: int = 1000,
    epsilon: float = 0.003,
    gw_max_iter: int = 500,
    rounds: int = 40,
    neighbours: int = 50,
    refine_size: int = 4000,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
) -> OrthogonalStitch:
    r"""Fit an orthogonal stitch from two unpaired sets of vectors.

    Parameters
    ----------
    X : array_like or Tensor of shape (n_x, d_src)
        Vectors of the source model, ``n_x >= 8``.
    Y : array_like or Tensor of shape (n_y, d_tgt)
        Vectors of the target model, ``n_y >= 8``: other texts, or the same texts in an
        unknown order. ``n_y`` and ``d_tgt`` may differ from ``n_x`` and ``d_src``.
    sample_size : int, default 1000
        Rows drawn from each side for the Gromov–Wasserstein matching (all rows when a
        side has fewer); ``8 … 2000``. Its cost grows as ``sample_size**3`` per iteration.
    epsilon : float, default 0.003
        Entropic regularisation of the coupling, ``> 0``, on the scale of cosine
        distances (``(0, 2]``). Smaller is sharper but slower and less stable.
    gw_max_iter : int, default 500
        Most outer iterations of the Gromov–Wasserstein solver, ``1 … 2000``.
    rounds : int, default 40
        Refinement rounds (re-match, refit), ``0 … 200``.
    neighbours : int, default 50
        Nearest neighbours averaged into each pseudo-target in the first refinement round,
        ``1 … 500``; the count falls linearly to 1 over the rounds.
    refine_size : int, default 4000
        Rows drawn from each side for the refinement (all when fewer), ``8 … 8000``; memory
        grows as ``refine_size**2`` (about 260 MB at 4000).
    seed : int, default 0
        Seed of the row samples.
    progress : callable, optional
        ``progress(stage, step, total)``: ``("match", 0, 1)`` before the matching and
        ``("refine", round, rounds)`` before every refinement round and
        ``("refine", rounds, rounds)`` after the last; what it raises (e.g.
        :class:`~lead.errors.JobCancelledError`) stops the fit.

    Returns
    -------
    OrthogonalStitch
        ``weight`` (d_tgt, d_src) with orthonormal rows or columns, one ``scale`` for all
        dimensions (``scaling=True``), float32 parameters, gradients off. ``info.fit``
        holds ``unpaired_rows`` ([n_x, n_y]), ``sample_size``, ``epsilon``,
        ``gw_max_iter``, ``gw_distance``, ``gw_solver_warnings`` (convergence warnings of
        the solver, silenced), ``gw_matched_pairs`` (mutual matches of the coupling),
        ``refine_size``, ``rounds``, ``neighbours_per_round``, ``matched_pairs`` (mutual
        nearest neighbours among the refinement rows after the last round: a confidence
        figure), ``matched_cosine`` (their mean cosine), ``scale``, ``seed``,
        ``gw_seconds``, ``seconds`` and ``warnings`` (reasons to distrust the fit, e.g.
        fewer than :data:`RELIABLE_ROWS` rows on a side; empty when none).

    Raises
    ------
    ShapeMismatchError, NonFiniteError
        For inputs that are not finite 2-D arrays.
    TooFewPairsError
        For fewer than 8 rows on a side, or a coupling with fewer than 4 confident
        matches (``param="epsilon"``).
    InvalidInputError
        For an option of the wrong type or out of range (``param`` names it).
    FitError
        If the coupling is not finite or an SVD fails.

    Notes
    -----
    1. Matching. Each side is centred on its mean and L2-normalised; on samples of
       ``sample_size`` rows the cosine distance matrices :math:`C^x, C^y` are coupled by
       entropic Gromov–Wasserstein [1]_,
       :math:`T = \arg\min_{T \in \Pi(p, q)} \sum_{ijkl} (C^x_{ik} - C^y_{jl})^2 T_{ij}
       T_{kl} - \epsilon H(T)` with uniform :math:`p, q`, solved by projected gradient
       with Sinkhorn steps (POT [2]_). Pairs :math:`(i, j)` where :math:`T_{ij}` is the
       largest of both its row and its column seed the map.
    2. Refinement. With :math:`\mathrm{Proc}(P, Q) = UV^\top` from the SVD
       :math:`Q^\top P = U S V^\top` (orthogonal Procrustes), round :math:`r` of
       ``rounds`` averages :math:`k_r` nearest neighbours, :math:`k_r` falling linearly
       from ``neighbours`` to 1: with :math:`\hat x_i = R x_i`, the pseudo-target of
       :math:`x_i` is :math:`\bar y_i = \mathrm{mean}_{j \in N_{k_r}(\hat x_i)}\, y_j`,
       the pseudo-source of :math:`y_j` is
       :math:`\bar x_j = \mathrm{mean}_{i \in N_{k_r}(y_j)}\, x_i`, and
       :math:`R \leftarrow \mathrm{Proc}([X; \bar X], [\bar Y; Y])` (all rows centred on
       their side's mean and L2-normalised) [3]_, [5]_. Averaging neighbours is what lets
       the loop lift off from a weak start when the two sets hold different texts;
       mutual nearest neighbours alone stall there.
    3. The stitch is :math:`\hat y = s\, R (x - \mu_x) + \mu_y` with the means of all of
       ``X`` and ``Y`` and one scale :math:`s`, the ratio of the mean centred norms of
       ``Y`` and ``X`` (known without pairs).

    Measured (``bench/results/zeroshot.json``): all-MiniLM-L6-v2 → paraphrase-MiniLM-L3-v2,
    2,000 SciFact documents per side, default options, one thread, ~20 s per fit; top-1
    among 1,000 held-out documents 0.97 when both sides hold the same documents
    (shuffled) and 0.76–0.79 over three seeds when they hold different documents, against
    0.97 for Procrustes and 0.92 for ridge fitted on the 2,000 true pairs.

    Nothing guarantees success: the coupling can lock onto a wrong symmetry, and a
    source and target space too unlike each other have no structure to match
    (``bench/zeroshot.py`` measures real models, with the same and with different texts
    on each side). Check the result against a few known pairs where you can.

    References
    ----------
    .. [1] Peyré, G., Cuturi, M. and Solomon, J. (2016). Gromov-Wasserstein averaging of
       kernel and distance matrices. ICML. http://proceedings.mlr.press/v48/peyre16.html
    .. [2] Flamary, R. et al. (2021). POT: Python Optimal Transport. JMLR 22(78), 1-8.
       https://jmlr.org/papers/v22/20-451.html
    .. [3] Artetxe, M., Labaka, G. and Agirre, E. (2018). A robust self-learning method for
       fully unsupervised cross-lingual mappings of word embeddings. ACL. arXiv:1805.06297
    .. [4] Alvarez-Melis, D. and Jaakkola, T. (2018). Gromov-Wasserstein alignment of word
       embedding spaces. EMNLP. arXiv:1809.00013
    .. [5] Dar, G. (2025). mini-vec2vec: scaling universal geometry alignment with linear
       transformations. arXiv:2510.02348

    Examples
    --------
    A rotated copy of a point cloud, rows shuffled, is matched back:

    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(60, 5, generator=g, dtype=torch.float64) * torch.arange(1.0, 6.0)
    >>> Q = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64)).Q
    >>> Y = (X @ Q.T)[torch.randperm(60, generator=g)]
    >>> stitch = fit_unsupervised(X, Y, epsilon=0.01)
    >>> torch.allclose(stitch.weight, Q.float(), atol=1e-3)
    True
    """
    checked = check_unsupervised_options(
        sample_size=sample_size,
        epsilon=epsilon,
        gw_max_iter=gw_max_iter,
        rounds=rounds,
        neighbours=neighbours,
        refine_size=refine_size,
        seed=seed,
    )
    sample_size, gw_max_iter, rounds = (
        checked[k] for k in ("sample_size", "gw_max_iter", "rounds")
    )
    neighbours, refine_size, seed = (checked[k] for k in ("neighbours", "refine_size", "seed"))
    epsilon = checked["epsilon"]
    X = as_matrix(X, name="X")
    Y = as_matrix(Y, name="Y")
    for name, Z in (("X", X), ("Y", Y)):
        if Z.shape[0] < MIN_UNPAIRED_ROWS:
            raise TooFewPairsError(
                f"{name} needs at least {MIN_UNPAIRED_ROWS} rows, got {Z.shape[0]}",
                minimum=MIN_UNPAIRED_ROWS,
                got=Z.shape[0],
                param=name,
            )
    X, Y = X.cpu(), Y.cpu()
    if progress is not None:
        progress("match", 0, 1)
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    sx, sy = _sample(X.shape[0], sample_size, rng), _sample(Y.shape[0], sample_size, rng)
    Xs, Ys = X[sx], Y[sy]
    T, gw_info = _gromov_wasserstein(
        _unit_centred(Xs, Xs.mean(dim=0)), _unit_centred(Ys, Ys.mean(dim=0)), epsilon, gw_max_iter
    )
    gw_seconds = time.perf_counter() - start
    i, j = _mutual_best(T)
    gw_pairs = int(i.numel())
    if gw_pairs < 4:
        raise TooFewPairsError(
            f"the Gromov–Wasserstein coupling has only {gw_pairs} confident matches; "
            "try a larger sample_size or epsilon",
            minimum=4,
            got=gw_pairs,
            param="epsilon",
        )
    mean_x, mean_y = X.mean(dim=0), Y.mean(dim=0)
    rx, ry = _sample(X.shape[0], refine_size, rng), _sample(Y.shape[0], refine_size, rng)
    Xr, Yr = _unit_centred(X[rx], mean_x), _unit_centred(Y[ry], mean_y)
    rotation = _rotation(_unit_centred(Xs[i], mean_x), _unit_centred(Ys[j], mean_y))
    schedule = _neighbour_schedule(neighbours, rounds, min(Xr.shape[0], Yr.shape[0]))
    for step, k in enumerate(schedule):
        if progress is not None:
            progress("refine", step, len(schedule))
        S = (Xr @ rotation.T) @ Yr.T
        near_y, near_x = S.topk(k, dim=1).indices, S.T.topk(k, dim=1).indices
        del S
        targets = _neighbour_mean(near_y, Yr)  # (n_x, d_tgt)
        sources = _neighbour_mean(near_x, Xr)  # (n_y, d_src)
        rotation = _rotation(torch.cat([Xr, sources]), torch.cat([targets, Yr]))
    if progress is not None:
        progress("refine", len(schedule), len(schedule))
    a, b = _mutual_best((Xr @ rotation.T) @ Yr.T)
    norm_x = float((X - mean_x).norm(dim=1).mean())
    norm_y = float((Y - mean_y).norm(dim=1).mean())
    scale = norm_y / norm_x if norm_x > 0 else 1.0
    stitch = OrthogonalStitch(X.shape[1], Y.shape[1], scaling=True)
    with torch.no_grad():
        stitch.weight.copy_(rotation)
        stitch.scale.fill_(scale)
        stitch.source_mean.copy_(mean_x)
        stitch.target_mean.copy_(mean_y)
    stitch.info.fit = {
        "unpaired_rows": [int(X.shape[0]), int(Y.shape[0])],
        "sample_size": sample_size,
        "epsilon": epsilon,
        "gw_max_iter": gw_max_iter,
        **gw_info,
        "gw_matched_pairs": gw_pairs,
        "refine_size": refine_size,
        "rounds": len(schedule),
        "neighbours_per_round": schedule,
        "matched_pairs": int(a.numel()),
        "matched_cosine": float((Xr[a] @ rotation.T * Yr[b]).sum(dim=1).mean())
        if a.numel()
        else 0.0,
        "scale": scale,
        "seed": seed,
        "gw_seconds": round(gw_seconds, 3),
        "seconds": round(time.perf_counter() - start, 3),
    }
    stitch.info.fit["warnings"] = _warnings(stitch.info.fit)
    return stitch.requires_grad_(False)


#: Fewest rows per side at which the bench saw reliable unpaired matching (SciFact:
#: held-out top-1 0.78 at 2,000 rows, 0.60 with 1,000 refinement rows; 200 fails).
RELIABLE_ROWS = 1000


def _warnings(fit: dict[str, Any]) -> list[str]:
    """Reasons to distrust an unpaired fit, for the user to read (empty when none)."""
    out = []
    fewest = min(fit["unpaired_rows"])
    if fewest < RELIABLE_ROWS:
        out.append(
            f"only {fewest} rows on one side: matching without pairs is unreliable below "
            f"about {RELIABLE_ROWS} rows per side; check the stitch on a few known pairs "
            "(lead score) before using it"
        )
    if fit.get("gw_solver_warnings"):
        out.append(
            f"the Gromov-Wasserstein solver reported {fit['gw_solver_warnings']} numerical "
            "warnings; a larger epsilon may match more reliably"
        )
    return out
