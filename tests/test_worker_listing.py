"""--list_on_workers: a gs:// image input listed unit by unit on the workers and its
shards cut there (transforms.worker_listing), against gcp-storage-emulator.

The promise is that it changes where the listing and the plan run, not what is
written: every test compares a run with the flag to a run without it on the
same bucket (shard bytes, inputs.jsonl bytes, dead letters, manifest), with
units small enough that each run has several, and rows of one shard coming
from several units.
"""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest
from PIL import Image

from beam_tfrecords import planners
from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.transforms import worker_listing
from beam_tfrecords.transforms.io import files
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)
from tests.test_dataflow import _one_sdist_build_at_a_time, offline  # noqa: F401  (fixtures)

SHARD_FLAGS = ["--shard_min_mb", "0.01", "--shard_max_mb", "0.05"]
QUIET = ["--progress", "off", "--max_bad_fraction", "0.3"]
# Outputs that differ between two runs by design: when they ran, and the options given.
RUN_FILES = ("manifest.json", "run_report.json")


def _objects(gcs, out: str) -> dict[str, str]:
    """``{relative name: sha256}`` of what a run wrote (the manifest and report apart)."""
    found = {}
    for name in gcs.list(out + "/"):
        rel = name[len(out) + 1:]
        if rel not in RUN_FILES:
            found[rel] = hashlib.sha256(gcs.download(name)).hexdigest()
    return found


def _manifest(gcs, out: str) -> dict:
    return json.loads(gcs.download(out + "/manifest.json"))


def _same_dataset(gcs, a: str, b: str) -> dict:
    """Asserts that runs ``a`` and ``b`` wrote the same dataset; returns ``b``'s manifest."""
    objects_a, objects_b = _objects(gcs, a), _objects(gcs, b)
    assert objects_b == objects_a
    assert any(".tfrecord" in name for name in objects_a)
    assert "inputs.jsonl" in objects_a
    manifest_a, manifest_b = _manifest(gcs, a), _manifest(gcs, b)
    for key in ("splits", "labels", "features", "statistics"):
        assert manifest_b.get(key) == manifest_a.get(key), key
    input_a, input_b = dict(manifest_a["input"]), dict(manifest_b["input"])
    assert input_b.pop("options_fingerprint", None) == input_a.pop("options_fingerprint", None)
    assert input_b == input_a
    return manifest_b


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8 + seed % 5, 9), (seed * 37 % 256, seed * 11 % 256, 90)).save(out, "PNG")
    return out.getvalue()


def _run(*flags) -> int:
    return main(["convert", *flags, *SHARD_FLAGS, *QUIET])


@pytest.fixture(name="few_units")
def _few_units(monkeypatch):
    """Units stop at 4 and shards travel 4 to a group: a sample of a few dozen
    images still makes several of each."""
    monkeypatch.setattr(planners, "WORKER_LISTING_UNITS", 4)
    monkeypatch.setattr(worker_listing, "SHARDS_PER_GROUP", 4)


@pytest.fixture(scope="module", name="split_tree")
def _split_tree(gcs_emulator, tmp_path_factory):
    local = str(tmp_path_factory.mktemp("wl") / "images")
    make_class_folder_sample(local, per_class=6)  # <split>/<class>/ and a stray README.txt
    with open(os.path.join(local, "loose.png"), "wb") as f:  # An image of no class.
        f.write(_png(1))
    gcs_emulator.upload_tree(local, "gs://wl/split")
    gcs_emulator.upload_bytes("gs://wl/split/train/notes.txt", b"not an image")
    return "gs://wl/split"


@pytest.mark.emulator
def test_units_list_what_one_listing_lists(gcs, split_tree, monkeypatch):
    """The units, listed in order, are the one listing, whatever the unit count and limit."""
    pattern = split_tree + "/**"
    whole = list(files.list_stamped(pattern))
    assert len(whole) > 40
    for min_units, limit in ((1, 1000), (4, 1000), (64, 1000), (4, 2), (64, 0)):
        units = files.listing_units(pattern, min_units, limit)
        listed = [item for unit in units for item in files.list_unit(pattern, unit)]
        assert listed == whole, (min_units, limit)
        folders = sum(objects is None for _, objects in units)
        # The 12 <split>/<class>/ folders are leaves: listed by the workers. With
        # min_units 1, or a limit below the root's own 2 files, the root is the one unit.
        assert folders == (1 if min_units == 1 or limit < 2 else 12), units
    # Past INLINE_OBJECTS objects met, the level that met them is left to the workers.
    monkeypatch.setattr(files, "INLINE_OBJECTS", 1)
    units = files.listing_units(pattern, 64)
    assert [name for name, objects in units if objects is None] == [
        "split/test/", "split/train/", "split/validation/"]
    assert [item for unit in units for item in files.list_unit(pattern, unit)] == whole
    monkeypatch.undo()
    # The launcher never lists inside a folder of more than `limit` objects.
    units = files.listing_units(pattern, 64, 2)
    inline = [item[0] for _, objects in units if objects is not None for item in objects]
    assert all(path.count("/") <= 5 for path in inline), inline  # none from a class folder


@pytest.mark.emulator
def test_worker_listing_writes_what_the_launcher_listing_writes(gcs, split_tree, few_units):
    assert _run("--input", split_tree, "--output", "gs://wl/out-launcher") == 0
    assert _run("--input", split_tree, "--output", "gs://wl/out-workers", "--list_on_workers") == 0
    manifest = _same_dataset(gcs, "gs://wl/out-launcher", "gs://wl/out-workers")
    assert set(manifest["splits"]) == {"train", "validation", "test"}
    assert sum(info["num_shards"] for info in manifest["splits"].values()) >= 6
    dead = [json.loads(line) for line in gcs.download("gs://wl/out-workers/dead_letter/listing.jsonl").splitlines()]
    assert [d["error"] for d in dead] == ["no_class_folder"]  # loose.png
    assert main(["verify", "gs://wl/out-workers"]) == 0


@pytest.mark.emulator
def test_multi_process_worker_listing_writes_the_same(gcs, split_tree, few_units):
    assert _run("--input", split_tree, "--output", "gs://wl/out-mp-launcher") == 0
    assert _run("--input", split_tree, "--output", "gs://wl/out-mp-workers", "--list_on_workers",
                "--direct_running_mode=multi_processing", "--direct_num_workers=2") == 0
    _same_dataset(gcs, "gs://wl/out-mp-launcher", "gs://wl/out-mp-workers")


@pytest.mark.emulator
def test_class_folders_with_labels_splits_and_large_folders(gcs, tmp_path, few_units, monkeypatch):
    """No split folders, --splits by path, a labels file missing a class (dead letters),
    and folders over the launcher's limit (listed whole by a worker)."""
    local = str(tmp_path / "classes")
    make_class_folder_sample(local, per_class=8, splits=None)
    gcs.upload_tree(local, "gs://wl/classes")
    classes = sorted(d for d in os.listdir(local) if os.path.isdir(os.path.join(local, d)))
    labels = str(tmp_path / "labels.txt")
    with open(labels, "w", encoding="utf-8") as f:
        f.write("\n".join(reversed(classes[1:])) + "\n")
    monkeypatch.setattr(files, "UNIT_OBJECTS", 3)
    flags = ["--input", "gs://wl/classes", "--labels", labels, "--splits", "train=0.7,val=0.3"]
    assert _run(*flags, "--output", "gs://wl/out-cl-launcher") == 0
    assert _run(*flags, "--output", "gs://wl/out-cl-workers", "--list_on_workers") == 0
    manifest = _same_dataset(gcs, "gs://wl/out-cl-launcher", "gs://wl/out-cl-workers")
    assert set(manifest["splits"]) == {"train", "val"}
    dead = [json.loads(line) for line in
            gcs.download("gs://wl/out-cl-workers/dead_letter/listing.jsonl").splitlines()]
    assert {d["error"] for d in dead} == {"unknown_class"} and len(dead) == 8


@pytest.mark.emulator
def test_cifar_layout_on_workers(gcs, tmp_path, few_units):
    local = tmp_path / "cifar"
    for split, count in (("train", 30), ("test", 12)):
        for i in range(count):
            path = local / split / f"{i}_{['cat', 'dog', 'frog'][i % 3]}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_png(i))
    (local / "train" / "77_bird.png").write_bytes(_png(77))  # a class not in labels.txt
    (local / "train" / "a.png").write_bytes(_png(78))  # no class: sorts with the one above
    (local / "labels.txt").write_text("cat\ndog\nfrog\n")
    gcs.upload_tree(str(local), "gs://wl/cifar")
    assert _run("--input", "gs://wl/cifar", "--output", "gs://wl/out-cf-launcher") == 0
    assert _run("--input", "gs://wl/cifar", "--output", "gs://wl/out-cf-workers", "--list_on_workers") == 0
    manifest = _same_dataset(gcs, "gs://wl/out-cf-launcher", "gs://wl/out-cf-workers")
    assert {k: v["records"] for k, v in manifest["splits"].items()} == {"train": 30, "test": 12}
    dead = [json.loads(line)["error"] for line in
            gcs.download("gs://wl/out-cf-workers/dead_letter/listing.jsonl").splitlines()]
    assert dead == ["unknown_class", "unlabeled"]  # by path, as one listing gives them


@pytest.mark.emulator
def test_a_glob_decides_the_layout_as_the_launcher_listing(gcs, few_units):
    """A labels.txt at the root that the glob does not match: class folders, not CIFAR."""
    for i in range(6):
        gcs.upload_bytes(f"gs://wl/globbed/{['cat', 'dog'][i % 2]}/{i}_{['cat', 'dog'][i % 2]}.png", _png(i))
    gcs.upload_bytes("gs://wl/globbed/labels.txt", b"cat\ndog\n")
    flags = ["--input", "gs://wl/globbed/**.png"]
    assert _run(*flags, "--output", "gs://wl/out-gl-launcher") == 0
    assert _run(*flags, "--output", "gs://wl/out-gl-workers", "--list_on_workers") == 0
    manifest = _same_dataset(gcs, "gs://wl/out-gl-launcher", "gs://wl/out-gl-workers")
    assert list(manifest["splits"]) == ["train"]


@pytest.mark.emulator
def test_no_image_at_all_ends_as_without_the_flag(gcs, few_units):
    gcs.upload_bytes("gs://wl/none/a.png", _png(1))  # no class folder
    gcs.upload_bytes("gs://wl/none/cat/readme.txt", b"text")
    codes = [_run("--input", "gs://wl/none", "--output", f"gs://wl/out-none-{mode}", *flags)
             for mode, flags in (("l", []), ("w", ["--list_on_workers"]))]
    assert codes[0] == codes[1] != 0
    reports = [json.loads(gcs.download(f"gs://wl/out-none-{mode}/run_report.json")) for mode in "lw"]
    assert reports[1]["status"] == reports[0]["status"]
    assert (gcs.download("gs://wl/out-none-w/dead_letter/listing.jsonl")
            == gcs.download("gs://wl/out-none-l/dead_letter/listing.jsonl"))


@pytest.mark.emulator
def test_worker_listing_refusals(gcs, split_tree, tmp_path, capsys, monkeypatch):
    def refused(*flags) -> str:
        assert main(["convert", *flags, *QUIET]) == 2
        return capsys.readouterr().err

    local = str(tmp_path / "local")
    make_class_folder_sample(local, per_class=1, splits=None)
    assert "is not one (drop the flag)" in refused("--input", local, "--output", str(tmp_path / "o"),
                                                   "--list_on_workers")
    err = refused("--input", split_tree, "--output", "gs://wl/out-r", "--list_on_workers", "--incremental")
    assert "does not combine with --incremental" in err
    err = refused("--input", split_tree, "--output", "gs://wl/out-r", "--list_on_workers",
                  "--splits", "a=0.5,b=0.5")
    assert "already names its splits" in err
    # A top folder of no images beside split folders: the launcher cannot tell, so it refuses.
    gcs.upload_bytes("gs://wl/mixed/train/cat/a.png", _png(3))
    gcs.upload_bytes("gs://wl/mixed/docs/readme.txt", b"text")
    monkeypatch.setattr(files, "UNIT_OBJECTS", 0)  # Every folder holding a file is a unit.
    err = refused("--input", "gs://wl/mixed", "--output", "gs://wl/out-r", "--list_on_workers")
    assert "look like splits" in err and "holds no images" in err
    assert not gcs.exists("gs://wl/out-r/manifest.json")
    err = refused("--input", split_tree, "--output", split_tree + "/out", "--list_on_workers")
    assert "is inside the input folder" in err
    gcs.upload_bytes("gs://wl/table/t.csv", b"a,b\n1,2\n")
    err = refused("--input", "gs://wl/table/t.csv", "--layout", "table", "--output", "gs://wl/out-r",
                  "--list_on_workers")
    assert "is read as a table (drop the flag)" in err


@pytest.mark.emulator
def test_dataflow_job_lists_on_the_workers(gcs, split_tree, offline, few_units):  # noqa: F811
    """The real DataflowRunner (dry run) builds the job: the listing and the cut are
    steps of the job; the launcher listed folders only (units in the job's graph)."""
    from apache_beam.runners.dataflow.internal import apiclient  # pylint: disable=import-outside-toplevel

    from beam_tfrecords.schemas.config import ConvertConfig  # pylint: disable=import-outside-toplevel
    from tests.test_dataflow import _assert_chain, _dry_run  # pylint: disable=import-outside-toplevel

    config = ConvertConfig(input=split_tree, output="gs://wl/out-dataflow", list_on_workers=True)
    job = _dry_run(config)
    assert isinstance(job, apiclient.Job)
    _assert_chain(job, ["ListOnWorkers", "WriteShards", "VerifyShards", "WriteManifest"])
    names = {step.name for step in job.proto.steps} | {
        t.unique_name for t in job.proto_pipeline.components.transforms.values()}
    for step in ("ListOnWorkers/ListUnit", "ListOnWorkers/Cut", "ListOnWorkers/ByGroup"):
        assert any(name.startswith(step) for name in names), (step, sorted(names)[:40])
    assert not gcs.list("gs://wl/out-dataflow/")  # A dry run writes nothing.
