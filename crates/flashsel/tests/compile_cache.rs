//! The NVRTC cubin cache: a second compile of the same variant is read back
//! from `FLASHSEL_CACHE_DIR`, a variant with other options misses, and
//! `FLASHSEL_CACHE_DIR=off` neither reads nor writes it. Needs libnvrtc (no
//! GPU): ignored without it, as kernels_compile.rs. Its own test binary, and
//! one test, because it sets the process's environment.

use std::path::Path;

use flashsel::cuda::compile::{self, Module, Variant};

fn files_ending(dir: &Path, suffix: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().ends_with(suffix)).count())
        .unwrap_or(0)
}

#[test]
#[cfg_attr(not(flashsel_nvrtc), ignore = "NVRTC (libnvrtc.so.13) is not on the loader path: see README, Development")]
fn a_variant_is_cached_under_its_key_and_off_disables_the_cache() {
    if let Err(why) = compile::nvrtc_available() {
        panic!("NVRTC was found at build time but cannot be loaded: {why}");
    }
    let dir = std::env::temp_dir().join(format!("flashsel-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("FLASHSEL_CACHE_DIR", &dir);

    // The grid module: the smaller of the two.
    let v = Variant::new(Module::SelectGrid, "sm_80", false);
    let first = compile::compile(&v).expect("first compile");
    assert!(!first.from_cache, "an empty cache directory cannot hold the variant");
    assert_eq!((files_ending(&dir, ".cubin"), files_ending(&dir, ".log")), (1, 1), "one cubin and its log written");

    let again = compile::compile(&v).expect("second compile");
    assert!(again.from_cache, "the same sources, options, NVRTC and arch must hit");
    assert_eq!(again.cubin, first.cubin);
    assert_eq!(again.log, first.log);
    assert_eq!(again.resources.len(), first.resources.len());

    let other = Variant { profile: true, ..v.clone() };
    let o = compile::compile(&other).expect("compile with another option");
    assert!(!o.from_cache, "other options are another key");
    assert_eq!(files_ending(&dir, ".cubin"), 2);

    std::env::set_var("FLASHSEL_CACHE_DIR", "off");
    let uncached = compile::compile(&v).expect("compile with the cache off");
    assert!(!uncached.from_cache, "FLASHSEL_CACHE_DIR=off must not read the cache");
    assert_eq!(uncached.cubin, first.cubin, "NVRTC is deterministic for one key");
    assert_eq!(files_ending(&dir, ".cubin"), 2, "FLASHSEL_CACHE_DIR=off must not write the cache");

    std::env::remove_var("FLASHSEL_CACHE_DIR");
    let _ = std::fs::remove_dir_all(&dir);
}
