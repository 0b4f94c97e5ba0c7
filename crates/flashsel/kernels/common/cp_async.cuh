// Asynchronous 16- and 4-byte copies global -> shared (cp.async, sm_80+) and their
// groups: the one set of helpers for every kernel that stages through
// shared memory (the attention kernels' gathers, the QSA staged scorer).
// The host emulator (crates/flashsel-dev/emu/shim.h) defines FSA_HOST_EMU
// and implements the same functions, with copies that may land early or
// late.
#ifndef FLASHSEL_COMMON_CP_ASYNC_CUH
#define FLASHSEL_COMMON_CP_ASYNC_CUH

#ifndef FSA_HOST_EMU
// 16 bytes to a 32-bit shared-memory address; both 16-byte aligned.
__device__ __forceinline__ void cp_async16(unsigned int dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// 4 bytes to a 32-bit shared-memory address; both 4-byte aligned (the
// L1-allocating form: sizes under 16 bytes have no other).
__device__ __forceinline__ void cp_async4(unsigned int dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
// 16 bytes to a generic pointer into shared memory; both 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    cp_async16((unsigned int)__cvta_generic_to_shared(dst), src);
}
// Closes this thread's open copies into a group (an empty group counts).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are in flight
// (the newest N); the others' bytes are then in shared memory.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Commits and waits for every copy of this thread.
__device__ __forceinline__ void cp_async_wait_all() {
    cp_async_commit();
    cp_async_wait<0>();
}
#endif

#endif  // FLASHSEL_COMMON_CP_ASYNC_CUH
