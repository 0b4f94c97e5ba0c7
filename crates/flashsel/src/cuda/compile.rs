//! Run-time compilation of the kernel modules with NVRTC, to a cubin for the
//! device's architecture, cached on disk.
//!
//! A *module* is one NVRTC program: an entry file (`kernels/<op>/<name>.cu`)
//! and the headers it includes (`kernels/common/*.cuh`, the op's own). Every
//! file under `kernels/` is embedded at build time (build.rs); NVRTC gets the
//! headers in memory, so nothing is read from disk at run time.
//!
//! Works without a GPU (NVRTC needs no driver), so CI compiles every module
//! that ships and checks ptxas' resource report (`tests/kernels_compile.rs`,
//! `flashsel kernels --compile-only`).
//!
//! Cache key: SHA-256 of the entry file's name and text, every embedded
//! header's name and text, the options, the NVRTC version and the
//! architecture. Cache directory: `$FLASHSEL_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/flashsel`, else `~/.cache/flashsel`;
//! `FLASHSEL_CACHE_DIR=off` disables it.

use std::ffi::{c_char, CString};
use std::path::PathBuf;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use sha2::{Digest, Sha256};

use crate::contract::{CudaError, Error, Result};
use crate::ops::select::plan;

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// The kernel modules, one NVRTC program each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Module {
    /// The select operation's streaming filter: the row path (`fs_scan_*`)
    /// and the split path (`fs_prep_*`, `fs_split_*`).
    SelectFilter,
    /// The select operation's grid path (`fs_grid_init_all`, `fs_grid*_*`).
    SelectGrid,
    /// The filter kernels' token form (`fs_scan_tok_*`, `fs_prep_tok_*`,
    /// `fs_split_tok_*`): rows as ranges or QSA blocks, ids written as
    /// tokens or KV slots (kernels/select/tokens.cuh). Its own program, so
    /// that the plain kernels' code stays as measured.
    SelectFilterTokens,
    /// The grid kernels' token form (`fs_grid*_tok_*`).
    SelectGridTokens,
    /// The QSA indexer's block scores (`qsa_scores_*`, kernels/indexer/).
    IndexerQsa,
    /// The QSA scorer's staged form (`qsa_staged_*`, kernels/indexer/):
    /// keys staged through shared memory for many rows of one sequence.
    IndexerQsaStaged,
    /// The DSA indexer's scores (`dsa_scores_*`, kernels/indexer/dsa_scores.cu):
    /// the CPU engine's f32 arithmetic on CUDA cores.
    IndexerDsa,
    /// The fused decode indexer (`qsa_decode_*`, kernels/indexer/): scores
    /// kept on chip, selected across a row's CTAs (cooperative).
    IndexerQsaDecode,
    /// Sparse MLA attention (kernels/attention/sparse_mla.cu): the one-pass
    /// kernels `mla_fwd_q{f32,bf16}_kv{f32,bf16,fp8}` (prefill and decode)
    /// and the split-KV combine `mla_combine_{f32,bf16}`.
    SparseMla,
    /// QSA sparse attention (kernels/attention/sparse_qsa.cu): the one-pass
    /// kernels `qsa_attn_fwd_q{f32,bf16}_kv{f32,bf16}` and the split-KV
    /// combine `qsa_attn_combine_{f32,bf16}`.
    SparseQsa,
    /// The short-row path (`fs_short_*`, `fs_short_tok_*`): rows that fit a
    /// CTA's shared memory, one CTA each; and its warp form
    /// (`fs_short_warp_*`, `fs_short_warp_tok_*`), one warp a row; and its
    /// wide form (`fs_short_wide_*`, `fs_short_wide_tok_*`), one CTA a row
    /// with the row in registers, for few rows (kernels/select/short.cu).
    SelectShort,
    /// The context-parallel merge (kernels/shard/merge.cu): the ranks'
    /// candidates compacted for the select engine (`sh_pack_b32`,
    /// `sh_pack_b16`) and the merged ids written back (`sh_write`).
    ShardMerge,
}

impl Module {
    pub const ALL: [Module; 12] = [
        Module::SelectFilter,
        Module::SelectGrid,
        Module::SelectFilterTokens,
        Module::SelectGridTokens,
        Module::IndexerQsa,
        Module::IndexerQsaStaged,
        Module::IndexerQsaDecode,
        Module::IndexerDsa,
        Module::SparseMla,
        Module::SparseQsa,
        Module::SelectShort,
        Module::ShardMerge,
    ];

    /// The module's name: its entry file under `kernels/`, without `.cu`.
    pub fn name(self) -> &'static str {
        match self {
            Module::SelectFilter => "select/filter",
            Module::SelectGrid => "select/grid",
            Module::SelectFilterTokens => "select/filter_tokens",
            Module::SelectGridTokens => "select/grid_tokens",
            Module::SelectShort => "select/short",
            Module::IndexerQsa => "indexer/qsa_scores",
            Module::IndexerQsaStaged => "indexer/qsa_staged",
            Module::IndexerQsaDecode => "indexer/qsa_decode",
            Module::IndexerDsa => "indexer/dsa_scores",
            Module::SparseMla => "attention/sparse_mla",
            Module::SparseQsa => "attention/sparse_qsa",
            Module::ShardMerge => "shard/merge",
        }
    }

    /// Every kernel entry point of the module.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Module::SelectFilter => &[
                "fs_scan_f32",
                "fs_scan_bf16",
                "fs_scan_f16",
                "fs_split_f32",
                "fs_split_bf16",
                "fs_split_f16",
                "fs_prep_f32",
                "fs_prep_bf16",
                "fs_prep_f16",
            ],
            Module::SelectFilterTokens => &[
                "fs_scan_tok_f32",
                "fs_scan_tok_bf16",
                "fs_scan_tok_f16",
                "fs_split_tok_f32",
                "fs_split_tok_bf16",
                "fs_split_tok_f16",
                "fs_prep_tok_f32",
                "fs_prep_tok_bf16",
                "fs_prep_tok_f16",
            ],
            Module::SelectGrid => &[
                "fs_grid_f32",
                "fs_grid_bf16",
                "fs_grid_f16",
                "fs_grid8_f32",
                "fs_grid8_bf16",
                "fs_grid8_f16",
                "fs_grid4_f32",
                "fs_grid_init_all",
            ],
            Module::SelectGridTokens => &[
                "fs_grid_tok_f32",
                "fs_grid_tok_bf16",
                "fs_grid_tok_f16",
                "fs_grid8_tok_f32",
                "fs_grid8_tok_bf16",
                "fs_grid8_tok_f16",
                "fs_grid4_tok_f32",
            ],
            Module::SelectShort => &[
                "fs_short_f32",
                "fs_short_bf16",
                "fs_short_f16",
                "fs_short_tok_f32",
                "fs_short_tok_bf16",
                "fs_short_tok_f16",
                "fs_short_warp_f32",
                "fs_short_warp_bf16",
                "fs_short_warp_f16",
                "fs_short_warp_tok_f32",
                "fs_short_warp_tok_bf16",
                "fs_short_warp_tok_f16",
                "fs_short_wide_f32",
                "fs_short_wide_bf16",
                "fs_short_wide_f16",
                "fs_short_wide_tok_f32",
                "fs_short_wide_tok_bf16",
                "fs_short_wide_tok_f16",
                "fs_short_cluster_f32",
                "fs_short_cluster_bf16",
                "fs_short_cluster_f16",
                "fs_short_cluster_tok_f32",
                "fs_short_cluster_tok_bf16",
                "fs_short_cluster_tok_f16",
            ],
            Module::IndexerQsa => &crate::ops::indexer::device::SCORE_ENTRIES,
            Module::IndexerQsaStaged => &crate::ops::indexer::device::STAGED_ENTRIES,
            Module::IndexerQsaDecode => &crate::ops::indexer::device::DECODE_ENTRIES,
            Module::IndexerDsa => &crate::ops::dsa::device::DSA_ENTRIES,
            Module::SparseMla => &crate::ops::mla::device::MLA_ENTRIES,
            Module::SparseQsa => &crate::ops::qsa_attention::device::QSA_ATTN_ENTRIES,
            Module::ShardMerge => &crate::ops::shard::device::MERGE_ENTRIES,
        }
    }

    /// Whether the module is built twice, with its candidate buffers in
    /// shared memory or in global memory (`FS_GLOBAL_BUF`).
    pub fn has_buffer_variants(self) -> bool {
        matches!(self, Module::SelectFilter | Module::SelectFilterTokens)
    }

    /// The entry file's path under `kernels/`.
    fn entry_file(self) -> String {
        format!("{}.cu", self.name())
    }
}

/// The architectures CI compiles for: Hopper (`sm_90a`, and plain `sm_90`: the
/// portable build forced on Hopper with `FLASHSEL_ARCH=sm_90`) and the portable
/// sm_80+ family.
pub const ARCHS: [&str; 5] = ["sm_90a", "sm_90", "sm_80", "sm_86", "sm_89"];

/// One compiled variant of a module.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Variant {
    pub module: Module,
    /// e.g. `sm_90a`, `sm_80`.
    pub arch: &'static str,
    /// The global-buffer build (modules with [`Module::has_buffer_variants`]).
    pub global_buffer: bool,
    /// With the phase counters (`FS_PROFILE=1`).
    pub profile: bool,
}

impl Variant {
    /// The shipped variant of a module for an architecture and buffer kind.
    pub fn new(module: Module, arch: &'static str, global_buffer: bool) -> Self {
        Self { module, arch, global_buffer: global_buffer && module.has_buffer_variants(), profile: false }
    }

    pub fn name(&self) -> String {
        let buffer = if !self.module.has_buffer_variants() {
            ""
        } else if self.global_buffer {
            " buffer=global"
        } else {
            " buffer=shared"
        };
        format!("{}[{}{buffer}{}]", self.module.name(), self.arch, if self.profile { " profile" } else { "" })
    }

    fn options(&self) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={}", self.arch),
            "-std=c++17".into(),
            "--ptxas-options=-v".into(),
            "-lineinfo".into(),
            format!("-DFS_BLOCK={}", plan::BLOCK),
            format!("-DFS_HOST_GRID_MAX_K={}", plan::GRID_MAX_K),
            format!("-DFS_HOST_GRID_SMALL={}", plan::GRID_SMALL),
            format!("-DFS_HOST_GRID_STATE_WORDS={}", plan::GRID_STATE_WORDS),
            format!("-DFS_HOST_STAGE_BYTES={}", plan::STAGE_BYTES),
        ];
        if self.module.has_buffer_variants() {
            o.push(format!("-DFS_GLOBAL_BUF={}", self.global_buffer as u32));
        }
        if self.module == Module::SelectShort {
            o.push(format!("-DFS_SHORT_BLOCK={}", plan::SHORT_BLOCK));
            o.push(format!("-DFS_SHORT_WARPS={}", plan::SHORT_WARPS));
            o.push(format!("-DFS_SHORT_WIDE_BLOCK={}", plan::SHORT_WIDE_BLOCK));
            o.push(format!("-DFS_SHORT_CLUSTER_CTAS={}", plan::SHORT_CLUSTER_CTAS));
        }
        if self.profile {
            o.push("-DFS_PROFILE=1".into());
        }
        o
    }
}

/// Every variant that ships for `arch`: each module, in each buffer kind it
/// has, without profiling.
pub fn shipped_variants(arch: &'static str) -> Vec<Variant> {
    Module::ALL
        .into_iter()
        .flat_map(|m| {
            let kinds: &[bool] = if m.has_buffer_variants() { &[false, true] } else { &[false] };
            kinds.iter().map(move |&g| Variant::new(m, arch, g))
        })
        .collect()
}

/// The embedded text of a kernel source (path relative to `kernels/`).
fn source(path: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(p, _)| *p == path).map(|(_, s)| *s)
}

/// The headers handed to NVRTC with the program of `entry`: every other
/// embedded source.
fn headers(entry: &str) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
    SOURCES.iter().copied().filter(move |(p, _)| *p != entry)
}

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

fn nvrtc_error(call: &str, r: nvrtc_sys::nvrtcResult) -> Error {
    Error::Cuda(CudaError::Nvrtc { call: call.into(), name: format!("{r:?}") })
}

/// NVRTC's version, e.g. (13, 0).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc_available().map_err(Error::BackendUnavailable)?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: two out-pointers to live ints.
    let r = unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_error("nvrtcVersion", r));
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

/// The cache key of a program: every input that can change the cubin.
fn cache_key(entry: &str, entry_text: &str, headers: &[(&str, &str)], opts: &[String], nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(entry.as_bytes());
    field(entry_text.as_bytes());
    for (name, text) in headers {
        field(name.as_bytes());
        field(text.as_bytes());
    }
    for o in opts {
        field(o.as_bytes());
    }
    field(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compiles (or loads from the cache) one variant.
pub fn compile(v: &Variant) -> Result<Compiled> {
    let version = nvrtc_version()?;
    let opts = v.options();
    let entry = v.module.entry_file();
    let text = source(&entry)
        .ok_or_else(|| Error::cuda_other(format!("no kernel source {entry} is embedded (kernels/{entry})")))?;
    let headers: Vec<(&str, &str)> = headers(&entry).collect();
    let key = cache_key(&entry, text, &headers, &opts, version);
    let dir = cache_dir();
    if let Some(d) = &dir {
        let (bin, log) = (d.join(format!("{key}.cubin")), d.join(format!("{key}.log")));
        if let (Ok(cubin), Ok(log)) = (std::fs::read(&bin), std::fs::read_to_string(&log)) {
            let resources = parse_ptxas(&log);
            return Ok(Compiled { cubin, log, resources, from_cache: true });
        }
    }
    let (cubin, log) = nvrtc_compile(&v.name(), &entry, text, &headers, &opts)?;
    if let Some(d) = &dir {
        // The cache is an optimisation: failures to write it are ignored.
        // The log goes first: a cubin is only read beside its log.
        if std::fs::create_dir_all(d).is_ok() {
            let _ = std::fs::write(d.join(format!("{key}.log")), &log);
            let tmp = d.join(format!("{key}.{}.tmp", std::process::id()));
            if std::fs::write(&tmp, &cubin).is_ok() {
                let _ = std::fs::rename(&tmp, d.join(format!("{key}.cubin")));
            }
        }
    }
    let resources = parse_ptxas(&log);
    Ok(Compiled { cubin, log, resources, from_cache: false })
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|e| Error::cuda_other(format!("a kernel source holds a NUL byte: {e}")))
}

/// One NVRTC program: `entry` (named `name`) with `headers` in memory, to a cubin.
fn nvrtc_compile(
    module: &str,
    name: &str,
    src: &str,
    headers: &[(&str, &str)],
    opts: &[String],
) -> Result<(Vec<u8>, String)> {
    let csrc = cstring(src)?;
    let cname = cstring(name)?;
    let texts: Vec<CString> = headers.iter().map(|(_, t)| cstring(t)).collect::<Result<_>>()?;
    let names: Vec<CString> = headers.iter().map(|(n, _)| cstring(n)).collect::<Result<_>>()?;
    let text_ptrs: Vec<*const c_char> = texts.iter().map(|c| c.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
    let mut prog: nvrtc_sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string that outlives
    // the program (destroyed below); the two arrays hold `headers.len()` each.
    let r = unsafe {
        nvrtc_sys::nvrtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            headers.len() as i32,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_error("nvrtcCreateProgram", r));
    }
    // SAFETY: `prog` is live until destroy_program below.
    unsafe {
        let compiled = nvrtc::compile_program(prog, opts);
        let log = nvrtc::get_program_log(prog)
            .map(|l| {
                let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        if compiled.is_err() {
            let _ = nvrtc::destroy_program(prog);
            return Err(Error::Cuda(CudaError::Compile { module: module.into(), log }));
        }
        let mut size = 0usize;
        let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
        if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            let _ = nvrtc::destroy_program(prog);
            return Err(nvrtc_error("nvrtcGetCUBINSize (was a real sm_XX architecture given?)", r));
        }
        let mut cubin = vec![0u8; size];
        let r = nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _);
        let _ = nvrtc::destroy_program(prog);
        if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(nvrtc_error("nvrtcGetCUBIN", r));
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

    /// Every module's entry file is embedded, and every `#include "..."` in
    /// every embedded file names an embedded header: NVRTC sees exactly the
    /// sources the cache key hashes.
    #[test]
    fn every_include_resolves_to_an_embedded_header() {
        for m in Module::ALL {
            assert!(source(&m.entry_file()).is_some(), "{} is not embedded", m.entry_file());
        }
        for (path, text) in SOURCES {
            for line in text.lines() {
                let Some(rest) = line.trim_start().strip_prefix("#include") else { continue };
                let rest = rest.trim();
                // System headers (<...>) are NVRTC's own builtins.
                let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) else { continue };
                assert!(
                    headers(path).any(|(h, _)| h == name),
                    "{path} includes {name:?}, which is not an embedded source (paths are relative to kernels/)"
                );
            }
        }
    }

    /// The key changes with any header's text, the entry, the options and
    /// the NVRTC version.
    #[test]
    fn the_cache_key_covers_every_source() {
        let opts = vec!["-DX=1".to_string()];
        let hs = [("common/a.cuh", "int a;"), ("select/b.cuh", "int b;")];
        let base = cache_key("select/filter.cu", "src", &hs, &opts, (13, 0));
        assert_eq!(base, cache_key("select/filter.cu", "src", &hs, &opts, (13, 0)));
        let edited = [("common/a.cuh", "int a;"), ("select/b.cuh", "int b ;")];
        assert_ne!(base, cache_key("select/filter.cu", "src", &edited, &opts, (13, 0)));
        let renamed = [("common/a.cuh", "int a;"), ("select/c.cuh", "int b;")];
        assert_ne!(base, cache_key("select/filter.cu", "src", &renamed, &opts, (13, 0)));
        assert_ne!(base, cache_key("select/filter.cu", "src", &hs[..1], &opts, (13, 0)));
        assert_ne!(base, cache_key("select/grid.cu", "src", &hs, &opts, (13, 0)));
        assert_ne!(base, cache_key("select/filter.cu", "src2", &hs, &opts, (13, 0)));
        assert_ne!(base, cache_key("select/filter.cu", "src", &hs, &["-DX=2".to_string()], (13, 0)));
        assert_ne!(base, cache_key("select/filter.cu", "src", &hs, &opts, (13, 1)));
        // Field boundaries count: moving a byte between fields changes the key.
        assert_ne!(cache_key("ab", "c", &[], &[], (13, 0)), cache_key("a", "bc", &[], &[], (13, 0)));
    }

    #[test]
    fn variants_and_options() {
        let v = shipped_variants("sm_90a");
        let twice = Module::ALL.iter().filter(|m| m.has_buffer_variants()).count();
        assert_eq!(v.len(), Module::ALL.len() + twice, "{v:?}");
        assert_eq!(v.iter().filter(|v| v.module == Module::SelectGrid).count(), 1);
        assert_eq!(v.iter().filter(|v| v.module == Module::SelectFilterTokens).count(), 2);
        let grid = Variant::new(Module::SelectGrid, "sm_80", true);
        assert!(!grid.global_buffer, "the grid module has no global-buffer build");
        assert!(!grid.options().iter().any(|o| o.starts_with("-DFS_GLOBAL_BUF")));
        let f = Variant::new(Module::SelectFilter, "sm_80", true);
        assert!(f.options().contains(&"-DFS_GLOBAL_BUF=1".to_string()));
        assert!(!f.options().iter().any(|o| o.contains("FS_PROFILE")));
        let p = Variant { profile: true, ..f.clone() };
        assert!(p.options().contains(&"-DFS_PROFILE=1".to_string()) && p.name() != f.name());
        assert_eq!(f.name(), "select/filter[sm_80 buffer=global]");
        let mut entries: Vec<&str> = Module::ALL.iter().flat_map(|m| m.entry_points().iter().copied()).collect();
        let n = entries.len();
        entries.sort_unstable();
        entries.dedup();
        assert_eq!(entries.len(), n, "entry points are unique across modules");
    }
}
