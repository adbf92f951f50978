//! Phase stamps of the TMA decodes with a bf16 cache, in builds with `--cfg mla_trace`
//! (`MLA_TRACE=1` at build time; a measurement build, never the product's): thread 0 of each
//! CTA writes `%globaltimer` (ns) at its entry and at each cell's start, prologue end (the
//! 64-row decode: the first S done; the small-row decode: the Q tile loaded), block-loop end
//! and epilogue end into the CTA's slots of the promotion scratch
//! (`DecodeParams::acc`, which the bf16 kernels leave unused otherwise), in the layout of
//! [`mla_abi::trace`]. The dev CLI reads them back (`MLA_TRACE_PRINT=1 mla bench`). Without
//! the cfg every call is empty.

use mla_abi::DecodeParams;
pub(crate) use mla_abi::trace::{CELLS, MAGIC};

/// Word `w` of this CTA's record, written by thread 0 only.
#[inline(always)]
#[allow(unused_variables)]
pub(crate) fn put(p: &DecodeParams, w: u32, v: u64) {
    #[cfg(mla_trace)]
    if crate::arch::thread_idx_x() == 0 {
        let cta = crate::arch::block_idx_x() as usize;
        let at = p.acc.addr() as usize + cta * mla_abi::ACC_FLOATS_PER_CTA * 4 + 8 * w as usize;
        // SAFETY: the scratch holds ACC_FLOATS_PER_CTA floats for every launched CTA, and
        // the record's words (`mla_abi::trace::WORDS`) fit one CTA's share.
        unsafe {
            core::arch::asm!("st.volatile.global.u64 [{a}], {v};", a = in(reg64) at as u64,
                v = in(reg64) v, options(nostack))
        }
    }
}

/// `%globaltimer` (ns) in trace builds; 0 otherwise.
#[inline(always)]
pub(crate) fn now() -> u64 {
    #[cfg(mla_trace)]
    {
        let t: u64;
        // SAFETY: a special-register read.
        unsafe {
            core::arch::asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack))
        };
        t
    }
    #[cfg(not(mla_trace))]
    0
}

/// Word 2: the cells recorded so far (`n`), with the SM's `%smid` in the high half (which
/// SMs a tail's CTAs ran on).
#[inline(always)]
#[allow(unused_variables)]
pub(crate) fn cells_done(p: &DecodeParams, n: u32) {
    #[cfg(mla_trace)]
    {
        let sm: u32;
        // SAFETY: a special-register read.
        unsafe {
            core::arch::asm!("mov.u32 {s}, %smid;", s = out(reg32) sm, options(nomem, nostack))
        };
        put(p, 2, ((sm as u64) << 32) | n.min(CELLS) as u64);
    }
}

/// A CTA's entry: the record's magic, the entry stamp, no cells yet.
#[inline(always)]
pub(crate) fn begin(p: &DecodeParams) {
    if cfg!(mla_trace) {
        put(p, 0, MAGIC);
        put(p, 1, now());
        cells_done(p, 0);
    }
}

/// Cell `cell`'s start (of sequence `b`, `blocks` KV blocks): its header and stamp 0.
#[inline(always)]
pub(crate) fn cell_begin(p: &DecodeParams, cell: u32, b: u32, blocks: u32) {
    if cfg!(mla_trace) && cell < CELLS {
        put(p, 3 + 5 * cell, ((b as u64) << 32) | blocks as u64);
        cell_stamp(p, cell, 0);
    }
}

/// Cell `*cell`'s end: stamp 3, then the count of cells done (and the SM) moves on.
#[inline(always)]
pub(crate) fn cell_end(p: &DecodeParams, cell: &mut u32) {
    if cfg!(mla_trace) {
        cell_stamp(p, *cell, 3);
        *cell += 1;
        cells_done(p, *cell);
    }
}

/// Stamp `k` (0..4) of recorded cell `cell` (cells past [`CELLS`] are not recorded).
#[inline(always)]
pub(crate) fn cell_stamp(p: &DecodeParams, cell: u32, k: u32) {
    if cfg!(mla_trace) && cell < CELLS {
        put(p, 3 + 5 * cell + 1 + k, now());
    }
}
