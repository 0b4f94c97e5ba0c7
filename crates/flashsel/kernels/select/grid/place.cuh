// The grid path's placement: each entry of the row's staged list finds its
// output slot by counting the entries ahead of it.
#ifndef FLASHSEL_SELECT_GRID_PLACE_CUH
#define FLASHSEL_SELECT_GRID_PLACE_CUH

#include "common/dtype.cuh"
#include "select/grid/state.cuh"
#include "select/grid/params.cuh"

// PLACE (grid rows): entries [e_lo, e_hi) of the row's staged list, a warp
// per EPW entries, its lanes counting the entries ahead of each in the n_pad
// staged ones (every staged entry read is compared with the EPW entries: EPW
// 2 halves the shared reads, GRID_PLACE_PAIR). Score order: ahead is the
// entry's rank in the list, and it is selected iff ahead < m. Index order:
// only entries >= T are selected, and ahead counts the selected ones with
// lower columns. Either way the count is the entry's output slot.
// TOK: each selected entry's column as its tokens (select/tokens.cuh).
template <int TAG, int EPW, bool TOK, typename Params>
__device__ __forceinline__ void grid_place(const Params& P, const u64* stage, u32 e_lo, u32 e_hi, u32 n_pad, u64 T,
                                           u32 m, int row, u32 lenm1, const void* row_scores, bool prof,
                                           unsigned long long& t_prev) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    TokRow tr = {0, 0, 0, 0, 0};
    if constexpr (TOK) tr = *tok_stash();
    for (u32 e = e_lo + warp * EPW; e < e_hi; e += WARPS * EPW) {
        // Past the share, or (index order) below T: an entry that is never
        // written; ~0 counts nothing. (Score order: T is not known; an entry
        // is written iff fewer than m are above it.)
        u64 x[EPW];
        u32 c[EPW];
#pragma unroll
        for (int a = 0; a < EPW; ++a) {
            const u64 x0 = e + a < e_hi ? stage[e + a] : 0ull;
            x[a] = e + a < e_hi && (!P.order_index || x0 >= T) ? x0 : ~0ull;
            c[a] = 0u;
        }
        // GRID_STEP entries a round: the loads first, then the compares.
        for (u32 j0 = 0; j0 < n_pad; j0 += GRID_STEP) {
            u64 y[GRID_STEP / 32];
#pragma unroll
            for (int u = 0; u < GRID_STEP / 32; ++u) y[u] = stage[j0 + u * 32 + lane];
            if (P.order_index) {
#pragma unroll
                for (int u = 0; u < GRID_STEP / 32; ++u) {
                    const u32 live = (u32)(y[u] >= T);
#pragma unroll
                    for (int a = 0; a < EPW; ++a) c[a] += live & (u32)((u32)y[u] > (u32)x[a]);
                }
            } else {
#pragma unroll
                for (int u = 0; u < GRID_STEP / 32; ++u)
#pragma unroll
                    for (int a = 0; a < EPW; ++a) c[a] += y[u] > x[a];
            }
        }
        PROF_STAMP(prof, PROF_NS(), t_prev, PROF_GRID_PLACE_COUNT);
#pragma unroll
        for (int a = 0; a < EPW; ++a) {
            const u32 ahead = __reduce_add_sync(FULL_MASK, c[a]);
            if (lane == a && x[a] != ~0ull && ahead < m) {  // (index order: always below m)
                if constexpr (TOK) {
                    const u32 col = lenm1 - (u32)x[a];
                    tok_put(P.tok, tr, P.out_idx + (long long)row * P.tok.width, ahead, col);
                    if (P.out_val)  // ratio 1 (the host checks)
                        store_bits<TAG>(P.out_val, (long long)row * P.tok.width + ahead,
                                        value_bits<TAG>((u32)(x[a] >> 32), row_scores, col));
                } else {
                    const long long o = (long long)row * P.k + ahead;
                    const u32 col = lenm1 - (u32)x[a];
                    P.out_idx[o] = (int)col;
                    if (P.out_val) store_bits<TAG>(P.out_val, o, value_bits<TAG>((u32)(x[a] >> 32), row_scores, col));
                }
            }
        }
    }
}

#endif  // FLASHSEL_SELECT_GRID_PLACE_CUH
