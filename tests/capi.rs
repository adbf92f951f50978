//! The C ABI on the CPU: typed statuses and last-error text without a GPU, null handles
//! refused, and the header `src/mla.h` agreeing with the Rust structs (compiled with the
//! system C compiler when there is one).

use std::ffi::CStr;
use std::process::Command;

use mla::capi::*;

fn last_error() -> String {
    // SAFETY: mla_last_error returns a valid NUL-terminated string owned by the library.
    unsafe { CStr::from_ptr(mla_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn statuses_and_errors_without_a_gpu() {
    let mut rt: *mut MlaRuntime = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    let s = unsafe { mla_runtime_create(0, &mut rt) };
    if s == MLA_OK {
        eprintln!("a GPU is present: only the null-handle checks run");
        // SAFETY: handle from create.
        unsafe { mla_runtime_destroy(rt) };
    } else {
        assert_eq!(s, MLA_ERR_NO_DEVICE, "{}", last_error());
        assert!(last_error().contains("CUDA"), "{}", last_error());
        assert!(rt.is_null());
    }
    // SAFETY: null handles are refused before any use.
    let s = unsafe {
        mla_decode_run(
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(s, MLA_ERR_INVALID);
    assert!(last_error().contains("null"), "{}", last_error());
    // SAFETY: as above.
    let s = unsafe { mla_plan_create(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()) };
    assert_eq!(s, MLA_ERR_INVALID);
    // SAFETY: null is accepted by the destructors.
    unsafe {
        mla_plan_destroy(std::ptr::null_mut());
        mla_runtime_destroy(std::ptr::null_mut());
    }
}

#[test]
fn header_matches_the_rust_structs() {
    let dir = std::env::temp_dir().join(format!("mla-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("sizes.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stddef.h>\n#include \"mla.h\"\n\
         int main(void) { printf(\"%zu %zu %zu %zu %zu\\n\", sizeof(MlaPlanConfig), sizeof(MlaDecodeArgs), \
         offsetof(MlaDecodeArgs, batch), offsetof(MlaDecodeArgs, page_table_stride), offsetof(MlaDecodeArgs, softmax_scale)); return 0; }\n",
    )
    .unwrap();
    let exe = dir.join("sizes");
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let cc = Command::new("cc")
        .arg("-I")
        .arg(include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output();
    let Ok(cc) = cc else {
        eprintln!("\n!!! SKIPPED header check: no C compiler (cc) !!!\n");
        return;
    };
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let want = vec![
        std::mem::size_of::<MlaPlanConfig>(),
        std::mem::size_of::<MlaDecodeArgs>(),
        std::mem::offset_of!(MlaDecodeArgs, batch),
        std::mem::offset_of!(MlaDecodeArgs, page_table_stride),
        std::mem::offset_of!(MlaDecodeArgs, softmax_scale),
    ];
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got, want, "C sizes/offsets vs Rust");
}
