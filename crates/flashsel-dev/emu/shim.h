// Host emulation of the CUDA features the sparse MLA kernels and the QSA
// scorer use: one CTA at a time, 256 std::threads (512 for the 64-head MLA
// CTA), barriers for __syncthreads / __syncwarp / warp shuffles, cp.async
// groups.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local dim3 threadIdx;
inline dim3 blockIdx;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <class T> inline T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
#include <math.h>
template <class A, class B> inline auto min(A a, B b) { return a < b ? a : b; }
template <class A, class B> inline auto max(A a, B b) { return a > b ? a : b; }
inline std::barrier<>* g_bar;
constexpr int EMU_MAX_THREADS = 512;
inline std::barrier<>* g_warp[EMU_MAX_THREADS / 32];
inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline std::atomic<int> g_or[2];
inline thread_local int g_gen = 0;
inline int __syncthreads_or(int v) {
    int g = g_gen; g_gen ^= 1;
    if (v) g_or[g].fetch_or(1);
    g_bar->arrive_and_wait();
    int r = g_or[g].load();
    g_bar->arrive_and_wait();
    if (threadIdx.x == 0) g_or[g] = 0;
    return r;
}
inline float g_xch[EMU_MAX_THREADS];
inline float __shfl_xor_sync(unsigned, float v, int m) {
    int t = threadIdx.x;
    g_xch[t] = v;
    g_warp[t >> 5]->arrive_and_wait();
    float r = g_xch[t ^ m];
    g_warp[t >> 5]->arrive_and_wait();
    return r;
}
inline int g_vote[EMU_MAX_THREADS];
// __any_sync over the calling warp.
inline bool __any_sync(unsigned, bool v) {
    int t = threadIdx.x, w = t & ~31;
    g_vote[t] = v;
    g_warp[t >> 5]->arrive_and_wait();
    bool r = false;
    for (int i = 0; i < 32; ++i) r = r || g_vote[w + i];
    g_warp[t >> 5]->arrive_and_wait();
    return r;
}
inline std::mutex g_mu;
inline int atomicMax(int* p, int v) { std::lock_guard<std::mutex> l(g_mu); int o = *p; if (v > o) *p = v; return o; }

// cp.async with groups, as the hardware may order it: a thread's copies are
// queued by commit group; cp_async_wait<N> lands every group but the newest
// N. A group may also land at its commit (g_land_early: a pseudo-random
// half), as a copy that arrives fast would: code that reads a buffer before
// waiting for it, or refills one that other lanes still read, sees the
// wrong bytes either way.
struct EmuCopy { void* dst; const void* src; int n; };
inline thread_local std::vector<EmuCopy> g_open;
inline thread_local std::vector<std::vector<EmuCopy>> g_groups;
inline thread_local unsigned g_land_state = 1;
inline bool g_land_early = true;
inline void emu_land(const std::vector<EmuCopy>& g) { for (const auto& c : g) std::memcpy(c.dst, c.src, c.n); }
inline void cp_async16(void* dst, const void* src) {
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) != 0) std::abort();
    g_open.push_back({dst, src, 16});
}
inline void cp_async_commit() {
    g_land_state = g_land_state * 1103515245u + 12345u + threadIdx.x;
    // An early group lands now and stays in the queue empty: the waits
    // count committed groups, landed or not.
    if (g_land_early && ((g_land_state >> 16) & 1)) { emu_land(g_open); g_open.clear(); }
    g_groups.push_back(g_open);
    g_open.clear();
}
template <int N>
inline void cp_async_wait() {
    while ((int)g_groups.size() > N) { emu_land(g_groups.front()); g_groups.erase(g_groups.begin()); }
}

// Runs a kernel over `grid` CTAs of `nt` threads (a multiple of 32, at most
// EMU_MAX_THREADS), one CTA at a time; a thread that ends with copies never
// waited for aborts.
template <class P>
inline void launch(void (*k)(const P), unsigned grid, const P& p, unsigned nt = 256) {
    if (nt % 32 != 0 || nt > (unsigned)EMU_MAX_THREADS) std::abort();
    std::barrier<> bar(nt);
    for (unsigned i = 0; i < nt / 32; ++i) { g_warp[i] = new std::barrier<>(32); }
    g_bar = &bar;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < nt; ++t)
            th.emplace_back([&, t] {
                threadIdx.x = t;
                g_gen = 0;
                k(p);
                if (!g_open.empty() || !g_groups.empty()) std::abort();  // copies never waited for
            });
        for (auto& x : th) x.join();
        g_or[0] = 0; g_or[1] = 0;
    }
    for (unsigned i = 0; i < nt / 32; ++i) delete g_warp[i];
}
// Tensor-core instructions (kernels/attention/common/mma.cuh) from the PTX
// fragment layouts: each lane posts its row address / fragments, the warp
// meets, each lane reads what its registers hold, the warp meets again.
// mma sums the 16 exact bf16 products in double, then adds to d in f32.
#define FSA_HOST_EMU 1
inline const void* g_ldp[EMU_MAX_THREADS / 32][32];
inline unsigned g_fa[EMU_MAX_THREADS / 32][32][4], g_fb[EMU_MAX_THREADS / 32][32][2];
inline void warp_bar() { g_warp[threadIdx.x >> 5]->arrive_and_wait(); }
inline unsigned emu_u16(const void* p, int i) { unsigned short v; std::memcpy(&v, (const char*)p + 2 * i, 2); return v; }
// Shared addresses are offsets from g_smem (the emulator's smem array).
inline unsigned char* g_smem;
inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - g_smem); }
inline void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    const void* row = g_smem + addr;
    if (((uintptr_t)row & 15) != 0) std::abort();
    g_ldp[w][l] = row;
    warp_bar();
    for (int i = 0; i < 4; ++i) {
        const void* p = g_ldp[w][8 * i + (l >> 2)];
        r[i] = emu_u16(p, 2 * (l & 3)) | (emu_u16(p, 2 * (l & 3) + 1) << 16);
    }
    warp_bar();
}
inline void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    const void* row = g_smem + addr;
    if (((uintptr_t)row & 15) != 0) std::abort();
    g_ldp[w][l] = row;
    warp_bar();
    for (int i = 0; i < 4; ++i) {
        const void* p0 = g_ldp[w][8 * i + 2 * (l & 3)];
        const void* p1 = g_ldp[w][8 * i + 2 * (l & 3) + 1];
        r[i] = emu_u16(p0, l >> 2) | (emu_u16(p1, l >> 2) << 16);
    }
    warp_bar();
}
inline float emu_bf(unsigned v, int hi) { return __uint_as_float((hi ? v >> 16 : v & 0xffffu) << 16); }
inline void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) g_fa[w][l][i] = a[i];
    g_fb[w][l][0] = b0;
    g_fb[w][l][1] = b1;
    warp_bar();
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        double s = 0;
        for (int k = 0; k < 16; ++k) {
            const float av = emu_bf(g_fa[w][(row & 7) * 4 + ((k & 7) >> 1)][(row >> 3) + 2 * (k >> 3)], k & 1);
            const float bv = emu_bf(g_fb[w][col * 4 + ((k & 7) >> 1)][k >> 3], k & 1);
            s += (double)av * bv;
        }
        d[e] = (float)((double)d[e] + s);
    }
    warp_bar();
}
// cp.async to a 32-bit shared address (kernels/common/cp_async.cuh): the
// groups above; wait_all commits and waits for every group.
inline void cp_async16(unsigned addr, const void* src) { cp_async16((void*)(g_smem + addr), src); }
inline void cp_async4(unsigned addr, const void* src) {
    if ((((uintptr_t)(g_smem + addr)) | (uintptr_t)src) & 3) std::abort();
    g_open.push_back({g_smem + addr, src, 4});
}
inline void cp_async_wait_all() { cp_async_commit(); cp_async_wait<0>(); }

// --- For the QSA scorer (kernels/indexer/qsa/score.cuh, qsa_emu.cpp) -------
inline dim3 gridDim;
inline void __syncwarp() { g_warp[threadIdx.x >> 5]->arrive_and_wait(); }
inline unsigned long long g_xch64[EMU_MAX_THREADS];
// A warp shuffle of a 64-bit value from lane `src`.
inline unsigned long long __shfl_sync(unsigned, unsigned long long v, int src) {
    int t = threadIdx.x;
    g_xch64[t] = v;
    g_warp[t >> 5]->arrive_and_wait();
    unsigned long long r = g_xch64[(t & ~31) + src];
    g_warp[t >> 5]->arrive_and_wait();
    return r;
}
// __ballot_sync over the calling warp.
inline unsigned __ballot_sync(unsigned, bool v) {
    int t = threadIdx.x, w = t & ~31;
    g_vote[t] = v;
    g_warp[t >> 5]->arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (unsigned)(g_vote[w + i] != 0) << i;
    g_warp[t >> 5]->arrive_and_wait();
    return r;
}
inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }
// An f32 split into bf16 terms (indexer/common/key_mma.cuh's f32_term): the
// hi, mid, lo truncations; a NaN or an infinity is hi alone.
inline float bf16_term(float x, int i) {
    const unsigned b = __float_as_uint(x);
    if (std::isnan(x)) return i == 0 ? NAN : 0.f;
    if (std::isinf(x)) return i == 0 ? x : 0.f;
    const float hi = __uint_as_float(b & 0xffff0000u), r = x - hi;
    const float mid = __uint_as_float(__float_as_uint(r) & 0xffff0000u);
    return i == 0 ? hi : i == 1 ? mid : r - mid;
}
// Round-to-nearest f32 arithmetic: plain float operations (built with
// -ffp-contract=off, so never contracted into an FMA).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
// Runs a kernel over a gx x gy grid, one CTA at a time, nt threads (a
// multiple of 32, at most 256).
template <class P>
inline void launch2(void (*k)(const P), unsigned gx, unsigned gy, const P& p, unsigned nt = 256) {
    std::barrier<> bar(nt);
    for (unsigned i = 0; i < nt / 32; ++i) g_warp[i] = new std::barrier<>(32);
    g_bar = &bar;
    gridDim.x = gx;
    gridDim.y = gy;
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x) {
            blockIdx.x = x;
            blockIdx.y = y;
            std::vector<std::thread> th;
            for (unsigned t = 0; t < nt; ++t)
                th.emplace_back([&, t] {
                    threadIdx.x = t;
                    k(p);
                    if (!g_open.empty() || !g_groups.empty()) std::abort();  // copies never waited for
                });
            for (auto& x : th) x.join();
        }
    for (unsigned i = 0; i < nt / 32; ++i) delete g_warp[i];
}

// --- For the filter's finish (kernels/select/filter/bucket.cuh, index_order.cuh,
// sort.cuh; finish_emu.cpp) -----------------------------------------------
#define __noinline__ __attribute__((noinline))
[[noreturn]] inline void __trap() { std::abort(); }
// Warp collectives on 32-bit values: each lane posts its value, the warp
// meets, each lane computes from the warp's values, the warp meets again.
inline unsigned g_xch32[EMU_MAX_THREADS];
template <class F>
inline unsigned warp_collect(unsigned v, F f) {
    int t = threadIdx.x;
    g_xch32[t] = v;
    g_warp[t >> 5]->arrive_and_wait();
    unsigned r = f(&g_xch32[t & ~31], t & 31);
    g_warp[t >> 5]->arrive_and_wait();
    return r;
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
    return warp_collect(v, [](const unsigned* w, int) { unsigned r = w[0]; for (int i = 1; i < 32; ++i) r = w[i] < r ? w[i] : r; return r; });
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    return warp_collect(v, [](const unsigned* w, int) { unsigned r = w[0]; for (int i = 1; i < 32; ++i) r = w[i] > r ? w[i] : r; return r; });
}
inline unsigned __reduce_add_sync(unsigned, unsigned v) {
    return warp_collect(v, [](const unsigned* w, int) { unsigned r = 0; for (int i = 0; i < 32; ++i) r += w[i]; return r; });
}
inline unsigned __shfl_up_sync(unsigned, unsigned v, int d) {
    return warp_collect(v, [d](const unsigned* w, int l) { return l >= d ? w[l - d] : w[l]; });
}
inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
    return warp_collect(v, [src](const unsigned* w, int) { return w[src]; });
}
inline unsigned long long __shfl_xor_sync(unsigned, unsigned long long v, int m) {
    int t = threadIdx.x;
    g_xch64[t] = v;
    g_warp[t >> 5]->arrive_and_wait();
    unsigned long long r = g_xch64[t ^ m];
    g_warp[t >> 5]->arrive_and_wait();
    return r;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_or(v); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline float __fdividef(float a, float b) { return a / b; }
// A warp shuffle of an f32 from lane `src` (the DSA scorer).
inline float __shfl_sync(unsigned m, float v, int src) { return __uint_as_float(__shfl_sync(m, __float_as_uint(v), src)); }
