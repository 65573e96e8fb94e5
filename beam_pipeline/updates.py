"""Scheduled runs: what an existing dataset was made from, and what to do now.

``--skip_unchanged``: a run whose inputs and record-shaping options match the
dataset at ``--output`` does nothing (status ``skipped``, exit 99); otherwise it
is a full run (which replaces the dataset, so it needs ``--overwrite``).

``--incremental``: only inputs the dataset does not hold (new files, and files
whose content changed, reported as such) are converted, into a new part
``OUT/part-NNNNN/`` that is a complete, verified dataset of its own; the root
``manifest.json`` then lists it under ``parts``. Deleted inputs are reported
(their records stay). A change that old records depend on (the options, the
labels file, the schema, the set of classes) is refused: that needs a full run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from beam_tfrecords.schemas.config import RUN_CONTROL_OPTIONS, ConvertConfig
from beam_tfrecords.schemas.features import parse_feature_names
from beam_tfrecords.schemas.inputs import (
    INPUTS_NAME,
    PART_PREFIX,
    InputFile,
    decode_inputs,
    options_fingerprint,
    part_name,
)
from beam_tfrecords.schemas.manifest import MANIFEST_NAME, manifest_shards, parse_manifest
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.fingerprint import (
    local_sha256,
    published_path,
    published_root,
    root_identity,
)
from beam_tfrecords.transforms.plan.changes import Changes, compare_inputs
from beam_tfrecords.verify import dataset_path, manifest_decoded, part_manifest

__all__ = ["Dataset", "Update", "config_fingerprint", "decide", "manifest_digest", "read_dataset"]


def config_fingerprint(config: ConvertConfig) -> str:
    """The fingerprint of the options that shape the records (see ``schemas.inputs``),
    ``--feature_names`` by the renames it makes (``_shaping``), not as it was typed."""
    return options_fingerprint(_shaping(config.to_json()), RUN_CONTROL_OPTIONS)


def _shaping(options: dict) -> dict:
    """``options`` (as the manifest records them) with ``feature_names`` as its parsed
    renames, canonical -> output, sorted: the same renames in another order, with
    spaces or as the pairs a preset stands for shape the same records. Options
    without it are returned as they are (their fingerprint stays what it was)."""
    text = options.get("feature_names")
    if not isinstance(text, str):
        return options
    try:
        renames = parse_feature_names(text).renames
    except ValueError:  # A manifest's text no run accepts now: compared as it is.
        return options
    return {**options, "feature_names": [[c, o] for c, o in sorted(renames.items())]}


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A published dataset as a later run sees it.

    Attributes:
      output: its folder.
      manifest: the root ``manifest.json``.
      parts: ``(name, manifest)`` of each incremental part, in order.
      files: ``{input root's identity: {path: entry}}``: the inputs it holds
        records of (a later part's entry wins; see ``fingerprint.root_identity``).
      roles: the labels file, schema, CSV manifest it was made with, by role.
      stale: inputs a later part converted again (changed files): the dataset
        also holds their old records.
      problem: why it cannot be compared with ('' when it can).
      manifest_sha256: of the root manifest as read (a run re-reads it once it
        holds the lock, to see that no other run changed the dataset meanwhile).
    """

    output: str
    manifest: dict
    parts: tuple[tuple[str, dict], ...] = ()
    files: dict = dataclasses.field(default_factory=dict)
    roles: dict = dataclasses.field(default_factory=dict)
    stale: tuple[str, ...] = ()
    problem: str = ""
    manifest_sha256: str = ""

    @property
    def next_part(self) -> str:
        numbers = [int(name[len(PART_PREFIX):]) for name, _ in self.parts]
        return part_name(max(numbers, default=0) + 1)

    @property
    def input_root(self) -> str:
        """The input root as the manifest names it (``published_root``; an absolute
        path in manifests of earlier versions)."""
        listed = self.manifest.get("input", {}).get("files_list") or {}
        return listed.get("root") or self.manifest.get("input", {}).get("root", "")

    @property
    def input_root_id(self) -> str:
        return _root_of(self.manifest)


def _root_of(manifest: dict) -> str:
    """What identifies the folder a manifest's input paths are relative to
    (``fingerprint.root_identity``): the ``root_id`` it records, or, for a manifest
    of an earlier version (an absolute root), the identity of that path now."""
    section = manifest.get("input", {})
    listed = section.get("files_list") or {}
    recorded = listed.get("root_id") or section.get("root_id")
    if recorded:
        return recorded
    root = listed.get("root") or section.get("root", "")
    return root_identity(root) if root else ""


def _read_inputs(folder: str, manifest: dict, source: str) -> list[InputFile] | str:
    listed = manifest.get("input", {}).get("files_list")
    if not isinstance(listed, dict):
        return "it records no input fingerprints (made by an older version)"
    path = dataset_path(folder, listed.get("path", INPUTS_NAME), "input.files_list.path", source)
    try:
        data = files.read_bytes(path)
    except (OSError, ValueError) as err:
        return f"cannot read {path}: {err}"
    except Exception as err:  # pylint: disable=broad-except  # Beam's BeamIOError
        return f"cannot read {path}: {err}"
    if hashlib.sha256(data).hexdigest() != listed.get("sha256"):
        return f"{path} does not match the SHA-256 the manifest records"
    try:
        return decode_inputs(data, path)
    except ValueError as err:
        return str(err)


def read_dataset(output: str) -> Dataset | None:
    """The dataset at ``output``, ``None`` when there is none (no ``manifest.json``).

    A dataset that cannot be compared with (a manifest that is malformed or names
    a path outside its folder, a part or input list missing or changed) comes
    back with its ``problem``, one line.
    """
    source = files.join(output, MANIFEST_NAME)
    data = files.read_bytes_if_exists(source)
    if data is None:
        return None
    digest = manifest_digest(data)
    try:
        manifest = parse_manifest(manifest_decoded(data, source), source)
    except ValueError as err:
        return Dataset(output, {}, problem=str(err), manifest_sha256=digest)
    try:
        return _read_layers(output, source, manifest, digest)
    except ValueError as err:  # A path that leads outside the dataset, a malformed part.
        return Dataset(output, manifest, problem=str(err), manifest_sha256=digest)


def _read_layers(output: str, source: str, manifest: dict, digest: str) -> Dataset:
    """``read_dataset`` once the root manifest is read: its parts, inputs and shards."""
    entries = _read_inputs(output, manifest, source)
    if isinstance(entries, str):
        return Dataset(output, manifest, problem=entries, manifest_sha256=digest)
    parts = []
    layers = [(_root_of(manifest), entries)]
    for i, part in enumerate(manifest.get("parts", [])):
        folder, part_path, part_text = part_manifest(output, source, i, part)
        if part_text is None:
            return Dataset(output, manifest, problem=f"part {part['path']} has no {MANIFEST_NAME}",
                           manifest_sha256=digest)
        if hashlib.sha256(part_text.encode("utf-8")).hexdigest() != part["manifest_sha256"]:
            return Dataset(output, manifest,
                           problem=f"part {part['path']}'s {MANIFEST_NAME} does not match the SHA-256 "
                           "the root manifest records", manifest_sha256=digest)
        part_manifest_json = parse_manifest(part_text, part_path)
        part_entries = _read_inputs(folder, part_manifest_json, part_path)
        if isinstance(part_entries, str):
            return Dataset(output, manifest, problem=f"part {part['path']}: {part_entries}",
                           manifest_sha256=digest)
        parts.append((part["path"], part_manifest_json))
        layers.append((_root_of(part_manifest_json), part_entries))
    missing = _missing_shard(output, source, manifest, parts)
    if missing:
        return Dataset(output, manifest, problem=missing, manifest_sha256=digest)
    by_root: dict[str, dict[str, InputFile]] = {}
    roles: dict[str, InputFile] = {}
    stale = []
    for root, layer in layers:
        for entry in layer:
            if entry.role:
                roles.setdefault(entry.role, entry)
            else:
                held = by_root.setdefault(root, {})
                if entry.path in held:
                    stale.append(entry.path)
                held[entry.path] = entry
    return Dataset(output, manifest, tuple(parts), by_root, roles, tuple(stale),
                   manifest_sha256=digest)


def _missing_shard(output: str, source: str, manifest: dict, parts: list) -> str | None:
    """Why the shards the manifests list are not all there at their sizes (one
    listing of the output; the content is ``verify``'s job), ``None`` if they are.

    Raises:
      ValueError: when a shard's path leads outside the dataset (a link).
    """
    present = dict(files.list_files(files.join(output, "**")))
    for folder, listed in [("", manifest), *parts]:
        base = files.join(output, folder) if folder else output
        where = files.join(base, MANIFEST_NAME) if folder else source
        for shard in manifest_shards(listed):
            path = dataset_path(base, shard.path, shard.key, where)
            size = present.get(path)
            if size != shard.bytes:
                what = "is missing" if size is None else f"holds {size:,} bytes, not {shard.bytes:,}"
                return f"shard {path} {what}"
    return None


def manifest_digest(data: bytes | str | None) -> str:
    """SHA-256 of a manifest's bytes (text: its UTF-8 bytes; '' for none)."""
    if data is None:
        return ""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Update:
    """What a scheduled run does.

    Attributes:
      action: ``run`` (a full run), ``skip`` (nothing to do), ``part`` (convert
        ``include`` into the part ``part``).
      reason: one line for people: why.
      changes: the comparison with the dataset (``None`` without one).
      part: the part's folder name (``part-00002``) for ``part``.
      include: the paths (as in ``inputs.jsonl``) to convert, for ``part``.
      refused_before: for ``part``, inputs refused while listing that the dataset
        refused before (in its dead letters): not dead-lettered or counted again.
      seen_manifest: SHA-256 of the dataset's manifest the decision was made on
        ('' when there was none).
    """

    action: str
    reason: str
    changes: Changes | None = None
    part: str = ""
    include: tuple[str, ...] = ()
    seen_manifest: str = ""
    refused_before: int = 0

    def to_json(self) -> dict:
        out: dict = {"action": self.action, "reason": self.reason}
        if self.part:
            out["part"] = self.part
        if self.refused_before:
            out["refused_before"] = self.refused_before
        if self.changes is not None:
            c = self.changes
            out["inputs"] = {"new": len(c.new), "changed": len(c.changed),
                             "deleted": len(c.deleted), "unchanged": c.unchanged,
                             "touched": c.touched}
            for name, items in (("changed_files", [now.path for _, now in c.changed]),
                                ("deleted_files", [e.path for e in c.deleted])):
                if items:
                    out[name] = items[:100]
        return out


def _hash_now(root_paths: dict[str, str]):
    def hash_now(entry: InputFile) -> str:
        path = root_paths.get(entry.path, "")
        if not files.is_local(path):
            return ""
        try:
            return local_sha256(path, entry.size)
        except OSError:
            return ""
    return hash_now


def _appended(old: InputFile, now: InputFile) -> bool:
    """Whether the local file ``now`` is ``old`` with bytes added at its end (its first
    ``old.size`` bytes hash to ``old.sha256``)."""
    if not (old.sha256 and files.is_local(now.path) and now.size >= old.size):
        return False
    digest, left = hashlib.sha256(), old.size
    try:
        with open(now.path, "rb") as f:
            while left > 0:
                block = f.read(min(left, 1 << 20))
                if not block:
                    return False
                digest.update(block)
                left -= len(block)
    except OSError:
        return False
    return digest.hexdigest() == old.sha256


def _listed(paths: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


class UpdateRefused(ValueError):
    """The inputs changed in a way an incremental run cannot take."""


def decide(config: ConvertConfig, dataset: Dataset | None, now: Sequence[InputFile],
           roles: Sequence[InputFile], paths: dict[str, str], input_root: str,
           vocabulary: Sequence[str] = ()) -> Update:
    """Compares the inputs now with the dataset's and decides (see the module docstring).

    Args:
      now: the entries of the inputs now (by path relative to ``input_root``).
      roles: the entries of the labels file, schema, CSV manifest now.
      paths: where to read each of ``now`` (to hash one whose time moved).
      vocabulary: the classes the listing found (images).

    Raises:
      UpdateRefused: for an incremental run that would need a full one.
    """
    update = _decide(config, dataset, now, roles, paths, input_root, vocabulary)
    return dataclasses.replace(update, seen_manifest=dataset.manifest_sha256 if dataset else "")


def _decide(config: ConvertConfig, dataset: Dataset | None, now: Sequence[InputFile],
            roles: Sequence[InputFile], paths: dict[str, str], input_root: str,
            vocabulary: Sequence[str]) -> Update:
    incremental = config.incremental
    if dataset is None:
        return Update("run", f"no dataset at {config.output} yet: a full run")
    if dataset.problem:
        if incremental:
            raise UpdateRefused(f"--incremental: the dataset at {config.output} cannot be "
                                f"compared with ({dataset.problem}); run without --incremental "
                                "(and with --overwrite) to rebuild it")
        return Update("run", f"the dataset cannot be compared with ({dataset.problem}): a full run")
    why_full = ""
    old_options = dataset.manifest.get("input", {}).get("options_fingerprint")
    if old_options != config_fingerprint(config):
        recorded = _shaping(dataset.manifest.get("options", {}))
        current = json.loads(json.dumps(_shaping(config.to_json()), default=list))  # As recorded.
        names = sorted(k for k in set(recorded) | set(current)
                       if k not in RUN_CONTROL_OPTIONS and k not in ("input", "output")
                       and recorded.get(k) != current.get(k))
        why_full = (f"the options that shape the records changed ({', '.join(names)})" if names
                    else "the options that shape the records changed")
    for entry in roles:
        old = dataset.roles.get(entry.role)
        # By content: the records depend on the file's bytes, not on the path it was
        # reached by (published relative to the input root, absolute before).
        if old is None or (old.content or "x") != (entry.content or "y"):
            if incremental and entry.role == "manifest_csv" and old is not None and _appended(old, entry):
                continue  # Rows added, none changed: the new rows' images are new inputs.
            why = " (its existing rows changed, not only rows added)" if entry.role == "manifest_csv" else ""
            name = published_path(input_root, entry.path) if input_root else entry.path
            why_full = why_full or f"the {entry.role.replace('_', ' ')} file {name} changed{why}"
    for role in dataset.roles:
        if role not in {e.role for e in roles}:
            why_full = why_full or f"the dataset was made with a {role} file; this run has none"
    root_id = root_identity(input_root) if input_root else ""
    if root_id and dataset.input_root_id and root_id != dataset.input_root_id and not incremental:
        # Named as published (the run report holds this reason): folder names, not paths.
        why_full = why_full or (f"the input root changed (from {published_root(dataset.input_root)} "
                                f"to {published_root(input_root)}, another folder)")
    old_vocabulary = dataset.manifest.get("labels", {}).get("vocabulary", [])
    if incremental and not why_full and vocabulary and list(vocabulary) != list(old_vocabulary):
        added = [c for c in vocabulary if c not in old_vocabulary]
        if added:
            why_full = f"classes not in the dataset appeared ({_listed(added)})"
    if dataset.stale and not incremental:
        why_full = why_full or (f"the dataset holds the old records of {len(dataset.stale)} "
                                f"changed file(s) ({_listed(list(dataset.stale))}) beside the new")
    if why_full:
        if incremental:
            raise UpdateRefused(f"--incremental: {why_full}; the dataset's records depend on "
                                "it, so a full run is needed (without --incremental, with --overwrite)")
        return Update("run", f"{why_full}: a full run")
    # Compared file by file with what the dataset holds from this input root; under
    # a root it never read (a new {date} landing folder) every file is new, and
    # nothing of the other roots counts as deleted.
    old = dataset.files.get(root_id, {})
    changes = compare_inputs(old, now, config.fingerprint, _hash_now(paths))
    if not changes.any:
        return Update("skip", f"input unchanged since {dataset.manifest.get('created', '?')} "
                      f"({changes.summary()})", changes)
    if incremental:
        include = tuple(e.path for e in changes.new) + tuple(now.path for _, now in changes.changed)
        if not include:
            return Update("skip", f"nothing new to convert ({changes.summary()}); the records of "
                          "deleted inputs stay until a full run", changes)
        return Update("part", f"{changes.summary()}: converting {len(include)} into part "
                      f"{dataset.next_part}", changes, dataset.next_part, include)
    return Update("run", f"input changed ({changes.summary()}): a full run", changes)
