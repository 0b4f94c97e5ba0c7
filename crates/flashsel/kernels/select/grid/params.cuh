// The grid path's launch parameters (fs_grid*_*), mirrored by GridParams in
// src/ops/select/device.rs.
#ifndef FLASHSEL_SELECT_GRID_PARAMS_CUH
#define FLASHSEL_SELECT_GRID_PARAMS_CUH

#include "common/types.cuh"
#include "select/tokens.cuh"

struct GridParams {
    const void* scores;    // rows x row_stride elements of the dtype
    long long row_stride;  // elements
    const int* lengths;    // nullable; rows entries
    int* out_idx;          // rows x k
    void* out_val;         // nullable; rows x k of the dtype
    u64* list;             // rows x (k + FS_HOST_GRID_SMALL) list entries
    u32* state;            // rows x GRID_STATE_WORDS words, zeroed by fs_grid_init_all
    int rows;
    int cols;
    int k;
    int chunks;            // CTAs per row (== gridDim.x)
    int nan_largest;       // NaN policy: 1 = above +inf, 0 = below -inf
    int order_index;       // 1: output by ascending column
};
static_assert(sizeof(GridParams) == 80, "GridParams layout changed: update src/ops/select/device.rs");

// The token kernels' parameters (fs_grid*_tok_*): GridParams, then the token
// description (a type of its own, as ScanTokParams).
struct GridTokParams : GridParams {
    Tokens tok;
};
static_assert(sizeof(GridTokParams) == 144, "GridTokParams layout changed: update src/ops/select/device.rs");

#endif  // FLASHSEL_SELECT_GRID_PARAMS_CUH
