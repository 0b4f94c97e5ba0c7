//! Run-time compilation of the kernels with NVRTC, to a cubin for the device's
//! architecture, cached on disk.
//!
//! Works without a GPU (NVRTC needs no driver), so CI compiles every variant
//! and checks the resource report: `flashsel kernels --compile-only`.
//!
//! Cache key: SHA-256 of the source, the options, the NVRTC version and the
//! architecture. Cache directory: `$FLASHSEL_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/flashsel`, else `~/.cache/flashsel`; `FLASHSEL_CACHE_DIR=off`
//! disables it.

use std::ffi::CString;
use std::path::PathBuf;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use sha2::{Digest, Sha256};

use crate::contract::{Error, Result};

/// The kernel source, embedded at build time.
pub const SELECT_SOURCE: &str = include_str!("../../kernels/select.cu");

/// Every kernel entry point in [`SELECT_SOURCE`].
pub const SELECT_KERNELS: [&str; 17] = [
    "fs_scan_f32",
    "fs_scan_bf16",
    "fs_scan_f16",
    "fs_split_f32",
    "fs_split_bf16",
    "fs_split_f16",
    "fs_prep_f32",
    "fs_prep_bf16",
    "fs_prep_f16",
    "fs_grid_f32",
    "fs_grid_bf16",
    "fs_grid_f16",
    "fs_grid8_f32",
    "fs_grid8_bf16",
    "fs_grid8_f16",
    "fs_grid4_f32",
    "fs_grid_init_all",
];

/// One compiled variant of the kernel source.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Variant {
    /// e.g. `sm_90a`, `sm_80`.
    pub arch: &'static str,
    pub block: u32,
    pub global_buffer: bool,
    /// Extra `NAME=VALUE` macro definitions, comma separated (tuning and
    /// profiling switches such as `FS_HIST=1,FS_PROFILE=1`); empty by default.
    /// Items that start with a lower-case letter are host switches, never
    /// macros ([`is_host_switch`]): `src=PATH` compiles the source at PATH in
    /// place of [`SELECT_SOURCE`] (A/B timing against another version of the
    /// kernels); `grid=0`, `gridchunk=N`, `gridplace=N` and `grid8=0` are
    /// planner switches (plans keep off the grid path; its smallest share of
    /// a row per CTA; its placement bound; grid rows keep to the 16-element
    /// kernels).
    pub defines: String,
}

/// The items of a comma-separated [`Variant::defines`] string, trimmed,
/// empty ones skipped.
pub fn define_items(defines: &str) -> impl Iterator<Item = &str> {
    defines.split(',').map(str::trim).filter(|d| !d.is_empty())
}

/// Whether an item of [`Variant::defines`] is a host switch (lower case:
/// `src=`, `grid=`, ...) rather than a kernel macro (`FS_...`).
pub fn is_host_switch(item: &str) -> bool {
    item.starts_with(|c: char| c.is_ascii_lowercase())
}

impl Variant {
    /// The default variant of an architecture and buffer kind.
    pub fn new(arch: &'static str, global_buffer: bool) -> Self {
        Self { arch, block: crate::plan::BLOCK, global_buffer, defines: String::new() }
    }

    pub fn name(&self) -> String {
        format!(
            "select[{} block={} buffer={}{}{}]",
            self.arch,
            self.block,
            if self.global_buffer { "global" } else { "shared" },
            if self.defines.is_empty() { "" } else { " " },
            self.defines
        )
    }

    /// The `src=PATH` item of `defines`, if any.
    fn source_path(&self) -> Option<&str> {
        define_items(&self.defines).find_map(|d| d.strip_prefix("src="))
    }

    fn options(&self) -> Vec<String> {
        let extra = define_items(&self.defines).filter(|d| !is_host_switch(d)).map(|d| format!("-D{d}"));
        let mut o = vec![
            format!("--gpu-architecture={}", self.arch),
            "-std=c++17".into(),
            "--ptxas-options=-v".into(),
            "-lineinfo".into(),
            format!("-DFS_BLOCK={}", self.block),
            format!("-DFS_GLOBAL_BUF={}", self.global_buffer as u32),
            format!("-DFS_HOST_GRID_MAX_K={}", crate::plan::GRID_MAX_K),
            format!("-DFS_HOST_GRID_SMALL={}", crate::plan::GRID_SMALL),
            format!("-DFS_HOST_GRID_STATE_WORDS={}", crate::plan::GRID_STATE_WORDS),
            format!("-DFS_HOST_STAGE_BYTES={}", crate::plan::STAGE_BYTES),
        ];
        o.extend(extra);
        o
    }
}

/// The architectures CI compiles for: Hopper (`sm_90a`, and plain `sm_90`: the
/// portable build forced on Hopper with `FLASHSEL_ARCH=sm_90`) and the portable
/// sm_80+ family.
pub const ARCHS: [&str; 5] = ["sm_90a", "sm_90", "sm_80", "sm_86", "sm_89"];

/// Resource use of one kernel, parsed from ptxas' report.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct KernelResources {
    pub kernel: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    pub static_smem: u32,
}

/// A compiled variant.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub log: String,
    pub resources: Vec<KernelResources>,
    pub from_cache: bool,
}

/// Whether `libnvrtc` can be loaded, with the reason when not.
pub fn nvrtc_available() -> std::result::Result<(), String> {
    // SAFETY: only probes dlopen.
    if unsafe { nvrtc_sys::is_culib_present() } {
        Ok(())
    } else {
        Err("libnvrtc.so (NVRTC 13) was not found by the dynamic loader: install the CUDA toolkit or the \
             nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH"
            .into())
    }
}

/// NVRTC's version, e.g. (13, 0).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc_available().map_err(Error::BackendUnavailable)?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: two out-pointers to live ints.
    let r = unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Cuda(format!("nvrtcVersion: {r:?}")));
    }
    Ok((a, b))
}

fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("FLASHSEL_CACHE_DIR") {
        Some(d) if d == "off" => None,
        Some(d) => Some(PathBuf::from(d)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(|d| PathBuf::from(d).join("flashsel"))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("flashsel"))),
    }
}

/// Compiles (or loads from the cache) one variant.
pub fn compile(v: &Variant) -> Result<Compiled> {
    let version = nvrtc_version()?;
    let opts = v.options();
    let source = match v.source_path() {
        Some(p) => std::borrow::Cow::Owned(
            std::fs::read_to_string(p).map_err(|e| Error::Cuda(format!("kernel source {p}: {e}")))?,
        ),
        None => std::borrow::Cow::Borrowed(SELECT_SOURCE),
    };
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in &opts {
        h.update(o.as_bytes());
        h.update([0]);
    }
    h.update(format!("nvrtc {}.{}", version.0, version.1).as_bytes());
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let dir = cache_dir();
    if let Some(d) = &dir {
        let (bin, log) = (d.join(format!("{key}.cubin")), d.join(format!("{key}.log")));
        if let (Ok(cubin), Ok(log)) = (std::fs::read(&bin), std::fs::read_to_string(&log)) {
            let resources = parse_ptxas(&log);
            return Ok(Compiled { cubin, log, resources, from_cache: true });
        }
    }
    let (cubin, log) = nvrtc_compile(&source, "select.cu", &opts)?;
    if let Some(d) = &dir {
        // The cache is an optimisation: failures to write it are ignored.
        if std::fs::create_dir_all(d).is_ok() {
            let tmp = d.join(format!("{key}.{}.tmp", std::process::id()));
            if std::fs::write(&tmp, &cubin).is_ok() {
                let _ = std::fs::rename(&tmp, d.join(format!("{key}.cubin")));
            }
            let _ = std::fs::write(d.join(format!("{key}.log")), &log);
        }
    }
    let resources = parse_ptxas(&log);
    Ok(Compiled { cubin, log, resources, from_cache: false })
}

fn nvrtc_compile(src: &str, name: &str, opts: &[String]) -> Result<(Vec<u8>, String)> {
    let csrc = CString::new(src).map_err(|e| Error::Cuda(e.to_string()))?;
    let cname = CString::new(name).map_err(|e| Error::Cuda(e.to_string()))?;
    let prog = nvrtc::create_program(&csrc, Some(&cname)).map_err(|e| Error::Cuda(format!("{e:?}")))?;
    // SAFETY: `prog` is live until destroy_program below; csrc/cname outlive it.
    unsafe {
        let compiled = nvrtc::compile_program(prog, opts);
        let log = nvrtc::get_program_log(prog)
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        if let Err(e) = compiled {
            let _ = nvrtc::destroy_program(prog);
            return Err(Error::Cuda(format!("NVRTC failed to compile {name} ({e:?}):\n{log}")));
        }
        let mut size = 0usize;
        let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
        if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            let _ = nvrtc::destroy_program(prog);
            return Err(Error::Cuda(format!("nvrtcGetCUBINSize: {r:?} (was a real sm_XX architecture given?)")));
        }
        let mut cubin = vec![0u8; size];
        let r = nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _);
        let _ = nvrtc::destroy_program(prog);
        if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::Cuda(format!("nvrtcGetCUBIN: {r:?}")));
        }
        Ok((cubin, log))
    }
}

/// Parses ptxas `-v` output: per function (entry points and out-of-line
/// device functions), registers, spills, stack, smem.
pub fn parse_ptxas(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let mut cur: Option<KernelResources> = None;
    let num_before = |line: &str, unit: &str| -> Option<u32> {
        let i = line.find(unit)?;
        line[..i].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            if let Some(c) = cur.take() {
                out.push(c);
            }
            let rest = &line[i + "Compiling entry function '".len()..];
            let name = rest.split('\'').next().unwrap_or("").to_string();
            cur = Some(KernelResources { kernel: name, ..Default::default() });
        } else if let Some(i) = line.find("Function properties for ") {
            // A device function of its own (noinline): a record of its own, so
            // its spills are seen too.
            let name = line[i + "Function properties for ".len()..].trim().to_string();
            if cur.as_ref().is_none_or(|c| c.kernel != name) {
                if let Some(c) = cur.take() {
                    out.push(c);
                }
                cur = Some(KernelResources { kernel: name, ..Default::default() });
            }
        } else if let Some(c) = cur.as_mut() {
            if line.contains("bytes stack frame") {
                c.stack_bytes = num_before(line, "bytes stack frame").unwrap_or(0);
                c.spill_stores = num_before(line, "bytes spill stores").unwrap_or(0);
                c.spill_loads = num_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                c.registers = num_before(line, "registers").unwrap_or(0);
                c.static_smem = num_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out.extend(cur);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_ptxas_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'fs_scan_f32' for 'sm_90a'\n\
ptxas info    : Function properties for fs_scan_f32\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 2096 bytes smem, 496 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'fs_merge_f32' for 'sm_90a'\n\
ptxas info    : Function properties for fs_merge_f32\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 32 registers, 2096 bytes smem, 496 bytes cmem[0]\n";
        let r = parse_ptxas(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelResources {
                kernel: "fs_scan_f32".into(),
                registers: 40,
                spill_stores: 4,
                spill_loads: 12,
                stack_bytes: 8,
                static_smem: 2096
            }
        );
        assert_eq!((r[1].registers, r[1].spill_stores), (32, 0));
    }

    #[test]
    fn a_source_override_is_not_a_macro() {
        let v =
            Variant { defines: "FS_SEG=16, src=/tmp/other.cu,FS_PROFILE=1".into(), ..Variant::new("sm_90a", false) };
        assert_eq!(v.source_path(), Some("/tmp/other.cu"));
        let o = v.options();
        assert!(o.contains(&"-DFS_SEG=16".to_string()) && o.contains(&"-DFS_PROFILE=1".to_string()));
        assert!(!o.iter().any(|x| x.contains("src=")), "{o:?}");
        let v = Variant { defines: "grid=0,gridchunk=4096,FS_PDL=0".into(), ..Variant::new("sm_90a", false) };
        let o = v.options();
        assert!(!o.iter().any(|x| x.contains("grid")), "{o:?}");
        assert!(o.contains(&"-DFS_PDL=0".to_string()));
        assert_eq!(Variant::new("sm_80", true).source_path(), None);
        assert_eq!(define_items(" FS_SEG=8, ,grid=0,").collect::<Vec<_>>(), ["FS_SEG=8", "grid=0"]);
    }
}
