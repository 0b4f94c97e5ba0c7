// QSA sparse attention on tensor cores (module SparseQsa, entries
// qsa_attn_tc_fwd_d{128,256}): the bf16 forward of sparse_qsa.cu (same
// contract, same parameter block, same split-KV workspace and combine) with
// both GEMMs on mma.sync m16n8k16 (bf16 in, f32 accumulate), the scheme of
// sparse MLA's tensor-core kernel (sparse_mla_tc.cuh) with QSA's shapes:
// one m16 tile of a KV head's query heads (QSA's 12 a KV head: 4 masked
// rows), d_qk = d_v = d, V from its own cache. Portable: sm_80 and later.
// Included by sparse_qsa.cu after its helpers (QsaAttnParams, head_geom).
//
// ALGORITHM (qsa_attn_tc_fwd_d*)
//   One CTA of 256 threads (8 warps) per (query row r, KV head g, block of
//   16 of g's query heads, KV split s). Prologue: q's block into shared
//   memory (bf16, zero rows past the block's heads), the row's length L
//   (common/length.cuh). Then per tile of KT = 32 positions of the split:
//     1. tile_offsets_of (gather.cuh): attended entries and their offsets,
//        from the entries threads < 32 loaded a tile ahead; a tile without
//        one is skipped.
//     2. qt_gather: the attended K rows and V rows of head g into k_s, v_s
//        as bf16 (cp.async when the cache's base and strides are 16-byte
//        multiples, else plain loads; zeros for the others, never read
//        from the cache), thread t serving token t / 8.
//     3. S = Q K^T: warp w takes the w-th eighth of the d / 16 k-steps, all
//        32 keys (ldmatrix x4 for A and B); its partial S goes to sp_s[w].
//     4. softmax (softmax.cuh: softmax_steps over the warp's two rows w and
//        w + 8): lane j sums key j's eight partials in warp order, times
//        the scale (-inf when not attended), updates the row's f32 (m, sum)
//        and writes p as two bf16 terms, hi = bf16(p) and lo = bf16(p - hi)
//        (sparse MLA's reason: one bf16 rounding of P misses the out
//        tolerance on rows with few keys), and alpha.
//     5. O = alpha O + P V: warp w takes output columns w d / 8 .. (w + 1)
//        d / 8 (d / 64 n8 tiles), A = P hi then P lo (ldmatrix), B = V
//        (ldmatrix .trans).
//   End: one split writes out (bf16) and lse (-inf for an empty head); several
//   write (O, m, sum) to the workspace for qsa_attn_combine_bf16, as the f32
//   kernel does.
//
// INVARIANTS
//   - Determinism: the split is a function of the shapes and formats only
//     (host: QsaAttnPlan); the partial logits are summed in a fixed warp
//     order; mma.sync is deterministic; no atomics touch values.
//   - The derived length only shortens the loop: derived and explicit
//     lengths give the same bits.
//   - A K / V row is read only for an attended entry; q rows past the
//     block's heads are zeros and nothing is written for them.
//   - Barriers: tile_offsets' orders the previous tile's reads of k_s, v_s,
//     p_s and alpha before this tile's writes; B0 (after the gather's
//     cp.async wait) the gathers before the products; B1 the partial logits
//     before the softmax; B2 the probabilities before P V. All uniform.
//   - Shared rows are padded to an odd number of 16-byte chunks (d + 8 bf16
//     for q / k / v, 40 for p), so an ldmatrix's 8 row addresses hit 8
//     distinct bank groups.
//
// COST
//   Per attended entry and head 4 d FLOPs on tensor cores (heads padded to
//   16: QSA's 12 use 75% of the rows). Per tile and warp: QK^T d / 128
//   k-steps of 3 ldmatrix.x4 + 4 mma, PV 2 k-steps of 2 + d / 128
//   ldmatrix.x4 and d / 16 mma (hi and lo). Each K / V row is gathered
//   once per 16 heads. Shared memory 65,728 B at d 256, 45,248 B at d 128.
#include "attention/common/mma.cuh"
#include "attention/common/tc_softmax.cuh"

namespace {

constexpr int QT_KT = 32;     // positions per tile
constexpr int QT_MR = 16;     // heads per CTA (one m16 tile)
constexpr int QT_WARPS = 8;
constexpr int QT_NT = 32 * QT_WARPS;
constexpr int QT_PLD = 40;    // bf16 per p row (32 + 8)
constexpr int QT_SLD = 40;    // f32 per partial-logit row (32 + 8)
constexpr int QT_ROWS = QT_MR / QT_WARPS;  // softmax rows a warp

template <int D>
struct QtShape {
    static constexpr int LD = D + 8;            // bf16 per q / k / v row
    static constexpr int KS = D / 16;           // k16 steps of Q K^T
    static constexpr int CW = D / QT_WARPS;     // output columns a warp
    static constexpr int NB = CW / 8;           // n8 tiles of O a warp
    static constexpr int CHUNKS = D / 8;        // 16-byte chunks a row
    static constexpr int Q_BYTES = QT_MR * LD * 2;
    static constexpr int K_BYTES = QT_KT * LD * 2;  // k_s, then v_s
    static constexpr int S_BYTES = QT_WARPS * QT_MR * QT_SLD * 4;
    static constexpr int P_BYTES = 2 * QT_MR * QT_PLD * 2;
    static constexpr int ST_BYTES = 3 * QT_MR * 4;
    static constexpr int OFF_BYTES = QT_KT * 8;
    static constexpr int SMEM = Q_BYTES + 2 * K_BYTES + S_BYTES + P_BYTES + ST_BYTES + OFF_BYTES;
};
static_assert(QtShape<256>::SMEM == 65728 && QtShape<128>::SMEM == 45248, "host: ops/qsa_attention/device.rs");
static_assert(QtShape<128>::NB % 2 == 0 && QtShape<256>::NB % 2 == 0, "pairs of n8 tiles a V fragment");
static_assert(QT_ROWS * QT_WARPS == QT_MR && QT_NT == 8 * QT_KT, "the warp mappings below");

// The tile's attended K and V rows of head g into k_s and v_s ([KT][LD]
// bf16; zeros where not attended): thread t serves token t / 8 and its
// 16-byte chunks t % 8 + 8 m. The copies are visible only after the
// caller's barrier (B0).
template <int D>
__device__ __forceinline__ void qt_gather(u16* k_s, u16* v_s, const i64* off_s, const CacheGeom& gk,
                                          const CacheGeom& gv) {
    using S = QtShape<D>;
    const int j = (int)threadIdx.x >> 3, u = (int)threadIdx.x & 7;
    const i64 off = off_s[j];
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
        const CacheGeom& g = kv == 0 ? gk : gv;
        u16* row = (kv == 0 ? k_s : v_s) + j * S::LD;
        const u8* src = g.base + (off < 0 ? 0 : off);
#pragma unroll
        for (int m = 0; m < S::CHUNKS / 8; ++m) {
            const int c = u + 8 * m;
            if (off < 0) {
                *(uint4*)(row + 8 * c) = make_uint4(0u, 0u, 0u, 0u);
            } else if (g.aligned) {
                cp_async16(smem_addr(row + 8 * c), src + 16 * c);
            } else {
                *(uint4*)(row + 8 * c) = ld16(src + 16 * c, false);
            }
        }
    }
    cp_async_wait_all();
}

// One k16 step ks of S = Q K^T: the warp's A fragment (16 heads) times the
// B fragments of the tile's 32 keys.
template <int LD>
__device__ __forceinline__ void qt_qk_step(float (&acc)[4][4], u32 qa, u32 kb, int ks) {
    u32 a[4], b0[4], b1[4];
    ldsm_x4(a, qa + 32 * ks);
    ldsm_x4(b0, kb + 32 * ks);
    ldsm_x4(b1, kb + 32 * LD + 32 * ks);
    mma_bf16_16816(acc[0], a, b0[0], b0[1]);
    mma_bf16_16816(acc[1], a, b0[2], b0[3]);
    mma_bf16_16816(acc[2], a, b1[0], b1[1]);
    mma_bf16_16816(acc[3], a, b1[2], b1[3]);
}

template <int D>
__device__ __forceinline__ void qsa_attn_tc_forward(const QsaAttnParams& P) {
    using S = QtShape<D>;
    constexpr int LD = S::LD, MR = QT_MR, NB = S::NB, CW = S::CW;
    extern __shared__ __align__(16) float smem[];
    __shared__ int len_s;
    u8* sb = (u8*)smem;
    u16* q_s = (u16*)sb;                                        // [MR][LD]
    u16* k_s = (u16*)(sb + S::Q_BYTES);                         // [KT][LD]
    u16* v_s = (u16*)(sb + S::Q_BYTES + S::K_BYTES);            // [KT][LD]
    float* sp_s = (float*)(sb + S::Q_BYTES + 2 * S::K_BYTES);   // [WARPS][MR][SLD]
    u16* p_s = (u16*)((u8*)sp_s + S::S_BYTES);                  // hi [MR][PLD], then lo
    float* st_s = (float*)((u8*)p_s + S::P_BYTES);              // alpha [MR], m [MR], sum [MR]
    i64* off_s = (i64*)((u8*)st_s + S::ST_BYTES);               // [KT]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int h_q = P.h_q;
    const i64 bid = blockIdx.x;
    const int split = (int)(bid % P.splits);
    const i64 rg = bid / P.splits;
    const int gi = (int)(rg % P.groups);
    const int r = (int)(rg / P.groups);
    const int g = gi / P.gpk;                  // KV head
    const int h0 = (gi - g * P.gpk) * MR;      // first head of the CTA within g's group
    const int nh = min(MR, P.group - h0);      // heads of the CTA
    const int hq0 = g * P.group + h0;          // its first query head
    const int* idx_row = P.indices + (i64)r * P.width;

    // q's block (zeros past nh), 8 bf16 at a time.
    {
        const u8* qb = (const u8*)P.q;
        const bool qal = ((u64)qb & 15u) == 0;
        for (int i = tid; i < MR * S::CHUNKS; i += QT_NT) {
            const int h = i / S::CHUNKS, c = i - h * S::CHUNKS;
            uint4 w = make_uint4(0u, 0u, 0u, 0u);
            if (h < nh) w = ld16(qb + (((i64)r * h_q + hq0 + h) * D + 8 * c) * 2, qal);
            *(uint4*)(q_s + h * LD + 8 * c) = w;
        }
    }
    const int L = list_length<QT_NT>(P.lengths, r, idx_row, P.width, P.bound, &len_s);
    const i64 start = (i64)split * P.chunk;
    const int lim = (int)min(min(start + P.chunk, (i64)P.width), (i64)L);
    if (tid < MR) {
        st_s[MR + tid] = -fsa_inf();
        st_s[2 * MR + tid] = 0.f;
    }
    float o[NB][4];
#pragma unroll
    for (int n = 0; n < NB; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    const int k_lo = warp * S::KS / QT_WARPS, k_hi = (warp + 1) * S::KS / QT_WARPS;
    const float scale = P.scale;
    // ldmatrix row addresses (sparse_mla_tc.cuh's mapping): A rows (lane &
    // 15), cols 8 (lane >> 4); B from [key][d]: key (lane & 7) + 8 (lane >>
    // 4), d 8 ((lane >> 3) & 1); B.trans from [key][col]: key (lane & 15),
    // col 8 (lane >> 4).
    const int a_row = lane & 15, a_col = 8 * (lane >> 4);
    const int b_key = (lane & 7) + 8 * (lane >> 4), b_col = 8 * ((lane >> 3) & 1);
    const u32 qa = smem_addr(q_s + a_row * LD + a_col);
    const u32 kb = smem_addr(k_s + b_key * LD + b_col);
    const u32 pa = smem_addr(p_s + a_row * QT_PLD + a_col);
    const u32 vb = smem_addr(v_s + a_row * LD + warp * CW + a_col);
    const CacheGeom gk = head_geom<FMT_BF16>(P, P.k, g);
    const CacheGeom gv = head_geom<FMT_BF16>(P, P.v, g);

    int entry = tile_entry<QT_KT>(idx_row, (int)start, lim);
    for (int t0 = (int)start; t0 < lim; t0 += QT_KT) {
        const int cur = entry;
        entry = tile_entry<QT_KT>(idx_row, t0 + QT_KT, lim);
        if (!tile_offsets_of<QT_KT>(off_s, cur, gk)) continue;
        qt_gather<D>(k_s, v_s, off_s, gk, gv);
        __syncthreads();  // B0
        {
            float acc[4][4];
#pragma unroll
            for (int n = 0; n < 4; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
            for (int ks = k_lo; ks < k_hi; ++ks) qt_qk_step<LD>(acc, qa, kb, ks);
            float* sp = sp_s + (warp * MR + gid) * QT_SLD + 2 * tig;
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                *(float2*)(sp + 8 * n) = make_float2(acc[n][0], acc[n][1]);
                *(float2*)(sp + 8 * QT_SLD + 8 * n) = make_float2(acc[n][2], acc[n][3]);
            }
        }
        __syncthreads();  // B1
        tc_softmax_tile<QT_ROWS, QT_WARPS, MR, QT_SLD, QT_PLD, QT_WARPS>(sp_s, p_s, st_s, warp, lane, off_s[lane] >= 0,
                                                                        scale);
        __syncthreads();  // B2
        {
            tc_rescale<NB>(o, st_s[gid], st_s[gid + 8]);
#pragma unroll
            for (int kk = 0; kk < QT_KT / 16; ++kk) {
                u32 a[4], al[4];
                ldsm_x4(a, pa + 32 * kk);
                ldsm_x4(al, pa + 2 * MR * QT_PLD + 32 * kk);
#pragma unroll
                for (int np = 0; np < NB / 2; ++np) {
                    u32 b[4];
                    ldsm_x4_trans(b, vb + 32 * kk * LD + 32 * np);
                    mma_bf16_16816(o[2 * np], a, b[0], b[1]);
                    mma_bf16_16816(o[2 * np + 1], a, b[2], b[3]);
                    mma_bf16_16816(o[2 * np], al, b[0], b[1]);
                    mma_bf16_16816(o[2 * np + 1], al, b[2], b[3]);
                }
            }
        }
    }
    // The last tile's state writes are ordered before the epilogue's reads
    // (with no tile at all: the initial values, before this barrier).
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = gid + 8 * half;
        if (row >= nh) continue;
        const int hq = hq0 + row;
        const float m = st_s[MR + row], sum = st_s[2 * MR + row];
        const int c0 = warp * CW + 2 * tig;
        const i64 rh = (i64)r * h_q + hq;
        if (P.splits == 1) {
            const HeadOut ho = head_out(m, sum, nullptr, 0);
            u16* out = (u16*)P.out + rh * D + c0;
            const bool pairs = ((u64)P.out & 3u) == 0;  // else two 2-byte stores
#pragma unroll
            for (int n = 0; n < NB; ++n) {
                const float x = ho.empty ? 0.f : o[n][2 * half] * ho.scale;
                const float y = ho.empty ? 0.f : o[n][2 * half + 1] * ho.scale;
                const u32 xy = pack_bf16x2(x, y);
                if (pairs) {
                    *(u32*)(out + 8 * n) = xy;
                } else {
                    out[8 * n] = (u16)xy;
                    out[8 * n + 1] = (u16)(xy >> 16);
                }
            }
            if (warp == 0 && tig == 0) P.lse[rh] = ho.empty ? -fsa_inf() : ho.lse;
        } else {
            const i64 part = rh * P.splits + split;
            float* w = P.ws + part * D + c0;
#pragma unroll
            for (int n = 0; n < NB; ++n) *(float2*)(w + 8 * n) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
            if (warp == 0 && tig == 0) {
                float* ml = P.ws + (i64)P.rows * h_q * P.splits * D;
                ml[2 * part] = m;
                ml[2 * part + 1] = sum;
            }
        }
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(QT_NT, 2) qsa_attn_tc_fwd_d128(const QsaAttnParams P) {
    qsa_attn_tc_forward<128>(P);
}
extern "C" __global__ void __launch_bounds__(QT_NT, 2) qsa_attn_tc_fwd_d256(const QsaAttnParams P) {
    qsa_attn_tc_forward<256>(P);
}
