//! Typed views of device tensors: a device address, an element type, a shape and strides
//! (in elements). Views borrow nothing: the caller keeps the memory alive for the call.

use mla_abi::ElemType;

/// A rank-`R` device tensor view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorView<const R: usize> {
    /// Device address of element `[0, .., 0]`.
    pub ptr: u64,
    pub dtype: ElemType,
    pub shape: [usize; R],
    /// Strides in elements.
    pub strides: [usize; R],
}

impl<const R: usize> TensorView<R> {
    /// A row-major contiguous view.
    pub fn contiguous(ptr: u64, dtype: ElemType, shape: [usize; R]) -> Self {
        let mut strides = [0usize; R];
        let mut s = 1usize;
        for i in (0..R).rev() {
            strides[i] = s;
            s = s.saturating_mul(shape[i]);
        }
        Self {
            ptr,
            dtype,
            shape,
            strides,
        }
    }

    /// A view with explicit strides (in elements).
    pub fn strided(ptr: u64, dtype: ElemType, shape: [usize; R], strides: [usize; R]) -> Self {
        Self {
            ptr,
            dtype,
            shape,
            strides,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The byte range `[ptr, ptr + span)` that the view can touch, or `None` if it is
    /// empty or its extent overflows `u64`.
    pub fn byte_span(&self) -> Option<(u64, u64)> {
        if self.shape.contains(&0) {
            return None;
        }
        let mut last = 0u64;
        for i in 0..R {
            let step = (self.shape[i] as u64 - 1).checked_mul(self.strides[i] as u64)?;
            last = last.checked_add(step)?;
        }
        let end = last
            .checked_add(1)?
            .checked_mul(self.dtype.size() as u64)?
            .checked_add(self.ptr)?;
        Some((self.ptr, end))
    }
}
