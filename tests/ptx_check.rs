//! CPU checks of the embedded kernel images: every PTX is self-contained, holds every
//! kernel of the ABI with a `.param` block of exactly the host's params size, and `ptxas`
//! assembles it for its arch with no spill, no stack frame, no local memory and no
//! serialized `wgmma` (ptxas note C7520); where `nvdisasm` is found (beside `ptxas`, or
//! `MLA_NVDISASM`), no memory instruction's cache-policy descriptor names an odd uniform
//! register (see [`odd_policy_descriptors`]).

use std::collections::BTreeMap;
use std::process::Command;

use mla::Variant;
use mla::images;

/// (ptxas arch, PTX, the variant whose symbols it holds, holds the primitive test kernels
/// too).
const IMAGES: &[(&str, &str, Variant, bool)] = &[
    ("sm_80", images::PTX_SM_80, Variant::Portable, false),
    ("sm_90a", images::PTX_SM_90A, Variant::Sm90a, false),
    ("sm_100a", images::PTX_SM_100A, Variant::Sm100a, false),
    ("sm_90a", images::PTX_PRIM_SM_90A, Variant::Sm90a, true),
];

/// The kernels an image must hold, with their params sizes: what the host resolves for
/// its variant (`mla::abi::kernels::ALL`), and the primitive kernels.
fn expected(variant: Variant, prim: bool) -> Vec<(&'static str, usize)> {
    let mut v: Vec<_> = variant
        .kernels()
        .map(|k| (k.symbol, k.params.size()))
        .collect();
    if prim {
        v.extend_from_slice(mla::abi::primitives::ALL);
    }
    v
}

/// `.entry NAME(` followed by `.param .align A .b8 NAME_param_0[SIZE]`.
fn entry_param_sizes(ptx: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut lines = ptx.lines();
    while let Some(l) = lines.next() {
        if let Some(rest) = l.trim().strip_prefix(".visible .entry ") {
            let name = rest.trim_end_matches('(').to_string();
            let param = lines.next().unwrap_or("");
            let size = param
                .rsplit('[')
                .next()
                .and_then(|s| s.trim_end_matches([']', ',', ' ']).parse().ok())
                .unwrap_or(usize::MAX);
            out.insert(name, size);
        }
    }
    out
}

#[test]
fn ptx_is_self_contained_and_matches_the_abi() {
    for &(tag, ptx, variant, prim) in IMAGES {
        for l in ptx.lines().filter(|l| l.contains(".extern")) {
            assert!(
                l.contains(".extern .shared"),
                "{tag}: unresolved declaration {l}"
            );
        }
        let target = format!(".target {tag}");
        assert!(ptx.contains(&target), "{tag}: PTX lacks `{target}`");
        let entries = entry_param_sizes(ptx);
        let want = expected(variant, prim);
        for &(name, size) in &want {
            assert_eq!(
                entries.get(name),
                Some(&size),
                "{tag}: entry {name} param size (host size_of = {size})"
            );
        }
        assert_eq!(
            entries.len(),
            want.len(),
            "{tag}: entries {:?}",
            entries.keys()
        );
        // A second parameter (the TMA decode's tensor map, by value) is 64-byte aligned.
        for k in variant.kernels() {
            if let Some(size) = k.params.second() {
                let decl = format!(
                    ".param .align {} .b8 {}_param_1[{size}]",
                    mla::abi::TENSOR_MAP_PARAM_ALIGN,
                    k.symbol
                );
                assert!(ptx.contains(&decl), "{tag}: no `{decl}`");
            }
        }
    }
}

struct Resources {
    registers: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
}

fn parse_ptxas(report: &str) -> BTreeMap<String, Resources> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    let num_before = |s: &str, key: &str| -> u32 {
        s.split(key)
            .next()
            .and_then(|h| h.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(u32::MAX)
    };
    for l in report.lines() {
        if let Some(i) = l.find("Compiling entry function '") {
            let rest = &l[i + "Compiling entry function '".len()..];
            current = rest.split('\'').next().map(str::to_string);
        } else if l.contains("bytes stack frame") {
            if let Some(n) = &current {
                out.insert(
                    n.clone(),
                    Resources {
                        registers: 0,
                        stack: num_before(l, "bytes stack frame"),
                        spill_stores: num_before(l, "bytes spill stores"),
                        spill_loads: num_before(l, "bytes spill loads"),
                    },
                );
            }
        } else if l.contains("Used ")
            && l.contains(" registers")
            && let Some(r) = current.as_ref().and_then(|n| out.get_mut(n))
        {
            r.registers = l
                .split("Used ")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
    }
    out
}

/// Memory instructions in `sass` (nvdisasm output) whose descriptor operand `desc[URn]`
/// names an odd uniform register, as `kernel: instruction`. ptxas 13.0 emitted such
/// LDGSTS for `cp.async ... .L2::cache_hint` in the `cp.async` `wgmma` decode
/// (`desc[UR1]`), and the kernel died with CUDA_ERROR_ILLEGAL_INSTRUCTION on the H200
/// (docs/PERF.md v10); every descriptor in the kernels that ran names an even register
/// (the 64-bit pair's first half). `gdesc[...]` (wgmma descriptors) is not this operand.
fn odd_policy_descriptors(sass: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut kernel = "";
    for l in sass.lines() {
        let t = l.trim();
        if let Some(name) = t.strip_prefix(".text.").and_then(|n| n.strip_suffix(':')) {
            kernel = name;
            continue;
        }
        let mut rest = t;
        while let Some(i) = rest.find("desc[UR") {
            let before = rest[..i].chars().last();
            let digits: String = rest[i + 7..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let is_policy = !before.is_some_and(|c| c.is_ascii_alphanumeric());
            if is_policy && digits.parse::<u32>().is_ok_and(|n| n % 2 == 1) {
                out.push(format!("{kernel}: {t}"));
                break;
            }
            rest = &rest[i + 7..];
        }
    }
    out
}

#[test]
fn odd_policy_descriptor_parser() {
    let sass = "\
        .text.mla_k:
        /*0a90*/ LDGSTS.E.BYPASS.128.ZFILL [R19], desc[UR12][R2.64], P0 ;
        /*0e50*/ LDGSTS.E.BYPASS.128.ZFILL [R11+UR0+0x12000], desc[UR1][R2.64], P3 ;
        /*22f0*/ HGMMA.64x32x16.F32.BF16 R152, gdesc[UR9], RZ, !UPT ;
        .text.mla_other:
        /*0100*/ LDG.E R2, desc[UR4][R2.64] ;";
    let found = odd_policy_descriptors(sass);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("mla_k: /*0e50*/"), "{found:?}");
}

/// `nvdisasm` to use: `MLA_NVDISASM`, else the one beside `ptxas` (the PyPI wheel
/// `nvidia-cuda-nvdisasm` installs into the same `nvidia/cu13/bin`).
fn nvdisasm_beside(ptxas: &str) -> Option<std::path::PathBuf> {
    let path = match std::env::var_os("MLA_NVDISASM") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::Path::new(ptxas).with_file_name("nvdisasm"),
    };
    path.is_file().then_some(path)
}

#[test]
fn ptxas_assembles_every_arch_without_spills() {
    let ptxas = std::env::var("MLA_PTXAS").unwrap_or_else(|_| images::PTXAS_PATH.to_string());
    if ptxas.is_empty() || !std::path::Path::new(&ptxas).is_file() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "\n!!! SKIPPED ptxas check: no ptxas (install the PyPI wheel nvidia-cuda-nvcc==13.0.88 \
             into ./.venv or set MLA_PTXAS, then rebuild) !!!\n"
        );
        return;
    }
    eprintln!("ptxas: {ptxas} ({})", images::PTXAS_VERSION);
    let dir = std::env::temp_dir().join(format!("mla-ptx-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    let nvdisasm = nvdisasm_beside(&ptxas);
    if nvdisasm.is_none() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "\n!!! SKIPPED SASS check: no nvdisasm beside ptxas (install the PyPI wheel \
             nvidia-cuda-nvdisasm into ./.venv or set MLA_NVDISASM) !!!\n"
        );
    }
    eprintln!(
        "{:<8} {:<28} {:>5} {:>6} {:>7} {:>7}",
        "arch", "kernel", "regs", "stack", "spill-st", "spill-ld"
    );
    for (i, &(tag, ptx, variant, prim)) in IMAGES.iter().enumerate() {
        let path = dir.join(format!("{i}-{tag}.ptx"));
        std::fs::write(&path, ptx).unwrap();
        let out = Command::new(&ptxas)
            .args([&format!("-arch={tag}"), "-v"])
            .arg(&path)
            .arg("-o")
            .arg(dir.join(format!("{i}-{tag}.cubin")))
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "ptxas -arch={tag} failed:\n{report}");
        // C7520: ptxas serialized a kernel's wgmmas (measured: it costs the wgmma decode
        // most of its tensor-core overlap). Every image must be free of it.
        let serialized: Vec<&str> = report.lines().filter(|l| l.contains("C7520")).collect();
        assert!(
            serialized.is_empty(),
            "ptxas -arch={tag}: wgmma serialized:\n{}",
            serialized.join("\n")
        );
        if let Some(dis) = &nvdisasm {
            let out = Command::new(dis)
                .arg(dir.join(format!("{i}-{tag}.cubin")))
                .output()
                .unwrap();
            assert!(out.status.success(), "nvdisasm on the {tag} cubin failed");
            for bad in odd_policy_descriptors(&String::from_utf8_lossy(&out.stdout)) {
                failures.push(format!("{tag}: odd cache-policy descriptor: {bad}"));
            }
        }
        let res = parse_ptxas(&report);
        let want = expected(variant, prim);
        let listed: Vec<&str> = if prim {
            mla::abi::primitives::ALL.iter().map(|k| k.0).collect()
        } else {
            want.iter().map(|k| k.0).collect()
        };
        for name in listed {
            let Some(r) = res.get(name) else {
                failures.push(format!("{tag}: no ptxas report for {name}"));
                continue;
            };
            eprintln!(
                "{tag:<8} {name:<28} {:>5} {:>6} {:>7} {:>7}",
                r.registers, r.stack, r.spill_stores, r.spill_loads
            );
            if r.stack != 0 || r.spill_stores != 0 || r.spill_loads != 0 {
                failures.push(format!(
                    "{tag} {name}: stack {} B, spill stores {} B, spill loads {} B",
                    r.stack, r.spill_stores, r.spill_loads
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failures.is_empty(),
        "local memory or bad SASS in kernels:\n{}",
        failures.join("\n")
    );
}
