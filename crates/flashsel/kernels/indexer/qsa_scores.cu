// The QSA indexer's scores (module IndexerQsa): one entry per query dtype,
// key dtype and head width (indexer/qsa/score.cuh has the algorithm).

#include "indexer/qsa/score.cuh"

extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_kf32_d64(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyF32, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_kf32_d128(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyF32, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_kf32_d256(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyF32, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_kbf16_d64(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyBf16, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_kbf16_d128(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyBf16, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_kbf16_d256(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyBf16, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_ke4m3_d64(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyE4m3, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_ke4m3_d128(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyE4m3, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qf32_ke4m3_d256(const qsa::ScoreParams p) { qsa::score_impl<false, qsa::KeyE4m3, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_kf32_d64(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyF32, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_kf32_d128(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyF32, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_kf32_d256(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyF32, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_kbf16_d64(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyBf16, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_kbf16_d128(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyBf16, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_kbf16_d256(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyBf16, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_ke4m3_d64(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyE4m3, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_ke4m3_d128(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyE4m3, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::SCORE_THREADS, 2) qsa_scores_qbf16_ke4m3_d256(const qsa::ScoreParams p) { qsa::score_impl<true, qsa::KeyE4m3, 256>(p); }
