"""keel's fuzzers (distribution `keel-dev`, beside `keel_dev`): `ops` fuzzes every op of every keel namespace,
`loaders` the checkpoint and GGUF loaders; each runs its cases in worker processes, so a crash or a hang is an
outcome, not the end of the run. The suite runs a fixed sample of each (tests/fuzz/, tests/hf/test_loader_fuzz.py);
`python -m keel_fuzz.ops` and `python -m keel_fuzz.loaders` run all of it."""
