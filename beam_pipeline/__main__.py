"""``python -m beam_tfrecords convert|verify|inspect ...`` and the ``beam-tfrecords`` script."""

import contextlib
import gc
import os
import sys

# Layouts whose listing walks the input folder (``files.folder_batches``).
_WALKED_LAYOUTS = ("auto", "class_folders", "cifar")


def run() -> int:
    """``cli.main``, imported with the collector off.

    Importing Beam and this package makes ~1M objects and no garbage: the
    collector's passes over them while they load cost ~0.25 s of CPU. Frozen
    before it runs again (as ``main()`` does, see there), its first pass does not
    walk them all either; it collects what the run makes.

    A ``convert`` of a local folder has the folder walked meanwhile, on the other
    core (``_walk_input_early``).

    numpy's OpenBLAS starts no threads (unless ``OPENBLAS_NUM_THREADS`` says
    otherwise): nothing here does linear algebra, and its thread per core cost
    ~0.05 s of CPU to start on every run (the helper processes set the same).

    This process is the CLI's own, its threads known: a run that starts helper
    processes before its runner forks them (``helpers.allow_forked_helpers``).
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    gc.disable()
    _walk_input_early(sys.argv[1:])
    with _connectors_left_out():
        from beam_tfrecords.cli import main  # pylint: disable=import-outside-toplevel
    from beam_tfrecords.transforms.io.helpers import allow_forked_helpers  # pylint: disable=import-outside-toplevel

    allow_forked_helpers()
    gc.freeze()
    gc.enable()
    return main()


# Beam's ``apache_beam.io`` loads its BigQuery connector first in a block whose
# first failed import ends it (then Pub/Sub, gcsio, cross-language IO): ~200
# modules that nothing here uses (gcsio loads with Beam's file systems all the same).
_UNUSED_CONNECTOR = "apache_beam.io.gcp.bigquery"


@contextlib.contextmanager
def _connectors_left_out():
    """Imports under it load Beam without the connectors it loads in that block
    (0.1-0.15 s of every run's start-up on one core). Only that loading is left
    out: after the block, ``import apache_beam.io.gcp.bigquery`` (or Pub/Sub)
    loads the module as always."""
    if _UNUSED_CONNECTOR in sys.modules:  # Beam loaded already (a caller's own process).
        yield
        return
    sys.modules[_UNUSED_CONNECTOR] = None  # type: ignore[assignment]  # Import raises ImportError.
    try:
        yield
    finally:
        if _UNUSED_CONNECTOR in sys.modules and sys.modules[_UNUSED_CONNECTOR] is None:
            del sys.modules[_UNUSED_CONNECTOR]


def _walk_input_early(argv: list[str]) -> None:
    """Starts the walk of ``convert --input FOLDER`` (a local folder, by the flags as
    written) before the CLI and Beam are imported (``folder_walk.walk_early``); for
    ``--input FILE``, the file's content hash (``early_hash.hash_early``).

    The preflight's listing takes the walk's result only when it walks the same
    folder with the same ``--follow_links_outside`` (the flags parsed for real);
    otherwise the result is dropped and the listing walks as it always does.
    """
    argv = argv[1:] if argv[:1] == ["--debug"] else argv
    if argv[:1] != ["convert"] or "--list_on_workers" in argv:  # The workers list then.
        return
    given: dict[str, str] = {}
    for i, arg in enumerate(argv[1:], 1):
        name, equals, value = arg.partition("=")
        if name in ("--input", "--layout"):
            if not equals:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            given[name] = value
    folder = given.get("--input", "")
    if folder and "://" not in folder and os.path.isfile(folder):
        # A table (or a CSV manifest of images): its content hash, which the preflight
        # records, is made now, beside the imports.
        from beam_tfrecords.transforms.io.early_hash import hash_early  # pylint: disable=import-outside-toplevel

        hash_early(folder)
        return
    if (not folder or given.get("--layout", "auto") not in _WALKED_LAYOUTS
            or any(char in folder for char in "*?[{}") or folder.lower().endswith(".csv")
            or "://" in folder or not os.path.isdir(folder)):
        return
    folder = os.path.abspath(folder)
    if folder == "/":
        return
    from beam_tfrecords.transforms.io.folder_walk import walk_early  # pylint: disable=import-outside-toplevel

    walk_early(folder, "--follow_links_outside" in argv)


if __name__ == "__main__":
    sys.exit(run())
