//! CUDA host code: device discovery, NVRTC compilation, the plan / run API.
//!
//! - [`CudaEngine::new`] binds a device (the primary context, the one torch
//!   uses) and reports *why* when no driver, no NVRTC or no GPU is there.
//! - [`CudaEngine::plan`] is [`crate::plan::plan`] with this device's
//!   properties; [`CudaEngine::workspace_bytes`] its workspace.
//! - [`CudaEngine::select_device`] launches a selection over caller-owned
//!   device buffers on a caller's stream: asynchronous, no allocation, no host
//!   synchronisation, so it can be captured in a CUDA graph.
//! - [`CudaEngine::select_host`] and [`CudaEngine::time_select`] are the
//!   host-memory conveniences used by the CLI.

pub mod check;
pub mod compile;
mod launch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};

use crate::contract::{error::cuda_err, Error, Result, ScoreElem, ScoresView, SelectSpec, Selection};
use crate::plan::{self, Buffer, DeviceProps, Plan};
pub use compile::{Compiled, KernelResources, Variant};

/// One asynchronous selection over caller-owned device buffers.
///
/// All pointers are `CUdeviceptr`s in the engine's context (torch tensors on the
/// same device qualify: torch uses the primary context).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSelect {
    pub spec: SelectSpec,
    /// Scores of `spec.dtype`, row `r` at `scores + r * row_stride * size`.
    pub scores: u64,
    /// Optional `i32` lengths, `rows` entries. Device-resident lengths cannot be
    /// checked without a host synchronisation: a row whose length is outside
    /// `0..=cols` comes out as all padding (nothing out of bounds is read).
    pub lengths: Option<u64>,
    /// `i32` output, `rows * k`.
    pub out_indices: u64,
    /// Optional values output in `spec.dtype`, `rows * k`.
    pub out_values: Option<u64>,
    /// Scratch of at least [`CudaEngine::workspace_bytes`] bytes, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// The `CUstream` to launch on (0: the legacy default stream).
    pub stream: u64,
}

/// The kernels of one compiled variant.
pub(crate) struct Kernels {
    pub(crate) module: Arc<cudarc::driver::CudaModule>,
    pub(crate) scan: [CudaFunction; 3],
    pub(crate) split: [CudaFunction; 3],
    pub(crate) prep: [CudaFunction; 3],
    /// The grid path's kernels by dtype slot (`None` for a tuning source
    /// without them): `fs_grid_*` (16 elements a thread), `fs_grid8_*`, and
    /// `fs_grid4_f32` (f32 only).
    pub(crate) grid: Option<[CudaFunction; 3]>,
    pub(crate) grid8: Option<[CudaFunction; 3]>,
    pub(crate) grid4: Option<CudaFunction>,
    pub(crate) grid_init: Option<CudaFunction>,
    /// Launch fs_split_* and fs_grid_* with programmatic stream serialisation
    /// (sm_90 or later, unless the defines say FS_PDL=0).
    pub(crate) pdl: bool,
    /// With `pdl`, also launch a call's first kernel (fs_grid_init_all,
    /// fs_prep_*, the row path's fs_scan_*) programmatically: it waits for
    /// the stream's previous kernel before touching anything (unless the
    /// defines say FS_PDL_CHAIN=0).
    pub(crate) pdl_chain: bool,
}

/// The CUDA engine bound to one device.
pub struct CudaEngine {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    props: DeviceProps,
    arch: &'static str,
    name: String,
    kernels: Mutex<HashMap<bool, Arc<Kernels>>>,
    /// Tuning switches (see [`Variant::defines`]), from `FLASHSEL_NVRTC_DEFINES`.
    defines: String,
    /// The planner switches among them, read once ([`path_options`]).
    path_opts: plan::PathOptions,
    /// Tuning: a candidate-buffer capacity to use instead of the planner's.
    cap_override: Option<u32>,
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
        };
        let stream = ctx.new_stream().map_err(cuda_err)?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        Ok(Self {
            ctx,
            stream,
            props,
            arch: arch_name(major, minor),
            name,
            kernels: Mutex::new(HashMap::new()),
            defines: String::new(),
            path_opts: plan::PathOptions::default(),
            cap_override: None,
        }
        .with_defines(std::env::var("FLASHSEL_NVRTC_DEFINES").unwrap_or_default()))
    }

    fn with_defines(mut self, defines: String) -> Self {
        self.path_opts = path_options(&defines);
        self.defines = defines;
        self
    }

    /// For tuning runs: extra kernel macro definitions and a buffer capacity
    /// that replaces the planner's (never below its minimum, `2k + tile`).
    #[doc(hidden)]
    pub fn with_tuning(mut self, defines: &str, cap: Option<u32>) -> Self {
        self = self.with_defines(defines.to_string());
        self.cap_override = cap;
        self.kernels = Mutex::new(HashMap::new());
        self
    }

    /// Reads and clears the `fs_prof` counters of a `FS_PROFILE=1` build.
    #[doc(hidden)]
    pub fn take_profile(&self) -> Result<Vec<u64>> {
        let k = self.kernels(false)?;
        let mut g = k.module.get_global("fs_prof", &self.stream).map_err(cuda_err)?;
        let bytes = self.stream.clone_dtoh(&g).map_err(cuda_err)?;
        self.stream.memset_zeros(&mut g).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)?;
        Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
    }

    /// The device's properties as the planner sees them.
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

    /// The plan for a selection on this device.
    pub fn plan(&self, spec: &SelectSpec, has_lengths: bool) -> Result<Plan> {
        let mut p = plan::plan_with(spec, has_lengths, &self.props, &self.path_opts)?;
        if let (Some(cap), Buffer::Shared) = (self.cap_override, p.buffer) {
            let min = plan::min_cap(spec.k) as u32; // a shared buffer's: fits a u32
            let room = self.props.max_smem_per_block - plan::STATIC_SMEM - p.stage_bytes;
            let max = plan::shared_cap(room as u64) as u32;
            p.cap = cap.clamp(min, max.max(min));
            p.smem_bytes = plan::shared_bytes(p.cap as u64, p.stage_bytes) as u32;
        }
        Ok(p)
    }

    /// Workspace a [`DeviceSelect`] with this spec needs.
    pub fn workspace_bytes(&self, spec: &SelectSpec, has_lengths: bool) -> Result<usize> {
        Ok(self.plan(spec, has_lengths)?.workspace_bytes as usize)
    }

    /// Compiles (or fetches) the kernels of a buffer kind. Call before graph
    /// capture to keep NVRTC out of it; [`Self::select_device`] calls it too.
    pub(crate) fn kernels(&self, global_buffer: bool) -> Result<Arc<Kernels>> {
        let mut map = self.kernels.lock().map_err(|_| Error::Cuda("kernel cache poisoned".into()))?;
        if let Some(k) = map.get(&global_buffer) {
            return Ok(k.clone());
        }
        let v = Variant { defines: self.defines.clone(), ..Variant::new(self.arch, global_buffer) };
        let c = compile::compile(&v)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(c.cubin))
            .map_err(|e| Error::Cuda(format!("loading the {} cubin: {e:?}", v.name())))?;
        let with_smem = |n: &str, dyn_bytes: u32| -> Result<CudaFunction> {
            let func = module.load_function(n).map_err(cuda_err)?;
            func.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dyn_bytes as i32,
            )
            .map_err(cuda_err)?;
            Ok(func)
        };
        let f = |n: &str| with_smem(n, self.props.max_smem_per_block - plan::STATIC_SMEM);
        let g = |n: &str| with_smem(n, plan::grid_smem_bytes(plan::GRID_MAX_K));
        let grid =
            match (g("fs_grid_f32"), g("fs_grid_bf16"), g("fs_grid_f16"), module.load_function("fs_grid_init_all")) {
                (Ok(a), Ok(b), Ok(c), Ok(i)) => (Some([a, b, c]), Some(i)),
                _ => (None, None),
            };
        let grid8 = match (g("fs_grid8_f32"), g("fs_grid8_bf16"), g("fs_grid8_f16")) {
            (Ok(a), Ok(b), Ok(c)) => Some([a, b, c]),
            _ => None,
        };
        // (A tuning source, src=, may predate the kernels' waits.)
        let pdl = !compile::define_items(&v.defines).any(|d| d == "FS_PDL=0" || d.starts_with("src="))
            && arch_major(self.arch) >= 9;
        let k = Arc::new(Kernels {
            module: module.clone(),
            scan: [f("fs_scan_f32")?, f("fs_scan_bf16")?, f("fs_scan_f16")?],
            split: [f("fs_split_f32")?, f("fs_split_bf16")?, f("fs_split_f16")?],
            prep: [f("fs_prep_f32")?, f("fs_prep_bf16")?, f("fs_prep_f16")?],
            grid: grid.0,
            grid8,
            grid4: g("fs_grid4_f32").ok(),
            grid_init: grid.1,
            pdl,
            pdl_chain: pdl && !compile::define_items(&v.defines).any(|d| d == "FS_PDL_CHAIN=0"),
        });
        map.insert(global_buffer, k.clone());
        Ok(k)
    }

    /// Compiles and loads every kernel variant now (NVRTC out of later calls).
    pub fn warm_up(&self) -> Result<()> {
        self.kernels(false)?;
        self.kernels(true)?;
        Ok(())
    }

    /// Launches the selection on `args.stream`; returns without waiting.
    ///
    /// On sm_90 and later the launches are programmatic (PDL): the first
    /// kernel waits for the stream's previous kernel before it reads
    /// anything, and the last lets the stream's next kernel launch early. A
    /// kernel launched programmatically after this call must wait
    /// (`griddepcontrol.wait`) before it reads the outputs; one launched
    /// plainly needs nothing.
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context, and `args.stream` a stream of that context.
    pub unsafe fn select_device(&self, args: &DeviceSelect) -> Result<()> {
        let spec = &args.spec;
        spec.validate()?;
        let plan = self.plan(spec, args.lengths.is_some())?;
        if (args.workspace_bytes as u64) < plan.workspace_bytes {
            return Err(Error::BufferSize {
                what: "workspace (bytes)",
                got: args.workspace_bytes,
                need: plan.workspace_bytes as usize,
            });
        }
        if plan.workspace_bytes > 0 && !args.workspace.is_multiple_of(256) {
            return Err(Error::InvalidOption {
                what: "workspace pointer",
                value: format!("{:#x}", args.workspace),
                expected: "256-byte aligned",
            });
        }
        if spec.rows == 0 {
            return Ok(());
        }
        let kernels = self.kernels(plan.buffer == Buffer::Global)?;
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        launch::run(&kernels, &plan, args)
    }

    /// Selects from host data: uploads, runs on the engine's stream, downloads.
    /// The outputs are poisoned before the run, so an unwritten element shows.
    pub fn select_host<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
    ) -> Result<Selection<T>> {
        let dev = DeviceData::upload(self, scores, spec, lengths)?;
        dev.poison(self)?;
        // SAFETY: every buffer was allocated above with the sizes the spec needs.
        unsafe { self.select_device(&dev.args(self, spec))? };
        dev.download(self, spec)
    }

    /// Uploads once, then times `iters` runs on the device. Runs shorter than
    /// ~50 us are timed as CUDA-graph replays of 20 launches (divided by 20),
    /// longer ones with events around each launch.
    pub fn time_select<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
        iters: usize,
    ) -> Result<(Selection<T>, Vec<f64>)> {
        let dev = DeviceData::upload(self, scores, spec, lengths)?;
        dev.poison(self)?;
        let args = dev.args(self, spec);
        // SAFETY: buffers sized for the spec, as above.
        let run = || unsafe { self.select_device(&args) };
        run()?;
        let out = dev.download(self, spec)?;
        let times = launch::time_on_stream(&self.stream, iters, run)?;
        Ok((out, times))
    }

    /// Device-to-device copy bandwidth (bytes read + written per second) over
    /// `bytes`, median of a few copies.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let a: CudaSlice<u8> = self.stream.alloc_zeros(bytes).map_err(cuda_err)?;
        let b: CudaSlice<u8> = self.stream.alloc_zeros(bytes).map_err(cuda_err)?;
        let (pa, _) = a.device_ptr(&self.stream);
        let (pb, _) = b.device_ptr(&self.stream);
        let s = self.stream.cu_stream();
        let times = launch::time_on_stream(&self.stream, 7, || {
            // SAFETY: both allocations hold `bytes` bytes.
            launch::check(unsafe { sys::cuMemcpyDtoDAsync_v2(pb, pa, bytes, s) }, "cuMemcpyDtoDAsync")
        })?;
        let mut t = times;
        t.sort_by(f64::total_cmp);
        Ok(2.0 * bytes as f64 / t[t.len() / 2])
    }
}

/// Device copies of one host problem.
struct DeviceData {
    scores: CudaSlice<u8>,
    lengths: Option<CudaSlice<i32>>,
    out_idx: CudaSlice<i32>,
    out_val: CudaSlice<u8>,
    workspace: CudaSlice<u8>,
    workspace_bytes: usize,
    elem: usize,
}

impl DeviceData {
    fn upload<T: ScoreElem>(
        e: &CudaEngine,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
    ) -> Result<Self> {
        spec.validate_host(scores, lengths)?;
        let s = &e.stream;
        let elem = std::mem::size_of::<T>();
        let n = spec.elements_needed();
        let mut host = Vec::with_capacity(n * elem);
        for r in 0..spec.rows {
            let row = scores.row(r);
            // SAFETY: f32 / bf16 / f16 are plain bits.
            let bytes = unsafe { std::slice::from_raw_parts(row.as_ptr() as *const u8, std::mem::size_of_val(row)) };
            host.extend_from_slice(bytes);
            if r + 1 < spec.rows {
                host.resize((r + 1) * spec.row_stride * elem, 0);
            }
        }
        let dscores = s.clone_htod(&host[..]).map_err(cuda_err)?;
        let dlen = match lengths {
            Some(l) => Some(s.clone_htod(l).map_err(cuda_err)?),
            None => None,
        };
        let outn = (spec.rows * spec.k).max(1);
        let wb = e.workspace_bytes(spec, lengths.is_some())?;
        Ok(Self {
            scores: dscores,
            lengths: dlen,
            out_idx: s.alloc_zeros(outn).map_err(cuda_err)?,
            out_val: s.alloc_zeros(outn * elem).map_err(cuda_err)?,
            workspace: s.alloc_zeros(wb.max(256)).map_err(cuda_err)?,
            workspace_bytes: wb,
            elem,
        })
    }

    fn poison(&self, e: &CudaEngine) -> Result<()> {
        let s = e.stream.cu_stream();
        let (pi, _) = self.out_idx.device_ptr(&e.stream);
        let (pv, _) = self.out_val.device_ptr(&e.stream);
        let (pw, _) = self.workspace.device_ptr(&e.stream);
        // SAFETY: sizes are the allocations' own.
        unsafe {
            launch::poison(pi, 0x5a, self.out_idx.len() * 4, s)?;
            launch::poison(pv, 0x7f, self.out_val.len(), s)?;
            launch::poison(pw, 0xa5, self.workspace.len(), s)?;
        }
        Ok(())
    }

    fn args(&self, e: &CudaEngine, spec: &SelectSpec) -> DeviceSelect {
        let st = &e.stream;
        DeviceSelect {
            spec: *spec,
            scores: self.scores.device_ptr(st).0,
            lengths: self.lengths.as_ref().map(|l| l.device_ptr(st).0),
            out_indices: self.out_idx.device_ptr(st).0,
            out_values: Some(self.out_val.device_ptr(st).0),
            workspace: self.workspace.device_ptr(st).0,
            workspace_bytes: self.workspace_bytes,
            stream: st.cu_stream() as u64,
        }
    }

    fn download<T: ScoreElem>(&self, e: &CudaEngine, spec: &SelectSpec) -> Result<Selection<T>> {
        let s = &e.stream;
        let n = spec.rows * spec.k;
        let mut idx = s.clone_dtoh(&self.out_idx).map_err(cuda_err)?;
        let val = s.clone_dtoh(&self.out_val).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        idx.truncate(n);
        let mut values = Vec::with_capacity(n);
        for j in 0..n {
            let b = &val[j * self.elem..(j + 1) * self.elem];
            // SAFETY: T is f32 / bf16 / f16, `elem` bytes of plain bits.
            values.push(unsafe { std::ptr::read_unaligned(b.as_ptr() as *const T) });
        }
        Ok(Selection { rows: spec.rows, k: spec.k, indices: idx, values })
    }
}

/// The major compute capability of an arch name such as `sm_90a` or `sm_86`.
fn arch_major(arch: &str) -> u32 {
    let digits: String = arch.trim_start_matches("sm_").chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse::<u32>().map_or(0, |n| n / 10)
}

/// The planner switches of tuning defines (`FLASHSEL_NVRTC_DEFINES` or
/// [`CudaEngine::with_tuning`]): `grid=0` checks and times the split path on
/// the grid path's geometries; `gridchunk=N` sets the grid path's smallest
/// share of a row per CTA, `gridplace=N` its placement bound; `grid8=0`
/// keeps grid rows on the 16-element kernels.
fn path_options(defines: &str) -> plan::PathOptions {
    let mut o = plan::PathOptions::default();
    for d in compile::define_items(defines) {
        if d == "grid=0" {
            o.grid = false;
        } else if let Some(n) = d.strip_prefix("gridchunk=").and_then(|n| n.parse().ok()) {
            o.grid_min_chunk = Some(n);
        } else if let Some(n) = d.strip_prefix("gridplace=").and_then(|n| n.parse().ok()) {
            o.grid_place_max = n;
        } else if d == "grid8=0" {
            o.grid_small_items = false;
        }
    }
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn planner_switches_come_from_the_tuning_defines() {
        assert_eq!(super::path_options(""), crate::plan::PathOptions::default());
        let o = super::path_options("FS_PDL=0, grid=0,gridchunk=2048 ,gridplace=99, grid8=0");
        assert_eq!((o.grid, o.grid_min_chunk, o.grid_place_max, o.grid_small_items), (false, Some(2048), 99, false));
    }

    #[test]
    fn arch_major_reads_the_compute_capability() {
        assert_eq!(super::arch_major("sm_90a"), 9);
        assert_eq!(super::arch_major("sm_90"), 9);
        assert_eq!(super::arch_major("sm_86"), 8);
        assert_eq!(super::arch_major("sm_100a"), 10);
        assert_eq!(super::arch_major("compute_x"), 0);
    }
}
