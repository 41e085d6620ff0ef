"""Bad input to the simulators, the power model, the lifecycle calculator and `train power`: a clear
ValueError (or the module's own error class) naming the parameter and the value, never an unrelated
exception or a silent NaN / wrong number."""

from __future__ import annotations

import dataclasses
import math
from importlib.resources import files

import numpy as np
import pytest

import wattcast
from wattcast.data.catalog import load_catalog, load_spec_file, resolve_device
from wattcast.models import power as pw
from wattcast.models.power import MIN_CLOCK_RATIO, apply_power_limit, load_power_model
from wattcast.simulate.parallel import ParallelConfig, ParallelConfigError, resolve_parallel

H100 = "H100-SXM5-80GB"
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def h100():
    return resolve_device(H100)


# ------------------------------------------------------------------------------------ 1. clock caps
@pytest.mark.parametrize("cap", [NAN, INF, 0.0, -5.0, 0, True, "fast"])
def test_clock_cap_must_be_finite_and_positive(h100, cap):
    with pytest.raises(ValueError, match="clock_cap_mhz"):
        pw.check_power_settings(None, cap, h100)
    with pytest.raises(ValueError, match="clock_cap_mhz"):
        apply_power_limit(np.array([1.0]), np.array([500.0]), None, h100, 0.5, clock_cap_mhz=cap)


def test_predict_refuses_nan_clock_cap():
    with pytest.raises(ValueError, match=r"clock_cap_mhz \(--clock-cap-mhz\).*nan"):
        wattcast.predict("gpt2", H100, clock_cap_mhz=NAN)
    with pytest.raises(ValueError, match="clock_cap_mhz"):
        wattcast.predict("gpt2", H100, clock_cap_mhz=0)


def test_clock_cap_below_the_lowest_modelled_clock_is_refused_not_clamped(h100):
    low = MIN_CLOCK_RATIO * h100.boost_clock_mhz  # 594 MHz
    with pytest.raises(ValueError, match=r"500 MHz is below the lowest clock .* 594 MHz"):
        pw.check_power_settings(None, 500, h100)
    with pytest.raises(ValueError, match="lowest clock"):
        wattcast.predict("gpt2", H100, clock_cap_mhz=1)
    assert pw.check_power_settings(None, low, h100) == (None, low)  # the lowest clock itself is fine
    r = wattcast.predict("gpt2", H100, clock_cap_mhz=600)
    assert math.isfinite(r.step_time_ms) and math.isfinite(r.energy_j) and r.avg_power_w > 0
    # a cap at or above boost does not bind
    free = wattcast.predict("gpt2", H100)
    above = wattcast.predict("gpt2", H100, clock_cap_mhz=5000)
    assert above.step_time_ms == pytest.approx(free.step_time_ms)


# ---------------------------------------------------------------------------------- 2. power limits
@pytest.mark.parametrize("limit", [NAN, INF, -INF, 0.0, -100.0, True])
def test_power_limit_must_be_finite_and_positive(h100, limit):
    with pytest.raises(ValueError, match="power_limit_w"):
        pw.check_power_settings(limit, None, h100)
    with pytest.raises(ValueError, match="power_limit_w"):
        apply_power_limit(np.array([1.0]), np.array([500.0]), limit, h100, 0.5)


@pytest.mark.parametrize("limit", [NAN, INF])
def test_predict_refuses_nan_and_inf_power_limits(limit):
    with pytest.raises(ValueError, match=r"power_limit_w \(--power-limit-w\)"):
        wattcast.predict("gpt2", H100, power_limit_w=limit)


def test_unattainable_power_limit_is_refused_single_device():
    with pytest.raises(ValueError, match=r"power limit|power_limit_w") as e:
        wattcast.predict("gpt2", H100, power_limit_w=10)
    msg = str(e.value)
    assert "10 W is below the" in msg and f"the {H100} draws running this step at its lowest clock" in msg
    floor = float(msg.split("is below the ")[1].split(" W")[0])
    assert 105 < floor < 700  # above idle, below TDP
    # at the floor the step runs, and its average power is not above the limit it is reported with
    lim = math.ceil(floor)
    r = wattcast.predict("gpt2", H100, power_limit_w=lim)
    assert r.power_limit_w == lim and r.avg_power_w <= lim + 1e-6


def test_power_limit_below_idle_is_refused(h100):
    import pandas as pd

    from wattcast.simulate.energy import kernel_power

    costed = pd.DataFrame({"gpu_ms": [1.0], "flops": [0.0], "bytes": [0.0], "dtype": ["bf16"], "op_class": ["matmul"]})
    with pytest.raises(ValueError, match="idle alone is 105 W"):
        kernel_power(costed, h100, power_limit_w=50)


def test_unattainable_power_limit_is_refused_distributed():
    with pytest.raises(ValueError, match=r"power_limit_w \(--power-limit-w\) 10 W is below the"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=2, batch=8, seq=256, power_limit_w=10)
    with pytest.raises(ValueError, match="power_limit_w"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=2, batch=8, seq=256, power_limit_w=NAN)
    with pytest.raises(ValueError, match="clock_cap_mhz"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=2, batch=8, seq=256, clock_cap_mhz=-5)


def test_settings_that_do_not_bind_say_so():
    """A clock cap at or above the boost clock and a power limit above the TDP are accepted (they change nothing:
    the same step as without them) with a warning naming each; one that binds gets none."""
    base = wattcast.predict("gpt2", H100)
    loose = wattcast.predict("gpt2", H100, clock_cap_mhz=2500, power_limit_w=900)
    assert loose.step_time_ms == pytest.approx(base.step_time_ms) and loose.energy_j == pytest.approx(base.energy_j)
    w = loose.meta["warnings"]
    assert any("2500 MHz is at or above the H100-SXM5-80GB's 1980 MHz boost clock: it does not bind" in x for x in w)
    assert any("900 W is above the H100-SXM5-80GB's 700 W TDP: it does not bind" in x for x in w)
    assert not base.meta.get("warnings")
    assert not wattcast.predict("gpt2", H100, clock_cap_mhz=1500, power_limit_w=500).meta.get("warnings")
    d = wattcast.predict_cluster("gpt2", "DGX-H100", gpus=2, batch=8, seq=256, clock_cap_mhz=1980).to_dict()
    assert len(d["warnings"]) == 1 and "1980 MHz is at or above" in d["warnings"][0]
    assert wattcast.predict_cluster("gpt2", "DGX-H100", gpus=2, batch=8, seq=256).to_dict()["warnings"] == []


def test_replayed_measured_limits_still_work(h100):
    """apply_power_limit itself (used to replay measured power-limit runs) keeps its contract."""
    t, p = apply_power_limit(np.array([1.0]), np.array([600.0]), 300.0, h100, np.array([0.8]), model=load_power_model())
    assert p[0] <= 300 + 1e-6 and t[0] > 1.0


# ------------------------------------------------------------------------------- 3. parallel rules
def _resolve(**kw):
    fw = kw.pop("framework", None)
    uneven = kw.pop("uneven_stages", False)
    return resolve_parallel(ParallelConfig(**kw), batch=16, n_layers=12, n_heads=12, ffn=3072, framework=fw,
                            uneven_stages=uneven)


@pytest.mark.parametrize("kw,msg", [
    (dict(gpus=0), "--gpus must be a positive integer, got 0"),
    (dict(gpus=-8), "--gpus must be a positive integer, got -8"),
    # the CLI computes gpus = tp x pp x (dp or 1) when --gpus is absent: name the degree the user gave
    (dict(gpus=0, tp=0), "--tp must be a positive integer, got 0"),
    (dict(gpus=1, dp=0), "--dp must be a positive integer, got 0"),
    (dict(gpus=8, micro_batch=0), "--micro-batch must be a positive integer, got 0"),
    (dict(gpus=8, pp=2, interleave=2, schedule="gpipe"), "--interleave 2 .* cannot run with --schedule gpipe"),
    (dict(gpus=8, pp=2, zero=2, framework="megatron"), "pipeline parallelism \\(pp 2\\) with ZeRO stage 2: megatron"),
    (dict(gpus=8, pp=2, zero=3, framework="megatron-deepspeed"), "ZeRO stage 3: megatron-deepspeed"),
    # DeepSpeed's pipeline engine (uneven stages) without the framework named
    (dict(gpus=8, pp=2, zero=2, uneven_stages=True), "ZeRO stage 2: megatron-deepspeed"),
    (dict(gpus=8, zero=True), "--zero must be 0, 1, 2 or 3"),
])
def test_parallel_rules_reject(kw, msg):
    with pytest.raises(ParallelConfigError, match=msg):
        _resolve(**kw)


@pytest.mark.parametrize("kw", [
    dict(gpus=8, pp=2, zero=1, framework="megatron"),
    dict(gpus=8, pp=2, zero=1, framework="megatron-deepspeed"),
    dict(gpus=8, pp=2, zero=3, framework="hf"),  # FSDP + pipeline: no rule here
    dict(gpus=8, pp=1, zero=3, framework="megatron-deepspeed"),  # ZeRO-3 without a pipeline is fine
    dict(gpus=8, pp=2, interleave=2, schedule="1f1b"),
    dict(gpus=8, pp=2, schedule="gpipe"),
    dict(gpus=np.int64(8), dp=np.int64(8)),
])
def test_parallel_rules_accept(kw):
    _resolve(**kw)


def test_predict_cluster_rejects_zero_gpus_and_deepspeed_pipeline_zero2():
    with pytest.raises(ParallelConfigError, match="--gpus must be a positive integer, got 0"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=0, batch=8, seq=256)
    with pytest.raises(ParallelConfigError, match="ZeRO stage 2"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=4, pp=2, zero=2, batch=8, seq=256, framework="megatron-deepspeed")
    with pytest.raises(ParallelConfigError, match="gpipe"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=4, pp=2, interleave=2, schedule="gpipe", batch=8, seq=256)


# ------------------------------------------------------------------------- 4. utilisation and tokens
@pytest.mark.parametrize("u", [5, -1, NAN, INF, 1.0001])
def test_footprint_utilisation_must_be_a_fraction(u):
    with pytest.raises(ValueError, match="utilisation"):
        wattcast.footprint(H100, gpus=8, hours=10, utilisation=u)


@pytest.mark.parametrize("u", [5, -1, NAN])
def test_gpu_power_at_utilisation_must_be_a_fraction(h100, u):
    from wattcast.simulate.energy import gpu_power_at_w

    with pytest.raises(ValueError, match="utilisation"):
        gpu_power_at_w(h100, u)


def test_footprint_utilisation_edges_are_meaningful(h100):
    from wattcast.models.power import idle_power_w

    idle = wattcast.footprint(H100, gpus=8, hours=10, utilisation=0)
    assert idle.avg_power_w == pytest.approx(idle_power_w(h100))  # 0: GPUs held idle
    full = wattcast.footprint(H100, gpus=8, hours=10, utilisation=1)
    assert idle.avg_power_w < full.avg_power_w <= h100.tdp_w


@pytest.mark.parametrize("bad", [dict(tokens=INF), dict(tokens=NAN), dict(tokens=0), dict(tokens=-1e9),
                                 dict(tokens_per_step=NAN), dict(step_time_ms=NAN), dict(gpu_power_w=NAN)])
def test_footprint_from_step_validates_its_numbers(bad):
    from wattcast.lifecycle import footprint_from_step

    kw = dict(step_time_ms=100.0, gpu_power_w=300.0, tokens=1e9, tokens_per_step=8192.0)
    kw.update(bad)
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        footprint_from_step(H100, 1, **kw)


# ------------------------------------------------------------------ 5. device-name collisions in prices
def test_cloud_price_only_for_the_catalog_spec_of_that_name(h100, tmp_path):
    cat = wattcast.footprint(H100, gpus=8, hours=10)
    assert cat.cloud_usd_per_gpu_hour == pytest.approx(6.88)  # AWS p5 list after the June 2025 cut (was 12.29)
    # an RTX 4090-like spec that reuses the H100's name
    impostor = dataclasses.replace(load_catalog()["L40S"], name=H100, aliases=())
    from wattcast.lifecycle import catalog_spec_matches, footprint

    assert not catalog_spec_matches(impostor) and catalog_spec_matches(h100)
    fp = footprint(impostor, 8, 10.0, avg_power_w=400.0, apply_goodput=False)
    assert fp.cloud_usd is None and fp.cloud_usd_per_gpu_hour is None
    assert any("not the catalog's" in f and "cloud price" in f for f in fp.flags)
    assert "cloud_usd_per_gpu_hour" not in fp.sources
    # a copy of the catalog file (same hardware figures) is the same device: priced as before
    copy = tmp_path / "h100.yaml"
    copy.write_text((files("wattcast.data") / "devices" / f"{H100}.yaml").read_text(encoding="utf-8"))
    same = footprint(load_spec_file(copy), 8, 10.0, avg_power_w=400.0, apply_goodput=False)
    assert same.cloud_usd_per_gpu_hour == pytest.approx(6.88)  # AWS p5 list after the June 2025 cut (was 12.29)
    # the CLI path: a spec file through wattcast.footprint
    fake = tmp_path / "rtx4090.yaml"
    fake.write_text(f"name: {H100}\npeak_fp32_tflops: 82.6\nmemory_gb: 24\nmemory_bandwidth_gbps: 1008\nnum_sms: 128\n"
                    "boost_clock_mhz: 2520\nl2_cache_mb: 72\ntdp_w: 450\nsource: RTX 4090 datasheet\n")
    fp2 = wattcast.footprint(str(fake), gpus=8, hours=10)
    assert fp2.cloud_usd is None


def test_sibling_price_and_die_area_tables_only_for_catalog_specs():
    from wattcast.lifecycle import footprint

    cat = load_catalog()
    own = footprint(cat["H100-PCIe-80GB"], 1, 10.0, avg_power_w=300.0, apply_goodput=False)
    assert own.sources["accelerator_price_usd"].startswith("assumption: price of H100-SXM5-80GB")
    other = dataclasses.replace(cat["L4"], name="H100-PCIe-80GB", launch_price_usd=None)
    fp = footprint(other, 1, 10.0, avg_power_w=300.0, apply_goodput=False)
    assert "USD/W x TDP" in fp.sources["accelerator_price_usd"]
    assert any("fallback purchase price" in f for f in fp.flags)
    b200_like = dataclasses.replace(cat["L4"], name="B200", die_area_mm2=None)
    fp = footprint(b200_like, 1, 10.0, avg_power_w=300.0, apply_goodput=False)
    assert fp.embodied_breakdown_kgco2e_per_gpu["die_area_mm2"] == 800  # the stated default, not B200's 1600
    assert any("die-area fallback" in f for f in fp.flags)


# ------------------------------------------------------------------------ 6. train power, bad CSVs
def _zeus_dir(tmp_path, text: str):
    d = tmp_path / "data" / "power" / "zeus"
    d.mkdir(parents=True)
    (d / "summary_power_v100.csv").write_text(text)
    return tmp_path / "data"


def test_train_power_names_file_and_missing_column(tmp_path):
    from wattcast.training.power import PowerDataError, run_train_power

    root = _zeus_dir(tmp_path, "dataset,network,batch_size,optimizer,power_limit,time_per_epoch\n"
                               "imagenet,resnet50,64,adam,250,100.0\n")
    with pytest.raises(PowerDataError, match=r"summary_power_v100\.csv: missing column\(s\) 'average_power'") as e:
        run_train_power(data=root, out_dir=tmp_path / "out", use_mlflow=False, log=lambda *_: None)
    assert isinstance(e.value, ValueError)


def test_train_power_garbage_csv(tmp_path):
    from wattcast.training.power import PowerDataError, load_zeus

    root = _zeus_dir(tmp_path, "foo,bar\n1,2\nx,y\n")
    with pytest.raises(PowerDataError, match=r"summary_power_v100\.csv: missing column\(s\) 'dataset'"):
        load_zeus(root / "power")
    (root / "power" / "zeus" / "summary_power_v100.csv").write_text(
        "dataset,network,batch_size,power_limit,time_per_epoch,average_power\nimagenet,resnet50,64,250,100.0,lots\n")
    with pytest.raises(PowerDataError, match="'average_power' must hold numbers; data row 1 has 'lots'"):
        load_zeus(root / "power")
    (root / "power" / "zeus" / "summary_power_v100.csv").write_text("")
    with pytest.raises(PowerDataError, match="cannot read as CSV"):
        load_zeus(root / "power")


def test_megatron_pipeline_refuses_zero2_through_predict_cluster():
    """The framework reaches the rules: Megatron-LM's distributed optimizer is ZeRO-1, so pp > 1 with ZeRO-2 is refused."""
    with pytest.raises(ParallelConfigError, match="ZeRO"):
        wattcast.predict_cluster("gpt2", "DGX-H100", gpus=8, batch=16, seq=1024, pp=2, zero=2, framework="megatron")


def test_waiting_power_respects_the_power_limit(h100):
    full = pw.comm_power_w(h100)
    assert pw.comm_power_w(h100, full - 20) == pytest.approx(full - 20)
    assert pw.comm_power_w(h100, 10.0) == pytest.approx(pw.idle_power_w(h100))  # never below idle
    assert pw.comm_power_w(h100, 10 * full) == pytest.approx(full)


def test_search_names_a_bad_count():
    with pytest.raises(ValueError, match="gpus must be at least 1"):
        wattcast.search("gpt2", "DGX-H100", 0, 8, 1024)
