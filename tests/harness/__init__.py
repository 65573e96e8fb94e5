"""Test harness: the CLI attack table, GCS emulators and fault proxy, a fake Dataflow API,
the reference image decoder. Not tests themselves; the test modules import them."""
