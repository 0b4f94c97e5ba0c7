//! The CUDA engine: one per device, shared by every operation.
//!
//! - [`CudaEngine::new`] binds a device (its primary context, the one torch
//!   uses) and reports *why* when no driver, no NVRTC or no GPU is there.
//! - Kernels come from a module registry keyed by kernel id ([`KernelId`]):
//!   a module ([`compile::Module`], one NVRTC program) is compiled for the
//!   device's architecture on first use (or read from the disk cache) and
//!   loaded once; [`CudaEngine::warm_up`] loads every module up front so that
//!   no compile happens inside a graph capture.
//! - [`launch`] is the one typed launch (grid, block, shared memory, the
//!   programmatic-serialisation and cooperative attributes) every operation
//!   goes through; [`workspace`] lays out the scratch regions of a plan.
//! - The operations add their device entry points to the engine in their own
//!   modules: [`crate::ops::select`] adds [`CudaEngine::select_device`],
//!   [`CudaEngine::select_host`] and [`CudaEngine::time_select`].

pub mod compile;
pub(crate) mod host;
pub(crate) mod launch;
pub(crate) mod timing;
pub mod workspace;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};

use crate::contract::error::cuda_err;
use crate::contract::{Error, Result};
pub use crate::ops::indexer::{DeviceBlockKeys, DeviceQsaIndexer, DeviceQsaScores};
pub use crate::ops::mla::device::{DeviceSparseMlaDecode, DeviceSparseMlaPrefill, MlaPath, MlaPlan};
pub use crate::ops::qsa::device::DeviceQsaSelect;
pub use crate::ops::qsa_attention::device::{DeviceQsaAttention, QsaAttnPath, QsaAttnPlan};
use crate::ops::select::plan::DeviceProps;
pub use crate::ops::select::{DevicePages, DeviceSelect};
pub use compile::{Compiled, KernelResources};
use compile::{Module, Variant};

/// One kernel of one compiled module: the module, whether it is the
/// global-buffer build of a module that has one, and the entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KernelId {
    pub module: Module,
    pub global_buffer: bool,
    pub entry: &'static str,
}

/// A loaded module and its entry points.
struct Loaded {
    /// Kept alive for the functions (and read by `take_profile`).
    #[cfg_attr(not(feature = "profile"), allow(dead_code))]
    module: Arc<cudarc::driver::CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
}

/// The CUDA engine bound to one device.
pub struct CudaEngine {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    props: DeviceProps,
    arch: &'static str,
    name: String,
    registry: Mutex<HashMap<(Module, bool), Arc<Loaded>>>,
    /// Whether rows of at most `plan::SHORT_COLS` take the short-row path
    /// (`FLASHSEL_SHORT=0` at creation: off; [`CudaEngine::set_short_rows`]).
    short_rows: std::sync::atomic::AtomicBool,
    /// Short rows of at most this many columns, in batches of at least
    /// `short_warp_min_rows` rows, take the short path's warp kernel
    /// (`plan::SHORT_WARP_COLS`, `SHORT_WARP_MIN_ROWS`;
    /// `FLASHSEL_SHORT_WARP=<cols>` at creation, 0: none;
    /// [`CudaEngine::set_short_warp`]).
    short_warp_cols: std::sync::atomic::AtomicU64,
    short_warp_min_rows: std::sync::atomic::AtomicU64,
    /// Batches of at most one row a SM, rows of at most this many columns,
    /// take the short path's wide kernel (`plan::SHORT_WIDE_COLS`;
    /// `FLASHSEL_SHORT_WIDE=<cols>` at creation, 0: none;
    /// [`CudaEngine::set_short_wide`]).
    short_wide_cols: std::sync::atomic::AtomicU64,
    /// Whether the wide kernel's few widest rows take its cluster form
    /// (sm_90+; `FLASHSEL_SHORT_CLUSTER=0` at creation: off;
    /// [`CudaEngine::set_short_cluster`]).
    short_cluster: std::sync::atomic::AtomicBool,
}

fn arch_name(major: i32, minor: i32) -> &'static str {
    if let Ok(a) = std::env::var("FLASHSEL_ARCH") {
        return Box::leak(a.into_boxed_str());
    }
    match (major, minor) {
        (9, 0) => "sm_90a",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (m, n) => Box::leak(format!("sm_{m}{n}").into_boxed_str()),
    }
}

/// The major compute capability of an arch name such as `sm_90a` or `sm_86`.
pub(crate) fn arch_major(arch: &str) -> u32 {
    let digits: String = arch.trim_start_matches("sm_").chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse::<u32>().map_or(0, |n| n / 10)
}

/// Why the CUDA backend cannot be used here, or `Ok` when it can.
pub fn availability() -> std::result::Result<(), String> {
    // SAFETY: only probes dlopen.
    if !unsafe { sys::is_culib_present() } {
        return Err("no NVIDIA driver: libcuda.so was not found by the dynamic loader".into());
    }
    compile::nvrtc_available()?;
    Ok(())
}

impl CudaEngine {
    /// Binds device `ordinal` (its primary context) and a stream of its own.
    pub fn new(ordinal: usize) -> Result<Self> {
        availability().map_err(Error::BackendUnavailable)?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| Error::BackendUnavailable("the CUDA driver panicked while initialising".into()))?
            .map_err(|e| Error::BackendUnavailable(format!("no usable GPU (device {ordinal}): {e:?}")))?;
        // SAFETY: flashsel synchronises its own buffers explicitly; no event
        // tracking keeps graph capture free of hidden event records.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(cuda_err)?;
        if major < 8 {
            return Err(Error::BackendUnavailable(format!(
                "compute capability {major}.{minor} is below 8.0 (Ampere), the oldest flashsel supports"
            )));
        }
        let attr = |a| ctx.attribute(a).map_err(cuda_err);
        use sys::CUdevice_attribute::*;
        let props = DeviceProps {
            sm_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            max_smem_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32,
            smem_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as u32,
            max_threads_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32,
            clusters: major >= 9,
        };
        let stream = ctx.new_stream().map_err(cuda_err)?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let short_rows = std::sync::atomic::AtomicBool::new(std::env::var("FLASHSEL_SHORT").map_or(true, |v| v != "0"));
        let short_warp_cols = std::sync::atomic::AtomicU64::new(
            std::env::var("FLASHSEL_SHORT_WARP")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(crate::ops::select::plan::SHORT_WARP_COLS),
        );
        let short_warp_min_rows = std::sync::atomic::AtomicU64::new(crate::ops::select::plan::SHORT_WARP_MIN_ROWS);
        let short_wide_cols = std::sync::atomic::AtomicU64::new(
            std::env::var("FLASHSEL_SHORT_WIDE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(crate::ops::select::plan::SHORT_WIDE_COLS),
        );
        let short_cluster = std::sync::atomic::AtomicBool::new(
            major >= 9 && std::env::var("FLASHSEL_SHORT_CLUSTER").map_or(true, |v| v != "0"),
        );
        Ok(Self {
            ctx,
            stream,
            props,
            arch: arch_name(major, minor),
            name,
            registry: Mutex::new(HashMap::new()),
            short_rows,
            short_warp_cols,
            short_warp_min_rows,
            short_wide_cols,
            short_cluster,
        })
    }

    /// The device's properties as the planners see them.
    pub fn props(&self) -> DeviceProps {
        self.props
    }
    /// The architecture the kernels are compiled for (`sm_90a` on Hopper).
    pub fn arch(&self) -> &'static str {
        self.arch
    }
    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.name
    }
    /// The engine's own stream (used by the host-memory helpers).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// Whether the planner may send rows of at most `plan::SHORT_COLS`
    /// columns down the short-row path (the default; `FLASHSEL_SHORT=0` when
    /// the engine is created turns it off).
    pub fn short_rows(&self) -> bool {
        self.short_rows.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Turns the short-row path on or off for later plans (the check suite's
    /// parity check and timings run the same rows both ways). A plan is made
    /// per call, so a call in flight is not affected.
    pub fn set_short_rows(&self, on: bool) {
        self.short_rows.store(on, std::sync::atomic::Ordering::Relaxed);
    }
    /// The short-row path's warp kernel bounds: (the widest rows, columns;
    /// the fewest rows of a batch). Columns 0: no warp kernel, every short
    /// row takes a CTA.
    pub fn short_warp(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.short_warp_cols.load(Relaxed), self.short_warp_min_rows.load(Relaxed))
    }
    /// Sets [`CudaEngine::short_warp`] for later plans (the check suite runs
    /// short rows on both kernels; the dev tool times both).
    pub fn set_short_warp(&self, cols: u64, min_rows: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.short_warp_cols.store(cols, Relaxed);
        self.short_warp_min_rows.store(min_rows, Relaxed);
    }
    /// The widest rows (columns) of the short path's wide kernel, taken by
    /// batches of at most one row a SM; 0: no wide kernel.
    pub fn short_wide(&self) -> u64 {
        self.short_wide_cols.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Sets [`CudaEngine::short_wide`] for later plans (the check suite runs
    /// its rows on the other paths too; the dev tool times both).
    pub fn set_short_wide(&self, cols: u64) {
        self.short_wide_cols.store(cols, std::sync::atomic::Ordering::Relaxed);
    }
    /// Whether the short path's wide kernel gives its few widest rows a
    /// thread-block cluster each (`plan::ShortKernel::Cluster`; sm_90+).
    pub fn short_cluster(&self) -> bool {
        self.short_cluster.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Sets [`CudaEngine::short_cluster`] for later plans; `true` has no
    /// effect below sm_90 (no clusters there).
    pub fn set_short_cluster(&self, on: bool) {
        self.short_cluster.store(on && arch_major(self.arch) >= 9, std::sync::atomic::Ordering::Relaxed);
    }
    /// Whether launches use programmatic dependent launch (sm_90 and later):
    /// see [`launch`].
    pub(crate) fn pdl(&self) -> bool {
        arch_major(self.arch) >= 9
    }

    /// Compiles (or fetches) and loads a module: every entry point gets the
    /// device's whole opt-in dynamic shared memory beside its static use, so
    /// a plan's launch size is the only limit.
    fn module(&self, module: Module, global_buffer: bool) -> Result<Arc<Loaded>> {
        let global_buffer = global_buffer && module.has_buffer_variants();
        let mut map = self.registry.lock().map_err(|_| Error::cuda_other("the kernel registry lock is poisoned"))?;
        if let Some(m) = map.get(&(module, global_buffer)) {
            return Ok(m.clone());
        }
        let v = Variant { profile: cfg!(feature = "profile"), ..Variant::new(module, self.arch, global_buffer) };
        let c = compile::compile(&v)?;
        let loaded = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(c.cubin))
            .map_err(|e| Error::cuda_other(format!("loading the {} cubin: {e:?}", v.name())))?;
        let mut functions = HashMap::new();
        for &entry in module.entry_points() {
            let f = loaded.load_function(entry).map_err(cuda_err)?;
            // SAFETY: reads an attribute of a loaded function.
            let static_smem = unsafe {
                let mut n = 0i32;
                let r = sys::cuFuncGetAttribute(
                    &mut n,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                    f.cu_function(),
                );
                launch::check(r, "cuFuncGetAttribute")?;
                n as u32
            };
            let dynamic = self.props.max_smem_per_block.saturating_sub(static_smem);
            f.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic as i32)
                .map_err(cuda_err)?;
            functions.insert(entry, f);
        }
        let m = Arc::new(Loaded { module: loaded, functions });
        map.insert((module, global_buffer), m.clone());
        Ok(m)
    }

    /// The function of a kernel id (its module compiled and loaded on first use).
    pub(crate) fn function(&self, id: KernelId) -> Result<CudaFunction> {
        let m = self.module(id.module, id.global_buffer)?;
        m.functions
            .get(id.entry)
            .cloned()
            .ok_or_else(|| Error::cuda_other(format!("module {} has no kernel {}", id.module.name(), id.entry)))
    }

    /// Compiles and loads every module now (NVRTC out of later calls and of
    /// graph captures).
    pub fn warm_up(&self) -> Result<()> {
        for module in Module::ALL {
            self.module(module, false)?;
            if module.has_buffer_variants() {
                self.module(module, true)?;
            }
        }
        Ok(())
    }

    /// Reads and clears the `fs_prof` phase counters of a module (a build
    /// with the `profile` feature compiles every module with them).
    #[cfg(feature = "profile")]
    pub fn take_profile(&self, module: Module, global_buffer: bool) -> Result<Vec<u64>> {
        let m = self.module(module, global_buffer)?;
        let mut g = m.module.get_global("fs_prof", &self.stream).map_err(cuda_err)?;
        let bytes = self.stream.clone_dtoh(&g).map_err(cuda_err)?;
        self.stream.memset_zeros(&mut g).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)?;
        Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
    }

    /// Device-to-device copy bandwidth (bytes read + written per second) over
    /// `bytes`, median of a few copies.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let a: CudaSlice<u8> = self.stream.alloc_zeros(bytes).map_err(cuda_err)?;
        let b: CudaSlice<u8> = self.stream.alloc_zeros(bytes).map_err(cuda_err)?;
        let (pa, _) = a.device_ptr(&self.stream);
        let (pb, _) = b.device_ptr(&self.stream);
        let s = self.stream.cu_stream();
        let times = timing::time_on_stream(&self.stream, 7, || {
            // SAFETY: both allocations hold `bytes` bytes.
            launch::check(unsafe { sys::cuMemcpyDtoDAsync_v2(pb, pa, bytes, s) }, "cuMemcpyDtoDAsync")
        })?;
        let mut t = times;
        t.sort_by(f64::total_cmp);
        Ok(2.0 * bytes as f64 / t[t.len() / 2])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn arch_major_reads_the_compute_capability() {
        assert_eq!(super::arch_major("sm_90a"), 9);
        assert_eq!(super::arch_major("sm_90"), 9);
        assert_eq!(super::arch_major("sm_86"), 8);
        assert_eq!(super::arch_major("sm_100a"), 10);
        assert_eq!(super::arch_major("compute_x"), 0);
    }
}
