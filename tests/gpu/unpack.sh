# Sourced from the repo root by the GPU-machine scripts: unpacks what tests/gpu/stage.sh
# and stage_variant.sh packed to stay under the device call's 64 MiB carry limit (the
# binaries, libmla.so and the cubins in stage/bin.tgz; the peers' kit in stage/peers.tgz; a
# host variant's binaries and library in stage/variants/NAME/bin.tgz), once.
for _t in stage/bin.tgz stage/peers.tgz stage/variants/*/bin.tgz; do
  if [[ -f $_t ]]; then
    tar xzf "$_t" -C "$(dirname "$_t")" && rm "$_t"
  fi
done
unset _t
