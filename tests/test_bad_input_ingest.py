"""Bad input to the importers and spec loaders (fuzzing findings): multi-run nccl-tests logs, impossible power
samples, duplicated Kineto events and unknown device indices, keys given twice in spec / cluster / HF config files,
and NeuSight device JSON keys."""

from __future__ import annotations

import json
import re

import pytest

from conftest import flat, run_cli
from wattcast.data.catalog import load_spec_file
from wattcast.data.cluster_spec import ClusterSpecError, load_cluster_file, list_clusters
from wattcast.data.device_spec import DeviceSpecError
from wattcast.data.neusight_device import from_neusight_json
from wattcast.data.profiles.kineto import import_kineto
from wattcast.data.profiles.nccl_tests import import_nccl_tests
from wattcast.data.profiles.power_logs import import_dcgm, import_nvidia_smi
from wattcast.data.profiles.tables import ProfileImportError
from wattcast.featurize.hf_config import builtin_models, load_hf_config
from wattcast.featurize.op_graph import GraphError


# ----------------------------------------------------------------------------- 1. nccl-tests: several runs in one log
def _run(test: str, ranks: list[tuple[int, str]], size: int, t_us: float) -> str:
    lines = [f"# Collective test starting: {test}",
             "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 validation: 1",
             "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid  {4000 + r} on {host:>12} device  {r % 2} [0x07] NVIDIA A100-SXM4-80GB"
              for r, host in ranks]
    lines += ["#",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
              f"{size:>12} {size // 4:>13}     float     sum      -1 {t_us:8.2f}    0.04    0.05      0 {t_us:8.2f}    0.04    0.06      0",
              "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 0.05", ""]
    return "\n".join(lines)


FOUR_ON_TWO = [(0, "node01"), (1, "node01"), (2, "node02"), (3, "node02")]


def test_nccl_tests_log_with_several_runs_reads_each_run(tmp_path):
    log = tmp_path / "sweep.log"  # `for t in all_reduce all_gather; do ${t}_perf ... >> sweep.log; done`
    log.write_text(_run("all_reduce_perf", FOUR_ON_TWO, 1024, 28.4)
                   + _run("all_gather_perf", [(0, "node01"), (1, "node01")], 2048, 20.5))
    c, notes = import_nccl_tests(log)
    assert c["op"].tolist() == ["all_reduce", "all_gather"]
    assert c["world_size"].tolist() == [4, 2]
    assert c["nodes"].tolist() == [2, 1] and c["gpus_per_node"].tolist() == [2, 2]
    assert c["time_us"].tolist() == [28.4, 20.5]
    assert notes["collective"] == ["all_reduce", "all_gather"] and notes["ranks"] == [4, 2]


def test_nccl_tests_repeated_rank_lines_count_each_rank_once(tmp_path):
    text = _run("all_reduce_perf", FOUR_ON_TWO, 1024, 28.4)
    rank_lines = "\n".join(ln for ln in text.splitlines() if "Rank" in ln)
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(text.replace("# Using devices", "# Using devices\n" + rank_lines))  # every Rank line twice
    c, notes = import_nccl_tests(log)
    assert (c["world_size"].iloc[0], c["nodes"].iloc[0], c["gpus_per_node"].iloc[0]) == (4, 2, 2)
    assert notes["ranks"] == 4


# ----------------------------------------------------------------------------- 2. impossible power samples
SMI_HEAD = "timestamp, name, index, power.draw [W], utilization.gpu [%], utilization.memory [%]\n"
H100 = "NVIDIA H100 80GB HBM3"  # catalog H100-SXM5-80GB, TDP 700 W


@pytest.mark.parametrize("cell,col,value", [
    ("-12.5 W, 50 %, 10 %", "power_w", "-12.5"),
    ("inf, 50 %, 10 %", "power_w", "inf"),
    ("1200 W, 50 %, 10 %", "power_w", "1200"),  # > 1.5 x 700 W
    ("300 W, 130 %, 10 %", "gpu_util_pct", "130"),
    ("300 W, 50 %, -4 %", "mem_util_pct", "-4"),
])
def test_nvidia_smi_drops_impossible_samples_with_a_counted_warning(tmp_path, cell, col, value):
    f = tmp_path / "smi.csv"
    f.write_text(SMI_HEAD + f"2025/01/10 12:00:00, {H100}, 0, 400 W, 90 %, 20 %\n"
                 f"2025/01/10 12:00:01, {H100}, 0, {cell}\n"
                 f"2025/01/10 12:00:02, {H100}, 0, 410 W, 91 %, 21 %\n")
    w, notes = import_nvidia_smi(f)
    assert w["power_w"].tolist() == [400.0, 410.0]
    assert notes["impossible_samples"] == 1 and sum(notes["unmapped_reasons"].values()) == 1
    assert re.search(rf"data row 2: column {col} value {value}\b", notes["warning"])
    if col == "power_w" and value == "-12.5":  # the CLI prints the warning and the count
        r = run_cli("profile", "import", str(f), "-o", str(tmp_path / "out"))
        assert r.returncode == 0, r.stderr
        out = flat(r.stderr)
        assert "1 sample(s) with an impossible value dropped" in out and "2 power samples" in out


def test_power_cap_without_a_known_tdp_and_all_bad_file_is_refused(tmp_path):
    f = tmp_path / "smi.csv"
    f.write_text(SMI_HEAD + "2025/01/10 12:00:00, Mystery GPU, 0, 4000 W, 90 %, 20 %\n"
                 "2025/01/10 12:00:01, Mystery GPU, 0, 6000 W, 90 %, 20 %\n")
    w, notes = import_nvidia_smi(f)  # unknown device: only > 5,000 W is impossible
    assert w["power_w"].tolist() == [4000.0] and "5000 W (device TDP unknown)" in notes["warning"]
    g = tmp_path / "bad.csv"
    g.write_text(SMI_HEAD + f"2025/01/10 12:00:00, {H100}, 0, -1 W, 90 %, 20 %\n")
    with pytest.raises(ProfileImportError, match=r"bad.csv: no usable power sample: data row 1: column power_w value -1"):
        import_nvidia_smi(g)


def test_dcgm_drops_impossible_samples_naming_the_line(tmp_path):
    f = tmp_path / "dmon.txt"
    f.write_text("#Entity   ID    POWER   GPUTL   MCUTL   SMCLK   TMPTR\n"
                 "ID                   W       %       %     MHZ       C\n"
                 "GPU 0            301.2      95      60    1410      61\n"
                 "GPU 0           -301.2      95      60    1410      61\n"
                 "GPU 0            305.9     250      61    1410      62\n"
                 "GPU 0            305.9      96      61    1410      62\n")
    w, notes = import_dcgm(f, device="A100-SXM4-40GB")
    assert w["power_w"].tolist() == [301.2, 305.9] and w["timestamp"].tolist() == [0, 3]
    assert notes["impossible_samples"] == 2 and "line 4: column power_w value -301.2" in notes["warning"]


# ----------------------------------------------------------------------------- 3. Kineto: duplicates, unknown device
def _trace_doc(device_index=0):
    cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000, "dur": 20,
           "args": {"Input Dims": [[64, 128], [128, 32]], "Input type": ["float", "float"]}}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1005, "dur": 3,
              "args": {"correlation": 5}}
    kern = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "pid": 0, "tid": 7, "ts": 1010, "dur": 50,
            "args": {"correlation": 5, "device": device_index}}
    return {"traceEvents": [cpu, launch, kern], "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}]}


def test_kineto_exact_duplicate_events_are_dropped_and_counted(tmp_path):
    doc = _trace_doc()
    doc["traceEvents"] = doc["traceEvents"] * 2
    p = tmp_path / "dup.json"
    p.write_text(json.dumps(doc))
    k, _, notes = import_kineto(p)
    assert k["latency_ms"].tolist() == [0.05] and k["n_kernels"].tolist() == [1]
    assert notes["duplicate_events"] == 3 and "3 exact duplicate event(s) dropped" in notes["warning"]


def test_kineto_kernel_on_a_device_absent_from_device_properties_is_unknown(tmp_path):
    p = tmp_path / "dev3.json"
    p.write_text(json.dumps(_trace_doc(device_index=3)))
    k, _, notes = import_kineto(p)
    assert k["device_name"].tolist() == [""] and k["Device"].tolist() == [""]
    assert "device index 3 absent" in notes["warning"] and notes["unknown_device_rows"] == 1
    k, _, _ = import_kineto(p, device="A100-SXM4-40GB")  # --device names it
    assert k["device_name"].tolist() == ["A100-SXM4-40GB"]


# ----------------------------------------------------------------------------- 4. keys given twice
def test_device_spec_yaml_with_a_key_twice_is_refused(tmp_path, my_gpu_yaml):
    text = my_gpu_yaml.read_text()
    f = tmp_path / "gpu.yaml"
    f.write_text(text.replace("memory_bandwidth_gbps: 1008\n", "memory_bandwidth_gbps: 1008\nmemory_bandwidth_gbps: 100\n"))
    with pytest.raises(DeviceSpecError, match=r"'memory_bandwidth_gbps' given twice"):
        load_spec_file(f)
    g = tmp_path / "gpu.json"
    g.write_text('{"Device": "NVIDIA L4", "Dev_Mem": 24, "Mem_Bw": 300, "Mem_Bw": 3000, "Num_Sm": 60, '
                 '"Core_Per_SM": 128, "Freq": 2040, "SingleFLOPs": 31334, "L2Cache": 48}')
    with pytest.raises(DeviceSpecError, match=r"gpu.json: key 'Mem_Bw' is given twice"):
        load_spec_file(g)
    assert load_spec_file(my_gpu_yaml).memory_bandwidth_gbps == 1008  # the example still loads


def test_cluster_file_with_a_key_twice_is_refused(tmp_path, repo):
    src = (repo / "data" / "clusters" / "dgx-a100.yaml").read_text()
    key = next(ln.split(":")[0] for ln in src.splitlines() if re.match(r"^[a-z_]+:\s*\S", ln))
    f = tmp_path / "c.yaml"
    f.write_text(src + f"\n{key}: again\n")
    with pytest.raises(ClusterSpecError, match=rf"'{key}' given twice"):
        load_cluster_file(f)
    assert len(list_clusters()) > 0  # the shipped presets still load


def test_hf_config_json_with_a_key_twice_is_refused(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, '
                                   '"vocab_size": 50257, "n_positions": 1024, "n_layer": 48}')
    with pytest.raises(GraphError, match=r"key 'n_layer' is given twice"):
        load_hf_config(d / "config.json")
    with pytest.raises(GraphError, match=r"key 'n_layer' is given twice"):
        load_hf_config(d)  # a model folder too
    for name in builtin_models():  # the shipped configs still load
        load_hf_config(name)


# ----------------------------------------------------------------------------- 5. NeuSight device JSON keys
NEW_GPU = {"Device": "NVIDIA Hypothetical X1", "Dev_Mem": 80, "Mem_Bw": 3430, "Num_Sm": 132, "Core_Per_SM": 128,
           "Freq": 1980, "SingleFLOPs": 66900, "L2Cache": 50}


def test_neusight_json_accepts_tdp_w(tmp_path):
    s = from_neusight_json({**NEW_GPU, "tdp_w": 700, "idle_power_w": 80})
    assert (s.tdp_w, s.idle_power_w) == (700, 80) and "tdp_w" in s.sources["tdp_w"]
    f = tmp_path / "x1.json"
    f.write_text(json.dumps({**NEW_GPU, "tdp_w": 700}))
    assert load_spec_file(f).tdp_w == 700
    # a catalog GPU: the file's tdp_w wins over the catalog's
    assert from_neusight_json({**NEW_GPU, "Device": "NVIDIA H100 80GB HBM3", "tdp_w": 650}).tdp_w == 650


@pytest.mark.parametrize("extra,match", [
    ({"Foo": 1}, r"unknown key\(s\) 'Foo'"),
    ({"tdp": 700}, r"unknown key\(s\) 'tdp' \(did you mean 'tdp_w'\?\)"),
    ({"Mem_Bw": "3352"}, r"NeuSight key 'Mem_Bw' \(-> memory_bandwidth_gbps\) must be a number, got '3352'"),
    ({"Core_Per_SM": "128"}, r"NeuSight key 'Core_Per_SM' .* must be a number, got '128'"),
    ({"tdp_w": "700"}, r"field 'tdp_w' must be a number, got '700'"),
])
def test_neusight_json_refuses_unknown_keys_and_text_numbers(extra, match):
    with pytest.raises(DeviceSpecError, match=match):
        from_neusight_json({**NEW_GPU, **extra})
