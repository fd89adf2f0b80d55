"""Train an :class:`~lead.stitches.InvertibleStitch` on pairs, in both directions at once.

Read top to bottom: split; start the linear part at a canonical-correlation map that
balances the forward and the inverse error (embedded in ``max(d_src, d_tgt)`` dimensions);
solve each coupling's shift on random features (``ridge-features``); then epochs of AdamW
on the forward loss plus the loss of the inverse map, with early stopping that keeps the
best epoch (the closed-form start counts as epoch 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lead._epochs import train_epochs
from lead._validation import (
    check_callable,
    check_config,
    check_config_fields,
    check_device,
    check_pairs,
)
from lead.closed_form import ProgressCallback, fit_ridge
from lead.errors import FitError, IllConditionedError, InvalidInputError
from lead.splits import early_stopping_split
from lead.stitches import InvertibleStitch, _Coupling, unit_rows

__all__ = ["COVARIANCE_REGS", "InvertibleConfig", "train_invertible"]

INITS = ("ridge-features", "zero")
#: Largest accepted values: a request can neither exhaust memory nor overflow float32.
_MOST: dict[str, float] = {
    "hidden_dim": 4096,
    "coupling_layers": 32,
    "max_epochs": 10_000,
    "lr": 10.0,
    "linear_lr_scale": 100.0,
    "init_scale": 1000.0,
    "init_offset": 1000.0,
    "inverse_weight": 1.0,
    "norm_weight": 1e6,
    "weight_decay": 1e3,
}
#: Covariance regularisations tried for the linear start when none is given.
COVARIANCE_REGS: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0)


@dataclass(frozen=True)
class InvertibleConfig:
    """Settings of :func:`train_invertible`.

    Attributes
    ----------
    hidden_dim, coupling_layers : int
        Width of each coupling network (1 … 4096) and the number of coupling layers
        (0 … 32).
    max_log_scale : float
        Bound on every coupling's log-scale (keeps the inverse well conditioned).
    lr, weight_decay : float
        AdamW learning rate of the coupling layers (the linear part moves at
        ``linear_lr_scale`` times it) and their decoupled weight decay.
    linear_lr_scale : float
        Learning-rate factor of the linear part, which starts at its closed-form optimum.
    inverse_weight : float
        Weight ``w`` of the inverse map's loss (target → source) against the forward one,
        in the linear start and in training. 0 fits the forward map alone (least squares:
        the inverse is still exact, but it blows up weakly correlated directions, so it
        translates target vectors badly); 1 treats both directions alike (reduced major
        axis), at a cost in forward accuracy. The default, 0.01, keeps the forward map
        close to least squares while the inverse ranks target vectors almost as well.
    covariance_reg : float or None
        The covariances whitened for the linear start get ``covariance_reg`` (1e-8 … 1e4)
        times their mean eigenvalue added to every eigenvalue. None (default) tries
        :data:`COVARIANCE_REGS` and keeps the one with the least held-out loss (few pairs
        for the dimension need more).
    norm_weight : float
        With unit-length outputs, the weight of :math:`(\\lVert \\hat y \\rVert - 1)^2`,
        which keeps the unnormalised outputs near unit length so that normalising them
        loses almost nothing of a round trip.
    init : {"ridge-features", "zero"}
        How the coupling layers start. ``"zero"``: as the identity (the stitch starts as its
        linear part). ``"ridge-features"`` (default): layer by layer, the first layer's
        units are centred on training vectors of the conditioning half (weight
        ``init_scale * c / (|c| r)`` with ``r`` the median row norm, bias
        ``-init_scale * init_offset``) and the shift's output layer is solved by ridge on
        what is left of the target, as :class:`lead.training.MLPConfig` does for the MLP.
    init_scale, init_offset : float
        Sharpness and threshold of the ``ridge-features`` units.
    min_singular_ratio : float
        Singular values of the starting linear map are raised to at least this fraction of
        the largest (a safety net: the balanced start is already well conditioned).
    batch_size, max_epochs, patience : int
        Mini-batch size; most epochs; epochs without held-out improvement before stopping.
    holdout_fraction : float
        Share of the pairs held out for early stopping.
    seed : int
        Seeds the held-out split, the ridge start and the shuffling.
    device : str
        Torch device to train on.
    """

    hidden_dim: int = 256
    coupling_layers: int = 4
    max_log_scale: float = 2.0
    lr: float = 1e-3
    weight_decay: float = 1e-4
    linear_lr_scale: float = 0.1
    inverse_weight: float = 0.01
    norm_weight: float = 1.0
    covariance_reg: float | None = None
    min_singular_ratio: float = 1e-3
    init: str = "ridge-features"
    init_scale: float = 2.0
    init_offset: float = 0.3
    batch_size: int = 256
    max_epochs: int = 30
    patience: int = 4
    holdout_fraction: float = 0.1
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_config_fields(
            self,
            zero_ok=frozenset(
                {"coupling_layers", "weight_decay", "inverse_weight", "norm_weight", "init_offset"}
            ),
            most=_MOST,
        )
        if self.holdout_fraction >= 1:
            raise InvalidInputError("holdout_fraction must be below 1", param="holdout_fraction")
        reg = self.covariance_reg
        if reg is not None and (
            isinstance(reg, bool) or not isinstance(reg, int | float) or not 1e-8 <= reg <= 1e4
        ):
            raise InvalidInputError(
                "covariance_reg must be a number in [1e-8, 1e4], or null", param="covariance_reg"
            )
        if self.init not in INITS:
            raise InvalidInputError(
                f"init must be one of {', '.join(INITS)}, got {self.init!r}", param="init"
            )
        if self.max_log_scale > 10:
            raise InvalidInputError("max_log_scale must be <= 10", param="max_log_scale")
        if self.min_singular_ratio >= 1:
            raise InvalidInputError(
                "min_singular_ratio must be below 1", param="min_singular_ratio"
            )
        check_device(self.device)


def _svd(matrix: Tensor, *, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.linalg.svd``, once more in the other floating precision when LAPACK's
    divide-and-conquer driver fails to converge (it did for a well-conditioned 768 x 384
    start in float64 with one thread, and not in float32 or with two).

    Raises
    ------
    FitError
        When it fails in both precisions.
    """
    try:  # torch.linalg.LinAlgError is a RuntimeError (and not typed as exported)
        U, S, Vh = torch.linalg.svd(matrix, full_matrices=full_matrices)
        return U, S, Vh
    except RuntimeError:
        other = torch.float32 if matrix.dtype == torch.float64 else torch.float64
        try:
            parts = torch.linalg.svd(matrix.to(other), full_matrices=full_matrices)
        except RuntimeError:
            raise FitError(
                f"the invertible fit's linear start, shape {tuple(matrix.shape)}, did not converge "
                "(LAPACK's SVD); more pairs or a larger covariance_reg may help"
            ) from None
        U, S, Vh = (part.to(matrix.dtype) for part in parts)
        return U, S, Vh


def _square_start(weight: Tensor, min_ratio: float) -> Tensor:
    """Embed the ridge weight (d_tgt, d_src) in a well-conditioned invertible (D, D) matrix.

    The missing columns (``d_src < d_tgt``) or rows (``d_src > d_tgt``) span the orthogonal
    complement of the weight's column (row) space at the median singular value.
    """
    d_tgt, d_src = weight.shape
    if d_src != d_tgt:
        tall = weight if d_src < d_tgt else weight.T  # (D, d) with D > d
        U, S, _ = _svd(tall)
        complement = U[:, tall.shape[1] :] * S.median()
        square = torch.cat([tall, complement], dim=1)
        weight = square if d_src < d_tgt else square.T
    U, S, Vh = _svd(weight)
    S = S.clamp_min(float(S.max()) * min_ratio)
    conditioned: Tensor = (U * S) @ Vh
    return conditioned


def _balanced_gains(rho: Tensor, weight: float) -> Tensor:
    r"""Per canonical direction, the gain ``g`` minimising forward + ``weight`` × inverse error.

    In whitened coordinates a direction with canonical correlation :math:`\rho` mapped with
    gain :math:`g` has forward error :math:`1 - 2g\rho + g^2` and inverse error
    :math:`1 - 2\rho/g + 1/g^2`; the weighted sum is least at the root in
    :math:`[\rho, 1]` of :math:`g^4 - \rho g^3 + w\rho g - w` (found by bisection):
    :math:`g = \rho` (least squares) for :math:`w = 0`, :math:`g = 1` for :math:`w = 1`.
    """
    lo, hi = rho.clone(), torch.ones_like(rho)
    for _ in range(60):
        g = (lo + hi) / 2
        below = g**4 - rho * g**3 + weight * rho * g - weight < 0
        lo, hi = torch.where(below, g, lo), torch.where(below, hi, g)
    return (lo + hi) / 2


def _root_pair(C: Tensor, reg: float) -> tuple[Tensor, Tensor]:
    """``C^{1/2}`` and ``C^{-1/2}`` of a covariance, its eigenvalues raised by ``reg`` × mean."""
    lam, V = torch.linalg.eigh(C)
    lam = lam.clamp_min(0.0) + reg * float(lam.clamp_min(0.0).mean()) + 1e-300
    return (V * lam.sqrt()) @ V.T, (V / lam.sqrt()) @ V.T


@torch.no_grad()
def _set_linear(
    model: InvertibleStitch, X: Tensor, Y: Tensor, config: InvertibleConfig, reg: float
) -> None:
    """Start the linear part at the balanced canonical-correlation map of ``Y`` on ``X``.

    With regularised covariances, :math:`M = C_x^{-1/2} C_{xy} C_y^{-1/2} = U P V^\top`
    (canonical correlations :math:`P`), the start is
    :math:`W = C_y^{1/2} V G U^\top C_x^{-1/2}` with gains :math:`G` from
    :func:`_balanced_gains`: the least-squares (OLS) map when ``inverse_weight`` is 0, the
    symmetric (reduced major axis) map when it is 1.
    """
    n = X.shape[0]
    mean_x, mean_y = X.mean(dim=0), Y.mean(dim=0)
    Xc, Yc = X - mean_x, Y - mean_y
    try:
        _, Sx_inv = _root_pair(Xc.T @ Xc / n, reg)
        Sy, Sy_inv = _root_pair(Yc.T @ Yc / n, reg)
        U, rho, Vh = _svd(Sx_inv @ (Xc.T @ Yc / n) @ Sy_inv, full_matrices=False)
    except FitError:  # from _svd: says what helps
        raise
    except RuntimeError as error:  # torch.linalg.LinAlgError
        raise FitError(f"canonical correlation start failed: {error}") from None
    gains = _balanced_gains(rho.clamp(0.0, 1.0), config.inverse_weight)
    W = _square_start(Sy @ Vh.T @ torch.diag(gains) @ U.T @ Sx_inv, config.min_singular_ratio)
    P, L, Up = torch.linalg.lu(W)
    diag = Up.diagonal()
    model.perm.copy_(P)
    model.lower.copy_(L)
    model.upper.copy_(Up)
    model.sign.copy_(torch.where(diag < 0, -1.0, 1.0))
    model.log_scale.copy_(diag.abs().clamp_min(1e-12).log())
    model.source_mean.copy_(mean_x)
    model.target_mean.copy_(mean_y)


@torch.no_grad()
def _init_couplings(
    model: InvertibleStitch,
    X: Tensor,
    Y: Tensor,
    config: InvertibleConfig,
    progress: ProgressCallback | None = None,
) -> None:
    """Solve each coupling's shift in closed form on random features (``ridge-features``).

    Layer by layer: the pairs run through the stitch so far, the shift network's units are
    centred on training rows of its conditioning half, and its output layer is the ridge
    fit (strength chosen on held-out pairs by :func:`lead.fitting.fit_ridge`) of the free
    half of what the target still lacks.
    """
    generator = torch.Generator().manual_seed(config.seed)
    z = model._pad(X.float() - model.source_mean) @ model.linear_weight().T
    target = model._pad(Y.float() - model.target_mean)
    for layer, coupling in enumerate(model.couplings):
        assert isinstance(coupling, _Coupling)
        if progress is not None:
            progress("init", layer, len(model.couplings))
        first, _, last = coupling.net
        assert isinstance(first, torch.nn.Linear) and isinstance(last, torch.nn.Linear)
        cond = z[:, coupling.cond]
        rows = torch.randint(cond.shape[0], (config.hidden_dim,), generator=generator)
        centres = torch.nn.functional.normalize(cond[rows], dim=1)
        radius = float(cond.norm(dim=1).median().clamp_min(1e-12))
        first.weight.copy_(config.init_scale * centres / radius)
        first.bias.fill_(-config.init_scale * config.init_offset)
        features = coupling.net[:2](cond).double()
        free = z.shape[1] - cond.shape[1]
        try:
            ridge = fit_ridge(features, (target - z)[:, coupling.free].double(), seed=config.seed)
        except IllConditionedError as error:  # of its features: not the caller's vectors
            raise IllConditionedError(
                f"the invertible fit's coupling layer {layer} cannot start: its random "
                "features of the mapped source vectors do not vary in float32 (are the "
                "source or target vectors at a scale far from 1, such as 1e-30 or 1e30? "
                "scale them first)",
                param="source",
            ) from error
        last.weight[free:].copy_(ridge.weight)
        last.bias[free:].copy_(ridge.target_mean - ridge.weight @ ridge.source_mean)
        z = coupling(z)


def _side_loss(raw: Tensor, target: Tensor, normalize: bool, norm_weight: float) -> Tensor:
    """Mean squared L2 error per row (of the unit rows when ``normalize``, plus the norm term)."""
    loss: Tensor
    if not normalize:
        loss = ((raw - target) ** 2).sum(dim=1).mean()
        return loss
    norm_term = ((raw.norm(dim=1) - 1.0) ** 2).mean()
    loss = ((unit_rows(raw) - target) ** 2).sum(dim=1).mean() + norm_weight * norm_term
    return loss


def train_invertible(
    X: Any,
    Y: Any,
    config: InvertibleConfig | None = None,
    progress: ProgressCallback | None = None,
    *,
    normalize_output: bool = False,
    normalize_inverse_output: bool = False,
) -> InvertibleStitch:
    r"""Train a bijective stitch on paired vectors, forward and inverse together.

    Parameters
    ----------
    X : array_like or Tensor of shape (n, d_src)
        Source-model vectors; ``n >= 8``, and enough that ``holdout_fraction`` of them is
        at least 4 pairs (40 with the default 0.1).
    Y : array_like or Tensor of shape (n, d_tgt)
        Target-model vectors of the same items.
    config : InvertibleConfig, optional
        Training settings; defaults to ``InvertibleConfig()``.
    progress : callable, optional
        Called as ``progress("init", layer, coupling_layers)`` before each coupling's
        closed-form start and ``progress("train", epoch, config.max_epochs)`` after every
        epoch (the last one ``progress("train", epochs, epochs)`` when early stopping ends
        training); an exception it raises (e.g. :class:`~lead.errors.JobCancelledError`)
        propagates.
    normalize_output, normalize_inverse_output : bool, default False
        L2-normalise the forward (target-space) and inverse (source-space) outputs; the
        losses then see the normalised rows.

    Returns
    -------
    InvertibleStitch
        The best epoch's parameters (float32, CPU, eval mode, gradients off). ``info.fit``
        holds ``inverse_weight``, ``covariance_reg``, ``epochs``, ``best_epoch``,
        ``init_holdout_loss`` and ``best_holdout_loss`` (forward + ``inverse_weight`` ×
        inverse, per row).

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        For bad inputs, or too few pairs to hold out 4 of them.
    FitError
        If the training loss becomes NaN or infinite (lower ``lr``).
    InvalidInputError
        If ``config`` is not a :class:`InvertibleConfig` or ``progress`` is not callable.

    Notes
    -----
    The loss of a batch is
    :math:`\ell(\hat y, y) + w_{inv}\, \ell(\hat x, x)` with :math:`\hat y` the forward map
    of :math:`x`, :math:`\hat x` the inverse map of :math:`y` and :math:`\ell` the mean
    squared L2 distance per row; with normalised outputs :math:`\ell` compares the unit
    rows and adds :math:`w_{norm}(\lVert \cdot \rVert - 1)^2`. Training both directions
    follows BERT-INN (Guo et al., 2023 [1]_), which fits invertible maps between
    transformer embedding spaces.

    References
    ----------
    .. [1] Guo, Y. et al. (2023). All roads lead to Rome? Exploring the invariance of
       transformers' representations. arXiv:2305.14555
    .. [2] Dinh, L., Sohl-Dickstein, J. and Bengio, S. (2017). Density estimation using Real
       NVP. ICLR. arXiv:1605.08803
    """
    config = config if config is not None else InvertibleConfig()
    check_config(config, InvertibleConfig)
    check_callable(progress, "progress")
    X, Y = check_pairs(X, Y, minimum=8)
    n, d_src = X.shape
    device = torch.device(config.device)
    train_idx, val_idx = early_stopping_split(
        n, config.holdout_fraction, config.seed, method="invertible"
    )
    torch.manual_seed(config.seed)
    model = InvertibleStitch(
        d_src,
        Y.shape[1],
        hidden_dim=config.hidden_dim,
        coupling_layers=config.coupling_layers,
        max_log_scale=config.max_log_scale,
        normalize_output=normalize_output,
        normalize_inverse_output=normalize_inverse_output,
    )
    model.to(device)
    X_train, Y_train = X[train_idx].float().to(device), Y[train_idx].float().to(device)
    X_val, Y_val = X[val_idx].float().to(device), Y[val_idx].float().to(device)

    def batch_loss(x: Tensor, y: Tensor) -> Tensor:
        forward = model._map(x - model.source_mean) + model.target_mean
        loss = _side_loss(forward, y, normalize_output, config.norm_weight)
        if config.inverse_weight > 0:
            backward = model.inverse_raw(y)
            loss = loss + config.inverse_weight * _side_loss(
                backward, x, normalize_inverse_output, config.norm_weight
            )
        return loss

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        total = 0.0
        for start in range(0, X_val.shape[0], config.batch_size):
            x, y = (
                X_val[start : start + config.batch_size],
                Y_val[start : start + config.batch_size],
            )
            total += float(batch_loss(x, y)) * x.shape[0]
        return total / float(X_val.shape[0])

    linear = [model.lower, model.upper, model.log_scale]
    optimizer = torch.optim.AdamW(
        [
            {"params": linear, "weight_decay": 0.0, "lr": config.lr * config.linear_lr_scale},
            {"params": list(model.couplings.parameters()), "weight_decay": config.weight_decay},
        ],
        lr=config.lr,
    )
    for p in (*linear, *model.couplings.parameters()):
        p.requires_grad_(True)
    regs = COVARIANCE_REGS if config.covariance_reg is None else (config.covariance_reg,)
    start_losses = {}
    for reg in regs:  # the linear start: closed form, its regularisation on held-out pairs
        _set_linear(model, X[train_idx], Y[train_idx], config, reg)
        start_losses[reg] = evaluate()
    reg = min(regs, key=lambda r: (start_losses[r], -r))
    if reg != regs[-1]:
        _set_linear(model, X[train_idx], Y[train_idx], config, reg)
    init_loss = start_losses[reg]
    if config.init == "ridge-features" and config.coupling_layers > 0:
        _init_couplings(model, X_train, Y_train, config, progress)
        init_loss = evaluate()
    result = train_epochs(
        model,
        optimizer,
        lambda rows: batch_loss(X_train[rows], Y_train[rows]),
        evaluate,
        n_train=X_train.shape[0],
        init_loss=init_loss,
        batch_size=config.batch_size,
        max_epochs=config.max_epochs,
        patience=config.patience,
        seed=config.seed,
        lr=config.lr,
        device=device,
        progress=progress,
    )
    model.to("cpu")
    model.info.fit = {
        "inverse_weight": config.inverse_weight,
        "covariance_reg": reg,
        "epochs": result.epochs,
        "best_epoch": result.best_epoch,
        "init_holdout_loss": init_loss,
        "best_holdout_loss": result.best_loss,
        "holdout_fraction": config.holdout_fraction,
    }
    return model.requires_grad_(False).eval()
