"""Issue 23 (start-up): a table's content hash is made beside the CLI's imports.

The preflight records the SHA-256 of every table it converts (~0.5 s a GB on one
core, waited for). ``convert --input FILE`` starts it in a thread before Beam is
imported; the fingerprint takes it when the file is as it was then, and hashes the
file itself when it has changed since.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from beam_tfrecords.schemas.inputs import InputFile
from beam_tfrecords.transforms.io import early_hash
from beam_tfrecords.transforms.io.fingerprint import hash_entries
from tests.harness.cli_probe import run_noted


@pytest.mark.unit
def test_an_early_hash_is_taken_only_for_the_file_as_it_was(tmp_path):
    table = tmp_path / "rows.csv"
    table.write_bytes(b"a,b\n1,2\n" * 1000)
    info = os.stat(table)
    early_hash.hash_early(str(table))
    digest = hashlib.sha256(table.read_bytes()).hexdigest()
    assert early_hash.take_early_hash(str(table), info.st_size, info.st_mtime_ns) == digest
    assert early_hash.take_early_hash(str(table), info.st_size + 1, info.st_mtime_ns) == ""
    assert early_hash.take_early_hash(str(tmp_path / "other.csv"), info.st_size, info.st_mtime_ns) == ""
    early_hash.hash_early(str(tmp_path))  # A folder: nothing started.
    assert early_hash.take_early_hash(str(tmp_path), 0, 0) == ""


@pytest.mark.unit
def test_the_fingerprint_hashes_a_file_changed_since_its_early_hash(tmp_path):
    table = tmp_path / "changed.csv"
    table.write_bytes(b"x,y\n" + b"1,2\n" * 500)
    early_hash.hash_early(str(table))
    before = os.stat(table)
    assert early_hash.take_early_hash(str(table), before.st_size, before.st_mtime_ns)
    table.write_bytes(b"x,y\n" + b"3,4\n" * 600)  # Another size and time: the early hash is stale.
    now = os.stat(table)
    entry, = hash_entries([InputFile("changed.csv", now.st_size, now.st_mtime_ns)], [str(table)])
    assert entry.sha256 == hashlib.sha256(table.read_bytes()).hexdigest()


@pytest.mark.e2e
def test_the_cli_records_the_tables_early_hash_in_its_fingerprint(tmp_path):
    table = tmp_path / "rows.csv"
    table.write_text("id,text\n" + "".join(f"{i},row {i}\n" for i in range(2000)), encoding="utf-8")
    out = tmp_path / "out"
    done, taken = run_noted("beam_tfrecords.transforms.io.fingerprint", "take_early_hash", "result",
                            "convert", "--input", str(table), "--output", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    digest = hashlib.sha256(table.read_bytes()).hexdigest()
    assert taken == [digest]  # The fingerprint took the hash made at the CLI's start.
    lines = [json.loads(line) for line in (out / "inputs.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [line["sha256"] for line in lines if line["path"] == "rows.csv"] == [digest]
