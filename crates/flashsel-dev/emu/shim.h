// Host emulation of the CUDA features the sparse MLA kernels use: one CTA at a
// time, 256 std::threads, barriers for __syncthreads / warp shuffles.
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
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local dim3 threadIdx;
inline dim3 blockIdx;
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
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
inline std::barrier<>* g_warp[8];
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
inline float g_xch[256];
inline float __shfl_xor_sync(unsigned, float v, int m) {
    int t = threadIdx.x;
    g_xch[t] = v;
    g_warp[t >> 5]->arrive_and_wait();
    float r = g_xch[t ^ m];
    g_warp[t >> 5]->arrive_and_wait();
    return r;
}
inline std::mutex g_mu;
inline int atomicMax(int* p, int v) { std::lock_guard<std::mutex> l(g_mu); int o = *p; if (v > o) *p = v; return o; }
template <class P>
inline void launch(void (*k)(const P), unsigned grid, const P& p) {
    std::barrier<> bar(256);
    std::vector<std::barrier<>*> w;
    for (int i = 0; i < 8; ++i) { g_warp[i] = new std::barrier<>(32); }
    g_bar = &bar;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < 256; ++t) th.emplace_back([&, t] { threadIdx.x = t; g_gen = 0; k(p); });
        for (auto& x : th) x.join();
        g_or[0] = 0; g_or[1] = 0;
    }
    for (int i = 0; i < 8; ++i) delete g_warp[i];
}
