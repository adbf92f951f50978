//! The C ABI: typed statuses and last-error text (empty after a success), config errors
//! naming their field, null handles reported as such, the header `src/mla.h` (embedded as
//! `mla::capi::HEADER`, so the check runs from staged binaries too) agreeing with the Rust
//! structs and constants; with a GPU, plan introspection, the checked mode's fault record
//! and eager runs mixed with graph replays of one plan on two caches, each step checked
//! against the f64 oracle.

mod common;

use std::ffi::{CStr, c_char};
use std::process::Command;

use mla::capi::*;

fn last_error() -> String {
    // SAFETY: mla_last_error returns a valid NUL-terminated string owned by the library.
    unsafe { CStr::from_ptr(mla_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn text(c: &[c_char]) -> String {
    // SAFETY: the library NUL-terminates every string field it writes.
    unsafe { CStr::from_ptr(c.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn good_config() -> MlaPlanConfig {
    MlaPlanConfig {
        max_batch: 4,
        heads: 128,
        s_q: 1,
        page_size: 64,
        max_seq_len: 4096,
        q_dtype: MLA_BF16,
        kv_dtype: MLA_BF16,
        waves: 0,
        tile: 0,
    }
}

/// Succeeds anywhere (no device needed).
fn succeed() {
    let (mut a, mut b, mut c) = (9, 9, 9);
    // SAFETY: valid out pointers.
    assert_eq!(unsafe { mla_get_version(&mut a, &mut b, &mut c) }, MLA_OK);
    assert_eq!(
        format!("{a}.{b}.{c}"),
        env!("CARGO_PKG_VERSION"),
        "mla_get_version"
    );
}

#[test]
fn null_handles_and_arguments_are_named() {
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
    assert_eq!(last_error(), "rt is a null handle");
    let cfg = good_config();
    let mut plan: *mut MlaPlan = std::ptr::null_mut();
    // SAFETY: as above.
    let s = unsafe { mla_plan_create(std::ptr::null(), &cfg, &mut plan) };
    assert_eq!(s, MLA_ERR_INVALID);
    assert_eq!(last_error(), "rt is a null handle");
    // SAFETY: as above.
    let s = unsafe { mla_plan_create(std::ptr::null(), std::ptr::null(), &mut plan) };
    assert_eq!(s, MLA_ERR_INVALID);
    assert_eq!(last_error(), "cfg is a null pointer argument");
    let mut info = std::mem::MaybeUninit::<MlaPlanInfo>::uninit();
    // SAFETY: as above.
    let s = unsafe { mla_plan_info(std::ptr::null(), std::ptr::null(), info.as_mut_ptr()) };
    assert_eq!(
        (s, last_error().as_str()),
        (MLA_ERR_INVALID, "rt is a null handle")
    );
    let mut fault = MlaFault::default();
    // SAFETY: as above.
    let s = unsafe {
        mla_plan_fault(
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null_mut(),
            &mut fault,
        )
    };
    assert_eq!(
        (s, last_error().as_str()),
        (MLA_ERR_INVALID, "rt is a null handle")
    );
    // SAFETY: as above.
    let s =
        unsafe { mla_plan_clear_fault(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()) };
    assert_eq!(s, MLA_ERR_INVALID);
    // SAFETY: as above.
    let s = unsafe {
        mla_schedule_step(
            std::ptr::null(),
            std::ptr::null(),
            0,
            1,
            1,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(
        (s, last_error().as_str()),
        (MLA_ERR_INVALID, "rt is a null handle")
    );
    // SAFETY: as above.
    let s = unsafe {
        mla_decode_run_layer(
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(
        (s, last_error().as_str()),
        (MLA_ERR_INVALID, "rt is a null handle")
    );
    // SAFETY: as above.
    let s = unsafe { mla_merge(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()) };
    assert_eq!(
        (s, last_error().as_str()),
        (MLA_ERR_INVALID, "rt is a null handle")
    );
    for f in [mla_append_kv, mla_gather_kv] {
        // SAFETY: as above.
        let s = unsafe { f(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(
            (s, last_error().as_str()),
            (MLA_ERR_INVALID, "rt is a null handle")
        );
    }
    for f in [mla_append_kv_split, mla_gather_kv_split] {
        // SAFETY: as above.
        let s = unsafe {
            f(
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(
            (s, last_error().as_str()),
            (MLA_ERR_INVALID, "rt is a null handle")
        );
    }
    // SAFETY: as above.
    let s = unsafe { mla_runtime_create(0, std::ptr::null_mut()) };
    assert_eq!(
        (s, last_error().as_str()),
        (MLA_ERR_INVALID, "out is a null pointer argument")
    );
    // SAFETY: null is accepted by the destructors.
    unsafe {
        mla_plan_destroy(std::ptr::null_mut());
        mla_runtime_destroy(std::ptr::null_mut());
    }
}

#[test]
fn a_negative_device_ordinal_is_invalid() {
    let mut rt: *mut MlaRuntime = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    let s = unsafe { mla_runtime_create(-1, &mut rt) };
    assert_eq!(s, MLA_ERR_INVALID, "{}", last_error());
    assert!(last_error().contains("ordinal"), "{}", last_error());
    assert!(last_error().contains("-1"), "{}", last_error());
    assert!(rt.is_null());
    // A destroy leaves the last error for a caller that cleans up before reading it.
    // SAFETY: null handles are ignored.
    unsafe { mla_plan_destroy(std::ptr::null_mut()) };
    assert!(last_error().contains("ordinal"), "{}", last_error());
}

#[test]
fn an_ordinal_past_the_visible_devices() {
    let mut rt: *mut MlaRuntime = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    let s = unsafe { mla_runtime_create(4096, &mut rt) };
    assert!(rt.is_null());
    if s == MLA_ERR_NO_DEVICE {
        eprintln!("no GPU visible: {}", last_error());
    } else {
        // Devices are visible: the ordinal is bad input, named with what is allowed.
        assert_eq!(s, MLA_ERR_INVALID, "{}", last_error());
        assert!(last_error().contains("ordinal"), "{}", last_error());
        assert!(last_error().contains("4096"), "{}", last_error());
    }
}

#[test]
fn plan_config_errors_are_invalid_and_name_the_field() {
    type Edit = fn(&mut MlaPlanConfig);
    let cases: [(&str, &str, Edit); 11] = [
        ("heads", "0", |c| c.heads = 0),
        // A field out of range is named even beside a dtype pair no backend runs
        // (MLA_ERR_UNSUPPORTED is for valid configs).
        ("heads", "0", |c| {
            c.heads = 0;
            c.kv_dtype = MLA_FP16;
        }),
        ("heads", "129", |c| c.heads = 129),
        ("s_q", "9", |c| c.s_q = 9),
        ("s_q", "0", |c| c.s_q = 0),
        ("page_size", "48", |c| c.page_size = 48),
        ("page_size", "512", |c| c.page_size = 512),
        ("max_batch", "0", |c| c.max_batch = 0),
        ("tile", "5", |c| c.tile = 5),
        ("waves", "5", |c| c.waves = 5),
        ("q_dtype", "7", |c| c.q_dtype = 7),
    ];
    // With and without a runtime: the config is checked before the handle.
    let mut rt: *mut MlaRuntime = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    if unsafe { mla_runtime_create(0, &mut rt) } != MLA_OK {
        rt = std::ptr::null_mut();
    }
    for (field, value, edit) in cases {
        let mut cfg = good_config();
        edit(&mut cfg);
        let mut plan: *mut MlaPlan = std::ptr::null_mut();
        // SAFETY: rt is null or live; valid pointers.
        let s = unsafe { mla_plan_create(rt, &cfg, &mut plan) };
        let e = last_error();
        assert_eq!(s, MLA_ERR_INVALID, "{field} = {value}: {e}");
        assert!(
            e.starts_with(&format!("invalid {field}:")) && e.ends_with(&format!("got {value}")),
            "{field} = {value}: {e}"
        );
        assert!(plan.is_null());
        succeed();
        assert_eq!(last_error(), "", "a success leaves no error text");
    }
    // SAFETY: null or a live handle.
    unsafe { mla_runtime_destroy(rt) };
}

#[test]
fn last_error_is_empty_after_a_success() {
    // SAFETY: a null handle is refused.
    let s =
        unsafe { mla_plan_clear_fault(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()) };
    assert_eq!(s, MLA_ERR_INVALID);
    assert!(!last_error().is_empty());
    succeed();
    assert_eq!(last_error(), "");
    // Per thread: another thread's failure leaves this thread's text alone.
    std::thread::spawn(|| {
        // SAFETY: as above.
        unsafe { mla_plan_destroy(std::ptr::null_mut()) };
        // SAFETY: as above.
        let s = unsafe { mla_runtime_create(-3, std::ptr::null_mut()) };
        assert_eq!(s, MLA_ERR_INVALID);
    })
    .join()
    .unwrap();
    assert_eq!(last_error(), "");
}

#[test]
fn statuses_without_a_gpu() {
    let mut rt: *mut MlaRuntime = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    let s = unsafe { mla_runtime_create(0, &mut rt) };
    if s == MLA_OK {
        eprintln!("a GPU is present: the GPU test below covers the device statuses");
        // SAFETY: handle from create.
        unsafe { mla_runtime_destroy(rt) };
    } else {
        assert_eq!(s, MLA_ERR_NO_DEVICE, "{}", last_error());
        assert!(last_error().contains("CUDA"), "{}", last_error());
        assert!(rt.is_null());
    }
}

/// `#define NAME VALUE` lines of the header, values parsed as integers.
fn header_defines() -> Vec<(String, i64)> {
    HEADER
        .lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?.to_string();
            let v = it.next()?.trim_matches(['(', ')']).trim_end_matches('u');
            Some((name, v.parse().ok()?))
        })
        .collect()
}

#[test]
fn header_constants_match_the_rust_ones() {
    let want: Vec<(&str, i64)> = vec![
        ("MLA_OK", MLA_OK as i64),
        ("MLA_ERR_INVALID", MLA_ERR_INVALID as i64),
        ("MLA_ERR_UNSUPPORTED", MLA_ERR_UNSUPPORTED as i64),
        ("MLA_ERR_NO_DEVICE", MLA_ERR_NO_DEVICE as i64),
        ("MLA_ERR_CUDA", MLA_ERR_CUDA as i64),
        ("MLA_ERR_INTERNAL", MLA_ERR_INTERNAL as i64),
        ("MLA_BF16", MLA_BF16 as i64),
        ("MLA_FP16", MLA_FP16 as i64),
        ("MLA_FP8_E4M3", MLA_FP8_E4M3 as i64),
        ("MLA_FAULT_NONE", MLA_FAULT_NONE as i64),
        ("MLA_FAULT_PAGE_ID", MLA_FAULT_PAGE_ID as i64),
        ("MLA_FAULT_SEQ_LEN", MLA_FAULT_SEQ_LEN as i64),
    ];
    let got = header_defines();
    for (name, v) in want {
        assert!(
            got.iter().any(|(n, g)| n == name && *g == v),
            "{name} = {v} not in the header's defines {got:?}"
        );
    }
}

#[test]
fn header_matches_the_rust_structs() {
    use std::mem::{offset_of, size_of};
    let dir = std::env::temp_dir().join(format!("mla-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mla.h"), HEADER).unwrap();
    let src = dir.join("sizes.c");
    let probes = [
        "sizeof(MlaPlanConfig)",
        "offsetof(MlaPlanConfig, tile)",
        "sizeof(MlaDecodeArgs)",
        "offsetof(MlaDecodeArgs, batch)",
        "offsetof(MlaDecodeArgs, page_table_stride)",
        "offsetof(MlaDecodeArgs, softmax_scale)",
        "offsetof(MlaDecodeArgs, kv_scale)",
        "sizeof(MlaPlanInfo)",
        "offsetof(MlaPlanInfo, tactic)",
        "offsetof(MlaPlanInfo, kernels)",
        "offsetof(MlaPlanInfo, workspace_bytes)",
        "offsetof(MlaPlanInfo, checked)",
        "sizeof(MlaFault)",
        "offsetof(MlaFault, value)",
        "sizeof(MlaMergeArgs)",
        "offsetof(MlaMergeArgs, dtype)",
        "offsetof(MlaMergeArgs, lses_rank_stride)",
        "sizeof(MlaSplitArgs)",
        "offsetof(MlaSplitArgs, q_pe)",
        "sizeof(MlaPagedArgs)",
        "offsetof(MlaPagedArgs, batch)",
        "offsetof(MlaPagedArgs, rows_dtype)",
        "offsetof(MlaPagedArgs, page_table_stride)",
        "offsetof(MlaPagedArgs, kv_scale)",
    ];
    let prints: String = probes
        .iter()
        .map(|p| format!("printf(\"%zu \\n\", (size_t){p});"))
        .collect();
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <stddef.h>\n#include \"mla.h\"\n\
             int main(void) {{ {prints} return 0; }}\n"
        ),
    )
    .unwrap();
    let exe = dir.join("sizes");
    let cc = Command::new("cc")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(&dir)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output();
    let Ok(cc) = cc else {
        common::loud("SKIPPED header check: no C compiler (cc)");
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
        size_of::<MlaPlanConfig>(),
        offset_of!(MlaPlanConfig, tile),
        size_of::<MlaDecodeArgs>(),
        offset_of!(MlaDecodeArgs, batch),
        offset_of!(MlaDecodeArgs, page_table_stride),
        offset_of!(MlaDecodeArgs, softmax_scale),
        offset_of!(MlaDecodeArgs, kv_scale),
        size_of::<MlaPlanInfo>(),
        offset_of!(MlaPlanInfo, tactic),
        offset_of!(MlaPlanInfo, kernels),
        offset_of!(MlaPlanInfo, workspace_bytes),
        offset_of!(MlaPlanInfo, checked),
        size_of::<MlaFault>(),
        offset_of!(MlaFault, value),
        size_of::<MlaMergeArgs>(),
        offset_of!(MlaMergeArgs, dtype),
        offset_of!(MlaMergeArgs, lses_rank_stride),
        size_of::<MlaSplitArgs>(),
        offset_of!(MlaSplitArgs, q_pe),
        size_of::<MlaPagedArgs>(),
        offset_of!(MlaPagedArgs, batch),
        offset_of!(MlaPagedArgs, rows_dtype),
        offset_of!(MlaPagedArgs, page_table_stride),
        offset_of!(MlaPagedArgs, kv_scale),
    ];
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got, want, "C sizes/offsets {probes:?} vs Rust");
}

mod gpu {
    use std::sync::Arc;

    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use cudarc::driver::{CudaSlice, CudaStream};
    use mla::DecodeDtypes;
    use mla::capi::*;
    use mla_dev::harness::{self, CaseSpec, DeviceCase, HostCase};
    use mla_dev::rng::SplitMix64;

    use super::{good_config, last_error, text};

    fn args(stream: &CudaStream, h: &HostCase, d: &DeviceCase) -> MlaDecodeArgs {
        let r = d.request(stream, h);
        MlaDecodeArgs {
            q: r.q.ptr,
            kv_cache: r.kv_cache.ptr,
            page_table: r.page_table.ptr,
            seq_lens: r.seq_lens.ptr,
            out: r.out.ptr,
            lse: r.lse.ptr,
            batch: h.seq_lens.len() as u32,
            num_pages: h.num_pages as u32,
            max_pages: h.max_pages as u32,
            _pad: 0,
            page_table_stride: r.page_table.strides[0] as u64,
            kv_page_stride: r.kv_cache.strides[0] as u64,
            softmax_scale: h.scales.softmax_scale,
            output_scale: h.scales.output_scale,
            q_scale: h.scales.q_scale,
            kv_scale: h.scales.kv_scale,
        }
    }

    /// A C runtime handle beside the Rust runtime and a stream, both on device 0; `None`
    /// (skipped loudly, the handle freed) without a GPU.
    fn runtimes(test: &str) -> Option<(*mut MlaRuntime, mla::Runtime, Arc<CudaStream>)> {
        let mut rt: *mut MlaRuntime = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        if unsafe { mla_runtime_create(0, &mut rt) } != MLA_OK {
            crate::common::loud(&format!("SKIPPED GPU test {test}: {}", last_error()));
            return None;
        }
        let Some((rt_rust, stream)) = crate::common::gpu(test) else {
            // SAFETY: a live handle.
            unsafe { mla_runtime_destroy(rt) };
            return None;
        };
        Some((rt, rt_rust, stream))
    }

    /// The gathers' output types from a `cache_t` cache: raw, and dequantised (bf16) from
    /// an fp8 one.
    fn gather_types(cache_t: mla::abi::ElemType) -> Vec<mla::abi::ElemType> {
        use mla::abi::ElemType;
        if cache_t == ElemType::Fp8E4m3 {
            vec![ElemType::Fp8E4m3, ElemType::Bf16]
        } else {
            vec![cache_t]
        }
    }

    /// Two gather outputs of `bytes` each, poisoned alike (0x5a).
    fn poisoned_pair(stream: &Arc<CudaStream>, bytes: usize) -> [CudaSlice<u8>; 2] {
        [
            stream.clone_htod(&vec![0x5au8; bytes]).unwrap(),
            stream.clone_htod(&vec![0x5au8; bytes]).unwrap(),
        ]
    }

    /// The Rust gather into `g[0]` wrote something, and the C one into `g[1]` the same bytes
    /// (`what`: the case's name, `out_t` the output type).
    fn assert_same_gather(
        stream: &Arc<CudaStream>,
        g: &[CudaSlice<u8>; 2],
        what: &str,
        out_t: mla::abi::ElemType,
    ) {
        let (g0, g1): (Vec<u8>, Vec<u8>) = (
            stream.clone_dtoh(&g[0]).unwrap(),
            stream.clone_dtoh(&g[1]).unwrap(),
        );
        assert!(
            g0.iter().any(|&x| x != 0x5a),
            "{what}: the gather wrote nothing"
        );
        assert!(g0 == g1, "{what} to {}: the C gather differs", out_t.name());
    }

    /// Through the C ABI, the pattern a serving stack runs: one plan (bf16, page 64,
    /// H=128: the TMA decode), two caches; eager runs on either mixed with replays of a
    /// graph captured on one of them; every step against the oracle. Then plan info, the
    /// checked mode's fault record and an unsupported config.
    #[test]
    fn eager_runs_and_replays_mix_on_one_plan() {
        let test = "capi_interleave";
        let seed = crate::common::seed(test);
        let Some((rt, _rt_rust, stream)) = runtimes(test) else {
            return;
        };
        let mut rng = SplitMix64::new(seed);
        let lens = vec![3000, 1200, 4000];
        let mk = |rng: &mut SplitMix64| {
            HostCase::random(
                &CaseSpec::new(DecodeDtypes::Bf16, 64, 128, 1, lens.clone()),
                rng,
            )
        };
        let (ha, hb) = (mk(&mut rng), mk(&mut rng));
        let (ra, rb) = (ha.references(), hb.references());
        let mut da = DeviceCase::upload(&stream, &ha).unwrap();
        let mut db = DeviceCase::upload(&stream, &hb).unwrap();
        let cfg = MlaPlanConfig {
            max_batch: 3,
            ..good_config()
        };
        let mut plan: *mut MlaPlan = std::ptr::null_mut();
        // SAFETY: live runtime, valid pointers.
        let s = unsafe { mla_plan_create(rt, &cfg, &mut plan) };
        assert_eq!(s, MLA_OK, "{}", last_error());
        assert_eq!(last_error(), "");
        // SAFETY: live handles.
        assert_eq!(
            unsafe { mla_plan_set_checked(rt, plan, 2) },
            MLA_ERR_INVALID
        );
        assert!(last_error().contains("checked"), "{}", last_error());
        // SAFETY: live handles.
        assert_eq!(unsafe { mla_plan_set_checked(rt, plan, 1) }, MLA_OK);
        let mut info = std::mem::MaybeUninit::<MlaPlanInfo>::uninit();
        // SAFETY: live handles, valid out pointer.
        assert_eq!(
            unsafe { mla_plan_info(rt, plan, info.as_mut_ptr()) },
            MLA_OK
        );
        // SAFETY: written by the call.
        let info = unsafe { info.assume_init() };
        let kernels = text(&info.kernels);
        eprintln!(
            "[{test}] plan: backend {}, tactic {}, kernels {kernels}, workspace {} B",
            text(&info.backend),
            text(&info.tactic),
            info.workspace_bytes
        );
        assert!(kernels.contains("mla_decode"), "{kernels}");
        assert!(info.workspace_bytes > 0 && info.checked == 1);

        let raw = stream.cu_stream() as *mut std::ffi::c_void;
        let (aa, ab) = (args(&stream, &ha, &da), args(&stream, &hb, &db));
        let run = |a: &MlaDecodeArgs| {
            // SAFETY: live handles; the args' buffers live until the stream is synchronised.
            let s = unsafe { mla_decode_run(rt, plan, a, raw) };
            assert_eq!(s, MLA_OK, "{}", last_error());
        };
        // Warm up, then capture a run on A.
        run(&aa);
        stream.synchronize().unwrap();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        run(&aa);
        let graph = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .unwrap()
            .expect("a captured graph");
        let mut failures = Vec::new();
        let steps = [
            "eager A", "eager B", "replay A", "eager B", "replay A", "eager A", "eager B",
            "replay A", "replay A", "eager B",
        ];
        for (i, step) in steps.iter().enumerate() {
            let on_a = step.ends_with('A');
            let (h, d, refs): (&HostCase, &mut DeviceCase, _) = if on_a {
                (&ha, &mut da, &ra)
            } else {
                (&hb, &mut db, &rb)
            };
            d.poison_outputs(&stream).unwrap();
            if step.starts_with("replay") {
                graph.launch().unwrap();
            } else {
                run(if on_a { &aa } else { &ab });
            }
            stream.synchronize().unwrap();
            let got = d.download(&stream, h.spec.dtypes.out()).unwrap();
            let c = harness::check(&got, refs);
            if !c.ok() {
                failures.push(format!("step {i} ({step}): {} | {}", c.out, c.lse));
            }
        }
        let mut fault = MlaFault {
            kind: 99,
            ..MlaFault::default()
        };
        // SAFETY: live handles, valid out pointer.
        assert_eq!(unsafe { mla_plan_fault(rt, plan, raw, &mut fault) }, MLA_OK);
        assert_eq!(fault, MlaFault::default(), "no fault on valid page tables");
        // A page id past num_pages in sequence 1, inside its length: recorded.
        let mut table = ha.page_table.clone();
        let col = 7;
        table[ha.max_pages + col] = ha.num_pages as i32 + 5;
        stream.memcpy_htod(&table, &mut da.table).unwrap();
        run(&aa);
        // SAFETY: as above.
        assert_eq!(unsafe { mla_plan_fault(rt, plan, raw, &mut fault) }, MLA_OK);
        assert_eq!(
            fault,
            MlaFault {
                kind: MLA_FAULT_PAGE_ID,
                sequence: 1,
                column: col as i32,
                value: ha.num_pages as i32 + 5
            }
        );
        // SAFETY: as above.
        assert_eq!(unsafe { mla_plan_clear_fault(rt, plan, raw) }, MLA_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { mla_plan_fault(rt, plan, raw, &mut fault) }, MLA_OK);
        assert_eq!(fault.kind, MLA_FAULT_NONE);

        // A valid config no backend runs here: bf16 q with an fp16 cache.
        let bad = MlaPlanConfig {
            kv_dtype: MLA_FP16,
            ..good_config()
        };
        let mut p2: *mut MlaPlan = std::ptr::null_mut();
        // SAFETY: live runtime, valid pointers.
        let s = unsafe { mla_plan_create(rt, &bad, &mut p2) };
        assert_eq!(s, MLA_ERR_UNSUPPORTED, "{}", last_error());
        // An unchecked plan has no fault record to read.
        let mut p3: *mut MlaPlan = std::ptr::null_mut();
        // SAFETY: as above.
        assert_eq!(
            unsafe { mla_plan_create(rt, &good_config(), &mut p3) },
            MLA_OK
        );
        // SAFETY: as above.
        let s = unsafe { mla_plan_fault(rt, p3, raw, &mut fault) };
        assert_eq!(s, MLA_ERR_INVALID);
        assert!(last_error().contains("checked"), "{}", last_error());
        drop(graph);
        // SAFETY: the plans' work completed (synchronised above); plans before the runtime.
        unsafe {
            mla_plan_destroy(p3);
            mla_plan_destroy(plan);
            mla_runtime_destroy(rt);
        }
        let _keep: Arc<CudaStream> = stream;
        eprintln!(
            "[{test}] {} steps checked, {} failed (seed {seed})",
            steps.len(),
            failures.len()
        );
        assert!(failures.is_empty(), "{failures:#?}");
    }

    /// Where two arguments are bad, the documented one is named: a step slot past
    /// `STEP_SLOTS` before `max_pages`; a merge's `outs_rank_stride` that is not a multiple
    /// of 4 elements even at one rank (where it is never read). A plan runs with a second
    /// runtime of its device (they share the primary context).
    #[test]
    fn the_first_bad_argument_is_named() {
        use mla_dev::harness::device_addr as ptr;
        let test = "capi_first_bad";
        let Some((rt, _rt_rust, stream)) = runtimes(test) else {
            return;
        };
        let mut plan: *mut MlaPlan = std::ptr::null_mut();
        // SAFETY: live runtime, valid pointers.
        assert_eq!(
            unsafe { mla_plan_create(rt, &good_config(), &mut plan) },
            MLA_OK,
            "{}",
            last_error()
        );
        let st = stream.cu_stream() as *mut std::ffi::c_void;
        let lens = stream.clone_htod(&[100i32; 4]).unwrap();
        // SAFETY: live handles; refused before the lengths are read.
        let s = unsafe { mla_schedule_step_slot(rt, plan, 9, ptr(&lens, &stream), 4, 0, st) };
        assert_eq!(s, MLA_ERR_INVALID);
        let e = last_error();
        assert!(
            e.starts_with("invalid slot:") && e.ends_with("got 9"),
            "{e}"
        );
        // The same plan through a second runtime of device 0: accepted.
        let mut rt2: *mut MlaRuntime = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        assert_eq!(unsafe { mla_runtime_create(0, &mut rt2) }, MLA_OK);
        // SAFETY: live handles; the lengths outlive the synchronisation below.
        let s = unsafe { mla_schedule_step_slot(rt2, plan, 1, ptr(&lens, &stream), 4, 2, st) };
        assert_eq!(s, MLA_OK, "{}", last_error());
        stream.synchronize().unwrap();

        let rows = 2 * 16;
        let outs = stream.alloc_zeros::<u16>(rows * 512).unwrap();
        let lses = stream.alloc_zeros::<f32>(rows).unwrap();
        let out = stream.alloc_zeros::<u16>(rows * 512).unwrap();
        let lse = stream.alloc_zeros::<f32>(rows).unwrap();
        let mut args = MlaMergeArgs {
            outs: ptr(&outs, &stream),
            lses: ptr(&lses, &stream),
            out: ptr(&out, &stream),
            lse: ptr(&lse, &stream),
            ranks: 1,
            batch: 2,
            s_q: 1,
            heads: 16,
            dtype: MLA_BF16,
            _pad: 0,
            outs_rank_stride: 3,
            lses_rank_stride: 0,
        };
        // SAFETY: live handle; refused before any pointer is read.
        let s = unsafe { mla_merge(rt, &args, st) };
        assert_eq!(s, MLA_ERR_INVALID);
        let e = last_error();
        assert!(
            e.starts_with("invalid outs_rank_stride:") && e.ends_with("got 3"),
            "{e}"
        );
        args.outs_rank_stride = 0;
        // SAFETY: live handle; the buffers outlive the synchronisation below.
        let s = unsafe { mla_merge(rt, &args, st) };
        assert_eq!(s, MLA_OK, "{}", last_error());
        stream.synchronize().unwrap();
        // SAFETY: the plan's work completed (synchronised); plans before the runtimes.
        unsafe {
            mla_plan_destroy(plan);
            mla_runtime_destroy(rt2);
            mla_runtime_destroy(rt);
        }
        eprintln!("[{test}] passed");
    }

    /// `mla_append_kv` and `mla_gather_kv` write and read the same bytes as the Rust API's
    /// `append_kv` and `gather_kv` on the same inputs: a bf16 cache and an fp8 one (bf16 rows
    /// in, quantised; gathered raw and dequantised), pages of 16, a padding sequence.
    #[test]
    fn paged_append_and_gather_match_the_rust_api() {
        use mla::abi::{D_QK, ElemType};
        use mla::{AppendRequest, GatherRequest, HostMirror, TensorView};
        use mla_dev::harness::device_addr as ptr;
        use mla_dev::numeric;
        let test = "capi_paged";
        let seed = crate::common::seed(test);
        let Some((rt, rt_rust, stream)) = runtimes(test) else {
            return;
        };
        let mut rng = SplitMix64::new(seed);
        let st = stream.cu_stream() as *mut std::ffi::c_void;
        for d in [DecodeDtypes::Bf16, DecodeDtypes::Fp8KvBf16Q] {
            let (page, s_q) = (16usize, 2usize);
            let lens = [37usize, 0, 300];
            // Lengths of at least s_q for the host case; sequence 1 is padding on the device.
            let spec = CaseSpec::new(d, page, 1, s_q, lens.iter().map(|&l| l.max(s_q)).collect());
            let mut h = HostCase::random(&spec, &mut rng);
            h.seq_lens[1] = 0;
            let cache_t = d.kv();
            let new_t = cache_t.append_rows();
            let b = lens.len();
            let new_vals: Vec<f32> = (0..b * s_q * D_QK).map(|_| rng.normal() as f32).collect();
            let new_bytes = numeric::from_f32(new_t, &new_vals);
            let d_new = stream.clone_htod(&new_bytes).unwrap();
            let d_table = stream.clone_htod(&h.page_table).unwrap();
            let d_lens = stream.clone_htod(&h.seq_lens).unwrap();
            let caches = [
                stream.clone_htod(&h.kv_bytes).unwrap(),
                stream.clone_htod(&h.kv_bytes).unwrap(),
            ];
            let kv_view = |i: usize| {
                TensorView::contiguous(ptr(&caches[i], &stream), cache_t, [h.num_pages, page, D_QK])
            };
            let table =
                TensorView::contiguous(ptr(&d_table, &stream), ElemType::I32, [b, h.max_pages]);
            let lens_v = TensorView::contiguous(ptr(&d_lens, &stream), ElemType::I32, [b]);
            // Rust into cache 0.
            rt_rust
                .append_kv(
                    &stream,
                    &AppendRequest {
                        new_kv: TensorView::contiguous(ptr(&d_new, &stream), new_t, [b, s_q, D_QK]),
                        kv_cache: kv_view(0),
                        page_table: table,
                        seq_lens: lens_v,
                        kv_scale: h.scales.kv_scale,
                        host: HostMirror::default(),
                    },
                )
                .unwrap();
            // C into cache 1.
            let mut a = MlaPagedArgs {
                rows: ptr(&d_new, &stream),
                kv_cache: kv_view(1).ptr,
                page_table: table.ptr,
                seq_lens: lens_v.ptr,
                batch: b as u32,
                n: s_q as u32,
                num_pages: h.num_pages as u32,
                max_pages: h.max_pages as u32,
                page_size: page as u32,
                kv_dtype: cache_t as u32,
                rows_dtype: new_t as u32,
                _pad: 0,
                page_table_stride: 0,
                kv_page_stride: 0,
                kv_scale: h.scales.kv_scale,
                _pad2: 0,
            };
            // SAFETY: live handle; the buffers outlive the synchronisation below.
            let s = unsafe { mla_append_kv(rt, &a, st) };
            assert_eq!(s, MLA_OK, "{}", last_error());
            let c0: Vec<u8> = stream.clone_dtoh(&caches[0]).unwrap();
            let c1: Vec<u8> = stream.clone_dtoh(&caches[1]).unwrap();
            assert!(c0 != h.kv_bytes, "{}: the append wrote nothing", d.name());
            assert!(
                c0 == c1,
                "{}: the C append differs from the Rust one",
                d.name()
            );
            // Gather from cache 1, raw and (fp8) dequantised, both ways.
            let n = 310usize;
            for out_t in gather_types(cache_t) {
                let g = poisoned_pair(&stream, b * n * D_QK * out_t.size());
                rt_rust
                    .gather_kv(
                        &stream,
                        &GatherRequest {
                            kv_cache: kv_view(1),
                            page_table: table,
                            seq_lens: lens_v,
                            out: TensorView::contiguous(ptr(&g[0], &stream), out_t, [b, n, D_QK]),
                            kv_scale: h.scales.kv_scale,
                            host: HostMirror::default(),
                        },
                    )
                    .unwrap();
                a.rows = ptr(&g[1], &stream);
                a.n = n as u32;
                a.rows_dtype = out_t as u32;
                // SAFETY: as above.
                let s = unsafe { mla_gather_kv(rt, &a, st) };
                assert_eq!(s, MLA_OK, "{}", last_error());
                assert_same_gather(&stream, &g, d.name(), out_t);
            }
        }
        // SAFETY: all work synchronised (the copies above); a live handle.
        unsafe { mla_runtime_destroy(rt) };
    }

    /// `mla_append_kv_split` and `mla_gather_kv_split` write and read the same bytes as the
    /// Rust API's `append_kv_split` and `gather_kv_split` on a split cache with padded token
    /// strides (512-wide part 528 apart, rope part 80 apart): bf16 and fp8 (bf16 rows in,
    /// gathered raw and dequantised), pages of 16, a padding sequence.
    #[test]
    fn split_paged_calls_match_the_rust_api() {
        use mla::abi::{D_QK, D_V, ElemType};
        use mla::{AppendRequest, GatherRequest, HostMirror, TensorView};
        use mla_dev::harness::device_addr as ptr;
        use mla_dev::numeric;
        let test = "capi_paged_split";
        let seed = crate::common::seed(test);
        let Some((rt, rt_rust, stream)) = runtimes(test) else {
            return;
        };
        let mut rng = SplitMix64::new(seed);
        let st = stream.cu_stream() as *mut std::ffi::c_void;
        let (kv_tok, pe_tok, rope) = (528usize, 80usize, D_QK - D_V);
        for cache_t in [ElemType::Bf16, ElemType::Fp8E4m3] {
            let (page, n_new, num_pages, max_pages) = (16usize, 2usize, 64usize, 20usize);
            let lens = [37i32, 0, 300];
            let b = lens.len();
            // Each sequence its own pages, in a shuffled order.
            let mut pages: Vec<i32> = (0..num_pages as i32).collect();
            for i in (1..pages.len()).rev() {
                pages.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            let table: Vec<i32> = pages[..b * max_pages].to_vec();
            let new_t = cache_t.append_rows();
            let new_vals: Vec<f32> = (0..b * n_new * D_QK).map(|_| rng.normal() as f32).collect();
            let d_new = stream
                .clone_htod(&numeric::from_f32(new_t, &new_vals))
                .unwrap();
            let d_table = stream.clone_htod(&table).unwrap();
            let d_lens = stream.clone_htod(&lens).unwrap();
            let fill = |len: usize, rng: &mut SplitMix64| -> Vec<u8> {
                (0..len).map(|_| rng.next_u64() as u8).collect()
            };
            let kv_bytes = fill(num_pages * page * kv_tok * cache_t.size(), &mut rng);
            let pe_bytes = fill(num_pages * page * pe_tok * cache_t.size(), &mut rng);
            let kv = [
                stream.clone_htod(&kv_bytes).unwrap(),
                stream.clone_htod(&kv_bytes).unwrap(),
            ];
            let pe = [
                stream.clone_htod(&pe_bytes).unwrap(),
                stream.clone_htod(&pe_bytes).unwrap(),
            ];
            let kv_view = |i: usize| {
                TensorView::strided(
                    ptr(&kv[i], &stream),
                    cache_t,
                    [num_pages, page, D_V],
                    [page * kv_tok, kv_tok, 1],
                )
            };
            let pe_view = |i: usize| {
                TensorView::strided(
                    ptr(&pe[i], &stream),
                    cache_t,
                    [num_pages, page, rope],
                    [page * pe_tok, pe_tok, 1],
                )
            };
            let table_v =
                TensorView::contiguous(ptr(&d_table, &stream), ElemType::I32, [b, max_pages]);
            let lens_v = TensorView::contiguous(ptr(&d_lens, &stream), ElemType::I32, [b]);
            let kv_scale = if cache_t == ElemType::Fp8E4m3 {
                0.25
            } else {
                1.0
            };
            rt_rust
                .append_kv_split(
                    &stream,
                    &AppendRequest {
                        new_kv: TensorView::contiguous(
                            ptr(&d_new, &stream),
                            new_t,
                            [b, n_new, D_QK],
                        ),
                        kv_cache: kv_view(0),
                        page_table: table_v,
                        seq_lens: lens_v,
                        kv_scale,
                        host: HostMirror::default(),
                    },
                    &pe_view(0),
                )
                .unwrap();
            let mut a = MlaPagedArgs {
                rows: ptr(&d_new, &stream),
                kv_cache: kv_view(1).ptr,
                page_table: table_v.ptr,
                seq_lens: lens_v.ptr,
                batch: b as u32,
                n: n_new as u32,
                num_pages: num_pages as u32,
                max_pages: max_pages as u32,
                page_size: page as u32,
                kv_dtype: cache_t as u32,
                rows_dtype: new_t as u32,
                _pad: 0,
                page_table_stride: 0,
                kv_page_stride: 0,
                kv_scale,
                _pad2: 0,
            };
            let sp = MlaSplitArgs {
                kpe_cache: pe_view(1).ptr,
                kpe_page_stride: 0,
                kpe_token_stride: pe_tok as u64,
                kv_token_stride: kv_tok as u64,
                q_pe: 0,
            };
            // SAFETY: live handle; the buffers outlive the synchronisation below.
            let s = unsafe { mla_append_kv_split(rt, &a, &sp, st) };
            assert_eq!(s, MLA_OK, "{}", last_error());
            for (name, pair, before) in [("kv", &kv, &kv_bytes), ("kpe", &pe, &pe_bytes)] {
                let c0: Vec<u8> = stream.clone_dtoh(&pair[0]).unwrap();
                let c1: Vec<u8> = stream.clone_dtoh(&pair[1]).unwrap();
                assert!(
                    c0 != *before,
                    "{}: the append wrote no {name}",
                    cache_t.name()
                );
                assert!(
                    c0 == c1,
                    "{}: the C append's {name} differs",
                    cache_t.name()
                );
            }
            // q_pe is refused by name.
            let with_q = MlaSplitArgs { q_pe: 0x1000, ..sp };
            // SAFETY: as above; refused before any device pointer is touched.
            let s = unsafe { mla_append_kv_split(rt, &a, &with_q, st) };
            assert_eq!(s, MLA_ERR_INVALID);
            assert!(last_error().contains("split.q_pe"), "{}", last_error());
            let n = 310usize;
            for out_t in gather_types(cache_t) {
                let g = poisoned_pair(&stream, b * n * D_QK * out_t.size());
                rt_rust
                    .gather_kv_split(
                        &stream,
                        &GatherRequest {
                            kv_cache: kv_view(1),
                            page_table: table_v,
                            seq_lens: lens_v,
                            out: TensorView::contiguous(ptr(&g[0], &stream), out_t, [b, n, D_QK]),
                            kv_scale,
                            host: HostMirror::default(),
                        },
                        &pe_view(1),
                    )
                    .unwrap();
                a.rows = ptr(&g[1], &stream);
                a.n = n as u32;
                a.rows_dtype = out_t as u32;
                // SAFETY: as above.
                let s = unsafe { mla_gather_kv_split(rt, &a, &sp, st) };
                assert_eq!(s, MLA_OK, "{}", last_error());
                assert_same_gather(&stream, &g, cache_t.name(), out_t);
            }
        }
        eprintln!("[{test}] passed (seed {seed})");
        // SAFETY: all work synchronised (the copies above); a live handle.
        unsafe { mla_runtime_destroy(rt) };
    }
}

#[cfg(feature = "nccl")]
#[test]
fn context_parallel_handles_are_checked() {
    // SAFETY: null handles and arguments are what is being checked; no pointer is read.
    unsafe {
        assert_eq!(mla_cp_unique_id(std::ptr::null_mut()), MLA_ERR_INVALID);
        assert!(last_error().contains("id"), "{}", last_error());
        let mut id = [0u8; 128];
        let s = mla_cp_unique_id(id.as_mut_ptr());
        // Without NCCL on the loader's path the transport is unsupported, and says why.
        assert!(
            s == MLA_OK || s == MLA_ERR_UNSUPPORTED,
            "{s}: {}",
            last_error()
        );
        if s == MLA_ERR_UNSUPPORTED {
            assert!(last_error().contains("NCCL"), "{}", last_error());
        }
        let mut cp: *mut MlaCp = std::ptr::null_mut();
        let s = mla_cp_create(
            std::ptr::null(),
            0,
            1,
            id.as_ptr(),
            16,
            MLA_BF16,
            1000,
            &mut cp,
        );
        assert_eq!(s, MLA_ERR_INVALID);
        assert!(last_error().contains("rt"), "{}", last_error());
        assert_eq!(
            mla_cp_wait(std::ptr::null_mut(), std::ptr::null_mut()),
            MLA_ERR_INVALID
        );
        assert!(last_error().contains("cp"), "{}", last_error());
        let s = mla_cp_decode(
            std::ptr::null(),
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            0,
            std::ptr::null_mut(),
        );
        assert_eq!(s, MLA_ERR_INVALID);
        mla_cp_destroy(std::ptr::null_mut());
    }
}

/// The `mla_*` names in `text` that `before` directly precedes (`fn ` for the Rust
/// exports, a return type for the header's prototypes).
fn names_after(text: &str, before: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            before.iter().find_map(|b| l.strip_prefix(b))
        })
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            name.starts_with("mla_").then_some(name)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn header_declares_every_export() {
    let rust = [
        include_str!("../src/capi.rs"),
        include_str!("../src/capi_cp.rs"),
    ]
    .concat();
    let exported = names_after(
        &rust,
        &["pub unsafe extern \"C\" fn ", "pub extern \"C\" fn "],
    );
    let declared = names_after(HEADER, &["int ", "void ", "const char *"]);
    assert!(exported.len() >= 20, "{exported:?}");
    assert_eq!(
        exported, declared,
        "the C exports and the header's prototypes"
    );
}
