// Sparse MLA on tensor cores (module SparseMla, entries mla_tc_*): the bf16
// forward of sparse_mla.cu (same contract, same parameter block, same
// combine) with both GEMMs on mma.sync m16n8k16 (bf16 in, f32 accumulate).
// Portable: sm_80 and later. Included by sparse_mla.cu after its helpers
// (row_length, lse_at, MlaParams).
//
// ALGORITHM (mla_tc_fwd_m{16,32}_qbf16_kv{bf16,fp8}, mla_tc_fwd_m64_qbf16_kvfp8)
//   One CTA of 256 threads (8 warps) per (query row r, block of MR = 16 MT
//   heads of that row, KV split s); MT = 1 for h_q <= 16, else 2; or, for
//   fp8 caches on sm_90 (host: MlaPlan::on_device), MT = 4 with 512 threads
//   (16 warps) and two KV buffers (TcShape: each warp the MT 2 CTA's
//   per-warp work, so the same bits; the steps below with 16 warps). The M
//   dimension of both GEMMs is the block's heads (one index list per row);
//   heads past h_q are zero rows of q whose results are never written, so
//   any h_q in 1..128 runs unpadded by the caller. Prologue: q's block into
//   shared memory (bf16), the row's length L as in sparse_mla.cu. Then per
//   tile of KT = 32 positions of the split:
//     1. tile_offsets_of (gather.cuh): attended entries and their offsets
//        from the index entries threads < 32 loaded a tile ahead; a tile
//        without one is skipped.
//     2. tc_gather: the attended rows into k_s as bf16, thread t serving
//        token t / 8; cp.async for a bf16 cache with 16-byte aligned rows
//        (else plain loads); an aligned fp8 cache is staged raw by cp.async
//        over sp_s / p_s (free until B0) and decoded from shared memory
//        (e4m3 x its 128-column f32 scale, rounded to nearest even: exact
//        for the power-of-two scales of the V3.2 quantizer; the rope values
//        are bf16 already). Unattended rows are zeros. MT 4 (tc_fp8_issue,
//        tc_fp8_decode; 16 threads a token): tile t + 1's raw tokens are
//        copied into an area of their own during tile t's steps 3-5 and
//        decoded into the other KV buffer at tile t + 1's start.
//     3. S = Q K^T: warp w takes m-tile w % MT and the w / MT-th of the
//        d_qk / 16 k-steps (NDQ = warps / MT slices), all 32 keys (4 n8 tiles,
//        ldmatrix x4 for A and B); its partial S goes to sp_s[slice].
//     4. softmax (softmax.cuh: softmax_steps over the warp's rows at once,
//        their butterflies interleaved): warp w owns rows w + warps i; lane
//        j sums key j's NDQ partials in slice order, times sm_scale (-inf
//        when not attended), updates the row's f32 (m, sum) and writes p =
//        exp(l - m) to p_s as two bf16 terms, hi = bf16(p) and lo = bf16(p -
//        hi), and alpha. (FlashMLA rounds P to bf16 once; with unit-normal
//        data that misses FlashMLA's own out tolerance on rows with few keys,
//        see docs/design.md. hi + lo carries p to ~2^-17; sum takes the f32
//        p.)
//     5. O = alpha O + P V: warp w takes m-tile w % MT and the w / MT-th
//        of the 512 output columns (64 MT of them, 8 MT n8 tiles), A = P hi
//        and P lo from p_s (ldmatrix; two mma on the same B), B = V =
//        k_s[.][0..512) (ldmatrix .trans).
//   End: one split writes out (bf16), lse and max_logits (softmax.cuh:
//   head_out); several write (O, m, sum) to the workspace for
//   mla_combine_bf16, exactly as the f32 kernel does.
//
// INVARIANTS
//   - Determinism: the split is a function of the shapes and formats only
//     (host: ops/mla/device.rs, MlaPlan::new_for), and MT 2 and MT 4 give
//     the same bits (MlaPlan::on_device picks between them by device); the
//     partial logits are summed in a fixed slice order; mma.sync is a
//     deterministic instruction; no atomics touch values.
//   - The derived length only shortens the loop (tiles past L hold no
//     attended entry and would be skipped): derived and explicit lengths
//     give the same bits.
//   - A cache row is read only for an attended entry; rows of q past h_q are
//     zeros and nothing is written for them.
//   - Every barrier is reached by all threads (uniform loop bounds and skip
//     test). Per tile: tile_offsets' barrier orders the previous tile's
//     reads of k_s / p_s / alpha before this tile's writes (the fp8 staging
//     into sp_s / p_s included; its own barrier orders the raw bytes before
//     their decode); B0 (after the gather's cp.async wait), B1 (after the
//     partial logits) and B2 (after the probabilities) order each stage's
//     writes before the next stage's reads. MT 4: tile t + 1's tile_offsets
//     barrier comes after tile t's decode (its B0) and orders every
//     thread's reads of the other buffer and of the raw area (tiles t - 1
//     and t) before tile t + 1's copies into them.
//   - Shared-memory rows are padded to an odd number of 16-byte chunks
//     (q / k rows 584 bf16, p rows 40 bf16), so the 8 row addresses of an
//     ldmatrix hit 8 distinct bank groups.
//
// COST
//   Per attended entry and head 2 (d_qk + 512) FLOPs on tensor cores
//   (heads padded up to 16 MT). Per tile and warp: QK^T 9 k-steps (d_qk
//   576, MT 2) of 3 ldmatrix.x4 + 4 mma, PV 2 k-steps of 2 + 8 ldmatrix.x4
//   and 32 mma (hi and lo); the logits take one f32 round trip through
//   shared memory (MR x 32 x NDQ floats). Each KV row is gathered (an fp8
//   token decoded) once per head block: ceil(h_q / 32) CTAs per row for h_q
//   > 16 (h_q / 64 at MT 4). Shared memory 100,992 B at MT 2, 79,552 B at
//   MT 1 (fits sm_86/89's 99 KB; two CTAs per SM on sm_80 and sm_90); one
//   KV buffer, the second CTA hides the gather. MT 4: 222,976 B, one CTA an
//   SM. Registers: O is 64 f32 per thread at MT 2 and 4, 32 at MT 1;
//   126-128 at MT 2 and 4, 94-128 at MT 1 (__launch_bounds__ caps at 128),
//   no spills. Measured (H200, h_q 128 prefill): ~5,300 warp instructions a
//   CTA-tile, 800 of them mma; bound by shared-memory traffic, the gather's
//   latency and the four barriers a tile (docs/perf-log.md v38). MT 4 on
//   an H100 (v50): fp8 decode 2.5-4.6% faster than MT 2 (half the decodes);
//   bf16 prefill 3-7% slower (16 warps meet at every barrier, where two MT
//   2 CTAs overlap each other's phases), so bf16 keeps MT 2.
#include "attention/common/mma.cuh"
#include "attention/common/tc_softmax.cuh"

namespace {

constexpr int TC_KT = 32;    // positions per tile
constexpr int TC_LD = 584;   // bf16 per q / k row in shared memory (576 + 8)
constexpr int TC_PLD = 40;   // bf16 per p row (32 + 8)
constexpr int TC_SLD = 40;   // f32 per partial-logit row (32 + 8)
constexpr int FP8_TOKEN = 656;              // bytes of a V3.2 fp8 token
constexpr int FP8_CHUNKS = FP8_TOKEN / 16;  // its 16-byte chunks

// The CTA of MT m-tiles (MR = 16 MT heads). MT 1 and 2: 8 warps, one KV
// buffer (sm_80+, within sm_86/89's 99 KB, two CTAs an SM). MT 4 (fp8
// caches only): 16 warps and two KV buffers with a raw fp8 staging area of
// its own (sm_90's shared memory, one CTA an SM): the next tile's copies are
// in flight during this one's products, and each token is decoded once per
// 64 heads. Every warp does the per-warp work of the MT 2 CTA (NDQ 4
// slices, CW 128 columns, 4 softmax rows), so MT 2 and MT 4 give the same
// bits.
template <int MT>
struct TcShape {
    static constexpr int WARPS = MT == 4 ? 16 : 8;
    static constexpr int NT = 32 * WARPS;            // threads
    static constexpr int TPT = NT / TC_KT;           // gather threads a token
    static constexpr int STAGES = MT == 4 ? 2 : 1;   // KV tile buffers
    static constexpr int MR = 16 * MT;       // heads per CTA
    static constexpr int NDQ = WARPS / MT;   // d_qk slices of S = Q K^T (warps per m-tile)
    static constexpr int CW = DV / NDQ;      // output columns per warp
    static constexpr int NB = CW / 8;        // n8 tiles of O per warp
    static constexpr int ROWS = MR / WARPS;  // softmax rows per warp
    static constexpr int Q_BYTES = MR * TC_LD * 2;
    static constexpr int K_BYTES = TC_KT * TC_LD * 2;   // one buffer
    static constexpr int S_BYTES = NDQ * MR * TC_SLD * 4;
    static constexpr int P_BYTES = 2 * MR * TC_PLD * 2;  // hi and lo planes
    static constexpr int ST_BYTES = 3 * MR * 4;
    static constexpr int OFF_BYTES = STAGES * TC_KT * 8;
    static constexpr int RAW_BYTES = STAGES == 2 ? TC_KT * FP8_TOKEN : 0;  // else over sp_s / p_s
    static constexpr int SMEM = Q_BYTES + STAGES * K_BYTES + S_BYTES + P_BYTES + ST_BYTES + OFF_BYTES + RAW_BYTES;
};
static_assert(TcShape<2>::SMEM == 100992 && TcShape<1>::SMEM == 79552 && TcShape<4>::SMEM == 222976,
              "host: ops/mla/device.rs, tc_smem_bytes");
static_assert(TcShape<2>::SMEM <= 99 * 1024, "fits sm_86 / sm_89");
static_assert(TcShape<4>::SMEM + 1024 <= 228 * 1024, "one CTA an SM on sm_90 (with the CTA's reserved 1 KB)");
// The single-buffer fp8 gather stages a tile's raw tokens over the partial
// logits and P (free from the tile's first barrier until B0).
static_assert(TcShape<1>::S_BYTES + TcShape<1>::P_BYTES >= TC_KT * FP8_TOKEN, "fp8 staging fits");
static_assert(TcShape<2>::S_BYTES + TcShape<2>::P_BYTES >= TC_KT * FP8_TOKEN, "fp8 staging fits");
static_assert(TcShape<1>::ROWS * TcShape<1>::WARPS == 16 && TcShape<2>::NB == 16, "the warp mappings below");
static_assert(TcShape<4>::NDQ == TcShape<2>::NDQ && TcShape<4>::CW == TcShape<2>::CW &&
                  TcShape<4>::ROWS == TcShape<2>::ROWS,
              "MT 4's warps do MT 2's per-warp work (the same bits)");

// Two e4m3 codes (low byte first) times `s`, as a packed bf16 pair (round
// to nearest even; exact for power-of-two scales). sm_89+ decodes with the
// hardware conversion (e4m3 -> f16 is exact), older parts bit by bit.
__device__ __forceinline__ u32 e4m3x2_to_bf16x2(u32 x, float s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    u32 h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)x));
    float lo, hi;
    asm("{ .reg .f16 a, b; mov.b32 {a, b}, %2; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }" : "=f"(lo), "=f"(hi) : "r"(h));
    return pack_bf16x2(lo * s, hi * s);
#else
    return pack_bf16x2(e4m3_to_f32(x & 0xffu) * s, e4m3_to_f32((x >> 8) & 0xffu) * s);
#endif
}

// Eight e4m3 codes (lo first, low byte first) times `s`: four packed bf16 pairs.
__device__ __forceinline__ uint4 e4m3x8_to_bf16(u32 lo, u32 hi, float s) {
    return make_uint4(e4m3x2_to_bf16x2(lo & 0xffffu, s), e4m3x2_to_bf16x2(lo >> 16, s), e4m3x2_to_bf16x2(hi & 0xffffu, s),
                      e4m3x2_to_bf16x2(hi >> 16, s));
}

// Thread u (of TPT = 8 or 16 a token) of one fp8 token as bf16 into `row`
// (zeros when not attended): value chunks c = u + TPT m (codes 16c .. 16c +
// 15, scale c / 8, columns 16c ..) and, for u < 8, rope chunk u (bf16
// columns 512 + 8u ..). The token's bytes are read from shared memory
// (STAGED) or, unaligned, from the cache.
template <bool STAGED, int TPT>
__device__ __forceinline__ void fp8_token_to_bf16(u16* row, const u8* tok, bool attended, int u) {
    auto ld = [&](int at) { return STAGED ? *(const uint4*)(tok + at) : ld16(tok + at, false); };
    auto scale = [&](int m) {
        return STAGED ? *(const float*)(tok + 512 + 4 * m) : __uint_as_float(ld4(tok + 512 + 4 * m, false));
    };
#pragma unroll
    for (int m = 0; m < 32 / TPT; ++m) {
        const int c = u + TPT * m;
        uint4 w0 = make_uint4(0u, 0u, 0u, 0u), w1 = w0;
        if (attended) {
            const uint4 x = ld(16 * c);
            const float s = scale(TPT * m / 8 + (TPT == 8 ? 0 : u >> 3));  // c / 8
            w0 = e4m3x8_to_bf16(x.x, x.y, s);
            w1 = e4m3x8_to_bf16(x.z, x.w, s);
        }
        *(uint4*)(row + 16 * c) = w0;
        *(uint4*)(row + 16 * c + 8) = w1;
    }
    if (TPT == 8 || u < 8) *(uint4*)(row + 512 + 8 * u) = attended ? ld(528 + 16 * u) : make_uint4(0u, 0u, 0u, 0u);
}

// The tile's attended rows into k_s ([TC_KT][TC_LD] bf16); zeros for the
// others (the single-buffer CTAs, 8 threads a token). Thread t serves token
// t / 8 of the tile and its 16-byte chunks t % 8 + 8 m (no divisions; each
// 8 threads read 128 contiguous bytes of a row). The copies are visible to
// the CTA only after the caller's barrier (B0). fp8 with a 16-byte aligned
// cache first stages the raw tokens in raw_s ([TC_KT][656] bytes, cp.async,
// one barrier) and decodes from shared memory, so that a thread's global
// loads are all in flight at once; an unaligned cache decodes from global
// loads.
template <int KF>
__device__ __forceinline__ void tc_gather(u16* k_s, u8* raw_s, const i64* off_s, const CacheGeom& g, int d_qk) {
    static_assert(TcShape<1>::NT == 8 * TC_KT && TcShape<2>::NT == 8 * TC_KT, "8 threads a token");
    const int j = (int)threadIdx.x >> 3, u = (int)threadIdx.x & 7;
    const i64 off = off_s[j];
    u16* row = k_s + j * TC_LD;
    const u8* src = g.base + (off < 0 ? 0 : off);
    if (KF == FMT_BF16) {
        // Chunks u + 8m: m < 8 always (d_qk >= 512), m = 8 for d_qk 576.
        const bool ninth = d_qk > 512;
        if (off < 0) {
#pragma unroll
            for (int m = 0; m < 9; ++m) {
                if (m < 8 || ninth) *(uint4*)(row + 8 * (u + 8 * m)) = make_uint4(0u, 0u, 0u, 0u);
            }
        } else if (g.aligned) {
            const u32 dst = smem_addr(row + 8 * u);
            const u8* at = src + 16 * u;
#pragma unroll
            for (int m = 0; m < 9; ++m) {
                if (m < 8 || ninth) cp_async16(dst + 128 * m, at + 128 * m);
            }
        } else {
#pragma unroll 1
            for (int m = 0; m < 9; ++m) {
                if (m < 8 || ninth) *(uint4*)(row + 8 * (u + 8 * m)) = ld16(src + 16 * (u + 8 * m), false);
            }
        }
        cp_async_wait_all();
        return;
    }
    // fp8: the token's 41 chunks staged by its 8 threads, then decoded.
    if (g.aligned) {
        u8* raw = raw_s + j * FP8_TOKEN;
        if (off >= 0) {
#pragma unroll
            for (int m = 0; m < 6; ++m) {
                const int c = u + 8 * m;
                if (c < FP8_CHUNKS) cp_async16(smem_addr(raw + 16 * c), src + 16 * c);
            }
        }
        cp_async_wait_all();
        __syncthreads();
        fp8_token_to_bf16<true, 8>(row, raw, off >= 0, u);
        return;
    }
    fp8_token_to_bf16<false, 8>(row, src, off >= 0, u);
}

// The two-buffer CTA's fp8 gather, in two steps (TPT threads a token:
// thread t serves token j = t / TPT and its chunks u + TPT m, u = t % TPT).
// tc_fp8_issue: an aligned cache's raw tokens into raw_s by cp.async (not
// waited for); an unaligned cache's decoded from global memory into k_s
// directly (zeros where not attended). tc_fp8_decode: an aligned cache's
// tile from raw_s into k_s, after its copies landed and a barrier.
template <int TPT>
__device__ __forceinline__ void tc_fp8_issue(u16* k_s, u8* raw_s, const i64* off_s, const CacheGeom& g) {
    const int j = (int)threadIdx.x / TPT, u = (int)threadIdx.x % TPT;
    const i64 off = off_s[j];
    const u8* src = g.base + (off < 0 ? 0 : off);
    if (g.aligned) {
        if (off >= 0) {
            u8* raw = raw_s + j * FP8_TOKEN;
#pragma unroll
            for (int m = 0; m < (FP8_CHUNKS + TPT - 1) / TPT; ++m) {
                const int c = u + TPT * m;
                if (c < FP8_CHUNKS) cp_async16(smem_addr(raw + 16 * c), src + 16 * c);
            }
        }
        return;
    }
    fp8_token_to_bf16<false, TPT>(k_s + j * TC_LD, src, off >= 0, u);
}

template <int TPT>
__device__ __forceinline__ void tc_fp8_decode(u16* k_s, const u8* raw_s, const i64* off_s, const CacheGeom& g) {
    if (!g.aligned) return;
    const int j = (int)threadIdx.x / TPT, u = (int)threadIdx.x % TPT;
    fp8_token_to_bf16<true, TPT>(k_s + j * TC_LD, raw_s + j * FP8_TOKEN, off_s[j] >= 0, u);
}

// One k16 step ks of S = Q K^T: this warp's A fragment (16 heads) times the
// B fragments of the tile's 32 keys (two ldmatrix.x4, two n8 tiles each).
__device__ __forceinline__ void qk_step(float (&acc)[4][4], u32 qa, u32 kb, int ks) {
    u32 a[4], b0[4], b1[4];
    ldsm_x4(a, qa + 32 * ks);
    ldsm_x4(b0, kb + 32 * ks);
    ldsm_x4(b1, kb + 32 * TC_LD + 32 * ks);
    mma_bf16_16816(acc[0], a, b0[0], b0[1]);
    mma_bf16_16816(acc[1], a, b0[2], b0[3]);
    mma_bf16_16816(acc[2], a, b1[0], b1[1]);
    mma_bf16_16816(acc[3], a, b1[2], b1[3]);
}

// The cache geometry, rebuilt from the parameter block at each use (the
// compiler reads it from constant memory instead of holding 11 registers
// across the tile loop).
__device__ __forceinline__ CacheGeom geom_of(const MlaParams& P) {
    CacheGeom g;
    g.base = P.kv;
    g.bound = P.bound;
    g.page_size = P.page_size;
    g.page_stride = P.page_stride;
    g.token_stride = P.token_stride;
    g.aligned = (((u64)P.kv | (u64)P.page_stride | (u64)P.token_stride) & 15u) == 0;
    return g;
}

template <int MT, int KF>
__device__ __forceinline__ void mla_tc_forward(const MlaParams& P) {
    using S = TcShape<MT>;
    constexpr int MR = S::MR, NDQ = S::NDQ, CW = S::CW, NB = S::NB, ROWS = S::ROWS, NW = S::WARPS;
    extern __shared__ __align__(16) float smem[];
    __shared__ int len_s;
    u8* sb = (u8*)smem;
    u16* q_s = (u16*)sb;                                             // [MR][TC_LD]
    u16* k_s = (u16*)(sb + S::Q_BYTES);                              // [STAGES][TC_KT][TC_LD]
    float* sp_s = (float*)(sb + S::Q_BYTES + S::STAGES * S::K_BYTES);  // [NDQ][MR][TC_SLD]
    u16* p_s = (u16*)((u8*)sp_s + S::S_BYTES);                       // hi [MR][TC_PLD], then lo
    float* st_s = (float*)((u8*)p_s + S::P_BYTES);                   // alpha [MR], m [MR], sum [MR]
    i64* off_s = (i64*)((u8*)st_s + S::ST_BYTES);                    // [STAGES][TC_KT]
    // fp8 raw tokens: an area of its own with two buffers, else over sp_s / p_s.
    u8* raw_s = S::STAGES == 2 ? (u8*)off_s + S::OFF_BYTES : (u8*)sp_s;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int d_qk = P.d_qk, h_q = P.h_q;
    const i64 bid = blockIdx.x;
    const int split = (int)(bid % P.splits);
    const i64 rg = bid / P.splits;
    const int grp = (int)(rg % P.groups);
    const int r = (int)(rg / P.groups);
    const int h0 = grp * MR;
    const int* idx_row = P.indices + (i64)r * P.topk;


    // q's block (zeros past h_q), 8 bf16 at a time.
    {
        const u8* qb = (const u8*)P.q;
        const bool qa = ((u64)qb & 15u) == 0;
        const int chunks = d_qk / 8;
        for (int i = tid; i < MR * chunks; i += S::NT) {
            const int h = i / chunks, c = i - h * chunks, hq = h0 + h;
            uint4 w = make_uint4(0u, 0u, 0u, 0u);
            if (hq < h_q) w = ld16(qb + (((i64)r * h_q + hq) * d_qk + 8 * c) * 2, qa);
            *(uint4*)(q_s + h * TC_LD + 8 * c) = w;
        }
    }
    const int L = row_length<S::NT>(P, idx_row, r, &len_s);
    const i64 start = (i64)split * P.chunk;
    const int lim = (int)min(min(start + P.chunk, (i64)P.topk), (i64)L);

    // Softmax state (m, sum) of row x at st_s[MR + x], st_s[2 MR + x]: only
    // warp x % NW updates it (every lane computes the same bits, lane 0
    // writes; the tile's barriers order the write before the next tile's
    // reads); the epilogue reads it. Initialised before the first tile's barrier.
    if (tid < MR) {
        st_s[MR + tid] = -fsa_inf();
        st_s[2 * MR + tid] = 0.f;
    }
    // O fragments: m-tile mt, columns cb * CW + 8n + 2 tig (+1), rows gid (+8).
    const int mt = warp % MT, slice = warp / MT;
    float o[NB][4];
#pragma unroll
    for (int n = 0; n < NB; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    const int ksteps = d_qk / 16;
    const int k_lo = slice * ksteps / NDQ, k_hi = (slice + 1) * ksteps / NDQ;
    // Steps a slice: KMIN at d_qk 512, KMIN or KMIN + 1 at 576.
    constexpr int KMIN = 32 / NDQ;
    const float scale = P.sm_scale;
    // ldmatrix row addresses: A (16 rows x 16 cols at (row0, col0)): lane
    // gives row row0 + (lane & 15), col col0 + 8 (lane >> 4). B from a
    // [key][d] matrix (two n8 tiles of keys, one k16 step): key
    // (lane & 7) + 8 (lane >> 4), d + 8 ((lane >> 3) & 1). B.trans from
    // [key][col] (one k16 step of keys, two n8 tiles of columns): key
    // (lane & 15), col + 8 (lane >> 4).
    const int a_row = lane & 15, a_col = 8 * (lane >> 4);
    const int b_key = (lane & 7) + 8 * (lane >> 4), b_col = 8 * ((lane >> 3) & 1);
    // This lane's ldmatrix addresses (32-bit shared addresses: half the
    // registers of pointers), steps in bytes; buffer b's K / V at + b K_BYTES.
    const u32 qa = smem_addr(q_s + (16 * mt + a_row) * TC_LD + a_col);
    const u32 kb0 = smem_addr(k_s + b_key * TC_LD + b_col);
    const u32 pa = smem_addr(p_s + (16 * mt + a_row) * TC_PLD + a_col);
    const u32 vb0 = smem_addr(k_s + a_row * TC_LD + slice * CW + a_col);

    // One tile's products once its keys are in k_s buffer `buf` (after B0):
    // S = Q K^T, B1, the softmax, B2, O = alpha O + P V. off: the tile's
    // offsets (attended where >= 0).
    auto tile_products = [&](int buf, const i64* off) {
        const u32 kb = kb0 + buf * S::K_BYTES, vb = vb0 + buf * S::K_BYTES;
        {
            float acc[4][4];
#pragma unroll
            for (int n = 0; n < 4; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
            // KMIN steps unrolled (ptxas schedules their loads ahead as
            // registers allow), then d_qk 576's extra step where this slice
            // has one.
#pragma unroll
            for (int s = 0; s < KMIN; ++s) qk_step(acc, qa, kb, k_lo + s);
            if (k_hi - k_lo > KMIN) qk_step(acc, qa, kb, k_hi - 1);
            float* sp = sp_s + (slice * MR + 16 * mt + gid) * TC_SLD + 2 * tig;
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                *(float2*)(sp + 8 * n) = make_float2(acc[n][0], acc[n][1]);
                *(float2*)(sp + 8 * TC_SLD + 8 * n) = make_float2(acc[n][2], acc[n][3]);
            }
        }
        __syncthreads();  // B1
        tc_softmax_tile<ROWS, NDQ, MR, TC_SLD, TC_PLD, NW>(sp_s, p_s, st_s, warp, lane, off[lane] >= 0, scale);
        __syncthreads();  // B2
        {
            tc_rescale<NB>(o, st_s[16 * mt + gid], st_s[16 * mt + gid + 8]);
            // Each O tile takes P hi then P lo per k16 step, as the contract's
            // order: the two tiles of a column pair take their hi products,
            // then their lo products (no product waits on the one just
            // issued), and pair np + 1's V fragment is loaded before them.
#pragma unroll 1
            for (int kk = 0; kk < TC_KT / 16; ++kk) {
                u32 a[4], al[4], b[2][4];
                ldsm_x4(a, pa + 32 * kk);
                ldsm_x4(al, pa + 2 * MR * TC_PLD + 32 * kk);
                ldsm_x4_trans(b[0], vb + 32 * kk * TC_LD);
#pragma unroll
                for (int np = 0; np < NB / 2; ++np) {
                    const u32(&bc)[4] = b[np & 1];
                    if (np + 1 < NB / 2) ldsm_x4_trans(b[(np + 1) & 1], vb + 32 * kk * TC_LD + 32 * (np + 1));
                    mma_bf16_16816(o[2 * np], a, bc[0], bc[1]);
                    mma_bf16_16816(o[2 * np + 1], a, bc[2], bc[3]);
                    mma_bf16_16816(o[2 * np], al, bc[0], bc[1]);
                    mma_bf16_16816(o[2 * np + 1], al, bc[2], bc[3]);
                }
            }
        }
    };

    // Threads < TC_KT hold the next tile's index entries, loaded a tile ahead.
    if constexpr (S::STAGES == 1) {
        int entry = tile_entry<TC_KT>(idx_row, (int)start, lim);
        for (int t0 = (int)start; t0 < lim; t0 += TC_KT) {
            const int cur = entry;
            entry = tile_entry<TC_KT>(idx_row, t0 + TC_KT, lim);
            if (!tile_offsets_of<TC_KT>(off_s, cur, geom_of(P))) continue;
            tc_gather<KF>(k_s, raw_s, off_s, geom_of(P), d_qk);
            __syncthreads();  // B0
            tile_products(0, off_s);
        }
    } else {
        // Two buffers (fp8): tile t's keys in buffer b; tile t + 1's raw
        // tokens are copied into raw_s after tile_offsets' barrier, which
        // orders every thread's reads of buffer b ^ 1 and its offsets (tile t
        // - 1's products) and of raw_s (tile t's decode, just before it)
        // ahead of them, and which is B0 for the decode's writes into buffer
        // b. One cp.async group a tile, empty or not (the waits count groups).
        // An unaligned cache decodes tile t + 1 from global memory into
        // buffer b ^ 1 at the same point instead.
        static_assert(KF == FMT_FP8, "the two-buffer CTA is built for fp8 caches only (host: MlaPlan::on_device)");
        const bool staged = geom_of(P).aligned;
        int b = 0;
        bool have = tile_offsets_of<TC_KT>(off_s, tile_entry<TC_KT>(idx_row, (int)start, lim), geom_of(P));
        if (have) tc_fp8_issue<S::TPT>(k_s, raw_s, off_s, geom_of(P));
        cp_async_commit();
        int entry = tile_entry<TC_KT>(idx_row, (int)start + TC_KT, lim);
        for (int t0 = (int)start; t0 < lim; t0 += TC_KT) {
            const bool cur = have;
            const i64* off = off_s + b * TC_KT;
            u16* kbuf = k_s + b * (TC_KT * TC_LD);
            if (staged && cur) {
                cp_async_wait<0>();
                __syncthreads();  // the raw tokens of tile t
                tc_fp8_decode<S::TPT>(kbuf, raw_s, off, geom_of(P));
            }
            const int nxt = entry;
            entry = tile_entry<TC_KT>(idx_row, t0 + 2 * TC_KT, lim);
            have = tile_offsets_of<TC_KT>(off_s + (b ^ 1) * TC_KT, nxt, geom_of(P));  // (B0)
            if (have) tc_fp8_issue<S::TPT>(k_s + (b ^ 1) * (TC_KT * TC_LD), raw_s, off_s + (b ^ 1) * TC_KT, geom_of(P));
            cp_async_commit();
            if (cur) tile_products(b, off);
            b ^= 1;
        }
        cp_async_wait<0>();  // the trailing empty group
    }
    // The last tile's state writes are ordered before the epilogue's reads
    // (with no tile at all: the initial values, before this barrier).
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = 16 * mt + gid + 8 * half, hq = h0 + row;
        if (hq >= h_q) continue;
        const float m = st_s[MR + row], sum = st_s[2 * MR + row];
        const int c0 = slice * CW + 2 * tig;
        if (P.splits == 1) {
            const HeadOut ho = head_out(m, sum, P.sink, hq);
            u16* out = (u16*)P.out + ((i64)r * h_q + hq) * DV + c0;
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
            if (slice == 0 && tig == 0) {
                P.lse[lse_at(r, hq, h_q, P.s_q)] = ho.lse;
                if (P.max_logits) P.max_logits[(i64)r * h_q + hq] = m;
            }
        } else {
            const i64 part = ((i64)r * h_q + hq) * P.splits + split;
            float* w = P.ws + part * DV + c0;
#pragma unroll
            for (int n = 0; n < NB; ++n) *(float2*)(w + 8 * n) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
            if (slice == 0 && tig == 0) {
                float* ml = P.ws + (i64)P.rows * h_q * P.splits * DV;
                ml[2 * part] = m;
                ml[2 * part + 1] = sum;
            }
        }
    }
}

}  // namespace

#define FSA_TC_FWD(NAME, MT, KF)                                                                    \
    extern "C" __global__ void __launch_bounds__(TcShape<MT>::NT, MT == 4 ? 1 : 2) NAME(const MlaParams P) { \
        mla_tc_forward<MT, KF>(P);                                                                  \
    }

FSA_TC_FWD(mla_tc_fwd_m16_qbf16_kvbf16, 1, FMT_BF16)
FSA_TC_FWD(mla_tc_fwd_m16_qbf16_kvfp8, 1, FMT_FP8)
FSA_TC_FWD(mla_tc_fwd_m32_qbf16_kvbf16, 2, FMT_BF16)
FSA_TC_FWD(mla_tc_fwd_m32_qbf16_kvfp8, 2, FMT_FP8)
FSA_TC_FWD(mla_tc_fwd_m64_qbf16_kvfp8, 4, FMT_FP8)
