#!/usr/bin/env bash
# Session 8, device call 10: the joined table at HEAD (the schedule fold for B <= 8):
# `mla bench --grid extra` and the peers' harness with our plugins on the reference grid.
set -uo pipefail
cd "$(dirname "$0")/../../.."
MLA_TESTS=0 MLA_BENCH_EXTRA=1 MLA_PEERS=1 bash tests/gpu/run.sh 2>&1 | tail -75
