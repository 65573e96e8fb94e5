"""Every option of ``convert``, each declared once: its flag, type, default, help,
the input kinds it applies to and its check.

The rest is read off these declarations: the command line's parser (flags, types,
defaults, help and its groups, in this order: ``beam_pipeline.cli``), the fields
of ``ConvertConfig`` (``schemas.config``) and the config a parsed command line
makes (``option_values``), the refusal of a flag given with an input it does not
apply to (``flags_only_for``, read by ``beam_pipeline.preflight``), the Dataflow
Flex Template's parameters (``dataflow/make_metadata.py``) and the test that the
README's flag table names every flag (``tests/test_options.py``).

Adding an option is one ``Option(...)`` below (in the group whose ``--help``
section shows it) plus the code that uses it: ``ConvertConfig`` gains the field
(after those manifests have always recorded, see ``schemas.config``), the parser
the flag, the template the parameter, and the refusals the flag if ``kinds`` names
only some inputs. The groups follow ``--help``'s sections: the run's shards,
commit and runner (``main``), images (``resize``, ``manifest``), tables
(``dialect``, ``tables``), schedule (``schedule``) and the drift gate (``drift``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Collection, Mapping, Sequence

from beam_tfrecords.schemas.annotations import ANNOTATION_LAYOUTS
from beam_tfrecords.schemas.features import FEATURE_NAME_PRESETS, parse_feature_names
from beam_tfrecords.schemas.inputs import SKIPPED_EXIT_STATUS
from beam_tfrecords.schemas.shards import COMPRESSIONS, clashing_split_names, is_valid_split_name

__all__ = ["ALL_KINDS", "ANNOTATION_OPTIONS", "BOX_COLUMNS", "BOX_UNITS", "COLOR_MODES", "CONVERT_OPTIONS", "CSV_MANIFEST", "CSV_TABLE", "DEFAULT_MAX_FILE_BYTES",
           "DEFAULT_MAX_PIXELS", "DRIFT_EXIT_STATUS", "DRIFT_MAX_CLASS_SHARE_CHANGE", "DRIFT_MAX_MEAN_SHIFT",
           "DRIFT_MAX_MISSING_CHANGE", "FINGERPRINTS", "FITS", "GROUP_TITLES", "IMAGES", "IMAGE_BYTES_MODES",
           "IMAGE_FOLDERS", "IMAGE_FORMATS", "LAYOUTS", "Option", "PROGRESS_MODES", "SPLIT_BY", "TABLES",
           "TYPED_TABLE", "VALIDATE_MODES", "check_options", "check_values", "flags_only_for", "option_fields", "option_values", "parse_date",
           "parse_roots", "parse_size", "parse_splits"]

LAYOUTS = ("auto", "class_folders", "cifar", "csv", "table", *ANNOTATION_LAYOUTS)
# --box_units: a box CSV's coordinates in pixels, or divided by the width and height.
BOX_UNITS: tuple[str, ...] = ("pixels", "normalized")
BOX_COLUMNS: tuple[str, ...] = ("xmin", "ymin", "xmax", "ymax")
# --validate, from the cheapest: container headers only; headers plus a check of the
# compressed stream that refuses what a full decode would (the default); a full decode.
VALIDATE_MODES: tuple[str, ...] = ("headers", "structure", "decode")
# Resizing and re-encoding images (--max_side, --min_side, --size/--fit,
# --image_format, --jpeg_quality, --color_mode).
FITS: tuple[str, ...] = ("stretch", "crop", "pad")
IMAGE_FORMATS: tuple[str, ...] = ("keep", "jpeg", "png")
COLOR_MODES: tuple[str, ...] = ("keep", "rgb", "l")
# What an image's ratio split is a hash of (--split_by).
SPLIT_BY: tuple[str, ...] = ("path", "content")
# How records keep an image's bytes: ``readable`` stores what tf.io.decode_image
# cannot read as a lossless PNG; ``original`` stores every file's bytes as they are.
IMAGE_BYTES_MODES: tuple[str, ...] = ("readable", "original")
# --fingerprint (see schemas.inputs): trust an unchanged size and time, or hash.
FINGERPRINTS: tuple[str, ...] = ("stat", "content")
# --progress (beam_pipeline.console): auto picks bar on a terminal, else log.
PROGRESS_MODES: tuple[str, ...] = ("auto", "bar", "log", "off")
# --max_pixels: images whose header declares more pixels are refused before any decode
# (2**27, about 11585 x 11585). It also bounds the memory of checking an image (see
# transforms/codec/image_inspection.py: up to ~10 bytes a pixel for a progressive JPEG in decode mode).
DEFAULT_MAX_PIXELS = 1 << 27
# --max_file_bytes: an input file larger than this is dead-lettered (file_too_large)
# without being read (256 MiB; README "flags"): a reading thread holds a file and its
# record at once, so 4 threads stay near 2 GiB at worst, while camera photos and
# scans within --max_pixels compress far below it.
DEFAULT_MAX_FILE_BYTES = 256 << 20
# Drift gate defaults (--drift_max_*; README "Statistics and drift gate"): a mean
# may move 2 standard deviations of the old values (sampling noise moves it about
# std/sqrt(records), so only a real change gets near 2; a 3-std shift fails); a
# missing rate, and a class's share of the records, 0.1 (ten points).
DRIFT_MAX_MEAN_SHIFT = 2.0
DRIFT_MAX_MISSING_CHANGE = 0.1
DRIFT_MAX_CLASS_SHARE_CHANGE = 0.1
# The exit status of a run the drift gate stopped (status drift_found).
DRIFT_EXIT_STATUS = 3

# The kinds of input an option may apply to: a folder or glob of images (class
# folders, CIFAR), a CSV image manifest, a CSV table, a Parquet or JSON Lines table.
IMAGE_FOLDERS, CSV_MANIFEST, CSV_TABLE, TYPED_TABLE = "image_folders", "csv_manifest", "csv_table", "typed_table"
IMAGES = frozenset({IMAGE_FOLDERS, CSV_MANIFEST})
TABLES = frozenset({CSV_TABLE, TYPED_TABLE})
ALL_KINDS = IMAGES | TABLES
# --help's sections: the option's group -> its title (None: the untitled first one).
GROUP_TITLES: dict[str, str | None] = {
    "main": None,
    "resize": "resize and re-encode images (default: keep them as they are)",
    "schedule": "scheduled runs (see 'Scheduled runs' in the README)",
    "manifest": "CSV image manifests (default: the usual column names)",
    "dialect": "CSV dialect (not for Parquet or JSON Lines)",
    "tables": "tables (--layout table, or a CSV without an image column)",
    "drift": "drift gate (see 'Statistics and drift gate' in the README)",
    "annotations": "annotated images: boxes, masks, several labels (see 'Annotated images' in the README)",
}


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of ``convert``.

    Attributes:
      name: the ``ConvertConfig`` field (or, for an option of the command line
        alone, ``config=False``, the parsed value's name).
      group: the ``--help`` section (a key of ``GROUP_TITLES``).
      help: what ``--help`` says of it.
      default: the value when the flag is not given.
      annotation: the field's type, as ``ConvertConfig`` declares it.
      parse: text -> value (``int``, ``float``, ``parse_splits``, ...); None: the text.
        A parse other than ``int``/``float`` raises ValueError as ``--flag: why``.
      choices: the values it takes, if only some.
      switch: a flag without a value; given, the field is ``not default``.
      flag: the command-line flag (default ``--name``).
      kinds: the inputs it applies to (``ALL_KINDS``, ``IMAGES``, ``TABLES``, ...);
        given (not at its default) with another, the run is refused before it starts.
      check: raises ValueError, naming the flag, for a value it cannot take (called
        with the flag and the value; ``choices`` are checked without it).
      required: the flag must be given (the field has no default).
      config: a field of ``ConvertConfig``; False: the command line's own.
      recorded_when_given: the manifest (``ConvertConfig.to_json``) records it only
        when it is not at its default: an option added for inputs that runs made
        before it never had, so their manifests and options fingerprints stay the same.
    """

    name: str
    group: str
    help: str
    default: object = None
    annotation: str = "str | None"
    parse: Callable[[str], object] | None = None
    choices: tuple[str, ...] = ()
    switch: bool = False
    flag: str = ""
    kinds: frozenset[str] = ALL_KINDS
    check: Callable[[str, object], None] | None = None
    required: bool = False
    config: bool = True
    recorded_when_given: bool = False

    def __post_init__(self):
        if not self.flag:
            object.__setattr__(self, "flag", f"--{self.name}")

    @property
    def dest(self) -> str:
        """The parsed value's name (the flag without ``--``)."""
        return self.flag[2:]

    def validate(self, value: object) -> None:
        """Raises ValueError naming the flag when ``value`` is not one it takes."""
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.flag} must be one of {', '.join(self.choices)}; got {value!r}")
        if self.check is not None:
            self.check(self.flag, value)


# --- checks and parsers --------------------------------------------------------------


def _bounded(test: Callable[[object], bool], wording: str, shown: Callable[[object], str] = str):
    """A check: ``--flag must be <wording>; got <value>`` unless ``test(value)``."""

    def check(flag: str, value: object) -> None:
        if not test(value):
            raise ValueError(f"{flag} must be {wording}; got {shown(value)}")
    return check


def _given(message: str):
    """A check: ``message`` when the value is empty."""

    def check(flag: str, value: object) -> None:  # pylint: disable=unused-argument
        if not value:
            raise ValueError(message)
    return check


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _share(most: float | None):
    def test(value: object) -> bool:
        return (not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0
                and value != float("inf") and (most is None or value <= most))
    return _bounded(test, f"within [0, {most:g}]" if most is not None else "a number >= 0", repr)


def _column(value: object) -> bool:
    return value is None or (bool(value.strip()) and value == value.strip())


def _check_splits(flag: str, splits) -> None:  # pylint: disable=unused-argument
    if not splits:
        return
    names = [name for name, _ in splits]
    if len(set(names)) != len(names):
        raise ValueError(f"--splits names a split twice: {names}")
    clash = clashing_split_names(names)
    if clash:
        raise ValueError(f"--splits names {' and '.join(map(repr, clash[0]))}, which differ only "
                         "in case: their shard files would be one file on a case-insensitive "
                         "file system; give the splits names that differ in more than case")
    for name, fraction in splits:
        if not is_valid_split_name(name):
            raise ValueError(f"--splits: {name!r} cannot name a shard file; "
                             "use letters, digits, '_' and '.'")
        if not 0 < fraction <= 1:
            raise ValueError(f"--splits: the fraction of {name!r} must be in (0, 1]; got {fraction}")
    if abs(sum(f for _, f in splits) - 1) > 1e-6:
        raise ValueError(f"--splits fractions must add up to 1; they add up to "
                         f"{sum(f for _, f in splits):g}")


def _check_roots(flag: str, roots) -> None:  # pylint: disable=unused-argument
    for root in roots:
        if not isinstance(root, str) or not root.strip() or root.rstrip("/").endswith(("/..", "/.")):
            raise ValueError(f"--allowed_roots: {root!r} is not a folder or bucket (e.g. "
                             "gs://photos,/data/imgs)")


def _check_date(flag: str, value) -> None:  # pylint: disable=unused-argument
    if value:
        parse_date(value)


def _check_compare_to(flag: str, value) -> None:  # pylint: disable=unused-argument
    if value is not None and not value.strip():
        raise ValueError("--compare_to needs a manifest.json, a dataset folder, or 'previous'")


def parse_size(text: str) -> tuple[int, int]:
    """``224x224`` -> ``(224, 224)``.

    Raises:
      ValueError: naming the text that does not parse.
    """
    width, sep, height = text.lower().partition("x")
    try:
        if not sep:
            raise ValueError
        return int(width), int(height)
    except ValueError:
        raise ValueError(f"--size: {text!r} is not WIDTHxHEIGHT (e.g. 224x224)") from None


def parse_splits(text: str) -> tuple[tuple[str, float], ...]:
    """``train=0.8,validation=0.1,test=0.1`` → ``(("train", 0.8), ...)``.

    Raises:
      ValueError: naming the part that does not parse.
    """
    splits = []
    for part in text.split(","):
        name, sep, fraction = part.partition("=")
        try:
            if not sep:
                raise ValueError
            splits.append((name.strip(), float(fraction)))
        except ValueError:
            raise ValueError(f"--splits: {part!r} is not NAME=FRACTION "
                             "(e.g. train=0.8,validation=0.1,test=0.1)") from None
    return tuple(splits)


def parse_date(text: str) -> datetime.date:
    """``--date``: ``YYYY-MM-DD``."""
    try:
        if len(text) != 10 or text[4] != "-" or text[7] != "-":
            raise ValueError(text)
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--date must be a day as YYYY-MM-DD (like 2026-11-22); got {text!r}") from None


def parse_roots(text: str) -> tuple[str, ...]:
    """``gs://photos,/data/imgs`` → ``("gs://photos", "/data/imgs")`` (``--allowed_roots``).

    Raises:
      ValueError: for an empty entry.
    """
    roots = tuple(part.strip() for part in text.split(","))
    if not all(roots):
        raise ValueError(f"--allowed_roots: {text!r} has an empty entry; give folders or buckets "
                         "separated by commas (gs://photos,/data/imgs)")
    return roots


def _parse_delimiter(text: str) -> str:
    """``--csv_delimiter``: ``\\t`` or ``tab`` is a tab."""
    return "\t" if text in ("\\t", "tab") else text


def _parse_columns(text: str) -> tuple[str, ...]:
    """``--columns a, b,c`` -> ``("a", "b", "c")``."""
    return tuple(c.strip() for c in text.split(",")) if text else ()


_ONE_CHARACTER = _bounded(lambda v: len(v) == 1 and v not in "\r\n", "one character (not a newline)", repr)
_COLUMN = _bounded(_column, "name a CSV column (no surrounding spaces)", repr)
_POSITIVE_WHOLE = _bounded(_whole, "a positive whole number", repr)
_WHOLE_OR_OFF = _bounded(lambda v: v == 0 or _whole(v), "a positive whole number", repr)


def _text(name: str, group: str, help: str, **more) -> Option:  # pylint: disable=redefined-builtin
    """An option whose value is text, None when not given."""
    return Option(name, group, help, **more)


def _switch(name: str, group: str, help: str, **more) -> Option:  # pylint: disable=redefined-builtin
    """A flag without a value, off when not given."""
    return Option(name, group, help, default=False, annotation="bool", switch=True, **more)


# --- the options, in --help's order ---------------------------------------------------

_MAIN = (
    Option("input", "main", "folder, glob or CSV manifest (local path or gs://; gs:// on Dataflow)",
           annotation="str", required=True,
           check=_given("--input is required: a folder, a glob or a CSV manifest")),
    Option("output", "main", "folder for shards and manifest.json (local path or gs://; gs:// on Dataflow)",
           annotation="str", required=True,
           check=_given("--output is required: the folder to write shards and manifest.json to")),
    Option("layout", "main", "input layout (default: auto-detect)", "auto", "str", choices=LAYOUTS),
    _text("labels", "main", "file of class names, one per line; line index = label", kinds=IMAGES),
    Option("compression", "main", "gzip writes .tfrecord.gz (default: none)", "none", "str",
           choices=COMPRESSIONS),
    Option("validate", "main", "headers: container checks only, no decoding (fastest); structure "
           "(default): also checks the compressed data (JPEG decoded at 1/8 size, PNG inflated, other "
           "formats decoded), refusing what a full decode would; decode: full decode",
           "structure", "str", choices=VALIDATE_MODES, kinds=IMAGES),
    Option("max_pixels", "main", "refuse images whose header declares more pixels (width x height), "
           f"before any decode (default {DEFAULT_MAX_PIXELS:,} = 2**27, about 11585 x 11585)",
           DEFAULT_MAX_PIXELS, "int", int, kinds=IMAGES, check=_POSITIVE_WHOLE),
    Option("max_file_bytes", "main", "dead-letter (file_too_large), without reading it, an image file "
           f"larger than this (default {DEFAULT_MAX_FILE_BYTES:,} = 256 MiB)",
           DEFAULT_MAX_FILE_BYTES, "int", int, kinds=IMAGES, check=_POSITIVE_WHOLE),
    _switch("follow_links_outside", "main", "follow symbolic links inside --input that lead outside it "
            "(default: passed over, listed in the plan and dead_letter/skipped.jsonl)", kinds=IMAGES),
    Option("shard_min_mb", "main", "shard size floor, MB (default 100)", 100.0, "float", float,
           check=_bounded(lambda v: not v <= 0, "positive")),
    Option("shard_max_mb", "main", "shard size cap, MB (default 200)", 200.0, "float", float),
    Option("max_bad_fraction", "main", "fail the run when more than this fraction of inputs is bad "
           "(default 0.01)", 0.01, "float", float,
           check=_bounded(lambda v: 0.0 <= v <= 1.0, "within [0, 1]")),
    _switch("overwrite", "main", "replace a dataset already in --output (its old shards are removed)"),
    Option("read_threads", "main", "threads reading and checking images inside each shard writer "
           "(default 4)", 4, "int", int, kinds=IMAGES, check=_bounded(lambda v: 1 <= v <= 64, "within 1..64")),
    Option("encode_processes", "main", "helper processes per shard writer; -1 (default): all cores on "
           "the DirectRunner, none on distributed runners", -1, "int", int,
           check=_bounded(lambda v: -1 <= v <= 64, "within 0..64, or -1 for automatic")),
    _switch("reread", "main", "gs:// output: verify every shard by downloading and re-reading it too "
            "(default: the CRC-32C and size GCS reports for it must equal the writer's); local shards "
            "are always re-read"),
    Option("image_bytes", "main", "readable (default): an image tf.io.decode_image cannot read as "
           "stored (TIFF, WebP, CMYK or 12-bit JPEG, BMP other than 24-bit) is stored as a lossless "
           "PNG, counted in the manifest; original: every file's own bytes",
           "readable", "str", choices=IMAGE_BYTES_MODES, kinds=IMAGES),
    _switch("list_on_workers", "main", "gs:// image folders only: list the bucket on the workers, "
            "folder by folder, and cut the shards there (for millions of objects; see "
            "docs/scaling.md); the launcher lists folders only. Not with --skip_unchanged, "
            "--incremental, --drop_duplicates, --split_by content or resizing flags"),
)
# ImageReshape (schemas.config) runs these checks too, as it is made.
_RESIZE = (
    Option("max_side", "resize", "shrink the longest side to N pixels (aspect kept, never enlarged)",
           0, "int", int, kinds=IMAGES, check=_WHOLE_OR_OFF),
    Option("min_side", "resize", "shrink the shortest side to N pixels (aspect kept, never enlarged)",
           0, "int", int, kinds=IMAGES, check=_WHOLE_OR_OFF),
    Option("size", "resize", "make every image WIDTHxHEIGHT (e.g. 224x224), by --fit",
           (), "tuple[int, ...]", parse_size, kinds=IMAGES,
           check=_bounded(lambda v: not v or (len(v) == 2 and min(v) >= 1), "WIDTHxHEIGHT, both positive", repr)),
    Option("fit", "resize", "with --size: stretch (aspect not kept), crop (cover, centre cut) or pad "
           "(fit, centred on black)", "stretch", "str", choices=FITS, kinds=IMAGES),
    Option("image_format", "resize", "format of changed images: keep (JPEG stays JPEG, PNG stays PNG, "
           "others become PNG), jpeg or png", "keep", "str", choices=IMAGE_FORMATS, kinds=IMAGES),
    Option("jpeg_quality", "resize", "JPEG quality, 1-95 (default 90)", 90, "int", int, kinds=IMAGES,
           check=_bounded(lambda v: 1 <= v <= 95, "within 1..95")),
    Option("color_mode", "resize", "keep, rgb or l (grey)", "keep", "str", choices=COLOR_MODES,
           kinds=IMAGES),
)
_RUN = (
    _switch("drop_duplicates", "main", "leave out images whose bytes equal another's (keeping the "
            "first by ordering key; listed in the manifest); reads every file once more", kinds=IMAGES),
    _switch("fail_on_leakage", "main", "publish nothing (exit 1) when an image's content sits in more "
            "than one split; without it such copies are listed in the manifest", kinds=IMAGES),
    Option("progress", "main", "auto (default): one line updated in place on a terminal, else a log "
           "line every --progress_seconds; bar, log, or off", "auto", choices=PROGRESS_MODES, config=False),
    Option("progress_seconds", "main", "seconds between progress log lines (default 30; 0: no progress)",
           30.0, parse=float, config=False),
    _text("report_json", "main", "also write the run report to this local file", config=False),
    Option("on_interrupt", "main", "on Dataflow, what Ctrl-C or SIGTERM does to the job convert waits "
           "for: cancel (default): cancel it, and release the output's lock once it ended; keep: leave "
           "it running, and its lock until it ends", "cancel", choices=("cancel", "keep"), config=False),
)
_SCHEDULE = (
    _switch("skip_unchanged", "schedule", "when the input files and the options that shape the records "
            f"match the dataset at --output, do nothing and exit {SKIPPED_EXIT_STATUS}; otherwise a full "
            "run (which needs --overwrite to replace the dataset)"),
    _switch("incremental", "schedule", "convert only inputs the dataset at --output does not hold (new "
            "files, and changed ones, reported) into a new part OUT/part-NNNNN/, listed in the "
            f"dataset's manifest; nothing new: exit {SKIPPED_EXIT_STATUS}. A first run (no dataset yet) "
            "is a full run"),
    Option("fingerprint", "schedule", "how a local file counts as unchanged: stat (default): the same "
           "size and modification time, or, if the time moved, the same content hash; content: the "
           "same content hash, every file read", "stat", "str", choices=FINGERPRINTS),
    Option("date", "schedule", "YYYY-MM-DD filling {date}, {yyyy}, {mm}, {dd}, {yyyymmdd} in --input "
           "and --output (default: today, UTC)", "", "str", check=_check_date),
)
_MANIFEST = (
    _text("image_column", "manifest", "the column of image paths (default: the first of image, "
          "image_uri, image_path, path, filename, file, uri)", kinds=frozenset({CSV_MANIFEST}), check=_COLUMN),
    _text("label_column", "manifest", "the column of labels (default: the first of label, class, "
          "category)", kinds=frozenset({CSV_MANIFEST}), check=_COLUMN),
    Option("allowed_roots", "manifest", "folders or buckets outside the CSV's folder whose images the "
           "rows may name, comma-separated (gs://photos,/data/imgs); rows naming others refuse the run",
           (), "tuple[str, ...]", parse_roots, kinds=frozenset({CSV_MANIFEST}), check=_check_roots),
    _switch("allow_paths_outside", "manifest", "read the images the rows name wherever they are "
            "(default: only inside the CSV's folder and --allowed_roots)", kinds=frozenset({CSV_MANIFEST})),
)
# Shared by convert and infer-schema.
_DIALECT = (
    Option("csv_delimiter", "dialect", "cell delimiter (default ','; '\\t' for TSV)", ",", "str",
           _parse_delimiter, kinds=frozenset({CSV_TABLE}), check=_ONE_CHARACTER),
    Option("csv_quote", "dialect", "quote character (default '\"')", '"', "str",
           kinds=frozenset({CSV_TABLE}), check=_ONE_CHARACTER),
    _switch("no_header", "dialect", "the files have no header row", kinds=frozenset({CSV_TABLE})),
    Option("columns", "dialect", "with --no_header: column names in file order, comma-separated",
           (), "tuple[str, ...]", _parse_columns, kinds=frozenset({CSV_TABLE})),
    Option("encoding", "dialect", "text encoding (default utf-8)", "utf-8", "str",
           kinds=frozenset({CSV_TABLE})),
    # A quoted cell may hold newlines (RFC 4180); the flag makes such a row an error,
    # for data known to have none (a stray quote then costs one row, not many).
    Option("quoted_newlines", "dialect", "a row whose quoted cell holds a newline is dead-lettered (for "
           "data known to have none, so that rows a stray quote pair merges are not written)",
           True, "bool", switch=True, flag="--no_quoted_newlines", kinds=frozenset({CSV_TABLE})),
)
_TABLES = (
    _text("schema", "tables", "YAML or JSON table schema (default: inferred from the first rows)",
          kinds=TABLES),
    _switch("strict_schema", "tables", "refuse a CSV with columns that --schema does not name (default: "
            "they are dropped and listed; name them with 'skip: true' to drop them on purpose)",
            kinds=TABLES),
    _text("split_column", "tables", "column naming each row's split", kinds=TABLES),
    Option("splits", "tables", "hash splits by ratio, e.g. train=0.8,validation=0.1,test=0.1 (tables, "
           "and images without split folders or a split column)", (), "tuple[tuple[str, float], ...]",
           parse_splits, check=_check_splits),
    Option("split_by", "tables", "images with --splits: hash the path relative to --input (default), or "
           "the file's content (copies of an image land in one split; reads every file once more)",
           "path", "str", choices=SPLIT_BY, kinds=IMAGES),
    _text("key_column", "tables", "with --splits: the column hashed to pick a row's split (default: "
          "the row)", kinds=TABLES),
    _text("sequence_key", "tables", "group the rows of each key into one SequenceExample", kinds=TABLES),
    _text("sequence_order", "tables", "with --sequence_key: the column that orders rows within a "
          "sequence", kinds=TABLES),
)
_DRIFT = (
    _text("compare_to", "drift", "compare the run's statistics with this dataset's (a manifest.json, a "
          "dataset folder, local or gs://, or 'previous': the one at --output, if any) and publish "
          f"nothing (exit {DRIFT_EXIT_STATUS}) when they moved past the limits", check=_check_compare_to),
    Option("drift_max_mean_shift", "drift", "standard deviations (of the old values) a numeric "
           f"feature's mean may move (default {DRIFT_MAX_MEAN_SHIFT:g})", DRIFT_MAX_MEAN_SHIFT, "float",
           float, check=_share(None)),
    Option("drift_max_missing_change", "drift", "how much a feature's missing rate, or a numeric "
           "feature's share of NaN and infinite values, may change, absolute (default "
           f"{DRIFT_MAX_MISSING_CHANGE:g})", DRIFT_MAX_MISSING_CHANGE, "float", float, check=_share(1.0)),
    Option("drift_max_class_share_change", "drift", "how much an image class's share of the records, or "
           f"a string feature's top value's share, may change, absolute (default "
           f"{DRIFT_MAX_CLASS_SHARE_CHANGE:g})", DRIFT_MAX_CLASS_SHARE_CHANGE, "float", float,
           check=_share(1.0)),
)


def _check_box_columns(flag: str, value) -> None:
    names = tuple(value)
    if len(names) != 4 or not all(names) or len(set(names)) != 4:
        raise ValueError(f"{flag} must name 4 different columns, comma-separated, in xmin,ymin,xmax,ymax "
                         f"order; got {','.join(names)!r}")


def _check_separator(flag: str, value) -> None:
    if value is not None and (not value or "\n" in value or "\r" in value):
        raise ValueError(f"{flag} must be one or more characters (not a newline); got {value!r}")


def _annotated(option: Option) -> Option:
    return dataclasses.replace(option, recorded_when_given=True)


_ANNOTATIONS = tuple(_annotated(o) for o in (
    _text("annotations", "annotations", "COCO instances JSON for the images under --input (file_name "
          "relative to it): a path, or one per split: train=a.json,validation=b.json", kinds=IMAGES),
    _text("masks", "annotations", "semantic segmentation: the folder of PNG masks, one per image at the "
          "same relative path and stem (values: class ids, see --labels)", kinds=IMAGES),
    _switch("instance_masks", "annotations", "COCO: render each object's segmentation (polygons, RLE) "
            "into a PNG mask (image/object/mask)", kinds=IMAGES),
    Option("box_columns", "annotations", "a box CSV's four box columns, comma-separated, in xmin,ymin,"
           "xmax,ymax order", BOX_COLUMNS, "tuple[str, ...]", _parse_columns, kinds=IMAGES,
           check=_check_box_columns),
    Option("box_units", "annotations", "a box CSV's coordinates: pixels (default) or normalized "
           "(divided by the image's width and height)", "pixels", "str", choices=BOX_UNITS, kinds=IMAGES),
    _text("label_separator", "annotations", "several labels per image: split one label cell into several "
          "at this text (e.g. '|')", kinds=IMAGES, check=_check_separator),
    _switch("drop_empty", "annotations", "leave out images without objects (default: kept as negative "
            "examples, counted)", kinds=IMAGES),
))


def _check_feature_names(flag: str, value) -> None:  # pylint: disable=unused-argument
    parse_feature_names(value)  # Raises ValueError naming the entry to change.


# Issue 22: the keys a reader already expects (README "Feature names").
_NAMES = (
    _text("feature_names", "main", "rename output features: a preset ("
          f"{', '.join(FEATURE_NAME_PRESETS)}), CANONICAL=OUTPUT pairs "
          "(image/encoded=img,image/class/label=label), or a preset and pairs "
          "(tutorial,image/filename=name)", check=_check_feature_names, recorded_when_given=True),
)
# The flags of annotated images (their ConvertConfig fields).
ANNOTATION_OPTIONS: tuple[str, ...] = tuple(o.name for o in _ANNOTATIONS)
CONVERT_OPTIONS: tuple[Option, ...] = (*_MAIN, *_RESIZE, *_RUN, *_SCHEDULE, *_MANIFEST, *_DIALECT, *_TABLES,
                                       *_DRIFT, *_ANNOTATIONS, *_NAMES)


def flags_only_for(kinds: Collection[str], options=CONVERT_OPTIONS) -> tuple[tuple[str, str], ...]:
    """``(flag, ConvertConfig field)`` of the options that apply to some of ``kinds``
    and to no other input, in ``--help``'s order."""
    return tuple((o.flag, o.name) for o in options if o.config and o.kinds <= frozenset(kinds))


def option_values(parsed: Mapping[str, object], options=CONVERT_OPTIONS) -> dict[str, object]:
    """The ``ConvertConfig`` fields that parsed flags (by ``Option.dest``) give: a
    switch given is its field's ``not default``. Options not in ``parsed`` are left out."""
    values = {}
    for o in options:
        if o.config and o.dest in parsed:
            value = parsed[o.dest]
            values[o.name] = (not o.default if value else o.default) if o.switch else value
    return values


def option_fields(options: Sequence[Option] = CONVERT_OPTIONS, first: Sequence[str] = ()):
    """A class decorator: the class as a frozen dataclass with one field per option
    of ``options`` (its type and default as declared; ``required`` ones without a
    default), those named in ``first`` first, in its order, then the others in
    declaration order; ``cls.OPTIONS`` keeps ``options`` (``check_options`` reads it)."""

    def make(cls):
        declared = {o.name: o for o in options if o.config}
        order = [name for name in first if name in declared] + [n for n in declared if n not in first]
        cls.__annotations__ = {name: declared[name].annotation for name in order}
        for name in order:
            if not declared[name].required:
                setattr(cls, name, declared[name].default)
        cls.OPTIONS = tuple(options)
        return dataclasses.dataclass(frozen=True)(cls)
    return make


def check_options(config: object, options: Sequence[Option] = CONVERT_OPTIONS) -> None:
    """Each option's own check of its value in ``config``, in ``--help``'s order.

    Raises:
      ValueError: naming the flag to change.
    """
    check_values({o.name: getattr(config, o.name) for o in options if o.config}, options)


def check_values(values: Mapping[str, object], options: Sequence[Option] = CONVERT_OPTIONS) -> None:
    """The checks of the options named in ``values`` (by ``Option.name``), of those
    values, in ``--help``'s order.

    Raises:
      ValueError: naming the flag to change.
    """
    for o in options:
        if o.name in values:
            o.validate(values[o.name])
