"""examples/agent-stack.yml on the test swarm, with this machine's stand-ins.

What the test machine lacks is swapped in, and only that: the test image (busybox)
with this machine's Python and the repository bind-mounted instead of an image with
gpuspawner, and the fake libnvidia-ml.so.1 instead of the NVIDIA runtime's. The nodes'
token files live in a folder of the caller's instead of /etc/gpuspawner/agent-tokens
(the workers share this machine's file system, so each run keeps its own). The rest
is the stack file as users get it: a global service placed by a node label, the host
network, the tokens' folder bind-mounted and each node's own file in it named through
a swarm template (``GPUSPAWNER_AGENT_TOKEN_FILE``, ``{{.Node.Hostname}}``), the node's
hostname through the same template.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STACK = REPO / "examples" / "agent-stack.yml"
STACK_NAME = "gpuspawner-agent-test"
TOKEN_SOURCE = "/etc/gpuspawner/agent-tokens"  # the tokens' folder, as the example stack has it


def docker(swarm, *args, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", **swarm.env()},
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def set_gpu_label(swarm, hostname: str, value: str | None) -> None:
    node = next(n for n in swarm.client().nodes.list() if n.attrs["Description"]["Hostname"] == hostname)
    spec = node.attrs["Spec"]
    labels = dict(spec.get("Labels") or {})
    if value is None:
        labels.pop("gpu", None)
    else:
        labels["gpu"] = value
    node.update(dict(spec, Labels=labels))


def local_stack(
    hub_url: str,
    lib_dir: Path,
    devices: str,
    image: str,
    token_dir: Path,
    interval: float = 1,
    docker_sockets: str | None = None,
    args: tuple[str, ...] = (),
) -> dict:
    """The example stack with this machine's stand-ins for the image and the driver,
    the nodes' tokens read from ``token_dir/HOSTNAME`` (see :func:`write_tokens`).
    ``devices`` may use swarm templates, e.g. ``/x/{{.Node.Hostname}}.txt``; so may
    ``docker_sockets``, each node's own dockerd socket (the test nodes' daemons do not
    listen on /var/run/docker.sock); None: no socket, processes go unattributed.
    ``args``: more of the agent's options."""
    stack = yaml.safe_load(STACK.read_text())
    [service] = stack["services"].values()
    service["image"] = image
    [token] = [v for v in service["volumes"] if isinstance(v, dict) and v.get("source") == TOKEN_SOURCE]
    folder = str(Path(devices).parent)
    mounts = {"/usr", "/lib", "/lib64", sys.base_prefix, sys.prefix, str(REPO), str(lib_dir), folder}
    [sock] = [v for v in service["volumes"] if isinstance(v, str) and v.endswith("docker.sock:ro")]
    service["volumes"] = (
        [{"type": "bind", "source": m, "target": m, "read_only": True} for m in sorted(mounts) if Path(m).exists()]
        + [dict(token, source=str(token_dir))]
        + [v for v in service["volumes"] if isinstance(v, str) and v.startswith("/proc:")]
    )
    if docker_sockets is not None:
        target = sock.split(":")[1]
        service["volumes"].append({"type": "bind", "source": docker_sockets, "target": target, "read_only": True})
    # Live readings: a test changes a node's file while its agent runs.
    service["environment"].update(
        LD_LIBRARY_PATH=str(lib_dir), FAKE_NVML_DEVICES=devices, FAKE_NVML_WATCH="1", PYTHONPATH=str(REPO)
    )
    command = service["command"]
    assert command[0] == "gpuspawner-agent"
    command[:1] = [sys.executable, "-m", "gpuspawner.agent.command"]
    command[command.index("--hub-url") + 1] = hub_url
    command[command.index("--interval") + 1] = str(interval)
    command += list(args)
    return stack


def write_tokens(token_dir: Path, tokens: dict[str, str]) -> None:
    """Each node's token in ``token_dir/HOSTNAME``, readable by root only, as an admin
    installs it in /etc/gpuspawner/agent-tokens on each node (docs/agent.md)."""
    token_dir.mkdir(parents=True, exist_ok=True)
    for hostname, token in tokens.items():
        path = token_dir / hostname
        path.touch(mode=0o600)
        path.write_text(token + "\n")


def deploy(swarm, stack: dict, labels: dict[str, str], workdir: Path) -> None:
    """Deploy the stack with these gpu= node labels (the tokens written beforehand);
    :func:`remove` undoes it (done here when the deploy fails)."""
    stack_file = workdir / "agent-stack.yml"
    stack_file.write_text(yaml.safe_dump(stack))
    docker(swarm, "stack", "rm", STACK_NAME, check=False)
    for hostname, value in labels.items():
        set_gpu_label(swarm, hostname, value)
    try:
        docker(swarm, "stack", "deploy", "-c", str(stack_file), STACK_NAME)
    except BaseException:
        remove(swarm, labels)
        raise


def remove(swarm, labels: dict[str, str]) -> None:
    """Remove the stack and the nodes' gpu= labels."""
    docker(swarm, "stack", "rm", STACK_NAME, check=False)
    for hostname in labels:
        set_gpu_label(swarm, hostname, None)


@contextlib.contextmanager
def deployed(swarm, stack: dict, labels: dict[str, str], workdir: Path):
    """The stack deployed with these gpu= node labels for the block (see :func:`deploy`)."""
    deploy(swarm, stack, labels, workdir)
    try:
        yield
    finally:
        remove(swarm, labels)
