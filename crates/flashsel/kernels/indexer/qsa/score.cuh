// The QSA indexer's block scores (ops/indexer: the contract and the CPU
// engine this reproduces bit for bit):
//
//   score[t, b] = sum over h of relu(q[t, h, :] . kbar[b, :]) * c,  b < V(t)
//
// Shared memory (dynamic): heads * d f32 of queries + SCORE_WARPS * 2 *
// BUF_BYTES of stage buffers (74 KB at 4 heads of 128: three CTAs an SM).
//
// Algorithm: one CTA per (row, tile of blocks_per_cta blocks); each warp
// takes groups of 32 consecutive blocks of the tile, one block a lane. The
// row's queries are decoded once into shared memory as f32. A warp streams
// its group's keys through shared memory in stages of 128 bytes a key
// (cp.async, coalesced: eight lanes copy one key's 128 bytes; rows padded by
// 16 bytes so that the lanes' reads hit distinct banks), two stages in
// flight: while the lanes compute on one stage the next is arriving. Each
// lane decodes its key's values exactly to f32 and accumulates, per head,
// the contract's 8 lanes (lane l adds the products of j = l, l + 8, ... in
// increasing j), then combines them as ((a0 + a1) + (a2 + a3)) + ((a4 + a5)
// + (a6 + a7)), applies relu, sums the heads left to right from +0.0 and
// scales once. Heads go four at a time (a pass over the key per four heads). Every multiply and add
// is an explicit round-to-nearest f32 operation (__fmul_rn / __fadd_rn: no
// contraction into FMA), so a score's bits depend on its inputs only: not
// on the tile, the batch or the GPU.
//
// Invariants: no key past a row's V is read; a device value out of range
// (a negative position, V > blocks, a sequence outside the page table, more
// pages than a table row has) makes the whole row NaN, and a block whose
// page entry is outside the cache scores NaN; no key outside the cache is
// read. Fused use (skip_upto >= 0): rows with V <= skip_upto and blocks
// past V are not written at all (qsa_select reads neither), and the CTAs of
// tile 0 write each row's position to positions_out, or -1 for a row whose
// device values are out of range (so the selection pads that row).
//
// Cost: each visible block's key is read once (d * sizeof(K) bytes) and the
// query row once per CTA; d * H multiplies and adds per block.
#ifndef FLASHSEL_INDEXER_QSA_SCORE_CUH
#define FLASHSEL_INDEXER_QSA_SCORE_CUH

#include "common/types.cuh"

namespace qsa {

enum : int {
    SCORE_THREADS = 256,  // threads per CTA (the host's indexer SCORE_THREADS)
    SCORE_WARPS = SCORE_THREADS / 32,
    MAX_HEADS = 16,
    MAX_DIM = 256,
    LANES = 8,            // the contract's lanes (ops/indexer LANES)
    STAGE_BYTES = 128,    // bytes of one key a stage holds
    ROW_BYTES = STAGE_BYTES + 16,      // a key's stage in shared memory, padded
    BUF_BYTES = 32 * ROW_BYTES,        // one stage of a warp's 32 keys
    HEAD_GROUP = 4,
};

// The launch's parameter block (ops/indexer/device.rs ScoreParams).
struct ScoreParams {
    u64 q;           // [rows, heads, dim], f32 or bf16
    u64 kbar;        // [blocks, dim], or paged [cache_pages, per_page, dim]
    u64 positions;   // i32 [rows]
    u64 out;         // f32: row r at out + r * out_stride
    u64 page_table;  // i32 [sequences, max_pages]; 0: contiguous keys
    u64 seq_ids;     // i32 [rows] (paged)
    u64 positions_out;  // fused form: i32 [rows], the positions the selection reads
    long long out_stride;
    int rows, heads, blocks, ratio;
    int max_pages, per_page, cache_pages, sequences;
    int skip_upto;       // >= 0: the fused form (see the header)
    float scale;         // c, the f32 nearest 1 / sqrt(dim)
    int blocks_per_cta;  // a multiple of SCORE_THREADS
    int pad_;
};
static_assert(sizeof(ScoreParams) == 112, "ScoreParams layout (ops/indexer/device.rs)");

// Key element types: K::BYTES per value, decode(raw 16 bytes, i) -> exact f32.
struct KeyF32 {
    static constexpr int BYTES = 4;
    static __device__ __forceinline__ float at(const uint4& v, int i) {
        u32 w = i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
        return __uint_as_float(w);
    }
};
struct KeyBf16 {
    static constexpr int BYTES = 2;
    static __device__ __forceinline__ float at(const uint4& v, int i) {
        u32 w = (i >> 1) == 0 ? v.x : (i >> 1) == 1 ? v.y : (i >> 1) == 2 ? v.z : v.w;
        return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
    }
};
struct KeyE4m3 {
    static constexpr int BYTES = 1;
    // e4m3 (no infinities; 0x7f / 0xff NaN) exactly: its sign and 7 low bits
    // placed at the top of an f32 give the value times 2^-120 (normals and
    // subnormals alike), and the product by 2^120 is exact.
    static __device__ __forceinline__ float at(const uint4& v, int i) {
        u32 w = (i >> 2) == 0 ? v.x : (i >> 2) == 1 ? v.y : (i >> 2) == 2 ? v.z : v.w;
        u32 b = (w >> ((i & 3) * 8)) & 0xffu;
        u32 sign = (b & 0x80u) << 24;
        if ((b & 0x7fu) == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
        return __fmul_rn(__uint_as_float(sign | ((b & 0x7fu) << 20)), 0x1p120f);
    }
};

// The contract's relu: x if x > 0, NaN if NaN, else +0.0.
__device__ __forceinline__ float relu(float x) { return (x > 0.f || isnan(x)) ? x : 0.f; }

// The contract's lane tree.
__device__ __forceinline__ float combine(const float (&a)[LANES]) {
    return __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3])),
                     __fadd_rn(__fadd_rn(a[4], a[5]), __fadd_rn(a[6], a[7])));
}

// Bytes of one key a stage holds: at most 128 bytes and 64 values (fp8
// keys: 64 bytes, to keep the decoded stage in registers).
__host__ __device__ constexpr int stage_row(int d, int bytes) {
    return d * bytes < (bytes == 1 ? 64 : STAGE_BYTES) ? d * bytes : (bytes == 1 ? 64 : STAGE_BYTES);
}

// cp.async (the host emulator, crates/flashsel-dev/emu, defines FSA_HOST_EMU
// and its own: copies queued by commit group, landed by the waits).
#ifndef FSA_HOST_EMU
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#endif

// Issues the copy of stage `stage` of the warp's 32 keys (key addresses in
// `key_at`, a lane's own; a null key is skipped) into `buf`: each lane
// copies 16-byte pieces p = lane + 32 i of the stage's 32 x PER_ROW pieces.
template <int D, int BYTES>
__device__ __forceinline__ void issue_stage(unsigned char* buf, const unsigned char* key_at, int stage, int lane) {
    constexpr int ROW = stage_row(D, BYTES);
    constexpr int PER_ROW = ROW / 16;
#pragma unroll
    for (int i = 0; i < PER_ROW; ++i) {
        const int p = lane + 32 * i;
        const int r = p / PER_ROW, piece = p % PER_ROW;
        const unsigned char* src = (const unsigned char*)__shfl_sync(FULL_MASK, (unsigned long long)key_at, r);
        if (src != nullptr) cp_async16(buf + r * ROW_BYTES + piece * 16, src + stage * ROW + piece * 16);
    }
    cp_async_commit();
}

// Accumulates one stage (STAGE values of this lane's key, in `row`) into
// the lanes of heads h0 .. h0 + 3 (their queries at qs, the stage's first
// value j0).
template <class K, int D>
__device__ __forceinline__ void accumulate(const unsigned char* row, const float* qs, int h0, int heads, int j0,
                                           float (&acc)[HEAD_GROUP][LANES]) {
    constexpr int ROW = stage_row(D, K::BYTES);
    constexpr int STAGE = ROW / K::BYTES;
    constexpr int PER_LOAD = 16 / K::BYTES;
    static_assert(STAGE % LANES == 0 && STAGE % PER_LOAD == 0, "whole lanes, whole loads");
#pragma unroll
    for (int c = 0; c < STAGE; c += LANES) {
        float kv[LANES];
#pragma unroll
        for (int l = 0; l < LANES; l += PER_LOAD < LANES ? PER_LOAD : LANES) {
            // The 16-byte piece holding values c + l ...
            const uint4 raw = *reinterpret_cast<const uint4*>(row + ((c + l) / PER_LOAD) * 16);
#pragma unroll
            for (int m = 0; m < (PER_LOAD < LANES ? PER_LOAD : LANES); ++m) kv[l + m] = K::at(raw, (c + l + m) % PER_LOAD);
        }
#pragma unroll
        for (int g = 0; g < HEAD_GROUP; ++g) {
            if (h0 + g < heads) {
                const float4* q4 = reinterpret_cast<const float4*>(qs + (h0 + g) * D + j0 + c);
                const float4 qa = q4[0], qb = q4[1];
                const float qv[LANES] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                for (int l = 0; l < LANES; ++l) acc[g][l] = __fadd_rn(acc[g][l], __fmul_rn(qv[l], kv[l]));
            }
        }
    }
}

// The row's queries, decoded once into shared memory as f32 (qs: heads * D).
template <bool Q_BF16, int D>
__device__ __forceinline__ void load_queries(const ScoreParams& p, int row, float* qs) {
    const int n = p.heads * D;
    if (Q_BF16) {
        const unsigned short* q = (const unsigned short*)p.q + (long long)row * n;
        for (int i = threadIdx.x; i < n; i += SCORE_THREADS) qs[i] = __uint_as_float((u32)q[i] << 16);
    } else {
        const float* q = (const float*)p.q + (long long)row * n;
        for (int i = threadIdx.x; i < n; i += SCORE_THREADS) qs[i] = q[i];
    }
}

// Block b's key (null: nothing to read: b >= limit, or a page outside the
// cache, which sets bad_page). table: the row's page-table row (paged keys).
template <class K, int D>
__device__ __forceinline__ const unsigned char* key_address(const ScoreParams& p, const int* table, int b, int limit,
                                                            bool& bad_page) {
    bad_page = false;
    if (b >= limit) return nullptr;
    long long at = b;
    if (p.page_table != 0) {
        const int page = table[b / p.per_page];
        bad_page = page < 0 || page >= p.cache_pages;
        at = (long long)page * p.per_page + b % p.per_page;
    }
    return bad_page ? nullptr : (const unsigned char*)p.kbar + at * (D * K::BYTES);
}

// The warp's 32 keys (key_at, a lane's own; null: none) against the row's
// queries: each lane's sum over heads of relu(q_h . key), unscaled, in the
// contract's order. buf0: the warp's two stage buffers. Warp-uniform call.
template <class K, int D>
__device__ __forceinline__ float warp_relu_sum(const unsigned char* key_at, const float* qs, int heads,
                                               unsigned char* buf0, int lane) {
    constexpr int ROW = stage_row(D, K::BYTES);
    constexpr int STAGES = D * K::BYTES / ROW;  // stages of one key
    constexpr int STAGE = ROW / K::BYTES;       // values a stage holds
    unsigned char* buf1 = buf0 + BUF_BYTES;
    const int passes = (heads + HEAD_GROUP - 1) / HEAD_GROUP;
    const int items = passes * STAGES;  // stages of one group of 32 keys
    issue_stage<D, K::BYTES>(buf0, key_at, 0, lane);
    float acc[HEAD_GROUP][LANES];
    float s = 0.f;
#pragma unroll 1
    for (int it = 0; it < items; ++it) {
        const int stage = it % STAGES, h0 = (it / STAGES) * HEAD_GROUP;
        unsigned char* cur = (it & 1) ? buf1 : buf0;
        unsigned char* nxt = (it & 1) ? buf0 : buf1;
        if (it + 1 < items) {
            issue_stage<D, K::BYTES>(nxt, key_at, (it + 1) % STAGES, lane);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();
        if (stage == 0) {
#pragma unroll
            for (int g = 0; g < HEAD_GROUP; ++g)
#pragma unroll
                for (int l = 0; l < LANES; ++l) acc[g][l] = 0.f;
        }
        accumulate<K, D>(cur + lane * ROW_BYTES, qs, h0, heads, stage * STAGE, acc);
        if (stage == STAGES - 1) {
#pragma unroll
            for (int g = 0; g < HEAD_GROUP; ++g)
                if (h0 + g < heads) s = __fadd_rn(s, relu(combine(acc[g])));
        }
        __syncwarp();  // every lane is done with `cur` before it is refilled
    }
    return s;
}

// A visible block's score from its relu sum: NaN for a page outside the
// cache, else the scaled sum (NaN payloads made the one NaN).
__device__ __forceinline__ float finish_score(float s, bool bad_page, float scale) {
    if (bad_page) return __uint_as_float(0x7fc00000u);
    const float score = __fmul_rn(s, scale);
    return isnan(score) ? __uint_as_float(0x7fc00000u) : score;
}

// The scorer's row checks: the row's V, or -1 for a row whose device values
// are out of range (a negative position, V > blocks, a sequence outside the
// page table, more pages than a table row has); seq: its sequence (paged).
__device__ __forceinline__ int row_visible(const ScoreParams& p, int row, int& seq) {
    const long long t = ((const int*)p.positions)[row];
    long long v = t < 0 ? -1 : (t + 1) / p.ratio;
    seq = 0;
    if (v > p.blocks) v = -1;
    if (v >= 0 && p.page_table != 0) {
        seq = ((const int*)p.seq_ids)[row];
        const long long pages = (v + p.per_page - 1) / p.per_page;
        if (seq < 0 || seq >= p.sequences || pages > p.max_pages) v = -1;
    }
    return (int)v;
}

// The kernel body: Q the query dtype (true: bf16, false: f32), K the key type.
template <bool Q_BF16, class K, int D>
__device__ __forceinline__ void score_impl(const ScoreParams& p) {
    // Dynamic shared memory (the host's score_smem): the row's queries, then
    // two stage buffers a warp.
    float* qs = reinterpret_cast<float*>(dyn_smem);
    unsigned char* bufs = reinterpret_cast<unsigned char*>(qs + p.heads * D);
    __shared__ int row_state[2];  // V (or -1: a bad row), the row's sequence
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tile0 = blockIdx.x * p.blocks_per_cta;
    const bool fused = p.skip_upto >= 0;
    for (int row = blockIdx.y; row < p.rows; row += gridDim.y) {
        if (tid == 0) {
            int seq;
            const int v = row_visible(p, row, seq);
            row_state[0] = v;
            row_state[1] = seq;
            if (fused && blockIdx.x == 0) ((int*)p.positions_out)[row] = v < 0 ? -1 : ((const int*)p.positions)[row];
        }
        __syncthreads();
        const int v = row_state[0], seq = row_state[1];
        float* out = (float*)p.out + (long long)row * p.out_stride;
        const int tile_end = min(tile0 + p.blocks_per_cta, p.blocks);
        if (v < 0 || (fused && v <= p.skip_upto) || tile0 >= v) {
            // Nothing to score in this tile: fill (plain form) or skip (fused).
            if (!fused) {
                const float fill = v < 0 ? __uint_as_float(0x7fc00000u) : __uint_as_float(0xff800000u);
                for (int b = tile0 + tid; b < tile_end; b += SCORE_THREADS) out[b] = fill;
            }
            __syncthreads();
            continue;
        }
        load_queries<Q_BF16, D>(p, row, qs);
        __syncthreads();
        const int* table = (const int*)p.page_table + (long long)seq * p.max_pages;
        const int end = fused ? min(tile_end, v) : tile_end;
        const int scored_end = min(tile_end, v);
        unsigned char* buf0 = bufs + (2 * warp) * BUF_BYTES;
#pragma unroll 1
        for (int g0 = tile0 + warp * 32; g0 < end; g0 += SCORE_WARPS * 32) {
            const int b = g0 + lane;
            bool bad_page;
            const unsigned char* key_at = key_address<K, D>(p, table, b, scored_end, bad_page);
            const float s = warp_relu_sum<K, D>(key_at, qs, p.heads, buf0, lane);
            if (b < end) out[b] = b >= v ? __uint_as_float(0xff800000u) : finish_score(s, bad_page, p.scale);
        }
        __syncthreads();  // qs and row_state are rewritten for the next row
    }
}

}  // namespace qsa

#endif  // FLASHSEL_INDEXER_QSA_SCORE_CUH
