"""Planning benchmark: listing, labelling, splitting, fingerprinting and shard
planning of many image files, on a synthetic listing (no file is created).

    .venv/bin/python benchmarks/bench_planning.py [--sizes 100000,1000000,10000000]
                                                  [--tracemalloc] [--max_gb 12]
    .venv/bin/python benchmarks/bench_planning.py --handoff --sizes 100000,1000000

Paths look like ``gs://bench-bucket/<split>/class_0123/img_000123456.jpg``
(splits train/val/test as split folders, 80/10/10; 1,000 classes) with sizes
drawn from a log-normal distribution (median ~110 KB, like photos). They are
injected at the lowest listing layer: ``transforms.io.files.list_stamped`` (what
one GCS listing gives per object: name, size, generation, crc32c) is replaced by
a generator, so what is measured is everything the preflight and the pipeline
do per file between "the store answered" and "one ShardSpec per shard": layout
detection, labels, splits, ordering keys, the input fingerprint (``inputs.jsonl``
written from the listing's columns, to a temporary file), the listing element
handed to the Beam graph (``ImageRefs``) and the shard plan (every spec made and
its rows pickled, as the graph would).

Each size runs in a fresh subprocess; the parent prints a table of wall time,
peak RSS (``ru_maxrss`` of that process, which includes ~100 MB of imports),
tracemalloc peak (with ``--tracemalloc``; it slows allocation-heavy code ~2x,
so it is a second run), bytes per reference (tracemalloc peak, or RSS growth
over the imports, divided by the count) and shards planned. A size whose
projected RSS (from the previous size) exceeds ``--max_gb`` is not run and is
reported as an extrapolation.

``--handoff`` measures the listing the launcher hands to the listing step when
that runs in another process (``transforms.image_steps.write_listing``/``read_listing``):
for each size, a process lists and writes it, a fresh one reads it, each timed,
with its peak RSS over its RSS just before (``/proc/self/clear_refs``); once as the
pickle of before issue 18, once as the Arrow file with its SHA-256 check.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = "gs://bench-bucket"
SPLITS = (("train", 0.8), ("val", 0.1), ("test", 0.1))
CLASSES = 1000
BLOCK = 1 << 16


def synthetic_files(count: int, seed: int = 0, stamped: bool = False):
    """``(path, size)`` of ``count`` synthetic images, generated a block at a time
    (``stamped``: ``(path, size, generation, crc32c)``, as ``files.list_stamped``)."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    edges = np.cumsum([share for _, share in SPLITS])
    for start in range(0, count, BLOCK):
        n = min(BLOCK, count - start)
        sizes = np.clip(rng.lognormal(np.log(110_000), 0.6, n), 2_000, 20_000_000).astype(np.int64)
        classes = rng.integers(0, CLASSES, n)
        which = np.searchsorted(edges, rng.random(n), side="right")
        for i, (size, cls, split) in enumerate(zip(sizes.tolist(), classes.tolist(), which.tolist())):
            path = f"{ROOT}/{SPLITS[min(split, 2)][0]}/class_{cls:04d}/img_{start + i:09d}.jpg"
            if stamped:
                yield path, size, 1_763_800_000_000_000 + start + i, (start + i) * 2654435761 & 0xFFFFFFFF
            else:
                yield path, size


def _fake_gcs_listing(count: int):
    def listing(root):
        # What the GCS listing gives per object: size, generation, crc32c.
        return {path: (size, str(1_763_800_000_000_000 + i), f"{i & 0xFFFFFFFF:08x}")
                for i, (path, size) in enumerate(synthetic_files(count))}
    return listing


def run_one(count: int, trace: bool, compact_above: int = -1, workers: bool = False) -> dict:
    """Lists and plans ``count`` synthetic files in this process; returns the figures."""
    # pylint: disable=import-outside-toplevel
    import tracemalloc

    from beam_tfrecords.schemas.shards import ShardBand
    from beam_tfrecords.transforms import image_steps as images
    from beam_tfrecords.transforms.io import files, fingerprint

    files.list_files = lambda pattern, limit=None, skipped=None: synthetic_files(count)
    files.list_stamped = lambda pattern, skipped=None, **_: synthetic_files(count, stamped=True)
    fingerprint._gcs_listing = _fake_gcs_listing(count)  # pylint: disable=protected-access
    if compact_above >= 0 and hasattr(images, "COMPACT_LISTING_REFS"):
        images.COMPACT_LISTING_REFS = compact_above
    band = ShardBand.from_mb(100, 200)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if trace:
        tracemalloc.start()
    steps = {}
    start = last = time.perf_counter()

    def step(name):
        nonlocal last
        now = time.perf_counter()
        steps[name] = round(now - last, 2)
        last = now

    if workers:
        result = _on_workers(count, step)
    else:
        plan = _compact if hasattr(images, "pack_refs") else _today
        result = plan(images, fingerprint, ROOT, band, step)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"refs": count, "seconds": round(seconds, 2), "steps": steps, "rss": rss,
            "base_rss": base_rss, "traced_peak": peak, **result}


def _today(images, fingerprint, root, band, step) -> dict:
    """What the code of 2026-11 (before issue 11) does, step by step."""
    from beam_tfrecords.schemas.elements import ImageRefs  # pylint: disable=import-outside-toplevel

    listing = images.list_images(root)
    step("list+label+split")
    entries = fingerprint.file_entries(root, [(r.path, r.size) for r in listing.refs],
                                       [r.filename for r in listing.refs])
    step("fingerprint")
    element = ImageRefs.pack(listing.refs)
    step("graph element")
    specs = images.plan_image_shards(element, band, "none")
    step("plan")
    return {"shards": len(specs), "images": len(listing.refs), "entries": len(entries),
            "element_mb": round(len(element.packed) / 1e6, 1)}


def _compact(images, fingerprint, root, band, step) -> dict:
    """What the preflight and the pipeline do since issue 11: a large listing kept as
    columns with its stamps; ``inputs.jsonl`` streamed from them; one spec made at
    a time, holding its rows as a table."""
    import tempfile  # pylint: disable=import-outside-toplevel

    listing = images.list_images(root)
    step("list+label+split")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "inputs.jsonl")
        if hasattr(fingerprint, "write_inputs") and listing.files is not None:
            fingerprint.write_inputs(path, (), listing.files)
            entries = len(listing.files)
        else:
            entries = len(fingerprint.file_entries(root, [(r.path, r.size) for r in listing.refs],
                                                   [r.filename for r in listing.refs]))
        inputs_mb = round(os.path.getsize(path) / 1e6, 1) if os.path.exists(path) else 0
    step("fingerprint")
    element = images.pack_refs(listing.refs)
    del listing
    step("graph element")
    shards = 0
    for spec in images.image_shards(element, band, "none"):
        len(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))  # What the graph moves.
        shards += 1
    step("plan")
    return {"shards": shards, "entries": entries, "inputs_mb": inputs_mb,
            "element_mb": round(len(element.packed) / 1e6, 1)}


UNITS = 3000  # --workers: one unit per <split>/<class>/ folder (2400 train, 300 val, 300 test).


def _unit_files(count: int, unit: int, seed: int = 0):
    """The synthetic ``(path, size, generation, crc)`` of one unit of ``count`` files."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    per = count // UNITS + (unit < count % UNITS)
    first = unit * (count // UNITS) + min(unit, count % UNITS)
    split = "train" if unit < 2400 else "val" if unit < 2700 else "test"
    rng = np.random.default_rng((seed, unit))
    sizes = np.clip(rng.lognormal(np.log(110_000), 0.6, per), 2_000, 20_000_000).astype(np.int64).tolist()
    folder = f"{ROOT}/{split}/class_{unit % 1000:04d}/"
    return [(f"{folder}img_{first + i:09d}.jpg", size, 1_763_800_000_000_000 + first + i,
             (first + i) * 2654435761 & 0xFFFFFFFF) for i, size in enumerate(sizes)]


def _on_workers(count: int, step) -> dict:
    """--list_on_workers (transforms.worker_listing), its steps run one after another in
    this process: every unit listed into its table (its inputs.jsonl piece written,
    its thin columns kept, the table dropped, as a worker hands it on), then the
    cut from the thin columns (one worker), then each unit's rows sent to their
    shards (the units listed again, untimed, as the shuffle would hand them back).
    The RSS is that of a process holding every unit's thin columns: the cut worker's."""
    # pylint: disable=import-outside-toplevel,protected-access
    import tempfile

    from beam_tfrecords.schemas.shards import ShardBand
    from beam_tfrecords.transforms import worker_listing as wl
    from beam_tfrecords.transforms.io import files

    files.list_unit = lambda pattern, unit: iter(_unit_files(count, int(unit[0].split("/")[0][1:])))
    with tempfile.TemporaryDirectory() as folder:
        settings = wl.UnitsToList(ROOT + "/**", ROOT, "class_folders",
                                  tuple((f"u{u}/", None) for u in range(UNITS)), True, (), (),
                                  folder, folder, ShardBand.from_mb(100, 200), "none")
        thins, slowest, emitted = [], 0.0, []
        for unit in range(UNITS):
            started = time.perf_counter()
            for element in wl._ListUnitFn(settings).process(unit):
                if hasattr(element, "tag"):
                    thins.append(element.value)
            slowest = max(slowest, time.perf_counter() - started)
        step("list units (all)")
        thin_mb = sum(t.keys.nbytes + t.labels.nbytes + t.split_codes.nbytes + t.base_sizes.nbytes
                      for t in thins) / 1e6
        plan = wl.cut_plan(thins, settings)
        step("cut (one worker)")
        del thins
        pieces, first_group = 0, []
        for unit in range(UNITS):
            table, _, _ = wl.list_unit(settings, unit)
            packed = pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL)
            started = time.perf_counter()
            for group, piece in wl._AssignFn().process((unit, packed), plan):
                pieces += 1
                if group == 0:
                    first_group.append(piece)
            emitted.append(time.perf_counter() - started)
        steps_assign = round(sum(emitted), 2)
        started = time.perf_counter()
        specs = list(wl._ShardSpecsFn("none").process((0, first_group), plan))
        group_s = time.perf_counter() - started
    return {"shards": sum(plan.num_shards.values()), "units": UNITS, "slowest_unit_s": round(slowest, 3),
            "thin_mb": round(thin_mb, 1), "pieces": pieces, "assign_cpu_s": steps_assign,
            "groups": plan.groups, "group_specs": len(specs), "group_s": round(group_s, 2)}


# --- --handoff: the listing the launcher hands to the workers ------------------------------

HANDOFF_ARGS = (ROOT, "auto", None, None, None, (), "path", False, (), ())
_PICKLE_MAGIC = b"beam-tfrecords listing v1\n"


def _memory() -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of this process, in bytes."""
    import re  # pylint: disable=import-outside-toplevel

    with open("/proc/self/status", encoding="ascii") as f:
        text = f.read()
    return tuple(int(re.search(rf"{key}:\s+(\d+)", text).group(1)) * 1024 for key in ("VmRSS", "VmHWM"))


def _reset_peak() -> int:
    """Resets the peak RSS (``/proc/self/clear_refs``); returns the RSS now."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    return _memory()[0]


def handoff_write(count: int, fmt: str, path: str) -> dict:
    """Lists ``count`` synthetic files, then writes the hand-off as the launcher does:
    ``fmt`` ``pickle`` is what ``write_listing`` did before issue 18 (a prefix and
    ``pickle.dumps((args, listing))``), ``arrow`` what it does now."""
    # pylint: disable=import-outside-toplevel
    import dataclasses
    import gc

    from beam_tfrecords.transforms import image_steps as images
    from beam_tfrecords.transforms.io import files

    files.list_files = lambda pattern, limit=None, skipped=None: synthetic_files(count)
    files.list_stamped = lambda pattern, skipped=None, **_: synthetic_files(count, stamped=True)
    listing = images.list_images(ROOT)
    token = images.keep_listing(listing, HANDOFF_ARGS)
    gc.collect()
    before = _reset_peak()
    start = time.perf_counter()
    if fmt == "pickle":
        kept = dataclasses.replace(listing, files=None)
        files.write_bytes(path, _PICKLE_MAGIC + pickle.dumps((HANDOFF_ARGS, kept), protocol=pickle.HIGHEST_PROTOCOL))
        digest = ""
    else:
        digest = images.write_listing(path, token)
    seconds = time.perf_counter() - start
    return {"refs": len(listing.refs), "kind": type(listing.refs).__name__, "write_s": round(seconds, 2),
            "write_peak_mb": round((_memory()[1] - before) / 1e6, 1),
            "file_mb": round(os.path.getsize(path) / 1e6, 1), "digest": digest}


def handoff_read(fmt: str, path: str, digest: str) -> dict:
    """Reads the hand-off in a fresh process, as the listing step does (``pickle``: the
    code before issue 18; ``arrow``: the digest check, then the Arrow file)."""
    # pylint: disable=import-outside-toplevel
    from beam_tfrecords.transforms import image_steps as images
    from beam_tfrecords.transforms.io import files

    before = _reset_peak()
    start = time.perf_counter()
    if fmt == "pickle":
        data = files.read_bytes(path)
        assert data.startswith(_PICKLE_MAGIC)
        _, listing = pickle.loads(data[len(_PICKLE_MAGIC):])
        del data
    else:
        listing = images.read_listing(path, HANDOFF_ARGS, digest)
    seconds = time.perf_counter() - start
    return {"read_s": round(seconds, 2), "read_peak_mb": round((_memory()[1] - before) / 1e6, 1),
            "read_refs": len(listing.refs)}


def _handoff(count: int, fmt: str) -> dict:
    import tempfile  # pylint: disable=import-outside-toplevel

    env = {**os.environ, "PYTHONPATH": os.path.dirname(REPO)}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "listing")
        wrote = subprocess.run([sys.executable, os.path.abspath(__file__), "--handoff_write", fmt, path,
                                "--one", str(count)], check=True, capture_output=True, text=True, env=env,
                               cwd=REPO)
        row = json.loads(wrote.stdout.strip().splitlines()[-1])
        read = subprocess.run([sys.executable, os.path.abspath(__file__), "--handoff_read", fmt, path,
                               row["digest"] or "-"], check=True, capture_output=True, text=True, env=env,
                              cwd=REPO)
        row.update(json.loads(read.stdout.strip().splitlines()[-1]))
    assert row["read_refs"] == row["refs"] == count, row
    return row


# --- --cut: the step that plans shards ------------------------------------------------------


def _cut_api() -> str:
    """``parts`` (issue 19: a listing in parts, cut per split from thin columns) or
    ``element`` (before: the whole listing one element, planned in one step)."""
    from beam_tfrecords.transforms import image_steps as images  # pylint: disable=import-outside-toplevel

    return "parts" if hasattr(images, "listing_size") else "element"


def cut_setup(count: int, folder: str) -> dict:
    """Lists ``count`` synthetic files and writes what the planning step receives:
    the hand-off's parts (or, before, the one ``ImageRefs`` element, pickled)."""
    # pylint: disable=import-outside-toplevel
    from beam_tfrecords.transforms import image_steps as images
    from beam_tfrecords.transforms.io import files

    files.list_stamped = lambda pattern, skipped=None, **_: synthetic_files(count, stamped=True)
    listing = images.list_images(ROOT)
    if _cut_api() == "element":
        element = images.pack_refs(listing.refs)
        with open(os.path.join(folder, "element.pickle"), "wb") as f:
            pickle.dump(element, f, protocol=pickle.HIGHEST_PROTOCOL)
        return {"api": "element", "element_mb": round(len(element.packed) / 1e6, 1)}
    token = images.keep_listing(listing, HANDOFF_ARGS)
    digest = images.write_listing(os.path.join(folder, images.LISTING_NAME), token)
    images.drop_listing(token)
    return {"api": "parts", "digest": digest}


def cut_measure(folder: str, step: str) -> dict:
    """One step of the planning, in a fresh process: its peak RSS over its RSS after
    the imports (``/proc/self/clear_refs``). Before: ``plan`` (the one step: the
    element unpickled, every spec made and pickled). After: ``thin`` (each part
    read and its thin columns sent on, one part at a time: a part's worker),
    ``cut`` (the largest split's cut), ``assign`` (one part sent to its groups,
    with every split's cut as the side input), ``specs`` (one group's specs)."""
    # pylint: disable=import-outside-toplevel,protected-access
    from beam_tfrecords.schemas.shards import ShardBand
    from beam_tfrecords.transforms import image_steps as images

    band = ShardBand.from_mb(100, 200)
    before = _reset_peak()
    start = time.perf_counter()
    out: dict = {}
    if step == "plan":
        with open(os.path.join(folder, "element.pickle"), "rb") as f:
            element = pickle.load(f)
        shards = 0
        for spec in images.image_shards(element, band, "none"):
            len(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))  # What the graph moves.
            shards += 1
        out["shards"] = shards
    else:
        from beam_tfrecords.schemas.elements import ListingPart
        from beam_tfrecords.transforms import listing_plan
        with open(os.path.join(folder, "parts.json"), encoding="utf-8") as f:
            parts = [ListingPart(*p) for p in json.load(f)]
        if step == "thin":
            worst = 0
            for part in parts:
                rss = _memory()[0]
                for split, thin in listing_plan._thin(part):
                    with open(os.path.join(folder, f"thin-{split}"), "ab") as f:
                        pickle.dump(thin, f, protocol=pickle.HIGHEST_PROTOCOL)
                worst = max(worst, _memory()[1] - rss)
                _reset_peak()
            out["part_worker_mb"] = round(worst / 1e6, 1)
        elif step == "cut":
            largest = max((n for n in os.listdir(folder) if n.startswith("thin-")),
                          key=lambda n: os.path.getsize(os.path.join(folder, n)))
            thins = _thins(folder, largest)
            cut = listing_plan.cut_split(largest[len("thin-"):], thins, band)
            del thins
            cuts = [cut] + [listing_plan.cut_split(n[len("thin-"):], _thins(folder, n), band)
                            for n in os.listdir(folder) if n.startswith("thin-") and n != largest]
            with open(os.path.join(folder, "cuts.pickle"), "wb") as f:
                pickle.dump(cuts, f, protocol=pickle.HIGHEST_PROTOCOL)
            out.update(split=cut.split, split_rows=int(sum(len(s) for s in cut.shards.values())),
                       shards=sum(c.num_shards for c in cuts))
        else:
            with open(os.path.join(folder, "cuts.pickle"), "rb") as f:
                cuts = pickle.load(f)
            pieces = list(listing_plan._AssignFn().process(parts[0], cuts))
            if step == "specs":
                group = pieces[0][0]
                del pieces
                members = [piece for part in parts for key, piece in listing_plan._AssignFn().process(part, cuts)
                           if key == group]
                before = _reset_peak()
                start = time.perf_counter()
                specs = list(listing_plan._ShardSpecsFn("none").process((group, members), cuts))
                out["group_specs"] = len(specs)
            else:
                out["pieces"] = len(pieces)
    out[f"{step}_s"] = round(time.perf_counter() - start, 1)
    out[f"{step}_mb"] = round((_memory()[1] - before) / 1e6, 1)
    return out


def _thins(folder: str, name: str) -> list:
    thins = []
    with open(os.path.join(folder, name), "rb") as f:
        while True:
            try:
                thins.append(pickle.load(f))
            except EOFError:
                return thins


def _cut(count: int) -> dict:
    import tempfile  # pylint: disable=import-outside-toplevel

    env = {**os.environ}
    env.setdefault("PYTHONPATH", os.path.dirname(REPO))

    def run(*args) -> dict:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), *args, "--one", str(count)],
                             check=True, capture_output=True, text=True, env=env, cwd=REPO)
        return json.loads(out.stdout.strip().splitlines()[-1])

    row = {"refs": count}
    with tempfile.TemporaryDirectory() as folder:
        row.update(run("--cut_step", "setup", folder))
        if row["api"] == "element":
            row.update(run("--cut_step", "plan", folder))
            return row
        from beam_tfrecords.transforms import image_steps as images  # pylint: disable=import-outside-toplevel
        from beam_tfrecords.transforms.plan.handoff import decode_listing
        with open(os.path.join(folder, images.LISTING_NAME), "rb") as f:
            _, parts, _ = decode_listing(f.read(), HANDOFF_ARGS)
        with open(os.path.join(folder, "parts.json"), "w", encoding="utf-8") as f:
            json.dump([(i, n, os.path.join(folder, name), digest) for i, (name, n, digest) in enumerate(parts)], f)
        row["parts"] = len(parts)
        for step in ("thin", "cut", "assign", "specs"):
            row.update(run("--cut_step", step, folder))
    return row


# --- --commit: the commit worker (transforms.commit_step commit_run) ----------------------------

COMMIT_RECORDS_PER_SHARD = 1360  # A 150 MB shard of ~110 KB images.
COMMIT_COPY_EVERY = 1000  # One record in this many holds the content of the one before it.


def _commit_api() -> str:
    """``side_files`` (issue 19: content lists in side files, gathered on the workers)
    or ``inline`` (before: every record's entry in its ShardResult)."""
    import dataclasses  # pylint: disable=import-outside-toplevel

    from beam_tfrecords.schemas.elements import ShardResult  # pylint: disable=import-outside-toplevel

    return "side_files" if "contents_path" in {f.name for f in dataclasses.fields(ShardResult)} else "inline"


def commit_setup(count: int, folder: str) -> dict:
    """Writes what a run's commit finds of ``count`` synthetic images in ``folder``: the
    launcher's ``inputs.jsonl`` (one line per image, path order), one tiny temporary
    shard per ~150 MB of images (with the ``StoredObject`` its verification read),
    each shard's content entries (in side files, or in the results, by the API of
    the code run), and the pickled ``ShardResult`` s and ``InputSummary``."""
    # pylint: disable=import-outside-toplevel
    import hashlib

    import numpy as np

    from beam_tfrecords.schemas.elements import InputSummary, ShardResult
    from beam_tfrecords.schemas.inputs import INPUTS_NAME, file_line
    from beam_tfrecords.schemas.shards import ShardTarget, shard_name
    from beam_tfrecords.transforms.io import files
    from beam_tfrecords.transforms.io.commit import stored_object

    api = _commit_api()
    target = ShardTarget(os.path.join(folder, "out"), "none", "bench")
    os.makedirs(target.temp_dir)
    rng = np.random.default_rng(0)
    names = [name for name, _ in SPLITS]
    split = np.searchsorted(np.cumsum([share for _, share in SPLITS]), rng.random(count), side="right")
    split = np.minimum(split, len(SPLITS) - 1)
    classes = rng.integers(0, CLASSES, count)
    sizes = np.clip(rng.lognormal(np.log(110_000), 0.6, count), 2_000, 20_000_000).astype(np.int64)
    rank = np.argsort(np.argsort(names))  # Split names in sorted order: test, train, val.
    order = np.lexsort((np.arange(count), classes, rank[split]))

    def filename(i: int) -> str:
        return f"{names[split[i]]}/class_{classes[i]:04d}/img_{i:09d}.jpg"

    def content(i: int) -> str:
        source = i - 1 if i and i % COMMIT_COPY_EVERY == 0 else i
        return hashlib.sha256(b"%d" % source).hexdigest()

    with open(files.join(target.temp_dir, INPUTS_NAME), "w", encoding="utf-8") as out:
        for start in range(0, count, BLOCK):
            out.write("".join(file_line(filename(i), int(sizes[i]), generation=str(1_763_800_000_000_000 + i),
                                        crc32c=f"{i * 2654435761 & 0xFFFFFFFF:08x}")
                              for i in order[start:start + BLOCK].tolist()))
    results = []
    for code, name in enumerate(names):
        members = rng.permutation(np.flatnonzero(split == code))
        shards = max(1, -(-len(members) // COMMIT_RECORDS_PER_SHARD))
        for index, rows in enumerate(np.array_split(members, shards)):
            rows = rows.tolist()
            shard = shard_name(name, index, shards, "none")
            temp = target.temp_path(shard)
            with open(temp, "wb") as f:
                f.write(b"x")
            entries = [(content(i), filename(i), "") for i in rows]
            labels: dict = {}
            for i in rows:
                labels[f"class_{classes[i]:04d}"] = labels.get(f"class_{classes[i]:04d}", 0) + 1
            fields = dict(label_counts=tuple(sorted(labels.items())),
                          image_counts=(("format/jpeg", len(rows)), ("mode/RGB", len(rows))))
            if api == "side_files":
                from beam_tfrecords.transforms.io.contents import write_contents
                path, digest, n = write_contents(target.temp_dir, shard, entries)
                fields.update(contents_path=path, contents_sha256=digest, contents_count=n)
                if not path:
                    fields["contents"] = tuple(entries)
            else:
                fields["contents"] = tuple(entries)
            size = int(sizes[rows].sum())
            results.append(ShardResult(name, index, shards, target.final_path(shard), len(rows), 1,
                                       "00000000", hashlib.sha256(b"x").hexdigest(), size, verified=True,
                                       temp_path=temp, verified_as=stored_object(temp), **fields))
    summary = InputSummary(root=ROOT, layout="class_folders", input_files=count,
                           input_bytes=int(sizes.sum()), ignored_files=0,
                           vocabulary=tuple(f"class_{c:04d}" for c in range(CLASSES)))
    with open(os.path.join(folder, "results.pickle"), "wb") as f:
        pickle.dump((target, summary, len(results)), f, protocol=pickle.HIGHEST_PROTOCOL)
        for result in results:  # One at a time, as a shuffle hands a group's values.
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
    return {"api": api, "shards": len(results), "inputs_mb": round(os.path.getsize(
        files.join(target.temp_dir, INPUTS_NAME)) / 1e6, 1),
        "results_mb": round(os.path.getsize(os.path.join(folder, "results.pickle")) / 1e6, 1)}


def _stored_results(folder: str):
    """``(target, summary, results)``: the results an iterator over the file, one
    unpickled at a time (as Dataflow's shuffle hands a large group, a page at a time)."""
    stream = open(os.path.join(folder, "results.pickle"), "rb")  # noqa: SIM115 - closed at the end.
    target, summary, count = pickle.load(stream)

    def results():
        with stream:
            for _ in range(count):
                yield pickle.load(stream)

    return target, summary, results()


def commit_gather(folder: str) -> dict:
    """What the gathering workers do (``transforms.gather``), one element after
    another, the shuffle between them spilled to disk: each shard's entries read
    and sent to their content-hash bucket and ``inputs.jsonl`` piece, then each
    bucket and piece processed. The peak is that of the largest element (one
    worker's), not of all of them: each is processed with the others on disk."""
    # pylint: disable=import-outside-toplevel,protected-access
    from beam_tfrecords.transforms import gather

    target, _, results = _stored_results(folder)
    results = list(results)
    before = _reset_peak()
    start = time.perf_counter()
    spill = os.path.join(folder, "shuffle")
    os.makedirs(spill)
    read = gather._ReadContentsFn(target.temp_dir, 0)
    keys = {}
    for key, value in gather._pieces(None, target.temp_dir, 0):
        keys.setdefault(key, len(keys))
        with open(os.path.join(spill, str(keys[key])), "ab") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    for result in results:
        for key, value in read.process(result):
            keys.setdefault(key, len(keys))
            with open(os.path.join(spill, str(keys[key])), "ab") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    del results
    read_s = time.perf_counter() - start
    _reset_peak()  # The first element's peak is its own, not the sending's above.
    parts, worst = [], 0
    fn = gather._GatherFn(target.temp_dir)
    for key, number in keys.items():
        values = []
        with open(os.path.join(spill, str(number)), "rb") as f:
            while True:
                try:
                    values.append(pickle.load(f))
                except EOFError:
                    break
        rss = _memory()[0]
        parts.extend(value for _, value in fn.process((key, values)))
        del values
        worst = max(worst, _memory()[1] - rss)
        _reset_peak()
    with open(os.path.join(folder, "parts.pickle"), "wb") as f:
        pickle.dump(parts, f, protocol=pickle.HIGHEST_PROTOCOL)
    return {"gather_read_s": round(read_s, 1), "gather_s": round(time.perf_counter() - start, 1),
            "gather_keys": len(keys), "gather_element_peak_mb": round(worst / 1e6, 1),
            "gather_base_mb": round(before / 1e6, 1)}


def commit_measure(folder: str) -> dict:
    """The commit worker: receives every ``ShardResult`` (and, with side files, the
    gathered parts), then ``commit_run`` publishes the dataset. Peak RSS over the
    process's RSS after its imports, and wall time."""
    # pylint: disable=import-outside-toplevel
    from beam_tfrecords.schemas.shards import ShardBand
    from beam_tfrecords.transforms import commit_step as manifest

    api = _commit_api()
    before = _reset_peak()
    start = time.perf_counter()
    target, summary, results = _stored_results(folder)
    settings = manifest.CommitSettings(target, ShardBand.from_mb(100, 200), 0.01,
                                       options_fingerprint="bench", input_root=ROOT)
    if api == "side_files":  # What _CommitFn does with its group's values.
        from beam_tfrecords.transforms.io.contents import stripped
        folded = manifest._CountsFolded()  # pylint: disable=protected-access
        for result in results:
            folded.add(stripped(result))  # As KeyResults sends it.
        with open(os.path.join(folder, "parts.pickle"), "rb") as f:
            parts = pickle.load(f)
        gathered = manifest.join_gathered(parts, target.temp_dir, settings.options_fingerprint)
        report = manifest.commit_run(settings, folded.results(), summary, gathered)
    else:  # The code before issue 19: list(grouped["results"]), then the commit.
        report = manifest.commit_run(settings, list(results), summary)
    seconds = time.perf_counter() - start
    peak = _memory()[1] - before
    assert report.status == "ok", report.status
    manifest_json = report.manifest_json
    return {"commit_s": round(seconds, 1), "commit_peak_mb": round(peak / 1e6, 1),
            "commit_base_mb": round(before / 1e6, 1), "records": report.records,
            "duplicate_groups": manifest_json.get("duplicates", {}).get("groups", 0),
            "input_files": manifest_json["input"]["files_list"]["files"]}


def _commit(count: int) -> dict:
    import tempfile  # pylint: disable=import-outside-toplevel

    env = {**os.environ}
    env.setdefault("PYTHONPATH", os.path.dirname(REPO))
    row = {"refs": count}
    with tempfile.TemporaryDirectory() as folder:
        for step in ("setup", "gather", "commit"):
            if step == "gather" and row.get("api") == "inline":
                continue
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--commit_step", step, folder,
                                  "--one", str(count)], check=True, capture_output=True, text=True,
                                 env=env, cwd=REPO)
            row.update(json.loads(out.stdout.strip().splitlines()[-1]))
    assert row["records"] == count, row
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="also measure the tracemalloc peak (a second, slower run)")
    parser.add_argument("--max_gb", type=float, default=12.0,
                        help="skip a size whose projected RSS exceeds this")
    parser.add_argument("--compact_above", type=int, default=-1,
                        help="list as columns above this many images (default: the code's "
                        "COMPACT_LISTING_REFS; 0: always)")
    parser.add_argument("--workers", action="store_true",
                        help="measure --list_on_workers: units listed one by one, then the cut "
                        "from thin columns (RSS: the cut worker's)")
    parser.add_argument("--handoff", action="store_true",
                        help="measure the listing hand-off to the workers (written by the launcher, "
                        "read by the listing step): the pickle of before issue 18 against the Arrow "
                        "file with its digest check")
    parser.add_argument("--commit", action="store_true",
                        help="measure the commit worker: commit_run of synthetic ShardResults (content "
                        "lists in side files, gathered on the workers first; or, with the code before "
                        "issue 19, in the results); peak RSS over the process's RSS after its imports")
    parser.add_argument("--commit_step", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--cut", action="store_true",
                        help="measure the step that plans shards: before, the whole listing as one "
                        "element planned in one step; after, the listing in parts, each split cut from "
                        "thin columns (and a part's and a group's step beside it)")
    parser.add_argument("--cut_step", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--handoff_write", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--handoff_read", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args(argv)
    if args.commit_step:
        step, folder = args.commit_step
        fn = {"setup": lambda: commit_setup(args.one, folder), "gather": lambda: commit_gather(folder),
              "commit": lambda: commit_measure(folder)}[step]
        print(json.dumps(fn()))
        return 0
    if args.cut_step:
        step, folder = args.cut_step
        print(json.dumps(cut_setup(args.one, folder) if step == "setup" else cut_measure(folder, step)))
        return 0
    if args.cut:
        rows = []
        for count in (int(s) for s in args.sizes.split(",")):
            row = _cut(count)
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
        return 0
    if args.commit:
        rows = []
        print(f"{'refs':>11} {'api':>10} {'shards':>6} {'commit s':>8} {'commit MB':>9} "
              f"{'gather s':>8} {'largest gather element MB':>25}", flush=True)
        for count in (int(s) for s in args.sizes.split(",")):
            row = _commit(count)
            rows.append(row)
            print(f"{count:>11,} {row['api']:>10} {row['shards']:>6} {row['commit_s']:>8} "
                  f"{row['commit_peak_mb']:>9} {row.get('gather_s', '-'):>8} "
                  f"{row.get('gather_element_peak_mb', '-'):>25}", flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
        return 0
    if args.handoff_write:
        print(json.dumps(handoff_write(args.one, *args.handoff_write)))
        return 0
    if args.handoff_read:
        fmt, path, digest = args.handoff_read
        print(json.dumps(handoff_read(fmt, path, digest)))
        return 0
    if args.handoff:
        rows = []
        print(f"{'refs':>11} {'as':>8} {'format':>6} {'file MB':>8} {'write s':>8} {'write MB':>9} "
              f"{'read s':>7} {'read MB':>8}  (MB: peak RSS over the process's RSS before the step)")
        for count in (int(s) for s in args.sizes.split(",")):
            for fmt in ("pickle", "arrow"):
                row = {"format": fmt, **_handoff(count, fmt)}
                rows.append(row)
                print(f"{count:>11,} {row['kind']:>8} {fmt:>6} {row['file_mb']:>8} {row['write_s']:>8} "
                      f"{row['write_peak_mb']:>9} {row['read_s']:>7} {row['read_peak_mb']:>8}", flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
        return 0
    if args.one:
        print(json.dumps(run_one(args.one, args.tracemalloc, args.compact_above, args.workers)))
        return 0
    rows, per_ref = [], None
    for count in (int(s) for s in args.sizes.split(",")):
        if per_ref is not None and per_ref * count / 1e9 > args.max_gb:
            rows.append({"refs": count, "projected_gb": round(per_ref * count / 1e9, 1)})
            print(f"{count:>11,}  not run: projected RSS {per_ref * count / 1e9:.1f} GB > "
                  f"--max_gb {args.max_gb}", flush=True)
            continue
        row = _child(count, False, args.compact_above, args.workers)
        if args.tracemalloc:
            row["traced_peak"] = _child(count, True, args.compact_above, args.workers)["traced_peak"]
        per_ref = (row["rss"] - row["base_rss"]) / count
        rows.append(row)
        traced = f"{row['traced_peak'] / 1e6:9.0f}" if row["traced_peak"] else "        -"
        per = (row["traced_peak"] or row["rss"] - row["base_rss"]) / count
        print(f"{count:>11,} {row['seconds']:8.1f} s {row['rss'] / 1e6:8.0f} MB RSS {traced} MB "
              f"traced {per:7.0f} B/ref {row['shards']:6,} shards  {row['steps']}"
              + (f"  slowest unit {row['slowest_unit_s']} s, thin columns {row['thin_mb']} MB, "
                 f"assign {row['assign_cpu_s']} s CPU in all ({row['pieces']:,} pieces), "
                 f"specs of one group of {row['groups']}: {row['group_s']} s" if args.workers else ""),
              flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


def _child(count: int, trace: bool, compact_above: int, workers: bool = False) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--one", str(count),
               "--compact_above", str(compact_above)] + (["--workers"] if workers else [])
    if trace:
        command.append("--tracemalloc")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(REPO)}
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
