"""Shared fixtures: the repository paths, the public data root (skip when absent) and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Library code paths must never phone home; set it for this process and every subprocess we start.
_QUIET_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "HF_HUB_OFFLINE": "1"}
for _k, _v in _QUIET_ENV.items():
    os.environ.setdefault(_k, _v)
# extra XLA GEMM tables change what load_kernels returns: tests name theirs explicitly
os.environ.pop("WATTCAST_XLA_TABLE", None)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
#: the columns `wattcast kernels` adds (its contract with other tools)
CONTRACT_COLUMNS = ("pred_latency_ms", "pred_low_ms", "pred_high_ms", "ood")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def examples_csv() -> Path:
    return EXAMPLES / "kernels.csv"


@pytest.fixture(scope="session")
def my_gpu_yaml() -> Path:
    return EXAMPLES / "my_gpu.yaml"


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The public datasets folder; skips the test when it is not there."""
    from wattcast.data.kernel_datasets import DataNotFoundError, resolve_data_root

    try:
        return resolve_data_root()
    except DataNotFoundError as e:
        pytest.skip(f"public kernel data not available: {e}")


@pytest.fixture(scope="session")
def traces(data_root) -> Path:
    """The public PyTorch-profiler traces folder (``traces/``); skips the test when it is not there."""
    d = data_root / "traces"
    if not (d / "a100_trace_diff_control.json.gz").is_file():
        pytest.skip("../shared/datasets/traces not available")
    return d


def load_script(path: Path, name: str):
    """The module of a repository script outside the package (a benchmark, an example), loaded from its file and
    registered in ``sys.modules`` (dataclasses resolve annotations through it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def cli_env(data: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(_QUIET_ENV)
    # a wide virtual terminal so rich does not wrap the messages we look for
    env["COLUMNS"] = "400"
    env["NO_COLOR"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if data is not None:
        env["WATTCAST_DATA"] = str(data)
    else:
        try:
            from wattcast.data.kernel_datasets import resolve_data_root

            env.setdefault("WATTCAST_DATA", str(resolve_data_root()))
        except FileNotFoundError:
            pass
    return env


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, data: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real `wattcast` command line (``python -m wattcast.cli ARGS``) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "wattcast.cli", *map(str, args)],
        cwd=str(cwd or REPO),
        env=cli_env(data),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def flat(text: str) -> str:
    """Whitespace-normalised text (rich may still wrap long messages)."""
    return " ".join(text.split())


def preset_cluster(name: str = "dgx-h100", **change) -> dict:
    """A shipped cluster preset (``data/clusters/<name>.yaml``) as a dict, with ``change`` applied
    (``inter__nic_bandwidth_gbit_per_s`` sets a nested field)."""
    import yaml

    d = yaml.safe_load((REPO / "data" / "clusters" / f"{name}.yaml").read_text())
    for k, v in change.items():
        if "__" in k:
            sec, f = k.split("__")
            d[sec][f] = v
        else:
            d[k] = v
    return d


def write_preset_cluster(path: Path, device: str, nic: float = 400) -> Path:
    """The DGX-H100 preset with ``device`` and a NIC bandwidth (Gbit/s) written to ``path``."""
    import yaml

    path.write_text(yaml.safe_dump(preset_cluster(device=device, inter__nic_bandwidth_gbit_per_s=nic)))
    return path


@pytest.fixture(scope="session")
def cli():
    return run_cli


# ------------------------------------------------------------------------------ background training
def xla_gemm_table(devices: dict[str, list[tuple[int, int, int, int, int]]]) -> str:
    """An XLA GemmPerfTable textproto: per device key, its (b, m, n, k, bf16 FLOP/s) entries."""
    def entry(b, m, n, k, flops):
        return (f"    entries {{\n      b: {b}\n      m: {m}\n      n: {n}\n      k: {k}\n"
                f"      flops {{ key: \"bf16xbf16->bf16\" value: {flops} }}\n    }}\n")
    return "# proto-message: xla.GemmPerfTable\n" + "".join(
        f"entries {{\n  key: \"{key}\"\n  value {{\n{''.join(entry(*e) for e in rows)}  }}\n}}\n"
        for key, rows in devices.items())


#: a two-entry XLA GemmPerfTable on gfx942 (MI300X) and one sm_90 (H100) entry, which training must leave out (the
#: shared datasets withhold the Hopper generation): the figures of OpenXLA's table for these shapes
#: (jax-cuda13-pjrt 0.12.0.1)
XLA_EXTRA_TABLE = xla_gemm_table({
    "sm_90": [(1, 4096, 4096, 4096, 780193877565849)],
    "gfx942": [(1, 4096, 4096, 4096, 587080012780535), (1, 256, 256, 256, 9103209983722)],
})


class BackgroundTraining:
    """`wattcast train kernels --quick --out BASE/bundle --mlruns BASE/mlruns` on the shared data, in a subprocess.

    test_train_cli.py checks its results; conftest starts it at collection time so the ~45 s of
    training overlap the other tests (the machine has 2 cores; training keeps one of them busy).
    """

    def __init__(self, base: Path, data: Path):
        self.base = base
        self.bundle = base / "bundle"
        self.mlruns = base / "mlruns"
        # an extra XLA GEMM table (two MI300X bf16 shapes, the format of data/xla_perf_table.py) rides along
        self.xla_table = base / "xla_extra.txtpb"
        self.xla_table.write_text(XLA_EXTRA_TABLE)
        self._log = open(base / "train.log", "w+")
        self.proc = subprocess.Popen(
            # --force: the tests' bundle goes into a new --out, judged against the shipped (full-recipe) bundle since
            # stop 54; a quick bundle may be refused there, and these tests check its files, MLflow run and predictions
            [sys.executable, "-m", "wattcast.cli", "train", "kernels", "--quick", "--force",
             "--out", str(self.bundle), "--mlruns", str(self.mlruns), "--xla-table", str(self.xla_table)],
            cwd=str(base), env=cli_env(data), stdout=self._log, stderr=subprocess.STDOUT, text=True,
        )
        self._done: subprocess.CompletedProcess | None = None

    def result(self, timeout: float = 900) -> subprocess.CompletedProcess:
        """Wait for the run; stdout holds its combined output."""
        if self._done is None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop()
                pytest.fail(f"`wattcast train kernels --quick` did not finish in {timeout:.0f} s")
            self._log.seek(0)
            self._done = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self._log.read(), "")
            self._log.close()
        return self._done

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by its handle
            self.proc.wait()
        if not self._log.closed:
            self._log.close()


def pytest_collection_finish(session):
    """Start the shared-data training early when test_train_cli.py is selected and the data is there."""
    cfg = session.config
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under pytest-xdist every worker collects every test: the fixture starts it in the one that runs them
    if cfg.option.collectonly or not any(Path(str(i.fspath)).name == "test_train_cli.py" for i in session.items):
        return
    try:
        from wattcast.data.kernel_datasets import resolve_data_root

        data = resolve_data_root()
    except FileNotFoundError:
        return  # the module skips itself
    base = Path(cfg._tmp_path_factory.mktemp("train")) if hasattr(cfg, "_tmp_path_factory") else None
    if base is None:
        return  # no tmp_path factory (plugin disabled): the fixture starts it instead
    cfg._wattcast_training = BackgroundTraining(base, data)


def pytest_sessionfinish(session, exitstatus):
    t = getattr(session.config, "_wattcast_training", None)
    if t is not None:
        t.stop()


#: a valid user spec in the own schema (a GPU not in the catalog), shared by spec tests
USER_SPEC = {
    "schema_version": 1,
    "name": "Acme-X1",
    "vendor": "other",
    "peak_fp32_tflops": 40.0,
    "peak_bf16_tflops": 400.0,
    "memory_gb": 96,
    "memory_bandwidth_gbps": 2500,
    "num_sms": 100,
    "boost_clock_mhz": 1800,
    "l2_cache_mb": 64,
    "tdp_w": 500,
    "source": "Acme X1 datasheet rev 3",
}


@pytest.fixture()
def shipped_copy(tmp_path):
    """A copy of the shipped kernel bundle folder, to edit or break (the GEMM floor and ceiling members' file checks)."""
    import shutil

    from wattcast.models.kernel_bundle import shipped_folder

    dst = tmp_path / "bundle"
    shutil.copytree(shipped_folder(), dst)
    return dst
