"""Train an :class:`~lead.stitches.MLPStitch` by gradient descent, starting from the ridge fit.

One function, read top to bottom: split, initialise from ridge, then epochs of shuffled
mini-batches with AdamW, an evaluation on held-out pairs after every epoch, and early
stopping that keeps the best epoch (the ridge initialisation counts as epoch 0, so training
never returns something worse on held-out pairs than the ridge fit it started from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lead._epochs import train_epochs
from lead._validation import (
    check_callable,
    check_config,
    check_config_fields,
    check_device,
    check_pairs,
)
from lead.closed_form import ProgressCallback, fit_ridge
from lead.errors import InvalidInputError
from lead.splits import early_stopping_split
from lead.stitches import MLPStitch

__all__ = ["INITS", "LOSSES", "MLPConfig", "train_mlp"]

LOSSES = ("mse", "cosine", "infonce")
#: Largest accepted values: a request can not make training exhaust memory or run forever.
#: (``lr`` and ``weight_decay`` as for :class:`lead.invertible.InvertibleConfig`: far above
#: any that trains; 1e30 was accepted and failed in the second epoch)
_MOST = {
    "hidden_dim": 16384,
    "depth": 16,
    "max_epochs": 100_000,
    "lr": 10.0,
    "weight_decay": 1e3,
    "init_scale": 1000.0,
    "init_offset": 1000.0,
}
INITS = ("ridge-features", "ridge")
#: The affine weight starts at the ridge optimum: it is fine-tuned at a tenth of the lr.
_AFFINE_LR_SCALE = 0.1


@dataclass(frozen=True)
class MLPConfig:
    """Settings of :func:`train_mlp` (all have fast defaults).

    Attributes
    ----------
    hidden_dim, depth : int
        Width (at most 16,384) and number of hidden layers (at most 16) of the residual MLP.
    loss : {"mse", "cosine", "infonce"}
        Mean squared error, 1 − mean cosine similarity, or in-batch contrastive (InfoNCE)
        loss of predicted against true target vectors.
    lr, weight_decay : float
        AdamW learning rate of the MLP layers (the affine ``weight``, already at the ridge
        optimum, moves at a tenth of it), at most 10, and their decoupled weight decay (the
        affine ``weight`` is not decayed), at most 1,000.
    batch_size, max_epochs, patience : int
        Mini-batch size; most epochs (at most 100,000); epochs without held-out improvement
        before stopping.
    holdout_fraction : float
        Share of the pairs held out for early stopping.
    temperature : float
        Softmax temperature of the ``infonce`` loss.
    init : {"ridge-features", "ridge"}
        How training starts. ``"ridge"``: the affine part at the ridge fit and the MLP's
        last layer at zero, so epoch 0 is the ridge map. ``"ridge-features"`` (default):
        the first layer's units are centred on ``hidden_dim`` training vectors
        (weight ``init_scale * x_i / ||x_i||``, bias ``-init_scale * init_offset``), and the
        affine weight and the last layer are solved jointly by ridge on ``[x, h(x)]``, a
        closed-form random-feature fit that gradient training then refines.
    init_scale, init_offset : float
        Sharpness and threshold of the ``ridge-features`` units (on cosine similarity),
        each at most 1,000.
    seed : int
        Seeds the MLP initialisation, the held-out split and the shuffling.
    device : str
        Torch device to train on (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
    """

    hidden_dim: int = 512
    depth: int = 1
    loss: str = "mse"
    lr: float = 3e-4
    weight_decay: float = 1e-2
    batch_size: int = 256
    max_epochs: int = 20
    patience: int = 4
    holdout_fraction: float = 0.1
    temperature: float = 0.05
    init: str = "ridge-features"
    init_scale: float = 2.0
    init_offset: float = 0.3
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_config_fields(self, zero_ok=frozenset({"weight_decay", "init_offset"}), most=_MOST)
        if self.init not in INITS:
            raise InvalidInputError(
                f"init must be one of {', '.join(INITS)}, got {self.init!r}", param="init"
            )
        if self.loss not in LOSSES:
            raise InvalidInputError(
                f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}", param="loss"
            )
        if self.holdout_fraction >= 1:
            raise InvalidInputError("holdout_fraction must be below 1", param="holdout_fraction")
        check_device(self.device)


def _loss(pred: Tensor, target: Tensor, config: MLPConfig) -> Tensor:
    if config.loss == "mse":
        return nn.functional.mse_loss(pred, target)
    if config.loss == "cosine":
        return 1.0 - nn.functional.cosine_similarity(pred, target, dim=1).mean()
    logits = nn.functional.normalize(pred, dim=1) @ nn.functional.normalize(target, dim=1).T
    labels = torch.arange(pred.shape[0], device=pred.device)
    return nn.functional.cross_entropy(logits / config.temperature, labels)


@torch.no_grad()
def _init_first_layer(model: MLPStitch, X: Tensor, config: MLPConfig) -> None:
    """Centre the first layer's units on training vectors (``ridge-features`` init)."""
    first = model.mlp[0]
    assert isinstance(first, nn.Linear)
    n = X.shape[0]
    generator = torch.Generator().manual_seed(config.seed)
    if n >= config.hidden_dim:
        rows = torch.randperm(n, generator=generator)[: config.hidden_dim]
    else:
        rows = torch.randint(n, (config.hidden_dim,), generator=generator)
    centres = nn.functional.normalize(X[rows].float(), dim=1)
    # the MLP sees x - mean: h_j = GELU(s (x·c_j - o)) = GELU(s c_j·(x - mean) + s (c_j·mean - o))
    mean = X.float().mean(dim=0)
    first.weight.copy_(config.init_scale * centres)
    first.bias.copy_(config.init_scale * (centres @ mean - config.init_offset))


@torch.no_grad()
def _solve_closed_form(model: MLPStitch, X: Tensor, Y: Tensor, config: MLPConfig) -> float:
    """Set the affine weight, means and (with features) the last layer by ridge.

    Returns the ridge strength chosen on held-out pairs.
    """
    last = model.mlp[-1]
    assert isinstance(last, nn.Linear)
    if config.init == "ridge":
        ridge = fit_ridge(X, Y, seed=config.seed)
        model.weight.copy_(ridge.weight)
        last.weight.zero_()
        last.bias.zero_()
    else:
        hidden = model.mlp[:-1]((X - X.mean(dim=0)).float()).double()
        ridge = fit_ridge(torch.cat([X, hidden], dim=1), Y, seed=config.seed)
        d_src = X.shape[1]
        model.weight.copy_(ridge.weight[:, :d_src])
        last.weight.copy_(ridge.weight[:, d_src:])
        last.bias.copy_(-(ridge.weight[:, d_src:] @ ridge.source_mean[d_src:]))
    model.source_mean.copy_(ridge.source_mean[: X.shape[1]])
    model.target_mean.copy_(ridge.target_mean)
    return float(ridge.info.fit["alpha"])


def train_mlp(
    X: Any,
    Y: Any,
    config: MLPConfig | None = None,
    progress: ProgressCallback | None = None,
    *,
    normalize_output: bool = False,
) -> MLPStitch:
    r"""Train a residual MLP stitch, initialised from ridge, with early stopping.

    Parameters
    ----------
    X : array_like or Tensor of shape (n, d_src)
        Source-model vectors.
    Y : array_like or Tensor of shape (n, d_tgt)
        Target-model vectors of the same items.
    config : MLPConfig, optional
        Training settings; defaults to ``MLPConfig()``.
    progress : callable, optional
        Called as ``progress("train", epoch, config.max_epochs)`` after every epoch; when
        early stopping ends training, the last call is ``progress("train", epochs,
        epochs)`` (the stage ends complete, its total lowered to the epochs run). An
        exception it raises (e.g. :class:`~lead.errors.JobCancelledError`) stops training
        and propagates.
    normalize_output : bool, default False
        L2-normalise the stitch's outputs (also while training: the loss sees them).

    Returns
    -------
    MLPStitch
        The best epoch's parameters (float32, CPU, eval mode, gradients off); when no
        epoch beats the ridge start (epoch 0), the ridge map refitted on all pairs, with a
        zero MLP branch. ``info.fit`` holds ``ridge_alpha``, ``refitted_ridge``,
        ``epochs``, ``best_epoch``, ``init_holdout_loss`` and ``best_holdout_loss``. For a
        fixed seed, device and thread count the result is deterministic.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        For bad inputs, or too few pairs to hold out 4 of them.
    FitError
        If the training loss becomes NaN or infinite (lower ``lr``).
    InvalidInputError
        If ``config`` is not a :class:`MLPConfig` or ``progress`` is not callable.

    Notes
    -----
    The stitch computes :math:`y = W x_c + f(x_c) + \mu_y` with :math:`x_c = x - \mu_x`.
    With ``init="ridge"``, :math:`W, \mu_x, \mu_y`
    start at the ridge fit on the training part and :math:`f`'s last layer at zero, so
    epoch 0 is the ridge map. With ``init="ridge-features"`` the hidden units
    :math:`h_j(x) = \mathrm{GELU}(s(x^\top \hat c_j - o))` sit on training vectors
    :math:`c_j` (:math:`\hat c_j = c_j / \lVert c_j \rVert`; for unit-length inputs
    :math:`x^\top \hat c_j` is a cosine similarity) and :math:`[W, W_{last}]` is the ridge
    solution on :math:`[x, h(x)]` (random features, Rahimi & Recht 2007 [3]_), which is
    epoch 0. The InfoNCE loss of a batch of size
    :math:`B` with :math:`s_{ij} = \cos(\hat y_i, y_j) / \tau` is
    :math:`-\frac1B\sum_i \log\left(e^{s_{ii}} / \sum_j e^{s_{ij}}\right)`.

    References
    ----------
    .. [1] Loshchilov, I. and Hutter, F. (2019). Decoupled weight decay regularization. ICLR.
    .. [2] van den Oord, A., Li, Y. and Vinyals, O. (2018). Representation learning with
       contrastive predictive coding. arXiv:1807.03748
    .. [3] Rahimi, A. and Recht, B. (2007). Random features for large-scale kernel machines.
       NeurIPS.
    """
    config = config if config is not None else MLPConfig()
    check_config(config, MLPConfig)
    check_callable(progress, "progress")
    X, Y = check_pairs(X, Y, minimum=8)
    n, d_src = X.shape
    d_tgt = Y.shape[1]
    device = torch.device(config.device)

    # split: early stopping watches pairs that the gradient never sees
    train_idx, val_idx = early_stopping_split(n, config.holdout_fraction, config.seed, method="MLP")
    X_train, Y_train = X[train_idx], Y[train_idx]
    X_val, Y_val = X[val_idx], Y[val_idx]

    # model: closed-form start (ridge, or ridge on [x, hidden features]), see MLPConfig.init
    torch.manual_seed(config.seed)
    model = MLPStitch(
        d_src,
        d_tgt,
        hidden_dim=config.hidden_dim,
        depth=config.depth,
        normalize_output=normalize_output,
    )
    if config.init == "ridge-features":
        _init_first_layer(model, X_train, config)
    alpha = _solve_closed_form(model, X_train, Y_train, config)
    model.to(device)
    X_train, Y_train = X_train.float().to(device), Y_train.float().to(device)
    X_val, Y_val = X_val.float().to(device), Y_val.float().to(device)
    n_train = X_train.shape[0]

    optimizer = torch.optim.AdamW(
        [
            {"params": [model.weight], "weight_decay": 0.0, "lr": config.lr * _AFFINE_LR_SCALE},
            {"params": list(model.mlp.parameters()), "weight_decay": config.weight_decay},
        ],
        lr=config.lr,
    )

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        total = 0.0
        for start in range(0, X_val.shape[0], config.batch_size):
            stop = min(start + config.batch_size, X_val.shape[0])
            batch_loss = _loss(model(X_val[start:stop]), Y_val[start:stop], config)
            total += float(batch_loss) * (stop - start)
        return total / float(X_val.shape[0])

    def batch_loss(rows: Tensor) -> Tensor | None:
        if rows.numel() < 2 and config.loss == "infonce":
            return None  # a contrastive batch needs negatives
        return _loss(model(X_train[rows]), Y_train[rows], config)

    init_loss = evaluate()
    result = train_epochs(
        model,
        optimizer,
        batch_loss,
        evaluate,
        n_train=n_train,
        init_loss=init_loss,
        batch_size=config.batch_size,
        max_epochs=config.max_epochs,
        patience=config.patience,
        seed=config.seed,
        lr=config.lr,
        device=device,
        progress=progress,
    )
    best_epoch, best_loss, epoch = result.best_epoch, result.best_loss, result.epochs
    model.to("cpu")
    if best_epoch == 0:
        # no epoch beat the closed-form start: return that map, refitted on all the pairs
        alpha = _solve_closed_form(model, X, Y, config)
    model.info.fit = {
        "ridge_alpha": alpha,
        "init": config.init,
        "refitted_ridge": best_epoch == 0,
        "epochs": epoch,
        "best_epoch": best_epoch,
        "init_holdout_loss": init_loss,
        "best_holdout_loss": best_loss,
        "holdout_fraction": config.holdout_fraction,
        "loss": config.loss,
    }
    return model.requires_grad_(False).eval()
