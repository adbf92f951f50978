/work/main/kernels-gpu/target/release/deps/mla_abi-3d007ac6f6621dba.d: abi/src/lib.rs

/work/main/kernels-gpu/target/release/deps/libmla_abi-3d007ac6f6621dba.rmeta: abi/src/lib.rs

abi/src/lib.rs:
