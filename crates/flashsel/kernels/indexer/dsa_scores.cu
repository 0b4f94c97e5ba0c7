// The DSA indexer's scores (module IndexerDsa): for each query row t and key
// s of its range [starts[t], ends[t]),
//     score[t, s] = k_scale[s] * sum over h of w[t, h] * relu(q[t, h, :] . k[s, :]),
// -inf elsewhere, in exactly the CPU engine's f32 arithmetic
// (crates/flashsel/src/ops/dsa/mod.rs, "Arithmetic"): the same bits.
// Portable: sm_80 and later, CUDA cores.
//
// ALGORITHM (dsa_scores_q*_k*)
//   Grid (rows, chunks of CHUNK = 1024 columns). The CTA (256 threads, 8
//   warps) writes its chunk of row t: -inf outside the row's range; inside
//   it, warp w scores the keys s = c0 + w, c0 + w + 8, ... For one key the
//   warp's four groups of 8 lanes take heads h = 4i + g (g the group):
//     1. lane l of the group sums the products q[t, h, j] * k[s, j] of j =
//        l, l + 8, l + 16, ... in increasing j, each product and sum rounded
//        on its own (__fmul_rn, __fadd_rn: no contraction);
//     2. three xor butterflies (1, 2, 4) give every lane of the group the
//        contract's tree ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
//        (f32 addition is commutative: both lanes of a pair hold the same
//        bits);
//     3. p_h = w[t, h] * relu(dot_h) (rounded), and every lane adds the four
//        groups' p_h into the running sum in head order (shuffles from lanes
//        0, 8, 16, 24): acc = ((+0 + p_0) + p_1) + ... as the CPU engine;
//   then score = acc * k_scale[s] (with a scale), a NaN written as the quiet
//   NaN 0x7fc00000, by lane 0.
//
// INVARIANTS
//   - Every output element of the rows is written exactly once (the chunk
//     grid covers the columns; -inf outside the range).
//   - Only keys inside a row's range are read; q, w, k_scale of a row only
//     when its range meets the CTA's chunk.
//   - The bits are the CPU engine's: the same products, the same sums in the
//     same order, every operation rounded to nearest on its own.
//   - Ranges come from the host's checks (0 <= starts <= ends <= keys);
//     device values outside are clamped into 0..keys (never read out of
//     bounds).
//
// COST
//   Per score H d products and sums on CUDA cores (no FMA: two instructions
//   each), plus 3 H / 4 shuffles and H / 4 * 4 shuffles of the head sum a
//   lane; q (every warp of the row re-reads it) and k from L1 / L2 (__ldg).
//   A correctness-first kernel: the tensor-core form is future work.
#include "attention/common/types.cuh"

using namespace fsattn;

namespace {

constexpr int BLOCK = 256;
constexpr int WARPS = BLOCK / 32;
constexpr int CHUNK = 1024;  // columns a CTA
enum : int { KF_F32 = 0, KF_BF16 = 1, KF_E4M3 = 2 };

}  // namespace

// The parameter block (host: ops/dsa/device.rs, DsaParams; 80 bytes).
struct DsaParams {
    const void* q;         // [rows][heads][dim], the q format
    const void* k;         // [keys][dim], the k format
    const float* k_scale;  // [keys], or null
    const float* weights;  // [rows][heads]
    const int* starts;     // [rows]
    const int* ends;       // [rows]
    float* out;            // [rows][keys]
    long long keys;
    int rows;
    int heads;
    int dim;
    int pad_;
};
static_assert(sizeof(DsaParams) == 80, "DsaParams mirrors the host's layout");

namespace {

template <int F>
__device__ __forceinline__ float elem(const void* base, long long i) {
    if (F == KF_F32) return __ldg((const float*)base + i);
    if (F == KF_BF16) return bf16_bits_to_f32((u32)__ldg((const u16*)base + i));
    return e4m3_to_f32((u32)__ldg((const u8*)base + i));
}

template <int QF, int KF>
__device__ __forceinline__ void dsa_scores_impl(const DsaParams& P) {
    const int t = blockIdx.x;
    const long long c0 = (long long)blockIdx.y * CHUNK;
    const long long c1 = min(c0 + CHUNK, P.keys);
    const long long a = min(max((long long)__ldg(P.starts + t), 0ll), P.keys);
    const long long b = min(max((long long)__ldg(P.ends + t), a), P.keys);
    float* row = P.out + (long long)t * P.keys;
    // -inf outside the range.
    for (long long s = c0 + threadIdx.x; s < c1; s += BLOCK) {
        if (s < a || s >= b) row[s] = -fsa_inf();
    }
    const long long lo = max(a, c0), hi = min(b, c1);
    if (lo >= hi) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 3, l = lane & 7;
    const int H = P.heads, d = P.dim;
    const long long qrow = (long long)t * H * d;
    const float* w = P.weights + (long long)t * H;
    for (long long s = lo + warp; s < hi; s += WARPS) {
        const long long krow = s * d;
        float acc = 0.f;
        for (int h0 = 0; h0 < H; h0 += 4) {
            const int h = h0 + g;
            // 1. lane l's products j = l, l + 8, ... in increasing j (a
            //    group past H sums nothing).
            float part = 0.f;
            if (h < H) {
                const long long qh = qrow + (long long)h * d;
                for (int j = l; j < d; j += 8) {
                    part = __fadd_rn(part, __fmul_rn(elem<QF>(P.q, qh + j), elem<KF>(P.k, krow + j)));
                }
            }
            // 2. the lane tree (the lanes of a group differ in bits 0..2);
            //    every lane of the warp takes part.
            part = __fadd_rn(part, __shfl_xor_sync(FSA_FULL, part, 1));
            part = __fadd_rn(part, __shfl_xor_sync(FSA_FULL, part, 2));
            part = __fadd_rn(part, __shfl_xor_sync(FSA_FULL, part, 4));
            // 3. relu, then the weight.
            float p = 0.f;
            if (h < H) {
                const float r = part > 0.f || part != part ? part : 0.f;
                p = __fmul_rn(__ldg(w + h), r);
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float pq = __shfl_sync(FSA_FULL, p, 8 * q);
                if (h0 + q < H) acc = __fadd_rn(acc, pq);
            }
        }
        if (lane == 0) {
            float v = P.k_scale ? __fmul_rn(acc, __ldg(P.k_scale + s)) : acc;
            if (v != v) v = __int_as_float(0x7fc00000);
            row[s] = v;
        }
    }
}

}  // namespace

#define FSD_SCORES(NAME, QF, KF) \
    extern "C" __global__ void __launch_bounds__(BLOCK) NAME(const DsaParams P) { dsa_scores_impl<QF, KF>(P); }

FSD_SCORES(dsa_scores_qf32_kf32, KF_F32, KF_F32)
FSD_SCORES(dsa_scores_qf32_kbf16, KF_F32, KF_BF16)
FSD_SCORES(dsa_scores_qf32_ke4m3, KF_F32, KF_E4M3)
FSD_SCORES(dsa_scores_qbf16_kf32, KF_BF16, KF_F32)
FSD_SCORES(dsa_scores_qbf16_kbf16, KF_BF16, KF_BF16)
FSD_SCORES(dsa_scores_qbf16_ke4m3, KF_BF16, KF_E4M3)
FSD_SCORES(dsa_scores_qe4m3_kf32, KF_E4M3, KF_F32)
FSD_SCORES(dsa_scores_qe4m3_kbf16, KF_E4M3, KF_BF16)
FSD_SCORES(dsa_scores_qe4m3_ke4m3, KF_E4M3, KF_E4M3)
