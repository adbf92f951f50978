# Sourced from the repo root by the GPU-machine scripts: unpacks what tests/gpu/stage.sh
# packed to stay under the device call's 64 MiB carry limit (the binaries, libmla.so and
# the cubins in stage/bin.tgz; the peers' kit in stage/peers.tgz), once.
for _t in stage/bin.tgz stage/peers.tgz; do
  if [[ -f $_t ]]; then
    tar xzf "$_t" -C stage && rm "$_t"
  fi
done
unset _t
