// Thread-block clusters and distributed shared memory (sm_90+; below it
// the helpers compile to nothing and no planner takes a cluster form): the
// rank of this CTA in its cluster, the cluster barrier, and loads from
// another CTA's shared memory. Used by the short path's cluster form
// (select/short/cluster.cuh) and the fused decode indexer's
// (indexer/qsa/decode.cuh).
#ifndef FLASHSEL_COMMON_CLUSTER_CUH
#define FLASHSEL_COMMON_CLUSTER_CUH

#include "common/types.cuh"

__device__ __forceinline__ u32 cluster_rank() {
    u32 r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
// Every thread of every CTA of the cluster arrives; this CTA's earlier
// writes (shared and global) are visible to the others after it, and
// theirs to it. A CTA launched without a cluster is a cluster of one.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// The shared address of a variable of this CTA.
__device__ __forceinline__ u32 smem_at(const void* p) { return (u32)__cvta_generic_to_shared(p); }
// The shared address `a` of this CTA as the same variable of CTA `rank`.
__device__ __forceinline__ u32 cluster_map(u32 a, u32 rank) {
    u32 r = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
#endif
    return r;
}
__device__ __forceinline__ uint4 cluster_ld4(u32 a) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a)
                 : "memory");
#endif
    return v;
}
__device__ __forceinline__ uint2 cluster_ld2(u32 a) {
    uint2 v = make_uint2(0u, 0u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
#endif
    return v;
}
__device__ __forceinline__ u32 cluster_ld(u32 a) {
    u32 v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
#endif
    return v;
}

#endif  // FLASHSEL_COMMON_CLUSTER_CUH
