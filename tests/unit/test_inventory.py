"""gpuspawner.core.inventory: loading a static inventory, and the errors for bad ones.

Every malformed inventory must raise InventoryError whose message names where
it came from (the file path, or "gpu_inventory (dict)") and what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuspawner.allocator.allocator import Allocator, Request
from gpuspawner.core.inventory import GPU, InventoryError, parse_inventory
from gpuspawner.core.inventory_files import load_inventory

GTX = "NVIDIA GeForce GTX 1070"
A100 = "NVIDIA A100 80GB PCIe"

SPEC = {
    "gpu-b": [
        {"uuid": "GPU-b0c1d2e3-0000-4000-8000-000000000001", "model": A100, "memory_mib": 81920},
        {"uuid": "MIG-b0c1d2e3-0000-4000-8000-000000000002", "model": f"  {A100} ", "memory_mib": 40960},
    ],
    "gpu-a": [
        {"uuid": "GPU-a0c1d2e3-0000-4000-8000-000000000003", "model": GTX, "memory_mib": 8192, "index": 1},
        {"uuid": "GPU-a0c1d2e3-0000-4000-8000-000000000004", "model": GTX, "memory_mib": 8192, "index": 0},
    ],
}

EXPECTED = [
    GPU("gpu-a", 0, "GPU-a0c1d2e3-0000-4000-8000-000000000004", GTX, 8192),
    GPU("gpu-a", 1, "GPU-a0c1d2e3-0000-4000-8000-000000000003", GTX, 8192),
    GPU("gpu-b", 0, "GPU-b0c1d2e3-0000-4000-8000-000000000001", A100, 81920),
    GPU("gpu-b", 1, "MIG-b0c1d2e3-0000-4000-8000-000000000002", A100, 40960),
]

YAML_TEXT = f"""\
# two nodes
gpu-b:
  - {{uuid: GPU-b0c1d2e3-0000-4000-8000-000000000001, model: {A100}, memory_mib: 81920}}
  - uuid: MIG-b0c1d2e3-0000-4000-8000-000000000002
    model: "  {A100} "
    memory_mib: 40960
gpu-a:
  - {{uuid: GPU-a0c1d2e3-0000-4000-8000-000000000003, model: {GTX}, memory_mib: 8192, index: 1}}
  - {{uuid: GPU-a0c1d2e3-0000-4000-8000-000000000004, model: {GTX}, memory_mib: 8192, index: 0}}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------
# Valid inventories
# --------------------------------------------------------------------------


def test_from_a_dict():
    gpus = load_inventory(SPEC)
    assert gpus == EXPECTED  # sorted by host, then index; model stripped; index defaults to position


def test_from_a_yaml_file(tmp_path):
    """Guards docs/nodes.md, "A static inventory (the alternative)": "list each node's GPUs in an
    inventory file"."""
    assert load_inventory(str(write(tmp_path, "gpus.yaml", YAML_TEXT))) == EXPECTED


def test_from_a_json_file(tmp_path):
    assert load_inventory(write(tmp_path, "gpus.json", json.dumps(SPEC))) == EXPECTED  # a Path works too


def test_json_text_in_a_yaml_named_file(tmp_path):
    assert load_inventory(write(tmp_path, "gpus.yml", json.dumps(SPEC, indent=2))) == EXPECTED


def test_a_loaded_inventory_feeds_the_allocator(tmp_path):
    alloc = Allocator(load_inventory(write(tmp_path, "gpus.yaml", YAML_TEXT)), "pack")
    got = alloc.allocate("s", Request(GTX, 2))
    assert got.host == "gpu-a"
    assert got.uuids == ("GPU-a0c1d2e3-0000-4000-8000-000000000004", "GPU-a0c1d2e3-0000-4000-8000-000000000003")


# --------------------------------------------------------------------------
# Malformed inventories, from a YAML file: (file text, the problem the message names)
# --------------------------------------------------------------------------

DEV = f"model: {GTX}, memory_mib: 8192"

MALFORMED = {
    "not a mapping": ("- gpu-a\n- gpu-b\n", "expected a mapping of hostname to a list of GPUs, got list"),
    "a plain string": ("just some text\n", "expected a mapping of hostname to a list of GPUs, got str"),
    "empty file": ("", "expected a mapping of hostname to a list of GPUs, got nothing"),
    "empty mapping": ("{}\n", "expected a mapping of hostname to a list of GPUs, got nothing"),
    "host is not a list": ("gpu-a: {uuid: GPU-1, model: X, memory_mib: 1}\n", "gpu-a: expected a list of GPUs"),
    "device is not a mapping": ("gpu-a: [GPU-1]\n", "gpu-a[0]: expected a mapping with uuid, model, memory_mib"),
    "missing uuid": (f"gpu-a:\n  - {{{DEV}}}\n", "gpu-a[0]: missing 'uuid'"),
    "missing model": ("gpu-a:\n  - {uuid: GPU-1, memory_mib: 8192}\n", "gpu-a[0]: missing 'model'"),
    "missing memory_mib": (
        f"gpu-a:\n  - {{uuid: GPU-1, {DEV}}}\n  - {{uuid: GPU-2, model: {GTX}}}\n",
        "gpu-a[1]: missing 'memory_mib'",
    ),
    "bad uuid": (
        f"gpu-a:\n  - {{uuid: 1234-5678, {DEV}}}\n",
        "gpu-a[0]: uuid '1234-5678' is not a GPU-… or MIG-… UUID",
    ),
    "uuid smuggling syntax": (
        f"gpu-a:\n  - {{uuid: 'GPU-1,GPU-2 ; reboot', {DEV}}}\n",
        "uuid 'GPU-1,GPU-2 ; reboot' is not a GPU-… or MIG-… UUID",
    ),
    "uuid is a number": (f"gpu-a:\n  - {{uuid: 12345, {DEV}}}\n", "uuid 12345 is not a GPU-… or MIG-… UUID"),
    "negative memory": (
        f"gpu-a:\n  - {{uuid: GPU-1, model: {GTX}, memory_mib: -1}}\n",
        "gpu-a[0]: memory_mib must be a positive integer, got -1",
    ),
    "zero memory": (f"gpu-a:\n  - {{uuid: GPU-1, model: {GTX}, memory_mib: 0}}\n", "positive integer, got 0"),
    "memory with a unit": (
        f"gpu-a:\n  - {{uuid: GPU-1, model: {GTX}, memory_mib: 8 GiB}}\n",
        "memory_mib must be a positive integer, got '8 GiB'",
    ),
    "memory is a boolean": (f"gpu-a:\n  - {{uuid: GPU-1, model: {GTX}, memory_mib: true}}\n", "got True"),
    "negative index": (
        f"gpu-a:\n  - {{uuid: GPU-1, {DEV}, index: -1}}\n",
        "gpu-a[0]: index must be a non-negative integer, got -1",
    ),
    "duplicate uuid across hosts": (
        f"gpu-a:\n  - {{uuid: GPU-dup, {DEV}}}\ngpu-b:\n  - {{uuid: GPU-dup, {DEV}}}\n",
        "gpu-b[0]: uuid GPU-dup is listed twice (also on gpu-a)",
    ),
    "duplicate index": (
        f"gpu-a:\n  - {{uuid: GPU-1, {DEV}}}\n  - {{uuid: GPU-2, {DEV}, index: 0}}\n",
        "gpu-a[1]: index 0 is listed twice on gpu-a",
    ),
    "unknown key": (
        f"gpu-a:\n  - {{uuid: GPU-1, {DEV}, mem_gb: 8, Index: 0}}\n",
        "gpu-a[0]: unknown key(s) Index, mem_gb",
    ),
    "hostname with a space": (f"gpu a:\n  - {{uuid: GPU-1, {DEV}}}\n", "'gpu a' is not a valid hostname"),
    "hostname with shell syntax": (
        f"'gpu;rm -rf':\n  - {{uuid: GPU-1, {DEV}}}\n",
        "'gpu;rm -rf' is not a valid hostname",
    ),
    "hostname starting with a dash": (f"-gpu:\n  - {{uuid: GPU-1, {DEV}}}\n", "'-gpu' is not a valid hostname"),
    "hostname is a number": (f"42:\n  - {{uuid: GPU-1, {DEV}}}\n", "42 is not a valid hostname"),
    "model with markup": (
        "gpu-a:\n  - {uuid: GPU-1, model: '<b>GTX</b>', memory_mib: 8192}\n",
        "gpu-a[0]: model '<b>GTX</b>' is not a plain model name",
    ),
    "YAML syntax error": ("gpu-a:\n  - {uuid: GPU-1, model: [\n", "not valid YAML/JSON"),
}


@pytest.mark.parametrize("text, problem", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_yaml_names_the_file_and_the_problem(tmp_path, text, problem):
    path = write(tmp_path, "gpus.yaml", text)
    with pytest.raises(InventoryError) as info:
        load_inventory(str(path))
    message = str(info.value)
    assert message.startswith(f"GPU inventory {path}: "), message
    assert problem in message


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    path = write(tmp_path, "gpus.yaml", "gpu-a:\n  - {uuid: GPU-1, model: [\n")
    with pytest.raises(InventoryError, match=r"(?s)not valid YAML/JSON: .*line \d+, column \d+") as info:
        load_inventory(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)  # callers may catch ValueError


def test_json_syntax_error(tmp_path):
    path = write(tmp_path, "gpus.json", '{"gpu-a": [}')
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value).startswith(f"GPU inventory {path}: not valid YAML/JSON: ")
    assert "line 1 column 12" in str(info.value)


def test_malformed_json_file_content(tmp_path):
    path = write(tmp_path, "gpus.json", json.dumps({"gpu-a": [{"uuid": "GPU-1", "model": GTX, "memory_mib": -5}]}))
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value) == f"GPU inventory {path}: gpu-a[0]: memory_mib must be a positive integer, got -5"


@pytest.mark.parametrize("kind, reason", [("missing", "No such file or directory"), ("directory", "Is a directory")])
def test_unreadable_path(tmp_path, kind, reason):
    path = tmp_path / "nope.yaml" if kind == "missing" else tmp_path
    with pytest.raises(InventoryError) as info:
        load_inventory(str(path))
    assert str(info.value) == f"GPU inventory {path}: cannot read it ({reason})"


@pytest.mark.parametrize(
    "spec, problem",
    [
        ([], "expected a mapping of hostname to a list of GPUs, got nothing"),
        ({"gpu-a": [{"uuid": "GPU-1", "model": GTX}]}, "gpu-a[0]: missing 'memory_mib'"),
        ({"gpu-a": [{"uuid": "GPU-1", "model": GTX, "memory_mib": 1.5}]}, "positive integer, got 1.5"),
        ({"gpu-a": [{"uuid": "GPU-1", "model": GTX, "memory_mib": 1, "index": True}]}, "got True"),
        ({"bad host": []}, "'bad host' is not a valid hostname"),
    ],
    ids=["empty list", "missing memory", "float memory", "boolean index", "bad hostname"],
)
def test_malformed_dict_names_the_dict(spec, problem):
    with pytest.raises(InventoryError) as info:
        load_inventory(spec) if isinstance(spec, dict) else parse_inventory(spec, source="gpu_inventory (dict)")
    assert str(info.value).startswith("gpu_inventory (dict): ")
    assert problem in str(info.value)


# --------------------------------------------------------------------------
# Edge cases: each of these was a bug once
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        f'"gpu-a\\n":\n  - {{uuid: GPU-1, {DEV}}}\n',  # quoted key with a newline
        f"gpu-a:\n  - uuid: |\n      GPU-1\n    model: {GTX}\n    memory_mib: 8192\n",  # block scalar keeps the newline
    ],
    ids=["hostname", "uuid"],
)
def test_trailing_newline_is_rejected(tmp_path, text):
    path = write(tmp_path, "gpus.yaml", text)
    try:
        gpus = load_inventory(path)
    except InventoryError:
        return
    raise AssertionError(f"accepted {gpus!r}: a newline would reach the swarm constraint / NVIDIA_VISIBLE_DEVICES")


def test_host_listed_twice_in_yaml_is_an_error(tmp_path):
    path = write(tmp_path, "gpus.yaml", f"gpu-a:\n  - {{uuid: GPU-1, {DEV}}}\ngpu-a:\n  - {{uuid: GPU-2, {DEV}}}\n")
    try:
        gpus = load_inventory(path)
    except InventoryError as e:
        assert str(path) in str(e) and "gpu-a" in str(e)
        return
    raise AssertionError(f"loaded {[g.uuid for g in gpus]}, GPU-1 was dropped without a word")
