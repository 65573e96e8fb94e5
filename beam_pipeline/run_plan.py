"""What a preflight decides: the plan of a run (``RunPlan``) and the errors that refuse one.

The preflight (``beam_pipeline.preflight``) and its per-kind planners
(``beam_pipeline.planners``) make a ``RunPlan``; the pipeline is built from it.
``ConvertError`` and its kinds say, in one line, what to change.
"""

from __future__ import annotations

import dataclasses

from beam_tfrecords.schemas.annotations import AnnotatedRun
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.inputs import InputFile
from beam_tfrecords.schemas.shards import ShardTarget
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms.codec.tfds_metadata import tfds_not_written
from beam_tfrecords.transforms.image_steps import LISTING_NAME
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.ownership import OutputClaims
from beam_tfrecords.transforms.plan.ref_table import RefTable
from beam_tfrecords.transforms.worker_listing import UnitsToList
from beam_tfrecords.updates import Update

__all__ = ["ConvertError", "OutputBusy", "OutputExistsError", "OutputNotOursError", "RunPlan"]


class ConvertError(ValueError):
    """The options or the inputs cannot work; the message says what to change."""


class OutputExistsError(ConvertError):
    """The output folder already holds a dataset and ``overwrite`` is off."""


class OutputBusy(ConvertError):
    """Another run is writing the output folder."""


class OutputNotOursError(ConvertError):
    """The output folder holds files this product cannot prove it wrote, where a
    run would replace them or read them as the dataset's (or a folder of its own
    is a link)."""


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A conversion resolved before its pipeline is built.

    Attributes:
      config: the options, local paths absolute, ``encode_processes`` a count,
        ``layout`` set to ``table`` for a table.
      target: where the shards go, for this run.
      table_inputs: a table's CSV files ``(path, size)``, sorted.
      header: the columns of a table's first file.
      schema: a table's schema (given or inferred).
      dropped_columns: header columns that ``--schema`` does not name (not written).
      inputs: what the preflight decided, as lines for people (see ``describe``).
      listing: for images, a token for the listing the preflight made (the
        listing step takes it when it runs in this process).
      input_files: the fingerprint entries of the inputs this run converts.
      role_files: entries of the labels file, schema, CSV manifest (by role).
      update: what a scheduled run decided (``skip``, ``run`` or ``part``; see
        ``beam_pipeline.updates``); ``None`` for a plain run.
      dataset_output: the dataset's folder (the lock is taken there): the
        ``--output`` given; ``config.output`` is the part's folder for a part.
      vocabulary: for an incremental run over images, the dataset's classes.
      only: for an incremental run over images, the files to convert.
      input_table, input_rows: for a plain run over a folder layout, the listing's
        columns (``Listing.files``) and the rows it converts (``None``: all), which
        ``inputs.jsonl`` is written from instead of ``input_files``.
      hand_over: the listing step runs in other processes (Dataflow, a
        multi-process DirectRunner): building the pipeline writes the listing to
        the run's temporary folder for it (``listing_path``), so that the run
        converts the files this plan lists, not a second listing's.
      units: with ``--list_on_workers``, the units the workers list and what the
        launcher decided for them (no listing is made here).
      output_claims: the output folder sorted into what this product wrote, what
        it did not (refused), and what it leaves alone (see
        ``transforms.io.ownership``); ``None`` until ``plan_run`` looked.
      contents_on_workers: ``--drop_duplicates`` or ``--split_by content`` hash the
        images on the workers (``contents_on_workers``), not here.
      annotated: for an annotated layout (``--layout coco|voc|yolo|box_csv|
        multi_label|masks``, or one detected), what the pipeline and the commit need
        besides the annotations the listing's references carry; ``None`` otherwise.
    """

    config: ConvertConfig
    target: ShardTarget
    table_inputs: tuple[tuple[str, int], ...] = ()
    header: tuple[str, ...] = ()
    schema: TableSchema | None = None
    dropped_columns: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    listing: str | None = None
    input_files: tuple[InputFile, ...] = ()
    role_files: tuple[InputFile, ...] = ()
    update: Update | None = None
    dataset_output: str = ""
    vocabulary: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    input_table: RefTable | None = None
    input_rows: object = None
    hand_over: bool = False
    units: UnitsToList | None = None
    output_claims: OutputClaims | None = None
    contents_on_workers: bool = False
    annotated: AnnotatedRun | None = None

    @property
    def is_table(self) -> bool:
        return self.config.layout == "table"

    @property
    def listing_path(self) -> str | None:
        """Where the listing step reads the preflight's listing (``None``: it takes it
        in this process)."""
        return files.join(self.target.temp_dir, LISTING_NAME) if self.hand_over and self.listing else None

    def describe(self) -> list[str]:
        """What the run will do, decided before it runs: input kind and layout,
        splits, classes or columns, features, and what is left out and why."""
        claims = self.output_claims.plan_lines() if self.output_claims is not None else []
        # Issue 22: an uncompressed shard gets an index file beside it; say when none will.
        index = (["  index files: none (gzip shards cannot be read at an offset; --compression none "
                  "writes <shard>.idx beside each shard)"] if self.config.compression == "gzip" else [])
        # And when no TFDS metadata will be (split names from a column are known after the run:
        # the manifest's tfds entry says it then).
        why = tfds_not_written(self.config.compression, (name for name, _ in self.config.splits))
        tfds = [f"  TFDS metadata: none ({why})"] if why else []
        return [f"plan: {self.config.input} -> {self.config.output}", *self.inputs, *index, *tfds, *claims]
