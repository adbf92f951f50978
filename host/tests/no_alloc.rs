//! The per-step host work of `DecodePlan::run` is validation, the backend check and the
//! launches; validating and checking a valid request must not allocate (serving loops call it every step, also under graph
//! capture). A counting global allocator checks it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use mla_abi::{D_QK, D_V, ElemType};
use mla_host::validate::validate_decode;
use mla_host::{DecodeRequest, HostMirror, Scales, TensorView};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn validating_and_gating_a_valid_request_allocates_nothing() {
    let base = 0x7000_0000_0000u64;
    let gb = 1u64 << 32;
    for (dq, dkv, dout) in [
        (ElemType::Bf16, ElemType::Bf16, ElemType::Bf16),
        (ElemType::Fp16, ElemType::Fp16, ElemType::Fp16),
        (ElemType::Bf16, ElemType::Fp8E4m3, ElemType::Bf16),
        (ElemType::Fp8E4m3, ElemType::Fp8E4m3, ElemType::Bf16),
    ] {
        let mut scales = Scales::default_for_mla();
        if dkv == ElemType::Fp8E4m3 {
            scales.kv_scale = 0.01;
        }
        let (b, s, h) = (64, 2, 128);
        let req = DecodeRequest {
            q: TensorView::contiguous(base, dq, [b, s, h, D_QK]),
            kv_cache: TensorView::contiguous(base + gb, dkv, [4096, 64, D_QK]),
            page_table: TensorView::contiguous(base + 2 * gb, ElemType::I32, [b, 64]),
            seq_lens: TensorView::contiguous(base + 3 * gb, ElemType::I32, [b]),
            out: TensorView::contiguous(base + 4 * gb, dout, [b, s, h, D_V]),
            lse: TensorView::contiguous(base + 5 * gb, ElemType::F32, [b, s, h]),
            scales,
            host: HostMirror::default(),
        };
        let device = mla_host::DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            smem_per_block_optin: 232_448,
            smem_per_sm: 233_472,
            l2_bytes: 60 << 20,
            driver_version: 13000,
        };
        let before = ALLOCS.load(Ordering::SeqCst);
        let shape = validate_decode(&req);
        let supported = shape.as_ref().map(|s| {
            mla_host::gate::is_supported(mla_host::gate::Backend::Sm90a, &device, s).is_ok()
        });
        let after = ALLOCS.load(Ordering::SeqCst);
        assert!(shape.is_ok(), "{shape:?}");
        assert_eq!(supported.ok(), Some(true));
        assert_eq!(
            after - before,
            0,
            "validate_decode + is_supported allocated {} times for {dq:?}/{dkv:?}",
            after - before
        );
    }
}
