"""Issue 23 (WRITE): the bulk forms of the main process's per-record work give the
bytes the per-record forms gave: ``inputs.jsonl`` lines completed without a dict
or an encoder call per line, the index file's lines formatted in one call per
piece, and the shards' content lists encoded and parsed in one call each."""

from __future__ import annotations

import hashlib
import io
import json
import random

import pytest

from beam_tfrecords.schemas.inputs import complete_lines
from beam_tfrecords.transforms.codec.record_index import RecordIndex
from beam_tfrecords.transforms.codec.tfrecord import RecordError, TFRecordWriter, frame_record
from beam_tfrecords.transforms.io import progress
from beam_tfrecords.transforms.io.contents import ContentsError, read_contents, write_contents
from beam_tfrecords.transforms.io.files import write_bytes

pytestmark = pytest.mark.unit

_TEXTS = ["a", "/", "é", "\u2028", '"', "\\", "\n", "\x00", "😀", " ", "\t", "1"]


def _reference_line(line: str, digests: dict) -> tuple[str, str, list]:
    """What ``complete_lines`` made of a line before issue 23: json.loads, a dict, two encoders."""
    value = json.loads(line)
    path, role = value["path"], str(value.get("role", ""))
    out: dict = {"path": path}
    if role:
        out["role"] = role
    out["size"] = size = int(value["size"])
    mtime_ns = int(value.get("mtime_ns", 0))
    if mtime_ns:
        out["mtime_ns"] = mtime_ns
    generation = str(value.get("generation", ""))
    if generation:
        out["generation"] = generation
    sha256 = digests[path] if not role and path in digests else str(value.get("sha256", ""))
    if sha256:
        out["sha256"] = sha256
    crc32c = str(value.get("crc32c", ""))
    if crc32c:
        out["crc32c"] = crc32c
    content = f"sha256:{sha256}" if sha256 else f"crc32c:{crc32c}" if crc32c else ""
    token = [role, path, size, content or f"mtime_ns:{mtime_ns}:generation:{generation}"]
    return json.dumps(out, ensure_ascii=False) + "\n", json.dumps(token) + "\n", token


def _entry(rnd: random.Random, number: int) -> dict:
    def text() -> str:
        return "".join(rnd.choice(_TEXTS) for _ in range(rnd.randint(0, 5)))
    entry: dict = {"path": f"{number:05d}/{text()}", "size": rnd.randint(0, 10**13)}
    if rnd.random() < 0.6:
        entry["mtime_ns"] = rnd.choice([0, rnd.randint(1, 10**19)])
    for key in ("generation", "sha256", "crc32c"):
        if rnd.random() < 0.3:
            entry[key] = rnd.choice(["", text()])
    # Forms the fast path leaves to json.loads: a number as text, a bool, a float, a key of another kind.
    odd = rnd.random()
    if odd < 0.05:
        entry["size"] = str(entry["size"])
    elif odd < 0.08:
        entry["mtime_ns"] = True
    elif odd < 0.1:
        entry["size"] = 3.0
    elif odd < 0.12:
        entry["extra"] = 1
    return entry


def test_completed_lines_equal_the_per_line_encoding():
    rnd = random.Random(23)
    entries = [_entry(rnd, n) for n in range(3000)]
    lines = []
    for entry in entries:
        separators = rnd.choice([(", ", ": "), (",", ":")])
        line = json.dumps(entry, ensure_ascii=rnd.random() < 0.5, separators=separators)
        lines.append(line + (" " if rnd.random() < 0.05 else ""))
    role = json.dumps({"path": "/x/labels.txt", "role": "labels", "size": 7, "sha256": "ab"})
    data = "\n".join([role, *lines, ""]).encode("utf-8")  # Role files first, as written.
    digests = {e["path"]: rnd.choice(["", "c0ffee", "é"]) for e in entries if rnd.random() < 0.5}
    excluded = {entries[5]["path"], entries[70]["path"]}

    part = complete_lines(data, digests, excluded, sort=True)

    kept = [(line, entry) for line, entry in zip(lines, entries) if entry["path"] not in excluded]
    expected = [_reference_line(line, digests) for line, _ in kept]
    assert part.lines == (_reference_line(role, digests)[0]
                          + "".join(text for text, _, _ in expected)).encode("utf-8")
    assert part.file_tokens == "".join(token for _, token, _ in expected).encode("utf-8")
    assert part.role_tokens == (_reference_line(role, digests)[2],)
    assert part.files == len(kept)


@pytest.mark.parametrize("line", ['{"path": "a", "size": "x"}', '{"path": 1, "size": 2}', '{"path": "a"',
                                  '[1]', '{"path": "a", "size": 1} {}'])
def test_a_bad_line_is_still_named(line):
    data = f'{{"path": "0", "size": 1}}\n{line}\n'.encode()
    with pytest.raises(ValueError, match=r"^src line 2: "):
        complete_lines(data, {}, source="src")


def _reference_index(stream: bytes) -> bytes:
    lines, offset = [], 0
    while offset + 8 <= len(stream):
        length = int.from_bytes(stream[offset:offset + 8], "little") + 16
        lines.append(f"{offset} {length}\n")
        offset += length
    return "".join(lines).encode("ascii")


def test_index_of_pieces_cut_anywhere_is_the_per_record_index():
    rnd = random.Random(5)
    for _ in range(300):
        records = [frame_record(bytes(rnd.randrange(0, 300))) for _ in range(rnd.randrange(1, 40))]
        stream = b"".join(records)
        cuts = sorted(rnd.sample(range(len(stream) + 1), min(len(stream) + 1, rnd.randrange(0, 9))))
        sink = io.BytesIO()
        index = RecordIndex(sink)
        for start, end in zip([0, *cuts], [*cuts, len(stream)]):
            index.feed(stream[start:end])
        digest = index.finish()
        assert sink.getvalue() == _reference_index(stream)
        assert (digest.records, digest.bytes) == (len(records), len(sink.getvalue()))


def test_index_of_a_cut_stream_still_fails():
    stream = b"".join(frame_record(b"x" * n) for n in (3, 5, 7))
    index = RecordIndex()
    index.feed(stream[:-2])
    with pytest.raises(RecordError, match="ends inside a record"):
        index.finish()


def test_content_list_round_trip_and_refusals(tmp_path):
    entries = [(f"{n:064x}", f"d/ü\n{n}.png", "" if n % 3 else f"{n:064x}") for n in range(200)]
    path, sha256, count = write_contents(str(tmp_path), "train-00000-of-00001.tfrecord", entries)
    assert count == 200 and path
    assert [tuple(e) for e in read_contents(path, sha256, count)] == entries
    with pytest.raises(ContentsError, match="entries"):
        read_contents(path, sha256, count + 1)
    for bad in ([["a", "b"]] * 200, [["a", "b", 3]] * 200, {"a": 1}):
        data = json.dumps(bad).encode()
        write_bytes(path, data)
        with pytest.raises(ContentsError):
            read_contents(path, hashlib.sha256(data).hexdigest(), 200)



class _FailingSink(io.BytesIO):
    """A stream whose ``fail_at``-th write raises, as a store's connection would."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.writes = 0
        self._fail_at = fail_at

    def write(self, data) -> int:
        self.writes += 1
        if self.writes == self._fail_at:
            raise OSError("the store went away")
        return super().write(data)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_background_writer_writes_and_digests_the_same_bytes(compression):
    blocks = [b"".join(frame_record(bytes([n % 251]) * (n * 997 % 40000)) for n in range(k, k + 60))
              for k in range(0, 600, 60)]
    outputs = []
    for background in (False, True):
        sink = io.BytesIO()
        writer = TFRecordWriter(sink, compression, background=background)
        for block in blocks:
            writer.write_framed(block, 60)
        outputs.append((writer.close(), sink.getvalue()))
    assert outputs[0] == outputs[1]
    digest, data = outputs[1]
    assert digest.sha256 == hashlib.sha256(data).hexdigest() and digest.records == 600


def test_background_writer_raises_a_failed_write():
    sink = _FailingSink(fail_at=2)
    writer = TFRecordWriter(sink, background=True)
    with pytest.raises(OSError, match="went away"):
        for _ in range(8):
            writer.write_framed(frame_record(bytes(2 << 20)), 1)
        writer.close()
    writer.stop()
    writes = sink.writes
    assert writes >= 2 and sink.writes == writes  # Nothing is written once stopped.


def test_a_shard_verified_off_the_bundle_thread_is_counted_once():
    progress.reset()
    progress.watch(True)
    try:
        progress.add(shards=1, metrics=False)  # The verifying thread, as the check ends.
        assert progress.snapshot().shards == 1
        progress.add(shards=1, counters=False)  # The bundle's thread, when it yields the result.
        assert progress.snapshot().shards == 1
    finally:
        progress.watch(False)
        progress.reset()


def test_index_read_back_in_pieces_is_proved_against_the_index_written(tmp_path):
    import concurrent.futures
    import dataclasses

    from beam_tfrecords.transforms.codec.record_offsets import checkpoints
    from beam_tfrecords.transforms.shard_verification import verify_shard

    records = [frame_record(bytes([n % 256]) * (n * 7 % 900)) for n in range(3000)]
    path = tmp_path / "s.tfrecord"
    with open(path, "wb") as sink:
        index = RecordIndex()
        writer = TFRecordWriter(sink, observe=index.feed)
        writer.write_framed(b"".join(records), len(records))
        digest = writer.close()
    written = index.finish()
    boundaries = checkpoints([len(r) for r in records], every=100_000)
    assert len(boundaries) > 3
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert verify_shard(str(path), "none", digest, boundaries, pool, written) == (digest, "")
        other = dataclasses.replace(written, sha256="0" * 64)
        _, error = verify_shard(str(path), "none", digest, boundaries, pool, other)
        assert "is not the index written" in error
