// Sparse gathers for attention: one tile of KT listed KV rows into shared
// memory, widened to f32.
//
// ALGORITHM
//   tile_offsets: thread j < KT reads position p = t0 + j of the row's index
//   list (tile_entry; tile_offsets_of takes the entry already loaded); the
//   entry is attended iff p < lim (the row's length, clipped to the CTA's
//   split) and 0 <= idx < bound. Its byte offset in the cache (slot
//   idx: page idx / page_size, token idx % page_size; prefill passes one page
//   of s_kv tokens) goes to off_s[j], -1 when not attended. Returns, to every
//   thread, whether any entry of the tile is attended (one barrier).
//   gather_tile: the CTA copies each attended row into k_s[j][0..d_qk) in
//   16-byte chunks (vector loads when the cache's base and strides are
//   16-byte multiples, else byte loads), decoding bf16 / fp8 to f32. Rows
//   that are not attended are written as zeros and never read from global
//   memory: a NaN there cannot reach an output.
//
// INVARIANTS
//   - Only entries with off_s[j] >= 0 are dereferenced; off_s is written
//     before the barrier of tile_offsets and read after it.
//   - fp8 (FMT_FP8, the 656-byte V3.2 token, d_qk = 576): bytes 0..512 are
//     e4m3 values, scale t (f32 at byte 512 + 4t) multiplies values 128t ..
//     128t + 127, bytes 528..656 are 64 bf16 rope values (columns 512..575).
//
// COST
//   One pass over the attended rows' bytes; 16-byte loads, coalesced within a
//   row (consecutive threads take consecutive chunks).
#ifndef FLASHSEL_ATTENTION_COMMON_GATHER_CUH
#define FLASHSEL_ATTENTION_COMMON_GATHER_CUH

#include "attention/common/types.cuh"

namespace fsattn {

// Where a cache's rows are: slot s starts at byte (s / page_size) *
// page_stride + (s % page_size) * token_stride; slots 0 .. bound are valid.
struct CacheGeom {
    const u8* base;
    i64 bound;
    i64 page_size;
    i64 page_stride;   // bytes
    i64 token_stride;  // bytes
    bool aligned;      // base and both strides are multiples of 16 bytes
};

// tile_offsets from an entry already loaded: thread j < KT passes entry t0 +
// j of the list (-1 past lim). Kernels that load the next tile's entries a
// tile ahead call this one.
template <int KT>
__device__ __forceinline__ bool tile_offsets_of(i64* off_s, int entry, const CacheGeom& g) {
    bool v = false;
    if (threadIdx.x < KT) {
        const i64 idx = (i64)entry;
        i64 off = -1;
        if (idx >= 0 && idx < g.bound) {
            // 0 <= idx < 2^31: a 32-bit division when the page size fits.
            const i64 page = g.page_size <= 0x7fffffff ? (i64)((u32)idx / (u32)g.page_size) : idx / g.page_size;
            off = page * g.page_stride + (idx - page * g.page_size) * g.token_stride;
            v = true;
        }
        off_s[threadIdx.x] = off;
    }
    return __syncthreads_or(v) != 0;
}

// Entry t0 + j of the list for thread j < KT, -1 past lim or for other threads.
template <int KT>
__device__ __forceinline__ int tile_entry(const int* idx_row, int t0, int lim) {
    const int p = t0 + (int)threadIdx.x;
    return threadIdx.x < KT && p < lim ? __ldg(idx_row + p) : -1;
}

template <int KT>
__device__ __forceinline__ bool tile_offsets(i64* off_s, const int* idx_row, int t0, int lim, const CacheGeom& g) {
    return tile_offsets_of<KT>(off_s, tile_entry<KT>(idx_row, t0, lim), g);
}

__device__ __forceinline__ void store4(float* d, float a, float b, float c, float e) {
    *(float4*)d = make_float4(a, b, c, e);
}

// Widens one 16-byte chunk of format FMT into dst (4, 8 or 16 floats).
template <int FMT>
__device__ __forceinline__ void widen_chunk(float* dst, const uint4& w, float scale) {
    if (FMT == FMT_F32) {
        store4(dst, __uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z), __uint_as_float(w.w));
    } else if (FMT == FMT_BF16) {
        store4(dst, bf16_lo(w.x), bf16_hi(w.x), bf16_lo(w.y), bf16_hi(w.y));
        store4(dst + 4, bf16_lo(w.z), bf16_hi(w.z), bf16_lo(w.w), bf16_hi(w.w));
    } else {
        const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const u32 x = ws[q];
            store4(dst + 4 * q, e4m3_to_f32(x & 0xffu) * scale, e4m3_to_f32((x >> 8) & 0xffu) * scale,
                   e4m3_to_f32((x >> 16) & 0xffu) * scale, e4m3_to_f32(x >> 24) * scale);
        }
    }
}

// Copies the tile's attended rows into k_s ([KT][d_qk] f32, row stride
// d_qk); zeros for the others. Called by all BLOCK threads between barriers.
template <int FMT, int KT, int BLOCK>
__device__ __forceinline__ void gather_tile(float* k_s, const i64* off_s, const CacheGeom& g, int d_qk) {
    // Chunks of 16 bytes per row and the floats each one gives.
    const int chunks = FMT == FMT_F32 ? d_qk / 4 : FMT == FMT_BF16 ? d_qk / 8 : 40;
    const int total = KT * chunks;
    for (int i = threadIdx.x; i < total; i += BLOCK) {
        const int j = i / chunks;
        const int c = i - j * chunks;
        const i64 off = off_s[j];
        float* row = k_s + (i64)j * d_qk;
        if (FMT == FMT_FP8) {
            // c < 32: e4m3 values 16c .. 16c + 15; else rope chunk c - 32.
            const bool rope = c >= 32;
            float* dst = rope ? row + 512 + 8 * (c - 32) : row + 16 * c;
            if (off < 0) {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    if (q < 2 || !rope) store4(dst + 4 * q, 0.f, 0.f, 0.f, 0.f);
                }
            } else {
                const u8* tok = g.base + off;
                if (rope) {
                    widen_chunk<FMT_BF16>(dst, ld16(tok + 528 + 16 * (c - 32), g.aligned), 1.f);
                } else {
                    const float scale = __uint_as_float(ld4(tok + 512 + 4 * (c >> 3), g.aligned));
                    widen_chunk<FMT_FP8>(dst, ld16(tok + 16 * c, g.aligned), scale);
                }
            }
        } else {
            const int per = FMT == FMT_F32 ? 4 : 8;
            float* dst = row + per * c;
            if (off < 0) {
                store4(dst, 0.f, 0.f, 0.f, 0.f);
                if (per == 8) store4(dst + 4, 0.f, 0.f, 0.f, 0.f);
            } else {
                widen_chunk<FMT>(dst, ld16(g.base + off + 16 * c, g.aligned), 1.f);
            }
        }
    }
}

}  // namespace fsattn

#endif  // FLASHSEL_ATTENTION_COMMON_GATHER_CUH
