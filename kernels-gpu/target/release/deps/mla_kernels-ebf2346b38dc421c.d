/work/main/kernels-gpu/target/release/deps/mla_kernels-ebf2346b38dc421c.d: src/lib.rs src/arch/mod.rs src/arch/cp_async.rs src/arch/cvt.rs src/arch/ldmatrix.rs src/arch/mma.rs src/arch/smem.rs src/arch/sync.rs src/combine.rs src/decode.rs src/decode_ref.rs src/elem.rs src/paged.rs src/schedule.rs Cargo.toml

/work/main/kernels-gpu/target/release/deps/libmla_kernels-ebf2346b38dc421c.rmeta: src/lib.rs src/arch/mod.rs src/arch/cp_async.rs src/arch/cvt.rs src/arch/ldmatrix.rs src/arch/mma.rs src/arch/smem.rs src/arch/sync.rs src/combine.rs src/decode.rs src/decode_ref.rs src/elem.rs src/paged.rs src/schedule.rs Cargo.toml

src/lib.rs:
src/arch/mod.rs:
src/arch/cp_async.rs:
src/arch/cvt.rs:
src/arch/ldmatrix.rs:
src/arch/mma.rs:
src/arch/smem.rs:
src/arch/sync.rs:
src/combine.rs:
src/decode.rs:
src/decode_ref.rs:
src/elem.rs:
src/paged.rs:
src/schedule.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=
# env-dep:CLIPPY_CONF_DIR
