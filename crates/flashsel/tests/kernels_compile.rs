//! Every kernel variant compiles with NVRTC for every supported architecture,
//! without register spills. Needs libnvrtc (no GPU): CI installs the pinned
//! wheels and sets FLASHSEL_REQUIRE_NVRTC=1, which turns "NVRTC not found"
//! from a skip into a failure.

use flashsel::cuda::compile::{self, Variant, ARCHS, SELECT_KERNELS};

/// Whether NVRTC can run here; without it the tests skip, unless CI's
/// FLASHSEL_REQUIRE_NVRTC makes that a failure.
fn nvrtc_present() -> bool {
    match compile::nvrtc_available() {
        Ok(()) => true,
        Err(why) => {
            assert!(std::env::var_os("FLASHSEL_REQUIRE_NVRTC").is_none(), "NVRTC required but unavailable: {why}");
            eprintln!("skipped: {why}");
            false
        }
    }
}

#[test]
fn every_variant_compiles_without_spills() {
    if !nvrtc_present() {
        return;
    }
    for arch in ARCHS {
        for global_buffer in [false, true] {
            let v = Variant::new(arch, global_buffer);
            let c = compile::compile(&v).unwrap_or_else(|e| panic!("{}: {e}", v.name()));
            assert!(!c.cubin.is_empty());
            let names: Vec<&str> = c.resources.iter().map(|r| r.kernel.as_str()).collect();
            for k in SELECT_KERNELS {
                assert!(names.contains(&k), "{}: no ptxas report for {k} in:\n{}", v.name(), c.log);
            }
            for r in &c.resources {
                assert_eq!((r.spill_stores, r.spill_loads), (0, 0), "{}: {} spills", v.name(), r.kernel);
                if SELECT_KERNELS.contains(&r.kernel.as_str()) {
                    assert!(
                        r.registers > 0 && r.registers <= 128,
                        "{}: {} uses {} registers",
                        v.name(),
                        r.kernel,
                        r.registers
                    );
                }
            }
        }
    }
}

/// The A/B switches that turn a measured mechanism off (docs/perf-log.md
/// times each kernel beside its own switch-off build) still compile without
/// spills: one sm_90a shared-buffer build per switch.
#[test]
fn each_ab_switch_compiles_without_spills() {
    if !nvrtc_present() {
        return;
    }
    for switch in [
        "FS_STAGE=0",
        "FS_FINISH_RING=0",
        "FS_GE=0",
        "FS_RUN=0",
        "FS_RUN_UNROLL=0",
        "FS_PUSH_WORD=0",
        "FS_SAMPLE_RATE=0",
        "FS_BUCKET_SCALE=0",
        "FS_RESCUE_SD=0",
        "FS_GRID_KEY32=0",
        "FS_GRID_POLL=0",
        "FS_GRID_SPARSE_GATHER=0",
        "FS_GRID_SAMPLE=0",
        "FS_GRID_SAMPLE_RUNS=1",
        "FS_GRID_PLATEAU=0",
        "FS_GRID_BIN_LIST=0",
        "FS_GRID_TALLY_SPIN=0",
        "FS_GRID_BOUND_WARP0=0",
        "FS_PDL_CHAIN=0",
        "FS_PDL_CHAIN=1",
        "FS_PDL_CHAIN=3",
        "FS_GRID_PLACE_PAIR=0",
        "FS_GRID_SCORE_T=1",
    ] {
        let v = compile::Variant { defines: switch.into(), ..compile::Variant::new("sm_90a", false) };
        let c = compile::compile(&v).unwrap_or_else(|e| panic!("{}: {e}", v.name()));
        for r in &c.resources {
            assert_eq!((r.spill_stores, r.spill_loads), (0, 0), "{}: {} spills", v.name(), r.kernel);
        }
        let names: Vec<&str> = c.resources.iter().map(|r| r.kernel.as_str()).collect();
        for k in SELECT_KERNELS {
            assert!(names.contains(&k), "{}: no ptxas report for {k}", v.name());
        }
    }
}
