// The QSA scorer's staged form (module IndexerQsaStaged): one entry per
// query dtype, bf16 or e4m3 key dtype and head width whose stages fit the
// budget (indexer/qsa/staged.cuh has the algorithm; f32 keys and d 256 take
// qsa_scores' form: f32 keys' three terms spill the staged form's
// registers on sm_80-89).

#include "indexer/qsa/staged.cuh"

extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d64(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d128(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d64(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d128(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d64(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d128(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d64(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d128(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 128>(p); }

