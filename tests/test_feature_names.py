"""--feature_names (issue 22, item 6): parsing, refusals through the CLI, what the
records and the manifest hold."""

import json

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_cifar_sample
from beam_tfrecords.schemas.features import (
    FEATURE_NAME_PRESETS,
    IMAGE_FEATURE_SPEC,
    canonical_features,
    output_feature_name,
    parse_feature_names,
)
from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.example import example_to_dict
from beam_tfrecords.transforms.codec.image_example import image_example_parts
from beam_tfrecords.transforms.codec.image_inspection import inspect_image
from tests.conftest import load_manifest, read_dataset
from tests.harness.attack_table import cli

IMAGE_KEYS = [name for name, _, _ in IMAGE_FEATURE_SPEC.entries()]


@pytest.mark.unit
def test_presets_pairs_and_both():
    assert parse_feature_names(None).renames == {}
    tutorial = parse_feature_names("tutorial")
    assert tutorial.preset == "tutorial" and tutorial.renames == FEATURE_NAME_PRESETS["tutorial"]
    pairs = parse_feature_names(" image/encoded=img , image/class/label=label ")
    assert (pairs.preset, pairs.renames) == ("", {"image/class/label": "label", "image/encoded": "img"})
    both = parse_feature_names("tutorial,image/filename=name")
    assert both.renames == {**FEATURE_NAME_PRESETS["tutorial"], "image/filename": "name"}
    both.check_keys(IMAGE_KEYS)
    assert output_feature_name(both.renames, "image/encoded") == "image_raw"
    assert output_feature_name(both.renames, "image/format") == "image/format"
    assert canonical_features(both.renames, {"image_raw": [b"x"], "image/format": [b"png"]}) == {
        "image/encoded": [b"x"], "image/format": [b"png"]}


@pytest.mark.unit
@pytest.mark.parametrize("text, said", [
    ("", "has an empty entry"),
    ("tutorial,", "has an empty entry"),
    ("mnist", "'mnist' is neither a preset (tutorial, cifar_notebook)"),
    ("tutorial,cifar_notebook", "give one preset, not tutorial and cifar_notebook"),
    ("image/encoded=", "is not CANONICAL=OUTPUT"),
    ("=img", "is not CANONICAL=OUTPUT"),
    ("a=b=c", "is not CANONICAL=OUTPUT"),
    ("image/encoded=my img", "'my img' cannot name a feature"),
    ("image/encoded=/img", "'/img' cannot name a feature"),
    ("image/encoded=img/", "'img/' cannot name a feature"),
    ("image/encoded=a//b", "'a//b' cannot name a feature"),
    ("image/encoded=a,image/encoded=b", "renames 'image/encoded' twice"),
    ("image/encoded=image/encoded", "renames a feature to its own name"),
    ("image/encoded=x,image/filename=x", "gives image/encoded and image/filename one name, 'x'"),
    ("cifar_notebook,image/filename=label", "gives image/class/label and image/filename one name"),
    ("tutorial,image/encoded=pic", "the preset tutorial renames 'image/encoded' to 'image_raw'"),
])
def test_malformed_values_are_refused(text, said):
    with pytest.raises(ValueError, match="^--feature_names") as err:
        parse_feature_names(text)
    assert said in str(err.value) and "\n" not in str(err.value)


@pytest.mark.unit
def test_renames_checked_against_the_records_features():
    detection = [k for k in IMAGE_KEYS if not k.startswith("image/class/")]
    with pytest.raises(ValueError, match="the preset needs 'image/class/label', which detection"):
        parse_feature_names("cifar_notebook").check_keys(detection, "detection records")
    with pytest.raises(ValueError, match="'image/label' is not a feature of the records; rename one of"):
        parse_feature_names("image/label=label").check_keys(IMAGE_KEYS)
    with pytest.raises(ValueError, match="collides with the feature 'image/format'"):
        parse_feature_names("image/filename=image/format").check_keys(IMAGE_KEYS)
    with pytest.raises(ValueError, match="collides with the feature 'image/format'"):  # Renamed away too.
        parse_feature_names("image/format=fmt,image/filename=image/format").check_keys(IMAGE_KEYS)


@pytest.mark.unit
def test_renamed_record_is_protobufs_and_unrenamed_is_unchanged(tmp_path):
    make_cifar_sample(str(tmp_path), {"train": 1})
    data = next((tmp_path / "train").iterdir()).read_bytes()
    info = inspect_image(data, "structure", 1 << 20)
    args = (data, info, 2, "stripes", "train/0_stripes.png")
    plain = b"".join(image_example_parts(*args)[0])
    assert b"".join(image_example_parts(*args, names={})[0]) == plain  # Same bytes, same path.
    names = parse_feature_names("tutorial,image/filename=name").renames
    renamed, size = image_example_parts(*args, names=names)
    renamed = b"".join(renamed)
    assert size == len(renamed)
    example = example_pb2.Example()
    for key, values in example_to_dict(plain).items():
        feature = example.features.feature[output_feature_name(names, key)]
        if isinstance(values[0], bytes):
            feature.bytes_list.value.extend(values)
        else:
            feature.int64_list.value.extend(values)
    assert renamed == example.SerializeToString(deterministic=True)
    assert sorted(example_to_dict(renamed)) == sorted(
        ["image_raw", "height", "width", "depth", "label", "name", "image/class/text", "image/format",
         "image/key/sha256"])


@pytest.mark.e2e
def test_refusals_through_the_cli(tmp_path, capsys):
    """Each refusal: exit 2, one line naming the flag, nothing written."""
    images, table = str(tmp_path / "cifar"), tmp_path / "t.csv"
    make_cifar_sample(images, {"train": 2})
    table.write_text("city,age\nParis,3\nLyon,4\n", encoding="utf-8")
    cases = [
        (images, "image/label=label", "'image/label' is not a feature of these images' records"),
        (images, "image/filename=image/format", "collides with the feature 'image/format'"),
        (str(table), "tutorial", "the preset needs 'image/channels', which the table's records do not"),
        (str(table), "city=age", "collides with the feature 'age'"),
    ]
    for number, (source, value, said) in enumerate(cases):
        out = tmp_path / f"out{number}"
        capsys.readouterr()
        assert main(["convert", "--input", source, "--output", str(out), "--feature_names", value]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--feature_names" in err[0] and said in err[0], err
        assert not out.exists()
    # And the real CLI, as a process: a malformed pair refused before anything runs.
    run = cli(tmp_path, "convert", "--input", images, "--output", str(tmp_path / "p"),
              "--feature_names", "image/encoded=")
    assert run.exit == 2 and run.stderr.strip().count("\n") == 0
    assert "--feature_names: 'image/encoded=' is not CANONICAL=OUTPUT" in run.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.e2e
def test_manifest_and_records_follow_the_names(tmp_path, capsys):
    images, out = str(tmp_path / "cifar"), str(tmp_path / "img")
    make_cifar_sample(images, {"train": 3})
    assert main(["convert", "--input", images, "--output", out, "--encode_processes", "0",
                 "--feature_names", "tutorial,image/filename=name"]) == 0
    assert "feature names (--feature_names, preset tutorial, and pairs): image/channels -> depth" \
        in capsys.readouterr().out
    manifest = load_manifest(out)
    renames = {**FEATURE_NAME_PRESETS["tutorial"], "image/filename": "name"}
    assert manifest["feature_names"] == renames
    assert manifest["options"]["feature_names"] == "tutorial,image/filename=name"
    want = sorted(output_feature_name(renames, k) for k in IMAGE_KEYS)
    assert sorted(manifest["features"]) == want
    records = [r for rs in read_dataset(out).values() for r in rs]
    assert len(records) == 3 and all(sorted(r) == want for r in records)
    assert main(["inspect", out, "--contact_sheet", str(tmp_path / "sheet.png")]) == 0
    shown = capsys.readouterr().out
    assert "feature names (--feature_names): image/channels -> depth" in shown
    assert "contact sheet of train: " in shown and "(3 images)" in shown  # Found by their roles.

    table, out = tmp_path / "t.csv", str(tmp_path / "tab")
    table.write_text("city,age\nParis,3\nLyon,4\nParis,5\n", encoding="utf-8")
    assert main(["convert", "--input", str(table), "--output", out, "--feature_names", "age=years"]) == 0
    manifest = load_manifest(out)
    assert manifest["feature_names"] == {"age": "years"}
    assert sorted(manifest["features"]) == ["city", "years"]
    assert sorted(manifest["splits"]["train"]["statistics"]["features"]) == ["city", "years"]
    assert sorted(r["years"][0] for rs in read_dataset(out).values() for r in rs) == [3, 4, 5]
    assert main(["verify", out]) == 0
    plain = str(tmp_path / "plain")
    assert main(["convert", "--input", str(table), "--output", plain]) == 0
    assert "feature_names" not in json.dumps(load_manifest(plain))
