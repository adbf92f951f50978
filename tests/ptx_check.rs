//! CPU checks of the embedded kernel images: every PTX is self-contained, holds every
//! kernel of the ABI with a `.param` block of exactly the host's params size, and `ptxas`
//! assembles it for its arch with no spill, no stack frame, no local memory and no
//! serialized `wgmma` (ptxas note C7520); where `nvdisasm` is found (beside `ptxas`, or
//! `MLA_NVDISASM`), no memory instruction's cache-policy descriptor names an odd uniform
//! register (see [`odd_policy_descriptors`]). The `wgmma` kernels' warpgroup-synchronising
//! instructions appear once per source site in the PTX and the SASS ([`SYNC_SITES`]).

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
            // A kernel that moves registers between warpgroups carries the build's
            // `.maxntid`, which must be its launch shape (ptxas sizes the registers by it).
            let Some(body) = ptx_body(ptx, k.symbol) else {
                continue;
            };
            if body.contains("setmaxnreg") {
                let bound = format!(".maxntid {}, 1, 1", k.block);
                assert!(
                    body.contains(&bound),
                    "{tag}: {} uses setmaxnreg without `{bound}`",
                    k.symbol
                );
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

/// How many times each warp- or warpgroup-synchronising instruction appears in the sm_90a
/// body of the decode and schedule kernels: one per source call site. A compiler may copy an
/// instruction that follows a branch on the lane (`if issuer { .. }`) into both arms; a `.aligned` instruction (`wgmma.wait_group`,
/// `bar.sync`, `bar.arrive`) then runs as two copies in one warp, which is undefined and
/// was seen to hang the TMA decode on the H200. Changing a kernel's sites means updating
/// its row. Per kernel: (`wgmma.wait_group` count, `bar.sync` (id, count), `bar.arrive`
/// (id, count)); a barrier whose number is in a register counts under [`REG_ID`].
type SyncSites = (usize, &'static [(u32, usize)], &'static [(u32, usize)]);
/// The id under which a barrier numbered by a register counts (hardware ids are < 16).
const REG_ID: u32 = 16;
/// The e4m3 path's sites (see its rows): `$cta` CTA barriers, `$wg` warpgroup barriers
/// (5 and 6) each.
macro_rules! e4m3_sites {
    ($cta:expr, $wg:expr) => {
        (
            8,
            &[
                (0, $cta),
                (1, 1),
                (2, 1),
                (3, 1),
                (4, 1),
                (5, $wg),
                (6, $wg),
                (7, 1),
                (8, 1),
            ],
            &[(1, 1), (2, 1), (3, 1), (4, 1), (7, 1), (8, 2)],
        )
    };
}
/// The e4m3 path's `cp.async` forms (either Q): per S, the V^T transpose's warpgroup
/// barrier and the one before the V^T cleaning of a block with keys only the step's later
/// tokens see; in the prologue and each pair step (their copies land rows past the end as
/// zeros, so no tail is zeroed).
const E4M3_CP_SITES: SyncSites = e4m3_sites!(7, 4);
/// The e4m3 tensor-map forms, with the transposer warpgroup: CTA barriers, the init's and
/// the marking's (or the list scan's) two in each of the two walks; the consumers' CTA
/// barrier (9: the prologue's, the epilogue's, the staged store's two); the pair steps'
/// exchange barriers (1-4); each consumer's wait for a stage's V^T (10-13, one site each)
/// and its releases (7: warpgroup 0's, warpgroup 1's two predicated ones; 8: warpgroup 0's
/// in both branches of its S, warpgroup 1's); the transposer's waits for the releases
/// (numbered in a register, and its two after the walk), its own barrier before a V^T
/// cleaning (14) and its two arrivals on the ready barriers (in registers).
const E4M3_XPOSE_SITES: SyncSites = (
    8,
    &[
        (0, 5),
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 1),
        (7, 1),
        (8, 1),
        (9, 4),
        (10, 1),
        (11, 1),
        (12, 1),
        (13, 1),
        (14, 1),
        (REG_ID, 1),
    ],
    &[(1, 1), (2, 1), (3, 1), (4, 1), (7, 3), (8, 3), (REG_ID, 2)],
);
const SYNC_SITES: &[(&str, SyncSites)] = &[
    // CTA barriers: the one after the mbarriers' init, two around each marking of a
    // persistent CTA's cells, the prologue's, the epilogue's, two in the staged output store
    // and two in the staged 16-bit partial's.
    (
        "mla_decode_tma_bf16",
        (
            8,
            &[(0, 9), (1, 1), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2)],
            &[(1, 1), (2, 1), (3, 1), (4, 1)],
        ),
    ),
    // Its `cp.async` form: one `wgmma` wait in warpgroup 0's step and two in warpgroup 1's;
    // the CTA barriers of the TMA decode (the marking's two, the prologue's, the
    // epilogue's, the staged stores' two each); P handed over per stage (3, 4).
    (
        "mla_decode_tma_bf16_cp",
        (3, &[(0, 8), (3, 1), (4, 1)], &[(3, 1), (4, 1)]),
    ),
    // An fp8 cache under either Q (the e4m3 path), with the transposer warpgroup: see
    // E4M3_XPOSE_SITES.
    ("mla_decode_tma_fp8kv_bf16q", E4M3_XPOSE_SITES),
    ("mla_decode_tma_fp8", E4M3_XPOSE_SITES),
    // The work list's kernels: the sites of the cell kernels above, with the work list
    // scan's two CTA barriers in place of the marking's two.
    (
        "mla_decode_tma_bf16_list",
        (
            8,
            &[(0, 9), (1, 1), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2)],
            &[(1, 1), (2, 1), (3, 1), (4, 1)],
        ),
    ),
    ("mla_decode_tma_fp8kv_bf16q_list", E4M3_XPOSE_SITES),
    ("mla_decode_tma_fp8_list", E4M3_XPOSE_SITES),
    ("mla_decode_tma_fp8kv_bf16q_cp", E4M3_CP_SITES),
    ("mla_decode_tma_fp8_cp", E4M3_CP_SITES),
    // The small-row TMA decodes: S^T's wait and P.V's four; the consumer's row exchange
    // (1: each block and the epilogue), P (2), Q and the output staging (3); three CTA
    // barriers (the unaligned `barrier.sync 0`: the start, two around each marking of the
    // cells).
    (
        "mla_decode_tma32_bf16",
        (5, &[(0, 3), (1, 2), (2, 1), (3, 3)], &[]),
    ),
    // Its `cp.async` form: the same sites (the producer warp's copies add none).
    (
        "mla_decode_tma32_bf16_cp",
        (5, &[(0, 3), (1, 2), (2, 1), (3, 3)], &[]),
    ),
    // The fp8 forms (e4m3, two consumer warpgroups): one `wgmma` wait for S^T and one for
    // the P.V; each consumer's row exchange and P on its own barriers (a register id; the
    // exchange's also once before the raw slabs are freed, after every warp's transpose), the
    // epilogue's exchange (1, the first consumer's only) and output staging (3, twice);
    // both consumers' Q (9) and merge (10, four); five CTA barriers (the start, two around
    // each marking in the consumers' and the producer warpgroup's cell walks).
    (
        "mla_decode_tma32_fp8kv_bf16q",
        (
            2,
            &[(0, 5), (1, 1), (3, 2), (9, 1), (10, 4), (REG_ID, 3)],
            &[],
        ),
    ),
    (
        "mla_decode_tma32_fp8",
        (
            2,
            &[(0, 5), (1, 1), (3, 2), (9, 1), (10, 4), (REG_ID, 3)],
            &[],
        ),
    ),
    ("mla_decode_wg_bf16", (2, &[(0, 1), (1, 2), (2, 1)], &[])),
    (
        "mla_decode_wg_fp8kv_bf16q",
        (2, &[(0, 2), (1, 2), (2, 1)], &[]),
    ),
    ("mla_decode_wg_fp8", (2, &[(0, 2), (1, 2), (2, 1)], &[])),
    // The mma.sync and fp8 decodes: CTA barriers only (ring or two stages, the max and sum
    // exchanges; one more for an fp8 cache's conversion pass or pair step).
    ("mla_decode_mma16_bf16", (0, &[(0, 5)], &[])),
    ("mla_decode_mma16_fp16", (0, &[(0, 5)], &[])),
    // With the hardware fp8 conversion (`super::f8`); `MLA_HW_FP8=0` builds run the
    // mma.sync body for them (SW_FP8_SYNC_SITES).
    ("mla_decode_mma16_fp8", (0, &[(0, 6)], &[])),
    ("mla_decode_mma16_fp8kv_bf16q", (0, &[(0, 6)], &[])),
    ("mla_decode_mma32_fp8", (0, &[(0, 6)], &[])),
    ("mla_decode_mma32_fp8kv_bf16q", (0, &[(0, 6)], &[])),
    ("mla_decode_mma_bf16", (0, &[(0, 6)], &[])),
    ("mla_decode_mma_fp16", (0, &[(0, 6)], &[])),
    ("mla_decode_mma_fp8", (0, &[(0, 7)], &[])),
    ("mla_decode_mma_fp8kv_bf16q", (0, &[(0, 7)], &[])),
    ("mla_decode_ref_bf16", (0, &[(0, 1)], &[])),
    ("mla_schedule", (0, &[(0, 1)], &[])),
];

/// The rows of [`SYNC_SITES`] that differ in a build with the software fp8 decode
/// (`MLA_HW_FP8=0`): the 16-row fp8 kernels take the `mma.sync` body and its conversion pass.
/// Told apart by the image itself (the hardware build's 16-row fp8 kernel converts with
/// `cvt.rn.f16x2.e4m3x2`), not by the environment of this run.
const SW_FP8_SYNC_SITES: &[(&str, SyncSites)] = &[
    ("mla_decode_mma16_fp8", (0, &[(0, 7)], &[])),
    ("mla_decode_mma16_fp8kv_bf16q", (0, &[(0, 7)], &[])),
];

/// [`SYNC_SITES`] for this build.
fn sync_sites() -> Vec<(&'static str, SyncSites)> {
    let sw_fp8 = !ptx_body(images::PTX_SM_90A, "mla_decode_mma16_fp8")
        .is_some_and(|b| b.contains("cvt.rn.f16x2.e4m3x2"));
    SYNC_SITES
        .iter()
        .map(|&(name, sites)| {
            let sw = SW_FP8_SYNC_SITES.iter().find(|r| sw_fp8 && r.0 == name);
            (name, sw.map_or(sites, |r| r.1))
        })
        .collect()
}

/// The counted form of [`SYNC_SITES`]: wait groups and barrier (kind, id) -> count.
type SyncCounts = (usize, BTreeMap<(&'static str, u32), usize>);

fn expected_sync(sites: &SyncSites) -> SyncCounts {
    let mut bars = BTreeMap::new();
    for &(id, n) in sites.1 {
        bars.insert(("sync", id), n);
    }
    for &(id, n) in sites.2 {
        bars.insert(("arrive", id), n);
    }
    (sites.0, bars)
}

/// The body of `.entry NAME(` in `ptx`, up to the next entry.
fn ptx_body<'a>(ptx: &'a str, name: &str) -> Option<&'a str> {
    let start = ptx.find(&format!(".entry {name}("))?;
    let rest = &ptx[start + 1..];
    Some(&rest[..rest.find(".entry ").unwrap_or(rest.len())])
}

/// Counts in PTX: `wgmma.wait_group`, `bar.sync ID[, N]` (and `barrier.sync ID[, N]`),
/// `bar.arrive ID, N`.
fn ptx_sync_counts(body: &str) -> SyncCounts {
    let mut waits = 0;
    let mut bars = BTreeMap::new();
    for l in body.lines().map(str::trim) {
        // A predicate (`@p `) is part of the instruction, not of the site count.
        let l = match l.strip_prefix('@') {
            Some(rest) => rest.split_once(' ').map_or(l, |(_, op)| op.trim_start()),
            None => l,
        };
        if l.starts_with("wgmma.wait_group") {
            waits += 1;
        }
        // `barrier.sync` (the unaligned form) counts with `bar.sync`, as the SASS has both
        // as `BAR.SYNC`.
        for (kind, prefix) in [
            ("sync", "bar.sync "),
            ("sync", "barrier.sync "),
            ("arrive", "bar.arrive "),
        ] {
            if let Some(rest) = l.strip_prefix(prefix) {
                let id = rest.split([',', ';']).next().unwrap_or("").trim();
                let id = if id.starts_with("%r") {
                    Ok(REG_ID)
                } else {
                    id.parse()
                };
                if let Ok(id) = id {
                    *bars.entry((kind, id)).or_insert(0) += 1;
                }
            }
        }
    }
    (waits, bars)
}

/// Counts in one kernel's SASS (nvdisasm): `WARPGROUP.DEPBAR`, `BAR.SYNC[.DEFER_BLOCKING]
/// ID`, `BAR.ARV ID` (not `MEMBAR`).
fn sass_sync_counts(sass: &str) -> SyncCounts {
    let mut waits = 0;
    let mut bars = BTreeMap::new();
    for l in sass.lines() {
        let Some(op) = l.split("*/").nth(1).map(str::trim) else {
            continue;
        };
        // A predicate (`@P0 `) is part of the instruction, not of the site count.
        let op = op
            .strip_prefix('@')
            .map_or(op, |r| r.split_once(' ').map_or(r, |x| x.1));
        if op.starts_with("WARPGROUP.DEPBAR") {
            waits += 1;
        }
        for (kind, prefix) in [("sync", "BAR.SYNC"), ("arrive", "BAR.ARV")] {
            if let Some(rest) = op.strip_prefix(prefix) {
                let id = rest
                    .trim_start_matches(|c: char| c != ' ')
                    .trim()
                    .split([',', ';'])
                    .next()
                    .unwrap_or("")
                    .trim();
                let id = if id.starts_with('R') {
                    Ok(REG_ID)
                } else {
                    u32::from_str_radix(id.trim_start_matches("0x"), 16)
                };
                if let Ok(id) = id {
                    *bars.entry((kind, id)).or_insert(0) += 1;
                }
            }
        }
    }
    (waits, bars)
}

/// Bytes of stack and spill stores and loads a register-split kernel may have (see
/// [`local_in_mma_span`]; its stack alone at most `names::REGISTER_SPLIT_LOCAL_BYTES`).
const SPLIT_LOCAL_BYTES: u32 = 384;

/// Local-memory instructions (`LDL`, `STL`) between a kernel's first and last tensor-core
/// instruction (`HGMMA`, `QGMMA`, `HMMA`): its block loop.
fn local_in_mma_span(sass: &str) -> usize {
    let ops: Vec<&str> = sass
        .lines()
        .filter_map(|l| l.split("*/").nth(1).map(str::trim))
        .collect();
    let mma = |o: &&str| o.contains("GMMA") || o.contains("HMMA");
    let (Some(a), Some(b)) = (ops.iter().position(mma), ops.iter().rposition(mma)) else {
        return 0;
    };
    ops[a..=b]
        .iter()
        .filter(|o| o.contains("LDL") || o.contains("STL"))
        .count()
}

/// One kernel's function in nvdisasm output (`.text.NAME` up to the next `.text.`).
fn sass_function<'a>(sass: &'a str, name: &str) -> Option<&'a str> {
    let start = sass.find(&format!(".text.{name} "))?;
    let rest = &sass[start..];
    let end = rest[1..]
        .find("//--------------------- .text.")
        .map_or(rest.len(), |e| e + 1);
    Some(&rest[..end])
}

#[test]
fn warpgroup_sync_sites_appear_once_in_the_ptx() {
    let mut failures = Vec::new();
    for (name, sites) in sync_sites() {
        let Some(body) = ptx_body(images::PTX_SM_90A, name) else {
            failures.push(format!("{name}: not in the sm_90a PTX"));
            continue;
        };
        let got = ptx_sync_counts(body);
        let want = expected_sync(&sites);
        if got != want {
            failures.push(format!("{name}: PTX has {got:?}, the sources {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "warpgroup sync sites (see SYNC_SITES):\n{}",
        failures.join("\n")
    );
}

#[test]
fn sync_count_parsers() {
    let ptx = "\tbar.sync 0;\n\tbar.sync 5, 128;\n\tbar.arrive 3, 256;\n\twgmma.wait_group.sync.aligned 1;\n\tbar.sync %r12, 128;\n";
    let (w, b) = ptx_sync_counts(ptx);
    assert_eq!(w, 1);
    assert_eq!(b.get(&("sync", 0)), Some(&1));
    assert_eq!(b.get(&("sync", 5)), Some(&1));
    assert_eq!(b.get(&("sync", REG_ID)), Some(&1));
    assert_eq!(b.get(&("arrive", 3)), Some(&1));
    let sass = "        /*0100*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n\
                /*0110*/              @P6 BAR.SYNC.DEFER_BLOCKING 0x6, 0x80 ;\n\
                /*0120*/                   BAR.ARV 0x3, 0x100 ;\n\
                /*0130*/                   MEMBAR.ALL.CTA ;\n\
                /*0140*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n\
                /*0150*/                   BAR.SYNC.DEFER_BLOCKING R194, 0x80 ;\n";
    let (w, b) = sass_sync_counts(sass);
    assert_eq!(w, 1);
    assert_eq!(b.len(), 4);
    assert_eq!(b.get(&("sync", REG_ID)), Some(&1));
    assert_eq!(b.get(&("sync", 6)), Some(&1));
    assert_eq!(b.get(&("arrive", 3)), Some(&1));
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
        // C7508: ptxas ignored a `setmaxnreg` (the entry's register count unknown).
        let ignored: Vec<&str> = report.lines().filter(|l| l.contains("C7508")).collect();
        assert!(
            ignored.is_empty(),
            "ptxas -arch={tag}: setmaxnreg ignored:\n{}",
            ignored.join("\n")
        );
        let mut sass_text = None;
        if let Some(dis) = &nvdisasm {
            let out = Command::new(dis)
                .arg(dir.join(format!("{i}-{tag}.cubin")))
                .output()
                .unwrap();
            assert!(out.status.success(), "nvdisasm on the {tag} cubin failed");
            let sass = String::from_utf8_lossy(&out.stdout).to_string();
            for bad in odd_policy_descriptors(&sass) {
                failures.push(format!("{tag}: odd cache-policy descriptor: {bad}"));
            }
            if tag == "sm_90a" && !prim {
                for (name, sites) in sync_sites() {
                    let got = sass_function(&sass, name).map(sass_sync_counts);
                    let want = expected_sync(&sites);
                    if got.as_ref() != Some(&want) {
                        failures.push(format!(
                            "{tag} {name}: SASS has {got:?}, the sources {want:?} (a copied \
                             .aligned instruction; see SYNC_SITES)"
                        ));
                    }
                }
            }
            sass_text = Some(sass);
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
            let local = r.stack + r.spill_stores + r.spill_loads;
            // A kernel that splits the register file (`setmaxnreg`) may keep a few per-cell
            // values in local memory, never inside its `wgmma` loop.
            let split = ptx_body(ptx, name).is_some_and(|b| b.contains("setmaxnreg"));
            let in_loop = sass_text
                .as_deref()
                .and_then(|t| sass_function(t, name))
                .map(local_in_mma_span);
            let ok = if split {
                local <= SPLIT_LOCAL_BYTES
                    && r.stack <= mla::abi::names::REGISTER_SPLIT_LOCAL_BYTES
                    && mla::abi::names::REGISTER_SPLIT.contains(&name)
                    && in_loop.is_none_or(|n| n == 0)
            } else {
                local == 0
            };
            if !ok {
                failures.push(format!(
                    "{tag} {name}: stack {} B, spill stores {} B, spill loads {} B, local \
                     accesses between its first and last MMA {in_loop:?}",
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
