// The CTA's candidate buffer: where it lives (shared memory or the
// workspace), the warp-aggregated pushes of passing elements
// (raw words, keyed later on whole warps by to_keys) and the histogram pass
// of a compaction.
#ifndef FLASHSEL_SELECT_FILTER_BUFFER_CUH
#define FLASHSEL_SELECT_FILTER_BUFFER_CUH

#include "common/keys.cuh"
#include "common/dtype.cuh"
#include "select/filter/params.cuh"
#include "select/filter/shared.cuh"

// Dynamic shared memory of the scan and split kernels (shared buffer):
// [buffer: cap + 1 composites, padded to 16 bytes][load ring:
// FS_HOST_STAGE_BYTES when P.stage]. The buffer's last slot (index cap)
// takes the pushes past cap, which are never read (see push_tile). A global
// buffer is a slice of cap + 1 composites of gbuf.
__device__ __forceinline__ u64* cta_buffer(u64* gbuf, int cap) {
#if FS_GLOBAL_BUF
    return gbuf + ((u64)blockIdx.y * gridDim.x + blockIdx.x) * ((u64)cap + 1);
#else
    return dyn_smem;
#endif
}
// The ring's byte offset in dynamic shared memory (plan::shared_bytes).
__device__ __forceinline__ u32 ring_offset(int cap) { return (((u32)cap + 2u) & ~1u) * 8u; }
// Composites of scratch the finish may use from the buffer's start: the
// buffer, or, once the stream is over, the ring's room too.
__device__ __forceinline__ int finish_cap(int cap, int stage) {
    return stage ? (int)((ring_offset(cap) + FS_HOST_STAGE_BYTES) / 8u) : cap;
}

// Warp-aggregated push into the buffer: every lane of the warp must call it.
__device__ __forceinline__ void push(u64* buf, Shared& sh, bool pred, u64 c) { append(buf, &sh.count, pred, c); }

// Adds the digit at `shift` of every composite matching `prefix` under `mask`
// to sh.hist, with plain shared atomics: warp-aggregated (__match_any_sync) and
// run-length variants measured slower (docs/perf-log.md, v2/v3).
__device__ __forceinline__ void hist_pass(const u64* buf, Shared& sh, u32 n, u64 prefix, u64 mask, int shift) {
    for (u32 i = threadIdx.x; i < n; i += FS_BLOCK) {
        const u64 c = buf[i];
        if ((c & mask) == prefix) atomicAdd(&sh.hist[(u32)(c >> shift) & 255u], 1u);
    }
}

// The 32-bit word holding element b (= j * VEC + q) of this thread's tile,
// picked from the registers with a select tree (a dynamic index would spill
// to local memory): the element's raw bits for f32; for the 16-bit types
// the element and its neighbour, the element in the high half iff b is odd
// (raw_bits takes it out).
template <int TAG, int NV>
__device__ __forceinline__ u32 pick(const uint4 (&cur)[NV], u32 b) {
    const u32 w_i = TAG == 32 ? b : b >> 1;  // word index over the NV groups
    uint4 v = cur[0];
#pragma unroll
    for (int j = 1; j < NV; ++j) v = (w_i >> 2) == (u32)j ? cur[j] : v;
    const u32 lo = (w_i & 1) ? v.y : v.x, hi = (w_i & 1) ? v.w : v.z;
    const u32 w = (w_i & 2) ? hi : lo;
    return w;
}

// An element's raw bits from the word pick() gave for it. 16-bit types:
// the high half iff the element's offset from its range's start is odd
// (tiles and 16-byte groups hold an even number of elements).
template <int TAG>
__device__ __forceinline__ u32 raw_bits(u32 w, u32 col, u32 start) {
    if (TAG == 32) return w;
    return ((col ^ start) & 1u) ? (w >> 16) : (w & 0xffffu);
}

// Pushes the elements of this thread's tile (`cur`: ITEMS elements as 16-byte
// groups; element j * VEC + q has column tile0 + (j * FS_BLOCK + tid) * VEC + q)
// whose bit is set in `pass`, with one shared atomic per lane that has any.
// Only the set bits are visited (a warp loops as often as its busiest lane has
// passes). What is pushed is the RAW composite, the word pick() gives for the
// element where the key goes (word << 32 | low word): the element's bits
// (raw_bits) and their key transform are taken later, on whole
// warps, over every entry pushed since the last checkpoint (to_keys, called
// by stream_range before a compaction and before it returns). Pushes at or
// past `cap` all land in the spare slot buf[cap]: sh.count then exceeds cap
// and the streaming loop redoes the segment (see stream_range).
template <int TAG, int NV>
__device__ __forceinline__ void push_tile(u64* buf, Shared& sh, u32 pass, const uint4 (&cur)[NV], u32 tile0,
                                          u32 cap) {
    constexpr int VEC = Elem<TAG>::VEC;
    // One shared atomic per lane that has passes (a few per warp and tile at
    // the sampled bound's rate; measured faster than a warp scan and one
    // atomic per warp: docs/perf-log.md, v12).
    if (pass == 0) return;
    u32 pos = atomicAdd(&sh.count, (u32)__popc(pass));
    // The thread's first column, once; bits from the top (the buffer's order
    // does not matter); with one 16-byte group (NV == 1) bit b is column
    // offset b. (bf16: 41 instructions per push in v19, 28 in v21, 18 with
    // the key transform moved to to_keys (v22), 13 storing the whole word
    // (v24): perf-log.)
    const u32 low0 = 0xffffffffu - (tile0 + threadIdx.x * VEC);  // the composite's low word at offset 0
    while (pass) {
        const u32 b = 31 - __clz(pass);
        pass ^= 1u << b;
        const u32 off = NV == 1 ? b : (b / VEC) * (FS_BLOCK * VEC) + (b % VEC);
        // Past cap: into the spare slot buf[cap], never read (no branch).
        buf[pos < cap ? pos : cap] = ((u64)pick<TAG>(cur, b) << 32) | (u64)(low0 - off);
        ++pos;
    }
}

// Turns the raw composites buf[from, to) that push_tile wrote for the range
// starting at column `start` into composites (the key transform of their
// high words); every thread calls it, and the caller puts a barrier between
// it and any read of those entries.
template <int TAG>
__device__ __forceinline__ void to_keys(u64* buf, u32 from, u32 to, u32 start, int nan_largest) {
    for (u32 i = from + threadIdx.x; i < to; i += FS_BLOCK) {
        const u64 c = buf[i];
        const u32 bits = raw_bits<TAG>((u32)(c >> 32), composite_col(c), start);
        buf[i] = ((u64)order_key<TAG>(bits, nan_largest) << 32) | (u64)(u32)c;
    }
}

#endif  // FLASHSEL_SELECT_FILTER_BUFFER_CUH
