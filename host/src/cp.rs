//! Decode context parallelism across GPUs over NCCL.
//!
//! Each rank holds a share of every sequence's KV ([`mla_abi::Shard`]) and decodes it with
//! a plan set to that shard ([`crate::DecodePlan::set_shard`]): its `(out, lse)` is the
//! attention over its own keys. [`ContextParallel::combine`] then all-gathers every rank's
//! `(out, lse)` into this rank's workspace and merges them by their LSE
//! ([`crate::Runtime::merge`]) into the exact result, on every rank, in stream order
//! (capturable in a CUDA graph). An all-gather of the partial results plus a local merge
//! moves `ranks x rows x (1 KiB + 4 B)` per rank; at decode sizes (rows = batch x heads x
//! s_q, a few MiB at most) it is latency-bound, and the merge reads the gathered rows once.
//!
//! NCCL is loaded at run time like the driver (`libnccl.so` on the loader's path; the PyPI
//! wheel `nvidia-nccl-cu12` ships `libnccl.so.2`, which needs a `libnccl.so` link beside
//! it). Without it, [`ContextParallel::unique_id`] and [`ContextParallel::new`] return
//! [`MlaError::Unsupported`].
//!
//! Faults: communicator set-up is non-blocking and bounded by the timeout; a collective that
//! fails or a peer that never joins surfaces from [`ContextParallel::wait`] as
//! [`MlaError::Comm`] within the timeout, after which the communicator is aborted (every
//! later call errors). This rank writes only its own workspace and the `out` / `lse` it is
//! given; on an error their contents are unspecified, and no other rank's buffer is written
//! by this one.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self as cuda, CUstream};
use cudarc::driver::{CudaContext, CudaSlice};
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys as ncclsys;
use mla_abi::{D_V, ElemType, MAX_MERGE_RANKS};

use crate::error::{MlaError, Result};
use crate::module::Runtime;
use crate::request::{MergeRequest, MergeShape};
use crate::tensor::TensorView;

/// The identity of one communicator: made once ([`ContextParallel::unique_id`]) and handed
/// to every rank (its 128 bytes may travel between processes).
#[derive(Clone, Copy)]
pub struct NcclId(pub [u8; 128]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

fn comm_err(op: &'static str, e: nccl::NcclError) -> MlaError {
    MlaError::Comm {
        op,
        detail: format!("{:?}", e.0),
    }
}

fn have_nccl() -> Result<()> {
    #[cfg(not(feature = "linked"))]
    // SAFETY: only tries to open the library.
    let present = unsafe { ncclsys::is_culib_present() };
    // Linked at build time: present, or the process would not have started.
    #[cfg(feature = "linked")]
    let present = true;
    if present {
        Ok(())
    } else {
        Err(MlaError::Unsupported {
            what: "context parallelism",
            got: "no NCCL library".into(),
            why: "libnccl.so was not found on the loader's path".into(),
        })
    }
}

/// One rank's end of a context-parallel group: the NCCL communicator and the gather
/// workspace for up to `max_rows` query rows.
pub struct ContextParallel {
    comm: ncclsys::ncclComm_t,
    rank: usize,
    ranks: usize,
    max_rows: usize,
    timeout: Duration,
    /// Every rank's `(out)` rows, `[ranks, max_rows, D_V]` 16-bit, and `lse` rows,
    /// `[ranks, max_rows]` f32. Freed only once the last combine is done (see `Drop`).
    gather: ManuallyDrop<(CudaSlice<u16>, CudaSlice<f32>)>,
    /// Recorded on the caller's stream after each eager combine: `Drop` waits for it.
    done: Event,
    /// A combine was recorded on `done` since the communicator was made.
    pending: bool,
    /// Eager work on the gather buffers may be in flight that `done` does not cover (a
    /// combine that failed after enqueuing its all-gather, or on a stream whose capture
    /// state could not be read).
    untracked: bool,
    ctx: Arc<CudaContext>,
    outs_ptr: u64,
    lses_ptr: u64,
    /// The element type of every rank's `out` rows.
    dtype: ElemType,
    aborted: bool,
}

// The communicator is used from one thread at a time (`&mut self` for collectives).
unsafe impl Send for ContextParallel {}

impl ContextParallel {
    /// A new communicator identity, for [`ContextParallel::new`] on every rank.
    pub fn unique_id() -> Result<NcclId> {
        have_nccl()?;
        let id = nccl::get_uniqueid().map_err(|e| comm_err("get_unique_id", e))?;
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }

    /// Joins the group `id` as `rank` of `ranks` on `rt`'s device, with a workspace for
    /// combines of up to `max_rows` query rows (`batch * s_q * heads`) of `dtype` outputs
    /// (bf16 or fp16). Waits for every rank to join, at most `timeout`, then checks that
    /// every rank was made with the same rank count, `max_rows` and `dtype`: a rank that
    /// differs is an error on every rank (naming the field and the rank), and the
    /// communicator is aborted.
    pub fn new(
        rt: &Runtime,
        rank: usize,
        ranks: usize,
        id: &NcclId,
        max_rows: usize,
        dtype: ElemType,
        timeout: Duration,
    ) -> Result<Self> {
        if !matches!(dtype, ElemType::Bf16 | ElemType::Fp16) {
            return Err(MlaError::DtypeMismatch {
                field: "dtype",
                expected: "bf16 or fp16".into(),
                got: dtype.name().into(),
            });
        }
        if !(1..=MAX_MERGE_RANKS as usize).contains(&ranks) {
            return Err(MlaError::shape(
                "ranks",
                format!("1..={MAX_MERGE_RANKS}"),
                ranks,
            ));
        }
        if rank >= ranks {
            return Err(MlaError::shape("rank", format!("0..{ranks}"), rank));
        }
        if max_rows == 0 || max_rows > u32::MAX as usize {
            return Err(MlaError::shape("max_rows", "1..=u32::MAX", max_rows));
        }
        if timeout.is_zero() {
            // Setup and every wait poll a non-blocking communicator: no time to wait would
            // abort the group at its first poll.
            return Err(MlaError::shape("timeout", "> 0", "0"));
        }
        have_nccl()?;
        crate::module::make_current(rt.context())?;
        let stream = rt.context().default_stream();
        let alloc = |what: &'static str, n: usize| MlaError::Alloc {
            what,
            bytes: n as u64,
            source: cudarc::driver::DriverError(cuda::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        };
        let outs = stream
            .alloc_zeros::<u16>(ranks * max_rows * D_V)
            .map_err(|_| alloc("context-parallel gather outs", ranks * max_rows * D_V * 2))?;
        let lses = stream
            .alloc_zeros::<f32>(ranks * max_rows)
            .map_err(|_| alloc("context-parallel gather lses", ranks * max_rows * 4))?;
        let outs_ptr = crate::launch::addr(&outs, &stream);
        let lses_ptr = crate::launch::addr(&lses, &stream);
        stream.synchronize()?;

        let uid = ncclsys::ncclUniqueId {
            internal: id.0.map(|b| b as core::ffi::c_char),
        };
        // Non-blocking set-up, polled below against the timeout.
        // SAFETY: a plain C struct; every field is set to "default" or a value.
        let mut config: ncclsys::ncclConfig_t = unsafe { std::mem::zeroed() };
        init_config(&mut config);
        let mut comm: ncclsys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer and config; the id is the group's.
        let started = unsafe {
            nccl::comm_init_rank_config(&mut comm, ranks as i32, uid, rank as i32, &mut config)
        };
        if let Err(e) = started {
            if !comm.is_null() {
                // SAFETY: the handle the failed call returned.
                let _ = unsafe { nccl::comm_abort(comm) };
            }
            return Err(comm_err("comm_init_rank", e));
        }
        let done = match Event::new() {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: the handle the call above returned, aborted once.
                let _ = unsafe { nccl::comm_abort(comm) };
                return Err(e);
            }
        };
        let mut cp = ContextParallel {
            comm,
            rank,
            ranks,
            max_rows,
            timeout,
            gather: ManuallyDrop::new((outs, lses)),
            done,
            pending: false,
            untracked: false,
            ctx: rt.context().clone(),
            outs_ptr,
            lses_ptr,
            dtype,
            aborted: false,
        };
        cp.settle("comm_init_rank", None)?;
        cp.handshake(rt)?;
        Ok(cp)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The group's size.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The most query rows one combine takes.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Gathers every rank's `(out, lse)` of the same query rows (`local_out` `[batch, s_q,
    /// heads, 512]` bf16 or fp16 and `local_lse` `[batch, s_q, heads]` f32, both
    /// row-major over their dims longer than 1 and aligned to their element size, as this
    /// rank's sharded decode wrote them) and merges them into `out` and
    /// `lse` (same shapes), on `stream`. Every rank calls it with the same shape, in the
    /// same order. Capturable; [`ContextParallel::wait`] bounds the wait for it. Every
    /// check runs before anything is enqueued. The group's combines share its gather
    /// buffers: keep them on one stream, or order the streams.
    ///
    /// # Safety
    /// `stream` is a live stream of `rt`'s context; the views' pointers stay valid until
    /// the work completes.
    pub unsafe fn combine_raw(
        &mut self,
        rt: &Runtime,
        stream: CUstream,
        local_out: &TensorView<4>,
        local_lse: &TensorView<3>,
        out: &TensorView<4>,
        lse: &TensorView<3>,
    ) -> Result<()> {
        let merge = self.check_combine(local_out, local_lse, out, lse)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue(rt, stream, local_out, local_lse, &merge, None) }
    }

    /// One context-parallel decode step on this rank: `plan` (set to this rank's shard of
    /// the group, [`crate::DecodePlan::set_shard`]) decodes `req` into `req.out` /
    /// `req.lse`, then [`ContextParallel::combine_raw`] merges every rank's into `out` /
    /// `lse`. A plan sharded for another rank count or rank is an error, before anything
    /// is launched. The rows of a padding sequence (length `<= 0`) are written neither in
    /// `req.out` / `req.lse` nor in `out` / `lse`, as in a plain decode.
    ///
    /// # Safety
    /// As [`ContextParallel::combine_raw`] and [`crate::DecodePlan::run_raw`].
    pub unsafe fn decode_raw(
        &mut self,
        rt: &Runtime,
        stream: CUstream,
        plan: &crate::DecodePlan,
        req: &crate::DecodeRequest,
        out: &TensorView<4>,
        lse: &TensorView<3>,
    ) -> Result<crate::DecodeShape> {
        let sh = plan.shard();
        let (plan_rank, plan_ranks) = if sh.is_on() {
            (sh.rank as usize, sh.ranks as usize)
        } else {
            (0, 1)
        };
        if plan_ranks != self.ranks {
            return Err(MlaError::shape(
                "plan shard.ranks",
                format!("{} (the group's ranks)", self.ranks),
                plan_ranks,
            ));
        }
        if plan_rank != self.rank {
            return Err(MlaError::shape(
                "plan shard.rank",
                format!("{} (this rank of the group)", self.rank),
                plan_rank,
            ));
        }
        // The decode's own checks first, so a bad `out` or `lse` is named as the decode
        // names it; then the combine's view of them.
        crate::validate::validate_decode_shard(req, &sh)?;
        let merge = self.check_combine(&req.out, &req.lse, out, lse)?;
        crate::validate::merged_outputs_apart(req, &crate::SplitParts::default(), out, lse)?;
        // SAFETY: forwarded from the caller.
        let shape = unsafe { plan.run_raw(rt, stream, req)? };
        // SAFETY: forwarded from the caller; the lengths were validated with the decode
        // (`batch` of them, the local output's batch). The merge leaves the rows of padding
        // sequences, which no rank wrote, as the caller's `out` / `lse` held them.
        unsafe {
            self.enqueue(
                rt,
                stream,
                &req.out,
                &req.lse,
                &merge,
                Some(req.seq_lens.ptr),
            )?
        };
        Ok(shape)
    }

    /// The checks of a combine; the merge request over the gather workspace.
    fn check_combine(
        &self,
        local_out: &TensorView<4>,
        local_lse: &TensorView<3>,
        out: &TensorView<4>,
        lse: &TensorView<3>,
    ) -> Result<(MergeRequest, MergeShape)> {
        self.live()?;
        let [b, s, h, d] = local_out.shape;
        // An overflow of the caller's shape is a typed error (the views below use it).
        let rows = crate::validate::addressable_rows(b, s, h, "local_out.shape")?;
        // The merge checks the gathered views and the outputs; the local views are checked
        // here (contiguous rows of the gathered element type, matching shapes).
        let dtype = local_out.dtype;
        if dtype != self.dtype {
            return Err(MlaError::DtypeMismatch {
                field: "local_out",
                expected: format!("{} (the group's)", self.dtype.name()),
                got: dtype.name().into(),
            });
        }
        if local_lse.dtype != ElemType::F32 {
            return Err(MlaError::DtypeMismatch {
                field: "local_lse",
                expected: "f32".into(),
                got: local_lse.dtype.name().into(),
            });
        }
        if d != D_V {
            return Err(MlaError::shape("local_out.shape[3]", D_V, d));
        }
        if local_lse.shape != [b, s, h] {
            return Err(MlaError::shape(
                "local_lse.shape",
                format!("{:?} (local_out's rows)", [b, s, h]),
                format!("{:?}", local_lse.shape),
            ));
        }
        if rows == 0 || rows > self.max_rows {
            return Err(MlaError::shape(
                "local_out rows (batch * s_q * heads)",
                format!("1..={} (the group's max_rows)", self.max_rows),
                rows,
            ));
        }
        // Each is all-gathered as `rows` elements from its base address.
        crate::validate::block_source("local_out", "local_out.strides", local_out)?;
        crate::validate::block_source("local_lse", "local_lse.strides", local_lse)?;
        let (po, pl) = (self.outs_ptr, self.lses_ptr);
        // One all-gather per tensor in one group: NCCL places rank r's `rows` at r * rows,
        // and the merge reads them with that rank stride.
        let gathered_outs = TensorView::strided(
            po,
            dtype,
            [self.ranks, b, s, h, D_V],
            [rows * D_V, s * h * D_V, h * D_V, D_V, 1],
        );
        let gathered_lses = TensorView::strided(
            pl,
            ElemType::F32,
            [self.ranks, b, s, h],
            [rows, s * h, h, 1],
        );
        let req = MergeRequest {
            outs: gathered_outs,
            lses: gathered_lses,
            out: *out,
            lse: *lse,
        };
        // The merge's own checks (outputs' shapes, dtypes, aliasing) before anything runs.
        let shape = crate::validate::validate_merge(&req)?;
        Ok((req, shape))
    }

    /// The gather and the merge, on `stream`; with `seq_lens` (the decode's device
    /// lengths) the merge skips the rows of padding sequences.
    ///
    /// # Safety
    /// As [`ContextParallel::combine_raw`], with `merge` from [`Self::check_combine`] of
    /// the same views; `seq_lens` holds the local output's batch of lengths.
    unsafe fn enqueue(
        &mut self,
        rt: &Runtime,
        stream: CUstream,
        local_out: &TensorView<4>,
        local_lse: &TensorView<3>,
        merge: &(MergeRequest, MergeShape),
        seq_lens: Option<u64>,
    ) -> Result<()> {
        let [b, s, h, _] = local_out.shape;
        let rows = b * s * h;
        let (po, pl) = (self.outs_ptr, self.lses_ptr);
        crate::module::make_current(rt.context())?;
        let nccl_dtype = if local_out.dtype == ElemType::Fp16 {
            ncclsys::ncclDataType_t::ncclFloat16
        } else {
            ncclsys::ncclDataType_t::ncclBfloat16
        };
        // SAFETY: a live stream (the caller's).
        let capture = unsafe { capture_status(stream) };
        let eager = capture == Some(false);
        // From here the buffers may be written by work `done` does not cover yet.
        self.untracked |= capture != Some(true);
        // SAFETY: the send views are `rows` contiguous elements (checked above); the
        // receive buffers hold ranks x max_rows >= ranks x rows; the stream is the caller's.
        unsafe {
            let st = stream as ncclsys::cudaStream_t;
            nccl::group_start().map_err(|e| comm_err("group_start", e))?;
            let r1 = nccl::all_gather(
                local_out.ptr as *const c_void,
                po as *mut c_void,
                rows * D_V,
                nccl_dtype,
                self.comm,
                st,
            );
            let r2 = nccl::all_gather(
                local_lse.ptr as *const c_void,
                pl as *mut c_void,
                rows,
                ncclsys::ncclDataType_t::ncclFloat32,
                self.comm,
                st,
            );
            let end = nccl::group_end();
            if let Err(e) = r1.and(r2).and(end) {
                self.abort();
                return Err(comm_err("all_gather", e));
            }
        }
        // A non-blocking communicator may still be enqueuing the group: the merge goes
        // on the stream after it is.
        self.settle("all_gather", None)?;
        // SAFETY: forwarded from the caller; the gathered views are inside the workspace,
        // and `merge` was validated by `check_combine`.
        unsafe { rt.launch_merge(stream, &merge.0, &merge.1, seq_lens)? };
        if eager {
            // SAFETY: a live stream (the caller's) and event of this context.
            unsafe { self.done.record(stream)? };
            self.pending = true;
            self.untracked = false;
        }
        Ok(())
    }

    /// [`ContextParallel::combine_raw`] on a cudarc stream.
    pub fn combine(
        &mut self,
        rt: &Runtime,
        stream: &cudarc::driver::CudaStream,
        local_out: &TensorView<4>,
        local_lse: &TensorView<3>,
        out: &TensorView<4>,
        lse: &TensorView<3>,
    ) -> Result<()> {
        // SAFETY: a cudarc stream is a live stream of its context.
        unsafe { self.combine_raw(rt, stream.cu_stream(), local_out, local_lse, out, lse) }
    }

    /// Waits until `stream`'s work (a combine's collectives among it) is done, at most the
    /// group's timeout: an NCCL error, or a peer that does not take part in time, aborts
    /// the communicator and returns [`MlaError::Comm`].
    pub fn wait(&mut self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        // SAFETY: a cudarc stream is a live stream.
        unsafe { self.wait_raw(stream.cu_stream()) }
    }

    /// [`ContextParallel::wait`] on a raw `CUstream`.
    ///
    /// # Safety
    /// `stream` is a live stream (or null, the legacy default stream) of this group's
    /// device's context.
    pub unsafe fn wait_raw(&mut self, stream: CUstream) -> Result<()> {
        self.live()?;
        // cuStreamQuery needs the group's context current (the legacy stream, null, is the
        // current context's): a thread that never bound it must not abort the group.
        crate::module::make_current(&self.ctx)?;
        // Polled during a capture the stream answers with an error, which would abort the
        // group (and end the caller's capture): refused before it is touched.
        // SAFETY: a live stream of this context, now current (forwarded).
        unsafe {
            crate::module::refuse_capture(
                stream,
                "waiting for a context-parallel group",
                "it polls the stream on the host; call it outside graph capture",
            )?
        };
        self.settle("wait", Some(stream))
    }

    /// Every rank's (rank count, max_rows, dtype) against this one's, through one small
    /// all-gather on the context's default stream.
    fn handshake(&mut self, rt: &Runtime) -> Result<()> {
        const WORDS: usize = 4;
        let code = if self.dtype == ElemType::Fp16 { 2 } else { 1 };
        let mine = [
            0x4d4c_4131i32,
            self.ranks as i32,
            self.max_rows as i32,
            code,
        ];
        let stream = rt.context().default_stream();
        let send = stream.clone_htod(&mine)?;
        let recv = stream.alloc_zeros::<i32>(WORDS * self.ranks)?;
        let (ps, pr) = (
            crate::launch::addr(&send, &stream),
            crate::launch::addr(&recv, &stream),
        );
        // SAFETY: WORDS i32 sent, ranks x WORDS received, both on the device.
        let started = unsafe {
            nccl::all_gather(
                ps as *const c_void,
                pr as *mut c_void,
                WORDS,
                ncclsys::ncclDataType_t::ncclInt32,
                self.comm,
                stream.cu_stream() as ncclsys::cudaStream_t,
            )
        };
        if let Err(e) = started {
            self.abort();
            return Err(comm_err("handshake", e));
        }
        self.settle("handshake", Some(stream.cu_stream()))?;
        let all: Vec<i32> = stream.clone_dtoh(&recv)?;
        for (r, theirs) in all.chunks(WORDS).enumerate() {
            let field = match (0..WORDS).find(|&i| theirs[i] != mine[i]) {
                None => continue,
                Some(0) => "group (a rank outside this library's protocol)",
                Some(1) => "ranks",
                Some(2) => "max_rows",
                Some(_) => "dtype",
            };
            self.abort();
            return Err(MlaError::InvalidShape {
                field,
                expected: format!(
                    "the same on every rank: {:?} here (rank {})",
                    mine, self.rank
                ),
                got: format!("{theirs:?} on rank {r}"),
            });
        }
        Ok(())
    }

    fn live(&self) -> Result<()> {
        if self.aborted {
            return Err(MlaError::Comm {
                op: "use",
                detail: "the communicator was aborted after an earlier error".into(),
            });
        }
        Ok(())
    }

    /// Polls the communicator's asynchronous state (and `stream`, if given) until both
    /// are done, an error shows, or the timeout passes; aborts on the latter two.
    fn settle(&mut self, op: &'static str, stream: Option<CUstream>) -> Result<()> {
        let start = Instant::now();
        loop {
            let mut state = ncclsys::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator.
            let polled = unsafe { ncclsys::ncclCommGetAsyncError(self.comm, &mut state) };
            let state = if polled == ncclsys::ncclResult_t::ncclSuccess {
                state
            } else {
                polled
            };
            let nccl_busy = match state {
                ncclsys::ncclResult_t::ncclSuccess => false,
                ncclsys::ncclResult_t::ncclInProgress => true,
                other => {
                    self.abort();
                    return Err(MlaError::Comm {
                        op,
                        detail: format!("{other:?}; communicator aborted"),
                    });
                }
            };
            let stream_busy = match stream {
                None => false,
                // SAFETY: a live stream of this context.
                Some(s) => match unsafe { cuda::cuStreamQuery(s) } {
                    cuda::CUresult::CUDA_SUCCESS => false,
                    cuda::CUresult::CUDA_ERROR_NOT_READY => true,
                    other => {
                        self.abort();
                        return Err(MlaError::Driver(cudarc::driver::DriverError(other)));
                    }
                },
            };
            if !nccl_busy && !stream_busy {
                return Ok(());
            }
            if start.elapsed() > self.timeout {
                self.abort();
                return Err(MlaError::Comm {
                    op,
                    detail: format!(
                        "not done after {:.1} s (a peer that did not take part?); \
                         communicator aborted",
                        self.timeout.as_secs_f64()
                    ),
                });
            }
            if start.elapsed() < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    fn abort(&mut self) {
        if !self.aborted {
            self.aborted = true;
            // SAFETY: a live communicator, aborted once.
            let _ = unsafe { nccl::comm_abort(self.comm) };
        }
    }
}

/// The last combine's all-gather and merge may still write the gather buffers (a caller
/// need not wait before dropping): wait for them, at most the group's timeout; past it the
/// communicator is aborted (its kernels return) and the context synchronized. Buffers that
/// cannot be shown idle are leaked rather than freed under running work. A combine captured
/// in a graph belongs to the graph's replays, which the caller orders.
impl Drop for ContextParallel {
    fn drop(&mut self) {
        // The event's calls need its context current on this thread (an error shows below).
        let _ = self.ctx.bind_to_thread();
        let mut idle = !self.untracked && (!self.pending || self.done.wait(self.timeout));
        if !idle {
            self.abort();
            idle = self.ctx.synchronize().is_ok();
        }
        if !self.aborted {
            // SAFETY: a live communicator, destroyed once, its work done.
            let _ = unsafe { nccl::comm_destroy(self.comm) };
        }
        if idle {
            // SAFETY: dropped once, here; nothing uses the buffers after.
            unsafe { ManuallyDrop::drop(&mut self.gather) };
        } else {
            log::warn!(
                "mla: a context-parallel group's gather buffers are leaked: its last \
                 combine could not be shown done"
            );
        }
    }
}

/// A CUDA event without timing, destroyed with its owner.
struct Event(cuda::CUevent);

impl Event {
    /// On the current context.
    fn new() -> Result<Self> {
        let mut e: cuda::CUevent = std::ptr::null_mut();
        let flags = cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: a valid out-pointer.
        match unsafe { cuda::cuEventCreate(&mut e, flags) } {
            cuda::CUresult::CUDA_SUCCESS => Ok(Self(e)),
            r => Err(MlaError::Driver(cudarc::driver::DriverError(r))),
        }
    }

    /// # Safety
    /// `stream` is a live stream of the event's context, not capturing.
    unsafe fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: forwarded from the caller; a live event.
        match unsafe { cuda::cuEventRecord(self.0, stream) } {
            cuda::CUresult::CUDA_SUCCESS => Ok(()),
            r => Err(MlaError::Driver(cudarc::driver::DriverError(r))),
        }
    }

    /// Polls until the recorded work is done (true), or an error or the timeout (false).
    fn wait(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            // SAFETY: a live event.
            match unsafe { cuda::cuEventQuery(self.0) } {
                cuda::CUresult::CUDA_SUCCESS => return true,
                cuda::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() <= timeout => {
                    std::thread::sleep(Duration::from_micros(100));
                }
                _ => return false,
            }
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: a live event, destroyed once.
        let _ = unsafe { cuda::cuEventDestroy_v2(self.0) };
    }
}

/// Whether `stream` is capturing a graph (`None`: the driver could not say).
///
/// # Safety
/// `stream` is a live stream (or null).
unsafe fn capture_status(stream: CUstream) -> Option<bool> {
    let mut status = cuda::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: forwarded from the caller; a valid out-pointer.
    let r = unsafe { cuda::cuStreamIsCapturing(stream, &mut status) };
    (r == cuda::CUresult::CUDA_SUCCESS)
        .then_some(status != cuda::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// NCCL's "default" config with non-blocking set-up (`NCCL_CONFIG_INITIALIZER` plus
/// `blocking = 0`): every tunable left undefined.
fn init_config(c: &mut ncclsys::ncclConfig_t) {
    const UNDEF: i32 = i32::MIN;
    c.size = std::mem::size_of::<ncclsys::ncclConfig_t>();
    c.magic = 0xcafe_beef;
    c.version = 22800;
    c.blocking = 0;
    c.cgaClusterSize = UNDEF;
    c.minCTAs = UNDEF;
    c.maxCTAs = UNDEF;
    c.netName = std::ptr::null();
    c.splitShare = UNDEF;
    c.trafficClass = UNDEF;
    c.commName = std::ptr::null();
    c.collnetEnable = UNDEF;
    c.CTAPolicy = UNDEF;
    c.shrinkShare = UNDEF;
    c.nvlsCTAs = UNDEF;
    c.nChannelsPerNetPeer = UNDEF;
    c.nvlinkCentricSched = UNDEF;
    c.graphUsageMode = UNDEF;
    c.numRmaCtx = UNDEF;
    c.maxP2pPeers = UNDEF;
}
