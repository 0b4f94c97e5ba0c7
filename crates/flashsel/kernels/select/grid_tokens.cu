// The grid path's token kernels (module SelectGridTokens): select/grid.cu's
// rows with rows from P.tok (ranges, QSA blocks) and the token write
// (select/tokens.cuh); the state is zeroed by select/grid.cu's
// fs_grid_init_all. A module of its own, as select/filter_tokens.cu.

#include "select/grid/kernel.cuh"

extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_tok_f32(const GridTokParams p) { grid_impl<32, GRID_ITEMS, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_tok_bf16(const GridTokParams p) { grid_impl<16, GRID_ITEMS, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_tok_f16(const GridTokParams p) { grid_impl<15, GRID_ITEMS, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_tok_f32(const GridTokParams p) { grid_impl<32, 8, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_tok_bf16(const GridTokParams p) { grid_impl<16, 8, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_tok_f16(const GridTokParams p) { grid_impl<15, 8, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid4_tok_f32(const GridTokParams p) { grid_impl<32, 4, true>(p); }
