"""The Flex Template takes every ``convert`` flag, Dataflow refuses what its workers
cannot reach, and a Dataflow job says how far it got (issue 19).

``dataflow/metadata.json`` is generated from the ``convert`` parser
(``dataflow/make_metadata.py``); the template's entry point
(``dataflow/flex_main.py``) is run with every flag as the launcher passes them
(``--name=value``, booleans ``=true``) into the real DataflowRunner's dry run,
offline, with the inputs on the storage emulator.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
import threading
import types

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.runners.worker import worker_status
from google.cloud import dataflow_v1beta3
from google.protobuf import json_format

from beam_tfrecords.cli import config_from_args, convert_parser, main
from beam_tfrecords.preflight import plan_run
from beam_tfrecords.samples import CLASSES, make_csv_manifest_sample
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.options import CONVERT_OPTIONS, Option
from beam_tfrecords.transforms.io import progress
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)
from tests.test_dataflow import (  # noqa: F401  (fixtures)
    BUCKET,
    CUSTOM_IMAGE,
    DRY_RUN_FLAGS,
    REPO,
    _assert_chain,
    _one_sdist_build_at_a_time,
    _submitted_environment,
    offline,
)

METADATA_FILE = os.path.join(REPO, "dataflow", "metadata.json")


@pytest.fixture(name="template")
def _template(monkeypatch):
    """``dataflow/``'s two scripts as modules: ``(make_metadata, flex_main)``. The
    progress interval the entry point sets is restored afterwards."""
    monkeypatch.syspath_prepend(os.path.join(REPO, "dataflow"))
    monkeypatch.setenv(progress.INTERVAL_ENV, "30")
    monkeypatch.setattr(progress._state, "interval", None)  # pylint: disable=protected-access
    return importlib.import_module("make_metadata"), importlib.import_module("flex_main")


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0][2:]: a for a in parser._actions  # pylint: disable=protected-access
            if a.option_strings and not isinstance(a, argparse._HelpAction)}  # pylint: disable=protected-access


# --- metadata.json ---------------------------------------------------------------------


@pytest.mark.unit
def test_metadata_json_is_the_convert_flags(template):
    make_metadata, flex_main = template
    with open(METADATA_FILE, encoding="utf-8") as f:
        on_disk = json.load(f)
    assert on_disk == make_metadata.metadata(), ("dataflow/metadata.json differs from the convert "
                                                 "flags: run make metadata")
    json_format.ParseDict(on_disk, dataflow_v1beta3.TemplateMetadata.pb()())  # Dataflow's own message.
    parser = convert_parser()
    flags = _flags(parser)
    params = {p["name"]: p for p in on_disk["parameters"]}
    assert sorted([*params, *flex_main.TEMPLATE_REFUSES]) == sorted(flags)  # None missing, none extra.
    for name, param in params.items():
        action = flags[name]
        assert param["isOptional"] == (not action.required), name
        values = ["true", "false"] if param["paramType"] == "BOOLEAN" else [
            o["value"] for o in param.get("enumOptions", [])] or [param.get("defaultValue")]
        for value in filter(None, values):  # Each passes its regex and means what the CLI reads.
            assert all(re.fullmatch(r, value) for r in param["regexes"]), (name, value)
            args, rest = parser.parse_known_args(["--input=gs://b/i", "--output=gs://b/o", f"--{name}={value}"])
            assert rest == [], (name, rest)
            expected = value == "true" if param["paramType"] == "BOOLEAN" else (
                action.default if value == param.get("defaultValue") else value)
            assert getattr(args, action.dest) == expected, (name, value)
    # An option declared for convert is a parameter at once (this is what keeps the file complete).
    planted = Option("new_switch", "main", "a switch added later", False, "bool", switch=True)
    (added,) = [p for p in make_metadata.metadata((*CONVERT_OPTIONS, planted))["parameters"]
                if p["name"] == "new_switch"]
    assert (added["paramType"], added["helpText"], added["defaultValue"]) == (
        "BOOLEAN", "A switch added later", "false")


@pytest.mark.unit
def test_flags_without_a_value_take_true_or_false(tmp_path, capsys):
    parser = convert_parser()
    base = ["--input=in", "--output=out"]
    switches = [name for name, a in _flags(parser).items() if isinstance(a, argparse._StoreTrueAction)]  # pylint: disable=protected-access
    assert len(switches) >= 10
    plain = vars(parser.parse_known_args(base)[0])
    for name in switches:
        on = vars(parser.parse_known_args([*base, f"--{name}"])[0])
        assert on[name] is True and {**on, name: False} == plain, name
        assert vars(parser.parse_known_args([*base, f"--{name}=true"])[0]) == on, name
        assert vars(parser.parse_known_args([*base, f"--{name}=False"])[0]) == plain, name
        assert vars(parser.parse_known_args([*base, f"--{name}", f"--{name}=false"])[0]) == plain
    assert main(["convert", *base, "--overwrite=yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("beam-tfrecords convert: error: argument --overwrite: expected true or false, "
                   "got 'yes' (see beam-tfrecords convert --help)")
    # Every command takes them; a positional after a bare flag stays the positional.
    for form in ("--scan_only", "--scan_only=true"):
        assert main(["verify", form, str(tmp_path)]) == 1
        assert "FAIL  no TFRecord files found" in capsys.readouterr().out


# --- the entry point, with every flag --------------------------------------------------

DAY = "2024-01-31"
ROOT = f"{BUCKET}/in/{DAY}"
# A value for each convert flag that a CSV image manifest takes, other than its
# default where it may be. Flags not listed are passed as the launcher would: a
# boolean as true, a value at its default; NOT_GIVEN lists the rest.
FLAGS = {
    "input": f"{BUCKET}/in/{{date}}/manifest.csv", "output": f"{BUCKET}/out/{{date}}", "layout": "csv",
    "labels": f"{ROOT}/labels.txt", "compression": "gzip", "validate": "decode",
    "max_pixels": "100000000", "max_file_bytes": "1000000", "shard_min_mb": "1",
    "shard_max_mb": "2.5", "max_bad_fraction": "0.5", "read_threads": "8", "encode_processes": "0",
    "image_bytes": "original", "max_side": "32", "image_format": "png", "jpeg_quality": "80",
    "color_mode": "rgb", "progress": "log", "progress_seconds": "7", "fingerprint": "content",
    "date": DAY, "image_column": "image", "label_column": "label",
    "allowed_roots": f"{BUCKET}/shared", "splits": "train=0.5,test=0.5", "split_by": "content",
    "compare_to": "previous", "drift_max_mean_shift": "3", "drift_max_missing_change": "0.2",
    "drift_max_class_share_change": "0.3", "feature_names": "tutorial",
    # Booleans that cannot be true here:
    "list_on_workers": "false",  # Lists folders, not a CSV manifest.
    "incremental": "false",  # Not with --fail_on_leakage (and --skip_unchanged is true).
    "no_header": "false", "no_quoted_newlines": "false", "strict_schema": "false",  # Tables only.
    "instance_masks": "false", "drop_empty": "false",  # Annotated layouts only.
}
NOT_GIVEN = {"size": "--max_side sizes the images", "columns": "tables", "schema": "tables",
             "split_column": "tables", "key_column": "tables", "sequence_key": "tables",
             "sequence_order": "tables",
             # Annotated images: other layouts than a CSV image manifest's (--box_columns and
             # --box_units are passed at their defaults).
             "annotations": "COCO's layout", "masks": "semantic masks' layout",
             "label_separator": "several labels' layout"}


def _manifest_on_gcs(gcs, tmp_path) -> None:
    make_csv_manifest_sample(str(tmp_path), n=4)
    lines = [f"{row.split(',')[0]},{row.split(',')[1]}" for row in
             (tmp_path / "manifest.csv").read_text().splitlines()]
    (tmp_path / "manifest.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    gcs.upload_tree(str(tmp_path), ROOT)


@pytest.mark.emulator
def test_flex_template_entry_point_takes_every_flag(tmp_path, gcs, offline, template):  # noqa: F811
    make_metadata, flex_main = template
    _manifest_on_gcs(gcs, tmp_path)
    launcher, cli = [], []  # --name=value, as the launcher passes them; as a person types them.
    for param in make_metadata.metadata()["parameters"]:
        name = param["name"]
        value = FLAGS.get(name, "true" if param["paramType"] == "BOOLEAN" else param.get("defaultValue"))
        if value is None:
            assert name in NOT_GIVEN, f"--{name}: give it a value in FLAGS or say why not in NOT_GIVEN"
            continue
        launcher.append(f"--{name}={value}")
        cli += [f"--{name}"] if value == "true" else [] if value == "false" else [f"--{name}", value]
    assert sum(arg.endswith("=true") for arg in launcher) >= 6
    config, beam_args = flex_main.parse(launcher)
    args, rest = convert_parser().parse_known_args(cli)
    assert rest == [] and beam_args == [] and config == config_from_args(args)  # The CLI's.
    defaults = ConvertConfig(input="i", output="o")
    same = sorted(f for f in vars(defaults) if getattr(config, f) == getattr(defaults, f))
    assert same == ["annotations", "box_columns", "box_units", "columns", "csv_delimiter", "csv_quote",
                    "drop_empty", "encoding", "fit", "incremental", "instance_masks", "key_column",
                    "label_separator", "list_on_workers", "masks", "min_side", "no_header",
                    "quoted_newlines", "schema", "sequence_key", "sequence_order", "size", "split_column",
                    "strict_schema"]

    result = flex_main.run([*launcher, *DRY_RUN_FLAGS, f"--sdk_container_image={CUSTOM_IMAGE}"])
    job = result.job
    _assert_chain(job, ["ListImages", "SpoolImages", "WriteShards", "VerifyShards", "WriteManifest"])
    assert job.options.view_as(progress.ProgressOptions).progress_seconds == 7  # --progress_seconds
    environment = dataflow_v1beta3.Environment.to_dict(_submitted_environment(job))
    assert environment["sdk_pipeline_options"]["options"]["progress_seconds"] == 7  # To the workers.
    assert gcs.list(f"{BUCKET}/out/") == []  # Built, not run: nothing written, not even the lock.


# --- what Dataflow's workers cannot reach ----------------------------------------------


@pytest.mark.emulator
def test_dataflow_refuses_paths_its_workers_cannot_reach(tmp_path, gcs, offline, template,  # noqa: F811
                                                          capsys):
    _, flex_main = template
    _manifest_on_gcs(gcs, tmp_path / "in")
    manifest, out = f"{ROOT}/manifest.csv", f"{BUCKET}/out/refused"
    gcs.upload_bytes(f"{ROOT}/outside.csv", b"image,label\nimages/001.png,circles\n/data/x.png,squares\n")
    refused = {
        (f"--input={tmp_path / 'in'}", f"--output={out}"): f"--input {tmp_path / 'in'}",
        (f"--input={manifest}", f"--output={tmp_path / 'out'}"): f"--output {tmp_path / 'out'}",
        (f"--input={manifest}", f"--output={out}", "--allowed_roots=/data"): "--allowed_roots /data",
        (f"--input={ROOT}/outside.csv", f"--output={out}", "--allow_paths_outside=true"):
            f"--input {ROOT}/outside.csv (its rows name images under /data)",
    }
    for flags, named in refused.items():
        assert flex_main.main([*flags, *DRY_RUN_FLAGS]) == 2, flags
        err = capsys.readouterr().err
        assert err == (f"flex_main: error: {named}: Dataflow's workers cannot see this machine's "
                       "disk; use gs:// paths (copy local files to a bucket first, e.g. gcloud "
                       "storage cp -r DIR gs://BUCKET/DIR)\n"), flags
    assert flex_main.main([f"--input={manifest}", f"--output={out}", "--report_json=r.json",
                           *DRY_RUN_FLAGS]) == 2
    assert "--report_json cannot be used in a Flex Template" in capsys.readouterr().err
    assert flex_main.main([f"--input={manifest}", f"--output={out}", "--on_interrupt=keep",
                           *DRY_RUN_FLAGS]) == 2
    assert "--on_interrupt cannot be used in a Flex Template" in capsys.readouterr().err
    assert gcs.list(out) == [] and not os.path.exists(tmp_path / "out")
    # Files read on the launcher only may stay local: a labels file, a schema.
    config = ConvertConfig(input=manifest, output=out, labels=str(tmp_path / "in" / "labels.txt"))
    assert plan_run(config, PipelineOptions(DRY_RUN_FLAGS)).config.labels == config.labels


# --- progress on the workers ------------------------------------------------------------


@pytest.mark.unit
def test_a_worker_takes_the_interval_from_the_job(monkeypatch):
    """As Beam's SDK harness starts: the job's options become the runtime options."""
    monkeypatch.delenv(progress.INTERVAL_ENV, raising=False)
    monkeypatch.setattr(RuntimeValueProvider, "runtime_options", {"progress_seconds": 0.0})
    monkeypatch.setattr(progress._state, "interval", None)  # pylint: disable=protected-access
    assert progress.interval() == 0  # 0 (no lines) is a value, not "unset".
    monkeypatch.setattr(progress._state, "interval", None)  # pylint: disable=protected-access
    monkeypatch.setenv(progress.INTERVAL_ENV, "12")  # A process's environment comes first.
    assert progress.interval() == 12
    monkeypatch.setattr(progress._state, "interval", None)  # pylint: disable=protected-access
    monkeypatch.delenv(progress.INTERVAL_ENV)
    monkeypatch.setattr(RuntimeValueProvider, "runtime_options", {})
    assert progress.interval() == 30


@pytest.mark.unit
def test_a_long_step_is_logged_without_its_stack(caplog):
    """Beam's SDK harness logs a step that has not emitted for 5 minutes with every
    frame of its thread; importing our steps' progress module keeps the line only."""
    handler = object.__new__(worker_status.FnApiWorkerStatusHandler)  # No status server.
    handler.log_lull_timeout_ns, handler._element_processing_timeout_ns = 1, None  # pylint: disable=protected-access
    info = types.SimpleNamespace(
        time_since_transition=301e9, tracked_thread=threading.current_thread(),
        state_name=types.SimpleNamespace(step_name="WriteShards/Write", name="process-msecs"))
    logger = logging.getLogger("apache_beam.runners.worker.worker_status")
    ours = [f for f in logger.filters if type(f).__module__ == progress.__name__]
    assert len(ours) == 1
    messages = []
    for quiet in (False, True):
        handler._last_lull_logged_secs = 0.0  # pylint: disable=protected-access
        if not quiet:
            logger.removeFilter(ours[0])
        try:
            with caplog.at_level(logging.WARNING, logger=logger.name):
                caplog.clear()
                handler._log_lull_sampler_info(info, "bundle-7")  # pylint: disable=protected-access
        finally:
            progress.quiet_lull_logs()
        messages.append(caplog.records[-1].getMessage())
    loud, quiet = messages
    assert "Current Traceback" in loud and 'File "' in loud  # Beam's own: the stack.
    assert quiet == ("Operation ongoing in bundle bundle-7 for PTransform{name=WriteShards/Write, "
                     "state=process-msecs} for at least 301.00 seconds without outputting or "
                     "completing. (stack trace left out by beam-tfrecords: this worker's "
                     "progress lines say what the step is doing)")
