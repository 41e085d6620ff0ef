"""Train the NeuSight-style efficiency MLP with torch; the result runs in numpy (models.kernel_surrogates)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from wattcast.models.kernel_surrogates import EFF_MAX, MLPSurrogate


def fit_mlp(
    X: pd.DataFrame,
    y: np.ndarray,
    features: Sequence[str],
    hidden: int = 128,
    depth: int = 3,
    epochs: int = 30,
    batch_size: int = 512,
    lr: float = 2e-3,
    seed: int = 0,
    clip_inputs: bool = True,
) -> MLPSurrogate:
    """Fit on ``y = log(latency / roofline)``; returns a numpy :class:`MLPSurrogate`."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    feats = list(features)
    A = X[feats].to_numpy(dtype=np.float64)
    fill = np.nanmedian(A, axis=0)
    fill = np.where(np.isnan(fill), 0.0, fill)
    A = np.where(np.isnan(A), fill, A)
    mean = A.mean(axis=0)
    std = A.std(axis=0)
    std = np.where(std < 1e-9, 1.0, std)
    xs = torch.tensor((A - mean) / std, dtype=torch.float32)
    ys = torch.tensor(np.asarray(y, dtype=np.float64), dtype=torch.float32)

    layers: list[torch.nn.Module] = []
    width = len(feats)
    for _ in range(depth):
        layers += [torch.nn.Linear(width, hidden), torch.nn.SiLU()]
        width = hidden
    layers.append(torch.nn.Linear(width, 1))
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = max(1, int(np.ceil(len(xs) / batch_size)))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps_per_epoch)
    log_eff_max = float(np.log(EFF_MAX))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(xs), generator=gen)
        for i in range(steps_per_epoch):
            idx = perm[i * batch_size : (i + 1) * batch_size]
            z = net(xs[idx])[:, 0]
            pred = -(log_eff_max + torch.nn.functional.logsigmoid(z))
            # Huber in log space: robust to the few noisy timings
            loss = torch.nn.functional.huber_loss(pred, ys[idx], delta=0.3)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()

    weights: dict[str, np.ndarray] = {"mean": mean, "std": std, "fill": fill}
    if clip_inputs:
        weights["lo"], weights["hi"] = A.min(axis=0), A.max(axis=0)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    for i, lin in enumerate(linears):
        weights[f"w{i}"] = lin.weight.detach().numpy().astype(np.float32)
        weights[f"b{i}"] = lin.bias.detach().numpy().astype(np.float32)
    weights = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    return MLPSurrogate(feats, weights)

