"""gs:// in and out through Beam's FileSystems, against gcp-storage-emulator on loopback.

Every run here is compared with a run of the same input on local disk: the
shards must be byte-identical, and the crc32c GCS computed for each shard
object must be the one the manifest records. No process may wait on a
credential lookup: a Beam credential retry shows in the logs as
``_get_credentials_with_retrys`` and costs at least 15 s (2+4+8+16 s, fuzzed
down to half at most).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import google_crc32c
import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.transforms.io.gcs import crc32c_gcs_to_hex, crc32c_hex_to_gcs, object_crc32c
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD_FLAGS = ["--shard_min_mb", "0.01", "--shard_max_mb", "0.05"]
CREDENTIAL_RETRY = "_get_credentials_with_retrys"
SUBPROCESS_TIMEOUT = 240


def _hex_crc32c(data: bytes) -> str:
    return google_crc32c.Checksum(data).hexdigest().decode()


def _timed(label: str, fn, *args):
    start = time.monotonic()
    result = fn(*args)
    elapsed = time.monotonic() - start
    print(f"[timing] {label}: {elapsed:.2f} s")
    return result, elapsed


def _shard_entries(manifest: dict) -> list[dict]:
    return [shard for info in manifest["splits"].values() for shard in info["shards"]]


def _local_sha256(folder: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(folder)):
        if ".tfrecord" in name and not name.endswith(".idx"):
            with open(os.path.join(folder, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def _credential_retries(caplog) -> list[str]:
    return [r.getMessage()[:200] for r in caplog.records if CREDENTIAL_RETRY in r.getMessage()]


@pytest.fixture(scope="module", autouse=True)
def _module_wall_time():
    start = time.monotonic()
    yield
    print(f"\n[timing] tests/test_gcs.py, all tests: {time.monotonic() - start:.2f} s")


# -- crc32c: GCS base64 <-> manifest hex (no emulator) -----------------------------


@pytest.mark.unit
@pytest.mark.parametrize("data", [b"", b"123456789", b"\x00" * 33, bytes(range(256)) * 7])
def test_crc32c_hex_and_gcs_base64_round_trip(data):
    hex_digest = _hex_crc32c(data)
    gcs_value = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
    assert crc32c_hex_to_gcs(hex_digest) == gcs_value
    assert crc32c_gcs_to_hex(gcs_value) == hex_digest
    assert crc32c_gcs_to_hex(crc32c_hex_to_gcs(hex_digest)) == hex_digest


@pytest.mark.unit
def test_crc32c_known_value():
    # CRC-32C("123456789") = 0xE3069283, GCS reports base64 of e3 06 92 83.
    assert crc32c_hex_to_gcs("e3069283") == "4waSgw=="
    assert crc32c_gcs_to_hex("4waSgw==") == "e3069283"
    assert crc32c_hex_to_gcs("E3069283") == "4waSgw=="


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["", "e30692", "e306928300", "xyz12345"])
def test_crc32c_hex_rejects_malformed(bad):
    with pytest.raises(ValueError, match=r"not a (hex )?CRC-32C"):
        crc32c_hex_to_gcs(bad)


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["", "4waS", "4waSgwAA", "not base64!"])
def test_crc32c_gcs_rejects_malformed(bad):
    with pytest.raises(ValueError, match="not a GCS crc32c"):
        crc32c_gcs_to_hex(bad)


@pytest.mark.unit
def test_object_crc32c_is_none_off_gcs(tmp_path):
    assert object_crc32c(str(tmp_path / "x.tfrecord")) is None
    assert object_crc32c("s3://bucket/x") is None


# -- the emulator and its helpers ---------------------------------------------------


@pytest.mark.emulator
def test_first_gcs_call_in_driver_is_immediate(gcs, caplog):
    """The recipe: STORAGE_EMULATOR_HOST + NO_GCE_CHECK=true + ``import beam_tfrecords.transforms.io.gcs``.

    A stall is the credential lookup retrying against the metadata server, which
    logs each retry; the time is printed, not asserted (shared machines are noisy).
    """
    from apache_beam.io.filesystems import FileSystems  # pylint: disable=import-outside-toplevel

    gcs.upload_bytes("gs://first-call/x", b"x")
    with caplog.at_level(logging.DEBUG):
        found, _ = _timed("first GCS call in the driver (this process, FileSystems.match)",
                          FileSystems.match, ["gs://first-call/**"])
    assert [m.path for m in found[0].metadata_list] == ["gs://first-call/x"]
    assert _credential_retries(caplog) == []


@pytest.mark.emulator
def test_emulator_helpers_and_object_crc32c(gcs):
    data = b"hello gcs emulator\n" * 100
    gcs.upload_bytes("gs://helpers/a/b.bin", data)
    meta = gcs.object_metadata("gs://helpers/a/b.bin")
    assert meta["size"] == len(data)
    assert meta["crc32c_hex"] == _hex_crc32c(data)
    assert meta["crc32c"] == crc32c_hex_to_gcs(_hex_crc32c(data))
    assert gcs.download("gs://helpers/a/b.bin") == data
    assert object_crc32c("gs://helpers/a/b.bin") == _hex_crc32c(data)

    gcs.overwrite_object("gs://helpers/a/b.bin", b"changed")
    assert gcs.download("gs://helpers/a/b.bin") == b"changed"
    assert object_crc32c("gs://helpers/a/b.bin") == _hex_crc32c(b"changed")
    assert int(gcs.object_metadata("gs://helpers/a/b.bin")["generation"]) != int(meta["generation"])

    with pytest.raises(FileNotFoundError, match="gs://helpers/missing does not exist"):
        object_crc32c("gs://helpers/missing")
    with pytest.raises(FileNotFoundError, match="^gs://helpers/missing$"):
        gcs.overwrite_object("gs://helpers/missing", b"x")


def _first_call_in_fresh_process(recipe: bool) -> tuple[dict, str]:
    """Lists ``gs://first-call/`` in a fresh Python (the emulator's environment
    inherited), counting the process's calls to ``google.auth.default()``: Beam's
    credential lookup, which retries for 15-30 s when it finds no credentials.

    Returns:
      ``({"seconds", "lookups", "found"}, stderr)``: the call's time (printed by the
      tests, never asserted), the lookups made, the object paths the call listed.
    """
    code = textwrap.dedent(f"""
        import json, time
        import google.auth
        lookups = []
        lookup = google.auth.default
        def counted(*args, **kwargs):
            lookups.append(args)
            return lookup(*args, **kwargs)
        google.auth.default = counted
        {"import beam_tfrecords.transforms.io.gcs" if recipe else ""}
        from apache_beam.io.filesystems import FileSystems
        start = time.monotonic()
        found = FileSystems.match(["gs://first-call/**"])[0].metadata_list
        print(json.dumps({{"seconds": time.monotonic() - start, "lookups": len(lookups),
                          "found": [m.path for m in found]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.emulator
def test_first_gcs_call_in_fresh_process_is_immediate(gcs):
    """With the recipe, the first call returns what the emulator holds and never looks
    for credentials, so it has nothing to wait on (its time is printed, not asserted)."""
    gcs.upload_bytes("gs://first-call/x", b"x")
    run, stderr = _first_call_in_fresh_process(recipe=True)
    print(f"[timing] first GCS call, fresh process, with the recipe: {run['seconds']:.3f} s")
    assert run["found"] == ["gs://first-call/x"]  # Listed by the emulator, the only place it is.
    assert run["lookups"] == 0
    assert CREDENTIAL_RETRY not in stderr


@pytest.mark.skipif(not os.environ.get("GCS_MEASURE_STALL"),
                    reason="costs 15-30 s; set GCS_MEASURE_STALL=1 to measure the stall")
@pytest.mark.emulator
def test_first_gcs_call_in_fresh_process_without_recipe_stalls(gcs):
    gcs.upload_bytes("gs://first-call/x", b"x")
    run, stderr = _first_call_in_fresh_process(recipe=False)
    print(f"[timing] first GCS call, fresh process, env only (no recipe): {run['seconds']:.3f} s")
    assert run["found"] == ["gs://first-call/x"]
    assert run["lookups"] >= 1
    assert CREDENTIAL_RETRY in stderr
    assert run["seconds"] >= 15


# -- whole conversions: gs:// in and out, compared with local runs ---------------------


def _check_against_local(gcs, gs_out: str, local_out: str) -> dict:
    """Manifest on GCS, every shard's GCS crc32c = manifest crc32c, bytes = local run's."""
    manifest = json.loads(gcs.download(f"{gs_out}/manifest.json"))
    entries = _shard_entries(manifest)
    assert entries
    for shard in entries:
        path = f"{gs_out}/{shard['path']}"
        assert object_crc32c(path) == shard["crc32c"], path
        # Both recorded: what was computed while writing and what GCS reports.
        assert shard.pop("storage_crc32c") == shard["crc32c"], path
        assert gcs.object_metadata(path)["size"] == shard["bytes"], path
    gs_sha = {
        name.rsplit("/", 1)[1]: hashlib.sha256(gcs.download(name)).hexdigest()
        for name in gcs.list(gs_out + "/") if ".tfrecord" in name and not name.endswith(".idx")
    }
    assert gs_sha == _local_sha256(local_out)
    assert {s["path"]: s["sha256"] for s in entries} == gs_sha
    # Issue 22: each shard's index file, beside it on GCS, as the manifest lists it.
    for shard in entries:
        index = gcs.download(f"{gs_out}/{shard['index']['path']}")
        assert hashlib.sha256(index).hexdigest() == shard["index"]["sha256"]
        with open(os.path.join(local_out, shard["index"]["path"]), "rb") as f:
            assert f.read() == index
    with open(os.path.join(local_out, "manifest.json"), encoding="utf-8") as f:
        local_entries = _shard_entries(json.load(f))
    assert local_entries == entries
    return manifest


@pytest.fixture(scope="module")
def image_tree(gcs_emulator, tmp_path_factory):
    local = str(tmp_path_factory.mktemp("gcs-images") / "images")
    make_class_folder_sample(local, per_class=2, splits=None)
    gcs_emulator.upload_tree(local, "gs://b/images")
    return local


@pytest.mark.emulator
def test_convert_images_gs_to_gs(gcs, image_tree, tmp_path):
    start = time.monotonic()
    code, _ = _timed("convert gs://b/images -> gs://b/out-images", main, [
        "convert", "--input", "gs://b/images", "--output", "gs://b/out-images", *SHARD_FLAGS])
    assert code == 0
    assert gcs.exists("gs://b/out-images/manifest.json")
    code, _ = _timed("verify gs://b/out-images", main, ["verify", "gs://b/out-images"])
    assert code == 0
    print(f"[timing] whole gs:// image run (convert + verify): {time.monotonic() - start:.2f} s")

    local_out = str(tmp_path / "out-images")
    code, _ = _timed("convert local copy", main, [
        "convert", "--input", image_tree, "--output", local_out, *SHARD_FLAGS])
    assert code == 0
    manifest = _check_against_local(gcs, "gs://b/out-images", local_out)
    assert manifest["splits"]["train"]["records"] == 8


@pytest.mark.emulator
def test_verify_on_gcs_catches_a_changed_shard(gcs, image_tree, tmp_path, capsys):
    code = main(["convert", "--input", "gs://b/images", "--output", "gs://b/out-corrupt",
                 *SHARD_FLAGS])
    assert code == 0
    manifest = json.loads(gcs.download("gs://b/out-corrupt/manifest.json"))
    shard = _shard_entries(manifest)[0]
    path = f"gs://b/out-corrupt/{shard['path']}"
    data = bytearray(gcs.download(path))
    data[len(data) // 2] ^= 0x01
    gcs.overwrite_object(path, bytes(data))
    assert object_crc32c(path) != shard["crc32c"]
    capsys.readouterr()
    # Without --full: GCS's own crc32c is compared with the manifest, nothing is downloaded.
    assert main(["verify", "gs://b/out-corrupt"]) == 1
    report = capsys.readouterr().out
    assert f"FAIL  {path}  GCS reports crc32c {object_crc32c(path)}" in report
    assert "not downloaded" in report  # The untouched shards were checked the same way.
    # With --full the re-read finds the damaged record too.
    assert main(["verify", "gs://b/out-corrupt", "--full"]) == 1


def _rewrite_last_byte(result):
    """Someone rewrites the object between the write and the check."""
    from google.cloud import storage  # pylint: disable=import-outside-toplevel

    bucket, name = result.temp_path[len("gs://"):].split("/", 1)
    blob = storage.Client.create_anonymous_client().bucket(bucket).blob(name)
    blob.upload_from_string(blob.download_as_bytes()[:-1] + b"\x00")
    return result


@pytest.mark.emulator
def test_pipeline_catches_an_object_changed_after_writing(gcs, image_tree, tmp_path):
    import apache_beam as beam  # pylint: disable=import-outside-toplevel
    from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline  # pylint: disable=import-outside-toplevel
    from apache_beam.testing.util import assert_that, equal_to  # pylint: disable=import-outside-toplevel

    from beam_tfrecords.schemas.config import (
        ConvertConfig,
    )  # pylint: disable=import-outside-toplevel

    # pylint: disable=import-outside-toplevel
    from beam_tfrecords.schemas.shards import ShardTarget
    from beam_tfrecords.transforms.image_steps import ImageRecords, ListImages, PlanImageShards
    from beam_tfrecords.transforms.shard_engine import VerifyShards, WriteShards

    config = ConvertConfig(input="gs://b/images", output="gs://b/out-changed", encode_processes=0)

    with BeamTestPipeline() as p:
        verdicts = (
            (p | ListImages(config.input, config.layout, None, config.output)).refs
            | PlanImageShards(config.band)
            | WriteShards(ShardTarget(config.output, run_id="test"), ImageRecords())
            | beam.Map(_rewrite_last_byte) | VerifyShards()
            | beam.Map(lambda r: (r.verified, r.verify_error.startswith("GCS reports crc32c"),
                                  r.storage_crc32c != r.crc32c))
        )
        assert_that(verdicts, equal_to([(False, True, True)]))


@pytest.mark.emulator
def test_overwrite_and_stale_shards_on_gcs(gcs, image_tree):
    out = "gs://b/out-rerun"
    assert main(["convert", "--input", "gs://b/images", "--output", out, *SHARD_FLAGS]) == 0
    first = [p for p in gcs.list(out + "/") if ".tfrecord" in p]
    assert len(first) > 1
    # A finished dataset is refused without --overwrite (exists() on GCS).
    assert main(["convert", "--input", "gs://b/images", "--output", out, *SHARD_FLAGS]) == 2
    # One big shard now: the old shards are deleted from GCS after the new manifest.
    assert main(["convert", "--input", "gs://b/images", "--output", out, "--overwrite",
                 "--shard_min_mb", "1", "--shard_max_mb", "2"]) == 0
    assert [p for p in gcs.list(out + "/") if ".tfrecord" in p] == [f"{out}/train-00000-of-00001.tfrecord",
                                                                   f"{out}/train-00000-of-00001.tfrecord.idx"]
    assert main(["verify", out]) == 0


@pytest.mark.emulator
def test_dead_letter_on_gcs(gcs, image_tree):
    gcs.upload_tree(image_tree, "gs://b/images-bad")
    gcs.upload_bytes("gs://b/images-bad/circles/broken.jpg", b"not a jpeg at all")
    out = "gs://b/out-bad"
    assert main(["convert", "--input", "gs://b/images-bad", "--output", out, *SHARD_FLAGS,
                 "--max_bad_fraction", "0.5"]) == 0
    letters = [p for p in gcs.list(out + "/dead_letter/") if p.endswith(".jsonl")]
    assert letters
    lines = [json.loads(line) for p in letters for line in gcs.download(p).decode().splitlines()]
    assert [(line["source"], line["error"]) for line in lines] == [
        ("circles/broken.jpg", "not_an_image")]  # Relative to the input root.
    manifest = json.loads(gcs.download(f"{out}/manifest.json"))
    assert manifest["splits"]["train"]["records"] == 8


@pytest.fixture(scope="module")
def table_csv(gcs_emulator, tmp_path_factory):
    local = str(tmp_path_factory.mktemp("gcs-table") / "table.csv")
    with open(local, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "score"])
        for i in range(20):
            writer.writerow([i, f"{(i * 37 % 101) / 7:.4f}"])
    with open(local, "rb") as f:
        gcs_emulator.upload_bytes("gs://b/table.csv", f.read())
    return local


@pytest.mark.emulator
def test_convert_table_gs_to_gs(gcs, table_csv, tmp_path):
    start = time.monotonic()
    code, _ = _timed("convert gs://b/table.csv -> gs://b/out-table", main, [
        "convert", "--input", "gs://b/table.csv", "--output", "gs://b/out-table", *SHARD_FLAGS])
    assert code == 0
    assert gcs.exists("gs://b/out-table/manifest.json")
    assert main(["verify", "gs://b/out-table"]) == 0
    print(f"[timing] whole gs:// table run (convert + verify): {time.monotonic() - start:.2f} s")
    # The spool files are scratch: none is left in the output.
    assert not [p for p in gcs.list("gs://b/out-table/") if "/.beam-tfrecords/" in p]

    local_out = str(tmp_path / "out-table")
    code = main(["convert", "--input", table_csv, "--output", local_out, *SHARD_FLAGS])
    assert code == 0
    manifest = _check_against_local(gcs, "gs://b/out-table", local_out)
    assert manifest["splits"]["train"]["records"] == 20


@pytest.mark.emulator
def test_convert_images_multi_processing_workers_do_not_stall(gcs, image_tree, tmp_path, caplog, capfd):
    """Beam worker processes: ``--beam_plugin beam_tfrecords.transforms.io.gcs`` makes each one import the recipe.

    A worker without it looks for credentials on the metadata server and logs
    its retries to the stderr it shares with this process (captured by ``capfd``).
    """
    with caplog.at_level(logging.WARNING):
        code, elapsed = _timed("convert gs:// multi_processing x2 (--beam_plugin beam_tfrecords.transforms.io.gcs)",
                               main, ["convert", "--input", "gs://b/images", "--output",
                                      "gs://b/out-mp", *SHARD_FLAGS,
                                      "--direct_running_mode=multi_processing",
                                      "--direct_num_workers=2", "--beam_plugin=beam_tfrecords.transforms.io.gcs"])
    assert code == 0
    assert _credential_retries(caplog) == []
    worker_stderr = capfd.readouterr().err
    assert CREDENTIAL_RETRY not in worker_stderr, worker_stderr[-2000:]
    print(f"[timing] (not asserted: shared machines are noisy) {elapsed:.2f} s")
    local_out = str(tmp_path / "out-mp")
    assert main(["convert", "--input", image_tree, "--output", local_out, *SHARD_FLAGS]) == 0
    _check_against_local(gcs, "gs://b/out-mp", local_out)


@pytest.mark.emulator
def test_cli_process_env_only_has_no_credential_stall(gcs, image_tree):
    """A user's command line against the emulator: environment variables only."""
    env = dict(os.environ, PYTHONPATH=REPO)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "beam_tfrecords", "convert", "--input", "gs://b/images",
         "--output", "gs://b/out-cli", *SHARD_FLAGS],
        check=False, cwd=REPO, env=env, capture_output=True, text=True,
        timeout=SUBPROCESS_TIMEOUT)
    elapsed = time.monotonic() - start
    print(f"[timing] CLI process convert gs:// -> gs:// (env only): {elapsed:.2f} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    retries = proc.stderr.count(CREDENTIAL_RETRY)
    print(f"credential retries logged: {retries}")
    assert retries == 0


@pytest.mark.emulator
def test_listing_by_prefixes_side_by_side_equals_one_listing(gcs, monkeypatch):
    """The folders under a glob are listed by several threads; the stream (order,
    sizes, generations, crc32c) equals one plain listing's and Beam's match,
    whatever the layout: objects beside folders, names sorting between a folder
    and its neighbours ('a.jpg' < 'a/' < 'a0'), non-ASCII names, a folder marker
    object, deep and flat folders."""
    from apache_beam.io.filesystems import FileSystems

    from beam_tfrecords.transforms.io import files

    names = ["data/a.jpg", "data/a/x.png", "data/a/y/z.png", "data/a0/y.png", "data/a0.png",
             "data/b/c/d/e.png", "data/b/c/f.png", "data/p/", "data/p/q.png", "data/z.png",
             "data/ä/1.png", "data/日本/2.png", "data/sp ace/3.png", "dat.png", "datb/x.png"]
    names += [f"data/train/c{i % 6:02d}/{i:04d}.png" for i in range(60)]
    for number, name in enumerate(names):
        gcs.upload_bytes(f"gs://prefixes/{name}", name.encode() * (number % 5))
    monkeypatch.setattr(files, "_MIN_PREFIXES", 2)
    for pattern in ("gs://prefixes/data/**", "gs://prefixes/**", "gs://prefixes/data/*/*.png",
                    "gs://prefixes/da*", "gs://prefixes/data/train/**", "gs://prefixes/data/a/**"):
        one = list(files._list_gcs(pattern, threads=1))  # pylint: disable=protected-access
        for threads in (2, 8):
            assert list(files._list_gcs(pattern, threads=threads)) == one, (pattern, threads)  # pylint: disable=protected-access
        beam = sorted((m.path, m.size_in_bytes) for m in FileSystems.match([pattern])[0].metadata_list)
        assert [(path, size) for path, size, _, _ in one] == beam, pattern
        assert one and all(generation > 0 and crc >= 0 for _, _, generation, crc in one)
    listed = [path for path, *_ in files._list_gcs("gs://prefixes/**", threads=8)]  # pylint: disable=protected-access
    assert listed == sorted(listed) and len(listed) == len(names)
