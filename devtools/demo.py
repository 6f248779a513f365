"""The local demo: a real JupyterHub with GPUSwarmSpawner on a three-node swarm.

    python -m devtools.demo --state-dir DIR          # start; Ctrl-C stops the hub
    python -m devtools.demo --state-dir DIR --down   # stop the hub, remove servers and the swarm

The swarm (a manager on this machine, workers gpu-a and gpu-b) comes from
devtools.swarm. Its GPUs are those of examples/local/gpus.yaml, simulated by a
fake libnvidia-ml.so.1 on each worker and reported to the hub by gpuspawner-agent,
deployed as examples/agent-stack.yml (``--gpus static`` reads the file directly). Servers are
real JupyterLab servers (devtools.jupyter_image), or with ``--server standin`` the
busybox stand-in that starts in a second. A second run reuses the swarm, the image and
the hub's database.

Beyond examples/local/jupyterhub_config.py (which the integration tests share), the demo's
hub shares one model in fractions, gives a group a rule, and keeps a GPU for another group
by a reservation made through the hub's API at each start (HUB_SETTINGS, GROUPS,
RESERVATION); the banner says what to try with them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import signal
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests
import yaml

from . import agent_stack, fakenvml, jupyter_image
from . import swarm as swarm_harness
from .hub import LOCAL_CONFIG, Hub, HubError

INVENTORY = LOCAL_CONFIG.parent / "gpus.yaml"

# What a newcomer tries from the form (docs/sharing.md, docs/access.md, docs/reservations.md),
# on the models of INVENTORY: the small one shared, the large one reserved.
SHARED = "NVIDIA GeForce GTX 1070"
RESERVED = "NVIDIA A100 80GB PCIe"
HUB_SETTINGS = {
    # split: 0.2, then 1.2 as 0.6 + 0.6, leaves one device at 0.8 and one at 0.6 (docs/sharing.md's example).
    "gpu_sharing": {SHARED: {"quantum": 0.1, "split": True}},
    "gpu_access": {"students": {"models": [SHARED], "max_gpus": 1}},
}
GROUPS = {"students": ["carol"], "lab": ["dave"]}
RESERVATION = {"group": "lab", "model": RESERVED, "count": 1, "name": "Lab"}
# Long enough to see the forms before it opens, short enough to see it open.
OPENS_IN, LASTS = timedelta(minutes=5), timedelta(hours=2)


def hub_config() -> str:
    """The demo's lines after examples/local/jupyterhub_config.py."""
    lines = [f"c.GPUSwarmSpawner.{key} = {value!r}" for key, value in HUB_SETTINGS.items()]
    groups = {group: {"users": users} for group, users in GROUPS.items()}
    return "\n".join([*lines, f"c.JupyterHub.load_groups = {groups!r}"]) + "\n"


def _step(n: int, text: str) -> None:
    print(f"\n[{n}/4] {text}", flush=True)


def _agent_files(state_dir: Path) -> tuple[Path, Path]:
    """The fake NVML library, and one devices file per worker with the inventory's GPUs."""
    lib_dir = fakenvml.build(state_dir / "fakenvml").parent
    gpus = state_dir / "gpus"
    gpus.mkdir(parents=True, exist_ok=True)
    for host, devices in yaml.safe_load(INVENTORY.read_text()).items():
        fakenvml.write_devices(
            gpus / f"{host}.txt",
            [
                dict(
                    index=d.get("index", i),
                    uuid=d["uuid"],
                    name=d["model"],
                    memory_total_mib=d["memory_mib"],
                    memory_used_mib=0,
                    util_gpu=0,
                    temp_c=40,
                )
                for i, d in enumerate(devices)
            ],
        )
    return lib_dir, gpus


def _gpu_summary() -> str:
    """'3 × NVIDIA GeForce GTX 1070 on gpu-a, ...' from the demo's inventory."""
    parts = []
    for host, devices in yaml.safe_load(INVENTORY.read_text()).items():
        for model, count in collections.Counter(d["model"] for d in devices).items():
            parts.append(f"{count} × {model} on {host}")
    return ", ".join(parts)


DOWN_MARK = "down-requested"  # `make demo-down` leaves it: the running `make demo` then ends quietly


def _down(state_dir: Path) -> int:
    if state_dir.is_dir():
        (state_dir / DOWN_MARK).touch()
    if Hub(state_dir).stop_leftover():
        print("Stopped the demo's JupyterHub.", flush=True)
    print("Removing the local swarm (servers, daemons, namespaces)...", flush=True)
    swarm_harness.down()
    print(f"Done. The server image stays cached in {jupyter_image.DEFAULT_CACHE} for the next `make demo`.")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", type=Path, default=Path("demo-state"))
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--server",
        choices=["jupyter", "standin"],
        default="jupyter",
        help="real JupyterLab servers (default), or the busybox stand-in",
    )
    parser.add_argument(
        "--gpus",
        choices=["agent", "static"],
        default="agent",
        help="GPUs reported by node agents over a fake NVML (default), or read from the inventory file",
    )
    parser.add_argument("--down", action="store_true", help="tear everything down")
    return parser


def _swarm_and_image(server: str) -> tuple[swarm_harness.Cluster, str, str]:
    """Steps 1 and 2: (the swarm, the server image, what the servers are, in words)."""
    _step(1, "Local swarm: a manager and workers gpu-a, gpu-b (first run: about a minute)")
    cluster = swarm_harness.up()
    if server == "jupyter":
        _step(2, "Server image: JupyterLab with jupyterhub-singleuser (first run: a few minutes; cached)")
        image = jupyter_image.ensure_on(cluster)
        return cluster, image, f"JupyterLab ({image})"
    _step(2, "Server image: the busybox stand-in")
    return cluster, swarm_harness.TEST_IMAGE, "stand-ins (busybox httpd showing NVIDIA_VISIBLE_DEVICES)"


def _issue_tokens(hub: Hub, hosts: list[str], token_dir: Path) -> None:
    """Each node's own agent token, issued by the hub (as `gpuspawner agent-token HOST`
    does) and written where the node's agent reads it. Issuing again rotates them."""
    tokens = {}
    for host in hosts:
        r = hub.api("POST", f"/gpuspawner/agent-tokens/{host}")
        if r.status_code != 200:
            raise HubError(f"issuing {host}'s agent token: {r.status_code} {r.text}")
        tokens[host] = r.json()["token"]
    agent_stack.write_tokens(token_dir, tokens)


def _agents(stack: contextlib.ExitStack, hub: Hub, cluster: swarm_harness.Cluster, state_dir: Path) -> None:
    """Step 4 with agents: the agent stack on the workers, each with a token of its
    own, until both have reported (at most 90 s)."""
    _step(4, "GPU agents: gpuspawner-agent on gpu-a and gpu-b (examples/agent-stack.yml, fake NVML)")
    lib_dir, gpus = _agent_files(state_dir)
    workers = ["gpu-a", "gpu-b"]
    _issue_tokens(hub, workers, state_dir / "agent-tokens")
    hub_api = f"http://{cluster.manager_addr}:{hub.port + 81}/"
    spec = agent_stack.local_stack(
        hub_api, lib_dir, str(gpus / "{{.Node.Hostname}}.txt"), cluster.image, state_dir / "agent-tokens", interval=5
    )
    labels = dict.fromkeys(workers, "true")
    agent_stack.deploy(cluster, spec, labels, state_dir)
    stack.callback(agent_stack.remove, cluster, labels)

    def known() -> set[str]:
        try:
            r = hub.api("GET", "/gpuspawner/alloc-map")
        except requests.RequestException as exc:
            raise HubError(f"the hub stopped answering: {exc}") from None
        if r.status_code != 200:
            raise HubError(f"the hub's GPU map answered {r.status_code}")
        return set(r.json())

    deadline = time.monotonic() + 90
    while known() != {"gpu-a", "gpu-b"} and time.monotonic() < deadline:
        time.sleep(1)
    print(f"   reported: {', '.join(sorted(known())) or 'nothing yet'}", flush=True)


def _reservation(hub: Hub, now: datetime) -> dict | None:
    """RESERVATION from OPENS_IN after ``now`` for LASTS, made through the hub's API; the one
    an earlier run made (the hub's ledger keeps it) is removed first. None where the hub
    refuses it (said why; the demo goes on without it)."""
    try:
        listed = hub.api("GET", "/gpuspawner/reservations")
        for old in listed.json()["reservations"] if listed.status_code == 200 else []:
            if (old["name"], old["group"]) == (RESERVATION["name"], RESERVATION["group"]):
                hub.api("DELETE", f"/gpuspawner/reservations/{old['id']}")
        start = (now + OPENS_IN + timedelta(minutes=1)).replace(second=0, microsecond=0)  # on the minute
        body = {**RESERVATION, "start": start.isoformat(), "end": (start + LASTS).isoformat()}
        made = hub.api("POST", "/gpuspawner/reservations", json=body)
    except requests.RequestException as exc:
        print(f"   no reservation: the hub did not answer ({exc})", flush=True)
        return None
    if made.status_code != 201:
        print(f"   no reservation: the hub answered {made.status_code} {made.text}", flush=True)
        return None
    return made.json()


def _to_try(hub_url: str, reservation: dict | None) -> str:
    """The banner's lines on what to try."""
    students = ", ".join(GROUPS["students"])
    lines = [
        f"Log in as alice, ask for a 0.2 share of the {SHARED}; then as bob, for 1.2.",
        f"  As admin, {hub_url}/hub/gpus then shows one at 0.80 (alice 0.2, bob 0.6), one at 0.60.",
        f"{students} is in the group students, which may have the {SHARED} only, 1 at most.",
    ]
    if reservation:
        start, end = (datetime.fromisoformat(reservation[k].replace("Z", "+00:00")) for k in ("start", "end"))
        members = ", ".join(GROUPS[reservation["group"]])
        lines += [
            f"The reservation {reservation['name']} opens at {start:%H:%M} UTC (until {end:%H:%M}): it keeps"
            f" {reservation['count']:g} {reservation['model']}",
            f"  for the group {reservation['group']} ({members}); others' forms then say so and count it off.",
        ]
    return "\n To try:" + "".join(f"\n   {line}" for line in lines) + "\n"


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    state_dir = args.state_dir.resolve()
    try:
        if args.down:
            return _down(state_dir)
        running = Hub(state_dir).leftover_pid()
        if running:
            print(f"The demo's JupyterHub already runs (pid {running}); `make demo-down` stops it.", file=sys.stderr)
            return 1
        Hub(state_dir).stop_leftover()  # a proxy left behind by a killed run
        cluster, image, servers = _swarm_and_image(args.server)
    except swarm_harness.HarnessError as exc:
        print(f"\nThe demo could not start: {exc}", file=sys.stderr)
        return 1

    _step(3, f"JupyterHub on http://127.0.0.1:{args.port}")
    env = {"GPUSPAWNER_DOCKER_URL": cluster.manager_url, "GPUSPAWNER_IMAGE": image}
    if args.gpus == "agent":
        env.update(GPUSPAWNER_INVENTORY_SOURCE="agent")
    hub = Hub(state_dir, port=args.port, extra_config=hub_config(), env=env)
    (state_dir / DOWN_MARK).unlink(missing_ok=True)
    try:
        hub.start()
    except HubError as exc:
        print(f"JupyterHub did not start: {exc}", file=sys.stderr)
        return 1
    # What is undone at the end (the agent stack): not after `make demo-down`, which
    # removes the swarm with everything on it (undoing it there fails, the swarm gone).
    with contextlib.ExitStack() as stack:
        if args.gpus == "agent":
            try:
                _agents(stack, hub, cluster, state_dir)
            except HubError as exc:
                hub.stop()
                if _stopped_by_down(hub):  # `make demo-down` while the agents were starting
                    stack.pop_all()
                    return 0
                print(f"The GPU agents could not start: {exc}", file=sys.stderr)
                return 1
        else:
            _step(4, f"GPUs from {INVENTORY.name} (no agents)")
        # Once the hub knows the reserved model (from the agents' reports).
        reservation = _reservation(hub, datetime.now(timezone.utc))
        status = _serve(hub, cluster, servers, args.gpus, _to_try(hub.url, reservation))
        if _down_requested(hub):
            stack.pop_all()
        return status


def _down_requested(hub: Hub) -> bool:
    return (hub.state_dir / DOWN_MARK).exists()


def _stopped_by_down(hub: Hub) -> bool:
    """Whether `make demo-down` asked the hub to stop (then said, and not an error)."""
    if not _down_requested(hub):
        return False
    print("\nJupyterHub was stopped by `make demo-down`.", flush=True)
    return True


def _serve(hub: Hub, cluster, servers: str, gpus: str, to_try: str = "") -> int:
    source = (
        "reported by gpuspawner-agent on each worker over a fake NVML, simulating" if gpus == "agent" else "read from"
    )
    print(
        f"""
================================================================================
 Open {hub.url}/ and log in with any user name and any password
 ("admin" is an admin).

 The spawn form offers the GPUs {source} {INVENTORY.relative_to(LOCAL_CONFIG.parents[2])}:
   {_gpu_summary()}
 Servers: {servers}.
 In a server's terminal, `echo $NVIDIA_VISIBLE_DEVICES` shows the GPUs it was given.
 Admins: {hub.url}/hub/gpus shows who holds which GPU.
{to_try}
 Hub log:         {hub.log_path}
 What runs where: DOCKER_HOST={cluster.manager_url} docker service ls

 Ctrl-C stops the hub (servers keep running); `make demo-down` removes everything.
================================================================================
""",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while hub.proc.poll() is None:
            time.sleep(1)
        if _stopped_by_down(hub):
            return 0
        print(f"JupyterHub exited:\n{hub.log_tail(20)}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit):
        print("\nStopping JupyterHub...", flush=True)
        return 0
    finally:
        hub.stop()


if __name__ == "__main__":
    sys.exit(main())
