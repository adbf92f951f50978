#!/usr/bin/env bash
# Session 8, device call 1b: A/B of branch m16-three-barriers (bf16 16-row ring, 3 CTA
# barriers per block) against main's cubin: correctness on the 16-row tile, then
# `mla bench` bf16 m16n64, two interleaved repeats.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export MLA_GPU_TILES=m16n64 MLA_AB_FILTER='bf16 m16n64' MLA_AB_REPS=2 MLA_AB_TIMEOUT=60
export MLA_AB_VARIANTS="main: m16b3:MLA_IMAGE_FILE=stage/variants/m16b3.cubin"
bash tests/gpu/ab.sh
