// Sparse MLA attention (module SparseMla): FlashMLA's sparse prefill and the
// sparse decode over a paged cache, exactly the contract of
// crates/flashsel/src/ops/mla/mod.rs (docs/semantics.md, "Sparse MLA
// attention"). Portable: sm_80 and later, f32 arithmetic on CUDA cores.
//
// ALGORITHM (mla_fwd_q*_kv*)
//   One CTA of 256 threads per (query row r, group of HG = 8 heads, KV split
//   s). Prologue: the row's length L, either topk_length (clamped to
//   0..topk) or derived as in seed 000: the index list is scanned from the
//   tail, 256 positions at a time, until a chunk holds an in-range index; L
//   is one past the last one (0 when none). The CTA then walks its split's
//   positions [s * chunk, min((s + 1) * chunk, topk, L)) in tiles of KT = 32:
//     1. tile_offsets: which entries are attended (p < L, 0 <= idx < bound)
//        and their byte offsets; a tile with none is skipped whole.
//     2. gather_tile: the attended KV rows into shared memory as f32 (zeros
//        for the others, which are never read).
//     3. logits: warp w computes q[h] . k[j] for its 4 keys and all 8 heads,
//        lane l summing the column pairs 2l + 64i, then one reduce-scatter
//        over the warp; l = sm_scale * dot, -inf where not attended.
//     4. softmax_step: warp h updates head h's (m, sum) and writes the
//        tile's probabilities.
//     5. O[h][2t, 2t + 1] (thread t) += p[h][j] * v[j] for the 32 keys, in
//        order, after the rescale by alpha.
//   With one split the CTA writes out (q's dtype), lse and max_logits; with
//   several it writes its unnormalised state (O, m, sum) to the workspace
//   and mla_combine_* merges the splits.
//
// ALGORITHM (mla_combine_*)
//   One CTA per (row, head): M = max_s m_s, w_s = exp(m_s - M), sum = sum_s
//   w_s sum_s, O = sum_s w_s O_s, in increasing s (a fixed order), then the
//   same output step as one split (softmax.cuh: head_out).
//
// INVARIANTS
//   - Determinism: the split plan (groups, splits, chunk) is a function of
//     the shapes only (host: ops/mla/device.rs, MlaPlan); every sum runs in
//     a fixed order; no atomics touch values (the derived length's atomicMax
//     is order-free).
//   - The derived length only shortens the loop: tiles past L hold no
//     attended entry and would be skipped anyway, so passing the derived L
//     explicitly gives the same bits.
//   - A KV row is read only for an attended entry (gather.cuh); q rows past
//     h_q are zeros and nothing is written for them.
//   - Every barrier is reached by all threads: loop bounds and the skip test
//     are uniform over the CTA.
//
// COST
//   Per attended entry and head: 2 (d_qk + 512) FLOPs in f32 FMAs; the logits
//   read q and k from shared memory as float2 (12 loads per 64 FMAs), the
//   output 3 loads per 16 FMAs. Each KV row is gathered once per head group
//   (ceil(h_q / 8) CTAs per row read it, mostly from L2). Shared memory
//   (HG + KT) * d_qk * 4 B + 2.3 KB: 94.6 KB at d_qk 576 (fits sm_86/89's 99
//   KB; two CTAs per SM on sm_90).
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
constexpr int DV = 512;
static_assert(HG == WARPS && KT == 32 && HG * 4 == 32 && KT == 4 * WARPS, "the warp mappings below");
static_assert(2 * BLOCK == DV, "thread t owns output columns 2t, 2t + 1");

}  // namespace

// The parameter block (host: ops/mla/device.rs, MlaParams; 144 bytes).
struct MlaParams {
    const void* q;         // [rows][h_q][d_qk], q's format
    const u8* kv;          // the cache: slot s at (s / page_size) * page_stride + (s % page_size) * token_stride
    const int* indices;    // [rows][topk]
    const int* lengths;    // topk_length, or null: derived
    const float* sink;     // [h_q], or null
    void* out;             // [rows][h_q][512], q's format
    float* max_logits;     // [rows][h_q], or null
    float* lse;            // [b][h_q][s_q] (prefill: s_q = 1, i.e. [rows][h_q])
    float* ws;             // split partials: O [rows][h_q][splits][512], then (m, sum) [rows][h_q][splits]
    i64 bound;             // valid indices 0 .. bound
    i64 page_size;
    i64 page_stride;       // bytes
    i64 token_stride;      // bytes
    int rows;
    int h_q;
    int d_qk;
    int topk;
    int s_q;               // rows per request (lse layout, lengths per request)
    int len_per_row;       // 1: lengths[r]; 0: lengths[r / s_q]
    int groups;            // ceil(h_q / HG)
    int splits;
    int chunk;             // positions per split, a multiple of KT
    float sm_scale;
};
static_assert(sizeof(MlaParams) == 144, "MlaParams mirrors the host's layout");

namespace {

__device__ __forceinline__ i64 lse_at(int r, int h, int h_q, int s_q) {
    const int b = r / s_q, s = r - b * s_q;
    return ((i64)b * h_q + h) * s_q + s;
}

// The row's length: topk_length (clamped) or the derived one (seed 000),
// common/length.cuh.
template <int NT = BLOCK>
__device__ __forceinline__ int row_length(const MlaParams& P, const int* idx_row, int r, int* len_s) {
    return list_length<NT>(P.lengths, P.len_per_row ? r : r / P.s_q, idx_row, P.topk, P.bound, len_s);
}

template <int QF, int KF>
__device__ __forceinline__ void mla_forward(const MlaParams& P) {
    extern __shared__ __align__(16) float smem[];
    __shared__ int len_s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d_qk = P.d_qk, h_q = P.h_q;
    float* q_s = smem;                 // [HG][d_qk]
    float* k_s = q_s + HG * d_qk;      // [KT][d_qk]
    float* s_s = k_s + KT * d_qk;      // [HG][KT] logits
    float* p_s = s_s + HG * KT;        // [KT][HG] probabilities
    float* st_s = p_s + KT * HG;       // alpha [HG], m [HG], sum [HG] (32 floats)
    i64* off_s = (i64*)(st_s + 32);    // [KT]

    const i64 bid = blockIdx.x;
    const int split = (int)(bid % P.splits);
    const i64 rg = bid / P.splits;
    const int g = (int)(rg % P.groups);
    const int r = (int)(rg / P.groups);
    const int* idx_row = P.indices + (i64)r * P.topk;

    CacheGeom geom;
    geom.base = P.kv;
    geom.bound = P.bound;
    geom.page_size = P.page_size;
    geom.page_stride = P.page_stride;
    geom.token_stride = P.token_stride;
    geom.aligned = (((u64)P.kv | (u64)P.page_stride | (u64)P.token_stride) & 15u) == 0;

    // q rows of the group (zeros past h_q), as f32.
    for (int i = tid; i < HG * d_qk; i += BLOCK) {
        const int h = i / d_qk, d = i - h * d_qk, hq = g * HG + h;
        q_s[i] = hq < h_q ? load_elem<QF>(P.q, ((i64)r * h_q + hq) * d_qk + d) : 0.f;
    }
    const int L = row_length(P, idx_row, r, &len_s);
    const i64 start = (i64)split * P.chunk;
    const int lim = (int)min(min(start + P.chunk, (i64)P.topk), (i64)L);

    float m_run = -fsa_inf(), sum_run = 0.f;  // head `warp`'s state (every lane)
    float o[HG][2];
#pragma unroll
    for (int h = 0; h < HG; ++h) o[h][0] = o[h][1] = 0.f;
    const float scale = P.sm_scale;

    for (int t0 = (int)start; t0 < lim; t0 += KT) {
        // The barrier inside also orders the previous tile's reads of k_s
        // and p_s before this tile's writes.
        if (!tile_offsets<KT>(off_s, idx_row, t0, lim, geom)) continue;
        gather_tile<KF, KT, BLOCK>(k_s, off_s, geom, d_qk);
        __syncthreads();
        {
            const float dot = tile_dot<HG>(q_s, k_s, d_qk, lane, warp);
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
        tile_pv<HG, KT, 2>(o, st_s, p_s, k_s, d_qk, 2 * tid);
    }
    // Every thread's last reads of st_s[0..HG) are done before this barrier;
    // the final states go beside them.
    if (lane == 0) {
        st_s[HG + warp] = m_run;
        st_s[2 * HG + warp] = sum_run;
    }
    __syncthreads();
    const int c = 2 * tid;
    if (P.splits == 1) {
#pragma unroll
        for (int h = 0; h < HG; ++h) {
            const int hq = g * HG + h;
            if (hq >= h_q) break;
            const float m = st_s[HG + h];
            const HeadOut ho = head_out(m, st_s[2 * HG + h], P.sink, hq);
            const i64 at = ((i64)r * h_q + hq) * DV + c;
            store_elem<QF>(P.out, at, ho.empty ? 0.f : o[h][0] * ho.scale);
            store_elem<QF>(P.out, at + 1, ho.empty ? 0.f : o[h][1] * ho.scale);
            if (tid == 0) {
                P.lse[lse_at(r, hq, h_q, P.s_q)] = ho.lse;
                if (P.max_logits) P.max_logits[(i64)r * h_q + hq] = m;
            }
        }
    } else {
        const i64 parts = (i64)P.rows * h_q * P.splits;
        float* ml = P.ws + parts * DV;
#pragma unroll
        for (int h = 0; h < HG; ++h) {
            const int hq = g * HG + h;
            if (hq >= h_q) break;
            const i64 part = ((i64)r * h_q + hq) * P.splits + split;
            *(float2*)(P.ws + part * DV + c) = make_float2(o[h][0], o[h][1]);
            if (tid == 0) {
                ml[2 * part] = st_s[HG + h];
                ml[2 * part + 1] = st_s[2 * HG + h];
            }
        }
    }
}

template <int QF>
__device__ __forceinline__ void mla_combine(const MlaParams& P) {
    const i64 rh = blockIdx.x;
    const int h_q = P.h_q, S = P.splits;
    const int r = (int)(rh / h_q), hq = (int)(rh - (i64)r * h_q);
    const int c = 2 * (int)threadIdx.x;
    const i64 parts = (i64)P.rows * h_q * S;
    const float* ml = P.ws + parts * DV + rh * S * 2;
    float M = -fsa_inf();
    for (int s = 0; s < S; ++s) M = nan_max(M, __ldg(ml + 2 * s));
    float sum = 0.f, o0 = 0.f, o1 = 0.f;
    if (M != -fsa_inf()) {
        for (int s = 0; s < S; ++s) {
            const float ms = __ldg(ml + 2 * s);
            const float w = ms == -fsa_inf() ? 0.f : expf(ms - M);
            sum = fmaf(__ldg(ml + 2 * s + 1), w, sum);
            const float2 v = __ldg((const float2*)(P.ws + (rh * S + s) * DV + c));
            o0 = fmaf(v.x, w, o0);
            o1 = fmaf(v.y, w, o1);
        }
    }
    const HeadOut ho = head_out(M, sum, P.sink, hq);
    const i64 at = rh * DV + c;
    store_elem<QF>(P.out, at, ho.empty ? 0.f : o0 * ho.scale);
    store_elem<QF>(P.out, at + 1, ho.empty ? 0.f : o1 * ho.scale);
    if (threadIdx.x == 0) {
        P.lse[lse_at(r, hq, h_q, P.s_q)] = ho.lse;
        if (P.max_logits) P.max_logits[rh] = M;
    }
}

}  // namespace

#define FSA_FWD(NAME, QF, KF) \
    extern "C" __global__ void __launch_bounds__(BLOCK, 2) NAME(const MlaParams P) { mla_forward<QF, KF>(P); }

FSA_FWD(mla_fwd_qf32_kvf32, FMT_F32, FMT_F32)
FSA_FWD(mla_fwd_qf32_kvbf16, FMT_F32, FMT_BF16)
FSA_FWD(mla_fwd_qf32_kvfp8, FMT_F32, FMT_FP8)
FSA_FWD(mla_fwd_qbf16_kvf32, FMT_BF16, FMT_F32)
FSA_FWD(mla_fwd_qbf16_kvbf16, FMT_BF16, FMT_BF16)
FSA_FWD(mla_fwd_qbf16_kvfp8, FMT_BF16, FMT_FP8)

extern "C" __global__ void __launch_bounds__(BLOCK) mla_combine_f32(const MlaParams P) { mla_combine<FMT_F32>(P); }
extern "C" __global__ void __launch_bounds__(BLOCK) mla_combine_bf16(const MlaParams P) { mla_combine<FMT_BF16>(P); }

// The tensor-core kernels (bf16 q with a bf16 or fp8 cache).
#include "attention/sparse_mla_tc.cuh"
