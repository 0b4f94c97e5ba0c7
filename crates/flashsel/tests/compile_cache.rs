//! The NVRTC cubin cache: a second compile of the same variant is read back
//! from `FLASHSEL_CACHE_DIR`, a variant with other options misses, and
//! `FLASHSEL_CACHE_DIR=off` neither reads nor writes it. Needs libnvrtc (no
//! GPU); like kernels_compile.rs, CI's FLASHSEL_REQUIRE_NVRTC turns "NVRTC
//! not found" from a skip into a failure. Its own test binary, and one test,
//! because it sets the process's environment.

use std::path::Path;

use flashsel::cuda::compile::{self, Variant};

fn files_ending(dir: &Path, suffix: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().ends_with(suffix)).count())
        .unwrap_or(0)
}

#[test]
fn a_variant_is_cached_under_its_key_and_off_disables_the_cache() {
    if let Err(why) = compile::nvrtc_available() {
        assert!(std::env::var_os("FLASHSEL_REQUIRE_NVRTC").is_none(), "NVRTC required but unavailable: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("flashsel-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("FLASHSEL_CACHE_DIR", &dir);

    let v = Variant::new("sm_90a", false);
    let first = compile::compile(&v).expect("first compile");
    assert!(!first.from_cache, "an empty cache directory cannot hold the variant");
    assert_eq!((files_ending(&dir, ".cubin"), files_ending(&dir, ".log")), (1, 1), "one cubin and its log written");

    let again = compile::compile(&v).expect("second compile");
    assert!(again.from_cache, "the same source, options, NVRTC and arch must hit");
    assert_eq!(again.cubin, first.cubin);
    assert_eq!(again.log, first.log);
    assert_eq!(again.resources.len(), first.resources.len());

    let other = Variant { defines: "FS_GRID_SCORE_T=1".into(), ..Variant::new("sm_90a", false) };
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
