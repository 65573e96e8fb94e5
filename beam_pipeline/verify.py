"""``verify``: re-check a dataset against its manifest, or CRC-scan any TFRecords.

With a manifest, every listed shard must exist and match its record count,
size, CRC-32C and SHA-256, every record's CRCs must hold, and no other TFRecord
file may sit beside them; every dead-letter file it lists must exist, and their
lines add up to the bad inputs it counts (``bad_records.total``; for
``skipped.jsonl``, ``input.skipped.by_reason``). A folder without a manifest is not a finished dataset
and fails; asked to (``scan_only``), or given a glob or a file, every
``*.tfrecord[.gz]`` file found is scanned record by record instead (a run's
unfinished work folder, ``.beam-tfrecords/``, is left out). A folder scan also
fails an empty (0-byte) file and a shard set that is incomplete or mixed
(``train-00003-of-00004`` beside ``train-00000-of-00002``): what a reader
globbing the folder would get is not one dataset.

Every reader of a dataset in this package (``verify``, ``inspect``,
``dataset_shards``, scheduled runs, ``--compare_to``) reads its manifests through
``manifest_text`` and ``parse_manifest`` and opens what they name through
``dataset_path``: a manifest that is malformed, or names a path outside its
folder (``..``, an absolute path, a scheme, or locally a symbolic link leading
out), fails with one line (``ValueError``) naming the file, the key and the value.

Memory: a shard is checked in one pass holding at most ``SCAN_MEMORY_BYTES``
(16 MB) whatever its length fields claim (``transforms.codec.tfrecord``), two
shards at a time.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os

from beam_tfrecords.schemas.inputs import PART_PREFIX
from beam_tfrecords.schemas.manifest import (
    MANIFEST_NAME,
    manifest_shards,
    outside_folder,
    parse_manifest,
    shown_value,
)
from beam_tfrecords.schemas.shards import WORK_DIR, parse_shard_name
from beam_tfrecords.transforms.codec.record_index import first_index_fault
from beam_tfrecords.transforms.codec.tfrecord import FileDigest, digest_stream
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.gcs import is_gcs
from beam_tfrecords.transforms.io.tfds_output import tfds_problems
from beam_tfrecords.transforms.shard_engine import storage_crc32c_check, verify_shard

__all__ = [
    "ShardCheck",
    "VerifyReport",
    "dataset_path",
    "dataset_shards",
    "manifest_decoded",
    "manifest_text",
    "part_manifest",
    "verify_dataset",
]


@dataclasses.dataclass(frozen=True)
class ShardCheck:
    """The verdict on one file."""

    path: str
    ok: bool
    records: int | None = None
    bytes: int | None = None
    error: str = ""
    how: str = ""


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """The verdict on a dataset."""

    location: str
    with_manifest: bool
    checks: tuple[ShardCheck, ...]
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem and bool(self.checks) and all(c.ok for c in self.checks)

    def lines(self) -> list[str]:
        """A per-shard report for people."""
        mode = f"against {MANIFEST_NAME}" if self.with_manifest else "CRC scan (no manifest)"
        if self.problem:
            return [f"Verifying {self.location}", f"  FAIL  {self.problem}",
                    "0 files checked; the dataset is not verified"]
        out = [f"Verifying {self.location} ({mode})"]
        for c in self.checks:
            if c.ok:
                how = f"  ({c.how})" if c.how and c.how != "re-read" else ""
                out.append(f"  OK    {c.path}  {c.records} records  {c.bytes} bytes{how}")
            else:
                out.append(f"  FAIL  {c.path}  {c.error}")
        if not self.checks:
            out.append("  FAIL  no TFRecord files found")
        bad = sum(not c.ok for c in self.checks)
        out.append(
            f"{len(self.checks) - bad} of {len(self.checks)} files OK"
            + ("" if self.ok else f"; {bad} failed")
        )
        return out


_TFRECORD_SUFFIXES = (".tfrecord", ".tfrecord.gz")
_BLOCK = 1 << 22


def _set_problems(paths: list[str]) -> dict[str, str]:
    """``{path: why}`` for shard-named files that do not form one complete set per split."""
    by_split: dict[tuple[str, str], dict[int, list[tuple[int, str]]]] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        parsed = parse_shard_name(name)
        if parsed:
            split, index, count = parsed
            by_split.setdefault((folder, split), {}).setdefault(count, []).append((index, path))
    problems = {}
    for (_, split), sets in by_split.items():
        counts = sorted(sets)
        for count in counts:
            have = {index for index, _ in sets[count]}
            missing = sorted(set(range(count)) - have)
            for _, path in sets[count]:
                if len(counts) > 1:
                    problems[path] = (f"split {split!r} mixes shard sets of "
                                      f"{' and '.join(map(str, counts))} shards (old and new runs?)")
                elif missing:
                    problems[path] = (f"split {split!r} is incomplete: {len(missing)} of its "
                                      f"{count} shards missing (e.g. index {missing[0]})")
    return problems


def _compression(path: str) -> str:
    return "gzip" if path.endswith(".gz") else "none"


@dataclasses.dataclass(frozen=True)
class _IndexFile:
    """A shard's index file as its manifest lists it (``splits.*.shards[].index``)."""

    path: str
    bytes: int
    sha256: str


def _check(path: str, expected: FileDigest | None, sizes: dict[str, int], full: bool,
           index: _IndexFile | None = None) -> ShardCheck:
    check = _check_shard(path, expected, sizes, full, index)
    if not check.ok or index is None:
        return check
    error = _index_problem(path, index)
    return dataclasses.replace(check, ok=False, error=error) if error else check


def _index_problem(path: str, index: _IndexFile) -> str:
    """'' when a shard's index file holds the bytes its manifest records; else one
    line saying what is wrong with it (the first line that does not match the
    shard's framing, when that is what differs)."""
    name = index.path.rsplit("/", 1)[-1]
    try:
        with files.open_read(index.path) as stream:
            size, _, sha = digest_stream(stream)
    except FileNotFoundError:
        return f"its index file {name} (listed in {MANIFEST_NAME}) is missing"
    if (size, sha) == (index.bytes, index.sha256):
        return ""
    try:
        with files.open_read(path) as shard, files.open_read(index.path) as lines:
            fault = first_index_fault(shard, lines)
    except OSError as err:
        fault = f"cannot read it: {err}"
    return (f"its index file {name} is not the one {MANIFEST_NAME} records (sha256): "
            + (fault or "its lines match the shard, its bytes do not"))


def _check_shard(path: str, expected: FileDigest | None, sizes: dict[str, int], full: bool,
                 index: _IndexFile | None) -> ShardCheck:
    if expected is not None and is_gcs(path):
        # GCS keeps a CRC-32C of every object: compare it without downloading.
        _, error = storage_crc32c_check(path, expected.crc32c)
        if not error and sizes.get(path) != expected.bytes:
            error = f"size {sizes.get(path)} != expected {expected.bytes}"
        if error or not full:
            return ShardCheck(path, not error, expected.records, expected.bytes, error,
                              how="" if error else "GCS crc32c and size match (not downloaded)")
    written = None if index is None or expected is None else FileDigest(
        expected.records, index.bytes, "", index.sha256)
    digest, error = verify_shard(path, _compression(path), expected, index=written)
    if digest is None or error:
        return ShardCheck(path, False, error=error)
    return ShardCheck(path, True, digest.records, digest.bytes, how="re-read")


def manifest_text(path: str) -> str | None:
    """A manifest file's text, ``None`` when there is no such file.

    Raises:
      ValueError: when it is not UTF-8 text (one line naming the file).
    """
    data = files.read_bytes_if_exists(path)
    return None if data is None else manifest_decoded(data, path)


def manifest_decoded(data: bytes, path: str) -> str:
    """A manifest's bytes as text (a leading BOM dropped).

    Raises:
      ValueError: when they are not UTF-8 (one line naming the file).
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}): not a dataset manifest") from None


def dataset_path(folder: str, rel: str, key: str, source: str) -> str:
    """Where a path a manifest names (``rel``, relative to ``folder``) is, once it
    is proved to stay inside ``folder``: the lexical rule of every manifest path
    (``schemas.manifest.outside_folder``) and, on a local disk, no symbolic link
    leading out of ``folder``.

    Args:
      folder: the manifest's folder.
      rel: the path as the manifest gives it.
      key: where the manifest gives it (``splits.train.shards[0].path``).
      source: the manifest's path, for the message.

    Raises:
      ValueError: one line naming ``source``, ``key`` and the value (escaped).
    """
    why = outside_folder(rel)
    if not why:
        path = files.join(folder, rel)
        target = files.link_outside(folder, path)
        if not target:
            return path
        why = f"is a symbolic link to {shown_value(target)}"
    raise ValueError(f"{source}: {key}: {shown_value(rel)} {why}: it leads outside the dataset "
                     "folder (a manifest names files inside its own folder only)")


def part_manifest(location: str, source: str, index: int, part: dict) -> tuple[str, str, str | None]:
    """``(folder, manifest path, manifest text or None when missing)`` of the
    incremental part ``parts[index]`` of the dataset at ``location`` (its folder and
    manifest proved to stay inside; the text is not yet checked against the
    SHA-256 the root manifest lists).

    Raises:
      ValueError: when the part leads outside the dataset folder.
    """
    key = f"parts[{index}].path"
    folder = dataset_path(location, part["path"], key, source)
    path = dataset_path(location, f"{part['path']}/{MANIFEST_NAME}", key, source)
    return folder, path, manifest_text(path)


def _folder_jobs(folder: str, manifest: dict, source: str) -> tuple[list, list]:
    """The shards one manifest lists, and TFRecord files beside them it does not."""
    jobs = [(dataset_path(folder, e.path, e.key, source),
             FileDigest(e.records, e.bytes, e.crc32c, e.sha256),
             _IndexFile(dataset_path(folder, e.index_path, e.key.removesuffix(".path") + ".index.path", source),
                        e.index_bytes, e.index_sha256) if e.index_path else None)
            for e in manifest_shards(manifest)]
    listed = {job[0] for job in jobs}
    extra = [
        (path, f"TFRecord file not listed in {MANIFEST_NAME}")
        for path, _ in files.list_files(files.join(folder, "*"))
        if (parse_shard_name(path.rsplit("/", 1)[-1]) or path.endswith(_TFRECORD_SUFFIXES))
        and path not in listed
    ]
    extra += _dead_letter_problems(folder, manifest, source) + _label_map_problems(folder, manifest, source)
    # The TFDS metadata: recomputed from the manifest, compared byte for byte.
    return jobs, extra + tfds_problems(folder, manifest)


def _label_map_problems(folder: str, manifest: dict, source: str) -> list[tuple[str, str]]:
    """An annotated dataset's ``label_map.pbtxt``: missing, or not the bytes whose
    SHA-256 ``annotations.label_map.sha256`` records."""
    annotations = manifest.get("annotations")
    label_map = annotations.get("label_map") if isinstance(annotations, dict) else None
    if not isinstance(label_map, dict) or not isinstance(label_map.get("path"), str):
        return []
    path = dataset_path(folder, label_map["path"], "annotations.label_map.path", source)
    data = files.read_bytes_if_exists(path)
    if data is None:
        return [(path, f"label map listed in {MANIFEST_NAME} is missing")]
    if hashlib.sha256(data).hexdigest() != label_map.get("sha256"):
        return [(path, f"label map differs from the one {MANIFEST_NAME} records (sha256)")]
    return []


def _lines(path: str) -> int | None:
    """The lines of a file, read a block at a time (``None`` when it is not there)."""
    if not files.exists(path):
        return None
    count, last = 0, b"\n"
    with files.open_read(path) as stream:
        for block in iter(lambda: stream.read(_BLOCK), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _dead_letter_problems(folder: str, manifest: dict, source: str) -> list[tuple[str, str]]:
    """The dead-letter files a manifest names that are missing, or whose letters do not
    add up to what it counts: ``bad_records.dead_letter_files`` against
    ``bad_records.total``, and ``input.skipped.file`` against its ``by_reason``."""
    bad = manifest.get("bad_records") or {}
    names = list(bad.get("dead_letter_files") or [])
    # An annotated run's objects left out against the pixels (stage ``object``) share the
    # shards' files without being bad records: the manifest counts them apart.
    annotations = manifest.get("annotations") if isinstance(manifest.get("annotations"), dict) else {}
    objects = annotations.get("objects_dead_lettered", 0)
    total = bad.get("total")
    expected = total + objects if isinstance(total, int) and isinstance(objects, int) else total
    groups = [([(n, f"bad_records.dead_letter_files[{i}]") for i, n in enumerate(names)], expected,
               "bad_records.total" + (" + annotations.objects_dead_lettered" if objects else ""))]
    skipped = (manifest.get("input") or {}).get("skipped") or {}
    if isinstance(skipped.get("file"), str):
        groups.append(([(skipped["file"], "input.skipped.file")],
                       sum((skipped.get("by_reason") or {}).values()), "input.skipped.by_reason"))
    problems = []
    for listed, expected, key in groups:
        paths = [dataset_path(folder, name, where, source) for name, where in listed]
        lines = [_lines(path) for path in paths]
        problems += [(path, f"dead-letter file listed in {MANIFEST_NAME} is missing")
                     for path, n in zip(paths, lines) if n is None]
        if not paths or None in lines or not isinstance(expected, int) or sum(lines) == expected:
            continue
        held = (f"holds {lines[0]} letters" if len(paths) == 1 else
                f"and the {len(paths) - 1} other dead-letter files listed hold {sum(lines)} letters")
        problems.append((paths[0], f"dead-letter file {held}; {MANIFEST_NAME} {key} counts {expected}"))
    return problems


def _manifest_jobs(location: str, manifest_path: str) -> tuple[list, list]:
    """Every shard of a dataset (its first run's and each incremental part's, each
    part's manifest checked against the SHA-256 the root manifest lists), and the
    problems found on the way (unlisted TFRecords and part folders).

    Raises:
      ValueError: when a manifest is malformed or names a path outside its folder.
    """
    text = manifest_text(manifest_path)
    if text is None:
        raise ValueError(f"{manifest_path} does not exist")
    manifest = parse_manifest(text, manifest_path)
    jobs, extra = _folder_jobs(location, manifest, manifest_path)
    listed_parts = set()
    for i, part in enumerate(manifest.get("parts", [])):
        folder, part_path, part_text = part_manifest(location, manifest_path, i, part)
        listed_parts.add(part["path"])
        if part_text is None:
            extra.append((part_path, "the part's manifest is missing"))
            continue
        if hashlib.sha256(part_text.encode("utf-8")).hexdigest() != part["manifest_sha256"]:
            extra.append((part_path, f"does not match the SHA-256 the root {MANIFEST_NAME} lists"))
            continue
        part_jobs, part_extra = _folder_jobs(folder, parse_manifest(part_text, part_path), part_path)
        jobs += part_jobs
        extra += part_extra
    prefix = files.join(location, PART_PREFIX)
    for path, _ in files.list_files(files.join(location, "**")):
        if path.startswith(prefix) and path.endswith(_TFRECORD_SUFFIXES) and f"/{WORK_DIR}/" not in path:
            name = path[len(files.join(location, "")):].split("/", 1)[0]
            if name not in listed_parts:
                extra.append((path, f"in part folder {name}, which {MANIFEST_NAME} does not list "
                              "(left by a killed incremental run; the next one removes it)"))
    return jobs, extra


def dataset_shards(location: str, split: str | None = None) -> list[str]:
    """The shard paths of a published dataset, its parts' included, in manifest order.

    Readers: ``tf.data.TFRecordDataset(dataset_shards(OUT, "train"))``. Every path
    is proved to stay inside ``location`` (``dataset_path``), and each part's
    manifest to be the one the root manifest lists (its SHA-256).

    Raises:
      ValueError: when ``location`` holds no ``manifest.json``, or a manifest is
        malformed, names a path outside its folder, or is missing or changed.
    """
    manifest_path = files.join(location, MANIFEST_NAME)
    text = manifest_text(manifest_path)
    if text is None:
        raise ValueError(f"{location} holds no {MANIFEST_NAME}: not a finished dataset")
    manifest = parse_manifest(text, manifest_path)
    folders = [(location, manifest, manifest_path)]
    for i, part in enumerate(manifest.get("parts", [])):
        folder, part_path, part_text = part_manifest(location, manifest_path, i, part)
        if part_text is None:
            raise ValueError(f"{part_path} is missing (the part parts[{i}] of {manifest_path})")
        if hashlib.sha256(part_text.encode("utf-8")).hexdigest() != part["manifest_sha256"]:
            raise ValueError(f"{part_path} does not match the SHA-256 {manifest_path} lists "
                             f"for parts[{i}]")
        folders.append((folder, parse_manifest(part_text, part_path), part_path))
    return [dataset_path(folder, e.path, e.key, source) for folder, m, source in folders
            for e in manifest_shards(m) if split is None or e.split == split]


def verify_dataset(location: str, threads: int = 2, full: bool = False,
                   scan_only: bool = False) -> VerifyReport:
    """Verifies a dataset folder (or a glob or file of TFRecords without a manifest).

    Args:
      location: an output folder of ``convert``, any folder, glob or file.
      threads: shards checked at once.
      full: on GCS, also re-read every shard (otherwise, with a manifest, each
        object's stored CRC-32C and size are compared, without downloading).
      scan_only: CRC-scan the TFRecord files of a folder that has no manifest,
        instead of failing it.

    Raises:
      ValueError: when ``location`` does not exist (or, a glob, matches nothing).
    """
    manifest_path = files.join(location, MANIFEST_NAME)
    is_folder = not ("*" in location or location.endswith((".tfrecord", ".gz")))
    if is_folder:
        if not files.list_files(files.join(location, "**"), limit=1) and not (
                files.is_local(location) and os.path.isdir(location)):
            raise ValueError(f"{location} does not exist")
    elif not files.list_files(location, limit=1):
        raise ValueError(f"no files match {location}")
    if is_folder and not scan_only and not files.exists(manifest_path):
        if not files.list_files(files.join(location, "**"), limit=1):
            problem = f"{location} holds no files"
        else:
            problem = (f"no {MANIFEST_NAME}: not a finished dataset (a run failed or is still "
                       "going, or this is not a convert output); --scan_only CRC-scans the "
                       "TFRecord files instead")
        return VerifyReport(location, False, (), problem)
    if files.exists(manifest_path):
        jobs, extra = _manifest_jobs(location, manifest_path)
        with_manifest = True
    else:
        pattern = location if "*" in location or location.endswith((".tfrecord", ".gz")) \
            else files.join(location, "**")
        found = [(path, size) for path, size in sorted(files.list_files(pattern))
                 if path.endswith(_TFRECORD_SUFFIXES) and f"/{WORK_DIR}/" not in path]
        extra, with_manifest = [], False
        if is_folder:
            problems = _set_problems([path for path, _ in found])
            problems.update({path: "empty file (0 bytes): a shard holds at least one record"
                             for path, size in found if size == 0})
            extra = sorted(problems.items())
            found = [(path, size) for path, size in found if path not in problems]
        jobs = [(path, None, None) for path, _ in found]
    sizes = dict(files.list_files(files.join(location, "**"))) if is_gcs(location) else {}
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        checks = list(pool.map(lambda job: _check(job[0], job[1], sizes, full, job[2]), jobs))
    checks += [ShardCheck(path, False, error=why) for path, why in extra]
    checks.sort(key=lambda c: c.path)
    return VerifyReport(location, with_manifest, tuple(checks))
