// The select filter's token kernels (module SelectFilterTokens): the row
// and split paths of select/filter.cu with rows from P.tok (ranges, QSA
// blocks) and the token write (select/tokens.cuh). A module of its own: in
// one program with the plain kernels, the shared callees compile
// differently for both (measured: the plain kernels' code changed).

#include "select/filter/kernel.cuh"

extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_tok_f32(const ScanTokParams p) { scan_impl<32, false, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_tok_bf16(const ScanTokParams p) { scan_impl<16, false, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_tok_f16(const ScanTokParams p) { scan_impl<15, false, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_tok_f32(const ScanTokParams p) { scan_impl<32, true, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_tok_bf16(const ScanTokParams p) { scan_impl<16, true, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_tok_f16(const ScanTokParams p) { scan_impl<15, true, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_tok_f32(const ScanTokParams p) { prep_impl<32, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_tok_bf16(const ScanTokParams p) { prep_impl<16, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_tok_f16(const ScanTokParams p) { prep_impl<15, true>(p); }
