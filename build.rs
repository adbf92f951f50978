//! Builds the GPU kernels and embeds them in the `mla` library.
//!
//! For each arch of [`ARCHS`] the `kernels-gpu` crate is compiled by rustc's own
//! `nvptx64-nvidia-cuda` backend (nightly, `-Zbuild-std=core`, `-Cpanic=immediate-abort`,
//! one codegen unit, opt-level 3, `--emit=asm`) in its own target dir, and the PTX is checked
//! to be self-contained (no `.extern .func`). Where `ptxas` is found, the exact-arch PTX is
//! also assembled into cubins, which the runtime prefers over the driver's JIT.
//!
//! A published package carries no kernel sources: it ships the images in `prebuilt/`
//! (`mla_<tag>.ptx` and, where `ptxas` built one, `mla_<tag>.cubin`; `tools/package.sh`
//! puts them there), and this script embeds those, so a consumer builds on stable Rust with
//! no `ptxas` and no CUDA install. In the repository (kernel sources present) it compiles.
//!
//! Environment:
//! - `MLA_PREBUILT_PTX_DIR`: take `mla_<tag>.ptx` (and `mla_<tag>.cubin` where present)
//!   from this folder instead of compiling.
//! - `MLA_PTXAS`: the `ptxas` to use (else `ptxas` on `PATH`, `$CUDA_HOME/bin/ptxas`, or the
//!   PyPI wheel `nvidia-cuda-nvcc` inside `./.venv`).
//! - `MLA_REQUIRE_PTXAS=1`: fail instead of warning when no `ptxas` is found.
//! - `MLA_HW_FP8=0`: convert fp8 with the portable software e4m3 decode in the sm_90a and
//!   sm_100a builds too. The default there is the hardware `cvt.rn.f16x2.e4m3x2` (verified
//!   on the H200: bit-identical results, fp8 KV 1.2x faster; docs/PERF.md); sm_80 always
//!   uses the software decode.
//! - `MLA_TRACE=1`: a measurement build, not for serving: the sm_90a TMA decodes (bf16 caches)
//!   stamp their phases into the workspace's scratch (`kernels-gpu/src/decode/trace.rs`;
//!   `MLA_TRACE_PRINT=1 mla bench` prints them).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One kernel image to build.
struct Image {
    /// File tag (`mla_<tag>.ptx`) and the name of its embedded constants.
    tag: &'static str,
    /// rustc `target-cpu` and `ptxas -arch`.
    arch: &'static str,
    /// Assemble a cubin for it (exact-arch images).
    cubin: bool,
    /// The arch has the hardware fp8 conversion (used unless `MLA_HW_FP8=0`).
    hw_fp8: bool,
    /// The primitive test kernels (`--cfg mla_primitives`) instead of a product image.
    primitives: bool,
    /// The `wgmma` decode (`--cfg mla_wgmma`): sm_90a only (`wgmma` is not on sm_100a).
    wgmma: bool,
}

const IMAGES: &[Image] = &[
    Image {
        tag: "sm_80",
        arch: "sm_80",
        cubin: false,
        hw_fp8: false,
        primitives: false,
        wgmma: false,
    },
    Image {
        tag: "sm_90a",
        arch: "sm_90a",
        cubin: true,
        hw_fp8: true,
        primitives: false,
        wgmma: true,
    },
    Image {
        tag: "sm_100a",
        arch: "sm_100a",
        cubin: true,
        hw_fp8: true,
        primitives: false,
        wgmma: false,
    },
    Image {
        tag: "prim_sm_90a",
        arch: "sm_90a",
        cubin: true,
        hw_fp8: false,
        primitives: true,
        wgmma: true,
    },
];

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for p in [
        "kernels-gpu/src",
        "kernels-gpu/abi/src",
        "kernels-gpu/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    if root.join(".venv/lib").is_dir() {
        println!(
            "cargo:rerun-if-changed={}",
            root.join(".venv/lib").display()
        );
    }
    for v in [
        "MLA_PREBUILT_PTX_DIR",
        "MLA_PTXAS",
        "MLA_REQUIRE_PTXAS",
        "CUDA_HOME",
        "MLA_HW_FP8",
        "MLA_TRACE",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }

    let packaged = !root.join("kernels-gpu/src").is_dir() && root.join("prebuilt").is_dir();
    // A package embeds its prebuilt cubins: no ptxas is looked for, whatever the consumer's
    // environment holds.
    let ptxas = if packaged { None } else { find_ptxas(&root) };
    // A package's cubins were built by the ptxas named in prebuilt/ptxas-version.txt.
    let ptxas_version = match (&ptxas, packaged) {
        (Some(p), _) => ptxas_version(p),
        (None, true) => fs::read_to_string(root.join("prebuilt/ptxas-version.txt"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default(),
        (None, false) => String::new(),
    };
    if ptxas.is_none() && !packaged {
        let msg = "ptxas not found (set MLA_PTXAS, put ptxas on PATH, or \
                   `python3 -m venv .venv && .venv/bin/pip install nvidia-cuda-nvcc==13.0.88`): \
                   no cubins embedded, the runtime will use the driver's PTX JIT";
        if env::var("MLA_REQUIRE_PTXAS").as_deref() == Ok("1") {
            panic!("{msg}");
        }
        println!("cargo:warning={msg}");
    }

    // Prebuilt images: the override, else a package's `prebuilt/` (no kernel sources).
    let prebuilt = env::var_os("MLA_PREBUILT_PTX_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let p = root.join("prebuilt");
            (!root.join("kernels-gpu/src").is_dir() && p.is_dir()).then_some(p)
        });
    if let Some(dir) = &prebuilt {
        println!("cargo:rerun-if-changed={}", dir.display());
    } else if !root.join("kernels-gpu/src").is_dir() {
        panic!(
            "no kernel sources (kernels-gpu/src) and no prebuilt images (prebuilt/ or \
             MLA_PREBUILT_PTX_DIR) in {}",
            root.display()
        );
    }

    let mut images_rs =
        String::from("// Generated by build.rs: the kernel images embedded in this library.\n");
    for img in IMAGES {
        let (tag, cpu, want_cubin) = (img.tag, img.arch, img.cubin);
        let ptx_path = out.join(format!("mla_{tag}.ptx"));
        let cubin_path = out.join(format!("mla_{tag}.cubin"));
        // A prebuilt cubin, when the prebuilt folder has a non-empty one.
        let mut prebuilt_cubin = false;
        match &prebuilt {
            Some(dir) => {
                let src = dir.join(format!("mla_{tag}.ptx"));
                fs::copy(&src, &ptx_path).unwrap_or_else(|e| {
                    panic!("prebuilt images: cannot copy {}: {e}", src.display())
                });
                let cubin = dir.join(format!("mla_{tag}.cubin"));
                if want_cubin && fs::metadata(&cubin).is_ok_and(|m| m.len() > 0) {
                    fs::copy(&cubin, &cubin_path).unwrap();
                    prebuilt_cubin = true;
                }
            }
            None => compile_kernels(&root, &out, img, &ptx_path),
        }
        let ptx = align_tensor_map_params(fs::read_to_string(&ptx_path).unwrap());
        let ptx = bound_register_split_entries(ptx);
        fs::write(&ptx_path, &ptx).unwrap();
        check_self_contained(tag, &ptx);

        let have_cubin = match (&ptxas, want_cubin, prebuilt_cubin) {
            (_, _, true) => true,
            (Some(p), true, false) => {
                assemble(p, cpu, &ptx_path, &cubin_path);
                true
            }
            _ => {
                fs::write(&cubin_path, b"").unwrap();
                false
            }
        };
        let up = tag.to_uppercase();
        images_rs += &format!(
            "pub const PTX_{up}: &str = include_str!(concat!(env!(\"OUT_DIR\"), \"/mla_{tag}.ptx\"));\n\
             pub const CUBIN_{up}: Option<&[u8]> = {};\n",
            if have_cubin {
                format!("Some(include_bytes!(concat!(env!(\"OUT_DIR\"), \"/mla_{tag}.cubin\")))")
            } else {
                "None".to_string()
            }
        );
    }
    images_rs += &format!("pub const PTXAS_VERSION: &str = {ptxas_version:?};\n");
    let ptxas_path = ptxas
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    images_rs += &format!("pub const PTXAS_PATH: &str = {ptxas_path:?};\n");
    fs::write(out.join("kernel_images.rs"), images_rs).unwrap();
}

/// Compiles `kernels-gpu` for one `target-cpu` and writes its PTX to `ptx_path`.
fn compile_kernels(root: &Path, out: &Path, img: &Image, ptx_path: &Path) {
    let cpu = img.arch;
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let vv = Command::new(&rustc)
        .arg("-vV")
        .output()
        .expect("cannot run rustc -vV");
    let vv = String::from_utf8_lossy(&vv.stdout);
    if !vv.contains("nightly") && !vv.contains("-dev") {
        panic!(
            "the GPU kernels need a nightly rustc (found: {}); rust-toolchain.toml selects \
             `nightly`: run cargo through rustup, or `rustup toolchain install nightly`",
            vv.lines().next().unwrap_or("?")
        );
    }
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .unwrap();
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if !sysroot
        .join("lib/rustlib/src/rust/library/core/Cargo.toml")
        .exists()
    {
        panic!(
            "rust-src is missing from {} (needed by -Zbuild-std=core): \
             `rustup component add rust-src --toolchain nightly`",
            sysroot.display()
        );
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = out.join("kernels").join(img.tag);
    let mut flags = vec![
        format!("-Ctarget-cpu={cpu}"),
        "-Zunstable-options".into(),
        "-Cpanic=immediate-abort".into(),
    ];
    if img.hw_fp8 && env::var("MLA_HW_FP8").as_deref() != Ok("0") {
        flags.push("--cfg=mla_hw_fp8".into());
    }
    if img.primitives {
        flags.push("--cfg=mla_primitives".into());
    }
    if cpu == "sm_80" {
        // L2 cache-policy hints on the KV copies (`createpolicy`, `.L2::cache_hint`) need
        // PTX ISA 7.4 (CUDA 11.4 drivers); rustc's sm_80 default is 7.0.
        flags.push("-Ctarget-feature=+ptx74".into());
    } else {
        // sm_90+: programmatic dependent launch (`griddepcontrol`).
        flags.push("--cfg=mla_pdl".into());
    }
    if img.wgmma && env::var("MLA_TRACE").as_deref() == Ok("1") {
        // A measurement build: the TMA decodes' phase stamps (kernels-gpu decode::trace).
        flags.push("--cfg=mla_trace".into());
    }
    if img.wgmma {
        flags.push("--cfg=mla_wgmma".into());
        // The TMA decode's tensor-map proxy fence needs PTX ISA 8.3 (CUDA 12.3 drivers).
        flags.push("-Ctarget-feature=+ptx83".into());
    }
    let flags = flags.join("\x1f");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root.join("kernels-gpu"))
        .args([
            "rustc",
            "--release",
            "--target",
            "nvptx64-nvidia-cuda",
            "-Zbuild-std=core",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .arg("--")
        .arg(format!("--emit=asm={}", ptx_path.display()));
    // The outer build's settings must not leak into the kernel build.
    for v in [
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags);
    let status = cmd.status().expect("cannot run cargo for the kernel build");
    if !status.success() {
        panic!("building kernels-gpu for {cpu} failed (see the compiler output above)");
    }
}

/// Raises every entry's 128-byte second parameter (the TMA decodes' tensor map, the only
/// second parameter any kernel takes: `mla_abi::kernels::Params::DecodeWithMap`) from the
/// `.align 16` rustc emits (its nvptx kernel ABI takes no larger alignment) to the 64 bytes
/// a tensor map needs (`mla_abi::TensorMap`). The kernels only take the parameter's
/// address, so the declaration is the one place its alignment lives; `tests/ptx_check.rs`
/// checks every map parameter the table names.
fn align_tensor_map_params(ptx: String) -> String {
    const FROM: &str = ".param .align 16 .b8 ";
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.split_inclusive('\n') {
        let decl = line.trim();
        match decl.strip_prefix(FROM) {
            Some(name) if name.trim_end_matches(',').ends_with("_param_1[128]") => {
                out.push_str(&line.replacen(".align 16", ".align 64", 1));
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// Threads of every kernel that moves registers between its warpgroups (`setmaxnreg`):
/// three warpgroups (`mla_abi::decode_tile::TMA32_FP8`'s layout; `tests/ptx_check.rs`
/// checks each such entry against its launch shape).
const REGISTER_SPLIT_THREADS: u32 = 384;

/// Gives every entry that uses `setmaxnreg` a `.maxntid` and `.minnctapersm 1` (rustc emits
/// no launch bounds): ptxas then allocates the entry's code against the launch's share of
/// the register file and each warpgroup's code after its `setmaxnreg` against that limit
/// (with neither, or with `.maxntid` alone, ptxas ignores the instruction: C7508). Entries
/// that already carry one (prebuilt images) are kept.
fn bound_register_split_entries(ptx: String) -> String {
    let mut out = String::with_capacity(ptx.len() + 256);
    let mut rest = ptx.as_str();
    while let Some(at) = rest.find(".entry ") {
        let next = rest[at + 1..]
            .find(".entry ")
            .map_or(rest.len(), |n| n + at + 1);
        let entry = &rest[at..next];
        let open = entry.find("\n{\n");
        match open {
            Some(open) if entry.contains("setmaxnreg") && !entry[..open].contains(".maxntid") => {
                out.push_str(&rest[..at]);
                out.push_str(&entry[..open]);
                out.push_str(&format!(
                    "\n.maxntid {REGISTER_SPLIT_THREADS}, 1, 1\n.minnctapersm 1"
                ));
                out.push_str(&entry[open..]);
            }
            _ => out.push_str(&rest[..next]),
        }
        rest = &rest[next..];
    }
    out.push_str(rest);
    out
}

/// The PTX must not call into anything the driver cannot resolve: the only `.extern`
/// allowed is the dynamic shared-memory buffer.
fn check_self_contained(tag: &str, ptx: &str) {
    for line in ptx.lines().filter(|l| l.contains(".extern")) {
        if !line.contains(".extern .shared") {
            panic!(
                "PTX for {tag} holds an unresolved declaration `{}`: something calls into core \
                 (a panic path or an out-of-line function); it must be inlined or removed",
                line.trim()
            );
        }
    }
    if !ptx.contains(".entry") {
        panic!("PTX for {tag} has no kernel entry");
    }
}

fn assemble(ptxas: &Path, arch: &str, ptx: &Path, cubin: &Path) {
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg(ptx)
        .arg("-o")
        .arg(cubin)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", ptxas.display()));
    if !out.status.success() {
        panic!(
            "ptxas -arch={arch} rejected the kernels:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn ptxas_version(ptxas: &Path) -> String {
    Command::new(ptxas)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.contains("release"))
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_default()
}

/// `MLA_PTXAS`, then `ptxas` on `PATH`, `$CUDA_HOME/bin`, the wheel in `./.venv`.
fn find_ptxas(root: &Path) -> Option<PathBuf> {
    if let Some(p) = env::var_os("MLA_PTXAS") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
        panic!("MLA_PTXAS={} is not a file", p.display());
    }
    let mut cands: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).map(|d| d.join("ptxas")).collect())
        .unwrap_or_default();
    if let Some(h) = env::var_os("CUDA_HOME") {
        cands.push(PathBuf::from(h).join("bin/ptxas"));
    }
    if let Ok(rd) = fs::read_dir(root.join(".venv/lib")) {
        for e in rd.flatten() {
            cands.push(e.path().join("site-packages/nvidia/cu13/bin/ptxas"));
        }
    }
    cands.into_iter().find(|p| p.is_file())
}
