"""What a stranger found in --feature_names (issue 22, item 6) and two exit paths:
presets on records their readers cannot parse, output names that should not be,
renames spelt differently taken for changed options, inspect's escapes, Ctrl-C after
the dataset was published, and Beam's extra ERROR line before a verdict."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.features import IMAGE_FEATURE_SPEC, parse_feature_names
from tests.conftest import load_manifest
from tests.harness.annotated_sets import make_multi_label, make_voc

IMAGE_KEYS = [name for name, _, _ in IMAGE_FEATURE_SPEC.entries()]


def _refused(capsys, argv) -> str:
    """``convert ARGV`` refused before anything runs: exit 2, one line; the line."""
    capsys.readouterr()
    assert main(["convert", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("beam-tfrecords convert: error: --feature_names"), err
    return err[0]


@pytest.mark.unit
@pytest.mark.parametrize("output", ["a/../b", "a/./b", "x/../../../etc/passwd", "a/..", "a/.hidden"])
def test_dot_parts_cannot_name_a_feature(output):
    with pytest.raises(ValueError, match=f"{output!r} cannot name a feature.*no '.' or '..' parts"):
        parse_feature_names(f"image/filename={output}")
    assert parse_feature_names("image/filename=a.b/c..d").renames == {"image/filename": "a.b/c..d"}


@pytest.mark.unit
def test_another_roles_key_and_a_shape_that_follows_are_refused():
    detection = [k for k in IMAGE_KEYS if not k.startswith("image/class/")] + [
        "image/object/class/label", "image/object/class/text"]
    with pytest.raises(ValueError, match="image/object/class/label=image/class/label: 'image/class/label' "
                                         "is the key of another feature"):
        parse_feature_names("image/object/class/label=image/class/label").check_keys(detection, "VOC")
    table = ["id", "pixels", "pixels/shape"]
    with pytest.raises(ValueError, match="id=px/shape collides with 'px/shape', the shape feature that "
                                         "pixels=px gives"):
        parse_feature_names("pixels=px,id=px/shape").check_keys(table, shaped=["pixels"])
    with pytest.raises(ValueError, match="'pixels/shape' is the shape of 'pixels' and follows its name"):
        parse_feature_names("pixels/shape=ps").check_keys(table, shaped=["pixels"])
    parse_feature_names("pixels=px,id=ident").check_keys(table, shaped=["pixels"])


@pytest.mark.e2e
def test_refusals_of_the_records_features_through_the_cli(tmp_path, capsys):
    """Each against the spec the records would carry: exit 2, one line naming the entry."""
    labels = make_multi_label(tmp_path / "ml")  # image/class/label: a list, shape [None].
    for preset in ("tutorial", "cifar_notebook"):
        line = _refused(capsys, [*labels.flags, "--output", str(tmp_path / "o1"), "--feature_names", preset])
        assert (f"--feature_names {preset}: the preset's reader parses 'image/class/label' (as 'label') "
                "as one int64 per record, but these images' records hold a variable-length list of "
                "int64; convert without the preset") in line
    voc = make_voc(tmp_path / "voc")
    line = _refused(capsys, [*voc.flags, "--output", str(tmp_path / "o2"), "--feature_names",
                             "image/object/class/label=image/class/label"])
    assert "'image/class/label' is the key of another feature of this product's records" in line
    (tmp_path / "d.csv").write_text("id,score,pixels\n1,0.5,1 2 3 4 5 6\n", encoding="utf-8")
    (tmp_path / "s.yaml").write_text("columns:\n  - {name: id, type: int64, required: true}\n"
                                     "  - {name: score, type: float}\n"
                                     "  - {name: pixels, type: float, delimiter: ' ', shape: [2, 3]}\n",
                                     encoding="utf-8")
    table = ["--input", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.yaml")]
    for value, said in [
        ("pixels=px,id=pixels/shape", "id=pixels/shape collides with the feature 'pixels/shape' the "
                                      "table's records already hold"),
        ("score=pixels/shape", "score=pixels/shape collides with the feature 'pixels/shape'"),
        ("pixels=px,id=px/shape", "id=px/shape collides with 'px/shape', the shape feature that pixels=px"),
        ("pixels/shape=ps", "'pixels/shape' is the shape of 'pixels' and follows its name"),
    ]:
        assert said in _refused(capsys, [*table, "--output", str(tmp_path / "o3"), "--feature_names", value])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("o")]


@pytest.mark.e2e
def test_the_same_renames_spelt_otherwise_are_unchanged_options(tmp_path, capsys):
    images, out = str(tmp_path / "cf"), str(tmp_path / "out")
    make_class_folder_sample(images, per_class=2, splits=None, classes=("cat", "dog"), size_range=(16, 24))
    assert main(["convert", "--input", images, "--output", out, "--encode_processes", "0",
                 "--feature_names", "image/encoded=img,image/class/label=label"]) == 0
    features = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  features: ")]
    assert features == ["  features: image/channels, image/class/text, image/filename, image/format, "
                        "image/height, image/key/sha256, image/width, img, label"]  # As the records.
    for spelt in ("image/class/label=label,image/encoded=img", " image/encoded=img , image/class/label=label",
                  "cifar_notebook"):
        assert main(["convert", "--input", images, "--output", out, "--skip_unchanged",
                     "--feature_names", spelt]) == 99, spelt
        assert "SKIPPED: input unchanged" in capsys.readouterr().out
    # Other renames are other options.
    assert main(["convert", "--input", images, "--output", out, "--skip_unchanged",
                 "--feature_names", "image/encoded=pic,image/class/label=label"]) == 2
    assert "the options that shape the records changed (feature_names)" in capsys.readouterr().err
    (Path(images) / "cat" / "new.png").write_bytes(_png())
    assert main(["convert", "--input", images, "--output", out, "--incremental", "--encode_processes", "0",
                 "--feature_names", "cifar_notebook"]) == 0
    manifest = load_manifest(out)
    assert len(manifest["parts"]) == 1 and manifest["dataset"]["splits"]["train"]["records"] == 5


def _png() -> bytes:
    import io  # pylint: disable=import-outside-toplevel

    from PIL import Image  # pylint: disable=import-outside-toplevel
    buffer = io.BytesIO()
    Image.new("RGB", (20, 20), (9, 99, 199)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.e2e
def test_inspect_escapes_names_as_convert_does(tmp_path, capsys):
    table, out = tmp_path / "e.csv", str(tmp_path / "out")
    table.write_text("id,evil\x1bx\n1,2\n", encoding="utf-8")
    assert main(["convert", "--input", str(table), "--output", out, "--feature_names", "evil\x1bx=evil"]) == 0
    assert "feature names (--feature_names, pairs): evil\\x1bx -> evil;" in capsys.readouterr().out
    assert main(["inspect", out]) == 0
    shown = capsys.readouterr().out
    assert "  feature names (--feature_names): evil\\x1bx -> evil\n" in shown and "\x1b" not in shown


@pytest.mark.e2e
def test_a_verdict_ends_in_our_line_only(tmp_path, capsys, caplog):
    """--fail_on_leakage: Beam logs no ERROR of the commit's verdict before the summary's."""
    images = tmp_path / "in"
    make_class_folder_sample(str(images), per_class=1, splits=("train", "test"), classes=("cat", "dog"),
                             size_range=(16, 24))
    first = sorted((images / "train" / "cat").iterdir())[0]
    (images / "test" / "cat" / f"copy{first.suffix}").write_bytes(first.read_bytes())
    with caplog.at_level(logging.INFO):
        assert main(["convert", "--input", str(images), "--output", str(tmp_path / "out"),
                     "--encode_processes", "0", "--fail_on_leakage"]) == 1
    assert "LEAKAGE FOUND" in capsys.readouterr().out
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage()[:200] for r in errors]
    assert any("Run finished: leakage_found" in r.getMessage() for r in caplog.records)  # It ran.


@pytest.mark.e2e
def test_ctrl_c_after_the_dataset_was_published_says_so_and_exits_0(tmp_path):
    """A real SIGINT at the hold point right after the manifest is published (no
    report written yet): the run finishes and exits 0 with its summary."""
    images, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(images, per_class=1, splits=None, classes=("cat", "dog"), size_range=(16, 24))
    env = {**os.environ, "BEAM_TFRECORDS_HOLD_AT": "manifest_published",
           "BEAM_TFRECORDS_HOLD_DIR": str(tmp_path), "BEAM_TFRECORDS_TEST_HOOKS": "1"}
    hold = tmp_path / "manifest_published"
    with open(tmp_path / "stdout", "w+", encoding="utf-8") as stdout, \
            open(tmp_path / "stderr", "w+", encoding="utf-8") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", "--input", images,
                                 "--output", out, "--encode_processes", "0", "--progress", "off"],
                                env=env, stdout=stdout, stderr=stderr, text=True)
        try:
            deadline = time.monotonic() + 120
            while not hold.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert hold.exists() and os.path.exists(os.path.join(out, "manifest.json"))
            proc.send_signal(signal.SIGINT)
            told = "interrupted after the run published its dataset at " + out
            while told not in (tmp_path / "stderr").read_text() and proc.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            hold.unlink()  # The run goes on: its cleanup, its report, its summary.
            code = proc.wait(timeout=120)
        finally:
            proc.kill()
        stdout.seek(0)
        stderr.seek(0)
        said, logged = stdout.read(), stderr.read()
    assert code == 0, logged[-2000:]
    assert told in logged and "nothing was published" not in logged and "Traceback" not in logged
    assert "status: ok" in said and said.strip().splitlines()[-1].startswith("bad inputs: 0 of 2")
    assert json.loads(Path(out, "run_report.json").read_text())["status"] == "ok"
    assert main(["verify", out]) == 0
