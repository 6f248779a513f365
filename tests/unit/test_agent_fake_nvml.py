"""gpuspawner-agent probe against the real pynvml bindings and a fake libnvidia-ml.so.1.

The fake library (devtools/fakenvml) is built with gcc once per module. The agent runs as
a subprocess because LD_LIBRARY_PATH is read by the dynamic loader only at process
start, and because pynvml keeps the loaded library for the life of a process.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import fakenvml
from devtools.fakenvml.nodes import A100, GTX, MIXED_NODE, T4
from tests.ci import skip_or_fail

REPO = Path(__file__).resolve().parents[2]

DEVICES = MIXED_NODE

# Written out by hand, not derived with the agent's own rules.
EXPECTED_PROBLEMS = {
    2: ["GPU is lost (NVML_ERROR_GPU_IS_LOST)"],
    3: ["temperature 93 C is above 90 C"],
    5: ["2 uncorrected ECC errors"],
}
# Device 6's MIG devices; slot 2 is empty. Slot 3's name lacks the profile, which
# comes from its attributes instead.
EXPECTED_MIG = [
    {
        "index": 0,
        "uuid": "MIG-1d89abd8-d10a-5361-bd06-77a807048470",
        "profile": "1g.10gb",
        "name": "NVIDIA A100 80GB PCIe MIG 1g.10gb",
        "memory_total_mib": 9728,
        "memory_used_mib": 1024,
    },
    {
        "index": 1,
        "uuid": "MIG-1d89abd8-d10a-5361-bd06-77a807048471",
        "profile": "3g.40gb",
        "name": "NVIDIA A100 80GB PCIe MIG 3g.40gb",
        "memory_total_mib": 40192,
        "memory_used_mib": 0,
    },
    {
        "index": 3,
        "uuid": "MIG-1d89abd8-d10a-5361-bd06-77a807048473",
        "profile": "1c.2g.20gb",
        "name": "NVIDIA A100 80GB PCIe",
        "memory_total_mib": 19968,
        "memory_used_mib": 0,
    },
]


def expected_device(dev: dict) -> dict:
    i = dev["index"]
    if dev.get("lost"):
        # A lost GPU answers nothing but its position.
        return {
            "index": i,
            "uuid": None,
            "name": None,
            "memory_total_mib": None,
            "memory_used_mib": None,
            "utilization_gpu": None,
            "temperature_c": None,
            "ecc_uncorrected": None,
            "lost": True,
            "processes": [],
            "mig_mode": None,
            "mig_devices": [],
            "healthy": False,
            "problems": EXPECTED_PROBLEMS[i],
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
        "mig_devices": EXPECTED_MIG if dev.get("mig") else [],
        "healthy": i not in EXPECTED_PROBLEMS,
        "problems": EXPECTED_PROBLEMS.get(i, []),
    }


@pytest.fixture(scope="module")
def devices_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gpus") / "devices.txt"
    return fakenvml.write_devices(path, DEVICES, driver="550.54.15", cuda=12040)


def run_agent(args, lib_dir, devices=None, **extra_env) -> subprocess.CompletedProcess:
    # PYTHONPATH: works without `pip install -e .` too
    env = fakenvml.process_env(lib_dir, devices, PYTHONPATH=str(REPO), **extra_env)
    return subprocess.run(
        [sys.executable, "-m", "gpuspawner.agent.command", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


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
        skip_or_fail("a real libnvidia-ml.so.1 is installed system-wide, so the no-library case cannot be made")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == ("gpuspawner-agent: no NVIDIA driver library (libnvidia-ml.so.1) found on this node\n")
    assert "Traceback" not in proc.stderr


def test_library_but_no_driver(fake_lib_dir, devices_file):
    proc = run_agent(["probe"], fake_lib_dir, devices_file, FAKE_NVML_NO_DRIVER="1")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "gpuspawner-agent: the NVIDIA driver library is installed but the "
        "NVIDIA kernel driver is not loaded on this node\n"
    )
    assert "Traceback" not in proc.stderr


def test_fake_matches_the_bindings_struct_layouts(fake_lib_dir, devices_file):
    """Calls the agent does not make, straight through pynvml: v2 memory struct,
    the process list's two-call protocol, ECC counters of both kinds, MIG handles."""
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
gpu = n.nvmlDeviceGetHandleByIndex(6)
mig = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 3)
a = n.nvmlDeviceGetAttributes(mig)
m2 = n.nvmlDeviceGetMemoryInfo(mig, version=n.nvmlMemory_v2)
out.update(
    max_mig=[n.nvmlDeviceGetMaxMigDeviceCount(n.nvmlDeviceGetHandleByIndex(i)) for i in (4, 6)],
    attrs=[a.gpuInstanceSliceCount, a.computeInstanceSliceCount, a.memorySizeMB,
           a.multiprocessorCount],
    is_mig=[n.nvmlDeviceIsMigDeviceHandle(gpu).value, n.nvmlDeviceIsMigDeviceHandle(mig).value],
    parent=n.nvmlDeviceGetIndex(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)),
    ids=[n.nvmlDeviceGetGpuInstanceId(mig), n.nvmlDeviceGetComputeInstanceId(mig)],
    mig_v2=[m2.total, m2.used],
)
for what, call in [("slot 2", lambda: n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)),
                   ("temperature of a MIG device", lambda: n.nvmlDeviceGetTemperature(mig, 0)),
                   ("attributes of a whole GPU", lambda: n.nvmlDeviceGetAttributes(gpu))]:
    try:
        call()
    except n.NVMLError as e:
        out[what] = type(e).__name__
try:
    n.nvmlDeviceGetPciInfo_v3(h)
except n.NVMLError as e:
    out["pci"] = type(e).__name__  # (no bus id in its line: test_agent_topology.py reads them)
n.nvmlShutdown()
print(json.dumps(out))
"""
    env = fakenvml.process_env(fake_lib_dir, devices_file)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    mib = 1024 * 1024
    assert json.loads(proc.stdout) == {
        "v2": [0x02000028, 81920 * mib, 0, 40960 * mib, 40960 * mib],
        "procs": [[1001, 30720 * mib], [1002, 10240 * mib]],
        "ecc_agg": 2,
        "mig": [1, 1],
        "cuda_v1": 12040,
        "pci": "NVMLError_NotSupported",
        "max_mig": [0, 7],
        "attrs": [2, 1, 19968, 0],
        "is_mig": [0, 1],
        "parent": 6,
        "ids": [5, 1],
        "mig_v2": [19968 * mib, 0],
        "slot 2": "NVMLError_NotFound",
        "temperature of a MIG device": "NVMLError_NotSupported",
        "attributes of a whole GPU": "NVMLError_NotSupported",
    }


def test_build_is_cached(fake_lib_dir):
    lib = fake_lib_dir / fakenvml.LIBNAME
    before = lib.stat().st_mtime_ns
    assert fakenvml.build(fake_lib_dir) == lib
    assert lib.stat().st_mtime_ns == before


def test_agent_modules_import_neither_docker_nor_jupyterhub_nor_the_hubs_side():
    paths = sorted((REPO / "gpuspawner" / "agent").glob("*.py"))
    assert REPO / "gpuspawner" / "agent" / "command.py" in paths
    imported = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    assert not {m.split(".")[0] for m in imported} & {"docker", "jupyterhub", "dockerspawner"}
    ours = {m for m in imported if m.startswith("gpuspawner.")}
    assert all(m.startswith(("gpuspawner.agent.", "gpuspawner.core.", "gpuspawner._version")) for m in ours), ours


def test_the_agent_runs_without_docker_or_jupyterhub_loaded():
    # GPU nodes need not have the hub's packages: importing the agent (through
    # the package) must not load them.
    code = "import sys, gpuspawner.agent.command; print(sorted({'docker', 'jupyterhub', 'dockerspawner'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
