#!/usr/bin/env bash
# keel's main command, from nothing to the table (README "The two commands"):
#   build once (torch 2.13.0) -> audit gate -> the SAME wheel on torch 2.13.0, 2.14.1, 2.15.0, 2.10.0
#   (fresh environments, no rebuild): mapped-library hashes = built, op tests, greedy tokens = torch A's;
#   and torch 2.9.1 (below the audited floor) must get keel's clear import error.
# Arguments go to scripts/release/pipeline.py (--targets, --pythons, --reuse-envs, --json, ...; see --help).
source "$(dirname "$0")/env.sh"
keel_venv "$KEEL_ROOT/.venv" 2.13.0   # the build environment (torch 2.13.0, CPU)
# keel-dev (dev/keel_dev): the parity rule the pipeline compares greedy tokens with
"$KEEL_ROOT/.venv/bin/python" -m pip install -q -e "$KEEL_ROOT/dev"
exec "$KEEL_ROOT/.venv/bin/python" "$KEEL_ROOT/scripts/release/pipeline.py" "$@"
