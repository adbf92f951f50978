//! The per-step host work of `DecodePlan::run` is validation plus launches; validation of a
//! valid request must not allocate (serving loops call it every step, also under graph
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
fn validating_a_valid_request_allocates_nothing() {
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
        let before = ALLOCS.load(Ordering::SeqCst);
        let shape = validate_decode(&req);
        let after = ALLOCS.load(Ordering::SeqCst);
        assert!(shape.is_ok(), "{shape:?}");
        assert_eq!(
            after - before,
            0,
            "validate_decode allocated {} times for {dq:?}/{dkv:?}",
            after - before
        );
    }
}
