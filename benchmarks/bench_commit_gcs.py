"""The commit on ``gs://``: requests and wall time to publish N verified shards, and
the requests of verifying them, against a storage emulator on loopback.

    .venv/bin/python benchmarks/bench_commit_gcs.py [--shards 1000] [--server emulator|fake]
                                                    [--verify] [--over_same_names]
                                                    [--tree DIR] [--json FILE]

N small shards (3 records each) are uploaded to the server under a run's
temporary folder (``<shard>.<attempt id>``), with a result for each as the shard
verifier leaves it (size, CRC-32C, SHA-256, the generation read); the run's lock is
taken. Then the commit step (``transforms.commit_step.commit_run``) runs once, every
request of it through ``tests/harness/fault_proxy.py``'s ``FaultProxy``, whose log is
counted by kind (``fault_proxy.request_kind``). ``--verify`` also runs the
pipeline's verification step (``VerifyShards``, on the in-process runner) over the
N shards, before the commit: as the CLI runs it (without ``--reread``: the CRC-32C
and size GCS reports) and with ``--reread``. ``--over_same_names`` first publishes an
older dataset of N shards of the same names (other bytes) there, as a nightly
``--overwrite`` finds it: the commit then keeps each old shard, and the old
manifest, aside before replacing it (a copy each).

``--tree DIR`` runs the code of another checkout (e.g. ``git archive <commit> | tar
-x -C DIR``) instead of this one: the "before" figures. Wall times are of the
emulator on this machine (gcp-storage-emulator is a Python server; ``--server fake``
is fake-gcs-server), not of GCS: compare requests, which GCS bills and which cost it
~20-100 ms each.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _use_tree(tree: str) -> None:
    """Imports ``beam_tfrecords`` from ``tree`` (a checkout) instead of this worktree."""
    import __editable___beam_tfrecords_0_1_0_finder as finder  # pylint: disable=import-outside-toplevel

    for name, folder in (("beam_tfrecords", "beam_pipeline"), ("beam_tfrecords.schemas", "schemas"),
                         ("beam_tfrecords.transforms", "transforms")):
        finder.MAPPING[name] = os.path.join(os.path.abspath(tree), folder)


def _server(kind: str, workdir: str):
    if kind == "fake":
        from tests.harness.fake_gcs import FakeGcs  # pylint: disable=import-outside-toplevel

        server = FakeGcs(workdir).start()
    else:
        from tests.harness.gcs_emulator import GcsEmulator  # pylint: disable=import-outside-toplevel

        server = GcsEmulator(workdir).start()
    return server, server.url


def _client(url: str):
    """A google-cloud-storage client on ``url``, anonymous. The shards are uploaded
    through the proxy: the emulator keeps each object's download link as the upload's
    host gave it, and a read would otherwise bypass the proxy."""
    # pylint: disable=import-outside-toplevel
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="bench", credentials=AnonymousCredentials(),
                          client_options=ClientOptions(api_endpoint=url))


def _shard_bytes(index: int, tag: str = "") -> bytes:
    from beam_tfrecords.transforms.codec.tfrecord import frame_record  # pylint: disable=import-outside-toplevel

    return b"".join(frame_record(f"shard {index} record {i}{tag} ".encode() * 20) for i in range(3))


def _uploaded(client, bucket: str, out: str, run_id: str, shards: int, tag: str = "") -> list:
    """The shards uploaded (8 at a time); their results, as verified."""
    # pylint: disable=import-outside-toplevel
    import google_crc32c

    from beam_tfrecords.schemas.elements import ShardResult, StoredObject
    from beam_tfrecords.schemas.shards import ShardTarget, shard_name

    target = ShardTarget(out, "none", run_id)

    def one(index: int):
        data = _shard_bytes(index, tag)
        name = shard_name("train", index, shards, "none")
        temp = f"{target.temp_dir}/{name}.{uuid.uuid4().hex[:12]}"
        blob = client.bucket(bucket).blob(temp[len(f"gs://{bucket}/"):])
        blob.upload_from_string(data)
        return ShardResult("train", index, shards, target.final_path(name), 3, len(data),
                           google_crc32c.Checksum(data).hexdigest().decode(),
                           hashlib.sha256(data).hexdigest(), len(data), temp_path=temp,
                           verified=True, verified_as=StoredObject(len(data), generation=int(blob.generation)))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # The client keeps 10 connections.
        return list(pool.map(one, range(shards)))


def _counts(proxy) -> dict:
    from tests.harness.fault_proxy import request_kind  # pylint: disable=import-outside-toplevel

    kinds = Counter(request_kind(e.method, e.target) for e in proxy.log)
    return {"total": sum(kinds.values()), **dict(sorted(kinds.items()))}


def _verify(results: list, reread: bool | None) -> None:
    # pylint: disable=import-outside-toplevel
    import dataclasses

    import apache_beam as beam

    from beam_tfrecords.transforms.shard_engine import VerifyShards

    pending = [dataclasses.replace(r, verified=False, verified_as=None) for r in results]
    step = VerifyShards() if reread is None else VerifyShards(reread=reread)
    with beam.Pipeline() as p:
        _ = p | beam.Create(pending) | step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--server", choices=("emulator", "fake"), default="emulator")
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--over_same_names", action="store_true")
    parser.add_argument("--tree", default="")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if args.tree:
        _use_tree(args.tree)
    from tests.harness.fault_proxy import FaultProxy  # pylint: disable=import-outside-toplevel

    figures: dict = {"shards": args.shards, "server": args.server, "tree": args.tree or REPO,
                     "over_same_names": args.over_same_names}
    with tempfile.TemporaryDirectory() as workdir:
        server, url = _server(args.server, workdir)
        try:
            with FaultProxy(url) as proxy:
                os.environ.update(STORAGE_EMULATOR_HOST=proxy.url, NO_GCE_CHECK="true")
                client = _client(proxy.url)
                # pylint: disable=import-outside-toplevel
                from beam_tfrecords.schemas.elements import InputSummary
                from beam_tfrecords.schemas.shards import ShardBand, ShardTarget
                from beam_tfrecords.transforms.commit_step import CommitSettings, commit_run
                from beam_tfrecords.transforms.io import gcs
                from beam_tfrecords.transforms.io.commit import acquire_lock, new_run_id

                gcs.use_anonymous_credentials()
                client.create_bucket("bench")
                out = f"gs://bench/commit-{uuid.uuid4().hex[:6]}"
                summary = InputSummary(root="", layout="records", input_files=0, input_bytes=0,
                                       ignored_files=0, vocabulary=())
                if args.over_same_names:  # An older dataset there, its shards of the same names.
                    old_id = new_run_id()
                    acquire_lock(out, old_id)
                    old = _uploaded(client, "bench", out, old_id, args.shards, tag=" (older)")
                    settings = CommitSettings(ShardTarget(out, "none", old_id), ShardBand(1, 1 << 30), 0.0,
                                              release_lock=old_id)
                    figures["older dataset"] = str(commit_run(settings, old, summary).status)
                run_id = new_run_id()
                acquire_lock(out, run_id)
                results = _uploaded(client, "bench", out, run_id, args.shards)
                if args.verify:
                    modes = [("verify (as before: re-read)", None)] if args.tree else [
                        ("verify (default: stored CRC-32C)", False), ("verify --reread", True)]
                    for label, reread in modes:
                        proxy.clear_log()
                        began = time.monotonic()
                        _verify(results, reread)
                        figures[label] = {"seconds": round(time.monotonic() - began, 2), **_counts(proxy)}
                settings = CommitSettings(ShardTarget(out, "none", run_id), ShardBand(1, 1 << 30), 0.0,
                                          release_lock=run_id)
                proxy.clear_log()
                began = time.monotonic()
                report = commit_run(settings, results, summary)
                figures["commit"] = {"seconds": round(time.monotonic() - began, 2), **_counts(proxy)}
                figures["status"] = str(report.status)
                if report.status != "ok":
                    figures["failures"] = [f.to_json() for f in report.verification_failures or ()][:1]
        finally:
            server.stop()
    for key, value in figures.items():
        print(f"{key}: {json.dumps(value)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    return 0 if figures.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
