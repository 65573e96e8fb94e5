"""Packaging: the sdist, a clean install of it, and the worker Dockerfile.

SLOW: ``test_sdist_installs_into_a_fresh_venv_and_converts`` (marked ``slow``)
takes ~1.5 min: it creates a fresh virtualenv and lets pip resolve
apache-beam[gcp] and the rest from the package index (no cache). It still runs in
``make test``; ``pytest -m 'not slow'`` skips it. The Dockerfile checks are static
(no Docker needed) and instant.

How the sdist is built: ``python setup.py sdist`` with the project venv's own
setuptools, offline. That is the command Beam's stager runs for ``--setup_file``
when the ``build`` package is not installed (``make test`` does not install it),
so it is the sdist Dataflow workers get. It is built from a copy of exactly what
the Dockerfile's ``COPY`` lines put in the image, so a file the build needs but
the image lacks fails here. The fresh venv then installs it with the Dockerfile's
own ``RUN pip install ...`` command, read from the Dockerfile and run inside the
unpacked sdist (plus ``--quiet``).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
import setuptools

from beam_tfrecords.samples import make_class_folder_sample

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(REPO, "Dockerfile")
PACKAGE_GLOBS = ["beam_pipeline*", "transforms*", "schemas*"]


# --- the Dockerfile ------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined."""
    with open(DOCKERFILE, encoding="utf-8") as f:
        text = re.sub(r"\\\n", " ", f.read())
    lines = [ln.strip() for ln in text.splitlines()]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "")
            for ln in lines if ln and not ln.startswith("#")]


def _instructions(name: str) -> list[str]:
    return [args for instr, args in _dockerfile() if instr == name]


def _copy_sources() -> list[str]:
    """The build-context paths the Dockerfile copies (not ``COPY --from=`` another image)."""
    sources = []
    for args in _instructions("COPY"):
        words = shlex.split(args)
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        sources += words[:-1]
    return sources


def _install_command() -> list[str]:
    """The Dockerfile's ``RUN pip install ...`` as arguments (there is exactly one)."""
    runs = [shlex.split(r) for r in _instructions("RUN") if "pip install" in r]
    assert len(runs) == 1, f"expected one 'RUN pip install' in the Dockerfile, got {runs}"
    return runs[0]


def _beam_pin() -> str:
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        pins = re.findall(r'"apache-beam(?:\[[a-z,]+\])?==([0-9][^"]*)"', f.read())
    assert len(pins) == 1, f"setup.py should pin apache-beam exactly once: {pins}"
    return pins[0]


@pytest.mark.unit
def test_dockerfile_base_image_matches_the_beam_pin():
    (base,) = _instructions("FROM")
    pin = _beam_pin()
    assert base == f"apache/beam_python3.11_sdk:{pin}"  # setup.py's pin, Python 3.11 like .venv
    import apache_beam  # The launcher's Beam must be the workers' Beam.

    assert apache_beam.__version__ == pin


@pytest.mark.unit
def test_dockerfile_copies_only_existing_paths_and_everything_the_build_needs():
    sources = _copy_sources()
    for src in sources:
        assert os.path.exists(os.path.join(REPO, src)), f"Dockerfile COPYs {src}, not in the repo"
    packages = {p.split(".")[0] for p in setuptools.find_packages(REPO, include=PACKAGE_GLOBS)}
    build_files = [f for f in ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in")
                   if os.path.exists(os.path.join(REPO, f))]
    missing = sorted((packages | set(build_files)) - {s.rstrip("/") for s in sources})
    assert not missing, f"the Dockerfile does not COPY {missing}"


@pytest.mark.unit
def test_dockerfile_keeps_the_beam_entrypoint_and_installs_the_package():
    (entrypoint,) = _instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == ["/opt/apache/beam/boot"]
    assert _install_command() == ["pip", "install", "--no-cache-dir", "."]


# --- the sdist -----------------------------------------------------------------------


def _docker_context(dest: str) -> str:
    """A copy of what the Dockerfile COPYs (no caches, no egg-info)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    os.makedirs(dest)
    for src in _copy_sources():
        path = os.path.join(REPO, src)
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(dest, src), ignore=ignore)
        else:
            shutil.copy2(path, os.path.join(dest, src))
    return dest


def _build_sdist(tmp_path) -> str:
    context = _docker_context(str(tmp_path / "context"))
    dist = str(tmp_path / "dist")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", dist],
                   cwd=context, check=True, capture_output=True, timeout=120)
    (sdist,) = glob.glob(os.path.join(dist, "*.tar.gz"))
    return sdist


def _repo_files(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, pattern)))


def _assert_sdist_complete(sdist: str) -> None:
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    generated = _repo_files("schemas/proto/*_pb2.py")
    examples = _repo_files("schemas/examples/*.yaml")
    assert generated and examples
    packages = setuptools.find_packages(REPO, include=PACKAGE_GLOBS)
    modules = [os.path.relpath(p, REPO) for pkg in packages
               for p in glob.glob(os.path.join(REPO, pkg.replace(".", "/"), "*.py"))]
    missing = sorted(set(generated + examples + modules + ["setup.py", "README.md"]) - members)
    assert not missing, f"the sdist lacks {missing}"


@pytest.mark.unit
def test_sdist_holds_every_package_the_protos_and_the_examples(tmp_path):
    _assert_sdist_complete(_build_sdist(tmp_path))


def _run(argv, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, **kwargs)


@pytest.mark.slow
def test_sdist_installs_into_a_fresh_venv_and_converts(tmp_path):
    started = time.monotonic()
    sdist = _build_sdist(tmp_path)
    _assert_sdist_complete(sdist)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (source,) = glob.glob(str(tmp_path / "unpacked" / "*"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / "bin"
    # The Dockerfile's command, verbatim, with the new venv's pip: `pip install --no-cache-dir .`
    command = _install_command()
    install = _run([str(bin_dir / "python"), "-m", *command, "--quiet"], cwd=source, timeout=900)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    installed = time.monotonic()

    work = tmp_path / "work"  # Run from outside the repo: only the installed package counts.
    work.mkdir()
    code = ("import beam_tfrecords, beam_tfrecords.schemas.proto.example_pb2 as p; "
            "print(beam_tfrecords.__file__, p.__file__)")
    where = _run([str(bin_dir / "python"), "-c", code], cwd=work, timeout=120)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(venv)) for line in where.stdout.split()), where.stdout

    script = str(bin_dir / "beam-tfrecords")
    make_class_folder_sample(str(work / "images"), per_class=2)
    images = _run([script, "convert", "--input", str(work / "images"), "--output",
                   str(work / "images_out"), "--shard_min_mb", "0.01", "--shard_max_mb", "5"],
                  cwd=work, timeout=300)
    assert images.returncode == 0, images.stdout[-3000:] + images.stderr[-3000:]
    manifest = json.loads((work / "images_out" / "manifest.json").read_text())
    assert sum(s["records"] for s in manifest["splits"].values()) == 24

    (work / "table.csv").write_text('id,flag,count,score,name\n1,true,3,0.5,a\n'
                                    '2,false,4,1.5,"b, c"\n3,yes,5,,d\n')
    table = _run([script, "convert", "--input", str(work / "table.csv"), "--output",
                  str(work / "table_out"), "--shard_min_mb", "0.01", "--shard_max_mb", "5"],
                 cwd=work, timeout=300)
    assert table.returncode == 0, table.stdout[-3000:] + table.stderr[-3000:]
    manifest = json.loads((work / "table_out" / "manifest.json").read_text())
    assert sum(s["records"] for s in manifest["splits"].values()) == 3
    print(f"install {installed - started:.0f} s, conversions {time.monotonic() - installed:.0f} s")
