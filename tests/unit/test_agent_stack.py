"""examples/agent-stack.yml: a stack file swarm accepts, running a command the agent accepts."""

from pathlib import Path

import yaml

from gpuspawner.agent.command import HOSTNAME_ENV, build_parser
from gpuspawner.agent.hub import TOKEN_FILE_ENV, report_url

STACK = Path(__file__).resolve().parents[2] / "examples" / "agent-stack.yml"


def load():
    return yaml.safe_load(STACK.read_text())


def test_the_stack_runs_one_agent_on_each_labelled_gpu_node_on_the_host_network():
    stack = load()
    [(name, service)] = stack["services"].items()
    deploy = service["deploy"]
    assert deploy["mode"] == "global"
    assert deploy["placement"]["constraints"] == ["node.labels.gpu == true"]
    assert deploy["restart_policy"]["condition"] == "on-failure"
    env = service["environment"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert env[HOSTNAME_ENV] == "{{.Node.Hostname}}"  # swarm fills templates in env
    [net] = service["networks"]
    assert stack["networks"][net] == {"external": True, "name": "host"}
    assert "secrets" not in service and "secrets" not in stack  # one for all tasks: not per node


def test_the_stacks_command_line_is_accepted_by_the_agent():
    stack = load()
    [service] = stack["services"].values()
    command = service["command"]
    assert command[0] == "gpuspawner-agent"
    args = build_parser().parse_args(command[1:])
    assert args.command == "run"
    assert args.token_file is None  # left to the environment's template
    path = service["environment"][TOKEN_FILE_ENV]
    assert path == "/run/gpuspawner/agent-tokens/{{.Node.Hostname}}"
    [token] = [v for v in service["volumes"] if isinstance(v, dict) and v["target"] == str(Path(path).parent)]
    # Each node's own token, from a file on that node named by a swarm template; its
    # folder is mounted, so that a file replaced by a new one is seen.
    assert token == {
        "type": "bind",
        "source": "/etc/gpuspawner/agent-tokens",
        "target": "/run/gpuspawner/agent-tokens",
        "read_only": True,
    }
    assert report_url(args.hub_url).endswith("/hub/api/gpuspawner/report")
    assert args.hostname is None  # left to the environment's template
    assert args.interval == 15


def test_the_stack_lets_the_agent_trace_gpu_processes_to_their_containers():
    [service] = load()["services"].values()
    args = build_parser().parse_args(service["command"][1:])
    assert args.proc_root == "/host/proc"
    assert "/proc:/host/proc:ro" in service["volumes"]
    assert f"{args.docker_socket}:{args.docker_socket}:ro" in service["volumes"]
