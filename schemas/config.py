"""The options of a conversion, checked once, before any pipeline is built."""

from __future__ import annotations

import dataclasses

from beam_tfrecords.schemas.options import (
    COLOR_MODES,
    CONVERT_OPTIONS,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_PIXELS,
    DRIFT_MAX_CLASS_SHARE_CHANGE,
    DRIFT_MAX_MEAN_SHIFT,
    DRIFT_MAX_MISSING_CHANGE,
    FINGERPRINTS,
    FITS,
    IMAGE_BYTES_MODES,
    IMAGE_FORMATS,
    LAYOUTS,
    SPLIT_BY,
    VALIDATE_MODES,
    check_options,
    check_values,
    option_fields,
    parse_date,
    parse_roots,
    parse_size,
    parse_splits,
)
from beam_tfrecords.schemas.shards import ShardBand

__all__ = ["COLOR_MODES", "DEFAULT_MAX_FILE_BYTES", "DEFAULT_MAX_PIXELS", "FITS", "IMAGE_BYTES_MODES", "IMAGE_FORMATS",
           "ImageReshape", "FINGERPRINTS", "LAYOUTS", "RUN_CONTROL_OPTIONS", "TEMPLATE_FIELDS", "expand_templates",
           "parse_date", "SPLIT_BY", "parse_size", "VALIDATE_MODES", "ConvertConfig", "CsvDialect",
           "TableLayout", "parse_splits", "parse_roots"]

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
        check_values({"max_side": self.max_side, "min_side": self.min_side, "size": self.size,
                      "fit": self.fit, "image_format": self.format, "jpeg_quality": self.quality,
                      "color_mode": self.color})  # The options' own checks (schemas.options).
        if self.fit != "stretch" and not self.size:
            raise ValueError(f"--fit {self.fit} applies only with --size WIDTHxHEIGHT")

    @property
    def active(self) -> bool:
        """Whether any image may change."""
        return bool(self.max_side or self.min_side or self.size or self.format != "keep"
                    or self.color != "keep")


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


# The order in which manifests have always recorded the options (``to_json``): the
# fields of ConvertConfig in it, then any option declared since, in declaration order.
_RECORDED_ORDER = (
    "input", "output", "layout", "labels", "compression", "validate", "max_pixels", "image_bytes",
    "shard_min_mb", "shard_max_mb", "max_bad_fraction", "overwrite", "read_threads", "encode_processes",
    "schema", "csv_delimiter", "csv_quote", "no_header", "columns", "encoding", "quoted_newlines",
    "strict_schema", "split_column", "splits", "key_column", "split_by", "drop_duplicates",
    "fail_on_leakage", "max_side", "min_side", "size", "fit", "image_format", "jpeg_quality",
    "color_mode", "sequence_key", "sequence_order", "image_column", "label_column", "allowed_roots",
    "allow_paths_outside", "compare_to", "drift_max_mean_shift", "drift_max_missing_change",
    "drift_max_class_share_change", "skip_unchanged", "incremental", "fingerprint", "date",
    "list_on_workers", "follow_links_outside", "max_file_bytes", "reread",
)


@option_fields(CONVERT_OPTIONS, _RECORDED_ORDER)
class ConvertConfig:
    """What to convert, where to, and how: one field per option of ``convert``, each
    declared once in ``schemas.options`` (its flag, default, help and check), and
    made as ``ConvertConfig(input=..., output=..., max_side=512, ...)``.

    Every check names the command-line flag to change, since that is where the
    values usually come from.
    """

    def __post_init__(self):
        check_options(self, self.OPTIONS)  # Each option's own check, then those across options.
        reshape = self.reshape  # Checks the image reshape flags.
        if reshape.size and reshape.size[0] * reshape.size[1] > self.max_pixels:
            raise ValueError(f"--size {reshape.size[0]}x{reshape.size[1]} is "
                             f"{reshape.size[0] * reshape.size[1]:,} pixels an image, more than "
                             f"--max_pixels ({self.max_pixels:,}); choose a smaller size (or raise "
                             "--max_pixels)")
        if self.split_by != "path" and not self.splits:
            raise ValueError("--split_by applies only with --splits")
        if self.shard_max_mb < self.shard_min_mb:
            raise ValueError(
                f"--shard_max_mb ({self.shard_max_mb}) must be at least --shard_min_mb "
                f"({self.shard_min_mb})"
            )
        if self.csv_delimiter == self.csv_quote:
            raise ValueError("--csv_delimiter and --csv_quote must differ")
        if self.no_header and not self.columns:
            raise ValueError("--no_header needs --columns a,b,c naming the columns in file order")
        if self.split_column and self.splits:
            raise ValueError("use --split_column or --splits, not both")
        if self.key_column and not self.splits:
            raise ValueError("--key_column only applies with --splits")
        if self.sequence_order and not self.sequence_key:
            raise ValueError("--sequence_order needs --sequence_key")
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
        for flag, value in (("--input", self.input), ("--output", self.output)):
            expand_templates(value, "2000-01-01", flag)

    def _check_drift_gate(self) -> None:
        limits = (("--drift_max_mean_shift", self.drift_max_mean_shift, DRIFT_MAX_MEAN_SHIFT),
                  ("--drift_max_missing_change", self.drift_max_missing_change, DRIFT_MAX_MISSING_CHANGE),
                  ("--drift_max_class_share_change", self.drift_max_class_share_change,
                   DRIFT_MAX_CLASS_SHARE_CHANGE))
        for flag, value, default in limits:
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
        """The options as the manifest records them (an option ``recorded_when_given``
        only when it is not at its default)."""
        recorded = dataclasses.asdict(self)
        for option in self.OPTIONS:
            if option.recorded_when_given and recorded.get(option.name) == option.default:
                del recorded[option.name]
        return recorded


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
