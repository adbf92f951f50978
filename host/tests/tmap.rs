//! What the TMA decode takes (`tmap::tma_unsupported`, `tmap::tma_pays`), CPU only: each
//! case starts from a request it takes and breaks one thing. (Encoding the map needs the
//! driver; the GPU tests run it.)

use mla_abi::{D_QK, D_V, ElemType};
use mla_host::request::*;
use mla_host::tensor::TensorView;
use mla_host::tmap::{tma_pays, tma_unsupported};

const B: usize = 2;
const H: usize = 128;
const PAGES: usize = 40;
const MAX_PAGES: usize = 16;

fn req(d: DecodeDtypes, page: usize) -> (DecodeRequest<'static>, DecodeShape) {
    let r = DecodeRequest {
        q: TensorView::contiguous(0x1000_0000, d.q(), [B, 1, H, D_QK]),
        kv_cache: TensorView::contiguous(0x2000_0000, d.kv(), [PAGES, page, D_QK]),
        page_table: TensorView::contiguous(0x3000_0000, ElemType::I32, [B, MAX_PAGES]),
        seq_lens: TensorView::contiguous(0x4000_0000, ElemType::I32, [B]),
        out: TensorView::contiguous(0x5000_0000, d.out(), [B, 1, H, D_V]),
        lse: TensorView::contiguous(0x6000_0000, ElemType::F32, [B, 1, H]),
        scales: Scales::default_for_mla(),
        host: HostMirror {
            seq_lens: None,
            page_table: None,
        },
    };
    let shape = DecodeShape {
        batch: B,
        s_q: 1,
        heads: H,
        page_size: page,
        num_pages: PAGES,
        max_pages: MAX_PAGES,
        dtypes: d,
    };
    (r, shape)
}

#[test]
fn bf16_and_fp8_kv_pages_of_16_and_more_are_taken() {
    for d in [DecodeDtypes::Bf16, DecodeDtypes::Fp8KvBf16Q] {
        for page in [16, 32, 64, 128, 256] {
            let (r, s) = req(d, page);
            assert_eq!(tma_unsupported(&r, &s), None, "{d:?} page {page}");
        }
    }
}

#[test]
fn other_dtypes_small_pages_and_unaligned_caches_are_not() {
    let (r, s) = req(DecodeDtypes::Fp16, 64);
    assert!(tma_unsupported(&r, &s).is_some());
    // fp8 Q with an fp8 cache takes it (Q widens as it loads).
    let (r, s) = req(DecodeDtypes::Fp8, 64);
    assert_eq!(tma_unsupported(&r, &s), None);
    // An fp8-cache request whose cache tensor is not fp8, and the reverse.
    for d in [DecodeDtypes::Fp8KvBf16Q, DecodeDtypes::Fp8] {
        let (mut r, s) = req(d, 64);
        r.kv_cache.dtype = ElemType::Bf16;
        assert!(tma_unsupported(&r, &s).is_some(), "{d:?}");
    }
    let (mut r, s) = req(DecodeDtypes::Bf16, 64);
    r.kv_cache.dtype = ElemType::Fp8E4m3;
    assert!(tma_unsupported(&r, &s).is_some());
    for d in [
        DecodeDtypes::Bf16,
        DecodeDtypes::Fp8KvBf16Q,
        DecodeDtypes::Fp8,
    ] {
        for page in [1, 2, 4, 8] {
            let (r, s) = req(d, page);
            assert!(tma_unsupported(&r, &s).is_some(), "{d:?} page {page}");
        }
    }
    // A cache 2 bytes off a 16-byte boundary.
    let (mut r, s) = req(DecodeDtypes::Bf16, 64);
    r.kv_cache.ptr += 2;
    assert!(tma_unsupported(&r, &s).is_some());
    // Token rows 577 elements apart (1154 bytes: not a multiple of 16).
    let (mut r, s) = req(DecodeDtypes::Bf16, 64);
    r.kv_cache.strides = [64 * 577, 577, 1];
    assert!(tma_unsupported(&r, &s).is_some());
    // Padded rows keep 16-byte strides, but only contiguous caches are checked on the GPU.
    r.kv_cache.strides = [64 * 584, 584, 1];
    assert!(tma_unsupported(&r, &s).is_some());
    r.kv_cache.strides = [65 * D_QK, D_QK, 1];
    assert!(tma_unsupported(&r, &s).is_some());
}

#[test]
fn one_block_per_split_keeps_the_cp_async_decode() {
    for d in [
        DecodeDtypes::Bf16,
        DecodeDtypes::Fp16,
        DecodeDtypes::Fp8KvBf16Q,
    ] {
        assert!(!tma_pays(d, 4096, 64));
        assert!(tma_pays(d, 4096, 32));
        assert!(tma_pays(d, 128, 1));
        assert!(!tma_pays(d, 64, 1));
    }
    // fp8 Q takes the TMA decode at any split length.
    assert!(tma_pays(DecodeDtypes::Fp8, 4096, 64));
    assert!(tma_pays(DecodeDtypes::Fp8, 64, 1));
}
