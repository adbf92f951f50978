//! CPU checks of the embedded kernel images: every PTX is self-contained, holds every
//! kernel of the ABI with a `.param` block of exactly the host's params size, and `ptxas`
//! assembles it for its arch with no spill, no stack frame, no local memory and no
//! serialized `wgmma` (ptxas note C7520).

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
/// its variant, and the primitive kernels.
fn expected(variant: Variant, prim: bool) -> Vec<(&'static str, usize)> {
    let mut v: Vec<_> = variant.symbols().copied().collect();
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
        "local memory in kernels:\n{}",
        failures.join("\n")
    );
}
