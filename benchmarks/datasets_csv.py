"""Deterministic synthetic CSV table for the CSV benchmark.

``make_tabular_csv`` writes a header and ``rows`` rows with the columns of
TensorFlow's CSV tutorial plus three awkward ones:

* ``flag``: ``True`` or ``False``;
* ``count``: an integer 0-4;
* ``animal``: one of cat, dog, chicken, horse, goat;
* ``score``: a standard normal float, ``%.6f``;
* ``comment``: free text of 2-4 comma-separated phrases, so always quoted; about
  10% of the comments hold a ``"quoted"`` phrase and about 2% a newline;
* ``maybe``: a float, ``%.6f``, empty in about 20% of the rows;
* ``ids``: 0-5 integers 0-99 joined by ``;`` (empty when there are none).

The file is written with Python's ``csv`` module (``QUOTE_MINIMAL``, ``\\n`` line
ends) in chunks of ``CHUNK_ROWS`` rows; chunk ``k`` is drawn from its own
``numpy`` generator seeded with ``[seed, k]``, so the file depends only on
``rows`` and ``seed``. ``schema.yaml``, describing the columns, is written in the
same folder.

The table is complete once ``<path>.complete`` exists; it is written last and
records the parameters, so an interrupted or differently sized table is rebuilt
and a complete one is reused as is.

Run as a script to build one: ``python benchmarks/datasets_csv.py PATH [--rows N]``.
"""

import argparse
import csv
import json
import os
import time

import numpy as np

COLUMNS = ("flag", "count", "animal", "score", "comment", "maybe", "ids")
ANIMALS = ("cat", "dog", "chicken", "horse", "goat")
PHRASES = ("great", "good", "not bad", "too loud", "very friendly", "would adopt again",
           "sleeps all day", "eats a lot", "a bit shy", "really", "loves children",
           "needs a big garden", "quiet", "smells", "best pet ever", "fine")
SCHEMA_NAME = "schema.yaml"
SCHEMA_YAML = """\
columns:
  - {name: flag, type: bool}
  - {name: count, type: int64}
  - {name: animal, type: string}
  - {name: score, type: float}
  - {name: comment, type: string}
  - {name: maybe, type: float, default: 0.0}
  - {name: ids, type: int64, delimiter: ";"}
"""
CHUNK_ROWS = 100_000
QUOTE_SHARE = 0.10
NEWLINE_SHARE = 0.02
EMPTY_MAYBE_SHARE = 0.20
MAX_IDS = 5


def _comment(phrases, quote_at, newline):
    """Joins phrases into a comment.

    Args:
        phrases: The phrases, at least two.
        quote_at: Index of the phrase to put in double quotes, or -1 for none.
        newline: Whether the last separator is ``",\\n"`` instead of ``", "``.

    Returns:
        The comment text.
    """
    if quote_at >= 0:
        phrases = list(phrases)
        phrases[quote_at] = f'"{phrases[quote_at]}"'
    if newline:
        return ", ".join(phrases[:-1]) + ",\n" + phrases[-1]
    return ", ".join(phrases)


def _chunk_rows(rng, n):
    """Draws ``n`` rows.

    Args:
        rng: The chunk's ``numpy.random.Generator``.
        n: Number of rows.

    Returns:
        A list of rows, each a list of the column values as written by ``csv``.
    """
    flags = (rng.random(n) < 0.5).tolist()
    counts = rng.integers(0, 5, n).tolist()
    animals = [ANIMALS[i] for i in rng.integers(0, len(ANIMALS), n)]
    scores = ["%.6f" % x for x in rng.standard_normal(n)]
    maybes = ["" if empty else "%.6f" % x
              for empty, x in zip(rng.random(n) < EMPTY_MAYBE_SHARE,
                                  rng.uniform(0, 100, n))]
    id_counts = rng.integers(0, MAX_IDS + 1, n)
    id_values = rng.integers(0, 100, (n, MAX_IDS)).astype(str).tolist()
    ids = [";".join(values[:k]) for values, k in zip(id_values, id_counts)]
    phrase_counts = rng.integers(2, 5, n)
    phrase_indices = rng.integers(0, len(PHRASES), (n, 4)).tolist()
    quoted = rng.random(n) < QUOTE_SHARE
    quote_at = (rng.random(n) * phrase_counts).astype(int)
    newline = (rng.random(n) < NEWLINE_SHARE).tolist()
    comments = [_comment([PHRASES[i] for i in indices[:k]], q if is_quoted else -1, nl)
                for indices, k, q, is_quoted, nl
                in zip(phrase_indices, phrase_counts, quote_at, quoted, newline)]
    return [list(row) for row in
            zip(flags, counts, animals, scores, comments, maybes, ids)]


def _read_marker(marker):
    """Returns the parameters stored in a marker file, or None if there is none."""
    try:
        with open(marker) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def make_tabular_csv(path, rows=1_000_000, seed=0):
    """Builds the CSV table and its schema unless they are already complete.

    Args:
        path: The CSV file to write; its folder is created if needed and gets
            ``schema.yaml`` and the ``<path>.complete`` marker too.
        rows: Number of data rows (the header comes on top).
        seed: Seed of the table.

    Returns:
        ``(csv_path, schema_path)``.
    """
    schema_path = os.path.join(os.path.dirname(os.path.abspath(path)), SCHEMA_NAME)
    marker = path + ".complete"
    params = {"kind": "tabular_csv", "rows": rows, "seed": seed}
    if _read_marker(marker) == params and os.path.exists(schema_path):
        print(f"csv: reusing the complete table {path}", flush=True)
        return path, schema_path
    started = time.perf_counter()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(marker):
        os.remove(marker)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        writer.writerow(COLUMNS)
        for chunk, first in enumerate(range(0, rows, CHUNK_ROWS)):
            rng = np.random.default_rng([seed, chunk])
            writer.writerows(_chunk_rows(rng, min(CHUNK_ROWS, rows - first)))
    with open(schema_path, "w") as f:
        f.write(SCHEMA_YAML)
    with open(marker, "w") as f:
        json.dump(params, f)
    print(f"csv: generated {rows} rows, {os.path.getsize(path) / 1e6:.1f} MB in "
          f"{time.perf_counter() - started:.1f} s -> {path}", flush=True)
    return path, schema_path


def main():
    """Builds the table at the path given on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("path", help="CSV file to write")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make_tabular_csv(args.path, rows=args.rows, seed=args.seed)


if __name__ == "__main__":
    main()
