// Programmatic dependent launch (sm_90+; nothing elsewhere).
//   PDL_TRIGGER: this grid's dependents may launch now (they still wait for
//   its completion at their own PDL_WAIT). PDL_WAIT: waits until the grids
//   this one depends on have completed and their writes are visible.
#ifndef FLASHSEL_COMMON_PDL_CUH
#define FLASHSEL_COMMON_PDL_CUH

// Programmatic dependent launch (sm_90+): the host launches fs_split_* with
// programmatic stream serialisation, so its CTAs start while fs_prep_* runs;
// they ask L2 for their chunk, then wait for prep's results.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_ON 1
#else
#define PDL_TRIGGER() ((void)0)
#define PDL_WAIT() ((void)0)
#define PDL_ON 0
#endif

// Calls chained by PDL (sm_90+): the host launches
// a call's first kernel (fs_grid_init_all, fs_prep_*, the row path's
// fs_scan_*) programmatically too, so it is resident before the stream's
// previous kernel ends; it waits for that kernel (CHAIN_WAIT) before it
// reads or writes anything, and only then lets its own dependents start.
// A call's last kernel (fs_grid8_*, fs_grid4_f32, fs_split_*,
// fs_scan_*) also lets the stream's next kernel launch as it starts
// (CHAIN_TRIGGER): a programmatic successor waits for this grid's completion
// anyway. Not fs_grid_*, whose CTA takes a whole SM's registers, so no CTA
// of the next kernel can wait beside it: there the early launch measured
// +0.3 us on 1 x 1,048,576 (132 CTAs).
#define CHAIN_WAIT() PDL_WAIT()
#define CHAIN_TRIGGER() PDL_TRIGGER()

#endif  // FLASHSEL_COMMON_PDL_CUH
