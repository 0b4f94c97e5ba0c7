// The QSA scorer's staged form (module IndexerQsaStaged): one entry per
// query dtype, bf16 or e4m3 key dtype, head width whose stages fit the
// budget, and padded head count (indexer/qsa/staged.cuh has the algorithm;
// f32 keys and d 256 take qsa_scores' form: f32 keys' three terms spill the
// staged form's registers on sm_80-89, and d 256 does not fit two stages).

#include "indexer/qsa/staged.cuh"

extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d64_h1(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 64, 1>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d64_h2(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 64, 2>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d64_h4(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 64, 4>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d64_h8(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 64, 8>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d64_h16(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 64, 16>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d128_h1(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 128, 1>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d128_h2(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 128, 2>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d128_h4(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 128, 4>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d128_h8(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 128, 8>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_kbf16_d128_h16(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyBf16, 128, 16>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d64_h1(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 64, 1>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d64_h2(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 64, 2>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d64_h4(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 64, 4>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d64_h8(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 64, 8>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d64_h16(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 64, 16>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d128_h1(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 128, 1>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d128_h2(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 128, 2>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d128_h4(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 128, 4>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d128_h8(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 128, 8>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qf32_ke4m3_d128_h16(const qsa::ScoreParams p) { qsa::score_staged_impl<false, qsa::KeyE4m3, 128, 16>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d64_h1(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 64, 1>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d64_h2(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 64, 2>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d64_h4(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 64, 4>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d64_h8(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 64, 8>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d64_h16(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 64, 16>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d128_h1(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 128, 1>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d128_h2(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 128, 2>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d128_h4(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 128, 4>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d128_h8(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 128, 8>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_kbf16_d128_h16(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyBf16, 128, 16>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d64_h1(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 64, 1>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d64_h2(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 64, 2>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d64_h4(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 64, 4>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d64_h8(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 64, 8>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d64_h16(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 64, 16>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d128_h1(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 128, 1>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d128_h2(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 128, 2>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d128_h4(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 128, 4>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d128_h8(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 128, 8>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_staged_qbf16_ke4m3_d128_h16(const qsa::ScoreParams p) { qsa::score_staged_impl<true, qsa::KeyE4m3, 128, 16>(p); }
