"""Annotated images benchmark (issue 21): what boxes and masks cost over class folders.

    .venv/bin/python benchmarks/bench_annotations.py [--workdir DIR] [--photo_mb 600]
                                                     [--repeat 1] [--skip_masks]

The photo set of the image benchmark (``datasets.make_photo_like``: JPEGs 320-1024 px
wide in ten class folders, built once under ``WORKDIR/data/photo`` or
``photo_<MB>mb`` and reused) is converted, in one invocation, as:

* ``class_folders``: ``convert --input PHOTO`` (the reference: no annotations);
* ``box_csv``: the same images (hard links under ``WORKDIR/data/<set>_annotated/
  images``, so the page cache holds them once) through a box CSV (``filename,width,
  height,class,xmin,ymin,xmax,ymax``) with three boxes per image, in pixels;
  target: at most 1.2x the class folders' wall time;
* ``coco_masks`` (not with ``--skip_masks``): the images with a COCO instances file
  holding the same three objects per image as polygons, ``--instance_masks`` (one PNG
  mask per object rendered, stored with the image);
* ``semantic_masks`` (not with ``--skip_masks``): ``--masks`` with one PNG per image
  (values 0-3, the three boxes filled), checked and stored with the image.

The masks runs are measured separately: no target, their cost is the masks' rendering,
encoding and bytes. Every runner is a subprocess measured by ``bench_images.run_measured``
(wall time, peak RSS of the process tree); the runners go in rounds (``--repeat``
rounds, each runner once a round) so that drift in the machine's load spreads over all
of them; the figures are the medians, and each runner's ratio to the class folders is
given both of the medians and as the median of the rounds' own ratios (paired). After each run the records are counted from the
shards' framing and checked against the number of images. Results are printed and
written to ``WORKDIR/results_annotations.json``; logs under ``WORKDIR/logs/annotations/``.
"""

import argparse
import io
import json
import os
import statistics
import sys
import time

import bench_images
import datasets
import numpy as np
from PIL import Image

MB = bench_images.MB
TARGET_RATIO = 1.2
# Three boxes per image, as fractions of its width and height: (class slot, x0, y0, x1, y1).
BOXES = ((0, 0.10, 0.10, 0.40, 0.50), (1, 0.50, 0.20, 0.90, 0.60), (2, 0.20, 0.60, 0.70, 0.95))


def _images(photo_dir):
    """The photo set's images: ``[(relative path, (width, height))]``, sorted."""
    found = []
    for folder, _, names in os.walk(photo_dir):
        for name in names:
            if name.endswith(".jpg"):
                path = os.path.join(folder, name)
                with Image.open(path) as im:
                    found.append((os.path.relpath(path, photo_dir), im.size))
    return sorted(found)


def _pixel_boxes(size):
    width, height = size
    return [(slot, round(x0 * width), round(y0 * height), round(x1 * width), round(y1 * height))
            for slot, x0, y0, x1, y1 in BOXES]


def build_annotated(photo_dir, root):
    """Writes the annotated views of the photo set under ``root`` (reused when its
    marker names the same set): ``images/`` (hard links), ``boxes.csv``,
    ``instances.json`` and ``masks/``.

    Returns:
        ``(root, number of images, seconds)``.
    """
    started = time.perf_counter()
    marker = os.path.join(root, ".complete")
    params = {"photo": os.path.abspath(photo_dir), "boxes": BOXES}
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == json.loads(json.dumps(params)):
                with open(os.path.join(root, "boxes.csv")) as g:
                    count = len({line.split(",", 1)[0] for line in g}) - 1
                print(f"annotated: reusing {root}", flush=True)
                return root, count, time.perf_counter() - started
    images = _images(photo_dir)
    classes = datasets.PHOTO_CLASSES
    rows = ["filename,width,height,class,xmin,ymin,xmax,ymax"]
    coco = {"images": [], "annotations": [],
            "categories": [{"id": i + 1, "name": n} for i, n in enumerate(classes[:3])]}
    for number, (rel, size) in enumerate(images, start=1):
        for sub in ("images", "masks"):
            os.makedirs(os.path.join(root, sub, os.path.dirname(rel)), exist_ok=True)
        link = os.path.join(root, "images", rel)
        if not os.path.exists(link):
            os.link(os.path.join(photo_dir, rel), link)
        width, height = size
        coco["images"].append({"id": number, "file_name": rel, "width": width, "height": height})
        mask = np.zeros((height, width), dtype=np.uint8)
        for slot, x0, y0, x1, y1 in _pixel_boxes(size):
            rows.append(f"images/{rel},{width},{height},{classes[slot]},{x0},{y0},{x1},{y1}")
            # A polygon that is not its box: the box with one corner cut.
            ring = [x0, y0, x1, y0, x1, y1, x0 + (x1 - x0) // 2, y1, x0, y0 + (y1 - y0) // 2]
            coco["annotations"].append({
                "id": len(coco["annotations"]) + 1, "image_id": number, "category_id": slot + 1,
                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float((x1 - x0) * (y1 - y0)), "iscrowd": 0,
                "segmentation": [[float(v) for v in ring]]})
            mask[y0:y1, x0:x1] = slot + 1
        out = io.BytesIO()
        Image.fromarray(mask).save(out, format="PNG")
        with open(os.path.join(root, "masks", rel[:-len(".jpg")] + ".png"), "wb") as f:
            f.write(out.getvalue())
    with open(os.path.join(root, "boxes.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    with open(os.path.join(root, "instances.json"), "w") as f:
        json.dump(coco, f)
    with open(marker, "w") as f:
        json.dump(params, f)
    print(f"annotated: {len(images)} images, {3 * len(images)} boxes, polygons and masks in "
          f"{time.perf_counter() - started:.1f} s -> {root}", flush=True)
    return root, len(images), time.perf_counter() - started


def commands(photo_dir, annotated, out_dir, masks):
    """``{runner: command}`` (the output folder is ``out_dir/<runner>``)."""
    convert = [sys.executable, "-m", "beam_tfrecords", "convert", "--overwrite"]
    runners = {
        "class_folders": ["--input", photo_dir],
        "box_csv": ["--input", os.path.join(annotated, "boxes.csv")],
    }
    if masks:
        runners["coco_masks"] = ["--input", os.path.join(annotated, "images"), "--annotations",
                                 os.path.join(annotated, "instances.json"), "--instance_masks"]
        runners["semantic_masks"] = ["--input", os.path.join(annotated, "images"), "--masks",
                                     os.path.join(annotated, "masks")]
    return {name: convert + flags + ["--output", os.path.join(out_dir, name)] for name, flags in runners.items()}


def summary(runs, images):
    """Median wall time and peak RSS per runner; a runner that failed, or wrote another
    number of records than there are images, is ``failed``."""
    table = {}
    for name, results in runs.items():
        ok = [r for r in results if r["status"] == "ok" and r.get("records") == images]
        table[name] = {
            "runs": len(results), "ok": len(ok),
            "wall_s_median": statistics.median(r["wall_s"] for r in ok) if ok else None,
            "wall_s_min": min(r["wall_s"] for r in ok) if ok else None,
            "wall_s_max": max(r["wall_s"] for r in ok) if ok else None,
            "peak_rss_mb": max(r["peak_rss_tree_bytes"] for r in ok) / MB if ok else None,
            "out_mb": statistics.median(r["bytes_written"] for r in ok) / MB if ok else None,
            "records": ok[0]["records"] if ok else None,
        }
    base = table["class_folders"]["wall_s_median"]
    for name, row in table.items():
        row["ratio"] = row["wall_s_median"] / base if base and row["wall_s_median"] else None
        # Paired: each round's time over the class folders' time of the same round (the
        # machine's load drifts less within a round than across rounds).
        pairs = [r["wall_s"] / c["wall_s"] for r, c in zip(runs[name], runs["class_folders"])
                 if r["status"] == c["status"] == "ok" and r.get("records") == c.get("records") == images]
        row["ratio_paired_median"] = statistics.median(pairs) if pairs else None
    return table


def print_summary(table, images, input_mb):
    print(f"\n== photo set: {images} images, {input_mb:.1f} MB; three objects per image ==")
    print(f"{'runner':<15} {'ok':>5} {'wall s (median)':>16} {'min':>7} {'max':>7} {'ratio':>7} "
          f"{'paired':>7} {'RSS MB':>7} {'out MB':>7}")
    for name, row in table.items():
        if row["wall_s_median"] is None:
            print(f"{name:<15} {row['ok']}/{row['runs']:<3} FAILED")
            continue
        print(f"{name:<15} {row['ok']}/{row['runs']:<3} {row['wall_s_median']:16.1f} {row['wall_s_min']:7.1f} "
              f"{row['wall_s_max']:7.1f} {row['ratio']:6.2f}x {row['ratio_paired_median']:6.2f}x "
              f"{row['peak_rss_mb']:7.0f} {row['out_mb']:7.1f}")
    ratio, paired = table["box_csv"]["ratio"], table["box_csv"]["ratio_paired_median"]
    if ratio is not None:
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        print(f"box CSV (3 boxes/image) / class folders: {ratio:.2f}x of the medians, {paired:.2f}x the median "
              f"of each round's ratio; target <= {TARGET_RATIO}x (medians): {verdict}")
    print("(masks: measured separately, no target)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", default="/tmp/beam-tfrecords-bench")
    parser.add_argument("--photo_mb", type=int, default=600)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--skip_masks", action="store_true")
    args = parser.parse_args(argv)
    data = os.path.join(args.workdir, "data")
    name = "photo" if args.photo_mb == 600 else f"photo_{args.photo_mb}mb"
    print(f"{name}: building the input set", flush=True)
    photo_dir, _ = bench_images.build_set("photo", data, args.photo_mb) if name == "photo" else (
        datasets.make_photo_like(os.path.join(data, name), total_mb=args.photo_mb), 0)
    annotated, images, _ = build_annotated(photo_dir, os.path.join(data, f"{name}_annotated"))
    warm = bench_images.warm_up(photo_dir)
    bench_images.warm_up(annotated)
    logs = os.path.join(args.workdir, "logs", "annotations")
    os.makedirs(logs, exist_ok=True)
    out_dir = os.path.join(args.workdir, "out", "annotations")
    cmds = commands(photo_dir, annotated, out_dir, not args.skip_masks)
    runs = {runner: [] for runner in cmds}
    for round_ in range(args.repeat):
        for runner, cmd in cmds.items():
            result = bench_images.bench_run(runner, cmd, os.path.join(out_dir, runner),
                                            os.path.join(logs, f"{runner}-{round_}"), warm["bytes"])
            wrong = result["status"] == "ok" and result.get("records") != images
            print(f"  {runner}: {result['status']}, {result['wall_s']:.1f} s, {result.get('records')} records"
                  + (f" (NOT one per image: {images} images)" if wrong else ""), flush=True)
            runs[runner].append(result)
    table = summary(runs, images)
    print_summary(table, images, warm["bytes"] / MB)
    results = {**bench_images.run_info(args.workdir), "photo": photo_dir, "annotated": annotated,
               "images": images, "summary": table, "runs": runs}
    path = os.path.join(args.workdir, "results_annotations.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nresults: {path}")
    return 0 if all(row["wall_s_median"] is not None for row in table.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
