// The DSA indexer's scores (module IndexerDsa): for each query row t and key
// s of its range [starts[t], ends[t]),
//     score[t, s] = k_scale[s] * sum over h of w[t, h] * relu(q[t, h, :] . k[s, :]),
// -inf elsewhere, in exactly the CPU engine's f32 arithmetic
// (crates/flashsel/src/ops/dsa/mod.rs, "Arithmetic"): the same bits.
// Portable: sm_80 and later, CUDA cores. The paged entries
// (dsa_scores_paged_q*) read the keys from DeepSeek-V3.2's paged fp8 cache
// (DeepGEMM's layout: a page of page_size tokens is page_size * d e4m3
// bytes, then page_size f32 scales), key s of row t being token s of
// sequence seq_ids[t] through the page table.
//
// ALGORITHM (dsa_scores_q*_k*)
//   Grid (rows, chunks of CHUNK = 1024 columns). The CTA (256 threads, 8
//   warps) writes its chunk of row t: -inf outside the row's range; inside
//   it, warp w scores the keys s = c0 + w, c0 + w + 8, ... The heads go in
//   chunks of HC (as many as 18 KB of shared memory holds, decoded to f32 in
//   rows of d + 8 floats); for each chunk every warp stages each of its keys
//   (decoded) in shared memory once and continues the key's head sum, kept
//   in acc_s between chunks. For one key the warp's four groups of 8 lanes
//   take heads h = 4i + g (g the group):
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
//     bounds). Paged: a row whose sequence is outside the table, or a key
//     whose page is past the row's pages or outside 0..num_pages, scores
//     -inf and is never read.
//
// COST
//   Per score H d products and sums on CUDA cores (no FMA: two instructions
//   each), plus 3 H / 4 shuffles and H / 4 * 4 shuffles of the head sum a
//   lane; q read and decoded once a CTA, each key once a head chunk (H / HC
//   times: twice for 64 heads of 128); the products read shared memory
//   (conflict-free: rows of d + 8 floats put the four groups 8 banks apart).
//   A correctness-first kernel: the tensor-core form is future work.
#include "attention/common/types.cuh"

using namespace fsattn;

namespace {

constexpr int BLOCK = 256;
constexpr int WARPS = BLOCK / 32;
constexpr int CHUNK = 1024;  // columns a CTA
constexpr int DMAX = 256;    // the widest head
constexpr int Q_SMEM = 4608; // floats of q's heads a chunk (18 KB)
enum : int { KF_F32 = 0, KF_BF16 = 1, KF_E4M3 = 2 };

}  // namespace

// The parameter block (host: ops/dsa/device.rs, DsaParams; 112 bytes).
struct DsaParams {
    const void* q;         // [rows][heads][dim], the q format
    const void* k;         // [keys][dim], the k format; paged: the cache's bytes
    const float* k_scale;  // [keys], or null (paged: unused)
    const float* weights;  // [rows][heads]
    const int* starts;     // [rows]
    const int* ends;       // [rows]
    float* out;            // [rows][keys]
    const int* table;      // paged: [sequences][max_pages]
    const int* seq_ids;    // paged: [rows]
    long long keys;
    long long max_pages;
    int rows;
    int heads;
    int dim;
    int page_size;         // paged
    int num_pages;         // paged: pages of the cache
    int sequences;         // paged: rows of the table
};
static_assert(sizeof(DsaParams) == 112, "DsaParams mirrors the host's layout");

namespace {

template <int F>
__device__ __forceinline__ float elem(const void* base, long long i) {
    if (F == KF_F32) return __ldg((const float*)base + i);
    if (F == KF_BF16) return bf16_bits_to_f32((u32)__ldg((const u16*)base + i));
    return e4m3_to_f32((u32)__ldg((const u8*)base + i));
}

// Where key s of a row lives: the element offset of its first value in
// P.k and its scale; false (the key scores -inf) when a paged row's page
// entry is not a page of the cache.
template <bool PAGED>
__device__ __forceinline__ bool key_at(const DsaParams& P, int seq, long long s, long long* off, float* scale,
                                       bool* scaled) {
    if (!PAGED) {
        *off = s * P.dim;
        *scaled = P.k_scale != nullptr;
        *scale = *scaled ? __ldg(P.k_scale + s) : 1.f;
        return true;
    }
    const long long pi = s / P.page_size;
    if (seq < 0 || pi >= P.max_pages) return false;
    const int page = __ldg(P.table + (long long)seq * P.max_pages + pi);
    if (page < 0 || page >= P.num_pages) return false;
    const long long j = s - pi * P.page_size;
    const long long base = (long long)page * P.page_size * (P.dim + 4);
    *off = base + j * P.dim;
    *scaled = true;
    *scale = __ldg((const float*)((const u8*)P.k + base + (long long)P.page_size * P.dim) + j);
    return true;
}

template <int QF, int KF, bool PAGED>
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
    __shared__ float q_s[Q_SMEM];                // a chunk of q's heads, rows of d + 8
    __shared__ float k_w[WARPS][DMAX];           // each warp's current key
    __shared__ float acc_s[CHUNK];               // each key's running head sum
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 3, l = lane & 7;
    const int H = P.heads, d = P.dim, ld = d + 8;
    const int HC = (Q_SMEM / ld) & ~3;           // heads a chunk: 64 (d 64), 32 (128), 16 (256)
    const long long qrow = (long long)t * H * d;
    const float* w = P.weights + (long long)t * H;
    int seq = 0;
    if (PAGED) {
        seq = __ldg(P.seq_ids + t);
        if (seq >= P.sequences) seq = -1;
    }
    for (int c = 0; c < H; c += HC) {
        const int hn = min(HC, H - c);
        // The previous chunk's reads of q_s are done; this chunk's heads go in
        // decoded (rows of d + 8: the four groups' reads hit distinct banks).
        __syncthreads();
        for (int i = threadIdx.x; i < hn * d; i += BLOCK) {
            const int h = i / d, j = i - h * d;
            q_s[h * ld + j] = elem<QF>(P.q, qrow + (long long)(c + h) * d + j);
        }
        __syncthreads();
        for (long long s = lo + warp; s < hi; s += WARPS) {
            long long krow;
            float kscale;
            bool scaled;
            if (!key_at<PAGED>(P, seq, s, &krow, &kscale, &scaled)) continue;  // uniform over the warp
            float* kw = k_w[warp];
            for (int j = lane; j < d; j += 32) kw[j] = elem<KF>(P.k, krow + j);
            __syncwarp();
            float acc = c == 0 ? 0.f : acc_s[s - c0];
            for (int h0 = 0; h0 < hn; h0 += 4) {
                const int h = h0 + g;
                // 1. lane l's products j = l, l + 8, ... in increasing j (a
                //    group past the chunk's heads sums nothing).
                float part = 0.f;
                if (h < hn) {
                    const float* qh = q_s + h * ld;
                    for (int j = l; j < d; j += 8) part = __fadd_rn(part, __fmul_rn(qh[j], kw[j]));
                }
                // 2. the lane tree (the lanes of a group differ in bits 0..2);
                //    every lane of the warp takes part.
                part = __fadd_rn(part, __shfl_xor_sync(FSA_FULL, part, 1));
                part = __fadd_rn(part, __shfl_xor_sync(FSA_FULL, part, 2));
                part = __fadd_rn(part, __shfl_xor_sync(FSA_FULL, part, 4));
                // 3. relu, then the weight; the four heads into the sum in order.
                float p = 0.f;
                if (h < hn) {
                    const float r = part > 0.f || part != part ? part : 0.f;
                    p = __fmul_rn(__ldg(w + c + h), r);
                }
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const float pq = __shfl_sync(FSA_FULL, p, 8 * q);
                    if (h0 + q < hn) acc = __fadd_rn(acc, pq);
                }
            }
            if (lane == 0) acc_s[s - c0] = acc;
            __syncwarp();  // every lane's reads of kw before the next key's writes
        }
    }
    // The scores (a warp's keys are its own in every chunk: no barrier).
    for (long long s = lo + warp; s < hi; s += WARPS) {
        long long krow;
        float kscale;
        bool scaled;
        if (lane != 0) continue;
        if (!key_at<PAGED>(P, seq, s, &krow, &kscale, &scaled)) {
            row[s] = -fsa_inf();
            continue;
        }
        const float acc = acc_s[s - c0];
        float v = scaled ? __fmul_rn(acc, kscale) : acc;
        if (v != v) v = __int_as_float(0x7fc00000);
        row[s] = v;
    }
}

}  // namespace

#define FSD_SCORES(NAME, QF, KF) \
    extern "C" __global__ void __launch_bounds__(BLOCK) NAME(const DsaParams P) { dsa_scores_impl<QF, KF, false>(P); }
#define FSD_PAGED(NAME, QF) \
    extern "C" __global__ void __launch_bounds__(BLOCK) NAME(const DsaParams P) { dsa_scores_impl<QF, KF_E4M3, true>(P); }

FSD_SCORES(dsa_scores_qf32_kf32, KF_F32, KF_F32)
FSD_SCORES(dsa_scores_qf32_kbf16, KF_F32, KF_BF16)
FSD_SCORES(dsa_scores_qf32_ke4m3, KF_F32, KF_E4M3)
FSD_SCORES(dsa_scores_qbf16_kf32, KF_BF16, KF_F32)
FSD_SCORES(dsa_scores_qbf16_kbf16, KF_BF16, KF_BF16)
FSD_SCORES(dsa_scores_qbf16_ke4m3, KF_BF16, KF_E4M3)
FSD_SCORES(dsa_scores_qe4m3_kf32, KF_E4M3, KF_F32)
FSD_SCORES(dsa_scores_qe4m3_kbf16, KF_E4M3, KF_BF16)
FSD_SCORES(dsa_scores_qe4m3_ke4m3, KF_E4M3, KF_E4M3)
FSD_PAGED(dsa_scores_paged_qf32, KF_F32)
FSD_PAGED(dsa_scores_paged_qbf16, KF_BF16)
FSD_PAGED(dsa_scores_paged_qe4m3, KF_E4M3)
