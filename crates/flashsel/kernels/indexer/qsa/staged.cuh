// The QSA scorer's staged form, for many rows that read one key source
// (prefill): score.cuh's arithmetic (the same bits for every (row, block):
// the same products in the same mma k slots, the same step, term and head
// order), with the keys staged through shared memory so that a key read
// from L2 serves STAGED_COLS query columns and several tiles of keys are in
// flight a CTA.
//
// Algorithm: a CTA takes a super-group of STAGED_CG row groups (each NT
// column tiles: group_rows(hp, NT) rows, 32 rows at 4 heads and NT 4) and a
// range of blocks. Its warps copy tiles of STAGED_TILE blocks' keys into a
// ring of S shared-memory stages by cp.async (S - 1 tiles ahead; warp w
// copies the tile's rows 8 w .. 8 w + 7, lane j < 8 finding row 8 w + j's
// key and page, the others taking it by a shuffle); warp w scores the
// tile's 32-block half w & 1 against row group w >> 1's columns.
//   - A (keys): bf16 rows are staged with each 32-dimension chunk's words
//     (dimension pairs) transposed 4 x 4 (4-byte copies), so that the 16
//     bytes of k slots 0-7 or 8-15 of a k16 step are contiguous and one
//     ldmatrix.x4 gives an m-tile's A fragment in score.cuh's dimension
//     order; e4m3 rows are staged as they are (16-byte copies) and decoded
//     a pair at a time (score.cuh's KeyE4m3).
//   - B (queries): the group's fragments in shared memory, two column tiles
//     a 16-byte load. Columns are placed so that each lane's 2 NT columns
//     are consecutive (row, head) columns (staged_column): a lane holds all
//     the heads of its rows (hp <= 2 NT) or a 2 NT-head part of one row, so
//     the head tree is in registers, with one or two shuffles past 2 NT
//     heads, in the contract's order.
// A key row's shared-memory stride is its bytes plus 16 (bf16: the 8 rows
// of an ldmatrix fall in distinct bank groups) or 32 (e4m3: a warp's 8-byte
// loads of 8 rows). Blocks past the pass's end, and blocks whose page entry
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
// stage is refilled (a barrier between the last read and the refill); a
// stage's bad-page bits are written with its copies and read after the
// same barriers.
//
// Cost: each visible block's key crosses L2 once a super-group (STAGED_COLS
// columns) instead of once a row group. Per warp and tile (bf16, NT 4, d
// 128): 64 mma, 16 ldmatrix.x4 and 16 16-byte loads of B, 16 4-byte copies
// a thread, the head trees in registers and one store a (row, block).
#ifndef FLASHSEL_INDEXER_QSA_STAGED_CUH
#define FLASHSEL_INDEXER_QSA_STAGED_CUH

#include "common/cp_async.cuh"
#include "indexer/qsa/score.cuh"

namespace qsa {

#ifndef FSA_HOST_EMU
using fsattn::ldsm_x4;
using fsattn::smem_addr;
#endif

enum : int {
    STAGED_CG = 4,    // row groups a CTA (warps 2 g, 2 g + 1 take group g)
    STAGED_TILE = 64, // blocks a stage: two warps' 32
    STAGED_SMEM_BUDGET = 98304,  // bytes: fits sm_86/89's 99 KB a CTA (the host's STAGED_SMEM_BUDGET)
    STAGED_MAX_S = 4,
};

// The staged form's geometry for a query dtype, key type and width (the
// host's staged_geometry): NT column tiles a row group, S stages, smem bytes
// (STAGED_CG query-fragment sets, one zeroed row, S stages).
template <bool Q_BF16, class K, int D>
struct Staged {
    static constexpr int TQ = Q_BF16 ? 1 : 3;
    static_assert(K::TERMS == 1, "f32 keys take score.cuh's form (registers)");
    static constexpr int NT = TQ == 1 ? 4 : 2;
    static constexpr int C = 2 * NT;  // a lane's columns
    static constexpr int ROW = D * K::BYTES;
    static constexpr bool LDSM = K::BYTES == 2;  // bf16: transposed rows, ldmatrix
    static constexpr int STRIDE = ROW + (LDSM ? 16 : 32);
    static constexpr int UNIT = LDSM ? 4 : 16;  // bytes a copy
    static constexpr int UNITS = ROW / UNIT;    // copies a row
    static constexpr int QF = query_frag_bytes<Q_BF16, D, NT>();
    static constexpr int FIXED = STAGED_CG * QF + STRIDE;
    static constexpr int S_FIT = (STAGED_SMEM_BUDGET - FIXED) / (STAGED_TILE * STRIDE);
    static constexpr int S = S_FIT < STAGED_MAX_S ? S_FIT : STAGED_MAX_S;
    static constexpr int SMEM = FIXED + S * STAGED_TILE * STRIDE;
    static constexpr int ROWS_MAX = STAGED_CG * 8 * NT;  // rows at one head
};

static_assert(Staged<true, KeyBf16, 128>::SMEM == 85264 && Staged<false, KeyBf16, 128>::SMEM == 84240,
              "the host's staged_geometry (ops/indexer/device.rs staged_geometry_is_the_kernels)");
static_assert(STAGED_TILE == 8 * SCORE_WARPS, "a warp copies 8 rows of a tile");

// Where a bf16 key's word (dimension pair) w of a row goes in its stage
// row: each 16-word (32-dimension) chunk transposed 4 x 4, so that word 4 t
// + x lands at 4 x + t. Then the 16 bytes at 16 x hold, for t = 0 .. 3,
// dimensions 32 s + 8 t + 2 x, + 1: k slots 2 t, 2 t + 1 of step 2 s + x / 2
// (x even) or k slots 2 t + 8, 2 t + 9 (x odd), score.cuh's order.
__device__ __forceinline__ int staged_word(int w) { return (w & ~15) | ((w & 3) << 2) | ((w >> 2) & 3); }

// The group column j of B column n (0 .. 7) of column tile q: lane quad
// position t holds columns C t .. C t + C - 1 (its value i = 2 q + e of tile
// q, entry e) of a group's 8 NT; column j is (row j / hp, head j % hp).
template <int NT>
__device__ __forceinline__ int staged_column(int q, int n) { return 2 * NT * (n >> 1) + 2 * q + (n & 1); }

// The B fragments of a group's query columns (staged_column's places), in
// shared memory: entry ((tq * KS + ks) * NT / 2 + pq) * 32 + lane holds
// lane's b0, b1 of step ks, query term tq, for tiles 2 pq and 2 pq + 1.
// Rows row0 .. row0 + nrows - 1 (the other rows' and the padded heads'
// columns zero). Every thread calls it.
template <bool Q_BF16, int D, int NT, int HP>
__device__ __forceinline__ void load_query_frags_staged(const ScoreParams& p, int row0, int nrows, int heads, uint4* qf) {
    constexpr int KS = D / 16, TQ = Q_BF16 ? 1 : 3, NP = NT / 2;
    for (int i = threadIdx.x; i < TQ * KS * NP * 32; i += SCORE_THREADS) {
        const int lane = i & 31, pq = (i >> 5) % NP, ks = ((i >> 5) / NP) % KS, tq = (i >> 5) / (NP * KS);
        const int dim0 = 32 * (ks >> 1) + 8 * (lane & 3) + 4 * (ks & 1);
        u32 b[4];
#pragma unroll
        for (int hq = 0; hq < 2; ++hq) {
            const int j = staged_column<NT>(2 * pq + hq, lane >> 2), rr = j / HP, h = j % HP;
            u32 v[4] = {0u, 0u, 0u, 0u};
            if (rr < nrows && h < heads) {
                const long long at = ((long long)(row0 + rr) * p.heads + h) * D + dim0;
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    v[e] = Q_BF16 ? ((const unsigned short*)p.q)[at + e] : f32_term(((const float*)p.q)[at + e], tq);
            }
            b[2 * hq] = pack2(v[0], v[1]);
            b[2 * hq + 1] = pack2(v[2], v[3]);
        }
        qf[i] = make_uint4(b[0], b[1], b[2], b[3]);
    }
}

// The A fragments of one 32-dimension chunk c (k16 steps 2 c and 2 c + 1)
// for the warp's two m-tiles: a[u][m] of step 2 c + u.
//   bf16 (ldsm): addr[m] this lane's ldmatrix row (a transposed stage row
//   or the zero row) plus 16 (lane >> 4); step ks is 32 ks bytes on.
//   e4m3: rows[2 m + j] block 16 m + g + 8 j's stage row (or the zero row),
//   decoded a pair at a time as score.cuh's KeyE4m3.
template <class K, bool LDSM>
struct StagedA;
template <class K>
struct StagedA<K, true> {
    u32 addr[2];
    // The warp's 32 stage rows at base (stride bytes apart); rows whose skip
    // bit is set read the zero row.
    __device__ __forceinline__ StagedA(const unsigned char* base, const unsigned char* zero_row, u32 skip, int stride,
                                       int lane) {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const int at = 16 * m + (lane & 7) + 8 * ((lane >> 3) & 1);
            addr[m] = smem_addr(((skip >> at) & 1u ? zero_row : base + at * stride) + 16 * (lane >> 4));
        }
    }
    __device__ __forceinline__ void chunk(int c, int, u32 (&a)[2][2][4]) const {
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int m = 0; m < 2; ++m) ldsm_x4(a[u][m], addr[m] + 32 * (2 * c + u));
    }
};
template <class K>
struct StagedA<K, false> {
    const unsigned char* rows[4];
    __device__ __forceinline__ StagedA(const unsigned char* base, const unsigned char* zero_row, u32 skip, int stride,
                                       int lane) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int at = 16 * (r >> 1) + (lane >> 2) + 8 * (r & 1);
            rows[r] = (skip >> at) & 1u ? zero_row : base + at * stride;
        }
    }
    __device__ __forceinline__ void chunk(int c, int t, u32 (&a)[2][2][4]) const {
        typename K::Raw raw[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) raw[r] = K::load(rows[r], c, t);
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                a[u][m][0] = K::pair(raw[2 * m], 2 * u, 0);
                a[u][m][1] = K::pair(raw[2 * m + 1], 2 * u, 0);
                a[u][m][2] = K::pair(raw[2 * m], 2 * u + 1, 0);
                a[u][m][3] = K::pair(raw[2 * m + 1], 2 * u + 1, 0);
            }
    }
};

// The warp's 32 blocks against its group's columns: acc[m][q][2 j + e] =
// dot of block 16 m + g + 8 j and column staged_column(q, 2 t + e), in
// score.cuh's order (from +0.0, one mma a step and term, steps ascending,
// query terms ascending within a step).
template <bool Q_BF16, class K, int D, int NT, class A>
__device__ __forceinline__ void staged_products(const A& ta, const uint4* qf, int lane, float (&acc)[2][NT][4]) {
    constexpr int KS = D / 16, CH = D / 32, TQ = Q_BF16 ? 1 : 3, NP = NT / 2;
    zero_acc(acc);
#pragma unroll 2
    for (int c = 0; c < CH; ++c) {
        u32 a[2][2][4];
        ta.chunk(c, lane & 3, a);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int ks = 2 * c + u;
#pragma unroll
            for (int tq = 0; tq < TQ; ++tq) {
                if (TQ > 1 && tq == 1)  // the keys' hi beside the queries' mid and lo
#pragma unroll
                    for (int m = 0; m < 2; ++m)
#pragma unroll
                        for (int e = 0; e < 4; ++e) a[u][m][e] = zero_infs(a[u][m][e]);
#pragma unroll
                for (int pq = 0; pq < NP; ++pq) {
                    const uint4 b = qf[((tq * KS + ks) * NP + pq) * 32 + lane];
#pragma unroll
                    for (int m = 0; m < 2; ++m) {
                        mma_bf16_16816(acc[m][2 * pq], a[u][m], b.x, b.y);
                        mma_bf16_16816(acc[m][2 * pq + 1], a[u][m], b.z, b.w);
                    }
                }
            }
        }
    }
}

// The pairwise tree of n relu'd values x[0 .. n) (keep[i]: a head < H).
template <int N>
__device__ __forceinline__ float head_tree(const float* x, const bool* keep) {
    if constexpr (N == 1) {
        return relu_if(x[0], keep[0]);
    } else {
        return head_tree<N / 2>(x, keep) + head_tree<N / 2>(x + N / 2, keep + N / 2);
    }
}

// Rows a lane's sums cover (hp <= C: C / hp rows; else one row, shared by
// R = hp / C lanes).
template <int C, int HP>
struct StagedSums {
    static constexpr int RL = HP <= C ? C / HP : 1;  // rows a lane
    static constexpr int R = HP <= C ? 1 : HP / C;   // lanes a row (replicas)
    static constexpr int N = HP <= C ? HP : C;       // values a lane's tree
    // The group row of this lane's row r.
    static __device__ __forceinline__ int row(int t, int r) { return HP <= C ? C * t / HP + r : t / R; }
};

// The relu sums of the heads in place: sum[m][j][r] of block 16 m + g + 8 j
// and the lane's row r (StagedSums::row), in the contract's tree.
template <int NT, int HP>
__device__ __forceinline__ void staged_sums(const float (&acc)[2][NT][4], int heads, int lane,
                                            float (&sum)[2][2][StagedSums<2 * NT, HP>::RL]) {
    constexpr int C = 2 * NT;
    using SS = StagedSums<C, HP>;
    const int t = lane & 3;
    bool keep[C];
#pragma unroll
    for (int i = 0; i < C; ++i) keep[i] = (HP <= C ? i % HP : C * (t % SS::R) + i) < heads;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float x[C];
#pragma unroll
            for (int i = 0; i < C; ++i) x[i] = acc[m][i >> 1][2 * j + (i & 1)];
#pragma unroll
            for (int r = 0; r < SS::RL; ++r) {
                float s = head_tree<SS::N>(x + r * SS::N, keep + r * SS::N);
                // Past C heads: the lanes t ^ 1 (and t ^ 2) hold the other
                // parts; x + y == y + x, so both lanes get the tree's bits.
                if (SS::R >= 2) s = s + __shfl_xor_sync(FULL_MASK, s, 1);
                if (SS::R >= 4) s = s + __shfl_xor_sync(FULL_MASK, s, 2);
                sum[m][j][r] = s;
            }
        }
}

// The staged form's kernel body (see the header) for rows of HP padded
// heads (a compile-time constant: the epilogue's head tree and its rows are
// fixed code; one entry each, the host's staged_entry). gridDim.x CTAs split
// the blocks (blocks_per_cta, a multiple of STAGED_TILE), gridDim.y loop
// over the super-groups.
template <bool Q_BF16, class K, int D, int HP>
__device__ __forceinline__ void score_staged_impl(const ScoreParams& p) {
    using G = Staged<Q_BF16, K, D>;
    static_assert(G::S >= 2, "no staged form for this geometry (the host takes score.cuh's)");
    constexpr int NT = G::NT, S = G::S, C = G::C;
    using SS = StagedSums<C, HP>;
    unsigned char* smem = reinterpret_cast<unsigned char*>(dyn_smem);
    unsigned char* zero_row = smem + STAGED_CG * G::QF;
    unsigned char* stages = zero_row + G::STRIDE;
    __shared__ int vis[G::ROWS_MAX], seqs[G::ROWS_MAX];
    __shared__ int pass_seq, pass_end;
    __shared__ unsigned char live[G::ROWS_MAX];  // rows of the current pass
    __shared__ unsigned char done[G::ROWS_MAX];  // rows already scored
    __shared__ u32 stage_bad[STAGED_MAX_S][2];   // a stage's blocks whose page is outside the cache
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int cg = warp >> 1, half = warp & 1, g = lane >> 2, t = lane & 3;
    const int tile0 = blockIdx.x * p.blocks_per_cta;
    const int tile_end = min(tile0 + p.blocks_per_cta, p.blocks);
    const bool fused = p.skip_upto >= 0;
    const int lim = fused ? p.skip_upto : -1;  // rows with V <= lim write nothing
    const float scale = p.scale;
    const int gr = group_rows(HP, NT), sgr = STAGED_CG * gr;
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
            load_query_frags_staged<Q_BF16, D, NT, HP>(p, row0 + c * gr, min(gr, max(nrows - c * gr, 0)), p.heads,
                                                       reinterpret_cast<uint4*>(smem + c * G::QF));
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
            // This lane's rows (row group cg): their outputs and the blocks
            // they write this pass (0: none).
            // The lane's rows are consecutive: row r's output is dst + r
            // out_stride.
            float* const dst = (float*)p.out + ((long long)row0 + r0 + min(SS::row(t, 0), gr - 1)) * p.out_stride;
            int upto[SS::RL];
#pragma unroll
            for (int r = 0; r < SS::RL; ++r) {
                const int rr = SS::row(t, r);
                upto[r] = rr < gr && r0 + rr < nrows && live[r0 + rr] ? vis[r0 + rr] : 0;
            }
            // Tiles [tile0 + i T, + T) for i < tiles; stage i % S. Warp w
            // copies rows 8 w .. 8 w + 7: lane j < 8 finds row 8 w + j's key
            // (its bad page a bit of stage_bad), the others take it by a
            // shuffle.
            const int tiles = (end - tile0 + STAGED_TILE - 1) / STAGED_TILE;
            auto issue = [&](int i) {
                if (i < tiles) {
                    unsigned char* st = stages + (i % S) * (STAGED_TILE * G::STRIDE) + 8 * warp * G::STRIDE;
                    const int b = tile0 + i * STAGED_TILE + 8 * warp + (lane & 7);
                    bool bad_page;
                    const unsigned char* key = key_address<K, D>(p, table, b, end, bad_page);
                    const u32 bad = __ballot_sync(FULL_MASK, bad_page && lane < 8);
                    if (lane == 0) reinterpret_cast<unsigned char*>(stage_bad[i % S])[warp] = (unsigned char)bad;
                    const u32 st_addr = smem_addr(st);
                    if constexpr (G::LDSM) {
                        // bf16: a row a step (warp-uniform), lane l copying words
                        // l + 32 k to staged_word's places (staged_word(w + 32 k)
                        // = staged_word(w) + 32 k).
                        static_assert(G::UNITS % 32 == 0, "bf16 rows of 32 or more words");
                        const u32 dst0 = st_addr + 4 * staged_word(lane);
#pragma unroll
                        for (int r = 0; r < 8; ++r) {
                            const unsigned char* kr = (const unsigned char*)__shfl_sync(FULL_MASK, (unsigned long long)key, r);
                            if (kr) {
#pragma unroll
                                for (int k = 0; k < G::UNITS / 32; ++k)
                                    cp_async4(dst0 + r * G::STRIDE + 128 * k, kr + 4 * lane + 128 * k);
                            }
                        }
                    } else {
                        // e4m3: 32 / UNITS rows a step (rows of 4 or 8 16-byte units).
                        static_assert(32 % G::UNITS == 0, "e4m3 rows of at most 32 units");
                        constexpr int PER = 8 * G::UNITS / 32;  // copies a lane
#pragma unroll
                        for (int k = 0; k < PER; ++k) {
                            const int f = 32 * k + lane, r = f / G::UNITS, u = f % G::UNITS;
                            const unsigned char* kr = (const unsigned char*)__shfl_sync(FULL_MASK, (unsigned long long)key, r);
                            if (kr) cp_async16(st_addr + r * G::STRIDE + 16 * u, kr + 16 * u);
                        }
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
                    const u32 bad = stage_bad[i % S][half];
                    const int valid = end - g0;
                    const u32 skip = bad | (valid >= 32 ? 0u : ~0u << valid);
                    const unsigned char* base = stages + (i % S) * (STAGED_TILE * G::STRIDE) + 32 * half * G::STRIDE;
                    float acc[2][NT][4];
                    const StagedA<K, G::LDSM> ta(base, zero_row, skip, G::STRIDE, lane);
                    staged_products<Q_BF16, K, D, NT>(ta, reinterpret_cast<const uint4*>(smem + cg * G::QF), lane, acc);
                    float sum[2][2][SS::RL];
                    staged_sums<NT, HP>(acc, p.heads, lane, sum);
                    // The writes: block slot s = 2 m + j (block 16 m + g + 8
                    // j); a row's R replica lanes share its four slots.
#pragma unroll
                    for (int s = 0; s < 4; ++s) {
                        if (SS::R > 1 && s % SS::R != t % SS::R) continue;
                        const int i_b = 16 * (s >> 1) + g + 8 * (s & 1), b = g0 + i_b;
                        const bool bad_i = (bad >> i_b) & 1u;
#pragma unroll
                        for (int r = 0; r < SS::RL; ++r) {
                            const float v = finish_score(sum[s >> 1][s & 1][r], bad_i, scale);
                            if (b < upto[r]) dst[r * p.out_stride + b] = v;  // a predicated store
                        }
                    }
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
