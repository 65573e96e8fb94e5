"""GCS requests spent reading images: how many requests of which kind the shard
writer's read path (``transforms.io.image_records.ImageRecordBuilder.chunk``, what ``ImageRecords``
runs for every chunk of a shard) sends per image, on the storage emulator.

    .venv/bin/python benchmarks/bench_gcs_reads.py [--images 1000] [--threads 4]

Starts ``gcp-storage-emulator`` (``tests/harness/gcs_emulator.py``) with the fault proxy
(``tests/harness/fault_proxy.py``) in front of it, uploads ``--images`` small PNGs in a
class-folder layout, lists them as a run does (``transforms.image_steps.list_images``),
then clears the proxy's log and encodes them all in chunks on ``--threads``
threads (as a shard writer does) and prints the requests the reads sent, by kind:
object metadata GETs, media GETs (with the ``generation`` they pinned, if any),
bucket GETs, and anything else. Wall time is printed too; it is the emulator's
(a Python server on loopback), not GCS's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import os
import sys
import tempfile
import time
from collections import Counter
from urllib.parse import parse_qs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _png(i: int) -> bytes:
    from PIL import Image  # pylint: disable=import-outside-toplevel

    out = io.BytesIO()
    Image.new("RGB", (4, 4), (i % 256, (i // 256) % 256, 7)).save(out, "PNG")
    return out.getvalue()


def _kind(entry, listed: dict[str, int]) -> str:
    """What one logged request was (``listed``: object name -> listed generation)."""
    path, _, query = entry.target.partition("?")
    if entry.method == "GET" and ("alt=media" in query or path.startswith("/download/")):
        generation = parse_qs(query).get("generation", [None])[0]
        if generation is None:
            return "media GET, no generation"
        same = listed.get(entry.object_name) == int(generation)
        return f"media GET, generation {'as listed' if same else 'not the listed one'}"
    if entry.method == "GET" and "/o/" in path:
        return "object metadata GET"
    if entry.method == "GET" and path.rstrip("/").count("/") == 4 and "/b/" in path:
        return "bucket GET"
    return f"other {entry.method}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args(argv)

    # pylint: disable=import-outside-toplevel
    from tests.harness.fault_proxy import FaultProxy
    from tests.harness.gcs_emulator import GcsEmulator

    with tempfile.TemporaryDirectory() as work:
        emulator = GcsEmulator(work).start()
        try:
            emulator.set_environment()
            with FaultProxy(emulator.url) as proxy:
                # Uploaded through the proxy: the emulator writes the address an object
                # was uploaded to into its mediaLink, and a client that downloads by
                # mediaLink would go around the proxy's counters.
                emulator.url, upstream = proxy.url, emulator.url
                for i in range(args.images):
                    emulator.upload_bytes(f"gs://bench-reads/images/c{i % 4}/img_{i:06d}.png", _png(i))
                emulator.url = upstream
                os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
                from beam_tfrecords.transforms.image_steps import list_images
                from beam_tfrecords.transforms.io import files, gcs
                from beam_tfrecords.transforms.io.image_records import ImageRecordBuilder

                gcs._gcsio = None  # pylint: disable=protected-access  # Made for the emulator.
                listing = list_images("gs://bench-reads/images", "class_folders")
                refs = list(listing.refs)
                listed = {path[len("gs://bench-reads/"):]: generation for path, _, generation, _
                          in files.list_stamped("gs://bench-reads/images/**")}
                proxy.clear_log()
                chunks = [refs[i:i + 64] for i in range(0, len(refs), 64)]
                start = time.monotonic()
                with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
                    results = list(pool.map(ImageRecordBuilder("structure").chunk, chunks))
                seconds = time.monotonic() - start
                dead = sum(1 for _, outcomes in results for o in outcomes if not isinstance(o, tuple))
                kinds = Counter(_kind(e, listed) for e in proxy.log)
                statuses = Counter(e.outcome for e in proxy.log)
                samples = {_kind(e, listed): e.target for e in proxy.log}
        finally:
            emulator.stop()
    total = sum(kinds.values())
    print(f"images read: {len(refs)} ({dead} dead letters) in {seconds:.2f} s on {args.threads} threads")
    print(f"requests: {total} ({total / max(len(refs), 1):.2f} per image); statuses {dict(statuses)}")
    for kind, count in sorted(kinds.items()):
        print(f"  {kind:32s} {count:6d}  ({count / max(len(refs), 1):.2f} per image)")
    for kind, target in sorted(samples.items()):
        print(f"  e.g. {kind}: {target[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
