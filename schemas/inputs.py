"""The input fingerprint: which files a dataset was made from, and how to tell a
changed one.

Every published dataset (and every part of one, see ``PART_PREFIX``) holds
``inputs.jsonl``: one JSON object per input file, sorted by path::

    {"path": "cats/001.jpg", "size": 51234, "mtime_ns": 1763800000123456789,
     "sha256": "9f86d0..."}                                   # a local file
    {"path": "2026/11/22/rows.csv", "size": 103000000, "generation": "1763800000123456",
     "crc32c": "c99465aa"}                                     # a gs:// object
    {"path": "/data/labels.txt", "role": "labels", "size": 40, ...}   # what else shapes records

``path`` is relative to the input root the manifest names (``input.root``);
files that are not inputs but shape the records (the labels file, the table
schema, a CSV image manifest) have a ``role`` and their own path. ``sha256`` is
the content hash of a local file's bytes, recorded when the run read them anyway
(every image it converted, every table, every file with a role); ``crc32c`` and
``generation`` come from the GCS listing (nothing is downloaded).

A file is unchanged when its size is the same and, locally, its modification time
is the same or, if that moved (``touch``, a copy), its content hash is the same;
on GCS when its crc32c is the same. With ``content`` fingerprints the time is not
trusted and every local file's content hash is compared. The manifest names the
file with its SHA-256 and holds the fingerprint of the whole input (``input.fingerprint``:
the files' paths, sizes and contents) and of the options that shape the records
(``options_fingerprint``), so a scheduler can compare two runs without reading
either input.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Container, Iterable, Iterator, Mapping

__all__ = [
    "FINGERPRINT_MODES",
    "INPUTS_NAME",
    "CompletedLines",
    "InputFile",
    "InputsFingerprint",
    "PART_PREFIX",
    "RECORD_SHAPING_EXCLUDED",
    "SKIPPED_EXIT_STATUS",
    "UNIT_INPUTS_DIR",
    "complete_inputs",
    "complete_lines",
    "decode_inputs",
    "encode_inputs",
    "encode_inputs_chunks",
    "file_line",
    "input_fingerprint",
    "options_fingerprint",
    "part_name",
    "unit_inputs_name",
]

INPUTS_NAME = "inputs.jsonl"
# A listing made on the workers (--list_on_workers): each unit's lines of
# inputs.jsonl, in the run's temporary folder, joined in unit order at the commit.
UNIT_INPUTS_DIR = "inputs"


def unit_inputs_name(index: int) -> str:
    """The file of listing unit ``index``'s ``inputs.jsonl`` lines (in ``UNIT_INPUTS_DIR``)."""
    return f"unit-{index:06d}.jsonl"

# An incremental run's part of a dataset: a folder ``part-00001/`` beside the
# first run's shards, itself a complete dataset (shards, manifest, inputs).
PART_PREFIX = "part-"
# --fingerprint: ``stat`` trusts an unchanged size and modification time (a moved
# time is checked against the content hash); ``content`` hashes every local file.
FINGERPRINT_MODES = ("stat", "content")
# The exit status of a run that found nothing to do (Airflow's BashOperator marks
# a task that exits 99 as skipped; cron and shells see a non-zero status).
SKIPPED_EXIT_STATUS = 99
# Options that never shape records, beyond schemas.config.RUN_CONTROL_OPTIONS:
# where the input and output are (the files themselves are fingerprinted) and how
# this run decides whether to run.
RECORD_SHAPING_EXCLUDED = frozenset({"input", "output"})


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One input file as the fingerprint records it (see the module docstring)."""

    path: str
    size: int
    mtime_ns: int = 0
    sha256: str = ""
    generation: str = ""
    crc32c: str = ""
    role: str = ""

    @property
    def content(self) -> str:
        """What names the bytes: ``sha256:<hex>``, ``crc32c:<hex>``, or '' (not known)."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        return f"crc32c:{self.crc32c}" if self.crc32c else ""

    def to_json(self) -> dict:
        out: dict = {"path": self.path}
        if self.role:
            out["role"] = self.role
        out["size"] = self.size
        for name in ("mtime_ns", "generation", "sha256", "crc32c"):
            value = getattr(self, name)
            if value:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, value: Mapping) -> InputFile:
        if not isinstance(value, Mapping) or not isinstance(value.get("path"), str):
            raise ValueError(f"not an input file entry: {value!r}")
        return cls(value["path"], int(value["size"]), int(value.get("mtime_ns", 0)),
                   str(value.get("sha256", "")), str(value.get("generation", "")),
                   str(value.get("crc32c", "")), str(value.get("role", "")))


_LINE_ENCODER = json.JSONEncoder(ensure_ascii=False)


def encode_inputs(entries: Iterable[InputFile]) -> bytes:
    """``inputs.jsonl``'s bytes: one entry per line, files with a role first, then by path."""
    ordered = sorted(entries, key=lambda e: (e.role == "", e.role, e.path))
    encode = _LINE_ENCODER.encode  # What json.dumps(ensure_ascii=False) does, built once.
    return "".join(encode(e.to_json()) + "\n" for e in ordered).encode("utf-8")


_encode_text = json.encoder.encode_basestring  # The string encoder of ensure_ascii=False.


def file_line(path: str, size: int, mtime_ns: int = 0, generation: str = "", crc32c: str = "") -> str:
    """The line of ``encode_inputs`` for a file without a role or content hash, made
    without an ``InputFile`` (the same characters; for listings of millions)."""
    line = '{"path": ' + _encode_text(path) + ', "size": ' + int.__repr__(size)
    if mtime_ns:
        line += ', "mtime_ns": ' + int.__repr__(mtime_ns)
    if generation:
        line += ', "generation": ' + _encode_text(generation)
    if crc32c:
        line += ', "crc32c": ' + _encode_text(crc32c)
    return line + "}\n"


def encode_inputs_chunks(entries: Iterable[InputFile], file_lines: Iterable[str] = ()) -> Iterator[bytes]:
    """``encode_inputs(entries)`` in chunks, followed by ``file_lines``: further
    files' lines (``file_line``), already in path order, after the entries.

    Raises:
      ValueError: when ``file_lines`` are given and an entry has no role (its
        place among them would be unknown).
    """
    entries = list(entries)
    if any(not e.role for e in entries) and file_lines != ():
        raise ValueError("entries without a role cannot be merged with file lines")
    yield encode_inputs(entries)
    block: list[str] = []
    for line in file_lines:
        block.append(line)
        if len(block) >= 65536:
            yield "".join(block).encode("utf-8")
            block = []
    if block:
        yield "".join(block).encode("utf-8")


def decode_inputs(data: bytes, source: str = INPUTS_NAME) -> list[InputFile]:
    """Parses ``inputs.jsonl`` (lines end at ``\\n`` only: a path may hold U+2028,
    U+0085 and the like, written as they are).

    Raises:
      ValueError: naming the line that is not an entry.
    """
    entries = []
    for number, line in enumerate(data.decode("utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            entries.append(InputFile.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{source} line {number}: {err}") from None
    return entries


_FINGERPRINT_ENCODER = json.JSONEncoder()  # What json.dumps does with its defaults.


def complete_inputs(data: bytes, digests: Mapping[str, str], options_digest: str,
                    source: str = INPUTS_NAME) -> tuple[bytes, int, str]:
    """``inputs.jsonl`` with the content hashes of ``digests`` (``{path: sha256}``)
    set on the files (not role files) they name, in one pass over the lines.

    Returns ``(bytes, files, fingerprint)``: the same bytes as
    ``encode_inputs`` of the completed entries, the count of files without a
    role, and ``input_fingerprint`` of the completed entries. No ``InputFile``
    is made per line, and lines in ``encode_inputs``' order (as runs write them)
    stream through. A run's commit completes its file in pieces instead
    (``complete_lines`` on each, then ``InputsFingerprint`` over them in order).

    Raises:
      ValueError: naming the line that is not an entry.
    """
    part = complete_lines(data, digests, source=source)
    if part.in_order:
        fingerprint = InputsFingerprint(options_digest)
        fingerprint.add_files(part.file_tokens)
        return part.lines, part.files, fingerprint.finish(part.role_tokens)
    return _complete_sorted(data, digests, options_digest, source)


@dataclasses.dataclass(frozen=True)
class CompletedLines:
    """Lines of ``inputs.jsonl`` completed with content hashes (``complete_lines``).

    Attributes:
      lines: the completed lines, in the order given (UTF-8).
      file_tokens: the fingerprint's token line of each file without a role, in
        that order (what ``InputsFingerprint.add_files`` takes).
      role_tokens: the tokens of the files with a role (hashed after the files).
      files: lines of files without a role.
      first_key, last_key: the sort key ``(no role, role, path)`` of the first and
        last line (``None`` without lines).
      in_order: whether the lines are in ``encode_inputs``' order.
    """

    lines: bytes
    file_tokens: bytes
    role_tokens: tuple
    files: int
    first_key: tuple | None
    last_key: tuple | None
    in_order: bool


def _completed_line(line: str, digests: Mapping[str, str], number: int, source: str):
    """``(sort key, completed line, fingerprint token)`` of one line of ``inputs.jsonl``."""
    try:
        value = json.loads(line)
        if not isinstance(value, Mapping) or not isinstance(value.get("path"), str):
            raise ValueError(f"not an input file entry: {value!r}")
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
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{source} line {number}: {err}") from None
    content = f"sha256:{sha256}" if sha256 else f"crc32c:{crc32c}" if crc32c else ""
    token = [role, path, size, content or f"mtime_ns:{mtime_ns}:generation:{generation}"]
    return (role == "", role, path), _LINE_ENCODER.encode(out) + "\n", token


_scan_value = json.scanner.make_scanner(json.JSONDecoder())  # What json.loads runs on one value.
_encode_ascii = json.encoder.encode_basestring_ascii  # The string encoder of _FINGERPRINT_ENCODER.
_LINE_KEYS = frozenset(("path", "role", "size", "mtime_ns", "generation", "sha256", "crc32c"))


# A line as ``file_line`` writes it for a local file whose path needs no escape in JSON
# (no quote, backslash or control character): its path's JSON text is its path quoted.
_FILE_LINE = re.compile(r'\{"path": "([^"\\\x00-\x1f]*)", "size": (0|[1-9][0-9]*)'
                        r'(?:, "mtime_ns": ([1-9][0-9]*))?\}')


def _completed_plain(line: str, digests: Mapping[str, str]):
    """``_completed_line`` of a line whose fields all have their own types (no number
    written as text, no stray key, nothing around the object): the same three values,
    the texts built without a dict or an encoder call; ``None`` for any other line
    (``_completed_line`` then parses it, and says what is wrong with it)."""
    match = _FILE_LINE.fullmatch(line)
    if match is not None:  # A launcher's line: its fields' texts are already theirs.
        path, size, mtime_ns = match.groups()
        sha256 = digests.get(path, "")
        if type(sha256) is str:
            text = line[:-1] + (', "sha256": ' + _encode_text(sha256) + "}\n" if sha256 else "}\n")
            content = "sha256:" + sha256 if sha256 else f"mtime_ns:{mtime_ns or 0}:generation:"
            token = ('["", "' + path + '", ' + size + ", " + _encode_ascii(content) + "]" if path.isascii()
                     else _token_text(("", path, size, content)))
            return (True, "", path), text, ("", path, int(size), content), token
    try:
        value, end = _scan_value(line, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(line) or type(value) is not dict or not _LINE_KEYS.issuperset(value):
        return None
    get = value.get
    path, role, size = get("path"), get("role", ""), get("size")
    mtime_ns, generation = get("mtime_ns", 0), get("generation", "")
    crc32c, sha256 = get("crc32c", ""), get("sha256", "")
    if (type(path) is not str or type(role) is not str or type(size) is not int or type(mtime_ns) is not int
            or type(generation) is not str or type(crc32c) is not str or type(sha256) is not str):
        return None
    if not role and path in digests:
        sha256 = digests[path]
        if type(sha256) is not str:
            return None
    text = '{"path": ' + _encode_text(path)
    if role:
        text += ', "role": ' + _encode_text(role)
    text += ', "size": ' + int.__repr__(size)
    if mtime_ns:
        text += ', "mtime_ns": ' + int.__repr__(mtime_ns)
    if generation:
        text += ', "generation": ' + _encode_text(generation)
    if sha256:
        text += ', "sha256": ' + _encode_text(sha256)
    if crc32c:
        text += ', "crc32c": ' + _encode_text(crc32c)
    content = ("sha256:" + sha256 if sha256 else "crc32c:" + crc32c if crc32c
               else f"mtime_ns:{mtime_ns}:generation:{generation}")
    token = (role, path, size, content)
    return (role == "", role, path), text + "}\n", token, "" if role else _token_text(token)


def _token_text(token) -> str:
    """``_FINGERPRINT_ENCODER.encode(list(token))`` of a ``_completed_plain`` token (its
    size an int, or the int's text)."""
    role, path, size, content = token
    return ("[" + _encode_ascii(role) + ", " + _encode_ascii(path) + ", "
            + (size if type(size) is str else int.__repr__(size)) + ", " + _encode_ascii(content) + "]")


def complete_lines(data: bytes, digests: Mapping[str, str], excluded: Container[str] = frozenset(),
                   source: str = INPUTS_NAME, first_line: int = 1, sort: bool = False) -> CompletedLines:
    """Completes lines of ``inputs.jsonl`` (all of it, or a piece that starts at line
    ``first_line``) with the content hashes of ``digests``, leaving out the files
    (without a role) named in ``excluded`` (images the run left out after the
    listing: copies dropped on the workers, files it could not read to hash).
    With ``sort``, lines not in ``encode_inputs``' order are sorted (``in_order``
    is then true).

    Raises:
      ValueError: naming the line that is not an entry.
    """
    dumps = _FINGERPRINT_ENCODER.encode
    lines: list[str] = []
    chunks: list[bytes] = []
    tokens: list[str] = []
    token_chunks: list[bytes] = []
    roles: list = []
    first = last = None
    in_order, files = True, 0
    given = data.decode("utf-8").split("\n")
    start = _plain_start(given)
    bulk = _bulk_plain(given[start:], digests, excluded) if start is not None else None
    if bulk is not None:
        given = given[:start]  # The lines before the plain ones (files with a role) go line by line.
    for number, line in enumerate(given, first_line):
        if not line or line.isspace():
            continue
        done = _completed_plain(line, digests)
        if done is None:
            key, text, token = _completed_line(line, digests, number, source)
            token_text = dumps(token)
        else:
            key, text, token, token_text = done
        if key[0] and key[2] in excluded:
            continue
        if last is not None and key < last:
            if sort:
                return _sorted_lines(data, digests, excluded, source, first_line)
            in_order = False
        first = key if first is None else first
        last = key
        lines.append(text)
        if len(lines) >= 65536:  # Held as UTF-8, a block at a time.
            chunks.append("".join(lines).encode("utf-8"))
            lines = []
        if key[0]:
            files += 1
            tokens.append(token_text + "\n")
            if len(tokens) >= 65536:
                token_chunks.append("".join(tokens).encode("utf-8"))
                tokens = []
        else:
            roles.append(list(token))
    chunks.append("".join(lines).encode("utf-8"))
    token_chunks.append("".join(tokens).encode("utf-8"))
    if bulk is not None and bulk.files:
        if last is not None and bulk.first_key < last:  # Not after the lines before them.
            if sort:
                return _sorted_lines(data, digests, excluded, source, first_line)
            in_order = False
        chunks.append(bulk.lines)
        token_chunks.append(bulk.file_tokens)
        files += bulk.files
        first = bulk.first_key if first is None else first
        last = bulk.last_key
    return CompletedLines(b"".join(chunks), b"".join(token_chunks), tuple(roles), files, first, last,
                          in_order)


# ``_FILE_LINE`` on every line of a text at once (a match never holds a line end).
_FILE_LINES = re.compile("^" + _FILE_LINE.pattern + "$", re.MULTILINE)
_BULK_LINES = 8192  # Few enough that its per-line objects add little to what a piece holds.
# Text that both JSON string encoders write as it is (printable ASCII but quote and backslash).
_UNESCAPED = re.compile(r'[ !#-\[\]-~]*')


def _plain_start(lines: list[str]) -> int | None:
    """The index of the first of ``lines`` that ``_FILE_LINE`` matches, when only a few
    lines (files with a role, first in ``encode_inputs``' order) come before it."""
    for index, line in enumerate(lines[:64]):
        if _FILE_LINE.fullmatch(line) is not None:
            return index
    return None


def _bulk_plain(lines: list[str], digests: Mapping[str, str], excluded: Container[str]) -> CompletedLines | None:
    """``complete_lines`` of lines that are all as ``file_line`` writes them for a local
    file (``_FILE_LINE``), in path order, made a block of lines at a time with one
    regular expression pass and list comprehensions (the same bytes as line by line);
    ``None`` when any line is not such a line, is out of order or has a digest that
    is not a string (the caller then goes line by line)."""
    if lines and lines[-1] == "":
        lines = lines[:-1]
    chunks, token_chunks, files, first, last = [], [], 0, None, None
    get = digests.get
    for begin in range(0, len(lines), _BULK_LINES):
        block = lines[begin:begin + _BULK_LINES]
        found = _FILE_LINES.findall("\n".join(block))
        if len(found) != len(block):  # A blank line or another kind of line among them.
            return None
        paths = [path for path, _, _ in found]
        if paths != sorted(paths) or (last is not None and paths and paths[0] < last):
            return None
        if excluded and any(path in excluded for path in paths):
            kept = [index for index, path in enumerate(paths) if path not in excluded]
            block, found, paths = [block[i] for i in kept], [found[i] for i in kept], [paths[i] for i in kept]
        shas = [get(path, "") for path in paths]
        if any(type(sha) is not str for sha in shas):
            return None
        if _hex_and_ascii(shas, paths):  # Nothing to escape: the texts as f-strings.
            chunks.append("".join([f'{line[:-1]}, "sha256": "{sha}"}}\n'
                                   for line, sha in zip(block, shas)]).encode("utf-8"))
            token_chunks.append("".join([f'["", "{path}", {size}, "sha256:{sha}"]\n'
                                         for (path, size, _), sha in zip(found, shas)]).encode("utf-8"))
        else:
            _bulk_texts(block, found, shas, chunks, token_chunks)
        files += len(paths)
        if paths:
            first = paths[0] if first is None else first
            last = paths[-1]
    if not files:
        return CompletedLines(b"", b"", (), 0, None, None, True)
    return CompletedLines(b"".join(chunks), b"".join(token_chunks), (), files, (True, "", first),
                          (True, "", last), True)


def _hex_and_ascii(shas: list[str], paths: list[str]) -> bool:
    """Whether every digest is set and hex and every path ASCII (JSON then quotes them as they are)."""
    return all(shas) and _UNESCAPED.fullmatch("".join(shas)) is not None and "".join(paths).isascii()


def _bulk_texts(block: list[str], found: list, shas: list[str], chunks: list, token_chunks: list) -> None:
    """``_bulk_plain``'s lines and tokens of a block, each text escaped as JSON needs."""
    chunks.append("".join([line[:-1] + ', "sha256": ' + _encode_text(sha) + "}\n" if sha else line + "\n"
                           for line, sha in zip(block, shas)]).encode("utf-8"))
    token_chunks.append("".join([
        ('["", "' + path + '", ' + size + ", " + _encode_ascii(
            "sha256:" + sha if sha else f"mtime_ns:{mtime or 0}:generation:") + "]"
         if path.isascii() else _token_text(("", path, size, "sha256:" + sha if sha
                                             else f"mtime_ns:{mtime or 0}:generation:"))) + "\n"
        for (path, size, mtime), sha in zip(found, shas)]).encode("utf-8"))


def _sorted_lines(data: bytes, digests: Mapping[str, str], excluded: Container[str], source: str,
                  first_line: int) -> CompletedLines:
    """``complete_lines`` of lines not in order: all of them parsed, then sorted."""
    items = []
    for number, line in enumerate(data.decode("utf-8").split("\n"), first_line):
        if line.strip():
            key, text, token = _completed_line(line, digests, number, source)
            if not (key[0] and key[2] in excluded):
                items.append((key, text, token))
    items.sort(key=lambda item: item[0])
    dumps = _FINGERPRINT_ENCODER.encode
    file_tokens = "".join(dumps(token) + "\n" for key, _, token in items if key[0])
    return CompletedLines("".join(text for _, text, _ in items).encode("utf-8"), file_tokens.encode("utf-8"),
                          tuple(token for key, _, token in items if not key[0]),
                          sum(1 for key, _, _ in items if key[0]), items[0][0] if items else None,
                          items[-1][0] if items else None, True)


class InputsFingerprint:
    """``input_fingerprint``, made streaming from completed pieces in order: the
    files' tokens first (in path order, as ``complete_lines`` gives them), then
    the role files' tokens, sorted."""

    def __init__(self, options_digest: str):
        self._digest = hashlib.sha256(options_digest.encode())

    def add_files(self, file_tokens: bytes) -> None:
        self._digest.update(file_tokens)

    def finish(self, role_tokens) -> str:
        dumps = _FINGERPRINT_ENCODER.encode
        for token in sorted(role_tokens, key=lambda token: (token[0], token[1])):
            self._digest.update(dumps(token).encode() + b"\n")
        return self._digest.hexdigest()


def _complete_sorted(data: bytes, digests: Mapping[str, str], options_digest: str,
                     source: str) -> tuple[bytes, int, str]:
    """``complete_inputs`` of lines not in ``encode_inputs``' order: sorted first."""
    part = _sorted_lines(data, digests, frozenset(), source, 1)
    fingerprint = InputsFingerprint(options_digest)
    fingerprint.add_files(part.file_tokens)
    return part.lines, part.files, fingerprint.finish(part.role_tokens)


def options_fingerprint(options: Mapping[str, object], run_control: Iterable[str]) -> str:
    """SHA-256 of the options that shape the records (canonical JSON), hex."""
    skip = set(run_control) | RECORD_SHAPING_EXCLUDED
    shaping = {k: v for k, v in sorted(options.items()) if k not in skip}
    return hashlib.sha256(json.dumps(shaping, sort_keys=True, default=list).encode()).hexdigest()


def input_fingerprint(entries: Iterable[InputFile], options_digest: str) -> str:
    """SHA-256 of every file's path, size and content (its time when the content is
    not known) and of the options' fingerprint, hex."""
    digest = hashlib.sha256(options_digest.encode())
    for entry in sorted(entries, key=lambda e: (e.role, e.path)):
        token = entry.content or f"mtime_ns:{entry.mtime_ns}:generation:{entry.generation}"
        digest.update(json.dumps([entry.role, entry.path, entry.size, token]).encode() + b"\n")
    return digest.hexdigest()


def part_name(number: int) -> str:
    """``part-00001``: the folder of a dataset's incremental part ``number`` (>= 1)."""
    if number < 1:
        raise ValueError(f"part numbers start at 1, got {number}")
    return f"{PART_PREFIX}{number:05d}"
