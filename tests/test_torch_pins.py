"""The torch/torchvision pins of cluster.yaml, the Dockerfile, the Makefile and pyproject.toml
agree, and so does the choice of torch's build (TORCH_CUDA) in the first three.

The Makefile installs the versions the tests run; cluster.yaml installs the same ones on every
node (the CPU wheel on the head, a CUDA wheel on the GPU workers); pyproject's lower bounds must
admit them. TORCH_CUDA picks the build (tools/torch_builds.txt lists them, the one list): the
Makefile's variable (unset: PyPI's torch), the Dockerfile's ARG and the GPU workers' `--env
TORCH_CUDA=...` (docker.worker_run_options), each checked by tools/torch_build.sh before it
installs. `pin_problems` reads the files of a directory, asks `make -n` what the Makefile would
run for every build, and lists every disagreement; `test_editing_one_file_alone_is_caught` edits
one file of a copy at a time and requires a complaint each time. Nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
BUILDS_FILE = "tools/torch_builds.txt"
CHECK_SCRIPT = "tools/torch_build.sh"
# what pin_problems reads, and what `make -n .venv/.installed` needs beside the Makefile
FILES = ("Makefile", "pyproject.toml", "cluster.yaml", "Dockerfile", BUILDS_FILE, CHECK_SCRIPT,
         "tools/ray_default_extras.py", "tools/python_check.sh")
PACKAGES = ("torch", "torchvision")
INDEX = "https://download.pytorch.org/whl/"
VARIABLE = re.compile(r"\$\{?TORCH_CUDA\}?")  # $TORCH_CUDA or ${TORCH_CUDA}, as a shell reads it
UNLISTED = "cu0"  # a build no list will have


def _makefile_pins(text: str) -> tuple[dict[str, str], list[str]]:
    lines = [line for line in text.splitlines()
             if line.startswith("REQUIREMENTS :=") and re.search(r"\btorch==", line)]
    if len(lines) != 1:
        return {}, [f"Makefile: expected one REQUIREMENTS line pinning torch, found "
                    f"{len(lines)}"]
    pins, problems = {}, []
    for pkg in PACKAGES:
        found = re.findall(rf"\b{pkg}==(\S+?)(?:\$\(TORCH_BUILD\))?(?:\s|$)", lines[0])
        if len(found) != 1:
            problems.append(f"Makefile: {pkg} pinned {len(found)} times on its REQUIREMENTS "
                            "line")
        else:
            pins[pkg] = found[0]
    return pins, problems


def torch_builds(text: str) -> list[str]:
    """The builds of tools/torch_builds.txt: each line's first word, but comments."""
    return [line.split()[0] for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _builds_problems(builds: list[str]) -> list[str]:
    problems = [f"{BUILDS_FILE}: {b!r} is not a wheel index's name (cpu, cuNNN)"
                for b in builds if not re.fullmatch(r"cpu|cu\d{3}", b)]
    if len(set(builds)) != len(builds):
        problems.append(f"{BUILDS_FILE}: a build listed twice: {builds}")
    # the Makefile's default is PyPI's torch, the CUDA 13.0 build: it must be namable too
    if "cu130" not in builds:
        problems.append(f"{BUILDS_FILE}: no cu130 (PyPI's default torch, the Makefile's default)")
    if not any(re.fullmatch(r"cu12\d", b) for b in builds):
        problems.append(f"{BUILDS_FILE}: no CUDA 12 build (drivers older than 580)")
    return problems


def _make(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`make -n -B` in root: the commands the Makefile would run, none run."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-n", "-B", "-C", str(root), "--no-print-directory", *args],
                          capture_output=True, text=True, env=env, timeout=60)


def _make_problems(root: Path, make: dict[str, str], builds: list[str]) -> list[str]:
    """What `make .venv/.installed` would install, unset and with each build, and a refusal."""
    problems = []
    for build in [None, *builds]:
        name = f"TORCH_CUDA={build}" if build else "TORCH_CUDA unset"
        run = _make(root, ".venv/.installed", *([f"TORCH_CUDA={build}"] if build else []))
        if run.returncode != 0:
            problems.append(f"Makefile, {name}: make -n fails: {run.stderr.strip()}")
            continue
        installs = [line for line in run.stdout.splitlines() if re.search(r"\btorch==", line)]
        if len(installs) != 2:  # uv's, and pip's where uv cannot be had
            problems.append(f"Makefile, {name}: {len(installs)} install lines name torch, want 2")
        for line in installs:
            found = {pkg: re.findall(rf"\b{pkg}==(\S+)", line) for pkg in PACKAGES}
            want = {pkg: [make[pkg] + (f"+{build}" if build else "")] for pkg in make}
            indexes = re.findall(re.escape(INDEX) + r"(\w+)", line)
            if found != want or indexes != ([build] if build else []):
                problems.append(f"Makefile, {name}: installs {found} from {indexes or 'PyPI'}, "
                                f"want {want} from {build or 'PyPI'}")
    run = _make(root, ".venv/.installed", f"TORCH_CUDA={UNLISTED}")
    lines = run.stderr.strip().splitlines()
    if (run.returncode != 2 or run.stdout.strip() or len(lines) != 1
            or f"error: TORCH_CUDA={UNLISTED} " not in lines[0]
            or not all(b in lines[0] for b in builds)):
        problems.append(f"Makefile: TORCH_CUDA={UNLISTED} gives exit {run.returncode}, "
                        f"{run.stdout.strip()!r}, {run.stderr.strip()!r}; want one error line "
                        "naming the builds, exit 2, no command")
    return problems


def _default_build(where: str, text: str, pattern: str, builds: list[str]
                   ) -> tuple[str | None, list[str]]:
    found = re.findall(pattern, text, re.MULTILINE)
    if len(found) != 1:
        return None, [f"{where}: {len(found)} defaults of TORCH_CUDA, want one"]
    if found[0] not in builds:
        return found[0], [f"{where}: TORCH_CUDA={found[0]} is not in {BUILDS_FILE}"]
    return found[0], []


def _checked_first(where: str, text: str) -> list[str]:
    """tools/torch_build.sh checks $TORCH_CUDA before anything is installed."""
    check = re.search(r'torch_build\.sh "\$TORCH_CUDA"', text)
    install = text.find("pip install")
    if not check or install < check.start():
        return [f"{where}: installs before tools/torch_build.sh checks \"$TORCH_CUDA\""]
    return []


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
    builds = torch_builds((root / BUILDS_FILE).read_text())
    problems += _builds_problems(builds)
    if len(make) == len(PACKAGES):
        problems += _make_problems(root, make, builds)
    cluster = yaml.safe_load((root / "cluster.yaml").read_text())
    dockerfile = (root / "Dockerfile").read_text()
    common = cluster.get("setup_commands") or []
    workers = common + (cluster.get("worker_setup_commands") or [])
    run_options = (cluster.get("docker") or {}).get("worker_run_options") or []
    worker_build, found = _default_build(
        "cluster.yaml docker.worker_run_options", "\n".join(run_options),
        r"^--env TORCH_CUDA=(\S*)$", builds)
    problems += found
    image_build, found = _default_build("Dockerfile", dockerfile, r"^ARG TORCH_CUDA=(\S*)$",
                                        builds)
    problems += found
    if worker_build and not worker_build.startswith("cu"):
        problems.append(f"cluster.yaml workers: TORCH_CUDA={worker_build}, want a CUDA build")
    if image_build != worker_build:
        problems.append(f"Dockerfile: TORCH_CUDA={image_build}, want the workers' "
                        f"{worker_build} (else each worker installs its build again)")
    problems += _checked_first("cluster.yaml workers", "\n".join(workers))
    problems += _checked_first("Dockerfile", dockerfile)
    roles = {"head": (common + (cluster.get("head_setup_commands") or []), [None])}
    # the workers and their image, as a shell expands TORCH_CUDA: with every listed build, so
    # that a build written out in place of the variable is caught
    for role, text, default in (("workers", "\n".join(workers), worker_build),
                                ("image", dockerfile, image_build)):
        roles[role] = ([text], [b for b in dict.fromkeys([default, *builds]) if b])
        if not VARIABLE.search(text):
            problems.append(f"{role}: no $TORCH_CUDA: the build is written out")
    for role, (commands, role_builds) in roles.items():
        where = "Dockerfile" if role == "image" else f"cluster.yaml {role}"
        for build in role_builds:
            expanded = [VARIABLE.sub(build, c) if build else c for c in commands]
            found, role_problems = _node_pins(role, expanded)
            problems += [f"{p} (TORCH_CUDA={build})" if build else p for p in role_problems]
            labels = {v.partition("+")[2] for versions in found.values() for v in versions}
            if labels != {build or "cpu"}:
                problems.append(f"{where}: builds {sorted(labels)}, want "
                                f"{build or 'the CPU one'}")
            for pkg in PACKAGES:
                for version in found[pkg]:
                    public = version.partition("+")[0]
                    if pkg in make and public != make[pkg]:
                        problems.append(f"{where}: {pkg}=={version} differs from "
                                        f"the Makefile's {pkg}=={make[pkg]}")
    for pkg in PACKAGES:
        if pkg not in specs:
            problems.append(f"pyproject.toml: no {pkg} requirement")
        elif pkg in make and not SpecifierSet(specs[pkg]).contains(make[pkg]):
            problems.append(f"pyproject.toml: {pkg}{specs[pkg]} excludes the pinned "
                            f"{make[pkg]}")
    return sorted(set(problems), key=problems.index)


def test_pins_agree_in_cluster_yaml_makefile_and_pyproject():
    assert pin_problems(ROOT) == []


def test_the_pins_are_where_the_checker_looks():
    make, _ = _makefile_pins((ROOT / "Makefile").read_text())
    assert set(make) == set(PACKAGES)
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    head, _ = _node_pins("head", cluster["head_setup_commands"])
    workers, _ = _node_pins("workers", [VARIABLE.sub("cu126", c)
                                        for c in cluster["worker_setup_commands"]])
    assert "--env TORCH_CUDA=cu130" in cluster["docker"]["worker_run_options"]
    assert re.search(r"^ARG TORCH_CUDA=cu130$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    for pkg in PACKAGES:
        assert head[pkg] == {f"{make[pkg]}+cpu"}
        assert workers[pkg] == {f"{make[pkg]}+cu126"}


def test_the_builds_are_pypis_cu130_a_cuda_12_one_and_cpu():
    builds = torch_builds((ROOT / BUILDS_FILE).read_text())
    assert _builds_problems(builds) == []
    assert {"cu130", "cu126", "cpu"} <= set(builds)
    assert _builds_problems(["cu130", "cpu"]) and _builds_problems(["cu126", "cpu"])
    assert _builds_problems(["cu130", "cu126", "cu 128"])


@pytest.mark.parametrize("value", ["cu126", "cu130", "cpu"])
def test_the_check_takes_a_listed_build_silently(value):
    run = subprocess.run(["sh", str(ROOT / CHECK_SCRIPT), value], capture_output=True, text=True)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


@pytest.mark.parametrize("value", ["cu128", "", "cu126 ", "CU126", "#", "cu130 cu126"])
def test_the_check_refuses_anything_else_in_one_error_line(value):
    run = subprocess.run(["sh", str(ROOT / CHECK_SCRIPT), value], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (f"error: TORCH_CUDA={value} is not a torch build: one of "
                          "cu126, cu130, cpu (tools/torch_builds.txt)\n")


def test_make_refuses_an_unlisted_build_before_running_anything():
    for target in (".venv/.installed", "quick", "test"):
        run = _make(ROOT, target, "TORCH_CUDA=cu128")
        assert run.returncode == 2 and run.stdout == "", run
        (line,) = run.stderr.splitlines()
        assert ("*** error: TORCH_CUDA=cu128 is not a torch build: one of cu126, cu130, cpu "
                "(tools/torch_builds.txt)") in line


def test_make_without_torch_cuda_installs_pypis_torch_as_before():
    run = _make(ROOT, ".venv/.installed")
    assert run.returncode == 0, run.stderr
    assert "download.pytorch.org" not in run.stdout and ".torch-" not in run.stdout
    installs = [line for line in run.stdout.splitlines() if "torch==" in line]
    assert len(installs) == 2
    for line in installs:
        assert line.rstrip("; \\").endswith(  # and the Ray the tests run on
            " torch==2.14.1 torchvision==0.29.1 -e '.[dev,mlflow,wandb]' 'ray[tune]==2.58.1'")


@pytest.mark.parametrize("build", ["cu126", "cpu"])
def test_make_with_a_build_installs_it_from_its_index_and_pypi(build):
    run = _make(ROOT, ".venv/.installed", f"TORCH_CUDA={build}")
    assert run.returncode == 0, run.stderr
    want = (f"--extra-index-url https://download.pytorch.org/whl/{build} "
            f"torch==2.14.1+{build} torchvision==0.29.1+{build} -e '.[dev,mlflow,wandb]'")
    installs = [line for line in run.stdout.splitlines() if "torch==" in line]
    assert len(installs) == 2 and all(want in line for line in installs)
    # uv keeps pip's own sources (the local wheels here, PyPI elsewhere) beside the index
    assert "$(.venv/bin/python tools/pip_sources.py) --extra-index-url" in installs[0]


def test_a_venv_keeps_its_build_and_another_build_installs_again(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    stamp = venv / ".installed"
    stamp.touch()  # newer than pyproject.toml and tools/ray_default_extras.py

    def reinstalls(*args: str) -> bool:
        env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA", "MAKEFLAGS")}
        run = subprocess.run(["make", "-n", "-C", str(ROOT), "--no-print-directory",
                              f"VENV={venv}", str(stamp), *args],
                             capture_output=True, text=True, env=env, timeout=60)
        assert run.returncode == 0, run.stderr
        return "-m venv" in run.stdout

    assert not reinstalls()  # installed: nothing to do
    assert reinstalls("TORCH_CUDA=cu126")  # no mark of cu126: its install runs
    mark = venv / ".torch-cu126"
    mark.touch()  # what that install leaves, before it touches the stamp
    stamp.touch()
    assert not reinstalls("TORCH_CUDA=cu126")
    assert not reinstalls()  # a later make without TORCH_CUDA keeps cu126
    assert reinstalls("TORCH_CUDA=cu130")  # another build installs again
    run = _make(ROOT, ".venv/.installed", "TORCH_CUDA=cu130")
    lines = run.stdout.splitlines()
    assert lines[0] == "rm -f .venv/.torch-*" and "touch .venv/.torch-cu130" in lines
    assert lines.index("touch .venv/.torch-cu130") < lines.index("touch .venv/.installed")


def _sub_first(old: str, new: str):
    return lambda text: text.replace(old, new, 1)


def _sub_all(old: str, new: str):
    return lambda text: text.replace(old, new)


@pytest.mark.parametrize("name, edit", [
    ("Makefile", _sub_first("torch==2.14.1", "torch==2.14.2")),
    ("Makefile", _sub_first("torchvision==0.29.1", "torchvision==0.29.2")),
    ("Makefile", _sub_first("torchvision==0.29.1$(TORCH_BUILD)", "torchvision==0.29.1")),
    ("Makefile", _sub_first("whl/$(TORCH_CUDA)", "whl/cu130")),
    ("Makefile", _sub_first("$(if $(TORCH_CUDA_ERROR),$(error $(TORCH_CUDA_ERROR)))", "")),
    ("cluster.yaml", _sub_first("torch==2.14.1+$TORCH_CUDA", "torch==2.14.2+$TORCH_CUDA")),
    ("cluster.yaml", _sub_all("2.14.1", "2.14.2")),  # the whole file, consistently
    ("cluster.yaml", _sub_all("0.29.1", "0.30.0")),
    ("cluster.yaml", _sub_first("('2.14.1+cpu', '0.29.1+cpu')", "('2.14.2+cpu', '0.29.1+cpu')")),
    ("cluster.yaml", _sub_first("--index-url https://download.pytorch.org/whl/$TORCH_CUDA",
                                "--index-url https://download.pytorch.org/whl/cu130")),
    ("cluster.yaml", _sub_first("('2.14.1+$TORCH_CUDA', '0.29.1+$TORCH_CUDA')",
                                "('2.14.1+cu130', '0.29.1+cu130')")),  # a build written out
    ("cluster.yaml", _sub_all("+cpu", "+cu130")),  # CUDA wheels on the head
    ("cluster.yaml", _sub_first("--env TORCH_CUDA=cu130", "--env TORCH_CUDA=cu128")),
    ("cluster.yaml", _sub_first("--env TORCH_CUDA=cu130", "--env TORCH_CUDA=cu126")),
    ("cluster.yaml", _sub_first("--env TORCH_CUDA=cu130", "--env TORCH_CUDA=cpu")),
    ("cluster.yaml", _sub_first('  - sh ~/unbiased-mi/tools/torch_build.sh "$TORCH_CUDA"', "")),
    ("Dockerfile", _sub_first("torch==2.14.1+${TORCH_CUDA}", "torch==2.14.2+${TORCH_CUDA}")),
    ("Dockerfile", _sub_first("whl/${TORCH_CUDA}", "whl/cu130")),
    ("Dockerfile", _sub_first("ARG TORCH_CUDA=cu130", "ARG TORCH_CUDA=cu126")),
    ("Dockerfile", _sub_first('sh /tmp/torch-builds/torch_build.sh "$TORCH_CUDA" \\\n    && ',
                              "")),
    (BUILDS_FILE, _sub_first("\ncu126 ", "\n# cu126 ")),  # no CUDA 12 build left
    (BUILDS_FILE, _sub_first("\ncu130 ", "\ncu131 ")),  # the workers' default unlisted
    ("pyproject.toml", _sub_first('"torch>=2.3"', '"torch>=2.15"')),
    ("pyproject.toml", _sub_first('"torchvision>=0.18"', '"torchvision>=0.30"')),
], ids=["makefile-torch", "makefile-torchvision", "makefile-torchvision-build",
        "makefile-index", "makefile-unchecked", "cluster-one-occurrence", "cluster-all-torch",
        "cluster-all-torchvision", "cluster-head-guard", "cluster-worker-index",
        "cluster-worker-guard", "cluster-cuda-on-head", "cluster-unlisted-build",
        "cluster-other-build-than-image", "cluster-cpu-workers", "cluster-unchecked",
        "dockerfile-torch", "dockerfile-index", "dockerfile-other-build-than-workers",
        "dockerfile-unchecked", "builds-no-cuda-12", "builds-no-cu130",
        "pyproject-torch-bound", "pyproject-torchvision-bound"])
def test_editing_one_file_alone_is_caught(tmp_path, name, edit):
    for file in FILES:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / file, tmp_path / file)
    assert pin_problems(tmp_path) == []
    before = (tmp_path / name).read_text()
    after = edit(before)
    assert after != before, "the edit no longer matches the file: update this test"
    (tmp_path / name).write_text(after)
    assert pin_problems(tmp_path), f"editing {name} alone went unnoticed"


@pytest.mark.parametrize("python, says", [
    ("old", "is Python 3.6.8: this project needs 3.10+"),
    ("missing", "does not run: this project needs Python 3.10+"),
])
def test_make_refuses_a_python_older_than_3_10_in_one_line_before_anything_runs(
        tmp_path, python, says):
    # A RHEL/Rocky 8 login node's python3 is 3.6: make stops before creating a venv.
    old = tmp_path / "python3.6"
    old.write_text("#!/bin/sh\necho 3.6.8\n")
    old.chmod(0o755)
    given = str(old) if python == "old" else str(tmp_path / "no-python")
    venv = tmp_path / "venv"
    run = _make(ROOT, "quick", f"PYTHON={given}", f"VENV={venv}")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and not run.stdout.strip(), (run.stdout, run.stderr)
    assert len(lines) == 1 and f"error: PYTHON={given} {says}" in lines[0], lines
    assert "PYTHON=python3.11" in lines[0] and "module load" in lines[0]
    assert not venv.exists()
    ok = _make(ROOT, "quick", f"VENV={venv}")  # this machine's python3 (3.11)
    assert ok.returncode == 0 and f"-m venv {venv}" in ok.stdout, ok.stderr
