// QSA sparse attention (module SparseQsa): grouped-query attention of each
// query row over the KV slots its index list names, exactly the contract of
// crates/flashsel/src/ops/qsa_attention/mod.rs (docs/semantics.md, "QSA
// sparse attention"). Portable: sm_80 and later, f32 arithmetic on CUDA
// cores, over the sparse MLA kernels' shared steps (common/*.cuh).
//
// ALGORITHM (qsa_attn_fwd_q*_kv*)
//   One CTA of 256 threads per (query row r, KV head g, group of HG = 8 of
//   g's query heads, KV split s). Prologue: the row's length L
//   (common/length.cuh: lengths[r] clamped, or derived from the list's
//   tail). The CTA walks its split's positions [s * chunk, min((s + 1) *
//   chunk, width, L)) in tiles of KT = 32:
//     1. tile_offsets: which entries are attended (p < L, 0 <= idx < slots)
//        and their byte offsets in the cache (K and V share the geometry);
//        a tile with none is skipped whole.
//     2. gather_tile twice: the attended K rows and V rows of head g into
//        shared memory as f32 (zeros for the others, never read).
//     3. logits: warp w computes q[h] . k[j] for its 4 keys and the 8
//        heads, lane l summing the column pairs 2l + 64i, then one
//        reduce-scatter over the warp; l = scale * dot, -inf where not
//        attended.
//     4. softmax_step: warp h updates head h's (m, sum) and writes the
//        tile's probabilities.
//     5. O[h][c] (thread c < d) += p[h][j] * v[j][c] for the 32 keys, in
//        order, after the rescale by alpha.
//   With one split the CTA writes out (q's dtype) and lse (-inf for an
//   empty head); with several it writes its unnormalised state (O, m, sum)
//   to the workspace and qsa_attn_combine_* merges the splits.
//
// ALGORITHM (qsa_attn_combine_*)
//   One CTA per (row, head): M = max_s m_s, w_s = exp(m_s - M), sum = sum_s
//   w_s sum_s, O = sum_s w_s O_s, in increasing s (a fixed order), then the
//   same output step as one split.
//
// INVARIANTS
//   - Determinism: the split plan (groups, splits, chunk) is a function of
//     the shapes only (host: ops/qsa_attention/device.rs, QsaAttnPlan);
//     every sum runs in a fixed order; no atomics touch values.
//   - The derived length only shortens the loop: tiles past L hold no
//     attended entry and would be skipped anyway, so passing the derived L
//     explicitly gives the same bits.
//   - A K / V row is read only for an attended entry (gather.cuh); q rows
//     of heads past the group are zeros and nothing is written for them.
//   - Every barrier is reached by all threads: loop bounds and the skip
//     test are uniform over the CTA.
//
// COST
//   Per attended entry and head: 4 d FLOPs in f32 FMAs. Each K / V row of
//   head g is gathered once per CTA of its row (ceil(group / 8) CTAs, QSA's
//   12 heads a KV head: 2, the second from L2). Shared memory (HG + 2 KT) d
//   * 4 B + 2.3 KB: 76.0 KB at d 256.
#include "attention/common/types.cuh"
#include "attention/common/gather.cuh"
#include "attention/common/length.cuh"
#include "attention/common/softmax.cuh"
#include "attention/common/tile_f32.cuh"

using namespace fsattn;

namespace {

constexpr int BLOCK = 256;
constexpr int WARPS = BLOCK / 32;
constexpr int HG = 8;   // heads per CTA (one warp each in the softmax)
constexpr int KT = 32;  // entries per tile (one lane each in the softmax)
constexpr int DMAX = 256;
static_assert(HG == WARPS && KT == 32 && HG * 4 == 32 && KT == 4 * WARPS, "the warp mappings below");
static_assert(BLOCK == DMAX, "thread c owns output column c");

}  // namespace

// The parameter block (host: ops/qsa_attention/device.rs, QsaAttnParams;
// 136 bytes).
struct QsaAttnParams {
    const void* q;       // [rows][h_q][d], q's format
    const u8* k;         // slot s, head g at (s / page_size) * page_stride + (s % page_size) * token_stride + g * d * elem
    const u8* v;         // the same geometry as k
    const int* indices;  // [rows][width]
    const int* lengths;  // [rows], or null: derived
    void* out;           // [rows][h_q][d], q's format
    float* lse;          // [rows][h_q]
    float* ws;           // split partials: O [rows][h_q][splits][d], then (m, sum) [rows][h_q][splits]
    i64 bound;           // valid slots 0 .. bound
    i64 page_size;
    i64 page_stride;     // bytes
    i64 token_stride;    // bytes
    int rows;
    int h_q;
    int d;
    int width;
    int group;           // query heads per KV head
    int gpk;             // CTAs per KV head: ceil(group / HG)
    int groups;          // CTAs per row across the heads: h_kv * gpk
    int splits;
    int chunk;           // positions per split, a multiple of KT
    float scale;
};
static_assert(sizeof(QsaAttnParams) == 136, "QsaAttnParams mirrors the host's layout");

namespace {

template <int KF>
__device__ __forceinline__ CacheGeom head_geom(const QsaAttnParams& P, const u8* base, int g) {
    CacheGeom geom;
    geom.base = base + (i64)g * P.d * (KF == FMT_F32 ? 4 : 2);
    geom.bound = P.bound;
    geom.page_size = P.page_size;
    geom.page_stride = P.page_stride;
    geom.token_stride = P.token_stride;
    geom.aligned = (((u64)geom.base | (u64)P.page_stride | (u64)P.token_stride) & 15u) == 0;
    return geom;
}

// The output step of one head: out (0 for an empty head) and lse (-inf for
// an empty head: the log of an empty sum).
template <int QF>
__device__ __forceinline__ void write_head(const QsaAttnParams& P, i64 rh, int c, float o, float m, float sum) {
    const HeadOut ho = head_out(m, sum, nullptr, 0);
    if (c < P.d) store_elem<QF>(P.out, rh * P.d + c, ho.empty ? 0.f : o * ho.scale);
    if (threadIdx.x == 0) P.lse[rh] = ho.empty ? -fsa_inf() : ho.lse;
}

template <int QF, int KF>
__device__ __forceinline__ void qsa_attn_forward(const QsaAttnParams& P) {
    extern __shared__ __align__(16) float smem[];
    __shared__ int len_s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = P.d, h_q = P.h_q;
    float* q_s = smem;                 // [HG][d]
    float* k_s = q_s + HG * d;         // [KT][d]
    float* v_s = k_s + KT * d;         // [KT][d]
    float* s_s = v_s + KT * d;         // [HG][KT] logits
    float* p_s = s_s + HG * KT;        // [KT][HG] probabilities
    float* st_s = p_s + KT * HG;       // alpha [HG], m [HG], sum [HG] (32 floats)
    i64* off_s = (i64*)(st_s + 32);    // [KT]

    const i64 bid = blockIdx.x;
    const int split = (int)(bid % P.splits);
    const i64 rg = bid / P.splits;
    const int gi = (int)(rg % P.groups);
    const int r = (int)(rg / P.groups);
    const int g = gi / P.gpk;                 // KV head
    const int h0 = (gi - g * P.gpk) * HG;     // first head of the CTA within g's group
    const int nh = min(HG, P.group - h0);     // heads of the CTA
    const int hq0 = g * P.group + h0;         // its first query head
    const int* idx_row = P.indices + (i64)r * P.width;
    const CacheGeom gk = head_geom<KF>(P, P.k, g);
    const CacheGeom gv = head_geom<KF>(P, P.v, g);

    // q rows of the CTA's heads (zeros past nh), as f32.
    for (int i = tid; i < HG * d; i += BLOCK) {
        const int h = i / d, c = i - h * d;
        q_s[i] = h < nh ? load_elem<QF>(P.q, ((i64)r * h_q + hq0 + h) * d + c) : 0.f;
    }
    const int L = list_length<BLOCK>(P.lengths, r, idx_row, P.width, P.bound, &len_s);
    const i64 start = (i64)split * P.chunk;
    const int lim = (int)min(min(start + P.chunk, (i64)P.width), (i64)L);

    float m_run = -fsa_inf(), sum_run = 0.f;  // head `warp`'s state (every lane)
    float o[HG][1];
#pragma unroll
    for (int h = 0; h < HG; ++h) o[h][0] = 0.f;
    const float scale = P.scale;

    for (int t0 = (int)start; t0 < lim; t0 += KT) {
        // The barrier inside also orders the previous tile's reads of k_s,
        // v_s and p_s before this tile's writes.
        if (!tile_offsets<KT>(off_s, idx_row, t0, lim, gk)) continue;
        gather_tile<KF, KT, BLOCK>(k_s, off_s, gk, d);
        gather_tile<KF, KT, BLOCK>(v_s, off_s, gv, d);
        __syncthreads();
        {
            const float dot = tile_dot<HG>(q_s, k_s, d, lane, warp);
            const int h = lane >> 2, j = 4 * warp + (lane & 3);
            s_s[h * KT + j] = off_s[j] >= 0 ? dot * scale : -fsa_inf();
        }
        __syncthreads();
        {
            float alpha;
            const float p = softmax_step(s_s[warp * KT + lane], m_run, sum_run, &alpha);
            p_s[lane * HG + warp] = p;
            if (lane == 0) st_s[warp] = alpha;
        }
        __syncthreads();
        if (tid < d) tile_pv<HG, KT, 1>(o, st_s, p_s, v_s, d, tid);
    }
    // Every thread's last reads of st_s[0..HG) are done before this barrier;
    // the final states go beside them.
    if (lane == 0) {
        st_s[HG + warp] = m_run;
        st_s[2 * HG + warp] = sum_run;
    }
    __syncthreads();
    if (P.splits == 1) {
#pragma unroll
        for (int h = 0; h < HG; ++h) {
            if (h >= nh) break;
            write_head<QF>(P, (i64)r * h_q + hq0 + h, tid, o[h][0], st_s[HG + h], st_s[2 * HG + h]);
        }
    } else {
        const i64 parts = (i64)P.rows * h_q * P.splits;
        float* ml = P.ws + parts * d;
#pragma unroll
        for (int h = 0; h < HG; ++h) {
            if (h >= nh) break;
            const i64 part = ((i64)r * h_q + hq0 + h) * P.splits + split;
            if (tid < d) P.ws[part * d + tid] = o[h][0];
            if (tid == 0) {
                ml[2 * part] = st_s[HG + h];
                ml[2 * part + 1] = st_s[2 * HG + h];
            }
        }
    }
}

template <int QF>
__device__ __forceinline__ void qsa_attn_combine(const QsaAttnParams& P) {
    const i64 rh = blockIdx.x;
    const int S = P.splits, d = P.d;
    const int c = (int)threadIdx.x;
    const i64 parts = (i64)P.rows * P.h_q * S;
    const float* ml = P.ws + parts * d + rh * S * 2;
    float M = -fsa_inf();
    for (int s = 0; s < S; ++s) M = nan_max(M, __ldg(ml + 2 * s));
    float sum = 0.f, o = 0.f;
    if (M != -fsa_inf()) {
        for (int s = 0; s < S; ++s) {
            const float ms = __ldg(ml + 2 * s);
            const float w = ms == -fsa_inf() ? 0.f : expf(ms - M);
            sum = fmaf(__ldg(ml + 2 * s + 1), w, sum);
            if (c < d) o = fmaf(__ldg(P.ws + (rh * S + s) * d + c), w, o);
        }
    }
    write_head<QF>(P, rh, c, o, M, sum);
}

}  // namespace

#define FSQ_FWD(NAME, QF, KF) \
    extern "C" __global__ void __launch_bounds__(BLOCK, 2) NAME(const QsaAttnParams P) { qsa_attn_forward<QF, KF>(P); }

FSQ_FWD(qsa_attn_fwd_qf32_kvf32, FMT_F32, FMT_F32)
FSQ_FWD(qsa_attn_fwd_qf32_kvbf16, FMT_F32, FMT_BF16)
FSQ_FWD(qsa_attn_fwd_qbf16_kvf32, FMT_BF16, FMT_F32)
FSQ_FWD(qsa_attn_fwd_qbf16_kvbf16, FMT_BF16, FMT_BF16)

extern "C" __global__ void __launch_bounds__(BLOCK) qsa_attn_combine_f32(const QsaAttnParams P) {
    qsa_attn_combine<FMT_F32>(P);
}
extern "C" __global__ void __launch_bounds__(BLOCK) qsa_attn_combine_bf16(const QsaAttnParams P) {
    qsa_attn_combine<FMT_BF16>(P);
}

// The tensor-core kernels (bf16 q and K / V, d 128 and 256).
#include "attention/sparse_qsa_tc.cuh"
