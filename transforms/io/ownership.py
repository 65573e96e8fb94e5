"""Which files of an output folder this product wrote, and the journal that proves it.

A run removes or replaces only what it can prove it wrote:

- what the output's ``manifest.json`` lists: its shards and their index files, its parts, its
  dead-letter files (``skipped.jsonl`` too), its ``inputs.jsonl``, an annotated dataset's
  ``label_map.pbtxt``, and TFDS metadata holding the bytes it implies (``codec.tfds_metadata``);
- a ``run_report.json`` that records the SHA-256 of that manifest
  (``manifest_sha256``; a report without the field, beside a manifest, is one
  written before the field existed, and is taken as ours);
- what the journal records: ``OUT/.beam-tfrecords/journal/``, small JSON files,
  each written *before* the files it describes reach their final names (a
  write-ahead log): ``commit-<run>.json`` (every shard and ``inputs.jsonl`` a
  commit is about to rename to its final name, with size, CRC-32C and SHA-256,
  where from, and the manifest it replaces), ``file-<key>.json`` (a dead-letter
  file or a run report, with size and SHA-256), ``folder-<key>.json`` (an
  incremental part folder, recorded before it is created).

A file the journal records is proved by content (its size and checksum now
equal the recorded ones), not by name; a part folder by name (the journal
records it only when it did not exist yet). A successful run prunes the journal
to what it still has to prove (usually nothing, and the folder goes); a failed
or killed run leaves it for the next run, which treats what it proves as its own.

Every other file that a run would replace, or that a reader would take as part
of the dataset (shard-like names, ``part-*`` folders, the fixed names above
when not proved ours), is *foreign*: ``claim_output`` names it and the run is
refused before it starts. A folder of our own (``part-*``, ``dead_letter``, the
work folder, a ``tmp-*`` folder in it) that is a symbolic link is refused too:
cleanup never deletes through a link. Everything else is left alone.

The commit journal also holds what a retried commit needs to tell a rename it
already made (the file at the final name has the recorded checksum, the source
is gone) from one still to make.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import uuid
from collections.abc import Iterable, Sequence

import google_crc32c

from beam_tfrecords.schemas.annotations import LABEL_MAP_NAME
from beam_tfrecords.schemas.inputs import INPUTS_NAME, PART_PREFIX
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR, MANIFEST_NAME, REPORT_NAME, parse_manifest
from beam_tfrecords.schemas.shards import WORK_DIR, parse_shard_name
from beam_tfrecords.transforms.codec.tfds_metadata import is_tfds_file, tfds_digests
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.gcs import is_gcs, object_crc32c

__all__ = [
    "JOURNAL_DIR",
    "Claim",
    "OutputClaims",
    "OutputNotOurs",
    "claim_output",
    "commit_claims",
    "commit_journaled",
    "commit_replaces",
    "file_claim",
    "journal_commit",
    "listed_paths",
    "prune_journal",
    "is_shard_like",
    "record_folder",
    "remove_tree",
    "temporary_folders",
    "write_atomic",
    "write_owned",
]

JOURNAL_DIR = "journal"
_FORMAT = 1
_TFRECORD_SUFFIXES = (".tfrecord", ".tfrecord.gz", ".tfrecord.idx")  # A shard's index goes with it.
_SHOWN = 5  # Names in a refusal: the first few, then a count.
_CHUNK = 1 << 22


class OutputNotOurs(OSError):
    """The output holds files this product cannot prove it wrote, where a run
    would replace them or read them as part of the dataset (or a folder of its
    own is a link); the message is one line naming them."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """One thing the journal says this product put in an output folder.

    Attributes:
      path: relative to the output folder, '/'-separated; a folder ends in '/'.
      size: the file's bytes (-1 for a folder).
      sha256, crc32c: hex digests of the file's stored bytes ('' when not
        recorded; a file has at least one).
      source: where a commit moves it from (its temporary path), '' otherwise.
    """

    path: str
    size: int = -1
    sha256: str = ""
    crc32c: str = ""
    source: str = ""

    @property
    def folder(self) -> bool:
        return self.path.endswith("/")

    def to_json(self) -> dict:
        value = {"path": self.path, "size": self.size}
        value.update({k: v for k, v in (("sha256", self.sha256), ("crc32c", self.crc32c),
                                        ("source", self.source)) if v})
        return value

    @classmethod
    def from_json(cls, value) -> Claim | None:
        """The claim a journal line holds; ``None`` when it is not one (never trusted)."""
        if not isinstance(value, dict) or not isinstance(value.get("path"), str):
            return None
        size = value.get("size", -1)
        digests = [value.get(k, "") for k in ("sha256", "crc32c", "source")]
        if not isinstance(size, int) or not all(isinstance(d, str) for d in digests):
            return None
        claim = cls(value["path"], size, *digests)
        if not claim.path or claim.path.startswith("/") or ".." in claim.path.split("/"):
            return None  # A journal only ever names what is inside its output.
        if not claim.folder and not (claim.sha256 or claim.crc32c):
            return None  # A file is proved by content or not at all.
        return claim


def file_claim(relative: str, data: bytes, source: str = "") -> Claim:
    """The claim of a file of ``data`` at ``relative``."""
    return Claim(relative, len(data), hashlib.sha256(data).hexdigest(), source=source)


def _journal(output: str) -> str:
    return files.join(output, WORK_DIR, JOURNAL_DIR)


def _key(relative: str) -> str:
    return hashlib.sha256(relative.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def write_atomic(path: str, data: bytes) -> None:
    """Writes a whole file so that a reader (or a run killed half way) sees the old
    bytes or the new, never a part: locally through a sibling and a rename; on GCS
    an object write is whole by itself."""
    if not files.is_local(path):
        files.write_bytes(path, data)
        return
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    staged = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.part")
    try:
        with open(staged, "wb") as f:
            f.write(data)
        os.replace(staged, path)
    except BaseException:
        files.delete_files([staged])
        raise


def _record(output: str, name: str, claims: Sequence[Claim], run_id: str = "",
            replaces: dict | None = None) -> None:
    value: dict = {"format": _FORMAT, "run_id": run_id, "claims": [c.to_json() for c in claims]}
    if replaces is not None:
        value["replaces"] = replaces
    data = (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode("utf-8", "surrogateescape")
    write_atomic(files.join(_journal(output), f"{name}.json"), data)


def write_owned(output: str, relative: str, data: bytes) -> None:
    """Writes ``OUT/<relative>`` (a dead-letter file, a run report) after recording it
    in the journal, so that the next run can prove it is this product's."""
    _record(output, f"file-{_key(relative)}", [file_claim(relative, data)])
    write_atomic(files.join(output, relative), data)


def record_folder(output: str, relative: str) -> None:
    """Records ``OUT/<relative>/`` (a part folder about to be created) in the journal."""
    name = relative.rstrip("/") + "/"
    _record(output, f"folder-{_key(name)}", [Claim(name)])


def journal_commit(output: str, run_id: str, claims: Sequence[Claim], replaces: dict | None) -> None:
    """Records what a commit is about to put at final names (before the first rename),
    and the manifest it replaces (whose files stay ours until they are removed)."""
    _record(output, f"commit-{run_id}", claims, run_id, replaces)


def commit_journaled(output: str, run_id: str) -> bool:
    """Whether the journal holds ``run_id``'s commit record: a retried commit keeps
    its first attempt's, which names the manifest that attempt found (a retry after
    the new manifest was published would find only that one)."""
    return files.exists(files.join(_journal(output), f"commit-{run_id}.json"))


def commit_replaces(output: str, run_id: str) -> dict | None:
    """The manifest ``run_id``'s commit record says the commit replaces (as its first
    attempt found it); ``None`` when there is no record, or it names none."""
    try:
        data = files.read_bytes_if_exists(files.join(_journal(output), f"commit-{run_id}.json"))
        value = json.loads(data.decode("utf-8", "surrogateescape")) if data else None
    except ValueError:
        return None
    replaces = value.get("replaces") if isinstance(value, dict) and value.get("format") == _FORMAT else None
    return replaces if isinstance(replaces, dict) else None


def commit_claims(output: str, run_id: str) -> list[Claim]:
    """What ``run_id``'s commit record says the commit puts at final names (``[]``
    when there is no record): a retry finds there the size and checksum of a file
    its first attempt moved already."""
    try:
        data = files.read_bytes_if_exists(files.join(_journal(output), f"commit-{run_id}.json"))
        value = json.loads(data.decode("utf-8", "surrogateescape")) if data else None
    except ValueError:
        return []
    if not isinstance(value, dict) or value.get("format") != _FORMAT:
        return []
    return [c for c in (Claim.from_json(v) for v in value.get("claims") or []) if c]


def _read_journal(output: str) -> list[tuple[str, list[Claim], dict | None]]:
    """``(journal file, claims, replaced manifest)`` of every journal file that parses."""
    found = []
    for path, _ in files.list_under(_journal(output)):
        if not path.endswith(".json") or path.rsplit("/", 1)[-1].startswith("."):
            continue
        try:
            value = json.loads(files.read_bytes(path).decode("utf-8", "surrogateescape"))
        except (ValueError, OSError):
            continue  # Not ours to trust: it proves nothing.
        if not isinstance(value, dict) or value.get("format") != _FORMAT:
            continue
        claims = [c for c in (Claim.from_json(v) for v in value.get("claims") or []) if c]
        replaces = value.get("replaces")
        found.append((path, claims, replaces if isinstance(replaces, dict) else None))
    return found


def listed_paths(manifest: dict | None) -> set[str]:
    """What a manifest lists, relative to its folder (a part folder ends in '/')."""
    if not isinstance(manifest, dict):
        return set()
    listed: set[str] = set()

    def get(value, *keys):
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    for info in (manifest.get("splits") or {}).values() if isinstance(manifest.get("splits"), dict) else []:
        for shard in get(info, "shards") or []:
            if isinstance(get(shard, "path"), str):
                listed.add(shard["path"])
            if isinstance(get(shard, "index", "path"), str):
                listed.add(shard["index"]["path"])
    for part in manifest.get("parts") or [] if isinstance(manifest.get("parts"), list) else []:
        if isinstance(get(part, "path"), str):
            listed.add(part["path"].rstrip("/") + "/")
    for path in get(manifest, "bad_records", "dead_letter_files") or []:
        if isinstance(path, str):
            listed.add(path)
    for value in (get(manifest, "input", "skipped", "file"), get(manifest, "input", "files_list", "path"),
                  get(manifest, "annotations", "label_map", "path")):
        if isinstance(value, str):
            listed.add(value)
    return {p for p in listed if p and not p.startswith("/") and ".." not in p.split("/")}


# --- what is in the folder ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Entry:
    """A file or folder of the output (relative path), as listed: links not followed."""

    path: str
    folder: bool = False
    link: bool = False
    size: int = -1
    stamp: int = 0  # A local file's modification time (ns): checksums are cached by it.


def _local_entries(folder: str, prefix: str = "") -> list[_Entry]:
    try:
        scanned = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in scanned:
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # Gone since the folder was read.
        link = stat.S_ISLNK(info.st_mode)
        found.append(_Entry(prefix + entry.name, stat.S_ISDIR(info.st_mode), link,
                            -1 if link else info.st_size, info.st_mtime_ns))
    return sorted(found, key=lambda e: e.path)


class _Listing:
    """The output folder's entries, level by level, listed once (GCS) or on demand (local)."""

    def __init__(self, output: str):
        self.output = output.rstrip("/") if len(output) > 1 else output
        self.local = files.is_local(output)
        self._objects: list[tuple[str, int]] | None = None

    def entries(self, relative: str = "") -> list[_Entry]:
        """What is directly in ``relative`` (a folder of the output; '' for the top)."""
        prefix = relative.rstrip("/") + "/" if relative else ""
        if self.local:
            return _local_entries(os.path.join(self.output, relative) if relative else self.output, prefix)
        if self._objects is None:
            head = self.output + "/"
            self._objects = [(p[len(head):], s) for p, s in files.list_under(self.output)
                             if p.startswith(head)]
        below: dict[str, _Entry] = {}
        for path, size in self._objects:
            if not path.startswith(prefix) or path == prefix:
                continue
            name, slash, _ = path[len(prefix):].partition("/")
            if name:
                below.setdefault(prefix + name, _Entry(prefix + name, bool(slash), False, size))
        return sorted(below.values(), key=lambda e: e.path)

    def path(self, relative: str) -> str:
        return files.join(self.output, relative)


_DIGESTS: dict[tuple, str] = {}  # (path, size, stamp, kind) -> hex: one read per file and process.


def _digest(path: str, entry: _Entry, kind: str) -> str:
    key = (path, entry.size, entry.stamp, kind)
    if key in _DIGESTS and files.is_local(path):
        return _DIGESTS[key]
    if kind == "crc32c" and is_gcs(path):
        try:
            return object_crc32c(path) or ""
        except FileNotFoundError:
            return ""
    crc, sha = google_crc32c.Checksum(), hashlib.sha256()
    try:
        with files.open_read(path) as stream:
            while True:
                chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                (crc.update if kind == "crc32c" else sha.update)(chunk)
    except FileNotFoundError:
        return ""
    value = crc.hexdigest().decode() if kind == "crc32c" else sha.hexdigest()
    _DIGESTS[key] = value
    return value


def _proved(listing: _Listing, entry: _Entry, claims: Iterable[Claim]) -> bool:
    """Whether a claim proves the file ``entry`` by its size and content."""
    for claim in claims:
        if claim.folder or claim.size != entry.size or entry.link or entry.folder:
            continue
        path = listing.path(entry.path)
        if claim.crc32c and _digest(path, entry, "crc32c") == claim.crc32c:
            return True
        if claim.sha256 and not claim.crc32c and _digest(path, entry, "sha256") == claim.sha256:
            return True
    return False


@dataclasses.dataclass(frozen=True)
class OutputClaims:
    """An output folder sorted by who wrote what (paths relative to it; folders end in '/').

    Attributes:
      output: the folder.
      owned: what a run may replace or remove: proved this product's.
      leftovers: the part of ``owned`` that no manifest lists (an unfinished run's).
      foreign: what a run would replace or read as the dataset's, not proved ours.
      links: folders of our own names that are symbolic links.
      unrelated: everything else at the top (and in ``dead_letter/``): left alone.
      temporaries: the work folder's ``tmp-*`` folders (runs' temporaries).
      manifest: the output's ``manifest.json``, parsed (``None``: none, or not ours).
      manifest_error: why a ``manifest.json`` there is not one this product can
        read ('' when there is none or it reads).
    """

    output: str
    owned: tuple[str, ...] = ()
    leftovers: tuple[str, ...] = ()
    foreign: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    unrelated: tuple[str, ...] = ()
    temporaries: tuple[str, ...] = ()
    manifest: dict | None = None
    manifest_error: str = ""

    def owns(self, relative: str) -> bool:
        return relative in self.owned

    def refusal(self) -> str:
        """One line saying why the output is refused; '' when it is not."""
        if self.links:
            one = len(self.links) == 1
            return (f"--output {self.output}: {_some(self.links)} "
                    f"{'is a symbolic link' if one else 'are symbolic links'} where this product "
                    f"keeps {'a folder' if one else 'folders'} of its own, and a cleanup would "
                    f"delete through {'it' if one else 'them'}; remove the "
                    f"{'link (what it points' if one else 'links (what they point'} to is not "
                    "touched), or choose another --output")
        if self.manifest_error:
            return (f"--output {self.output}: its {MANIFEST_NAME} is not a manifest this product "
                    f"can read ({self.manifest_error}), so nothing in the folder can be proved "
                    f"this product's; with or without --overwrite, restore or remove it (and the "
                    "files it lists), or choose another --output")
        if self.foreign:
            count, folders = len(self.foreign), sum(n.endswith("/") for n in self.foreign)
            what = ("folder" if folders else "file") if count == 1 else (
                "files and folders" if 0 < folders < count else "folders" if folders else "files")
            return (f"--output {self.output} holds {count} {what} this product cannot prove it "
                    f"wrote, which a run would replace or read as part of the dataset: "
                    f"{_some(self.foreign)}; with or without --overwrite, move "
                    f"{'them' if count > 1 else 'it'} out of the folder, or choose another --output")
        return ""

    def plan_lines(self) -> list[str]:
        """What the plan says of the output folder (files left alone, leftovers replaced)."""
        lines = []
        if self.leftovers:
            lines.append(f"  output: replaces or removes what an unfinished run of this product "
                         f"left (proved by its journal or its run report): {_some(self.leftovers, 8)}")
        if self.unrelated:
            lines.append(f"  output: left alone (not part of the dataset): {_some(self.unrelated, 8)}")
        return lines


def _some(names: Sequence[str], shown: int = _SHOWN) -> str:
    text = ", ".join(names[:shown])
    return text + (f", ... ({len(names)} in all)" if len(names) > shown else "")


def _is_shard_like(name: str) -> bool:
    return bool(parse_shard_name(name)) or name.endswith(_TFRECORD_SUFFIXES)


def _report_is_ours(listing: _Listing, entry: _Entry, manifest_sha256: str | None) -> bool:
    """A report that names the manifest beside it by its SHA-256, or (written before
    reports did) one that reads as a report beside a manifest."""
    if manifest_sha256 is None or entry.size > (64 << 20):
        return False
    try:
        report = json.loads(files.read_bytes(listing.path(entry.path)))
    except (ValueError, OSError):
        return False
    if not isinstance(report, dict):
        return False
    if "manifest_sha256" in report:
        return report["manifest_sha256"] == manifest_sha256
    return isinstance(report.get("status"), str) and "output" in report and "manifest" in report


def _earlier_failed_report(listing: _Listing, entry: _Entry | None) -> set[str] | None:
    """What the report of a failed run of an earlier version (before the journal) vouches
    for: itself and the dead-letter files it lists, when it names this very folder as
    its output and no manifest (``None`` when it is not such a report). Such a run left
    no journal; without this, every run after an upgrade would be refused until the
    report and the dead letters were removed by hand."""
    if entry is None or entry.folder or entry.link or entry.size > (64 << 20):
        return None
    try:
        report = json.loads(files.read_bytes(listing.path(entry.path)))
    except (ValueError, OSError):
        return None
    if (not isinstance(report, dict) or "manifest_sha256" in report or report.get("manifest") is not None
            or not isinstance(report.get("status"), str) or report.get("status") == "ok"
            or not isinstance(report.get("output"), str)
            or report["output"].rstrip("/") != listing.output.rstrip("/")):
        return None
    letters = report.get("dead_letter_files")
    letters = [p for p in letters if isinstance(p, str)] if isinstance(letters, list) else []
    return {p for p in letters if p.startswith(DEAD_LETTER_DIR + "/") and ".." not in p.split("/")}


def _read_manifest(listing: _Listing, entry: _Entry | None) -> tuple[dict | None, str | None, str]:
    """``(manifest, its SHA-256, why it is not one this product can read)`` of the output's
    ``manifest.json`` (``entry``, as listed); ``(None, None, '')`` when there is none."""
    if entry is None:
        return None, None, ""
    data = None if entry.folder or entry.link else files.read_bytes_if_exists(listing.path(MANIFEST_NAME))
    try:
        return (parse_manifest((data or b"").decode("utf-8-sig"), MANIFEST_NAME),
                hashlib.sha256(data).hexdigest(), "")
    except (ValueError, TypeError, KeyError) as err:
        return None, None, ((str(err).splitlines() or [type(err).__name__])[0] if data is not None
                            else "a folder or a link, not a file")


def _work_folder(output: str, listing: _Listing, work: _Entry | None
                 ) -> tuple[list[str], list[str], list[Claim], set[str]]:
    """What the work folder of ``output`` (``work``, as listed) holds: ``(its links where this product
    keeps folders, the runs' temporary folders, the journal's claims, what the manifests
    the journal recorded as replaced list)``."""
    links: list[str] = []
    temporaries: list[str] = []
    journal: list[Claim] = []
    replaced: set[str] = set()
    if work is not None and (work.link or not work.folder):
        links.append(WORK_DIR)
    elif work is not None:
        for inner in listing.entries(WORK_DIR):
            name = inner.path.rsplit("/", 1)[-1]
            if name.startswith("tmp-") or name == JOURNAL_DIR:
                if inner.link:
                    links.append(inner.path)
                elif name.startswith("tmp-") and inner.folder:
                    temporaries.append(inner.path + "/")
        if f"{WORK_DIR}/{JOURNAL_DIR}" not in links:
            for _, claims, replaces in _read_journal(output):
                journal += claims
                replaced |= listed_paths(replaces) | set(tfds_digests(replaces))  # (Its TFDS files too.)
    return links, temporaries, journal, replaced


def claim_output(output: str) -> OutputClaims:
    """Sorts an output folder into what this product can prove it wrote, what it
    cannot (and a run would replace or read), folder links, and the rest; reads
    only. A missing folder is an empty one."""
    listing = _Listing(output)
    top = {e.path: e for e in listing.entries()}
    owned, leftovers, unrelated = [], [], []
    entry = top.get(MANIFEST_NAME)
    manifest, manifest_sha256, manifest_error = _read_manifest(listing, entry)
    foreign = [MANIFEST_NAME] if entry is not None and manifest_sha256 is None else []
    links, temporaries, journal, replaced = _work_folder(output, listing, top.get(WORK_DIR))
    listed, derived = listed_paths(manifest), tfds_digests(manifest)
    earlier = _earlier_failed_report(listing, top.get(REPORT_NAME)) if entry is None else None
    by_path: dict[str, list[Claim]] = {}
    for claim in journal:
        by_path.setdefault(claim.path, []).append(claim)

    def judge(item: _Entry, name: str) -> None:
        if earlier is not None and name in earlier and not item.link and not item.folder:
            owned.append(name)
            leftovers.append(name)
        elif name in listed or (name in replaced and not item.link):
            owned.append(name)
            if name not in listed:
                leftovers.append(name)
        elif _proved(listing, item, by_path.get(name, ())):
            owned.append(name)
            leftovers.append(name)
        else:
            foreign.append(name)

    for name, item in sorted(top.items()):
        if name in (MANIFEST_NAME, WORK_DIR):
            continue
        if _is_shard_like(name):
            if item.folder or item.link:
                foreign.append(name + ("/" if item.folder else ""))
            else:
                judge(item, name)
        elif name.startswith(PART_PREFIX) and (item.folder or item.link):
            folder = name + "/"
            if item.link:
                links.append(name)
            elif folder in listed or folder in replaced or any(c.folder for c in by_path.get(folder, ())):
                owned.append(folder)
                if folder not in listed:
                    leftovers.append(folder)
            else:
                foreign.append(folder)
        elif name in (REPORT_NAME, INPUTS_NAME, LABEL_MAP_NAME) or is_tfds_file(name):
            if item.folder or item.link:
                foreign.append(name)
            elif name == REPORT_NAME and _report_is_ours(listing, item, manifest_sha256):
                owned.append(name)
            elif name in derived and _digest(listing.path(name), item, "sha256") == derived[name]:
                owned.append(name)
            elif name == REPORT_NAME and earlier is not None:
                owned.append(name)
                leftovers.append(name)
            else:
                judge(item, name)
        elif name == DEAD_LETTER_DIR:
            if item.link:
                links.append(name)
            elif not item.folder:
                foreign.append(name)
            else:
                for inner in listing.entries(DEAD_LETTER_DIR):
                    if inner.path.endswith(".jsonl") and not inner.folder:
                        judge(inner, inner.path)
                    else:
                        unrelated.append(inner.path + ("/" if inner.folder else ""))
        else:
            unrelated.append(name + ("/" if item.folder else ""))
    return OutputClaims(output, tuple(owned), tuple(leftovers), tuple(foreign), tuple(links),
                        tuple(unrelated), tuple(temporaries), manifest, manifest_error)


def temporary_folders(output: str) -> list[str]:
    """Every ``tmp-*`` entry of the output's work folder (runs' temporary folders, and
    links of such names, which ``remove_tree`` unlinks without entering)."""
    listing = _Listing(output)
    top = {e.path: e for e in listing.entries()}
    work = top.get(WORK_DIR)
    if work is None or work.link or not work.folder:
        return []
    return [listing.path(e.path) for e in listing.entries(WORK_DIR)
            if e.path.rsplit("/", 1)[-1].startswith("tmp-")]


def is_shard_like(name: str) -> bool:
    """Whether a file name at the top of an output reads as a shard (or any TFRecord)."""
    return "/" not in name and _is_shard_like(name)


def remove_tree(path: str) -> None:
    """Deletes a file or a folder and everything under it, never through a link: a
    link is unlinked (what it points to stays as it is), and nothing below a link is
    visited. On GCS, every object under the folder's name, taken literally."""
    if files.is_local(path):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            _remove_local_folder(path)
        else:
            os.unlink(path)
        return
    below = [p for p, _ in files.list_under(path)]
    files.delete_files(below + ([path] if not below and files.exists(path) else []))


def _remove_local_folder(folder: str) -> None:
    for entry in list(os.scandir(folder)):
        if entry.is_dir(follow_symlinks=False):
            _remove_local_folder(entry.path)
        else:
            try:
                os.unlink(entry.path)  # Files and links alike: a link's target is not touched.
            except FileNotFoundError:
                pass
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        pass


def prune_journal(output: str) -> None:
    """Drops what the journal no longer has to prove: claims of files that are gone
    or that ``manifest.json`` now lists (and the manifests a commit replaced, once
    nothing they list is left outside the current one). An empty journal is removed,
    and the work folder with it when nothing else is in it (locally).

    Call only while holding the output's lock (or as the run's last step)."""
    journal = _read_journal(output)
    if not journal:
        _remove_empty_journal(output)
        return
    listing = _Listing(output)
    present = set()
    for entry in listing.entries():
        present.add(entry.path + ("/" if entry.folder else ""))
    present |= {e.path for e in listing.entries(DEAD_LETTER_DIR)}
    text = files.read_text_if_exists(files.join(output, MANIFEST_NAME))
    try:
        current = parse_manifest(text, MANIFEST_NAME) if text is not None else None
    except ValueError:
        current = None
    listed, derived = listed_paths(current), tfds_digests(current)
    for path, claims, replaces in journal:  # (A TFDS file holding what the manifest implies is its.)
        kept = [c for c in claims if c.path in present and c.path not in listed
                and not (c.sha256 and derived.get(c.path) == c.sha256)]
        outside = (listed_paths(replaces) & present) - listed if replaces else set()
        name = path.rsplit("/", 1)[-1][:-len(".json")]
        if not kept and not outside:
            files.delete_files([path])
        elif kept != claims or (replaces and not outside):
            _record(output, name, kept, "", replaces if outside else None)
    _remove_empty_journal(output)


def _remove_empty_journal(output: str) -> None:
    if not files.is_local(output):
        return
    for folder in (_journal(output), files.join(output, WORK_DIR)):
        try:
            os.rmdir(folder)
        except OSError:
            pass  # Not empty (the lock, a temporary folder), a link, or not there.
