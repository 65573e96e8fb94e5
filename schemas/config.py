"""The options of a conversion, checked once, before any pipeline is built."""

from __future__ import annotations

import dataclasses
import datetime

from beam_tfrecords.schemas.shards import COMPRESSIONS, ShardBand, clashing_split_names, is_valid_split_name

__all__ = ["COLOR_MODES", "DEFAULT_MAX_FILE_BYTES", "DEFAULT_MAX_PIXELS", "FITS", "IMAGE_BYTES_MODES", "IMAGE_FORMATS",
           "ImageReshape", "FINGERPRINTS", "LAYOUTS", "RUN_CONTROL_OPTIONS", "TEMPLATE_FIELDS", "expand_templates",
           "parse_date", "SPLIT_BY", "parse_size", "VALIDATE_MODES", "ConvertConfig", "CsvDialect",
           "TableLayout", "parse_splits", "parse_roots"]

LAYOUTS = ("auto", "class_folders", "cifar", "csv", "table")

# --validate, from the cheapest: container headers only; headers plus a check of the
# compressed stream that refuses what a full decode would (the default); a full decode.
VALIDATE_MODES: tuple[str, ...] = ("headers", "structure", "decode")
# Resizing and re-encoding images (--max_side, --min_side, --size/--fit,
# --image_format, --jpeg_quality, --color_mode).
FITS: tuple[str, ...] = ("stretch", "crop", "pad")
IMAGE_FORMATS: tuple[str, ...] = ("keep", "jpeg", "png")
COLOR_MODES: tuple[str, ...] = ("keep", "rgb", "l")
# Options that steer a run but not the records it writes: the input fingerprint
# (skip if unchanged, incremental parts) leaves them out, so changing one of them
# alone does not make a dataset "changed". Every new option that cannot change a
# record's bytes, a shard's bytes or the manifest's dataset description belongs here.
RUN_CONTROL_OPTIONS: frozenset[str] = frozenset({
    "overwrite", "read_threads", "encode_processes", "max_bad_fraction",
    "skip_unchanged", "incremental", "fingerprint", "date", "list_on_workers",
    "compare_to", "drift_max_mean_shift", "drift_max_missing_change",
    "drift_max_class_share_change",
    # Which files are read (their entries are fingerprinted file by file instead).
    "follow_links_outside", "max_file_bytes",
    # Which CSV manifest rows may be read (a run they refuse writes nothing).
    "allowed_roots", "allow_paths_outside",
    # How a gs:// shard is verified (re-read, or its stored CRC-32C trusted).
    "reread",
})
# Drift gate defaults (--drift_max_*; README "Statistics and drift gate"): a mean
# may move 2 standard deviations of the old values (sampling noise moves it about
# std/sqrt(records), so only a real change gets near 2; a 3-std shift fails); a
# missing rate, and a class's share of the records, 0.1 (ten points).
DRIFT_MAX_MEAN_SHIFT = 2.0
DRIFT_MAX_MISSING_CHANGE = 0.1
DRIFT_MAX_CLASS_SHARE_CHANGE = 0.1
# --fingerprint (see schemas.inputs): trust an unchanged size and time, or hash.
FINGERPRINTS: tuple[str, ...] = ("stat", "content")
# Placeholders --input and --output may hold, filled from --date (default: today, UTC).
TEMPLATE_FIELDS: tuple[str, ...] = ("date", "yyyy", "mm", "dd", "yyyymmdd")


@dataclasses.dataclass(frozen=True)
class ImageReshape:
    """How images are reshaped on the way in; the default changes nothing.

    Attributes:
      max_side: the longest side shrunk to this (aspect kept, never enlarged); 0: off.
      min_side: the shortest side shrunk to this (aspect kept, never enlarged); 0: off.
      size: ``(width, height)`` every image is made (enlarged too), by ``fit``:
        ``stretch`` (aspect not kept), ``crop`` (scaled to cover, centre cut) or
        ``pad`` (scaled to fit, centred on black); ``()``: off.
      format: ``keep`` (JPEG stays JPEG, PNG stays PNG, others become PNG),
        ``jpeg`` or ``png``, for every image that is changed.
      quality: JPEG quality (1-95) of JPEGs written.
      color: ``keep``, ``rgb`` or ``l`` (grey).
    """

    max_side: int = 0
    min_side: int = 0
    size: tuple[int, ...] = ()
    fit: str = "stretch"
    format: str = "keep"
    quality: int = 90
    color: str = "keep"

    def __post_init__(self):
        given = [flag for flag, on in (("--max_side", self.max_side), ("--min_side", self.min_side),
                                       ("--size", self.size)) if on]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give one way to size images")
        for flag, value in (("--max_side", self.max_side), ("--min_side", self.min_side)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{flag} must be a positive whole number; got {value!r}")
        if self.size and (len(self.size) != 2 or min(self.size) < 1):
            raise ValueError(f"--size must be WIDTHxHEIGHT, both positive; got {self.size!r}")
        for flag, value, allowed in (("--fit", self.fit, FITS), ("--image_format", self.format,
                                     IMAGE_FORMATS), ("--color_mode", self.color, COLOR_MODES)):
            if value not in allowed:
                raise ValueError(f"{flag} must be one of {', '.join(allowed)}; got {value!r}")
        if not 1 <= self.quality <= 95:
            raise ValueError(f"--jpeg_quality must be within 1..95; got {self.quality}")
        if self.fit != "stretch" and not self.size:
            raise ValueError(f"--fit {self.fit} applies only with --size WIDTHxHEIGHT")

    @property
    def active(self) -> bool:
        """Whether any image may change."""
        return bool(self.max_side or self.min_side or self.size or self.format != "keep"
                    or self.color != "keep")


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


# What an image's ratio split is a hash of (--split_by).
SPLIT_BY: tuple[str, ...] = ("path", "content")
# How records keep an image's bytes: ``readable`` stores what tf.io.decode_image
# cannot read as a lossless PNG; ``original`` stores every file's bytes as they are.
IMAGE_BYTES_MODES: tuple[str, ...] = ("readable", "original")

# --max_pixels: images whose header declares more pixels are refused before any decode
# (2**27, about 11585 x 11585). It also bounds the memory of checking an image (see
# transforms/codec/images.py: up to ~10 bytes a pixel for a progressive JPEG in decode mode).
DEFAULT_MAX_PIXELS = 1 << 27
# --max_file_bytes: an input file larger than this is dead-lettered (file_too_large)
# without being read (256 MiB; README "flags"): a reading thread holds a file and its
# record at once, so 4 threads stay near 2 GiB at worst, while camera photos and
# scans within --max_pixels compress far below it.
DEFAULT_MAX_FILE_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class CsvDialect:
    """How a CSV file is written: what the table readers need of the options."""

    delimiter: str = ","
    quote: str = '"'
    no_header: bool = False
    columns: tuple[str, ...] = ()
    encoding: str = "utf-8"
    # A quoted cell may hold newlines (RFC 4180); False makes such a row an error,
    # for data known to have none (a stray quote then costs one row, not many).
    quoted_newlines: bool = True


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """Which split a row goes to, and how rows group into sequences."""

    split_column: str | None = None
    splits: tuple[tuple[str, float], ...] = ()
    key_column: str | None = None
    sequence_key: str | None = None
    sequence_order: str | None = None
    # --strict_schema: a row holding a column the schema does not name (a JSON
    # Lines key first seen past the header sample) is dead-lettered, not trimmed.
    strict_columns: bool = False


@dataclasses.dataclass(frozen=True)
class ConvertConfig:
    """What to convert, where to, and how.

    Every check names the command-line flag to change, since that is where the
    values usually come from.
    """

    input: str
    output: str
    layout: str = "auto"
    labels: str | None = None
    compression: str = "none"
    validate: str = "structure"
    max_pixels: int = DEFAULT_MAX_PIXELS
    # readable: store what tf.io.decode_image cannot read (TIFF, WebP, CMYK JPEG,
    # ...) as a lossless PNG; original: every file's own bytes.
    image_bytes: str = "readable"
    shard_min_mb: float = 100.0
    shard_max_mb: float = 200.0
    max_bad_fraction: float = 0.01
    overwrite: bool = False
    read_threads: int = 4
    # Helper processes per shard writer; -1: all cores when the pipeline runs on the
    # DirectRunner in one process, none elsewhere (Dataflow runs a process per core).
    encode_processes: int = -1
    # Tables (--layout table): the schema file, the CSV dialect, splits, sequences.
    schema: str | None = None
    csv_delimiter: str = ","
    csv_quote: str = '"'
    no_header: bool = False
    columns: tuple[str, ...] = ()
    encoding: str = "utf-8"
    quoted_newlines: bool = True
    # A header column that --schema does not name: dropped (listed in the run
    # summary and report), or, strict, a refused run.
    strict_schema: bool = False
    split_column: str | None = None
    splits: tuple[tuple[str, float], ...] = ()
    key_column: str | None = None
    # Images with --splits: the hash picking a split is of the relative path, or
    # of the file's content (copies of an image then land in one split).
    split_by: str = "path"
    # Images: leave out copies (same bytes) of another image, keeping the first by
    # key; fail the run when an image's content sits in more than one split.
    drop_duplicates: bool = False
    fail_on_leakage: bool = False
    # Images: resize and re-encode (see ImageReshape); the default changes nothing.
    max_side: int = 0
    min_side: int = 0
    size: tuple[int, ...] = ()
    fit: str = "stretch"
    image_format: str = "keep"
    jpeg_quality: int = 90
    color_mode: str = "keep"
    sequence_key: str | None = None
    sequence_order: str | None = None
    # CSV image manifests: the columns of the image paths and of the labels
    # (default: the first of the usual names, see transforms.plan.layouts).
    image_column: str | None = None
    label_column: str | None = None
    # CSV image manifests: rows naming images outside the CSV's folder are read only
    # under these folders or buckets (gs://photos, /data/imgs), or anywhere with
    # allow_paths_outside; otherwise the run is refused (transforms.plan.layouts).
    allowed_roots: tuple[str, ...] = ()
    allow_paths_outside: bool = False
    # The drift gate: compare the run's statistics with a published dataset's
    # (a manifest.json, a dataset folder, or "previous": the one at --output) and
    # publish nothing when they moved more than these (see transforms.quality.drift).
    compare_to: str | None = None
    drift_max_mean_shift: float = DRIFT_MAX_MEAN_SHIFT
    drift_max_missing_change: float = DRIFT_MAX_MISSING_CHANGE
    drift_max_class_share_change: float = DRIFT_MAX_CLASS_SHARE_CHANGE
    # Scheduled runs (see beam_pipeline.updates): do nothing when the input and
    # the options match the dataset at --output; or convert only new and changed
    # inputs into a new part of it. --date fills {date} in --input and --output.
    skip_unchanged: bool = False
    incremental: bool = False
    fingerprint: str = "stat"
    date: str = ""
    # List a gs:// image input on the workers, unit by unit, and cut the shards
    # there (transforms.worker_listing): for buckets of millions of objects.
    list_on_workers: bool = False
    # Images: follow links inside --input that lead outside it (else passed over,
    # listed in the plan and skipped.jsonl); dead-letter files larger than this.
    follow_links_outside: bool = False
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    # Verify a gs:// shard by re-reading it too (default: its CRC-32C and size as GCS
    # reports them must equal the writer's; local shards are always re-read).
    reread: bool = False

    def __post_init__(self):
        if not self.input:
            raise ValueError("--input is required: a folder, a glob or a CSV manifest")
        if not self.output:
            raise ValueError("--output is required: the folder to write shards and manifest.json to")
        reshape = self.reshape  # Checks the image reshape flags.
        if reshape.size and reshape.size[0] * reshape.size[1] > self.max_pixels:
            raise ValueError(f"--size {reshape.size[0]}x{reshape.size[1]} is "
                             f"{reshape.size[0] * reshape.size[1]:,} pixels an image, more than "
                             f"--max_pixels ({self.max_pixels:,}); choose a smaller size (or raise "
                             "--max_pixels)")
        if self.split_by != "path" and not self.splits:
            raise ValueError("--split_by applies only with --splits")
        for flag, value, allowed in (
            ("--layout", self.layout, LAYOUTS),
            ("--compression", self.compression, COMPRESSIONS),
            ("--validate", self.validate, VALIDATE_MODES),
            ("--image_bytes", self.image_bytes, IMAGE_BYTES_MODES),
            ("--split_by", self.split_by, SPLIT_BY),
            ("--fingerprint", self.fingerprint, FINGERPRINTS),
        ):
            if value not in allowed:
                raise ValueError(f"{flag} must be one of {', '.join(allowed)}; got {value!r}")
        if (not isinstance(self.max_pixels, int) or isinstance(self.max_pixels, bool)
                or self.max_pixels < 1):
            raise ValueError(f"--max_pixels must be a positive whole number; got {self.max_pixels!r}")
        if (not isinstance(self.max_file_bytes, int) or isinstance(self.max_file_bytes, bool)
                or self.max_file_bytes < 1):
            raise ValueError(f"--max_file_bytes must be a positive whole number; got {self.max_file_bytes!r}")
        if self.shard_min_mb <= 0:
            raise ValueError(f"--shard_min_mb must be positive; got {self.shard_min_mb}")
        if self.shard_max_mb < self.shard_min_mb:
            raise ValueError(
                f"--shard_max_mb ({self.shard_max_mb}) must be at least --shard_min_mb "
                f"({self.shard_min_mb})"
            )
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"--max_bad_fraction must be within [0, 1]; got {self.max_bad_fraction}")
        if not 1 <= self.read_threads <= 64:
            raise ValueError(f"--read_threads must be within 1..64; got {self.read_threads}")
        if not -1 <= self.encode_processes <= 64:
            raise ValueError(
                f"--encode_processes must be within 0..64, or -1 for automatic; "
                f"got {self.encode_processes}"
            )

        for flag, value in (("--csv_delimiter", self.csv_delimiter), ("--csv_quote", self.csv_quote)):
            if len(value) != 1 or value in "\r\n":
                raise ValueError(f"{flag} must be one character (not a newline); got {value!r}")
        if self.csv_delimiter == self.csv_quote:
            raise ValueError("--csv_delimiter and --csv_quote must differ")
        if self.no_header and not self.columns:
            raise ValueError("--no_header needs --columns a,b,c naming the columns in file order")
        if self.split_column and self.splits:
            raise ValueError("use --split_column or --splits, not both")
        if self.key_column and not self.splits:
            raise ValueError("--key_column only applies with --splits")
        if self.splits:
            names = [name for name, _ in self.splits]
            if len(set(names)) != len(names):
                raise ValueError(f"--splits names a split twice: {names}")
            clash = clashing_split_names(names)
            if clash:
                raise ValueError(f"--splits names {' and '.join(map(repr, clash[0]))}, which differ only "
                                 "in case: their shard files would be one file on a case-insensitive "
                                 "file system; give the splits names that differ in more than case")
            for name, fraction in self.splits:
                if not is_valid_split_name(name):
                    raise ValueError(f"--splits: {name!r} cannot name a shard file; "
                                     "use letters, digits, '_' and '.'")
                if not 0 < fraction <= 1:
                    raise ValueError(f"--splits: the fraction of {name!r} must be in (0, 1]; got {fraction}")
            if abs(sum(f for _, f in self.splits) - 1) > 1e-6:
                raise ValueError(f"--splits fractions must add up to 1; they add up to "
                                 f"{sum(f for _, f in self.splits):g}")
        for root in self.allowed_roots:
            if not isinstance(root, str) or not root.strip() or root.rstrip("/").endswith(("/..", "/.")):
                raise ValueError(f"--allowed_roots: {root!r} is not a folder or bucket (e.g. "
                                 "gs://photos,/data/imgs)")
        if self.sequence_order and not self.sequence_key:
            raise ValueError("--sequence_order needs --sequence_key")
        for flag, value in (("--image_column", self.image_column),
                            ("--label_column", self.label_column)):
            if value is not None and (not value.strip() or value != value.strip()):
                raise ValueError(f"{flag} must name a CSV column (no surrounding spaces); "
                                 f"got {value!r}")
        if self.image_column is not None and self.image_column == self.label_column:
            raise ValueError("--image_column and --label_column must name different columns; "
                             f"both are {self.image_column!r}")
        self._check_drift_gate()
        if self.layout in ("class_folders", "cifar", "table"):
            for flag, value in (("--image_column", self.image_column),
                                ("--label_column", self.label_column)):
                if value is not None:
                    raise ValueError(f"{flag} applies to CSV image manifests, not to "
                                     f"--layout {self.layout}")

        if self.incremental and self.sequence_key:
            raise ValueError("--incremental cannot add to sequences: a later file may hold more "
                             "rows of a key already written as a sequence; use a full run "
                             "(--skip_unchanged --overwrite rebuilds only when the input changed)")
        if self.incremental and self.fail_on_leakage:
            raise ValueError("--fail_on_leakage checks the records of one run; an --incremental "
                             "part cannot see the older parts' images; use a full run "
                             "(--skip_unchanged --overwrite) to check the whole dataset")
        if self.date:
            parse_date(self.date)
        for flag, value in (("--input", self.input), ("--output", self.output)):
            expand_templates(value, "2000-01-01", flag)

    def _check_drift_gate(self) -> None:
        if self.compare_to is not None and not self.compare_to.strip():
            raise ValueError("--compare_to needs a manifest.json, a dataset folder, or 'previous'")
        limits = (("--drift_max_mean_shift", self.drift_max_mean_shift, DRIFT_MAX_MEAN_SHIFT, None),
                  ("--drift_max_missing_change", self.drift_max_missing_change,
                   DRIFT_MAX_MISSING_CHANGE, 1.0),
                  ("--drift_max_class_share_change", self.drift_max_class_share_change,
                   DRIFT_MAX_CLASS_SHARE_CHANGE, 1.0))
        for flag, value, default, most in limits:
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
                    or value == float("inf") or (most is not None and value > most)):
                within = f"within [0, {most:g}]" if most is not None else "a number >= 0"
                raise ValueError(f"{flag} must be {within}; got {value!r}")
            if value != default and self.compare_to is None:
                raise ValueError(f"{flag} applies only with --compare_to (the dataset to compare with)")

    @property
    def dialect(self) -> CsvDialect:
        """The CSV dialect of a table."""
        return CsvDialect(self.csv_delimiter, self.csv_quote, self.no_header, self.columns,
                          self.encoding, self.quoted_newlines)

    @property
    def table_layout(self) -> TableLayout:
        """Splits and sequences of a table."""
        return TableLayout(self.split_column, self.splits, self.key_column, self.sequence_key,
                           self.sequence_order, self.strict_schema)

    @property
    def reshape(self) -> ImageReshape:
        """How images are resized and re-encoded."""
        return ImageReshape(self.max_side, self.min_side, tuple(self.size), self.fit,
                            self.image_format, self.jpeg_quality, self.color_mode)

    @property
    def band(self) -> ShardBand:
        """The shard size band in bytes."""
        return ShardBand.from_mb(self.shard_min_mb, self.shard_max_mb)

    def to_json(self) -> dict:
        """The options as the manifest records them."""
        return dataclasses.asdict(self)


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


def expand_templates(path: str, date: str, flag: str = "--input") -> str:
    """``path`` with ``{date}`` (``2026-11-22``), ``{yyyy}``, ``{mm}``, ``{dd}`` and
    ``{yyyymmdd}`` filled from ``date`` (``YYYY-MM-DD``).

    Raises:
      ValueError: naming a placeholder we do not know (a literal brace is written ``{{``).
    """
    if "{" not in path and "}" not in path:
        return path
    day = parse_date(date)
    values = {"date": day.isoformat(), "yyyy": f"{day.year:04d}", "mm": f"{day.month:02d}",
              "dd": f"{day.day:02d}", "yyyymmdd": day.strftime("%Y%m%d")}
    try:
        return path.format(**values)
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"{flag} {path!r}: {err} is not a placeholder we fill; use "
                         f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} (write {{{{ for a "
                         "literal brace)") from None


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
