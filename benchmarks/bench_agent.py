"""Agent benchmark: CPU time per cycle and memory over many cycles, 8 GPUs on the fake NVML.

    python -m benchmarks.bench_agent                    # 10,000 cycles (a minute or so)
    python -m benchmarks.bench_agent --cycles 2000      # quicker
    python -m benchmarks.bench_agent --json             # the same figures as JSON
    python -m benchmarks.bench_agent --processes 32     # a busier node: 32 processes over its GPUs

Needs gcc (it builds devtools/fakenvml into a temporary folder). The node is
devtools/fakenvml/nodes.py: 8 GPUs of three models, one lost, one split into 3 MIG
devices, with processes; the real pynvml bindings read it through the fake library.

Two measurements, each in a fresh process that loads the fake (LD_LIBRARY_PATH is
read at process start):

* probe + encode: the agent's own ``Nvml.read`` and ``encode_report`` in a loop,
  NVML kept open as ``run`` keeps it; CPU time per call from
  ``time.process_time_ns``, wall time from ``perf_counter_ns``.
* attribution: ``Attributor.attribute`` on those reports, each process's cgroup read
  from a /proc stand-in (one file per process, as the node's /proc has), each container's
  labels from the cache (dockerd is asked once per container, at its first process).
* full cycles: the real ``gpuspawner-agent run`` with a tiny interval, posting to a
  stand-in hub on 127.0.0.1 (devtools/report_sink.py) in this process. When the
  n-th report arrives, the agent is blocked waiting for the answer, and this process
  reads its CPU time (utime + stime from /proc/PID/stat) and its RSS (VmRSS from
  /proc/PID/status). CPU per cycle is taken over blocks of up to 1,000 cycles (from
  cycle 10 on); the median block is the figure, the spread of the blocks shows how much
  other work on the machine disturbed it. It includes the NVML reads, the JSON, the
  HTTP exchange (the kernel's loopback work for the request is charged to the agent
  too) and the call to sleep.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools import fakenvml
from devtools.fakenvml.nodes import MIXED_NODE
from devtools.report_sink import ReportSink

REPO = Path(__file__).resolve().parents[1]
TARGET_CPU_US = 1000
TICKS = os.sysconf("SC_CLK_TCK")
pc = time.perf_counter_ns
cpu = time.process_time_ns


def node_with(processes: int | None) -> list[dict]:
    """MIXED_NODE, or with ``processes`` processes spread over its GPUs that are neither
    lost nor in MIG mode (256 MiB each), in place of its own."""
    if processes is None:
        return MIXED_NODE
    node = copy.deepcopy(MIXED_NODE)
    usable = [d for d in node if not d.get("lost") and not d.get("mig")]
    for d in node:
        d["processes"] = []
    for i in range(processes):
        usable[i % len(usable)]["processes"].append({"pid": 5000 + i, "used_mib": 256})
    return node


def percentile(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def fake_proc(root: Path, report: dict) -> None:
    """A /proc with each GPU process in a container of its own, as on a node."""
    for dev in report["devices"]:
        for p in dev["processes"]:
            (root / str(p["pid"])).mkdir(parents=True, exist_ok=True)
            cid = f"{p['pid']:064x}"
            (root / str(p["pid"]) / "cgroup").write_text(
                "".join(f"{i}:{c}:/docker/{cid}\n" for i, c in enumerate(("cpu", "memory", "pids"), 1))
                + f"0::/docker/{cid}\n"
            )


def attribution_cpu_us(nvml, cycles: int) -> float:
    """The attribution's CPU per cycle, steady state: each process's cgroup read from
    /proc, its container's labels from the cache (dockerd is asked once per container)."""
    from gpuspawner.agent.attribution import SERVICE_LABEL, Attributor

    with tempfile.TemporaryDirectory(prefix="bench-proc-") as proc:
        fake_proc(Path(proc), nvml.read())
        attributor = Attributor(proc, lambda cid: {SERVICE_LABEL: f"jupyter-{cid[-4:]}"})
        reports = [nvml.read() for _ in range(cycles)]
        c0 = cpu()
        for report in reports:
            attributor.attribute(report)
        return (cpu() - c0) / cycles / 1e3


def inner_probe(cycles: int) -> dict:
    """Runs inside the process that loaded the fake: times the agent's own read and encode."""
    from gpuspawner.agent.nvml import Nvml
    from gpuspawner.agent.report import encode_report

    nvml = Nvml()
    nvml.open()
    for _ in range(50):  # warm-up: first calls resolve the bindings' function pointers
        encode_report(nvml.read(), "gpu-a", 15.0)
    read_cpu, encode_cpu, both_wall = [], [], []
    for _ in range(cycles):
        w0, c0 = pc(), cpu()
        report = nvml.read()
        c1 = cpu()
        body = encode_report(report, "gpu-a", 15.0)
        c2, w1 = cpu(), pc()
        read_cpu.append(c1 - c0)
        encode_cpu.append(c2 - c1)
        both_wall.append(w1 - w0)
    attribution = attribution_cpu_us(nvml, cycles)
    processes = sum(len(d["processes"]) for d in report["devices"])
    nvml.close()
    return {
        "attribution_cpu_us": attribution,
        "processes": processes,
        "cycles": cycles,
        "devices": report["device_count"],
        "body_bytes": len(body),
        "read_cpu_us": statistics.fmean(read_cpu) / 1e3,
        "encode_cpu_us": statistics.fmean(encode_cpu) / 1e3,
        "probe_encode_cpu_us": statistics.fmean(a + b for a, b in zip(read_cpu, encode_cpu)) / 1e3,
        "probe_encode_wall_p50_us": percentile(both_wall, 0.50) / 1e3,
        "probe_encode_wall_p99_us": percentile(both_wall, 0.99) / 1e3,
    }


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15)


def proc_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def full_cycles(env: dict, cycles: int, token_file: Path) -> dict:
    rss_marks = sorted({10, 100, 1000, cycles} & set(range(1, cycles + 1)))
    # CPU in blocks of up to 1,000 cycles: the median block is what a cycle costs when
    # the machine is not busy with something else, the spread shows how busy it was.
    block_marks = sorted({10, cycles, *range(1000, cycles, 1000)})
    marks = set(rss_marks) | set(block_marks)
    seen: dict[int, tuple[float, int, float]] = {}
    sink = ReportSink(record=False)
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuspawner.agent.command",
                "run",
                "--hub-url",
                sink.url(),
                "--token-file",
                str(token_file),
                "--interval",
                "0.0001",
                "--cycles",
                str(cycles),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        sink.on_request = lambda n: (
            seen.__setitem__(n, (proc_cpu_s(proc.pid), proc_rss_kib(proc.pid), time.perf_counter()))
            if n in marks
            else None
        )
        _, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"the agent failed ({proc.returncode}):\n{err}")
    finally:
        sink.stop()
    blocks = [(seen[b][0] - seen[a][0]) / (b - a) * 1e6 for a, b in zip(block_marks, block_marks[1:])]
    first, last = seen[block_marks[0]], seen[block_marks[-1]]
    n = block_marks[-1] - block_marks[0]
    return {
        "cycles": cycles,
        "cpu_per_cycle_us": (last[0] - first[0]) / n * 1e6,
        "cpu_per_cycle_us_median_block": statistics.median(blocks),
        "cpu_per_cycle_us_blocks_min_max": [min(blocks), max(blocks)],
        "wall_per_cycle_us": (last[2] - first[2]) / n * 1e6,
        "rss_kib": {str(m): seen[m][1] for m in rss_marks},
        "rss_growth_kib": seen[rss_marks[-1]][1] - seen[rss_marks[0]][1],
    }


def fmt(r: dict) -> str:
    p, f = r["probe"], r["full"]
    rss = f["rss_kib"]
    marks = list(rss)
    lo, hi = f["cpu_per_cycle_us_blocks_min_max"]
    lines = [
        f"Agent benchmark: {p['devices']} GPUs (3 models, one lost, one split into 3 MIG devices) "
        f"over the fake NVML; Python {r['python']}, nvidia-ml-py {r['pynvml']}",
        "",
        f"{'per cycle':<44} {'CPU µs':>8} {'wall p50 µs':>12} {'wall p99 µs':>12}",
        f"{'  NVML reads (Nvml.read)':<44} {p['read_cpu_us']:>8.0f}",
        f"{'  JSON body (encode_report, ' + str(p['body_bytes']) + ' bytes)':<44} {p['encode_cpu_us']:>8.0f}",
        f"{'  attribution (' + str(p['processes']) + ' processes, /proc + cache)':<44} {p['attribution_cpu_us']:>8.0f}",
        f"{'  probe + encode':<44} {p['probe_encode_cpu_us']:>8.0f} "
        f"{p['probe_encode_wall_p50_us']:>12.0f} {p['probe_encode_wall_p99_us']:>12.0f}",
        f"{'  full cycle, POST to 127.0.0.1 (run)':<44} {f['cpu_per_cycle_us_median_block']:>8.0f} "
        f"{'(mean ' + format(f['wall_per_cycle_us'], '.0f') + ')':>12}",
        "",
        f"full cycle: the median of blocks of up to 1,000 cycles; blocks ranged {lo:.0f}-{hi:.0f} µs, "
        f"all {f['cycles']:,} cycles together {f['cpu_per_cycle_us']:.0f} µs",
        f"target: full cycle ≤ {TARGET_CPU_US} µs CPU: "
        f"{'met' if f['cpu_per_cycle_us_median_block'] <= TARGET_CPU_US else 'NOT met'}",
        "RSS of the agent: "
        + ", ".join(f"{rss[m] / 1024:.1f} MiB after {int(m):,} cycles" for m in marks)
        + f" (growth {f['rss_growth_kib']} KiB from {int(marks[0]):,} to {int(marks[-1]):,})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_agent", description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=10_000, help="full cycles of `run` (default: %(default)s)")
    ap.add_argument("--probe-cycles", type=int, default=2_000, help="probe + encode calls (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument(
        "--processes", type=int, default=None, help="processes on the node's GPUs (default: the mixed node's own 6)"
    )
    ap.add_argument("--inner-probe", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.inner_probe:
        json.dump(inner_probe(args.inner_probe), sys.stdout)
        return 0

    import pynvml  # only its version; the fake is loaded by the child processes

    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        tmp = Path(tmp)
        lib_dir = fakenvml.build(tmp / "lib").parent
        devices = fakenvml.write_devices(tmp / "devices.txt", node_with(args.processes))
        token_file = tmp / "token"
        token_file.write_text("bench-token\n")
        env = fakenvml.process_env(lib_dir, devices, PYTHONPATH=str(REPO))
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_agent", "--inner-probe", str(args.probe_cycles)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        result = {
            "python": platform.python_version(),
            "pynvml": getattr(pynvml, "__version__", None) or _dist_version("nvidia-ml-py"),
            "probe": json.loads(out.stdout),
            "full": full_cycles(env, args.cycles, token_file),
        }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(fmt(result))
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
