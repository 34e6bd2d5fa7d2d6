"""A parameter vector's metrics on held-out data (`evaluate`): accuracy, mean cross-entropy and
the largest share of predictions one class gets, computed without gradients in chunks of
EVALUATION_CHUNK inputs, with one device-to-host read per call. The simulation evaluates the
global model on the validation and test parts with it (`robusttune.engine.simulation`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from robusttune.problem.models import param_layout

__all__ = ["EVALUATION_CHUNK", "Evaluation", "evaluate"]


@dataclass(frozen=True)
class Evaluation:
    """Test-set metrics of one parameter vector: accuracy in [0, 1], mean cross-entropy, and the
    largest share of test samples predicted as one class (1.0 = the model predicts one class)."""

    accuracy: float
    loss: float
    max_class_share: float


# inputs a forward pass of evaluation takes at once (robusttune.problem.footprint counts it)
EVALUATION_CHUNK = 4096


def evaluate(
    model: nn.Module, params: Tensor, x: Tensor, y: Tensor, *, chunk_size: int = EVALUATION_CHUNK
) -> Evaluation:
    """accuracy = (1/n) sum_j [argmax f(x_j) = y_j];  loss = (1/n) sum_j CE(f(x_j), y_j);
    max_class_share = max_c (1/n) #{j : argmax f(x_j) = c}.

    Inference runs under ``torch.no_grad`` in chunks of ``chunk_size`` samples (bounding
    activation memory, e.g. resnet18 on 10,000 CIFAR images). A non-finite ``params`` does not
    raise: its logits are NaN, the accuracy is that of whatever argmax returns, and loss is NaN
    (the simulation reads non-finite parameters as collapse)."""
    n = len(y)
    if n == 0:
        return Evaluation(math.nan, math.nan, math.nan)
    views = param_layout(model).views(params.detach())
    correct = torch.zeros((), dtype=torch.int64, device=params.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=params.device)
    counts: Tensor | None = None
    with torch.no_grad():
        for xc, yc in zip(x.split(chunk_size), y.split(chunk_size)):
            logits = functional_call(model, views, (xc.to(params.device),))
            yc = yc.to(params.device)
            pred = logits.argmax(dim=1)
            correct += (pred == yc).sum()
            loss_sum += F.cross_entropy(logits, yc, reduction="sum").double()
            c = torch.bincount(pred, minlength=logits.shape[1])
            counts = c if counts is None else counts + c
        assert counts is not None
        # one device-to-host read for the four figures (each .item() is a stream sync)
        read = torch.stack(
            [
                correct.double(),
                loss_sum,
                counts.max().double(),
                torch.isfinite(params).all().double(),
            ]
        ).tolist()
    n_correct, total_loss, top_count, finite = read
    loss = total_loss / n if finite else math.nan
    return Evaluation(accuracy=n_correct / n, loss=loss, max_class_share=top_count / n)
