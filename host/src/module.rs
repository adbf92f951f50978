//! Device discovery, the choice of kernel image, module load and symbol resolution.
//!
//! The driver library is loaded at run time (cudarc `dynamic-loading`): without it every
//! entry point returns [`MlaError::NoDriver`]. A module is loaded once per [`Runtime`] and
//! every kernel of its image ([`Variant::kernels`]) is resolved at load, so a missing symbol
//! fails the load, never a later launch.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use mla_abi::kernels::{self, Images, Kernel};

use crate::error::{MlaError, Result};

/// The kernel images a [`Runtime`] can load (the `mla` crate embeds them).
#[derive(Clone, Copy, Debug)]
pub struct KernelImages {
    pub ptx_sm80: &'static str,
    pub ptx_sm90a: &'static str,
    pub ptx_sm100a: &'static str,
    pub cubin_sm90a: Option<&'static [u8]>,
    pub cubin_sm100a: Option<&'static [u8]>,
}

/// Which build of the kernels runs on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `sm_90a` (Hopper, exact arch only).
    Sm90a,
    /// `sm_100a` (Blackwell, exact arch only). Built and assembled; not run here.
    Sm100a,
    /// `sm_80` PTX, JIT-compiled by the driver on any GPU of compute capability >= 8.0.
    Portable,
}

impl Variant {
    /// The variant for a compute capability, or why none runs there.
    pub fn for_compute_capability(major: i32, minor: i32) -> Result<Self> {
        match (major, minor) {
            (9, 0) => Ok(Variant::Sm90a),
            (10, 0) => Ok(Variant::Sm100a),
            (m, _) if m >= 8 => Ok(Variant::Portable),
            _ => Err(MlaError::Unsupported {
                what: "GPU architecture",
                got: format!("sm_{major}{minor}"),
                why: "the kernels need compute capability 8.0 or newer (cp.async, bf16 mma.sync)"
                    .into(),
            }),
        }
    }

    /// Every kernel this variant's image holds ([`mla_abi::kernels::ALL`]: the common
    /// set, and on sm_90a its own kernels too).
    pub fn kernels(self) -> impl Iterator<Item = &'static Kernel> {
        kernels::ALL
            .iter()
            .filter(move |k| k.images == Images::All || self == Variant::Sm90a)
    }

    /// The gating backend this variant's image implements.
    pub fn backend(self) -> crate::gate::Backend {
        match self {
            Variant::Sm90a => crate::gate::Backend::Sm90a,
            // The sm_100a image is the same mma.sync code as the portable one, built for the
            // exact arch (assembled by ptxas, never run here).
            Variant::Sm100a | Variant::Portable => crate::gate::Backend::Portable,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Variant::Sm90a => "sm_90a",
            Variant::Sm100a => "sm_100a",
            Variant::Portable => "sm_80 (portable PTX)",
        }
    }
}

/// How the module was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageForm {
    /// A `ptxas`-built cubin for the exact arch.
    Cubin,
    /// PTX compiled by the driver's JIT at load.
    PtxJit,
}

impl ImageForm {
    /// The form of an image file as `MLA_IMAGE_FILE` reads it: a cubin where the name ends
    /// in `.cubin`, PTX otherwise.
    pub fn of_image_file(path: &std::ffi::OsStr) -> ImageForm {
        if path.to_string_lossy().ends_with(".cubin") {
            ImageForm::Cubin
        } else {
            ImageForm::PtxJit
        }
    }
}

/// Load-time choices, for tests and debugging; the defaults pick the best image.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Force a variant (it must be able to run on the device).
    pub variant: Option<Variant>,
    /// Force PTX JIT (`Some(PtxJit)`) or require a cubin (`Some(Cubin)`); either wins over
    /// `MLA_IMAGE=ptx`, and an `MLA_IMAGE_FILE` of the other form is a load error.
    pub form: Option<ImageForm>,
}

/// What the driver reports about a device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: u32,
    /// Largest dynamic shared memory one block may opt into.
    pub smem_per_block_optin: u32,
    pub smem_per_sm: u32,
    pub l2_bytes: u32,
    pub driver_version: i32,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ma, mi) = self.compute_capability;
        write!(
            f,
            "{} (device {}, sm_{ma}{mi}, {} SMs, {} KB smem/block opt-in, {} MB L2, driver {}.{})",
            self.name,
            self.ordinal,
            self.sm_count,
            self.smem_per_block_optin / 1024,
            self.l2_bytes / (1024 * 1024),
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10
        )
    }
}

/// Per-kernel resources as the driver reports them for the loaded image.
#[derive(Clone, Debug)]
pub struct KernelResources {
    pub name: &'static str,
    pub registers: i32,
    pub local_bytes: i32,
    pub static_smem_bytes: i32,
    pub max_threads: i32,
}

/// True when the CUDA driver library can be loaded on this machine (always, when it is
/// linked at build time: feature `linked`).
pub fn driver_available() -> bool {
    #[cfg(not(feature = "linked"))]
    // SAFETY: only probes for the library file; no driver call is made.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    #[cfg(feature = "linked")]
    let present = true;
    present
}

fn require_driver() -> Result<()> {
    if driver_available() {
        Ok(())
    } else {
        Err(MlaError::NoDriver(
            "libcuda could not be loaded (no NVIDIA driver installed, or not on the loader path)"
                .into(),
        ))
    }
}

/// Number of CUDA devices (0 when the driver is present but sees none).
pub fn device_count() -> Result<usize> {
    require_driver()?;
    match CudaContext::device_count() {
        Ok(n) => Ok(n.max(0) as usize),
        Err(e) => Err(MlaError::NoDevice(format!("cuDeviceGetCount: {e}"))),
    }
}

/// A loaded kernel module on one device: the handle every launch goes through.
pub struct Runtime {
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
    /// CTAs of each kernel one SM holds at once at its launch block and shared memory.
    per_sm: HashMap<&'static str, u32>,
    info: DeviceInfo,
    variant: Variant,
    form: ImageForm,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("device", &self.info.name)
            .field("variant", &self.variant)
            .field("form", &self.form)
            .finish()
    }
}

/// Makes `ctx` the calling thread's current context, if it is not already. Not cudarc's
/// `bind_to_thread`: that also takes the context's deferred error (set by cudarc's drops on
/// any thread), so one thread's stale error failed another thread's next launch and was
/// gone before its own thread could see it.
pub(crate) fn make_current(ctx: &CudaContext) -> Result<()> {
    let cu = ctx.cu_ctx();
    if cudarc::driver::result::ctx::get_current()? != Some(cu) {
        // SAFETY: a live context: `ctx` holds it (a retained primary context).
        unsafe { cudarc::driver::result::ctx::set_current(cu)? };
    }
    Ok(())
}

/// `Ok` while `stream` captures no graph; else `Unsupported` naming `what`, with `why`,
/// before anything is issued on it: a host read or wait on a capturing stream would end the
/// caller's capture with a CUDA error.
///
/// # Safety
/// `stream` is a live stream (or null, the legacy default stream) of the current context.
pub(crate) unsafe fn refuse_capture(
    stream: cudarc::driver::sys::CUstream,
    what: &'static str,
    why: &str,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let status = unsafe { cudarc::driver::result::stream::is_capturing(stream)? };
    if status == cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        Ok(())
    } else {
        Err(MlaError::Unsupported {
            what,
            got: format!("{status:?}"),
            why: why.into(),
        })
    }
}

impl Runtime {
    /// Loads the best image for device `ordinal`.
    pub fn load(ordinal: usize, images: KernelImages) -> Result<Self> {
        Self::load_with(ordinal, images, LoadOptions::default())
    }

    /// Loads with explicit choices. The env var `MLA_IMAGE=ptx` forces the PTX JIT.
    pub fn load_with(ordinal: usize, images: KernelImages, opts: LoadOptions) -> Result<Self> {
        let count = device_count()?;
        if count == 0 {
            return Err(MlaError::NoDevice(format!(
                "device {ordinal} requested, no device visible"
            )));
        }
        if ordinal >= count {
            return Err(MlaError::shape(
                "ordinal",
                format!("0..{count} (the visible devices)"),
                ordinal,
            ));
        }
        let ctx = CudaContext::new(ordinal)?;
        let info = query_info(&ctx, ordinal)?;
        let (ma, mi) = info.compute_capability;
        let native = Variant::for_compute_capability(ma, mi)?;
        let variant = match opts.variant {
            None => native,
            Some(Variant::Portable) => Variant::Portable,
            Some(v) if v == native => v,
            Some(v) => {
                return Err(MlaError::Unsupported {
                    what: "kernel variant",
                    got: v.name().into(),
                    why: format!(
                        "this device is sm_{ma}{mi}; exact-arch images run only on their arch"
                    ),
                });
            }
        };
        let env_ptx = std::env::var("MLA_IMAGE").is_ok_and(|v| v == "ptx");
        let cubin = match variant {
            Variant::Sm90a => images.cubin_sm90a,
            Variant::Sm100a => images.cubin_sm100a,
            Variant::Portable => None,
        };
        let ptx = match variant {
            Variant::Sm90a => images.ptx_sm90a,
            Variant::Sm100a => images.ptx_sm100a,
            Variant::Portable => images.ptx_sm80,
        };
        // A developer's override of the native image (A/B of kernel builds with one host
        // binary): `MLA_IMAGE_FILE=path`, a cubin (`.cubin`) or PTX (anything else) built
        // from this crate's kernels for this arch. It must export every symbol this
        // variant loads; a missing one fails the load below.
        let file = match std::env::var_os("MLA_IMAGE_FILE") {
            Some(path) if variant != Variant::Portable => {
                let bytes = std::fs::read(&path).map_err(|e| MlaError::Load {
                    variant: variant.name().into(),
                    detail: format!("MLA_IMAGE_FILE={}: {e}", path.to_string_lossy()),
                })?;
                Some((ImageForm::of_image_file(&path), bytes))
            }
            _ => None,
        };
        let source = image_source(
            file.as_ref().map(|(f, _)| *f),
            cubin.is_some(),
            env_ptx,
            opts.form,
        )
        .map_err(|detail| MlaError::Load {
            variant: variant.name().into(),
            detail,
        })?;
        let (image, form) = match (source, file, cubin) {
            (ImageSource::File(ImageForm::Cubin), Some((_, bytes)), _) => {
                (Ptx::from_binary(bytes), ImageForm::Cubin)
            }
            (ImageSource::File(_), Some((_, bytes)), _) => {
                let src = String::from_utf8(bytes).map_err(|e| MlaError::Load {
                    variant: variant.name().into(),
                    detail: format!("MLA_IMAGE_FILE: not UTF-8 PTX: {e}"),
                })?;
                (Ptx::from_src(src), ImageForm::PtxJit)
            }
            (ImageSource::Embedded(ImageForm::Cubin), _, Some(c)) => {
                (Ptx::from_binary(c.to_vec()), ImageForm::Cubin)
            }
            _ => (Ptx::from_src(ptx), ImageForm::PtxJit),
        };
        let module = ctx.load_module(image).map_err(|e| MlaError::Load {
            variant: variant.name().into(),
            detail: format!("{e:?} ({form:?})"),
        })?;
        let mut functions = HashMap::new();
        for kernel in variant.kernels() {
            let name = kernel.symbol;
            let f = module.load_function(name).map_err(|e| MlaError::Load {
                variant: variant.name().into(),
                detail: format!("symbol {name}: {e:?}"),
            })?;
            functions.insert(name, f);
        }
        // Every kernel opts in to the dynamic shared memory it launches with.
        for kernel in variant.kernels().filter(|k| k.smem > 0) {
            functions[kernel.symbol]
                .set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    kernel.smem as i32,
                )
                .map_err(|source| MlaError::Launch {
                    kernel: kernel.symbol,
                    source,
                })?;
        }
        // Only a sizing hint (the combine's grid): a failed query counts one CTA per SM.
        let mut per_sm = HashMap::new();
        for kernel in variant.kernels() {
            let n = functions[kernel.symbol]
                .occupancy_max_active_blocks_per_multiprocessor(
                    kernel.block,
                    kernel.smem as usize,
                    None,
                )
                .unwrap_or(1);
            per_sm.insert(kernel.symbol, n);
        }
        Ok(Self {
            ctx,
            _module: module,
            functions,
            per_sm,
            info,
            variant,
            form,
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    pub fn form(&self) -> ImageForm {
        self.form
    }

    /// The gating backend this runtime's image implements.
    pub fn backend(&self) -> crate::gate::Backend {
        self.variant.backend()
    }

    /// A start and an end event with timing enabled (for CUDA-event timing: the tuner, the
    /// benches).
    pub fn timing_events(&self) -> Result<(CudaEvent, CudaEvent)> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok((self.ctx.new_event(flags)?, self.ctx.new_event(flags)?))
    }

    /// A new stream on this runtime's context.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.ctx.new_stream()?)
    }

    /// CTAs of `name` that the whole device holds at once at its launch block and shared
    /// memory (at least one per SM).
    pub(crate) fn wave(&self, name: &'static str) -> u32 {
        let per_sm = self.per_sm.get(name).copied().unwrap_or(1).max(1);
        self.info.sm_count.max(1) * per_sm
    }

    /// A resolved kernel.
    pub(crate) fn function(&self, name: &'static str) -> Result<&CudaFunction> {
        self.functions.get(name).ok_or_else(|| MlaError::Load {
            variant: self.variant.name().into(),
            detail: format!("symbol {name} was not resolved"),
        })
    }

    /// Registers, local memory, static shared memory and thread limit of every kernel.
    pub fn kernel_resources(&self) -> Result<Vec<KernelResources>> {
        use CUfunction_attribute::*;
        let mut out = Vec::new();
        for kernel in self.variant.kernels() {
            let name = kernel.symbol;
            let f = self.function(name)?;
            let attr = |a| {
                f.get_attribute(a).map_err(|source| MlaError::Launch {
                    kernel: name,
                    source,
                })
            };
            out.push(KernelResources {
                name,
                registers: attr(CU_FUNC_ATTRIBUTE_NUM_REGS)?,
                local_bytes: attr(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
                static_smem_bytes: attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
                max_threads: attr(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            });
        }
        Ok(out)
    }
}

fn query_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceInfo> {
    use CUdevice_attribute::*;
    let attr = |a| ctx.attribute(a).map(|v| v.max(0) as u32);
    let mut driver_version = 0i32;
    // SAFETY: a plain query writing one i32.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }.result()?;
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name()?,
        compute_capability: ctx.compute_capability()?,
        sm_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        smem_per_block_optin: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        smem_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
        l2_bytes: attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        driver_version,
    })
}

/// Where [`Runtime`]'s module comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ImageSource {
    /// `MLA_IMAGE_FILE`, in the form its name says.
    File(ImageForm),
    /// The image built into this crate.
    Embedded(ImageForm),
}

/// The image a load takes: `file` (the form of `MLA_IMAGE_FILE`, where set), whether a
/// cubin is embedded for the arch, `MLA_IMAGE=ptx` and the caller's required form
/// ([`LoadOptions::form`]). A required form wins over `MLA_IMAGE`; a file or an embedded
/// image that cannot give it is an error (its detail), never a silent other form.
fn image_source(
    file: Option<ImageForm>,
    has_cubin: bool,
    env_ptx: bool,
    required: Option<ImageForm>,
) -> std::result::Result<ImageSource, String> {
    if let Some(f) = file {
        return match required {
            Some(r) if r != f => Err(format!(
                "MLA_IMAGE_FILE is {f:?} but the load requires {r:?} (LoadOptions::form)"
            )),
            _ => Ok(ImageSource::File(f)),
        };
    }
    let jit = match required {
        Some(r) => r == ImageForm::PtxJit,
        None => env_ptx,
    };
    if jit || !has_cubin {
        if required == Some(ImageForm::Cubin) {
            return Err(
                "no cubin embedded for this arch (ptxas was not found at build time)".into(),
            );
        }
        Ok(ImageSource::Embedded(ImageForm::PtxJit))
    } else {
        Ok(ImageSource::Embedded(ImageForm::Cubin))
    }
}

#[cfg(test)]
mod tests {
    use super::{ImageForm, ImageSource, image_source};
    use ImageForm::{Cubin, PtxJit};

    #[test]
    fn the_embedded_image_follows_the_required_form_then_the_environment() {
        let src = |has_cubin, env_ptx, req| image_source(None, has_cubin, env_ptx, req);
        assert_eq!(src(true, false, None), Ok(ImageSource::Embedded(Cubin)));
        assert_eq!(src(true, true, None), Ok(ImageSource::Embedded(PtxJit)));
        assert_eq!(src(false, false, None), Ok(ImageSource::Embedded(PtxJit)));
        // A required form wins over MLA_IMAGE=ptx.
        assert_eq!(
            src(true, true, Some(Cubin)),
            Ok(ImageSource::Embedded(Cubin))
        );
        assert_eq!(
            src(true, false, Some(PtxJit)),
            Ok(ImageSource::Embedded(PtxJit))
        );
        // A required cubin that is not embedded is an error, never the PTX.
        for env_ptx in [false, true] {
            let e = src(false, env_ptx, Some(Cubin)).unwrap_err();
            assert!(e.contains("no cubin embedded"), "{e}");
        }
    }

    #[test]
    fn an_image_file_gives_its_own_form_or_refuses_another() {
        for has_cubin in [false, true] {
            for env_ptx in [false, true] {
                for f in [Cubin, PtxJit] {
                    let src = |req| image_source(Some(f), has_cubin, env_ptx, req);
                    assert_eq!(src(None), Ok(ImageSource::File(f)));
                    assert_eq!(src(Some(f)), Ok(ImageSource::File(f)));
                    let other = if f == Cubin { PtxJit } else { Cubin };
                    let e = src(Some(other)).unwrap_err();
                    assert!(
                        e.contains("MLA_IMAGE_FILE") && e.contains("requires"),
                        "{e}"
                    );
                }
            }
        }
    }
}
