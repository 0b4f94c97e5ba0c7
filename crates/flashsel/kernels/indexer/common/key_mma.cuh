// The indexers' tensor-core dot products (QSA's block scorer, DSA's token
// scorer): values split into bf16 terms whose products are exact in f32,
// the key loaders of each key format, and one warp's 32 keys against
// column tiles of query fragments (mma.sync m16n8k16, bf16 in, f32
// accumulate, sm_80+).
//
// THE DOT PRODUCT'S ORDER (the device order both indexers state): an f32
// accumulator from +0.0 takes one mma per 16-dimension step ks = 0 ..
// d/16 - 1, and within a step one per (key term, query term) pair, key
// term outer; step ks holds the dimensions 32 (ks / 2) + 8 t + 4 (ks % 2)
// + {0, 1, 2, 3}, t = 0 .. 3 (mma k slots 2t, 2t + 1, 2t + 8, 2t + 9). The
// tensor core's summation inside one mma is the hardware's (deterministic,
// not round-to-nearest f32): each operation's host code states its error
// bound. A column's sums depend on its own query values only (never on the
// tile or the other columns).
#ifndef FLASHSEL_INDEXER_COMMON_KEY_MMA_CUH
#define FLASHSEL_INDEXER_COMMON_KEY_MMA_CUH

#include "common/types.cuh"
#include "attention/common/mma.cuh"

namespace fsidx {

#ifndef FSA_HOST_EMU
using fsattn::mma_bf16_16816;
#endif

// An f32 split into bf16 terms hi + mid + lo == x exactly (truncations; a
// NaN or an infinity is hi alone, a NaN made canonical). term(x, i): bits.
__device__ __forceinline__ u32 f32_term(float x, int i) {
    const u32 b = __float_as_uint(x);
    const bool finite = (b & 0x7f800000u) != 0x7f800000u;
    if (i == 0) return (b & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : b >> 16;
    const float r = finite ? x - __uint_as_float(b & 0xffff0000u) : 0.f;  // exact: x's low 16 significand bits
    const u32 rb = __float_as_uint(r);
    return i == 1 ? rb >> 16 : __float_as_uint(r - __uint_as_float(rb & 0xffff0000u)) >> 16;  // exact, <= 8 bits
}
__device__ __forceinline__ u32 pack2(u32 lo, u32 hi) { return (lo & 0xffffu) | (hi << 16); }
// A bf16 pair with its infinities made +0.0: the keys' hi term beside the
// queries' mid and lo terms, so that an infinite key meets only a query's
// hi term (never inf x a zero term of a nonzero value). Per half: t's top
// bit is set, so t - 1 borrows nothing across the halves and clears that
// bit only where the half's magnitude is 0x7f80.
__device__ __forceinline__ u32 zero_infs(u32 v) {
    const u32 t = ((v & 0x7fff7fffu) ^ 0x7f807f80u) | 0x80008000u;
    const u32 inf = ~(t - 0x00010001u) & 0x80008000u;
    return v & ~((inf >> 15) * 0xffffu);
}

// Key element types: load() a lane's 8 values of one row and 32-dimension
// chunk (dimensions 32 s + 8 t .. + 7); pair(raw, w, term): the bf16 pair
// of values 2w, 2w + 1 (the lower in the low half) of one term.
struct KeyBf16 {
    static constexpr int BYTES = 2, TERMS = 1;
    struct Raw { uint4 v; };
    static __device__ __forceinline__ Raw load(const unsigned char* key, int s, int t) {
        Raw r;
        r.v = key ? *reinterpret_cast<const uint4*>(key + (32 * s + 8 * t) * 2) : make_uint4(0u, 0u, 0u, 0u);
        return r;
    }
    static __device__ __forceinline__ u32 pair(const Raw& r, int w, int) {
        return w == 0 ? r.v.x : w == 1 ? r.v.y : w == 2 ? r.v.z : r.v.w;
    }
};
struct KeyF32 {
    static constexpr int BYTES = 4, TERMS = 3;
    struct Raw { uint4 a, b; };
    static __device__ __forceinline__ Raw load(const unsigned char* key, int s, int t) {
        Raw r;
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        const uint4* p = reinterpret_cast<const uint4*>(key + (32 * s + 8 * t) * 4);
        r.a = key ? p[0] : z;
        r.b = key ? p[1] : z;
        return r;
    }
    static __device__ __forceinline__ u32 pair(const Raw& r, int w, int term) {
        const uint4& h = w < 2 ? r.a : r.b;
        const u32 lo = (w & 1) ? h.z : h.x, hi = (w & 1) ? h.w : h.y;
        return pack2(f32_term(__uint_as_float(lo), term), f32_term(__uint_as_float(hi), term));
    }
};
struct KeyE4m3 {
    static constexpr int BYTES = 1, TERMS = 1;
    struct Raw { uint2 v; };
    static __device__ __forceinline__ Raw load(const unsigned char* key, int s, int t) {
        Raw r;
        r.v = key ? *reinterpret_cast<const uint2*>(key + 32 * s + 8 * t) : make_uint2(0u, 0u);
        return r;
    }
    // e4m3 (no infinities; 0x7f / 0xff NaN) exactly: its sign and 7 low bits
    // placed at the top of an f32 give the value times 2^-120 (normals and
    // subnormals alike), the product by 2^120 is exact, and the value has at
    // most 4 significant bits, so its bf16 is the f32's top half.
    static __device__ __forceinline__ u32 bf16_of(u32 b) {
        const u32 v = __float_as_uint(__uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 0x1p120f) >> 16;
        return (b & 0x7fu) == 0x7fu ? 0x7fc0u : v;
    }
    static __device__ __forceinline__ u32 pair(const Raw& r, int w, int) {
        const u32 word = w < 2 ? r.v.x : r.v.y;
        const int sh = (w & 1) * 16;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        // sm_89+: the pair at once, e4m3x2 -> f16x2 -> f32 -> bf16x2, every
        // step exact (e4m3 values are f16 and bf16 values; a NaN stays a
        // NaN, its payload does not reach a score: finish_score).
        const unsigned short two = (unsigned short)((word >> sh) & 0xffffu);
        u32 h2, out;
        unsigned short lo16, hi16;
        float lo, hi;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(two));
        asm("mov.b32 {%0, %1}, %2;" : "=h"(lo16), "=h"(hi16) : "r"(h2));
        asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(lo16));
        asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(hi16));
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
        return out;
#else
        return pack2(bf16_of((word >> sh) & 0xffu), bf16_of((word >> (sh + 8)) & 0xffu));
#endif
    }
};


// The contract's relu where keep, else +0.0 (a head past H): x if x > 0,
// NaN if NaN, else +0.0 (one unordered compare and a select: "not x <= 0"
// holds for x > 0 and for NaN).
__device__ __forceinline__ float relu_if(float x, bool keep) { return keep && !(x <= 0.f) ? x : 0.f; }
__device__ __forceinline__ float relu(float x) { return relu_if(x, true); }

// A warp's accumulators (two m-tiles of NT column tiles) set to +0.0.
template <int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[2][NT][4]) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
}

// The B fragments' index: lane's b0, b1 of step ks, column tile n, query
// term tq, with KS steps and NT tiles.
__device__ __forceinline__ int frag_index(int tq, int ks, int n, int lane, int KS, int NT) {
    return ((tq * KS + ks) * NT + n) * 32 + lane;
}

// The dimension of a query fragment's first value: lane's b0 of step ks
// holds dimensions d0, d0 + 1, b1 d0 + 2, d0 + 3 (the A side's order).
__device__ __forceinline__ int frag_dim0(int ks, int lane) { return 32 * (ks >> 1) + 8 * (lane & 3) + 4 * (ks & 1); }

// A warp's 32 keys (key_at: this lane's key, row 0 of its own 32; null:
// nothing to read, zeros) against NT column tiles of query fragments (qf,
// at frag_index, TQ terms) over `chunks` 32-dimension chunks (d / 32), in
// the order above. On return acc[m][n][2 j + e] is the dot product of key
// 16 m + g + 8 j (g = lane / 4) and column 8 n + 2 (lane & 3) + e. SB:
// chunks loaded before their mma (registers). Warp-uniform call.
template <int TQ, class K, int NT, int SB>
__device__ __forceinline__ void warp_dots(const unsigned char* key_at, const uint2* qf, int chunks, int lane,
                                          float (&acc)[2][NT][4]) {
    constexpr int TK = K::TERMS;
    const int KS = 2 * chunks;
    const int t = lane & 3;
    // The four A rows this lane loads: keys 16 m + g + 8 j (row index 2m + j).
    const int g = lane >> 2;
    const unsigned char* ra[4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
        ra[r] = (const unsigned char*)__shfl_sync(FULL_MASK, (unsigned long long)key_at, 16 * (r >> 1) + g + 8 * (r & 1));
    zero_acc(acc);
#pragma unroll 1
    for (int c0 = 0; c0 < chunks; c0 += SB) {
        typename K::Raw raw[SB][4];
#pragma unroll
        for (int c = 0; c < SB; ++c)
#pragma unroll
            for (int r = 0; r < 4; ++r) raw[c][r] = K::load(ra[r], c0 + c, t);
#pragma unroll
        for (int c = 0; c < SB; ++c)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int ks = 2 * (c0 + c) + u;
#pragma unroll 1
                for (int tk = 0; tk < TK; ++tk) {
                    u32 a[2][4];
#pragma unroll
                    for (int m = 0; m < 2; ++m) {
                        a[m][0] = K::pair(raw[c][2 * m], 2 * u, tk);
                        a[m][1] = K::pair(raw[c][2 * m + 1], 2 * u, tk);
                        a[m][2] = K::pair(raw[c][2 * m], 2 * u + 1, tk);
                        a[m][3] = K::pair(raw[c][2 * m + 1], 2 * u + 1, tk);
                    }
#pragma unroll(TK == 1 ? TQ : 1)  // f32 keys and queries: registers
                    for (int tq = 0; tq < TQ; ++tq) {
                        if (TQ > 1 && tk == 0 && tq == 1)  // the keys' hi beside the queries' mid and lo
#pragma unroll
                            for (int m = 0; m < 2; ++m)
#pragma unroll
                                for (int e = 0; e < 4; ++e) a[m][e] = zero_infs(a[m][e]);
#pragma unroll
                        for (int n = 0; n < NT; ++n) {
                            const uint2 b = qf[frag_index(tq, ks, n, lane, KS, NT)];
#pragma unroll
                            for (int m = 0; m < 2; ++m) mma_bf16_16816(acc[m][n], a[m], b.x, b.y);
                        }
                    }
                }
            }
    }
}

}  // namespace fsidx

#endif  // FLASHSEL_INDEXER_COMMON_KEY_MMA_CUH
