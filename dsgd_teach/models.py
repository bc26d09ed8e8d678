"""Small torch models (logistic regression, MLP, CNN) driven through flat parameter vectors.

Distributed algorithms move parameters and gradients as one flat float32 vector; these helpers convert between
that vector and a torch module, on CUDA when the process has a GPU and on the CPU otherwise, with the same code.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from .config import check_choice, check_int

MODELS = ("logreg", "mlp", "cnn")


def default_device() -> torch.device:
    """cuda when this process sees a GPU, else cpu."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _Reshape(nn.Module):
    """Turn flat 64-pixel rows into 1x8x8 images for the CNN."""

    def __init__(self, side: int) -> None:
        super().__init__()
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(-1, 1, self.side, self.side)


def build_model(name: str, n_features: int, n_classes: int, seed: int = 0, hidden: int = 32) -> nn.Module:
    """A freshly initialised model; the seed drives a private RNG, torch's global RNG is left as it was."""
    check_choice("model", name, MODELS)
    check_int("n_features", n_features, 1)
    check_int("n_classes", n_classes, 2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "logreg":
            model: nn.Module = nn.Linear(n_features, n_classes)
        elif name == "mlp":
            model = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
        else:
            side = int(round(n_features**0.5))
            if side * side != n_features:
                raise ValueError(f"model 'cnn' needs square images; n_features={n_features} is not a square")
            model = nn.Sequential(
                _Reshape(side),
                nn.Conv2d(1, 8, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(8 * (side // 2) ** 2, n_classes),
            )
    return model


def n_params(model: nn.Module) -> int:
    """Number of scalar parameters (the length of the flat vector)."""
    return sum(p.numel() for p in model.parameters())


def get_flat(model: nn.Module) -> np.ndarray:
    """The model's parameters as one flat float32 numpy vector (a copy)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().numpy().astype(np.float32)


def set_flat(model: nn.Module, flat: np.ndarray) -> None:
    """Load a flat vector into the model's parameters."""
    first = next(model.parameters())
    vec = torch.as_tensor(np.asarray(flat, dtype=np.float32), device=first.device)
    torch.nn.utils.vector_to_parameters(vec, model.parameters())


#: Rows of a sparse matrix densified at once when evaluating (20000 features: about 40 MB a block).
EVAL_ROWS = 512


def as_tensors(X: np.ndarray | sp.spmatrix, y: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels as torch tensors on device (sparse rows are densified per batch)."""
    if sp.issparse(X):
        X = X.toarray()
    return (
        torch.as_tensor(np.asarray(X, dtype=np.float32), device=device),
        torch.as_tensor(np.asarray(y, dtype=np.int64), device=device),
    )


def loss_and_grad(model: nn.Module, flat: np.ndarray, X: np.ndarray | sp.spmatrix, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy on (X, y) at parameters `flat`, and its gradient as a flat float32 vector."""
    set_flat(model, flat)
    device = next(model.parameters()).device
    xt, yt = as_tensors(X, y, device)
    model.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(xt), yt)
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return float(loss.item()), grad.detach().cpu().numpy().astype(np.float32)


@torch.no_grad()
def evaluate(model: nn.Module, flat: np.ndarray, X: np.ndarray | sp.spmatrix, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of parameters `flat` on (X, y)."""
    set_flat(model, flat)
    device = next(model.parameters()).device
    if sp.issparse(X) and X.shape[0] > EVAL_ROWS:  # densify a block of rows at a time, not the whole matrix
        loss_sum, correct = 0.0, 0.0
        for start in range(0, X.shape[0], EVAL_ROWS):
            xt, yt = as_tensors(X[start:start + EVAL_ROWS], y[start:start + EVAL_ROWS], device)
            logits = model(xt)
            loss_sum += float(nn.functional.cross_entropy(logits, yt, reduction="sum").item())
            correct += float((logits.argmax(dim=1) == yt).sum().item())
        return loss_sum / X.shape[0], correct / X.shape[0]
    xt, yt = as_tensors(X, y, device)
    logits = model(xt)
    loss = nn.functional.cross_entropy(logits, yt)
    acc = (logits.argmax(dim=1) == yt).float().mean()
    return float(loss.item()), float(acc.item())
