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
