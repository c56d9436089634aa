"""cluster.yaml against Ray's own autoscaler schema, offline (no AWS call, no credentials).

`prepare_config` only merges Ray's AWS defaults file and fills per-type min/max workers;
`validate_config` checks the JSON schema (unknown keys, wrong types) and Ray's own rules.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _validate(config: dict) -> dict:
    # cluster.yaml as `ray up` checks it, offline: Ray's AWS defaults merged in, then its
    # schema and rules (ray.autoscaler._private.util: Ray has no public offline validator).
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_schema(cluster):
    prepared = _validate(cluster)
    types = prepared["available_node_types"]
    assert prepared["provider"]["type"] == "aws"
    head = types[prepared["head_node_type"]]
    assert not head["node_config"]["InstanceType"].startswith(("g", "p"))  # a CPU head
    gpu_types = {name: t for name, t in types.items() if name != prepared["head_node_type"]}
    instances = {t["node_config"]["InstanceType"] for t in gpu_types.values()}
    assert {"g5.xlarge", "g5.12xlarge"} <= instances  # one single-GPU and one 4-GPU type
    for t in gpu_types.values():
        assert t["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
        assert 0 <= t["min_workers"] <= t["max_workers"] <= prepared["max_workers"]
    assert "~/unbiased-mi" in prepared["file_mounts"]
    assert any("pip install" in c and "-e ~/unbiased-mi" in c
               for c in prepared["worker_setup_commands"])


def test_image_matches_the_ray_pin_of_pyproject(cluster):
    import ray

    # pyproject pins "ray[tune]>=X.Y,<..." (tomllib is not in Python 3.10: read the line)
    low = re.search(r'"ray\[tune\]>=(\d+\.\d+)', (ROOT / "pyproject.toml").read_text()).group(1)
    for key in ("image", "head_image"):
        tag = cluster["docker"][key].split(":")[1]
        assert tag.startswith(f"{ray.__version__}-py311"), tag
        assert ray.__version__.startswith(low)
    assert cluster["docker"]["image"].endswith("-gpu") or "-cu" in cluster["docker"]["image"]


def test_results_location_is_set_once(cluster):
    from sweeps.cli import STORAGE_ENV

    text = (ROOT / "cluster.yaml").read_text()
    uris = re.findall(r"s3://[^\s'\"]+", text)
    assert len(set(uris)) == 1
    options = " ".join(cluster["docker"]["run_options"])
    assert f"{STORAGE_ENV}={uris[0]}" in options


@pytest.mark.parametrize("mutate", [
    lambda c: c.update(max_worker=4),  # typo of a top-level key
    lambda c: c.update(max_workers="twelve"),  # wrong type
    lambda c: c["docker"].update(imgae="rayproject/ray:2.58.1-py311-gpu"),  # typo inside docker
    lambda c: c["available_node_types"]["gpu_1x"].update(min_worker=1),  # typo in a node type
    lambda c: c.update(head_node_type="nope"),  # head type not defined
], ids=["top-level-typo", "wrong-type", "docker-typo", "node-type-typo", "unknown-head"])
def test_a_typo_fails_validation(cluster, mutate):
    broken = copy.deepcopy(cluster)
    mutate(broken)
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        _validate(broken)


def test_gpu_nodes_name_one_ami_and_the_head_stops_on_its_placeholder(cluster):
    # Ray's default AMI (filled in when ImageId is "" or "latest_dlami") has an unknown driver;
    # the cu130 torch wheel needs >= 580. Both GPU types read one ImageId (a YAML anchor).
    prepared = _validate(cluster)
    gpu = [t for name, t in prepared["available_node_types"].items()
           if name != prepared["head_node_type"]]
    amis = {t["node_config"].get("ImageId", "") for t in gpu}
    assert len(amis) == 1 and amis.pop().lower() not in ("", "latest_dlami")
    guard = [c for c in prepared["head_setup_commands"] if "CHANGE-ME" in c and "ImageId" in c]
    assert len(guard) == 1 and "sys.exit(" in guard[0]


def test_torch_is_installed_pinned_before_the_project_on_every_node(cluster):
    prepared = _validate(cluster)
    assert not prepared.get("setup_commands")  # a common command would run before the pins
    # the workers' build: $TORCH_CUDA, set on their containers (tests/test_torch_pins.py)
    (env,) = [o for o in prepared["docker"]["worker_run_options"] if "TORCH_CUDA=" in o]
    worker_build = env.partition("TORCH_CUDA=")[2]
    for role, build in (("head", "cpu"), ("worker", "cu")):
        commands = [c.replace("$TORCH_CUDA", worker_build)
                    for c in prepared[f"{role}_setup_commands"]]
        torch_at = [i for i, c in enumerate(commands) if "--index-url" in c and "torch==" in c]
        project_at = [i for i, c in enumerate(commands) if "-e ~/unbiased-mi" in c]
        assert len(torch_at) == 1 and len(project_at) == 1 and torch_at[0] < project_at[0]
        # installed once: skipped when the pinned versions import already
        assert re.match(r'python -c ".*__version__.*" 2>/dev/null \|\| pip install ',
                        commands[torch_at[0]])
        assert f"download.pytorch.org/whl/{build}" in commands[torch_at[0]]
        # the project's install names the same pins, so pip keeps them
        pins = sorted(re.findall(r"\btorch(?:vision)?==\S+", commands[torch_at[0]]))
        assert pins and pins == sorted(re.findall(r"\btorch(?:vision)?==\S+",
                                                  commands[project_at[0]]))
    assert not any("+cu" in c or "whl/cu" in c for c in prepared["head_setup_commands"])
    # a GPU worker whose torch cannot see the GPU fails its setup, saying why
    check = prepared["worker_setup_commands"][-1]
    assert "torch.cuda.is_available()" in check and "nvidia-smi" in check
    assert "torch.version.cuda" in check and "sys.exit(" in check
    assert "!" not in check  # Ray runs setup in `bash -i`: "!" would be history expansion
