"""Copies the GPU test binaries named in `cargo test --no-run --message-format=json`
output (stdin) to DEST/test-NAME: the staging step of tests/gpu/stage.sh and
tests/gpu/stage_variant.sh. ptx_check is left out: a CPU test (ptxas over the images)
that CI runs."""

import json
import shutil
import sys

dest = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m["target"]["kind"] == ["test"] \
            and m["target"]["name"] != "ptx_check":
        dst = f"{dest}/test-{m['target']['name']}"
        shutil.copy(exe, dst)
        print("staged", dst)
