"""`train kernels --csv` checks the user's rows against the GPU specs' physics before training (stop 50 audit):
a CSV in microseconds replaced a good bundle (bf16 8192^3 on H100 then predicted 1888 ms, 0.58 TFLOP/s, unflagged),
H100 timings labelled as a slower GPU (585 TFLOP/s on a 209.5 TFLOP/s part) were trained on silently, and an
--only-csv run with 19 held-out rows became current at an empty --out although the README said it is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattcast.data.catalog import resolve_device
from wattcast.data.kernel_datasets import load_user_kernels
from wattcast.featurize.kernel_features import featurize_kernels
from wattcast.models.kernel_bundle import KernelBundle
from wattcast.training.kernel_run import (
    MIN_GATE_ROWS,
    UNIT_MIN_ROWS,
    check_user_physics,
    gate_decision,
    run_train_kernels,
)

from conftest import flat

GPU = "H100-SXM5-80GB"


def _shapes(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` distinct bf16 linear shapes, half of them large (roofline >= 0.01 ms on an H100)."""
    rng = np.random.default_rng(seed)
    dims = np.array([256, 512, 1024, 2048, 4096, 8192])
    seen, rows = set(), []
    while len(rows) < n:
        m, nn, k = (int(x) for x in rng.choice(dims, 3))
        if (m, nn, k) not in seen:
            seen.add((m, nn, k))
            rows.append({"OPName": "linear", "dtype": "bf16", "B": 1, "M": m, "N": nn, "K": k, "Device": GPU})
    return pd.DataFrame(rows)


def _plausible_ms(d: pd.DataFrame, device: str = GPU) -> np.ndarray:
    """A measurement-like latency: 1.5x the roofline plus a 5 us launch (the shared datasets' medians: 1.4-3.8x)."""
    f = featurize_kernels(d.rename(columns={"OPName": "op"}).assign(device=device), {device: resolve_device(device)})
    return f["t_roof_ms"].to_numpy() * 1.5 + 0.005


def _csv(d: pd.DataFrame, path: Path) -> Path:
    d.to_csv(path, index=False)
    return path


def _check(path: Path, extra_specs=None) -> None:
    u = load_user_kernels(path)
    specs = {d: resolve_device(d) for d in set(u["device"])} | (extra_specs or {})
    check_user_physics(u, specs, origin=str(path), lines=u.attrs.get("lines"))


def test_rows_faster_than_the_physical_floor_are_refused_by_line(tmp_path):
    d = _shapes(30).assign(Latency=lambda x: _plausible_ms(x))
    _check(_csv(d, tmp_path / "ok.csv"))  # plausible rows pass
    big = int(np.argmax(d["M"] * d["N"] * d["K"]))
    d.loc[big, "Latency"] = d.loc[big, "Latency"] / 10  # ~6.6x the dense peak
    with pytest.raises(ValueError) as e:
        _check(_csv(d, tmp_path / "fast.csv"))
    why = flat(str(e.value))
    peak = resolve_device(GPU).peak_bf16_tflops
    assert f"1 of 30 row(s) are faster than the GPU's spec allows" in why
    r = d.loc[big]
    assert f"line {big + 2}: linear B=1 M={r['M']} N={r['N']} K={r['K']} bf16 on {GPU}" in why
    assert f"vs the spec's {peak:,.1f} bf16 dense peak" in why
    assert "wrong GPU" in why and "sparse" in why and "Nothing was trained" in why


def test_a_vector_op_beyond_the_bandwidth_and_latencies_in_seconds_are_named(tmp_path):
    """An add moving more bytes through DRAM than the datasheet bandwidth allows is named with the GB/s it implies;
    a CSV in seconds (every row far below its floor) is told so."""
    n = 2 ** 14 * 2 ** 16
    bw_gbps = resolve_device(GPU).memory_bandwidth_gbps
    # the floor of a vector op counts its output alone (its inputs may be broadcast views): n x 2 bytes of bf16,
    # written here at 1.5x the bandwidth (the cache can hold a few tens of MB of these 2 GB)
    fast_ms = n * 2 / (bw_gbps * 1e9 * 1.5) * 1e3
    d = _shapes(10).assign(Latency=lambda x: _plausible_ms(x))
    add = pd.DataFrame([{"OPName": "add", "dtype": "bf16", "B": 2 ** 14, "H": 2 ** 16, "Device": GPU,
                         "Latency": fast_ms}])
    with pytest.raises(ValueError) as e:
        _check(_csv(pd.concat([d, add], ignore_index=True), tmp_path / "add.csv"))
    why = flat(str(e.value))
    assert "line 12: add B=16384 H=65536 bf16" in why and f"GB/s through DRAM" in why
    assert f"vs the spec's {bw_gbps:,.0f} GB/s" in why and "seconds" not in why
    with pytest.raises(ValueError, match="latencies in seconds instead of milliseconds"):
        _check(_csv(d.assign(Latency=d["Latency"] / 1000), tmp_path / "s.csv"))


def test_timings_of_a_faster_gpu_labelled_as_a_slower_one_are_refused_before_training(tmp_path):
    """The audit's H100 timings labelled RTX 5090: here H100-like timings labelled L40S (a slower bf16 peak)."""
    slow = "L40S"
    assert resolve_device(slow).peak_bf16_tflops < resolve_device(GPU).peak_bf16_tflops / 2
    d = _shapes(40).assign(Latency=lambda x: _plausible_ms(x), Device=slow)
    out = tmp_path / "kb"
    with pytest.raises(ValueError, match="faster than the GPU's spec allows"):
        run_train_kernels(csv=_csv(d, tmp_path / "l40s.csv"), only_csv=True, quick=True, out_dir=out,
                          use_mlflow=False, log=lambda _: None)
    assert not out.exists()  # nothing trained, nothing written


def test_latencies_in_microseconds_are_refused_naming_the_unit(tmp_path):
    d = _shapes(30).assign(Latency=lambda x: _plausible_ms(x))
    _check(_csv(d, tmp_path / "ms.csv"))
    us = d.assign(Latency=d["Latency"] * 1000)
    with pytest.raises(ValueError) as e:
        _check(_csv(us, tmp_path / "us.csv"))
    why = flat(str(e.value))
    assert "look like microseconds" in why and "Latency is read in milliseconds" in why
    med = float(why.split("the median measured latency is ")[1].split("x")[0].replace(",", ""))
    assert 1000 < med < 3000
    # too few rows with a roofline >= 0.01 ms to judge a unit: not refused on one outlier
    f = featurize_kernels(us.rename(columns={"OPName": "op"}).assign(device=GPU), {GPU: resolve_device(GPU)})
    small = us[(f["t_roof_ms"] < 0.01).to_numpy()]
    few = pd.concat([small, us[(f["t_roof_ms"] >= 0.01).to_numpy()].head(UNIT_MIN_ROWS - 1)])
    _check(_csv(few.assign(Latency=few["Latency"] / 1000), tmp_path / "few_ok.csv"))


def test_a_microsecond_csv_does_not_replace_a_working_bundle(tmp_path):
    """The audit's repro (1): a good --only-csv bundle, then the same shapes in microseconds into the same --out."""
    d = _shapes(120, seed=1).assign(Latency=lambda x: _plausible_ms(x))
    out = tmp_path / "kb"
    first = run_train_kernels(csv=_csv(d, tmp_path / "ms.csv"), only_csv=True, quick=True, out_dir=out, force=True,
                              use_mlflow=False, log=lambda _: None)
    assert first.replaced
    live = (out / "CURRENT").read_text()
    with pytest.raises(ValueError, match="look like microseconds"):
        run_train_kernels(csv=_csv(d.assign(Latency=d["Latency"] * 1000), tmp_path / "us.csv"), only_csv=True,
                          quick=True, out_dir=out, use_mlflow=False, log=lambda _: None)
    assert (out / "CURRENT").read_text() == live
    assert not (out / "refused").exists()


def _user_rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"op": ["linear"] * n, "source": ["user"] * n})


def test_too_few_held_out_rows_are_not_made_current_without_a_working_bundle(tmp_path):
    empty = KernelBundle({}, {})
    out = tmp_path / "none"
    ok, why, m = gate_decision(empty, out, _user_rows(MIN_GATE_ROWS - 1), {}, user_only=True)
    why = flat(why)
    assert not ok and f"only {MIN_GATE_ROWS - 1} row(s) of your CSV" in why and "no working bundle" in why
    assert "--force" in why and m["gate_user_rows"] == MIN_GATE_ROWS - 1
    ok, why, _ = gate_decision(empty, out, _user_rows(MIN_GATE_ROWS - 1), {}, user_only=True, force=True)
    assert ok and "--force" in why
    assert gate_decision(empty, out, _user_rows(MIN_GATE_ROWS), {}, user_only=True)[0]
    assert gate_decision(empty, out, _user_rows(MIN_GATE_ROWS - 1), {})[0]  # with the shared data: judged on them
    # a run: kept apart (a --models path), CURRENT not written
    d = _shapes(60, seed=2).assign(Latency=lambda x: _plausible_ms(x))
    o = run_train_kernels(csv=_csv(d, tmp_path / "small.csv"), only_csv=True, quick=True, out_dir=tmp_path / "kb",
                          use_mlflow=False, log=lambda _: None)
    assert not o.replaced and not (tmp_path / "kb" / "CURRENT").exists()
    kept = list((tmp_path / "kb" / "refused").iterdir())
    assert len(kept) == 1 and f"--models {kept[0]}" in o.reason
