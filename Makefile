# `make demo` and `make test` work on a fresh machine: both first build .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
# The demo works in a fresh temporary folder (it prints where); DEMO_DIR=... chooses one.
DEMO_DIR ?=
# The product's bytecode, compiled where it runs from (as `pip install .` does): where
# PYTHONDONTWRITEBYTECODE is set, every start would otherwise compile each module again
# (~0.16 s of a run's start-up). Only what changed is compiled again (~0.1 s when none).
COMPILE := $(PY) -m compileall -q beam_pipeline transforms schemas

.PHONY: setup demo test test-fast lint bench bench-quick bench-scaling bench-csv bench-annotations bench-readers proto metadata clean

# --use-pep517: once `wheel` is in the venv (TensorFlow's test extra brings it), pip would
# otherwise reinstall an edited setup.py with the legacy `setup.py develop`, whose egg-link
# cannot map beam_tfrecords onto beam_pipeline/ (the import then fails).
$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --use-pep517 -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)
	$(COMPILE)

demo: $(STAMP)
	$(COMPILE)
	$(PY) -m beam_tfrecords.demo $(if $(DEMO_DIR),--workdir '$(DEMO_DIR)')

# One worker per core, at most 4 (the tests are independent: each has its own
# folders, ports and emulator); about 6.5 min on 2 cores, 12 min on one. The product's
# bytecode is compiled first: hundreds of tests start the CLI as a process, and where
# PYTHONDONTWRITEBYTECODE is set each would compile every module again (~0.5 s a start).
# worksteal: a worker that runs dry takes tests queued on another, so that the run does
# not end on one worker's queue (the longest tests go first: tests/conftest.py).
test: $(STAMP)
	$(COMPILE)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist worksteal tests

# The unit and beam tiers only (markers in pytest.ini): no whole conversions, no emulator.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "unit or beam" tests

lint: $(STAMP)
	$(PY) -m ruff check .

# The benchmark needs the `bench` extra (the tfrecord package of the single-process
# baseline); the converter and `make test` do not.
$(BENCH_STAMP): $(STAMP) setup.py
	$(PY) -m pip install --quiet --disable-pip-version-check --use-pep517 -e '.[bench]'
	touch $(BENCH_STAMP)

# Ours against naive Beam, a tfrecord-package loop and a plain copy on every data
# set, in one invocation: about 50 min on 2 quiet cores once the data sets exist
# (building them the first time adds ~7 min and ~7 GB under /tmp/beam-tfrecords-bench).
# Take figures from a quiet machine: other load shows up directly in the times.
# BENCH_ARGS="--sets cifar,photo_x1,table" runs only issue 23's three sets (~25 min);
# "--compare_to OLD.json" compares ours' peak RSS and time with an earlier run's.
bench: $(BENCH_STAMP)
	$(COMPILE)
	$(PY) benchmarks/bench_suite.py $(BENCH_ARGS)

# The same harness on small sets, once each (~5 min): checks that it runs, not speed.
bench-quick: $(BENCH_STAMP)
	$(COMPILE)
	$(PY) benchmarks/bench_suite.py --quick $(BENCH_ARGS)

# Ours pinned to 1 core and to 2 (taskset) on cifar, photos and the 1M table, net of
# start-up, medians of 3 (~2 min on 2 quiet cores); BENCH_ARGS=--quick: small sets, ~1 min.
bench-scaling: $(STAMP)
	$(COMPILE)
	$(PY) benchmarks/bench_scaling.py $(BENCH_ARGS)

bench-csv: $(STAMP)
	$(COMPILE)
	$(PY) benchmarks/bench_csv.py

# Annotated images (issue 21): the photo set as class folders, as a box CSV with three
# boxes per image (target: at most 1.2x), and with masks (measured apart), in one run.
bench-annotations: $(STAMP)
	$(COMPILE)
	$(PY) benchmarks/bench_annotations.py

# Readers (issue 22): DataSource sequential and random-order reads of the photo set and
# the 1M-row table beside tf.data's sequential read of the same shards, in one run
# (TensorFlow from the test extra). BENCH_ARGS=--quick for small sets.
bench-readers: $(STAMP)
	$(COMPILE)
	$(PY) benchmarks/bench_readers.py $(BENCH_ARGS)

# Regenerate the checked-in protobuf code (needs Debian's protobuf-compiler, protoc 3.21).
proto:
	protoc -I. --python_out=. schemas/proto/*.proto

# Regenerate the Flex Template's parameters (dataflow/metadata.json) from the convert
# flags; tests/test_dataflow_template.py fails while the file is out of date.
metadata: $(STAMP)
	$(PY) dataflow/make_metadata.py

clean:
	rm -rf $(VENV) build *.egg-info
