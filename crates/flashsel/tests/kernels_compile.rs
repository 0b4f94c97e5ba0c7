//! Every kernel module that ships compiles with NVRTC for every supported
//! architecture, once, without register spills. Needs libnvrtc (no GPU):
//! without it on the loader path the test is ignored (build.rs sets
//! `cfg(flashsel_nvrtc)` when it finds libnvrtc.so.13); CI installs the pinned
//! wheel and sets FLASHSEL_REQUIRE_NVRTC=1, with which a missing NVRTC fails
//! the build instead.

use flashsel::cuda::compile::{self, Variant, ARCHS};

#[test]
#[cfg_attr(not(flashsel_nvrtc), ignore = "NVRTC (libnvrtc.so.13) is not on the loader path: see README, Development")]
fn every_shipped_module_compiles_without_spills() {
    if let Err(why) = compile::nvrtc_available() {
        panic!("NVRTC was found at build time but cannot be loaded: {why}");
    }
    let variants: Vec<Variant> = ARCHS.iter().flat_map(|&a| compile::shipped_variants(a)).collect();
    // Two at a time: NVRTC is single-threaded per program.
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut bad = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(v) = variants.get(i) else { return bad };
                        bad.extend(check(v));
                    }
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("a compile thread panicked")).collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What is wrong with one variant: a compile error, an entry point without a
/// ptxas report, a spill, or a register count outside 1..=128.
fn check(v: &Variant) -> Vec<String> {
    let c = match compile::compile(v) {
        Ok(c) => c,
        Err(e) => return vec![format!("{}: {e}", v.name())],
    };
    let mut bad = Vec::new();
    if c.cubin.is_empty() {
        bad.push(format!("{}: empty cubin", v.name()));
    }
    let names: Vec<&str> = c.resources.iter().map(|r| r.kernel.as_str()).collect();
    for k in v.module.entry_points() {
        if !names.contains(k) {
            bad.push(format!("{}: no ptxas report for {k} in:\n{}", v.name(), c.log));
        }
    }
    for r in &c.resources {
        if (r.spill_stores, r.spill_loads) != (0, 0) {
            bad.push(format!(
                "{}: {} spills ({} B stores, {} B loads)",
                v.name(),
                r.kernel,
                r.spill_stores,
                r.spill_loads
            ));
        }
        if v.module.entry_points().contains(&r.kernel.as_str()) && !(1..=128).contains(&r.registers) {
            bad.push(format!("{}: {} uses {} registers", v.name(), r.kernel, r.registers));
        }
    }
    bad
}
