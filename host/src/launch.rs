//! The only place that launches kernels: one safe function per kernel family, each of which
//! validates its request first and touches no device pointer before that succeeded.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, result};
use mla_abi::kernels::{Kernel, Params};
use mla_abi::{
    AppendParams, CombineParams, DecodeParams, DevPtr, ElemType, GatherParams, MAX_SPLITS,
    MergeParams, combine_tile, names, paged_tile,
};

use crate::choice::{DecodeKernels, spec};
use crate::error::{MlaError, Result};
use crate::module::Runtime;
use crate::plan::WorkspaceCapacity;
use crate::request::{
    AppendRequest, DecodeRequest, DecodeShape, GatherRequest, MergeRequest, MergeShape, PagedShape,
    SplitParts,
};
use crate::tactic::Tile;
use crate::tensor::TensorView;
use crate::validate::{
    validate_append_split, validate_decode, validate_gather_split, validate_merge,
};

/// Largest grid y / z dimension.
pub(crate) const MAX_GRID_YZ: usize = 65535;

/// Scheduled steps a plan holds at once (its step slots: micro-batches whose steps are
/// scheduled ahead of their layers, `DecodePlan::schedule_step_slot`).
pub const STEP_SLOTS: usize = 4;

/// Which split-count array of a workspace a launch reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counts {
    /// The runs' (`DecodePlan::run`: each run schedules, then reads).
    Runs,
    /// Scheduled step slot `k < STEP_SLOTS` (`schedule_step` writes, `run_layer` reads).
    Step(usize),
}

/// Split-KV workspace of a decode: partial outputs and LSE for up to `capacity`, plus
/// `1 + STEP_SLOTS` device arrays of per-sequence split counts ([`Counts`]): `[0, batch)`
/// for runs, then one per scheduled step (`schedule_step` and its `run_layer`s), so an
/// eager run between a step's schedule and its layers does not replace the step's counts,
/// and steps of several batches can be scheduled ahead of their layers. Allocated once
/// (outside any graph capture); sized by capacity, not by the live batch, so it can be
/// reused as batches change.
pub struct DecodeWorkspace {
    /// Freed only once the context has synchronized (see the `Drop` impl).
    bufs: ManuallyDrop<WorkspaceBuffers>,
    acc_ctas: usize,
    /// Decodes on this workspace run in checked mode (they get the fault record).
    pub(crate) checked: bool,
    /// The rank's share of the KV that decodes on this workspace read ([`mla_abi::Shard`]).
    pub(crate) shard: mla_abi::Shard,
    /// Device addresses of the three buffers, taken once the allocation completed, so that
    /// launches (also on a caller's raw stream, also under graph capture) need no cudarc call.
    ptrs: WorkspacePtrs,
    capacity: WorkspaceCapacity,
    /// Largest split count of the last `set_splits` (the decode grid's x dimension).
    grid_splits: usize,
    /// Entries written by the last `set_splits`.
    splits_len: usize,
}

/// The workspace's device buffers.
struct WorkspaceBuffers {
    partial_o: CudaSlice<f32>,
    _partial_lse: CudaSlice<f32>,
    num_splits: CudaSlice<i32>,
    /// The checked mode's fault record (`mla_abi::fault`), zero until a checked decode
    /// meets a fault.
    _fault: CudaSlice<i32>,
    /// The e4m3 TMA decode's promotion scratch ([`mla_abi::DecodeParams::acc`]), for
    /// `acc_ctas` persistent CTAs (the device's SM count).
    acc: CudaSlice<f32>,
}

impl DecodeWorkspace {
    pub fn new(stream: &Arc<CudaStream>, capacity: WorkspaceCapacity) -> Result<Self> {
        let max_rows = (mla_abi::MAX_HEADS * mla_abi::MAX_S_Q) as usize;
        if !(1..=MAX_GRID_YZ).contains(&capacity.batch)
            || !(1..=max_rows).contains(&capacity.rows)
            || !(1..=MAX_SPLITS as usize).contains(&capacity.max_splits)
        {
            return Err(MlaError::shape(
                "workspace capacity",
                format!(
                    "batch in 1..={MAX_GRID_YZ}, rows in 1..={max_rows}, max_splits in 1..={MAX_SPLITS}"
                ),
                format!("{capacity:?}"),
            ));
        }
        let alloc_err = |what: &'static str, len: usize, e| MlaError::Alloc {
            what,
            bytes: len as u64 * 4,
            source: e,
        };
        // At least one element each: the kernels get valid (never dereferenced) pointers
        // where a one-split plan needs no partials.
        let (po_len, pl_len) = (
            capacity.partial_o_len().max(1),
            capacity.partial_lse_len().max(1),
        );
        let po = stream
            .alloc_zeros(po_len)
            .map_err(|e| alloc_err("workspace partial_o", po_len, e))?;
        let pl = stream
            .alloc_zeros(pl_len)
            .map_err(|e| alloc_err("workspace partial_lse", pl_len, e))?;
        let ns = stream
            .alloc_zeros((1 + STEP_SLOTS) * capacity.batch)
            .map_err(|e| alloc_err("workspace num_splits", (1 + STEP_SLOTS) * capacity.batch, e))?;
        let fault = stream
            .alloc_zeros::<i32>(mla_abi::fault::WORDS)
            .map_err(|e| alloc_err("workspace fault record", mla_abi::fault::WORDS, e))?;
        let acc_ctas = stream
            .context()
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?
            .max(1) as usize;
        let acc_len = acc_ctas * mla_abi::ACC_FLOATS_PER_CTA;
        let acc = stream
            .alloc_zeros::<f32>(acc_len)
            .map_err(|e| alloc_err("workspace promotion scratch", acc_len, e))?;
        let ptrs = WorkspacePtrs {
            partial_o: addr(&po, stream),
            partial_lse: addr(&pl, stream),
            num_splits: addr(&ns, stream),
            batch: capacity.batch as u64,
            fault: addr(&fault, stream),
            acc: addr(&acc, stream),
        };
        // The addresses are used without cudarc from here on: let the zero-fill land first.
        stream.synchronize()?;
        Ok(Self {
            bufs: ManuallyDrop::new(WorkspaceBuffers {
                partial_o: po,
                _partial_lse: pl,
                num_splits: ns,
                _fault: fault,
                acc,
            }),
            acc_ctas,
            checked: false,
            shard: mla_abi::Shard::OFF,
            ptrs,
            capacity,
            grid_splits: 0,
            splits_len: 0,
        })
    }

    pub fn capacity(&self) -> WorkspaceCapacity {
        self.capacity
    }

    /// The promotion scratch read back as 64-bit words, `ACC_FLOATS_PER_CTA / 2` per CTA of
    /// the device: where a trace build's bf16 TMA decodes leave their phase stamps (the
    /// kernels' `decode::trace`, `MLA_TRACE=1`). Synchronises `stream`. For measurements.
    #[doc(hidden)]
    pub fn scratch_words(&self, stream: &Arc<CudaStream>) -> Result<Vec<u64>> {
        let words: Vec<f32> = stream.clone_dtoh(&self.bufs.acc)?;
        Ok(words
            .chunks_exact(2)
            .map(|w| u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32))
            .collect())
    }

    /// Uploads the split count of each sequence (`0..=max_splits`; 0 skips the sequence:
    /// its output rows are not written) for the next decodes.
    pub fn set_splits(&mut self, stream: &Arc<CudaStream>, splits: &[i32]) -> Result<()> {
        if splits.is_empty() || splits.len() > self.capacity.batch {
            return Err(MlaError::shape(
                "splits.len()",
                format!("1..={} (workspace batch capacity)", self.capacity.batch),
                splits.len(),
            ));
        }
        for (i, &s) in splits.iter().enumerate() {
            if s < 0 || s as usize > self.capacity.max_splits {
                return Err(MlaError::OutOfRange {
                    field: "splits",
                    index: i,
                    expected: format!("0..={} (workspace max_splits)", self.capacity.max_splits),
                    got: s as i64,
                });
            }
        }
        let mut dst = self.bufs.num_splits.slice_mut(0..splits.len());
        stream.memcpy_htod(splits, &mut dst)?;
        self.grid_splits = splits.iter().copied().max().unwrap_or(1) as usize;
        self.splits_len = splits.len();
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkspacePtrs {
    pub(crate) partial_o: u64,
    pub(crate) partial_lse: u64,
    /// The runs' counts, then the step slots' (`batch` entries each).
    pub(crate) num_splits: u64,
    pub(crate) batch: u64,
    pub(crate) fault: u64,
    pub(crate) acc: u64,
}

impl Counts {
    /// The array's index in the workspace (the runs' first).
    fn index(self) -> usize {
        match self {
            Counts::Runs => 0,
            Counts::Step(k) => 1 + k.min(STEP_SLOTS - 1),
        }
    }
}

impl WorkspacePtrs {
    /// The split counts a launch reads or writes.
    pub(crate) fn splits(&self, counts: Counts) -> u64 {
        self.num_splits + 4 * self.batch * counts.index() as u64
    }
}

impl std::fmt::Debug for DecodeWorkspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeWorkspace")
            .field("capacity", &self.capacity)
            .field("ptrs", &self.ptrs)
            .finish()
    }
}

/// Launches on streams cudarc does not know (`run_raw`, the C ABI, graphs) may still be
/// using the buffers when the workspace is dropped, and cudarc frees them in the order of
/// its own stream only: wait for the whole context first. Dropping a plan is not on the
/// per-step path. (Found on the H200: a Python caller dropped a plan right after launching
/// on torch's stream; the freed pool memory was unmapped under the running decode.) Where
/// the context cannot synchronize (a stream of it is capturing a graph, or a kernel
/// faulted), the buffers are leaked rather than freed under work that may still use them.
impl Drop for DecodeWorkspace {
    fn drop(&mut self) {
        match self.bufs.partial_o.context().synchronize() {
            // SAFETY: dropped once, here; nothing reads `bufs` after.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.bufs) },
            Err(e) => log::warn!(
                "mla: a decode workspace's buffers are leaked: the context could not \
                 synchronize before freeing them ({e:?}; a graph capture in progress?)"
            ),
        }
    }
}

impl DecodeWorkspace {
    /// The persistent CTAs a decode may run on a device of `sm_count` SMs: one per SM, at
    /// most what the promotion scratch holds (sized for the same SM count). A work-list
    /// launch runs `max(1, list_ctas / tiles)` parts of every row tile.
    pub(crate) fn list_ctas(&self, sm_count: u32) -> usize {
        (sm_count.max(1) as usize).min(self.acc_ctas).max(1)
    }

    pub(crate) fn ptrs(&self) -> WorkspacePtrs {
        self.ptrs
    }

    /// The context the buffers live in.
    pub(crate) fn context(&self) -> &Arc<cudarc::driver::CudaContext> {
        self.bufs.partial_o.context()
    }

    /// The first `n` split counts of an array as the device holds them now (waits for
    /// `stream`; for tests and inspection, never in a serving step).
    pub fn read_splits(
        &self,
        stream: &Arc<CudaStream>,
        n: usize,
        counts: Counts,
    ) -> Result<Vec<i32>> {
        let n = n.min(self.capacity.batch);
        let all: Vec<i32> = stream.clone_dtoh(&self.bufs.num_splits)?;
        let base = counts.index() * self.capacity.batch;
        Ok(all.get(base..base + n).unwrap_or_default().to_vec())
    }
}

impl DecodeWorkspace {
    /// Device bytes of the workspace's buffers.
    pub fn device_bytes(&self) -> usize {
        4 * (self.capacity.partial_o_len()
            + self.capacity.partial_lse_len()
            + (1 + STEP_SLOTS) * self.capacity.batch
            + mla_abi::fault::WORDS
            + self.acc_ctas * mla_abi::ACC_FLOATS_PER_CTA)
    }

    /// The fault record's words, after everything launched on `stream` before completed.
    ///
    /// # Safety
    /// `stream` is a live stream (or null) of `rt`'s context.
    pub(crate) unsafe fn read_fault(
        &self,
        rt: &Runtime,
        stream: CUstream,
    ) -> Result<[i32; mla_abi::fault::WORDS]> {
        use cudarc::driver::sys;
        crate::module::make_current(rt.context())?;
        let mut words = [0i32; mla_abi::fault::WORDS];
        // SAFETY: the record holds WORDS i32; `words` is as large and outlives the
        // synchronisation that ends the copy.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                words.as_mut_ptr().cast(),
                self.ptrs.fault,
                std::mem::size_of_val(&words),
                stream,
            )
            .result()?;
            sys::cuStreamSynchronize(stream).result()?;
        }
        Ok(words)
    }

    /// Zeroes the fault record in stream order on `stream`.
    ///
    /// # Safety
    /// As [`DecodeWorkspace::read_fault`].
    pub(crate) unsafe fn clear_fault(&self, rt: &Runtime, stream: CUstream) -> Result<()> {
        use cudarc::driver::sys;
        crate::module::make_current(rt.context())?;
        // SAFETY: the record holds WORDS i32.
        unsafe {
            sys::cuMemsetD32Async(self.ptrs.fault, 0, mla_abi::fault::WORDS, stream).result()?
        };
        Ok(())
    }
}

/// Device address of a cudarc slice, for params (the slice outlives the launch because the
/// caller holds it across the call and the stream orders later frees after the kernel).
pub(crate) fn addr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

/// The full grid over `rows` query rows of `batch` sequences, one CTA per group of rows
/// (`kernel`'s block holds whole `combine_tile::THREADS` rows): the merge's, and the
/// combine's before [`combine_grid`] cuts its width.
fn combine_launch_shape(kernel: &Kernel, rows: usize, batch: usize) -> LaunchShape {
    let per_cta = kernel.block / combine_tile::THREADS as u32;
    LaunchShape {
        grid: ((rows as u32).div_ceil(per_cta), batch as u32, 1),
        block: kernel.block,
        smem: kernel.smem,
    }
}

/// The combine's grid: [`combine_launch_shape`] with its width cut so that the whole grid
/// is at most one wave of `wave` CTAs (at least one CTA per sequence); each CTA strides
/// over its sequence's row groups. A sequence of one split then costs a few CTAs that read
/// its split count, not one CTA per row group: at B = 128, H = 128 the full width was
/// 4096 CTAs.
fn combine_grid(kernel: &Kernel, rows: usize, batch: usize, wave: u32) -> LaunchShape {
    let mut shape = combine_launch_shape(kernel, rows, batch);
    let per_seq = (wave / (batch as u32).max(1)).max(1);
    shape.grid.0 = shape.grid.0.min(per_seq);
    shape
}

/// Grid, block and dynamic shared memory of one launch.
pub(crate) struct LaunchShape {
    pub(crate) grid: (u32, u32, u32),
    pub(crate) block: u32,
    pub(crate) smem: u32,
}

/// `cuLaunchKernel` of `kernel` with one params struct by value.
///
/// # Safety
/// `params` matches the kernel's params struct and holds device pointers that are valid for
/// the grid (validated by the caller).
pub(crate) unsafe fn launch<P>(
    rt: &Runtime,
    kernel: &'static str,
    shape: LaunchShape,
    stream: CUstream,
    params: &P,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { launch_with(rt, kernel, shape, stream, params, false) }
}

/// The one launch: `cuLaunchKernel`, or with `pdl` `cuLaunchKernelEx` with the
/// programmatic-stream-serialization attribute: the kernel's CTAs may start once the
/// previous kernel in the stream triggers (`griddepcontrol.launch_dependents`) or
/// completes, and the kernel waits for that kernel's completion (`griddepcontrol.wait`)
/// before touching global memory, so stream order still holds for every read and write.
/// Inside a graph capture the driver records it as a programmatic edge.
///
/// # Safety
/// As [`launch`]; with `pdl`, `kernel` starts with `arch::grid_dep_wait` in the loaded
/// image ([`crate::choice::DecodeKernels::pdl`]).
pub(crate) unsafe fn launch_with<P>(
    rt: &Runtime,
    kernel: &'static str,
    shape: LaunchShape,
    stream: CUstream,
    params: &P,
    pdl: bool,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe {
        launch_args(
            rt,
            kernel,
            shape,
            stream,
            &mut [params as *const P as *mut c_void],
            pdl,
        )
    }
}

/// [`launch_with`] on a pointer per kernel parameter.
///
/// # Safety
/// As [`launch_with`], for every parameter.
pub(crate) unsafe fn launch_args(
    rt: &Runtime,
    kernel: &'static str,
    shape: LaunchShape,
    stream: CUstream,
    args: &mut [*mut c_void],
    pdl: bool,
) -> Result<()> {
    use cudarc::driver::sys;
    let f = rt.function(kernel)?;
    crate::module::make_current(rt.context())?;
    let launched = if pdl {
        // SAFETY: plain C structs; the attribute's union member is the one its id names.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: shape.grid.0,
            gridDimY: shape.grid.1,
            gridDimZ: shape.grid.2,
            blockDimX: shape.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shape.smem,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: forwarded from the caller; `args`, `attr` and `config` outlive the call,
        // which copies the params.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    } else {
        // SAFETY: forwarded from the caller; `args` outlives the call, which copies the
        // params.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                shape.grid,
                (shape.block, 1, 1),
                shape.smem,
                stream,
                args,
            )
        }
    };
    launched.map_err(|source| MlaError::Launch { kernel, source })
}

/// The decode kernels' params for a validated request and its split layouts' rope parts.
pub(crate) fn decode_params(
    req: &DecodeRequest,
    parts: &SplitParts,
    shape: &DecodeShape,
    ws: &DecodeWorkspace,
) -> DecodeParams {
    let fp8 = shape.dtypes.kv() == ElemType::Fp8E4m3;
    let s = req.scales;
    let (softmax_scale, value_scale) = if fp8 {
        (s.softmax_scale * s.q_scale * s.kv_scale, s.kv_scale)
    } else {
        (s.softmax_scale, 1.0)
    };
    let w = ws.ptrs();
    let (kpe, kpe_strides) = rope_part(&req.kv_cache, parts.kpe_cache.as_ref());
    let (q_pe, q_pe_strides) = rope_part(&req.q, parts.q_pe.as_ref());
    DecodeParams {
        q: dev(req.q.ptr),
        kv_cache: dev(req.kv_cache.ptr),
        page_table: dev(req.page_table.ptr),
        seq_lens: dev(req.seq_lens.ptr),
        num_splits: dev(w.num_splits),
        out: dev(req.out.ptr),
        lse: dev(req.lse.ptr),
        partial_o: dev(w.partial_o),
        partial_lse: dev(w.partial_lse),
        q_stride_b: req.q.strides[0] as u64,
        q_stride_s: req.q.strides[1] as u64,
        q_stride_h: req.q.strides[2] as u64,
        kv_stride_page: req.kv_cache.strides[0] as u64,
        kv_stride_token: req.kv_cache.strides[1] as u64,
        out_stride_b: req.out.strides[0] as u64,
        out_stride_s: req.out.strides[1] as u64,
        out_stride_h: req.out.strides[2] as u64,
        batch: shape.batch as u32,
        s_q: shape.s_q as u32,
        heads: shape.heads as u32,
        page_size: shape.page_size as u32,
        page_shift: shape.page_size.trailing_zeros(),
        page_table_stride: req.page_table.strides[0] as u32,
        num_pages: shape.num_pages.min(u32::MAX as usize) as u32,
        max_splits: ws.capacity.max_splits as u32,
        softmax_scale,
        value_scale,
        output_scale: s.output_scale,
        max_pages: shape.max_pages as u32,
        persist_splits: 0,
        list_fixed: 0,
        fault: dev(if ws.checked { w.fault } else { 0 }),
        fold: mla_abi::SchedFold::default(),
        shard: ws.shard,
        kpe: dev(kpe),
        kpe_stride_page: kpe_strides[0] as u64,
        kpe_stride_token: kpe_strides[1] as u64,
        q_pe: dev(q_pe),
        q_pe_stride_b: q_pe_strides[0] as u64,
        q_pe_stride_s: q_pe_strides[1] as u64,
        q_pe_stride_h: q_pe_strides[2] as u64,
        acc: dev(w.acc),
    }
}

/// Where a row tensor's rope part (dims `D_V..`) starts and its strides: the split tensor,
/// or the fused one `D_V` elements on.
fn rope_part<const R: usize>(
    fused: &TensorView<R>,
    split: Option<&TensorView<R>>,
) -> (u64, [usize; R]) {
    match split {
        Some(v) => (v.ptr, v.strides),
        None => (
            fused.ptr + (mla_abi::D_V * fused.dtype.size()) as u64,
            fused.strides,
        ),
    }
}

/// The workspace must hold the request's batch and rows; the batch must fit the grid.
pub(crate) fn check_workspace(shape: &DecodeShape, cap: WorkspaceCapacity) -> Result<()> {
    if shape.batch > cap.batch || shape.rows() > cap.rows {
        return Err(MlaError::shape(
            "workspace capacity",
            format!("batch >= {}, rows >= {}", shape.batch, shape.rows()),
            format!("batch {}, rows {}", cap.batch, cap.rows),
        ));
    }
    if shape.batch > MAX_GRID_YZ {
        return Err(MlaError::Unsupported {
            what: "batch",
            got: shape.batch.to_string(),
            why: format!("at most {MAX_GRID_YZ} sequences per launch"),
        });
    }
    Ok(())
}

/// One CTA per (row, sequence) of an append or gather, within the grid's limits.
fn paged_launch(shape: &PagedShape) -> Result<LaunchShape> {
    if shape.batch > MAX_GRID_YZ || shape.rows > i32::MAX as usize {
        return Err(MlaError::Unsupported {
            what: "paged-KV launch size",
            got: format!("batch {}, rows {}", shape.batch, shape.rows),
            why: format!("at most {MAX_GRID_YZ} sequences and 2^31-1 rows per launch"),
        });
    }
    Ok(LaunchShape {
        grid: (shape.rows as u32, shape.batch as u32, 1),
        block: paged_tile::THREADS as u32,
        smem: 0,
    })
}

fn dev<T>(p: u64) -> DevPtr<T> {
    DevPtr::from_addr(p)
}

impl Runtime {
    /// One MLA decode step with split counts set on the host
    /// ([`DecodeWorkspace::set_splits`]): the split-KV decode kernel, then the combine kernel
    /// when any sequence has more than one split. Not the serving API (that is
    /// [`crate::DecodePlan`], which schedules on the device): the tests and the bench use it
    /// to pin split counts and tiles.
    #[doc(hidden)]
    pub fn decode(
        &self,
        stream: &CudaStream,
        req: &DecodeRequest,
        ws: &DecodeWorkspace,
    ) -> Result<DecodeShape> {
        self.decode_tiled(stream, req, ws, Tile::M64N64)
    }

    /// [`Runtime::decode`] with an explicit tile.
    #[doc(hidden)]
    pub fn decode_tiled(
        &self,
        stream: &CudaStream,
        req: &DecodeRequest,
        ws: &DecodeWorkspace,
        tile: Tile,
    ) -> Result<DecodeShape> {
        let shape = validate_decode(req)?;
        tile.check(self.backend(), shape.dtypes)?;
        check_workspace(&shape, ws.capacity)?;
        if ws.splits_len != shape.batch {
            return Err(MlaError::shape(
                "workspace splits (DecodeWorkspace::set_splits)",
                format!("{} entries (the batch)", shape.batch),
                ws.splits_len,
            ));
        }
        let kernels = DecodeKernels::new(
            self.backend(),
            self.variant(),
            tile,
            crate::choice::Overrides::get().apply(crate::tactic::Switches::ON),
            shape.dtypes,
            shape.page_size,
            ws.grid_splits.max(1),
        );
        // SAFETY: validated request; the workspace holds its capacity and the split counts
        // (1..=max_splits) for this batch.
        unsafe {
            self.launch_decode(
                req,
                &SplitParts::default(),
                &shape,
                ws,
                &kernels,
                tile,
                mla_abi::SchedFold::default(),
                Counts::Runs,
                0,
                stream.cu_stream(),
            )?
        };
        Ok(shape)
    }

    /// The decode kernel (grid z = `kernels.grid_splits`) and, when that is above 1, the
    /// combine; `fold` on: the decode computes the split counts itself. `counts`: the
    /// array the split counts are in. `list`: the work list's fixed cost a piece where the
    /// run takes it, as [`DecodeKernels::list_fixed_for`] gave it for this request, else 0
    /// (the list kernel then writes the runs' counts).
    ///
    /// # Safety
    /// `req` passed [`validate_decode`] giving `shape`, the workspace holds `shape`, and its
    /// `num_splits[0..batch]` will hold values in `1..=kernels.grid_splits` when the kernel
    /// runs (or, with `fold` on, the decode computes them); `kernels` is for `tile`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch_decode(
        &self,
        req: &DecodeRequest,
        parts: &SplitParts,
        shape: &DecodeShape,
        ws: &DecodeWorkspace,
        kernels: &DecodeKernels,
        tile: Tile,
        fold: mla_abi::SchedFold,
        counts: Counts,
        list: u32,
        stream: CUstream,
    ) -> Result<()> {
        let rows = shape.rows();
        let mut p = decode_params(req, parts, shape, ws);
        p.fold = fold;
        p.num_splits = dev(ws.ptrs().splits(counts));
        // The work list: the TMA decode's list kernel cuts the batch itself and writes the
        // runs' counts, whatever array a scheduled layer would have read. It runs in place
        // of the map form, or of the `cp.async` form the page size gave an fp8 cache
        // ([`DecodeKernels::list_base_for`]).
        let cells = kernels.decode_for_parts(req, parts, shape);
        let kernel = match kernels.tma_list {
            Some(k) if list > 0 => k,
            _ => cells,
        };
        // Split-major (the kernels read tile, sequence, split from x, y, z): the graph-safe
        // grid's CTAs past a sequence's split count (most of them at large batch) launch
        // after every CTA that has work, instead of between them.
        let cells = (
            tile.row_tiles(rows) as u32,
            shape.batch as u32,
            kernels.grid_splits as u32,
        );
        let persistent = kernel.params == Params::DecodeWithMap;
        if persistent {
            p.persist_splits = cells.2;
        }
        if list > 0 && kernels.tma_list.is_some() {
            p.list_fixed = list;
            p.fold = mla_abi::SchedFold::default();
            p.num_splits = dev(ws.ptrs().splits(Counts::Runs));
        } else {
            // The cells: the grid's splits, not the workspace's (a plan's workspace may
            // hold more for the work list): the fold's rule and the count clamp take it
            // as their bound, and the combine its partials' stride.
            p.max_splits = p.max_splits.min(kernels.grid_splits.max(1) as u32);
        }
        let grid = LaunchShape {
            grid: if p.list_fixed > 0 {
                // Whole parts: `max(1, CTAs / tiles)` parts of every row tile.
                let cap = ws.list_ctas(self.device().sm_count);
                let tiles = cells.0.max(1) as usize;
                let ctas = if tiles <= cap {
                    cap / tiles * tiles
                } else {
                    cap
                };
                (ctas as u32, 1, 1)
            } else if persistent {
                // One CTA per SM (the TMA decode's shared memory allows no second) walks
                // the cells: no CTA launches only to find its cell empty.
                // At most the CTAs the workspace's promotion scratch holds (sized for the
                // same SM count).
                let all = cells.0 as usize * cells.1 as usize * cells.2 as usize;
                let ctas = all
                    .min(self.device().sm_count.max(1) as usize)
                    .min(ws.acc_ctas);
                (ctas as u32, 1, 1)
            } else {
                cells
            },
            block: kernel.block,
            smem: kernel.smem,
        };
        // SAFETY: forwarded from the caller.
        unsafe {
            if persistent {
                // The cache's tensor map by value, as the second parameter: the launch (or
                // the graph node a capture records) holds its own copy. The `cp.async`
                // forms read none (a zeroed map fills the parameter).
                let map = if mla_abi::names::DECODE_TMA_CP_FORMS.contains(&kernel.symbol) {
                    mla_abi::TensorMap { words: [0; 16] }
                } else {
                    crate::tmap::encode_kv_map(req, shape)?
                };
                let mut args = [
                    &p as *const DecodeParams as *mut c_void,
                    &map as *const mla_abi::TensorMap as *mut c_void,
                ];
                launch_args(self, kernel.symbol, grid, stream, &mut args, kernels.pdl)?;
            } else {
                launch_with(self, kernel.symbol, grid, stream, &p, kernels.pdl)?;
            }
        }
        let Some(combine) = kernels.combine_for_batch(shape.batch, rows, self.device().sm_count)
        else {
            return Ok(());
        };
        let c = CombineParams {
            partial_o: p.partial_o,
            partial_lse: p.partial_lse,
            num_splits: p.num_splits,
            out: p.out,
            lse: p.lse,
            out_stride_b: p.out_stride_b,
            out_stride_s: p.out_stride_s,
            out_stride_h: p.out_stride_h,
            batch: p.batch,
            s_q: p.s_q,
            heads: p.heads,
            max_splits: p.max_splits,
            output_scale: p.output_scale,
            partial_f16: names::DECODE_F16_PARTIALS.contains(&kernel.symbol) as u32,
            seq_lens: p.seq_lens,
        };
        let grid = combine_grid(combine, rows, shape.batch, self.wave(combine.symbol));
        // SAFETY: the combine reads what the decode wrote, in stream order.
        unsafe { launch_with(self, combine.symbol, grid, stream, &c, kernels.pdl) }
    }

    /// Runs the combine kernel alone on caller-provided partials (for tests and for merging
    /// partials computed elsewhere, e.g. context-parallel decode). `partial_o` is
    /// `[max_splits, batch, rows, D_V]` f32, `partial_lse` `[max_splits, batch, rows]`,
    /// `num_splits` `[batch]` i32 in `1..=max_splits`, `out` contiguous `[batch, rows, D_V]`.
    /// Not the serving API: the rank merge of context parallelism is [`Runtime::merge`].
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn combine(
        &self,
        stream: &CudaStream,
        partial_o: &CudaSlice<f32>,
        partial_lse: &CudaSlice<f32>,
        num_splits: &CudaSlice<i32>,
        out: &mut CudaSlice<u16>,
        out_dtype: ElemType,
        lse: &mut CudaSlice<f32>,
        (batch, s_q, heads, max_splits): (usize, usize, usize, usize),
        output_scale: f32,
    ) -> Result<()> {
        let need = |field: &'static str, have: usize, want: usize| {
            if have < want {
                Err(MlaError::shape(field, format!(">= {want} elements"), have))
            } else {
                Ok(())
            }
        };
        let (max_s_q, max_heads) = (mla_abi::MAX_S_Q as usize, mla_abi::MAX_HEADS as usize);
        if !(1..=MAX_GRID_YZ).contains(&batch)
            || !(1..=max_s_q).contains(&s_q)
            || !(1..=max_heads).contains(&heads)
            || !(1..=MAX_SPLITS as usize).contains(&max_splits)
        {
            return Err(MlaError::shape(
                "combine geometry",
                format!(
                    "batch 1..={MAX_GRID_YZ}, s_q 1..={max_s_q}, heads 1..={max_heads}, \
                     max_splits 1..={MAX_SPLITS}"
                ),
                format!("batch {batch}, s_q {s_q}, heads {heads}, max_splits {max_splits}"),
            ));
        }
        // In range: no overflow below.
        let rows = s_q * heads;
        need(
            "partial_o",
            partial_o.len(),
            max_splits * batch * rows * mla_abi::D_V,
        )?;
        need("partial_lse", partial_lse.len(), max_splits * batch * rows)?;
        need("num_splits", num_splits.len(), batch)?;
        need("out", out.len(), batch * rows * mla_abi::D_V)?;
        need("lse", lse.len(), batch * rows)?;
        let combine = |fp16| {
            names::combine(
                fp16,
                max_splits as u32,
                (batch * rows) as u64,
                self.device().sm_count,
            )
        };
        let kernel = match out_dtype {
            ElemType::Bf16 => combine(false),
            ElemType::Fp16 => combine(true),
            other => {
                return Err(MlaError::DtypeMismatch {
                    field: "out",
                    expected: "bf16 or fp16".into(),
                    got: other.name().into(),
                });
            }
        };
        let c = CombineParams {
            partial_o: dev(addr(partial_o, stream)),
            partial_lse: dev(addr(partial_lse, stream)),
            num_splits: dev(addr(num_splits, stream)),
            out: dev(addr(out, stream)),
            lse: dev(addr(lse, stream)),
            out_stride_b: (rows * mla_abi::D_V) as u64,
            out_stride_s: (heads * mla_abi::D_V) as u64,
            out_stride_h: mla_abi::D_V as u64,
            batch: batch as u32,
            s_q: s_q as u32,
            heads: heads as u32,
            max_splits: max_splits as u32,
            output_scale,
            partial_f16: 0,
            seq_lens: DevPtr::NULL,
        };
        // SAFETY: every buffer was checked to hold what the kernel indexes.
        unsafe {
            launch(
                self,
                kernel,
                combine_grid(spec(kernel), rows, batch, self.wave(kernel)),
                stream.cu_stream(),
                &c,
            )
        }
    }

    /// Merges `ranks` results of the same query rows by their LSE into the exact result
    /// (context-parallel decode: each rank decoded its own share of every sequence's KV).
    /// `lse = ln(sum_r exp(lse_r))`, `out = sum_r exp(lse_r - lse) * out_r`; a rank with
    /// `lse_r = -inf` contributes nothing and its `out_r` is not read; a row no rank saw
    /// gets zeros and `-inf`. Launches on `stream` only: capturable.
    pub fn merge(&self, stream: &CudaStream, req: &MergeRequest) -> Result<MergeShape> {
        // SAFETY: a cudarc stream is a live stream of its context.
        unsafe { self.merge_raw(stream.cu_stream(), req) }
    }

    /// [`Runtime::merge`] on a raw `CUstream`.
    ///
    /// # Safety
    /// `stream` is a live stream (or null) of this runtime's context, and the request's
    /// device pointers stay valid until the merge completes.
    pub unsafe fn merge_raw(&self, stream: CUstream, req: &MergeRequest) -> Result<MergeShape> {
        let shape = validate_merge(req)?;
        // SAFETY: forwarded from the caller; `shape` is the request's, validated.
        unsafe { self.launch_merge(stream, req, &shape, None)? };
        Ok(shape)
    }

    /// The merge kernel on a request `validate_merge` accepted with `shape`. With
    /// `seq_lens` (the device address of `[batch]` i32 lengths, the context-parallel
    /// decode's) the rows of padding sequences (length `<= 0`) are left as they are.
    ///
    /// # Safety
    /// As [`Runtime::merge_raw`], and `shape == validate_merge(req)?`; `seq_lens`, if
    /// given, holds `req.out.shape[0]` lengths, valid until the merge completes.
    pub(crate) unsafe fn launch_merge(
        &self,
        stream: CUstream,
        req: &MergeRequest,
        shape: &MergeShape,
        seq_lens: Option<u64>,
    ) -> Result<()> {
        let kernel = spec(if shape.dtype == ElemType::Fp16 {
            names::MERGE_FP16
        } else {
            names::MERGE_BF16
        });
        let p = MergeParams {
            outs: dev(req.outs.ptr),
            lses: dev(req.lses.ptr),
            out: dev(req.out.ptr),
            lse: dev(req.lse.ptr),
            out_rank_stride: req.outs.strides[0] as u64,
            lse_rank_stride: req.lses.strides[0] as u64,
            seq_lens: seq_lens.map_or(DevPtr::NULL, dev),
            rows: shape.rows as u32,
            ranks: shape.ranks as u32,
            // s_q x heads (validated: at least 1 each).
            rows_per_seq: (req.out.shape[1] * req.out.shape[2]).max(1) as u32,
            _pad: 0,
        };
        // The combine's rows-per-CTA grid, over one "sequence" of every row.
        let grid = combine_launch_shape(kernel, shape.rows, 1);
        // SAFETY: validated: every index the kernel forms is inside the views.
        unsafe { launch(self, kernel.symbol, grid, stream, &p) }
    }

    /// Writes each sequence's `s_q` new rows into its pages (quantising for fp8 caches).
    pub fn append_kv(&self, stream: &CudaStream, req: &AppendRequest) -> Result<()> {
        // SAFETY: a live stream of this context.
        unsafe { self.append_kv_raw(stream.cu_stream(), req, None) }
    }

    /// [`Runtime::append_kv`] into a split cache: `req.kv_cache` the latent part
    /// `[num_pages, page_size, 512]`, `kpe_cache` the rope part `[num_pages, page_size, 64]`;
    /// `new_kv` rows stay 576 wide.
    pub fn append_kv_split(
        &self,
        stream: &CudaStream,
        req: &AppendRequest,
        kpe_cache: &TensorView<3>,
    ) -> Result<()> {
        // SAFETY: a live stream of this context.
        unsafe { self.append_kv_raw(stream.cu_stream(), req, Some(kpe_cache)) }
    }

    /// [`Runtime::append_kv`] (with `kpe`: [`Runtime::append_kv_split`]) on a raw stream, for
    /// the C ABI.
    ///
    /// # Safety
    /// `stream` is a live stream (or null) of this runtime's context; the request's device
    /// pointers stay valid until the kernel completes.
    pub unsafe fn append_kv_raw(
        &self,
        stream: CUstream,
        req: &AppendRequest,
        kpe: Option<&TensorView<3>>,
    ) -> Result<()> {
        let shape = validate_append_split(req, kpe)?;
        let grid = paged_launch(&shape)?;
        let kernel = match shape.cache {
            ElemType::Bf16 => names::APPEND_BF16,
            ElemType::Fp16 => names::APPEND_FP16,
            _ => names::APPEND_FP8_FROM_BF16,
        };
        let rope = rope_part(&req.kv_cache, kpe);
        let p = AppendParams {
            new_kv: dev(req.new_kv.ptr),
            kv_cache: dev(req.kv_cache.ptr),
            page_table: dev(req.page_table.ptr),
            seq_lens: dev(req.seq_lens.ptr),
            new_stride_b: req.new_kv.strides[0] as u64,
            new_stride_s: req.new_kv.strides[1] as u64,
            kv_stride_page: req.kv_cache.strides[0] as u64,
            kv_stride_token: req.kv_cache.strides[1] as u64,
            batch: shape.batch as u32,
            s_q: shape.rows as u32,
            page_size: shape.page_size as u32,
            page_shift: shape.page_size.trailing_zeros(),
            page_table_stride: req.page_table.strides[0] as u32,
            num_pages: shape.num_pages.min(u32::MAX as usize) as u32,
            kv_scale: req.kv_scale,
            max_pages: shape.max_pages as u32,
            kpe: dev(rope.0),
            kpe_stride_page: rope.1[0] as u64,
            kpe_stride_token: rope.1[1] as u64,
        };
        // SAFETY: validated request; the stream is the caller's.
        unsafe { launch(self, kernel, grid, stream, &p) }
    }

    /// Copies each sequence's rows out of the pages (dequantising fp8 to bf16 on request).
    pub fn gather_kv(&self, stream: &CudaStream, req: &GatherRequest) -> Result<()> {
        // SAFETY: a live stream of this context.
        unsafe { self.gather_kv_raw(stream.cu_stream(), req, None) }
    }

    /// [`Runtime::gather_kv`] from a split cache (`req.kv_cache` 512 wide, `kpe_cache` its
    /// rope part); `out` rows stay 576 wide.
    pub fn gather_kv_split(
        &self,
        stream: &CudaStream,
        req: &GatherRequest,
        kpe_cache: &TensorView<3>,
    ) -> Result<()> {
        // SAFETY: a live stream of this context.
        unsafe { self.gather_kv_raw(stream.cu_stream(), req, Some(kpe_cache)) }
    }

    /// [`Runtime::gather_kv`] (with `kpe`: [`Runtime::gather_kv_split`]) on a raw stream, for
    /// the C ABI.
    ///
    /// # Safety
    /// As [`Runtime::append_kv_raw`].
    pub unsafe fn gather_kv_raw(
        &self,
        stream: CUstream,
        req: &GatherRequest,
        kpe: Option<&TensorView<3>>,
    ) -> Result<()> {
        let shape = validate_gather_split(req, kpe)?;
        let grid = paged_launch(&shape)?;
        let kernel = match (shape.cache, shape.other) {
            (ElemType::Bf16, _) => names::GATHER_BF16,
            (ElemType::Fp16, _) => names::GATHER_FP16,
            (_, ElemType::Fp8E4m3) => names::GATHER_FP8,
            _ => names::GATHER_FP8_TO_BF16,
        };
        let rope = rope_part(&req.kv_cache, kpe);
        let p = GatherParams {
            kv_cache: dev(req.kv_cache.ptr),
            page_table: dev(req.page_table.ptr),
            seq_lens: dev(req.seq_lens.ptr),
            out: dev(req.out.ptr),
            out_stride_b: req.out.strides[0] as u64,
            kv_stride_page: req.kv_cache.strides[0] as u64,
            kv_stride_token: req.kv_cache.strides[1] as u64,
            batch: shape.batch as u32,
            page_size: shape.page_size as u32,
            page_shift: shape.page_size.trailing_zeros(),
            page_table_stride: req.page_table.strides[0] as u32,
            num_pages: shape.num_pages.min(u32::MAX as usize) as u32,
            out_rows: shape.rows as u32,
            kv_scale: req.kv_scale,
            max_pages: shape.max_pages as u32,
            kpe: dev(rope.0),
            kpe_stride_page: rope.1[0] as u64,
            kpe_stride_token: rope.1[1] as u64,
        };
        // SAFETY: validated request; the stream is the caller's.
        unsafe { launch(self, kernel, grid, stream, &p) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_grid_is_at_most_a_wave_with_a_cta_per_sequence() {
        let k = spec(names::COMBINE_BF16);
        let per_cta = (k.block / combine_tile::THREADS as u32) as usize;
        let groups = 128usize.div_ceil(per_cta) as u32;
        // A large batch: the width cut to what one wave holds.
        let s = combine_grid(k, 128, 128, 264);
        assert_eq!(s.grid, (2, 128, 1));
        // A small batch: every row group its own CTA.
        assert_eq!(combine_grid(k, 128, 1, 264).grid, (groups, 1, 1));
        // More sequences than a wave holds: one CTA each.
        assert_eq!(combine_grid(k, 16, 1000, 264).grid, (1, 1000, 1));
    }
}
