// The streaming filter's launch parameters (fs_scan_*, fs_split_*,
// fs_prep_*) and its tuning constants.
#ifndef FLASHSEL_SELECT_FILTER_PARAMS_CUH
#define FLASHSEL_SELECT_FILTER_PARAMS_CUH

#include "common/types.cuh"
#include "select/tokens.cuh"

// The streaming filter's knobs, at their measured values (enumerators: no
// device variables).
enum : int { SEG = 32 };  // longest optimistic segment, tiles (16 and 64 measured no faster)
enum : int { SAMPLE_SD = 3 };  // sampled bounds' margin, deviations (2.5: -0.5%, twice the restarts; 2: +10% f32)
enum : int { RESCUE_SD = 8 };  // a failed sampled bound: again from one this wide (~2x the survivors), then lb = 0
enum : int { ROW_SAMPLE = 1 };  // tiles in a one-CTA row's sample (sample_lb's ST; 2: +4% f32, +11% bf16)
enum : int { PREP_SAMPLE = 1 };  // split rows: tiles in fs_prep_*'s row-wide sample (2: +0.8 us on 64 x 131,072)

// Parameters (mirrored by ScanParams in src/ops/select/device.rs).

struct ScanParams {
    const void* scores;      // rows x row_stride elements of the dtype
    long long row_stride;    // elements
    const int* lengths;      // nullable; rows entries
    int* out_idx;            // rows x k
    void* out_val;           // nullable; rows x k of the dtype
    u64* cand;               // split rows: rows x chunks x k candidate slots
    u32* row_count;          // split rows: candidates appended so far, per row
    u32* row_done;           // split rows: CTAs of the row that have finished
    u64* gbuf;               // FS_GLOBAL_BUF: gridDim.x * gridDim.y * cap
    u64* row_lb;             // split rows: per-row key bound from fs_prep_*
    int rows;
    int cols;
    int k;
    int chunks;              // CTAs per row (== gridDim.x of the scan)
    int cap;                 // buffer capacity in composites
    int nan_largest;         // NaN policy: 1 = above +inf, 0 = below -inf
    int order_index;         // 1: output by ascending column
    int stage;               // 1: the load ring (FS_HOST_STAGE_BYTES) follows
                             // the shared buffer (cta_buffer, ring_offset)
};
// The host mirror (src/ops/select/device.rs) asserts the same layout.
static_assert(sizeof(ScanParams) == 112, "ScanParams layout changed: update src/ops/select/device.rs");

// The token kernels' parameters (fs_*_tok_*): ScanParams, then the token
// description. (A type of its own: the plain kernels keep their 112-byte
// block, whose code a larger one changes.)
struct ScanTokParams : ScanParams {
    Tokens tok;
};
static_assert(sizeof(ScanTokParams) == 176, "ScanTokParams layout changed: update src/ops/select/device.rs");

#endif  // FLASHSEL_SELECT_FILTER_PARAMS_CUH
