"""The torch/torchvision pins of cluster.yaml, the Dockerfile, the Makefile and pyproject.toml
agree.

The Makefile installs the versions the tests run; cluster.yaml installs the same ones on every
node (the CPU wheel on the head, a CUDA wheel on the GPU workers); pyproject's lower bounds must
admit them. `pin_problems` reads the three files of a directory and lists every disagreement;
the last test edits one file of a copy at a time and requires a complaint each time.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
FILES = ("Makefile", "pyproject.toml", "cluster.yaml", "Dockerfile")
PACKAGES = ("torch", "torchvision")
INDEX = "https://download.pytorch.org/whl/"


def _makefile_pins(text: str) -> tuple[dict[str, str], list[str]]:
    lines = [line for line in text.splitlines()
             if line.startswith("REQUIREMENTS :=") and re.search(r"\btorch==", line)]
    if len(lines) != 1:
        return {}, [f"Makefile: expected one REQUIREMENTS line pinning torch, found "
                    f"{len(lines)}"]
    pins, problems = {}, []
    for pkg in PACKAGES:
        found = re.findall(rf"\b{pkg}==(\S+)", lines[0])
        if len(found) != 1:
            problems.append(f"Makefile: {pkg} pinned {len(found)} times on its REQUIREMENTS "
                            "line")
        else:
            pins[pkg] = found[0]
    return pins, problems


def _pyproject_specs(text: str) -> dict[str, str]:
    # tomllib is not in Python 3.10 (requires-python >= 3.10): read the dependency lines.
    return {pkg: m.group(1) for pkg in PACKAGES
            if (m := re.search(rf'^\s*"{pkg}\s*([<>=!~][^";]*)"', text, re.MULTILINE))}


def _node_pins(role: str, commands: list[str]) -> tuple[dict[str, set[str]], list[str]]:
    """Every torch/torchvision version named in one node type's commands, and its problems."""
    where = "Dockerfile" if role == "image" else f"cluster.yaml {role}"
    text = "\n".join(commands)
    found: dict[str, set[str]] = {pkg: set(re.findall(rf"\b{pkg}==(\S+)", text))
                                  for pkg in PACKAGES}
    # the "already installed?" guards and the GPU check compare a (torch, torchvision) pair
    for torch_v, vision_v in re.findall(r"== \('([^']+)', '([^']+)'\)", text):
        found["torch"].add(torch_v)
        found["torchvision"].add(vision_v)
    problems = []
    for pkg, versions in found.items():
        if len(versions) != 1:
            problems.append(f"{where}: {pkg} versions {sorted(versions)}, want one")
    pinned = {v for versions in found.values() for v in versions}
    # any other wheel version literal (e.g. in a message) must be one of the two pins
    for literal in set(re.findall(r"\b\d+\.\d+(?:\.\d+)?\+(?:cpu|cu\d+)\b", text)) - pinned:
        problems.append(f"{where}: {literal} is neither the torch nor the "
                        "torchvision pin")
    labels = {v.partition("+")[2] for v in pinned}
    indexes = set(re.findall(re.escape(INDEX) + r"(\w+)", text))
    if len(labels) != 1 or labels != indexes:
        problems.append(f"{where}: wheel builds {sorted(labels)} installed from "
                        f"indexes {sorted(indexes)}; want one build, from its own index")
    return found, problems


def pin_problems(root: Path) -> list[str]:
    make, problems = _makefile_pins((root / "Makefile").read_text())
    specs = _pyproject_specs((root / "pyproject.toml").read_text())
    cluster = yaml.safe_load((root / "cluster.yaml").read_text())
    common = cluster.get("setup_commands") or []
    roles = {"head": common + (cluster.get("head_setup_commands") or []),
             "workers": common + (cluster.get("worker_setup_commands") or []),
             # the workers' image bakes in what their setup would install
             "image": [(root / "Dockerfile").read_text()]}
    builds = {}
    for role, commands in roles.items():
        found, role_problems = _node_pins(role, commands)
        problems += role_problems
        builds[role] = {v.partition("+")[2] for versions in found.values() for v in versions}
        for pkg in PACKAGES:
            for version in found[pkg]:
                public = version.partition("+")[0]
                if pkg in make and public != make[pkg]:
                    where = "Dockerfile" if role == "image" else f"cluster.yaml {role}"
                    problems.append(f"{where}: {pkg}=={version} differs from "
                                    f"the Makefile's {pkg}=={make[pkg]}")
    if builds["head"] != {"cpu"}:
        problems.append(f"cluster.yaml head: builds {sorted(builds['head'])}, want the CPU one")
    if not all(re.fullmatch(r"cu\d+", b) for b in builds["workers"]) or not builds["workers"]:
        problems.append(f"cluster.yaml workers: builds {sorted(builds['workers'])}, want CUDA")
    if builds["image"] != builds["workers"]:
        problems.append(f"Dockerfile: builds {sorted(builds['image'])}, want the workers' "
                        f"{sorted(builds['workers'])}")
    for pkg in PACKAGES:
        if pkg not in specs:
            problems.append(f"pyproject.toml: no {pkg} requirement")
        elif pkg in make and not SpecifierSet(specs[pkg]).contains(make[pkg]):
            problems.append(f"pyproject.toml: {pkg}{specs[pkg]} excludes the pinned "
                            f"{make[pkg]}")
    return problems


def test_pins_agree_in_cluster_yaml_makefile_and_pyproject():
    assert pin_problems(ROOT) == []


def test_the_pins_are_where_the_checker_looks():
    make, _ = _makefile_pins((ROOT / "Makefile").read_text())
    assert set(make) == set(PACKAGES)
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    head, _ = _node_pins("head", cluster["head_setup_commands"])
    workers, _ = _node_pins("workers", cluster["worker_setup_commands"])
    for pkg in PACKAGES:
        assert head[pkg] == {f"{make[pkg]}+cpu"}
        assert len(workers[pkg]) == 1 and next(iter(workers[pkg])).startswith(f"{make[pkg]}+cu")


def _sub_first(old: str, new: str):
    return lambda text: text.replace(old, new, 1)


def _sub_all(old: str, new: str):
    return lambda text: text.replace(old, new)


@pytest.mark.parametrize("name, edit", [
    ("Makefile", _sub_first("torch==2.14.1", "torch==2.14.2")),
    ("Makefile", _sub_first("torchvision==0.29.1", "torchvision==0.29.2")),
    ("cluster.yaml", _sub_first("torch==2.14.1+cu130", "torch==2.14.2+cu130")),  # one of several
    ("cluster.yaml", _sub_all("2.14.1", "2.14.2")),  # the whole file, consistently
    ("cluster.yaml", _sub_all("0.29.1", "0.30.0")),
    ("cluster.yaml", _sub_first("('2.14.1+cpu', '0.29.1+cpu')", "('2.14.2+cpu', '0.29.1+cpu')")),
    ("cluster.yaml", _sub_first("--index-url https://download.pytorch.org/whl/cu130",
                                "--index-url https://download.pytorch.org/whl/cu128")),
    ("cluster.yaml", _sub_all("+cpu", "+cu130")),  # CUDA wheels on the head
    ("Dockerfile", _sub_first("torch==2.14.1+cu130", "torch==2.14.2+cu130")),
    ("pyproject.toml", _sub_first('"torch>=2.3"', '"torch>=2.15"')),
    ("pyproject.toml", _sub_first('"torchvision>=0.18"', '"torchvision>=0.30"')),
], ids=["makefile-torch", "makefile-torchvision", "cluster-one-occurrence", "cluster-all-torch",
        "cluster-all-torchvision", "cluster-head-guard", "cluster-worker-index",
        "cluster-cuda-on-head", "dockerfile-torch", "pyproject-torch-bound",
        "pyproject-torchvision-bound"])
def test_editing_one_file_alone_is_caught(tmp_path, name, edit):
    for file in FILES:
        shutil.copy(ROOT / file, tmp_path / file)
    assert pin_problems(tmp_path) == []
    before = (tmp_path / name).read_text()
    after = edit(before)
    assert after != before, "the edit no longer matches the file: update this test"
    (tmp_path / name).write_text(after)
    assert pin_problems(tmp_path), f"editing {name} alone went unnoticed"
