// The QSA indexer's block scores (ops/indexer: the contract and the CPU
// engine this reproduces bit for bit):
//
//   score[t, b] = sum over h of relu(q[t, h, :] . kbar[b, :]) * c,  b < V(t)
//
// Algorithm: one CTA per (row, tile of blocks_per_cta blocks), one thread per
// block (strided over the tile). The row's queries are decoded once into
// shared memory as f32; each thread streams its block's key in 128-byte
// stages (eight 16-byte loads in flight), decodes each value exactly to f32
// and accumulates, per head, the contract's 8 lanes (lane l adds the
// products of j = l, l + 8, ... in increasing j), then combines the lanes
// as ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), applies relu, sums
// the heads left to right from +0.0 and scales once. Every multiply and add
// is an explicit round-to-nearest f32 operation (__fmul_rn / __fadd_rn: no
// contraction into FMA), so a score's bits depend on its inputs only: not
// on the tile, the batch or the GPU.
//
// Invariants: nothing past a row's V is read; a device value out of range
// (a negative position, V > blocks, a sequence outside the page table, more
// pages than a table row has) makes the whole row NaN, and a block whose
// page entry is outside the cache scores NaN; no key outside the cache is
// read. Fused use (skip_upto >= 0): rows with V <= skip_upto and blocks
// past V are not written at all (qsa_select reads neither).
//
// Cost: each visible block's key is read once (d * sizeof(K) bytes) and the
// query row once per CTA; d * H multiplies and adds per block.
#ifndef FLASHSEL_INDEXER_QSA_SCORE_CUH
#define FLASHSEL_INDEXER_QSA_SCORE_CUH

#include "common/types.cuh"

namespace qsa {

enum : int {
    SCORE_THREADS = 256,  // threads per CTA (the host's indexer SCORE_THREADS)
    MAX_HEADS = 16,
    MAX_DIM = 256,
    LANES = 8,            // the contract's lanes (ops/indexer LANES)
    STAGE_LOADS = 8,      // 16-byte loads of one key stage (128 bytes)
};

// The launch's parameter block (ops/indexer/device.rs ScoreParams).
struct ScoreParams {
    u64 q;           // [rows, heads, dim], f32 or bf16
    u64 kbar;        // [blocks, dim], or paged [cache_pages, per_page, dim]
    u64 positions;   // i32 [rows]
    u64 out;         // f32: row r at out + r * out_stride
    u64 page_table;  // i32 [sequences, max_pages]; 0: contiguous keys
    u64 seq_ids;     // i32 [rows] (paged)
    long long out_stride;
    int rows, heads, blocks, ratio;
    int max_pages, per_page, cache_pages, sequences;
    int skip_upto;       // >= 0: the fused form (see the header)
    float scale;         // c, the f32 nearest 1 / sqrt(dim)
    int blocks_per_cta;  // a multiple of SCORE_THREADS
    int pad_;
};
static_assert(sizeof(ScoreParams) == 104, "ScoreParams layout (ops/indexer/device.rs)");

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

// The dot products of heads h0 .. h0 + G - 1 (their f32 queries at qs) with
// one key of D values at `key`: each head's lanes in increasing j.
template <class K, int D, int G>
__device__ __forceinline__ void dots(const unsigned char* __restrict__ key, const float* qs, int h0, float (&r)[G]) {
    constexpr int PER_LOAD = 16 / K::BYTES;                   // values per 16-byte load
    constexpr int STAGE = (D * K::BYTES < 16 * STAGE_LOADS) ? D : 16 * STAGE_LOADS / K::BYTES;
    constexpr int LOADS = STAGE / PER_LOAD;
    static_assert(D % STAGE == 0 && STAGE % LANES == 0 && STAGE % PER_LOAD == 0, "whole stages of whole loads");
    float acc[G][LANES];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int l = 0; l < LANES; ++l) acc[g][l] = 0.f;
    const uint4* k4 = reinterpret_cast<const uint4*>(key);
#pragma unroll 1
    for (int s0 = 0; s0 < D; s0 += STAGE) {
        uint4 raw[LOADS];
#pragma unroll
        for (int i = 0; i < LOADS; ++i) raw[i] = __ldg(k4 + s0 / PER_LOAD + i);
#pragma unroll
        for (int c = 0; c < STAGE; c += LANES) {
            float kv[LANES];
#pragma unroll
            for (int l = 0; l < LANES; ++l) kv[l] = K::at(raw[(c + l) / PER_LOAD], (c + l) % PER_LOAD);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float4* q4 = reinterpret_cast<const float4*>(qs + (h0 + g) * D + s0 + c);
                float4 qa = q4[0], qb = q4[1];
                float qv[LANES] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                for (int l = 0; l < LANES; ++l) acc[g][l] = __fadd_rn(acc[g][l], __fmul_rn(qv[l], kv[l]));
            }
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) r[g] = combine(acc[g]);
}

// One block's score: heads in groups of 4, then 2, then 1 (each head's dot
// product is its own chain; the head sum runs left to right from +0.0).
template <class K, int D>
__device__ __forceinline__ float block_score(const unsigned char* key, const float* qs, int heads, float scale) {
    float s = 0.f;
    int h = 0;
#pragma unroll 1
    for (; h + 4 <= heads; h += 4) {
        float r[4];
        dots<K, D, 4>(key, qs, h, r);
        s = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(s, relu(r[0])), relu(r[1])), relu(r[2])), relu(r[3]));
    }
    if (h + 2 <= heads) {
        float r[2];
        dots<K, D, 2>(key, qs, h, r);
        s = __fadd_rn(__fadd_rn(s, relu(r[0])), relu(r[1]));
        h += 2;
    }
    if (h < heads) {
        float r[1];
        dots<K, D, 1>(key, qs, h, r);
        s = __fadd_rn(s, relu(r[0]));
    }
    float score = __fmul_rn(s, scale);
    return isnan(score) ? __uint_as_float(0x7fc00000u) : score;
}

// The kernel body: Q the query dtype (true: bf16, false: f32), K the key type.
template <bool Q_BF16, class K, int D>
__device__ __forceinline__ void score_impl(const ScoreParams& p) {
    __shared__ __align__(16) float qs[MAX_HEADS * MAX_DIM];
    __shared__ int row_state[2];  // V (or -1: a bad row), the row's sequence
    const int tid = threadIdx.x;
    const int tile0 = blockIdx.x * p.blocks_per_cta;
    for (int row = blockIdx.y; row < p.rows; row += gridDim.y) {
        if (tid == 0) {
            long long t = ((const int*)p.positions)[row];
            long long v = t < 0 ? -1 : (t + 1) / p.ratio;
            int seq = 0;
            if (v > p.blocks) v = -1;
            if (v >= 0 && p.page_table != 0) {
                seq = ((const int*)p.seq_ids)[row];
                long long pages = (v + p.per_page - 1) / p.per_page;
                if (seq < 0 || seq >= p.sequences || pages > p.max_pages) v = -1;
            }
            row_state[0] = (int)v;
            row_state[1] = seq;
        }
        __syncthreads();
        const int v = row_state[0], seq = row_state[1];
        float* out = (float*)p.out + (long long)row * p.out_stride;
        const int tile_end = min(tile0 + p.blocks_per_cta, p.blocks);
        const bool fused = p.skip_upto >= 0;
        if (v < 0 || (fused && v <= p.skip_upto) || tile0 >= v) {
            // Nothing to score in this tile: fill (plain form) or skip (fused).
            if (!fused) {
                const float fill = v < 0 ? __uint_as_float(0x7fc00000u) : __uint_as_float(0xff800000u);
                for (int b = tile0 + tid; b < tile_end; b += SCORE_THREADS) out[b] = fill;
            }
            __syncthreads();
            continue;
        }
        const int n = p.heads * D;
        if (Q_BF16) {
            const unsigned short* q = (const unsigned short*)p.q + (long long)row * n;
            for (int i = tid; i < n; i += SCORE_THREADS) qs[i] = __uint_as_float((u32)q[i] << 16);
        } else {
            const float* q = (const float*)p.q + (long long)row * n;
            for (int i = tid; i < n; i += SCORE_THREADS) qs[i] = q[i];
        }
        __syncthreads();
        const unsigned char* kbar = (const unsigned char*)p.kbar;
        const int* table = (const int*)p.page_table + (long long)seq * p.max_pages;
        const int end = fused ? min(tile_end, v) : tile_end;
#pragma unroll 1
        for (int b = tile0 + tid; b < end; b += SCORE_THREADS) {
            float score;
            if (b >= v) {
                score = __uint_as_float(0xff800000u);
            } else {
                long long at = b;
                bool ok = true;
                if (p.page_table != 0) {
                    int page = table[b / p.per_page];
                    ok = page >= 0 && page < p.cache_pages;
                    at = (long long)page * p.per_page + b % p.per_page;
                }
                score = ok ? block_score<K, D>(kbar + at * (D * K::BYTES), qs, p.heads, p.scale)
                           : __uint_as_float(0x7fc00000u);
            }
            out[b] = score;
        }
        __syncthreads();  // qs and row_state are rewritten for the next row
    }
}

}  // namespace qsa

#endif  // FLASHSEL_INDEXER_QSA_SCORE_CUH
