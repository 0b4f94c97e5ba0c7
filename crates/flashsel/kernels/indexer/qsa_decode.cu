// The fused decode indexer (module IndexerQsaDecode): one entry per query
// dtype, key dtype and head width (indexer/qsa/decode.cuh has the
// algorithm). Launched cooperatively.

#include "indexer/qsa/decode.cuh"

extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_kf32_d64(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyF32, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_kf32_d128(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyF32, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_kf32_d256(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyF32, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_kbf16_d64(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyBf16, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_kbf16_d128(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyBf16, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_kbf16_d256(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyBf16, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_ke4m3_d64(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyE4m3, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_ke4m3_d128(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyE4m3, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qf32_ke4m3_d256(const qsa::DecodeParams p) { qsa::decode_impl<false, qsa::KeyE4m3, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_kf32_d64(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyF32, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_kf32_d128(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyF32, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_kf32_d256(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyF32, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_kbf16_d64(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyBf16, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_kbf16_d128(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyBf16, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_kbf16_d256(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyBf16, 256>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_ke4m3_d64(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyE4m3, 64>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_ke4m3_d128(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyE4m3, 128>(p); }
extern "C" __global__ void __launch_bounds__(qsa::DEC_THREADS, 2) qsa_decode_qbf16_ke4m3_d256(const qsa::DecodeParams p) { qsa::decode_impl<true, qsa::KeyE4m3, 256>(p); }
