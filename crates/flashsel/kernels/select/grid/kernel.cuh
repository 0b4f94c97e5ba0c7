// The grid kernel's body (grid_impl), shared by select/grid.cu (the
// selection's own write) and select/grid_tokens.cu (the token write,
// select/tokens.cuh). The algorithm is described in select/grid.cu.
#ifndef FLASHSEL_SELECT_GRID_KERNEL_CUH
#define FLASHSEL_SELECT_GRID_KERNEL_CUH

#include "common/pdl.cuh"
#include "select/rows.cuh"
#include "select/grid/place.cuh"

// ITEMS: elements a thread holds (fs_grid_*: GRID_ITEMS, fs_grid8_*: 8 for
// chunks of at most FS_BLOCK x 8, whose per-item phases then issue half the
// instructions; fs_grid4_f32: 4, f32 chunks of at most FS_BLOCK x 4).
template <int TAG, int ITEMS, bool TOK, typename Params>
__device__ void grid_impl(const Params& P) {
    typedef Elem<TAG> E;
    constexpr int VEC = E::VEC;
    constexpr int NV = ITEMS / VEC;
    static_assert(ITEMS % VEC == 0 && ITEMS <= GRID_ITEMS, "whole VEC groups, a bit each in the selection mask");
    constexpr int KW = TAG == 32 ? 32 : 16;  // key width
    __shared__ GridShared gs;
    u64* stage = dyn_smem;  // the row's list, k + GRID_SMALL composites
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row = blockIdx.y;
    const int p = blockIdx.x;
    const int chunks = P.chunks;
    const int len = row_span<TOK>(P, row).len;
    const u32 m = (u32)(len < P.k ? len : P.k);
    const bool prof = FS_PROFILE && p == 0 && tid == 0;
    unsigned long long t_prev = PROF_NS();
    const unsigned long long t_start = t_prev;
    const long long c_start = PROF_CLOCK();
    // ns since the last stamp into fs_prof[slot] (CTA 0, thread 0).
#define GRID_STAMP(slot) PROF_STAMP(prof, PROF_NS(), t_prev, slot)
    u32 start, end;
    chunk_range(len, chunks, p, start, end);
    const void* row_scores = span_scores<TAG, TOK>(P, row);
    const bool aligned = aligned16(row_scores);
    // The planner keeps every chunk within the registers; never drop elements.
    if (end - start > (u32)(FS_BLOCK * ITEMS)) __trap();
    // The next call's first kernel waits for this grid (the call chain).
    if (ITEMS < GRID_ITEMS) CHAIN_TRIGGER();

    // The row-wide sample: every CTA of the row reads the
    // same VEC elements per thread with its chunk, thread t's at t * len /
    // FS_BLOCK rounded down to VEC (128-byte runs of 8 threads instead
    // measured slower). Rows too short for distinct
    // groups, or whose k needs more than GRID_SAMPLE_TOPS sample keys a
    // warp, go without.
    // rs: the sample keys expected at or above the row's k-th, plus
    // GRID_SAMPLE_SD deviations and one; `tops` per warp cover it.
    constexpr u32 SAMPLE = FS_BLOCK * VEC;
    const float s_ex = (float)SAMPLE * (float)m / (float)(len > 0 ? len : 1);
    const u32 rs = (u32)(s_ex + (float)GRID_SAMPLE_SD * sqrtf(s_ex)) + 1u;
    const u32 tops = (rs + WARPS - 1) / WARPS;
    // (true &&: the form of the measured build; without it the operands'
    // order in the code generated changes.)
    const bool sampled =
        true && m > 0 && m < (u32)len && (u32)len >= 4u * SAMPLE && tops <= GRID_SAMPLE_TOPS;  // uniform
    uint4 sample_vec = make_uint4(0u, 0u, 0u, 0u);
    if (sampled) {
        const u32 e0 = (u32)((u64)(u32)tid * (u32)len / FS_BLOCK) & ~(VEC - 1u);
        sample_vec = load_vec<TAG>(row_scores, e0, (u32)len, aligned);
    }

    // Load: element i = j * VEC + q of this thread sits at
    // start + (j * FS_BLOCK + tid) * VEC + q.
    u32 key[ITEMS];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        const u32 e0 = start + (u32)(j * FS_BLOCK + tid) * VEC;
        const uint4 w = load_vec<TAG>(row_scores, e0, end, aligned);
#pragma unroll
        for (int q = 0; q < VEC; ++q) key[j * VEC + q] = order_key<TAG>(unpack<TAG>(w, q), P.nan_largest);
    }
    for (u32 b = tid; b < GRID_BINS; b += FS_BLOCK) gs.hist[b] = 0u;
    if (tid == 0) {
        gs.nsmall = 0;
        gs.admitted = 0;
    }
    // The sample's bound: keys >= s_lo are counted by the sampled pass, in
    // bins of 2^s_shift keys (the last bin: everything above). s_lo is a
    // key that at least rs sample keys reach (below), rounded down to a
    // multiple of 2^s_shift; s_shift puts the sample's largest key in the
    // lower half of the bins (0 at a plateau). Every CTA computes the same
    // pair from the same elements. Where the bound fails (the pass counts
    // fewer than m, or the k-th falls in the last bin) the exact passes run
    // as without a sample: the bound saves time, it never decides the result.
    u32 s_lo = 0, s_shift = 0;
    if (sampled) {  // uniform
        GRID_STAMP(PROF_GRID_LOAD);
        // Each warp's `tops` largest sample keys (a round: the warp's
        // largest, struck from the lane that holds it) into gs.scand; the
        // bound is the rs-th largest of those nc = tops * WARPS keys, so
        // at least rs sample keys are at or above it, and smax the largest.
        u32 sk[VEC];
#pragma unroll
        for (int q = 0; q < VEC; ++q) sk[q] = order_key<TAG>(unpack<TAG>(sample_vec, q), P.nan_largest);
        if (prof && sk[0] == 0x5eed5eedu) PROF_ADD(PROF_GRID_SAMPLE_SEEN, 1);  // FS_PROFILE: the stamp waits for the sample's loads
        GRID_STAMP(PROF_GRID_SAMPLE_LOADS);
        for (u32 t = 0; t < tops; ++t) {  // uniform
            u32 lm = 0;
#pragma unroll
            for (int q = 0; q < VEC; ++q) lm = sk[q] > lm ? sk[q] : lm;
            const u32 wm = __reduce_max_sync(FULL_MASK, lm);
            if (lane == __ffs(__ballot_sync(FULL_MASK, lm == wm)) - 1) {
                bool struck = false;
#pragma unroll
                for (int q = 0; q < VEC; ++q) {
                    const bool hit = !struck && sk[q] == wm;
                    sk[q] = hit ? 0u : sk[q];  // a struck key counts as 0: it can only lower the bound
                    struck |= hit;
                }
            }
            if (lane == 0) gs.scand[t * WARPS + warp] = wm;
        }
        __syncthreads();
        GRID_STAMP(PROF_GRID_SAMPLE_TOPS);
        // The rank and the bins' shift: one warp's work, the same in every
        // warp (warp 0 alone, its result shared by
        // the CTA barrier after the PDL wait; the other warps go on).
        if (warp == 0) {
            // Rank of candidate i: those above it, and those equal before it
            // (unique ranks): one lane holds the candidate of rank rs - 1.
            const u32 nc = tops * WARPS;
            u32 found = 0, bound = 0, next_found = 0, next = 0;
#pragma unroll
            for (u32 h = 0; h < (GRID_SAMPLE_TOPS * WARPS + 31) / 32; ++h) {
                const u32 i = lane + 32u * h;
                if (i < nc) {
                    const u32 x = gs.scand[i];
                    u32 rank = 0;
                    // nc is a multiple of WARPS: the reads of a round issue
                    // back to back (a run-time loop over single reads measured
                    // ~0.6 us).
                    for (u32 j0 = 0; j0 < nc; j0 += WARPS) {
                        u32 y[WARPS];
#pragma unroll
                        for (int jj = 0; jj < WARPS; ++jj) y[jj] = gs.scand[j0 + jj];
#pragma unroll
                        for (int jj = 0; jj < WARPS; ++jj)
                            rank += (u32)(y[jj] > x) | ((u32)(y[jj] == x) & (u32)(j0 + jj < i));
                    }
                    if (rank == rs - 1) found = 1, bound = x;
                    if (rank == rs) next_found = 1, next = x;
                }
            }
            bound = __shfl_sync(FULL_MASK, bound, __ffs(__ballot_sync(FULL_MASK, found)) - 1);
            const u32 next_lanes = __ballot_sync(FULL_MASK, next_found);  // none where nc == rs
            next = next_lanes ? __shfl_sync(FULL_MASK, next, __ffs(next_lanes) - 1) : ~bound;
            const u32 smax = __reduce_max_sync(FULL_MASK, lane < WARPS ? gs.scand[lane] : 0u);
            // A plateau at the bound (the next candidate equal to it: ReLU zeros,
            // equal rows, coarse bf16 steps) likely holds the k-th: one key a
            // bin, so the plateau's key is decided by this pass.
            const int span_bits = bit_len(smax - bound);
            s_shift = span_bits > 10 && (next != bound) ? (u32)(span_bits - 10) : 0u;
            s_lo = bound & ~((1u << s_shift) - 1u);
            if (lane == 0) {
                gs.s_lo = s_lo;
                gs.s_shift = s_shift;
            }
        }
        GRID_STAMP(PROF_GRID_BOUND_RANK);
    }
    const u32 lenm1 = len > 0 ? (u32)len - 1u : 0u;
    const u32 mine = end > start ? end - start : 0u;  // elements of this CTA
    // Element i's offset in the chunk and grid composite.
#define GRID_OFF(i) ((u32)(((i) / VEC) * FS_BLOCK + tid) * VEC + (u32)((i) % VEC))
#define GRID_G(i) (((u64)key[i] << 32) | (u64)(lenm1 - (start + GRID_OFF(i))))

    // fs_grid_init_all's zeroes must be visible before the first global write.
    PDL_WAIT();
    u32* state = P.state + (long long)row * GRID_STATE_WORDS;
    u32* bar = state;
    u32* list_count = state + 1;
    // The sampled pass's tally, on a line of its own: the CTAs poll it while
    // others add to the list counter (state is 8-byte aligned).
    u64* tally = (u64*)(state + 32);
    u64* list = P.list + (long long)row * (P.k + FS_HOST_GRID_SMALL);
    u32 barriers = 0;
    __syncthreads();
    if (sampled) {  // uniform; written by warp 0 before the barrier
        s_lo = gs.s_lo;
        s_shift = gs.s_shift;
    }
    GRID_STAMP(sampled ? PROF_GRID_SAMPLE_BOUND : PROF_GRID_LOAD);  // sampled: 32 holds the wait for fs_grid_init_all's zeroes

    // SELECT: the crossing bin's lower edge `edge`, how many of it are wanted
    // (r) and how many it holds (cnt). m == len: all of them (edge 0).
    u64 edge = 0;
    u32 r = 0, cnt = 0;
    int lo_last = 0;  // the crossing bin is [edge, edge + 2^lo_last)
    // The sampled pass decided the crossing bin, and the
    // list is laid out by its bins (gs.binpos). Uniform over the row.
    bool bin_list = false;
    if (m > 0 && m < (u32)len) {
        const int lbits = 32 - __clz(lenm1);  // bits of the low word in use
        int hi = 32 + KW;                     // bits >= hi are decided
        u32 matching = (u32)len;              // composites the next pass counts (in the row)
        r = m;
        bool passes = true;
        if (sampled) {  // uniform
            // The sampled pass: this CTA's keys >= s_lo into the bins of
            // slot 0, its count into the tally; the crossing bin once every
            // CTA has added. A bin other than the last is a key prefix
            // (s_lo is a multiple of 2^s_shift), so the exact passes go on
            // below it as from any pass's crossing bin.
            u32 counted = 0;
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) {
                if ((GRID_OFF(i) < mine) & (key[i] >= s_lo)) {
                    const u32 d = (key[i] - s_lo) >> s_shift;
                    atomicAdd(&gs.hist[d < GRID_BINS - 1u ? d : GRID_BINS - 1u], 1u);
                    ++counted;
                }
            }
            counted = __reduce_add_sync(FULL_MASK, counted);
            if (lane == 0 && counted) atomicAdd(&gs.admitted, counted);
            __syncthreads();
            u32* ghist = state + GRID_HDR;
            u32 place[GRID_FLUSH_J];
            grid_flush(gs, ghist, GRID_BINS, place);
            // Relaxed: a reader trusts the bins only once they add up to the
            // tally's total, so the tally needs no ordering after them.
            if (tid == 0) atomicAdd(tally, GRID_TALLY_ONE + gs.admitted);
            GRID_STAMP(PROF_GRID_PASS_WORK);
            u32 b, above;
            grid_crossing(gs, ghist, GRID_BINS, r, b, above, cnt, 0u, tally, (u32)chunks,
                          gs.binpos);
            if (b != GRID_NO_BIN && b != GRID_BINS - 1u) {  // uniform
                r -= above;
                matching = cnt;
                edge = (u64)(((s_lo >> s_shift) + b) << s_shift) << 32;
                lo_last = 32 + (int)s_shift;
                hi = s_shift == 0 ? lbits : 32 + (int)s_shift;
                passes = cnt != r && cnt > GRID_SMALL;
                if (prof) PROF_ADD(PROF_GRID_SAMPLE_RESOLVED, 1);
            } else if (prof) {
                PROF_ADD(PROF_GRID_SAMPLE_FELL_BACK, 1);
            }
            // The list by bin, where no pass follows: bin d's keys at
            // binpos[d] (the row's keys in bins above d) plus this CTA's
            // place in d (its flush's atomic) plus their order within the
            // CTA (the gather's shared counter). The selected bins (>= b)
            // thus fill the list's first above + cnt = n entries exactly.
            bin_list = b != GRID_NO_BIN && b != GRID_BINS - 1u && !passes;
            if (bin_list) {
#pragma unroll
                for (int j = 0; j < GRID_FLUSH_J; ++j) gs.binpos[tid + j * FS_BLOCK] += place[j];
                __syncthreads();
            }
            if (prof) PROF_ADD(PROF_GRID_PASSES, 1);
            GRID_STAMP(PROF_GRID_PASS_DECIDE);
        }
        for (int pass = 0; passes; ++pass) {
            const int floor_bit = hi > 32 ? 32 : 0;
            const int lo = hi - 11 > floor_bit ? hi - 11 : floor_bit;
            const u32 nbins = 1u << (hi - lo);
            const u64 pre = hi >= 64 ? 0ull : edge >> hi;
            if (lo >= 32) {  // uniform: a digit of the key, the low word plays no part
                const int khi = hi - 32, klo = lo - 32;
                const u32 kpre = (u32)pre;  // edge >> hi < 2^(64 - hi)
#pragma unroll
                for (int i = 0; i < ITEMS; ++i) {
                    if ((GRID_OFF(i) < mine) & (khi >= 32 || key[i] >> khi == kpre))
                        atomicAdd(&gs.hist[(key[i] >> klo) & (nbins - 1u)], 1u);
                }
            } else {
#pragma unroll
                for (int i = 0; i < ITEMS; ++i) {
                    if (GRID_OFF(i) < mine) {
                        const u64 g = GRID_G(i);
                        if ((hi >= 64 ? 0ull : g >> hi) == pre) atomicAdd(&gs.hist[(u32)(g >> lo) & (nbins - 1u)], 1u);
                    }
                }
            }
            __syncthreads();
            u32* ghist = state + GRID_HDR + (1 + pass) * GRID_BINS;
            u32 unused[GRID_FLUSH_J];
            grid_flush(gs, ghist, nbins, unused);
            GRID_STAMP(PROF_GRID_PASS_WORK);
            if (prof) PROF_ADD(PROF_GRID_PASSES, 1);
            u32 b, above;
            grid_crossing(gs, ghist, nbins, r, b, above, cnt, matching);
            matching = cnt;
            r -= above;
            edge |= (u64)b << lo;
            lo_last = lo;
            GRID_STAMP(PROF_GRID_PASS_DECIDE);
            // Done when the bin is wanted whole (always so once lo == 0) or
            // small enough to resolve by counting.
            if (cnt == r || cnt <= GRID_SMALL) break;
            hi = lo == 32 ? lbits : lo;
        }
    }

    // GATHER: this CTA's composites >= edge into the row's list: one global
    // atomic per CTA, warp offsets from a shared counter. A warp votes only
    // on the items some lane of it selected (few: about k / chunks per CTA).
    u32 sel_mask = 0;
    // Once the crossing bin is a range of keys (lo_last >= 32), edge's low
    // word is zero and the test is one 32-bit compare of the key.
    const bool key_edge = lo_last >= 32;  // uniform
    const u32 edge_key = (u32)(edge >> 32);
    // Branch-free: a mask bit per item (the edge test hoisted).
    if (key_edge) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) sel_mask |= ((u32)(GRID_OFF(i) < mine) & (u32)(key[i] >= edge_key)) << i;
    } else {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) sel_mask |= ((u32)(GRID_OFF(i) < mine) & (u32)(GRID_G(i) >= edge)) << i;
    }
    if (bin_list) {  // uniform; selected keys are >= s_lo
        // (Most warps select nothing: they skip the unrolled items.)
        if (__any_sync(FULL_MASK, sel_mask)) {
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) {
                if ((sel_mask >> i) & 1u) {
                    const u32 d0 = (key[i] - s_lo) >> s_shift;
                    const u32 d = d0 < GRID_BINS - 1u ? d0 : GRID_BINS - 1u;
                    list[gs.binpos[d] + atomicAdd(&gs.hist[d], 1u)] = GRID_G(i);
                }
            }
        }
        GRID_STAMP(PROF_GRID_LIST_ATOMIC);
    } else {
        const u32 nsel = __reduce_add_sync(FULL_MASK, (u32)__popc(sel_mask));
        const u32 warp_sel = __reduce_or_sync(FULL_MASK, sel_mask);
        u32 wbase = 0;
        if (lane == 0 && nsel) wbase = atomicAdd(&gs.nsmall, nsel);  // nsmall doubles as the CTA's count
        __syncthreads();
        if (tid == 0 && gs.nsmall) gs.base = atomicAdd(list_count, gs.nsmall);
        __syncthreads();
        GRID_STAMP(PROF_GRID_LIST_ATOMIC);
        wbase = __shfl_sync(FULL_MASK, wbase, 0) + gs.base;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            if ((warp_sel >> i) & 1u) {  // uniform over the warp
                const bool sel = (sel_mask >> i) & 1u;
                const u32 mask = __ballot_sync(FULL_MASK, sel);
                if (sel) list[wbase + __popc(mask & ((1u << lane) - 1u))] = GRID_G(i);
                wbase += __popc(mask);
            }
        }
    }
#undef GRID_G
#undef GRID_OFF
    GRID_STAMP(PROF_GRID_GATHER);
    const u32 n = m > 0 ? m - r + cnt : 0u;  // list entries
    const u32 e_lo = (u32)((u64)n * p / chunks), e_hi = (u32)((u64)n * (p + 1) / chunks);
    // STAGE the list (the bins above, then the crossing bin), then (index
    // order) T: the crossing bin's r-th largest, unless the bin is wanted
    // whole.
    // Padded with zeros (which count as ahead of nothing) to a multiple of
    // the placement's step. All loads first, then the stores: a guarded loop
    // would wait out one L2 round trip per iteration.
    const u32 n_pad = (n + GRID_STEP - 1) / GRID_STEP * GRID_STEP;
    barriers += (u32)chunks;
    grid_barrier(bar, barriers);
    GRID_STAMP(PROF_GRID_GATHER_WAIT);
    {
        u64 v[GRID_STAGE_ROUNDS];
#pragma unroll
        for (int u = 0; u < GRID_STAGE_ROUNDS; ++u) {
            const u32 j = u * FS_BLOCK + tid;
            v[u] = j < n ? __ldcg(list + j) : 0ull;
        }
#pragma unroll
        for (int u = 0; u < GRID_STAGE_ROUNDS; ++u) {
            const u32 j = u * FS_BLOCK + tid;
            if (j < n_pad) stage[j] = v[u];
        }
    }
    if (tid == 0) {
        gs.nsmall = 0;
        gs.T = edge;
    }
    __syncthreads();
    // Score order needs no T: an entry's count of the entries above it is
    // its rank in the list, and it is selected iff that rank is below m
    // (the crossing bin's r-th largest and above). Only index order, whose
    // counts are of the selected entries with lower columns, finds T.
    if (cnt != r && P.order_index) {  // uniform; then cnt <= GRID_SMALL
        for (u32 j = tid; j < n; j += FS_BLOCK) {
            const u64 x = stage[j];
            if (x - edge < (1ull << lo_last)) gs.small[atomicAdd(&gs.nsmall, 1u)] = x;
        }
        __syncthreads();
        if ((u32)tid < cnt) {
            const u64 x = gs.small[tid];
            u32 ahead = 0;
            for (u32 j = 0; j < cnt; ++j) ahead += gs.small[j] > x;
            if (ahead == r - 1) gs.T = x;
        }
        __syncthreads();
    }
    const u64 T = gs.T;
    GRID_STAMP(PROF_GRID_STAGE);

    // PLACE this CTA's share of the list, then its share of the padding.
    // Pairs where the CTA's shared reads (its entries x the staged list)
    // are many: 1 x 1,048,576 k 2048 (16 x 2,304) -0.2 us, 1 x 131,072 k
    // 2048 -1.2 us; a CTA of 10 entries of 1,280 measured 0.2 us slower.
    if ((u64)(e_hi - e_lo) * n_pad >= (u64)GRID_PLACE_PAIR)
        grid_place<TAG, 2, TOK>(P, stage, e_lo, e_hi, n_pad, T, m, row, lenm1, row_scores, prof, t_prev);
    else
        grid_place<TAG, 1, TOK>(P, stage, e_lo, e_hi, n_pad, T, m, row, lenm1, row_scores, prof, t_prev);
    if constexpr (TOK) {
        // This CTA's share of what follows the selection: tail tokens, -1.
        const TokRow tr = *tok_stash();
        const u32 sel = m * (u32)P.tok.ratio, rest = (u32)P.tok.width - sel;
        const u32 p_lo = (u32)((u64)rest * p / chunks), p_hi = (u32)((u64)rest * (p + 1) / chunks);
        int* out_row = P.out_idx + (long long)row * P.tok.width + sel;
        for (u32 j = p_lo + tid; j < p_hi; j += FS_BLOCK) {
            out_row[j] = tok_rest(P.tok, tr, j);
            if (P.out_val) store_bits<TAG>(P.out_val, (long long)row * P.tok.width + sel + j, Elem<TAG>::NEG_INF);
        }
        if (p == 0 && tid == 0 && P.tok.counts) P.tok.counts[row] = tok_count(P.tok, tr, m);
    } else {
        const u32 npad = (u32)P.k - m;
        const u32 p_lo = (u32)((u64)npad * p / chunks), p_hi = (u32)((u64)npad * (p + 1) / chunks);
        for (u32 j = p_lo + tid; j < p_hi; j += FS_BLOCK)
            write_padding<TAG>(P.out_idx, P.out_val, (long long)row * P.k + m + j);
    }
    GRID_STAMP(PROF_GRID_PLACE_WRITE);
    if (prof) {
        PROF_ADD(PROF_GRID_ROWS, 1);
        PROF_ADD(PROF_GRID_CTA_NS, PROF_NS() - t_start);
        PROF_ADD(PROF_GRID_CTA_CYCLES, PROF_CLOCK() - c_start);
    }
#undef GRID_STAMP
}

#endif  // FLASHSEL_SELECT_GRID_KERNEL_CUH
