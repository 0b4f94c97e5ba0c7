// The QSA scorer's staged form, for many rows that read one key source
// (prefill): score.cuh's arithmetic and warp loop (the same bits for every
// (row, block)), with the keys staged through shared memory so that a key
// read from L2 serves STAGED_COLS query columns and several tiles of keys
// are in flight a CTA.
//
// Algorithm: a CTA takes a super-group of STAGED_CG row groups (each
// NT column tiles: group_rows(hp, NT) rows, 32 rows at 4 heads and NT 4)
// and a range of blocks. Its threads copy tiles of STAGED_TILE blocks'
// keys into a ring of S shared-memory stages by cp.async (S - 1 tiles
// ahead of the warps); warp w scores the tile's 32-block half w & 1
// against row group w >> 1's columns (warp_scores_rows: A fragments from
// the staged rows, B from the group's query fragments in shared memory).
// A key row's shared-memory stride is its bytes plus 64 (bf16) or 32
// (e4m3) bytes, so that a warp's 16- or 8-byte loads of 8 rows fall in
// distinct banks. Blocks past the pass's end, and blocks whose page entry
// is outside the cache, read a zeroed row instead of a stage row that no
// copy filled (neither is written: a bad page scores NaN, as in score.cuh).
// bf16 and e4m3 keys only: f32 keys' three terms spill this form's
// registers on sm_80-89, and d 256 does not fit two stages.
//
// Key sources: the super-group's rows are scored in passes, one a key
// source (a sequence of the page table, or the one contiguous sequence):
// a pass takes every row of its source (the other rows' columns are
// scored and not written), so rows of one sequence share every key load.
// The host takes this form when rows are many for each sequence
// (ops/indexer/device.rs staged_plan); rows of many distinct sequences
// take score.cuh's form.
//
// Invariants: score.cuh's (no key past a row's V is read; device values out
// of range make the row NaN; nothing outside the cache is read); every
// cp.async group is waited for before its stage is read and before the
// stage is refilled (a barrier between the last read and the refill).
//
// Cost: each visible block's key crosses L2 once a super-group (STAGED_COLS
// columns) instead of once a row group; shared-memory reads per mma: 1 KB
// of A fragments and 256 B of B a column tile a 16-dimension step over the
// warp's 2 x NT mma.
#ifndef FLASHSEL_INDEXER_QSA_STAGED_CUH
#define FLASHSEL_INDEXER_QSA_STAGED_CUH

#include "common/cp_async.cuh"
#include "indexer/qsa/score.cuh"

namespace qsa {

enum : int {
    STAGED_CG = 4,    // row groups a CTA (warps 2 g, 2 g + 1 take group g)
    STAGED_TILE = 64, // blocks a stage: two warps' 32
    STAGED_SMEM_BUDGET = 98304,  // bytes: fits sm_86/89's 99 KB a CTA (the host's STAGED_SMEM_BUDGET)
};

// The staged form's geometry for a query dtype, key type and width (the
// host's staged_geometry): NT column tiles a row group, S stages, smem bytes
// (STAGED_CG query-fragment sets, one zeroed row, S stages).
template <bool Q_BF16, class K, int D>
struct Staged {
    static constexpr int TQ = Q_BF16 ? 1 : 3;
    static_assert(K::TERMS == 1, "f32 keys take score.cuh's form (registers)");
    static constexpr int NT = TQ == 1 ? 4 : 2;
    static constexpr int ROW = D * K::BYTES;
    static constexpr int STRIDE = ROW + (K::BYTES == 2 ? 64 : 32);
    static constexpr int QF = query_frag_bytes<Q_BF16, D, NT>();
    static constexpr int FIXED = STAGED_CG * QF + STRIDE;
    static constexpr int S_FIT = (STAGED_SMEM_BUDGET - FIXED) / (STAGED_TILE * STRIDE);
    static constexpr int S = S_FIT < 4 ? S_FIT : 4;
    static constexpr int SMEM = FIXED + S * STAGED_TILE * STRIDE;
    static constexpr int ROWS_MAX = STAGED_CG * 8 * NT;  // rows at one head
};

static_assert(Staged<true, KeyBf16, 128>::SMEM == 94528 && Staged<false, KeyBf16, 128>::SMEM == 90432,
              "the host's staged_geometry (ops/indexer/device.rs staged_geometry_is_the_kernels)");

// The staged form's kernel body (see the header) for rows of HP padded
// heads (a compile-time constant: the epilogue's head tree and its rows are
// fixed code; one entry each, the host's staged_entry). gridDim.x CTAs split
// the blocks (blocks_per_cta, a multiple of STAGED_TILE), gridDim.y loop
// over the super-groups.
template <bool Q_BF16, class K, int D, int HP>
__device__ __forceinline__ void score_staged_impl(const ScoreParams& p) {
    using G = Staged<Q_BF16, K, D>;
    static_assert(G::S >= 2, "no staged form for this geometry (the host takes score.cuh's)");
    constexpr int NT = G::NT, S = G::S;
    unsigned char* smem = reinterpret_cast<unsigned char*>(dyn_smem);
    unsigned char* zero_row = smem + STAGED_CG * G::QF;
    unsigned char* stages = zero_row + G::STRIDE;
    __shared__ int vis[G::ROWS_MAX], seqs[G::ROWS_MAX];
    __shared__ int pass_seq, pass_end;
    __shared__ unsigned char live[G::ROWS_MAX];  // rows of the current pass
    __shared__ unsigned char done[G::ROWS_MAX];  // rows already scored
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int cg = warp >> 1, half = warp & 1;
    const int tile0 = blockIdx.x * p.blocks_per_cta;
    const int tile_end = min(tile0 + p.blocks_per_cta, p.blocks);
    const bool fused = p.skip_upto >= 0;
    const int lim = fused ? p.skip_upto : -1;  // rows with V <= lim write nothing
    constexpr int hp = HP;
    const int gr = group_rows(hp, NT), sgr = STAGED_CG * gr;
    const int sgroups = (p.rows + sgr - 1) / sgr;
    for (int i = tid; i < G::STRIDE / 16; i += SCORE_THREADS) reinterpret_cast<uint4*>(zero_row)[i] = make_uint4(0u, 0u, 0u, 0u);
    for (int sg = blockIdx.y; sg < sgroups; sg += gridDim.y) {
        const int row0 = sg * sgr, nrows = min(sgr, p.rows - row0);
        if (tid < nrows) {
            check_row(p, row0, vis, seqs);
            done[tid] = vis[tid] <= lim;  // bad rows (-1) and rows that write nothing
        }
        __syncthreads();
        if (!fused) fill_past_visible(p, row0, nrows, vis, tile0, tile_end);
        // The query fragments of the super-group's rows (every pass uses them).
        for (int c = 0; c < STAGED_CG; ++c)
            load_query_frags<Q_BF16, D, NT>(p, row0 + c * gr, min(gr, max(nrows - c * gr, 0)), 0, p.heads,
                                            reinterpret_cast<uint2*>(smem + c * G::QF));
        for (;;) {
            if (tid == 0) {
                // The next pass: the first row not yet scored gives the key
                // source; every row of that source joins.
                int src = -1, vmax = 0;
                for (int rr = 0; rr < nrows; ++rr) {
                    const bool take = !done[rr] && (src < 0 || seqs[rr] == src);
                    if (take) src = seqs[rr], vmax = max(vmax, vis[rr]), done[rr] = 1;
                    live[rr] = take;
                }
                pass_seq = src;
                pass_end = min(tile_end, vmax);
            }
            __syncthreads();  // also: the query fragments are in place
            const int src = pass_seq, end = pass_end;
            if (src < 0) break;
            if (end <= tile0) {
                __syncthreads();  // pass_seq is rewritten
                continue;
            }
            const int* table = (const int*)p.page_table + (long long)src * p.max_pages;
            const int r0 = cg * gr;
            int wend = 0;  // the group's last block to write this pass (warp-uniform)
            for (int rr = r0; rr < min(r0 + gr, nrows); ++rr)
                if (live[rr]) wend = max(wend, vis[rr]);
            // This lane's sums' rows (row group cg), their outputs and limits
            // for the pass.
            float* dst[NT];
            int upto[NT][2];
            lane_slots<NT>(p, hp, lane, true, (long long)row0 + r0, [&](int rr) {
                return rr < gr && r0 + rr < nrows && live[r0 + rr] ? vis[r0 + rr] : 0;
            }, dst, upto);
            // Tiles [tile0 + i T, + T) for i < tiles; stage i % S.
            const int tiles = (end - tile0 + STAGED_TILE - 1) / STAGED_TILE;
            auto issue = [&](int i) {
                if (i < tiles) {
                    constexpr int PARTS = G::ROW / 16;
                    unsigned char* st = stages + (i % S) * (STAGED_TILE * G::STRIDE);
                    const int b0 = tile0 + i * STAGED_TILE;
                    for (int c = tid; c < STAGED_TILE * PARTS; c += SCORE_THREADS) {
                        const int r = c / PARTS, part = c % PARTS;
                        bool bad_page;
                        const unsigned char* key = key_address<K, D>(p, table, b0 + r, end, bad_page);
                        if (key) cp_async16(st + r * G::STRIDE + 16 * part, key + 16 * part);
                    }
                }
                cp_async_commit();  // one group a tile, empty or not: the waits count them
            };
#pragma unroll 1
            for (int i = 0; i < S - 1; ++i) issue(i);
#pragma unroll 1
            for (int i = 0; i < tiles; ++i) {
                cp_async_wait<S - 2>();  // tile i has landed (this thread's copies)
                __syncthreads();         // everyone's; and tile i - 1's stage is read
                issue(i + S - 1);
                const int g0 = tile0 + i * STAGED_TILE + 32 * half;
                if (g0 < wend) {
                    bool bad_page;
                    key_address<K, D>(p, table, g0 + lane, end, bad_page);
                    const u32 bad = __ballot_sync(FULL_MASK, bad_page);
                    const u32 skip = bad | __ballot_sync(FULL_MASK, g0 + lane >= end);
                    const unsigned char* base = stages + (i % S) * (STAGED_TILE * G::STRIDE) + 32 * half * G::STRIDE;
                    const unsigned char* ra[4];
                    const int g = lane >> 2;
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        const int at = 16 * (r >> 1) + g + 8 * (r & 1);
                        ra[r] = (skip >> at) & 1u ? zero_row : base + at * G::STRIDE;
                    }
                    float sum[2][NT][4];
                    warp_scores_rows<Q_BF16, K, D, NT, HP>(ra, reinterpret_cast<const uint2*>(smem + cg * G::QF), p.heads,
                                                       lane, sum);
                    write_sums<NT, sum_replicas(HP), sum_slots(HP)>(p, g0, bad, sum, dst, upto, lane);
                }
            }
            cp_async_wait<0>();  // the trailing empty groups
            __syncthreads();     // the stages and pass_seq are rewritten
        }
        __syncthreads();  // vis, seqs, live, done and the fragments are rewritten for the next super-group
    }
}

}  // namespace qsa

#endif  // FLASHSEL_INDEXER_QSA_STAGED_CUH
