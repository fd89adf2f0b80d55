"""Mini-batch training epochs with early stopping, shared by the trained stitches (private)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lead.errors import FitError

__all__ = ["EpochsResult", "train_epochs"]


@dataclass(frozen=True)
class EpochsResult:
    """How training went: epochs run, the best one (0 = the start) and its held-out loss."""

    epochs: int
    best_epoch: int
    best_loss: float


def train_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch_loss: Callable[[Tensor], Tensor | None],
    evaluate: Callable[[], float],
    *,
    n_train: int,
    init_loss: float,
    batch_size: int,
    max_epochs: int,
    patience: int,
    seed: int,
    lr: float,
    device: torch.device,
    progress: Callable[[str, int, int], None] | None,
) -> EpochsResult:
    """Run shuffled mini-batch epochs; keep and load the state of the best held-out epoch.

    ``batch_loss(rows)`` gives the loss of the training rows ``rows`` (or None to skip the
    batch); ``evaluate()`` the held-out loss. The start counts as epoch 0 with
    ``init_loss``, so training never returns something worse on held-out pairs. Training
    stops after ``patience`` epochs without improvement. ``progress("train", epoch,
    max_epochs)`` is called after every epoch, except that the epoch where early stopping
    ends training reports ``progress("train", epoch, epoch)``: the last call always has
    ``step == total``, so a progress bar ends full. What it raises propagates.

    Raises
    ------
    FitError
        If a training loss is NaN or infinite.
    """
    generator = torch.Generator().manual_seed(seed)
    best_loss, best_epoch, epoch, stale = init_loss, 0, 0, 0
    best_state = copy.deepcopy(model.state_dict())
    for epoch in range(1, max_epochs + 1):
        model.train()
        order = torch.randperm(n_train, generator=generator).to(device)
        for start in range(0, n_train, batch_size):
            loss = batch_loss(order[start : start + batch_size])
            if loss is None:
                continue
            if not torch.isfinite(loss):
                decay = max(group.get("weight_decay", 0.0) for group in optimizer.param_groups)
                also = f" or weight_decay (now {decay:g})" if decay else ""
                raise FitError(
                    f"training loss became non-finite in epoch {epoch}; try a lower lr "
                    f"(now {lr:g}){also}"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        val_loss = evaluate()
        if val_loss < best_loss:
            best_loss, best_epoch, stale = val_loss, epoch, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            stale += 1
        stop = stale >= patience
        if progress is not None:
            progress("train", epoch, epoch if stop else max_epochs)
        if stop:
            break
    model.load_state_dict(best_state)
    return EpochsResult(epochs=epoch, best_epoch=best_epoch, best_loss=best_loss)
