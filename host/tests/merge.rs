//! Rank-merge validation on the CPU: a valid request passes, and each broken field is a
//! typed error that names it (before any device pointer is touched).

use mla_abi::{D_V, ElemType};
use mla_host::MlaError;
use mla_host::request::MergeRequest;
use mla_host::tensor::TensorView;
use mla_host::validate::validate_merge;

const R: usize = 3;
const B: usize = 2;
const S: usize = 2;
const H: usize = 16;

fn req() -> MergeRequest {
    MergeRequest {
        outs: TensorView::contiguous(0x1000_0000, ElemType::Bf16, [R, B, S, H, D_V]),
        lses: TensorView::contiguous(0x2000_0000, ElemType::F32, [R, B, S, H]),
        out: TensorView::contiguous(0x3000_0000, ElemType::Bf16, [B, S, H, D_V]),
        lse: TensorView::contiguous(0x4000_0000, ElemType::F32, [B, S, H]),
    }
}

fn field_of(e: &MlaError) -> String {
    match e {
        MlaError::InvalidShape { field, .. }
        | MlaError::DtypeMismatch { field, .. }
        | MlaError::NullPointer { field }
        | MlaError::Misaligned { field, .. } => field.to_string(),
        MlaError::Aliasing { a, b } => format!("{a}/{b}"),
        other => format!("{other:?}"),
    }
}

#[test]
fn a_valid_merge_passes() {
    let s = validate_merge(&req()).unwrap();
    assert_eq!((s.ranks, s.rows, s.dtype), (R, B * S * H, ElemType::Bf16));
    // Ranks further apart than one block (a padded stack) are fine too.
    let mut r = req();
    r.outs.strides[0] += 4;
    r.lses.strides[0] += 1;
    validate_merge(&r).unwrap();
}

#[test]
fn each_broken_field_is_named() {
    type Edit = fn(&mut MergeRequest);
    let cases: [(&str, Edit); 12] = [
        ("outs.shape[0] (ranks)", |r| r.outs.shape[0] = 0),
        ("outs.shape[0] (ranks)", |r| {
            r.outs = TensorView::contiguous(r.outs.ptr, ElemType::Bf16, [65, B, S, H, D_V]);
            r.lses = TensorView::contiguous(r.lses.ptr, ElemType::F32, [65, B, S, H]);
        }),
        ("outs.shape[4] (D_V)", |r| r.outs.shape[4] = 576),
        ("outs", |r| r.outs.dtype = ElemType::F32),
        ("lses.shape[3] (heads)", |r| r.lses.shape[3] = 8),
        ("lses", |r| r.lses.dtype = ElemType::Bf16),
        ("out", |r| r.out.dtype = ElemType::Fp16),
        ("out.strides[2] (head)", |r| r.out.strides[2] = 1024),
        ("outs.strides[3] (head)", |r| r.outs.strides[3] = 1024),
        ("outs", |r| r.outs.ptr += 2),
        ("lse", |r| r.lse.ptr = 0),
        ("out/outs", |r| r.out.ptr = r.outs.ptr),
    ];
    for (want, edit) in cases {
        let mut r = req();
        edit(&mut r);
        let e = validate_merge(&r).expect_err(want);
        assert_eq!(field_of(&e), want, "{e}");
    }
}

#[test]
fn an_output_of_another_shape_names_the_inputs() {
    let mut r = req();
    r.out = TensorView::contiguous(r.out.ptr, ElemType::Bf16, [B + 1, S, H, D_V]);
    let e = validate_merge(&r).expect_err("out batch");
    let text = e.to_string();
    assert_eq!(field_of(&e), "out.shape[0] (batch)", "{text}");
    assert!(text.contains("outs.shape[1]"), "{text}");
    assert!(!text.contains("q.shape"), "{text}");
}
