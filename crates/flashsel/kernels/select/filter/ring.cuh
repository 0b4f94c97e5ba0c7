// The load ring: the row path's tiles copied ahead with cp.async into
// shared memory after the buffer (sm_80+).
#ifndef FLASHSEL_SELECT_FILTER_RING_CUH
#define FLASHSEL_SELECT_FILTER_RING_CUH

#include "select/filter/buffer.cuh"

// THE LOAD RING (the row path's shared buffers): FS_HOST_STAGE_BYTES
// of dynamic shared memory after the buffer hold DEPTH tiles; tile t of a
// stream sits in slot t % DEPTH. Each thread copies its own 16-byte groups of
// a tile there with cp.async (sm_80+) and later reads back only those: no
// barrier, only the thread's own cp.async.wait_group.
// Invariants: DEPTH - 1 tiles are in flight while one is filtered (the
// register pipeline holds one); a slot is refilled only after its thread
// has read it into registers and used them; every copy has landed before
// the stream returns (drain), so the finish may use the ring's room.
// Cost per tile and thread: NV copies, a commit, a wait, NV shared loads.
// Measured (perf-log, v19-v20): the bf16 prefill's wait on the next
// tile's loads (9% of its warp samples) gone, -0.1 to -3.5% (the loop is
// then issue-bound); f32 -5%; the split path's short streams slower, so the
// split kernel is built without it. Groups past the range, or of an
// unaligned row, are not copied; next() loads those directly (load_vec),
// as the unstaged loop does.
#ifndef FS_HOST_STAGE_BYTES
#error "the host passes FS_HOST_STAGE_BYTES"
#endif
// 16 bytes from global memory to shared memory (L2 only), asynchronously.
__device__ __forceinline__ void copy_async16(u32 smem, const void* g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(g) : "memory");
}
// 16 bytes from shared memory; ordered after the cp.async waits before it.
__device__ __forceinline__ uint4 load_shared16(u32 smem) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(smem)
                 : "memory");
    return v;
}
template <int TAG>
struct Stage {
    typedef Elem<TAG> E;
    static constexpr int NV = E::ITEMS / E::VEC;
    static constexpr int TILE = FS_BLOCK * E::ITEMS;
    static constexpr int DEPTH = FS_HOST_STAGE_BYTES / (TILE * (int)sizeof(typename E::raw));
    static_assert(DEPTH < 2 || ((DEPTH & (DEPTH - 1)) == 0 && DEPTH <= 4), "ring slots: a power of two, at most 4");
    u32 at;    // the ring's shared-window address
    u32 slot;  // the slot of the next tile to read

    __device__ __forceinline__ explicit Stage(int cap) : at((u32)__cvta_generic_to_shared(dyn_smem) + ring_offset(cap)), slot(0) {}
    // This thread's 16-byte group j of slot s, as a shared-window address.
    __device__ __forceinline__ u32 addr(u32 s, int j) const {
        return at + ((s * NV + (u32)j) * FS_BLOCK + threadIdx.x) * 16u;
    }
    __device__ __forceinline__ static bool copied(u32 e0, u32 end, bool aligned) {
        return aligned && e0 + E::VEC <= end;
    }
    // Starts the copy of the tile at tb into slot s (one commit group, empty
    // past the range).
    __device__ __forceinline__ void issue(const void* row, u32 tb, u32 end, bool aligned, u32 s) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const u32 e0 = tb + (u32)(j * FS_BLOCK + threadIdx.x) * E::VEC;
            if (copied(e0, end, aligned)) {
                copy_async16(addr(s, j), (const char*)row + (size_t)e0 * sizeof(typename E::raw));
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
#endif
    }
    // The tiles from `base` on: DEPTH - 1 of them in flight.
    __device__ __forceinline__ void fill(const void* row, u32 base, u32 end, bool aligned) {
#pragma unroll
        for (int t = 0; t + 1 < DEPTH; ++t) issue(row, base + (u32)(t * TILE), end, aligned, (u32)t);
        slot = 0;
    }
    // The tile at `base` (the next in order) into cur; the tile DEPTH - 1
    // ahead starts into the slot freed by the previous one. Where both tiles
    // are whole, a path of its own without per-group tests (the measured
    // build; the same logic folded into one path with a flag compiles to
    // different code throughout the kernel).
    __device__ __forceinline__ void next(uint4 (&cur)[NV], const void* row, u32 base, u32 end, bool aligned) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        if (aligned && base + (u32)(DEPTH * TILE) <= end) {  // uniform: both tiles whole, no tests per group
            next_whole(cur, row, base);
            return;
        }
#endif
        issue(row, base + (u32)((DEPTH - 1) * TILE), end, aligned, (slot + DEPTH - 1) & (DEPTH - 1));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("cp.async.wait_group %0;" ::"n"(DEPTH - 1) : "memory");
#endif
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const u32 e0 = base + (u32)(j * FS_BLOCK + threadIdx.x) * E::VEC;
            if (copied(e0, end, aligned)) {
                cur[j] = load_shared16(addr(slot, j));
            } else {
                cur[j] = load_vec<TAG>(row, e0, end, aligned);
            }
        }
        slot = (slot + 1) & (DEPTH - 1);
    }
    // next_whole() for a run of tiles starting at slot 0: the tile at slot
    // s (a constant where the caller's loop is unrolled: shared addresses as
    // immediate offsets), the tile DEPTH - 1 ahead from `ahead` (this
    // thread's first group of it). The caller moves `slot` on.
    __device__ __forceinline__ void next_at(uint4 (&cur)[NV], const char* ahead, u32 s) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        const u32 SA = (s + DEPTH - 1) % DEPTH;
#pragma unroll
        for (int j = 0; j < NV; ++j) copy_async16(addr(SA, j), ahead + (size_t)j * FS_BLOCK * 16);
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" ::"n"(DEPTH - 1) : "memory");
#pragma unroll
        for (int j = 0; j < NV; ++j) cur[j] = load_shared16(addr(s, j));
#endif
    }
    // next() where the row is aligned and both tiles are whole (base +
    // DEPTH * TILE <= end): no tests per group (sm_80+). next_at's body with
    // the slot a variable; kept apart because sharing it (or only the
    // `ahead` pointer) changed the code generated across the kernel, which
    // was not measured on the device.
    __device__ __forceinline__ void next_whole(uint4 (&cur)[NV], const void* row, u32 base) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        const char* g = (const char*)row +
                        (size_t)(base + (u32)((DEPTH - 1) * TILE) + threadIdx.x * E::VEC) * sizeof(typename E::raw);
        const u32 s = (slot + DEPTH - 1) & (DEPTH - 1);
#pragma unroll
        for (int j = 0; j < NV; ++j) copy_async16(addr(s, j), g + (size_t)j * FS_BLOCK * 16);
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" ::"n"(DEPTH - 1) : "memory");
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            cur[j] = load_shared16(addr(slot, j));
        }
        slot = (slot + 1) & (DEPTH - 1);
#endif
    }
    // Waits for every copy in flight (before the ring is refilled or left).
    __device__ __forceinline__ static void drain() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
    }
};

#endif  // FLASHSEL_SELECT_FILTER_RING_CUH
