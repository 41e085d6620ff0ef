"""wattcast: forecast deep-learning step time, power, energy, cost and CO2e on hardware you do not have."""

from __future__ import annotations

import os

# Never phone home from library code paths (MLflow, Hugging Face).
# OMP_WAIT_POLICY=PASSIVE: LightGBM's and torch's OpenMP runtimes (and other processes) otherwise spin
# against each other on a 2-core machine; measured here as a >20x slowdown of training.
for _k, _v in (
    ("MLFLOW_DISABLE_TELEMETRY", "true"),
    ("DO_NOT_TRACK", "true"),
    ("HF_HUB_OFFLINE", "1"),
    ("OMP_WAIT_POLICY", "PASSIVE"),
):
    os.environ.setdefault(_k, _v)

__version__ = "0.1.0"


def predict_kernels(frame, device):
    """Predict per-kernel latency for every row of ``frame`` on ``device`` (see wattcast.models.kernel_predictor)."""
    from wattcast.models.kernel_predictor import predict_kernels as _pk

    return _pk(frame, device)


__all__ = ["predict_kernels", "__version__"]
