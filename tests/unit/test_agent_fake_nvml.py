"""gpuspawner-agent probe against the real pynvml bindings and a fake libnvidia-ml.so.1.

The fake library (tests/fakenvml) is built with gcc once per module. The agent runs as
a subprocess because LD_LIBRARY_PATH is read by the dynamic loader only at process
start, and because pynvml keeps the loaded library for the life of a process.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fakenvml

REPO = Path(__file__).resolve().parents[2]

GTX = "NVIDIA GeForce GTX 1070"
A100 = "NVIDIA A100 80GB PCIe"
T4 = "Tesla T4"

# 8 GPUs of three models. GeForce cards have no ECC and no MIG ("not supported"),
# A100s have both, the T4 has ECC but no MIG.
DEVICES = [
    dict(index=0, uuid="GPU-0a1b2c3d-0000-4000-8000-000000000000", name=GTX,
         memory_total_mib=8192, memory_used_mib=2048, util_gpu=63, temp_c=71,
         processes=[{"pid": 4242, "used_mib": 1900}]),
    dict(index=1, uuid="GPU-0a1b2c3d-0000-4000-8000-000000000001", name=GTX,
         memory_total_mib=8192, memory_used_mib=0, util_gpu=0, temp_c=35),
    dict(index=2, uuid="GPU-0a1b2c3d-0000-4000-8000-000000000002", name=GTX,   # lost
         memory_total_mib=8192, memory_used_mib=0, util_gpu=0, temp_c=0, lost=True),
    dict(index=3, uuid="GPU-0a1b2c3d-0000-4000-8000-000000000003", name=GTX,   # hot
         memory_total_mib=8192, memory_used_mib=512, util_gpu=100, temp_c=93,
         processes=[{"pid": 777, "used_mib": 500}]),
    dict(index=4, uuid="GPU-a100a100-0000-4000-8000-000000000004", name=A100,
         memory_total_mib=81920, memory_used_mib=40960, util_gpu=88, temp_c=60,
         ecc_uncorrected=0, mig=False,
         processes=[{"pid": 1001, "used_mib": 30720}, {"pid": 1002, "used_mib": 10240}]),
    dict(index=5, uuid="GPU-a100a100-0000-4000-8000-000000000005", name=A100,  # ECC errors
         memory_total_mib=81920, memory_used_mib=0, util_gpu=0, temp_c=42,
         ecc_uncorrected=2, mig=False),
    dict(index=6, uuid="GPU-a100a100-0000-4000-8000-000000000006", name=A100,  # MIG on
         memory_total_mib=81920, memory_used_mib=0, util_gpu=0, temp_c=38,
         ecc_uncorrected=0, mig=True),
    dict(index=7, uuid="GPU-7e57a7e5-0000-4000-8000-000000000007", name=T4,
         memory_total_mib=15360, memory_used_mib=300, util_gpu=12, temp_c=55,
         ecc_uncorrected=0, mig=None, processes=[{"pid": 31337, "used_mib": 290}]),
]

# Written out by hand, not derived with the agent's own rules.
EXPECTED_PROBLEMS = {
    2: ["GPU is lost (NVML_ERROR_GPU_IS_LOST)"],
    3: ["temperature 93 C is above 90 C"],
    5: ["2 uncorrected ECC errors"],
}


def expected_device(dev: dict) -> dict:
    i = dev["index"]
    if dev.get("lost"):
        # A lost GPU answers nothing but its position.
        return {
            "index": i, "uuid": None, "name": None, "memory_total_mib": None,
            "memory_used_mib": None, "utilization_gpu": None, "temperature_c": None,
            "ecc_uncorrected": None, "lost": True, "processes": [], "mig_mode": None,
            "healthy": False, "problems": EXPECTED_PROBLEMS[i],
        }
    return {
        "index": i,
        "uuid": dev["uuid"],
        "name": dev["name"],
        "memory_total_mib": dev["memory_total_mib"],
        "memory_used_mib": dev["memory_used_mib"],
        "utilization_gpu": dev["util_gpu"],
        "temperature_c": dev["temp_c"],
        "ecc_uncorrected": dev.get("ecc_uncorrected"),
        "lost": False,
        "processes": dev.get("processes", []),
        "mig_mode": dev.get("mig"),
        "healthy": i not in EXPECTED_PROBLEMS,
        "problems": EXPECTED_PROBLEMS.get(i, []),
    }


@pytest.fixture(scope="module")
def fake_lib_dir(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        msg = "gcc is required to build the fake libnvidia-ml.so.1 (apt-get install gcc)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)  # in CI a missing compiler is a broken setup, not a skip
        pytest.skip(msg)
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml")).parent


@pytest.fixture(scope="module")
def devices_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gpus") / "devices.txt"
    return fakenvml.write_devices(path, DEVICES, driver="550.54.15", cuda=12040)


def run_agent(args, lib_dir, devices=None, **extra_env) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    env["PYTHONPATH"] = str(REPO)  # works without `pip install -e .` too
    if devices is not None:
        env["FAKE_NVML_DEVICES"] = str(devices)
    env.update(extra_env)
    return subprocess.run([sys.executable, "-m", "gpuspawner.agent", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_probe_reports_every_device_exactly(fake_lib_dir, devices_file):
    proc = run_agent(["probe"], fake_lib_dir, devices_file)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["driver_version"] == "550.54.15"
    assert report["cuda_version"] == "12.4"
    assert report["device_count"] == 8
    assert report["healthy"] is False
    for got, dev in zip(report["devices"], DEVICES, strict=True):
        assert got == expected_device(dev), f"device {dev['index']}"
    models = [d["name"] for d in report["devices"] if not d["lost"]]
    assert (models.count(GTX), models.count(A100), models.count(T4)) == (3, 3, 1)


def test_max_temperature_option(fake_lib_dir, devices_file):
    proc = run_agent(["probe", "--max-temperature", "95"], fake_lib_dir, devices_file)
    assert proc.returncode == 0, proc.stderr
    hot = json.loads(proc.stdout)["devices"][3]
    assert hot["temperature_c"] == 93 and hot["healthy"] is True and hot["problems"] == []


def test_healthy_node(fake_lib_dir, tmp_path):
    good = [d for d in DEVICES if d["index"] not in EXPECTED_PROBLEMS]
    good = [dict(d, index=i) for i, d in enumerate(good)]
    path = fakenvml.write_devices(tmp_path / "good.txt", good)
    proc = run_agent(["probe"], fake_lib_dir, path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["healthy"] is True and report["device_count"] == len(good)


def test_no_gpus(fake_lib_dir, tmp_path):
    path = fakenvml.write_devices(tmp_path / "none.txt", [])
    proc = run_agent(["probe"], fake_lib_dir, path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["devices"] == [] and report["device_count"] == 0


def test_no_library(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_agent(["probe"], empty)
    if proc.returncode == 0:  # a real driver on this machine shadows the test
        msg = "a real libnvidia-ml.so.1 is installed system-wide, so the no-library case cannot be made"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "gpuspawner-agent: no NVIDIA driver library (libnvidia-ml.so.1) found on this node\n")
    assert "Traceback" not in proc.stderr


def test_library_but_no_driver(fake_lib_dir, devices_file):
    proc = run_agent(["probe"], fake_lib_dir, devices_file, FAKE_NVML_NO_DRIVER="1")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == ("gpuspawner-agent: the NVIDIA driver library is installed but the "
                           "NVIDIA kernel driver is not loaded on this node\n")
    assert "Traceback" not in proc.stderr


def test_fake_matches_the_bindings_struct_layouts(fake_lib_dir, devices_file):
    """Calls the agent does not make, straight through pynvml: v2 memory struct,
    the process list's two-call protocol, ECC counters of both kinds."""
    code = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(4)
m = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
p = n.nvmlDeviceGetComputeRunningProcesses_v3(h)
out = dict(
    v2=[m.version, m.total, m.reserved, m.free, m.used],
    procs=[[x.pid, x.usedGpuMemory] for x in p],
    ecc_agg=n.nvmlDeviceGetTotalEccErrors(n.nvmlDeviceGetHandleByIndex(5),
        n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
    mig=n.nvmlDeviceGetMigMode(n.nvmlDeviceGetHandleByIndex(6)),
    cuda_v1=n.nvmlSystemGetCudaDriverVersion(),
)
try:
    n.nvmlDeviceGetPciInfo_v3(h)
except n.NVMLError_FunctionNotFound:
    out["pci"] = "function not found"
n.nvmlShutdown()
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
    env.update(LD_LIBRARY_PATH=str(fake_lib_dir), FAKE_NVML_DEVICES=str(devices_file))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    mib = 1024 * 1024
    assert json.loads(proc.stdout) == {
        "v2": [0x02000028, 81920 * mib, 0, 40960 * mib, 40960 * mib],
        "procs": [[1001, 30720 * mib], [1002, 10240 * mib]],
        "ecc_agg": 2,
        "mig": [1, 1],
        "cuda_v1": 12040,
        "pci": "function not found",
    }


def test_build_is_cached(fake_lib_dir):
    lib = fake_lib_dir / fakenvml.LIBNAME
    before = lib.stat().st_mtime_ns
    assert fakenvml.build(fake_lib_dir) == lib
    assert lib.stat().st_mtime_ns == before


def test_agent_module_imports_neither_docker_nor_jupyterhub():
    tree = ast.parse((REPO / "gpuspawner" / "agent.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"docker", "jupyterhub", "dockerspawner"}


def test_the_agent_runs_without_docker_or_jupyterhub_loaded():
    # GPU nodes need not have the hub's packages: importing the agent (through
    # the package) must not load them.
    code = "import sys, gpuspawner.agent; print(sorted({'docker', 'jupyterhub', 'dockerspawner'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
