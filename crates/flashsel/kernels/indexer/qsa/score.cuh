// The QSA indexer's block scores on the GPU (ops/indexer: the contract; its
// "device order" section is the order written out here):
//
//   score[t, b] = sum over h of relu(q[t, h, :] . kbar[b, :]) * c,  b < V(t)
//
// Algorithm: tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate, sm_80+).
// A CTA takes a group of rows (queries) and a tile of blocks_per_cta blocks;
// its warps take groups of 32 consecutive blocks (two 16-row A tiles of keys)
// against the group's query columns (B: NT tiles of 8 columns, each column
// one (row, head); a row's heads padded to a power of two, hp; a run of
// rows whose columns fit one tile takes one tile). Keys go
// straight from global memory into A fragments (a lane loads 16 contiguous
// bytes of bf16 a row and 32-dimension chunk); the queries' B fragments are
// built once per row group in shared memory, in the same dimension order.
// A lane's finished sums map to fixed (row, block) slots (sum_row), so the
// writes' rows and limits are set once a run.
//
// Arithmetic (the device order, a pure function of the row's and the
// block's values: the same bits in any batch, tile or group):
//   - a value is split into bf16 terms whose sum is exactly its value: bf16
//     and e4m3 (decoded exactly) one term, f32 three (truncations: hi, mid,
//     lo); every product of terms is exact in f32. An infinite key value
//     counts +0.0 beside the queries' mid and lo terms (zero_infs), so an
//     infinite key times a nonzero query value is an infinity, as exactly.
//     (An infinite query value beside f32 keys' zero mid or lo terms still
//     gives NaN: not handled.)
//   - dot_h: an f32 accumulator from +0.0 takes one mma per 16-dimension
//     step ks = 0 .. d/16 - 1, and within a step one per (key term, query
//     term) pair, key term outer; step ks holds the dimensions
//     32 (ks / 2) + 8 t + 4 (ks % 2) + {0, 1, 2, 3}, t = 0 .. 3 (mma k
//     slots 2t, 2t + 1, 2t + 8, 2t + 9). The tensor core's own summation
//     inside one mma is the hardware's (deterministic, not round-to-nearest
//     f32): the host states its error bound.
//   - relu (NaN kept, -0 and negatives +0.0; heads past H count +0.0),
//     then a pairwise tree over the padded heads: ((h0 + h1) + (h2 + h3)) +
//     ((h4 + h5) + (h6 + h7)), sixteen heads as tree(0..7) + tree(8..15);
//     one round-to-nearest multiply by c; a NaN written as 0x7fc00000.
//
// Invariants: no key past a row's V is read; a device value out of range
// (a negative position, V > blocks, a sequence outside the page table, more
// pages than a table row has) makes the whole row NaN, and a block whose
// page entry is outside the cache scores NaN; no key outside the cache is
// read. Rows of a group share their keys' loads when they share a key
// source (contiguous keys, or one sequence); other groups run row by row.
// Fused use (skip_upto >= 0): rows with V <= skip_upto and blocks past V
// are not written at all (qsa_select reads neither), and the CTAs of tile 0
// write each row's position to positions_out, or -1 for a row whose device
// values are out of range (so the selection pads that row).
//
// Cost: each visible block's key is read once per row group (d * sizeof(K)
// bytes); (d / 16) * terms mma per 16 blocks and 8 columns.
#ifndef FLASHSEL_INDEXER_QSA_SCORE_CUH
#define FLASHSEL_INDEXER_QSA_SCORE_CUH

#include "common/types.cuh"
#include "indexer/common/key_mma.cuh"

namespace qsa {

// The bf16 terms, the key loaders, relu and the warp's mma chain are
// indexer/common/key_mma.cuh's.
using namespace fsidx;

enum : int {
    SCORE_THREADS = 256,  // threads per CTA (the host's indexer SCORE_THREADS)
    SCORE_WARPS = SCORE_THREADS / 32,
    MAX_HEADS = 16,
    MAX_DIM = 256,
    GROUP_NT = 2,         // query column tiles of the plain scorer's row groups (the host's SCORE_NT)
    MAX_GROUP_ROWS = 8 * GROUP_NT,  // rows of a group: 8 NT / hp, at most 16 (hp 1)
};

// The launch's parameter block (ops/indexer/device.rs ScoreParams).
struct ScoreParams {
    u64 q;           // [rows, heads, dim], f32 or bf16
    u64 kbar;        // [blocks, dim], or paged [cache_pages, per_page, dim]
    u64 positions;   // i32 [rows]
    u64 out;         // f32: row r at out + r * out_stride
    u64 page_table;  // i32 [sequences, max_pages]; 0: contiguous keys
    u64 seq_ids;     // i32 [rows] (paged)
    u64 positions_out;  // fused form: i32 [rows], the positions the selection reads
    long long out_stride;
    int rows, heads, blocks, ratio;
    int max_pages, per_page, cache_pages, sequences;
    int skip_upto;       // >= 0: the fused form (see the header)
    float scale;         // c, the f32 nearest 1 / sqrt(dim)
    int blocks_per_cta;  // a multiple of SCORE_THREADS
    int pad_;
};
static_assert(sizeof(ScoreParams) == 112, "ScoreParams layout (ops/indexer/device.rs)");

// Chunks a lane loads before its mma (bounded registers).
template <class K, int D, int NT>
__host__ __device__ constexpr int chunk_batch() {
    return K::BYTES == 2 && NT == 1 ? 2 : 1;
}

// A row's heads padded to a power of two (1, 2, 4, 8 or 16).
__device__ __forceinline__ int padded_heads(int h) { return h <= 1 ? 1 : h <= 2 ? 2 : h <= 4 ? 4 : h <= 8 ? 8 : 16; }
// Rows of a group of NT column tiles.
__device__ __forceinline__ int group_rows(int hp, int nt) { return hp <= 8 ? nt * 8 / hp : nt / 2; }


// The B fragments of a group's query columns, in shared memory: entry
// ((tq * KS + ks) * NT + nt) * 32 + lane holds lane's b0, b1 of step ks,
// tile nt, query term tq. Rows row0 .. row0 + nrows - 1, heads head0 ..
// head0 + heads - 1 (the other rows' and the padded heads' columns zero).
// Every thread calls it.
template <bool Q_BF16, int D, int NT>
__device__ __forceinline__ void load_query_frags(const ScoreParams& p, int row0, int nrows, int head0, int heads,
                                                 uint2* qf) {
    constexpr int KS = D / 16, TQ = Q_BF16 ? 1 : 3;
    const int hp = padded_heads(heads);
    for (int i = threadIdx.x; i < TQ * KS * NT * 32; i += SCORE_THREADS) {
        const int lane = i & 31, nt = (i >> 5) % NT, ks = ((i >> 5) / NT) % KS, tq = (i >> 5) / (NT * KS);
        const int col = nt * 8 + (lane >> 2);
        const int rr = hp <= 8 ? col / hp : col / 16, h = hp <= 8 ? col % hp : col % 16;
        const int dim0 = 32 * (ks >> 1) + 8 * (lane & 3) + 4 * (ks & 1);
        u32 v[4] = {0u, 0u, 0u, 0u};
        if (rr < nrows && h < heads) {
            const long long at = ((long long)(row0 + rr) * p.heads + head0 + h) * D + dim0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                v[e] = Q_BF16 ? ((const unsigned short*)p.q)[at + e] : f32_term(((const float*)p.q)[at + e], tq);
            }
        }
        qf[i] = make_uint2(pack2(v[0], v[1]), pack2(v[2], v[3]));
    }
}

// Block b's key (null: nothing to read: b >= limit, or a page outside the
// cache, which sets bad_page). table: the row's page-table row (paged keys).
template <class K, int D>
__device__ __forceinline__ const unsigned char* key_address(const ScoreParams& p, const int* table, int b, int limit,
                                                            bool& bad_page) {
    bad_page = false;
    if (b >= limit) return nullptr;
    long long at = b;
    if (p.page_table != 0) {
        const int page = table[b / p.per_page];
        bad_page = page < 0 || page >= p.cache_pages;
        at = (long long)page * p.per_page + b % p.per_page;
    }
    return bad_page ? nullptr : (const unsigned char*)p.kbar + at * (D * K::BYTES);
}

// Which of the group's rows a lane's finished sum (n, e) belongs to (see
// warp_scores), or -1 where the lane holds none: hp 1 has a row a column
// (e 0 and 1), wider rows one sum for a lane that ends their head tree.
__device__ __forceinline__ int sum_row(int hp, int lane, int n, int e) {
    const int t = lane & 3, col = 8 * n + 2 * t + e;
    if (hp == 1) return col;
    if (e != 0) return -1;
    if (hp == 2) return col >> 1;
    if (hp == 4) return (t & 1) ? -1 : col >> 2;
    if (hp == 8) return t == 0 ? n : -1;
    return t == 0 && (n & 1) ? n >> 1 : -1;  // sixteen heads: tiles 2r, 2r + 1
}

// The warp's 32 blocks (key_at: lane's own block's key, null: none) against
// the group's query columns (qf): for each block and each of the group's
// rows, the relu sum of its heads in the device order, unscaled. On return
// sum[m][n][2 j + e] is the sum of block 16 m + g + 8 j (g = lane / 4) and
// row sum_row(hp, lane, n, e) where that is >= 0 (other entries: scratch).
// Warp-uniform call.
template <bool Q_BF16, class K, int D, int NT>
__device__ __forceinline__ void warp_scores(const unsigned char* key_at, const uint2* qf, int heads, int lane,
                                            float (&acc)[2][NT][4]) {
    warp_dots<Q_BF16 ? 1 : 3, K, NT, chunk_batch<K, D, NT>()>(key_at, qf, D / 32, lane, acc);
    const int t = lane & 3;
    // The heads' relu sums, in place: lane (g, t) holds columns 8 n + 2t,
    // 8 n + 2t + 1 of blocks 16 m + g (entries 0, 1) and 16 m + g + 8 (2, 3).
    const int hp = padded_heads(heads);
    const int hmask = hp <= 8 ? hp - 1 : 15;  // a column's head: col & hmask
    // The lane's two heads: (8 n + 2 t) & hmask, the same for every n up to
    // 8 heads, 8 (n & 1) + 2 t at sixteen (keep[n & 1]).
    bool keep[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        const int h0 = (8 * n + 2 * t) & hmask;
        keep[n][0] = h0 < heads;
        keep[n][1] = h0 + 1 < heads;
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float prev = 0.f;  // sixteen heads: the first tile's tree
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const float x0 = acc[m][n][2 * j], x1 = acc[m][n][2 * j + 1];
                if (hp == 1) {
                    acc[m][n][2 * j] = relu(x0);
                    acc[m][n][2 * j + 1] = relu(x1);
                    continue;
                }
                float s = relu_if(x0, keep[n & 1][0]) + relu_if(x1, keep[n & 1][1]);
                if (hp >= 4) s = s + __shfl_xor_sync(FULL_MASK, s, 1);
                if (hp >= 8) s = s + __shfl_xor_sync(FULL_MASK, s, 2);
                if (hp == 16) {
                    if (n & 1) s = prev + s;
                    else prev = s;
                }
                acc[m][n][2 * j] = s;
            }
        }
}

// A visible block's score from its relu sum: NaN for a page outside the
// cache, else the scaled sum (NaN payloads made the one NaN).
__device__ __forceinline__ float finish_score(float s, bool bad_page, float scale) {
    const float score = s * scale;
    return bad_page || isnan(score) ? __uint_as_float(0x7fc00000u) : score;
}

// Lanes that hold the same finished sums after the head tree (t's low
// bits): 1 at hp 1 and 2, 2 at hp 4 (t, t ^ 1), 4 at hp 8 and 16.
__host__ __device__ constexpr int sum_replicas(int hp) { return hp <= 2 ? 1 : hp == 4 ? 2 : 4; }
// Slots (n, e) a lane's finished sums use: e 1 at hp 1 only.
__host__ __device__ constexpr int sum_slots(int hp) { return hp == 1 ? 2 : 1; }
// sum_row for every lane that holds the sum (the row of its first replica).
__device__ __forceinline__ int slot_row(int hp, int lane, int n, int e) {
    return sum_row(hp, lane & ~(sum_replicas(hp) - 1), n, e);
}

// A lane's write slots for a run whose first row is `first`: dst[n] the row
// of slot (n, 0) (slot (n, 1), hp 1 only: the next row), upto[n][e] =
// limit(rr) for the slot's row rr of the run, 0 where this lane writes
// nothing. shared: the replica lanes share the writes (write_sums with R =
// sum_replicas(hp)); else the first replica writes them all (R = 1).
template <int NT, typename Limit>
__device__ __forceinline__ void lane_slots(const ScoreParams& p, int hp, int lane, bool shared, long long first,
                                           Limit limit, float* (&dst)[NT], int (&upto)[NT][2]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int rr = shared ? slot_row(hp, lane, n, e) : sum_row(hp, lane, n, e);
            upto[n][e] = rr >= 0 ? limit(rr) : 0;
        }
        dst[n] = (float*)p.out + (first + max(slot_row(hp, lane, n, 0), 0)) * p.out_stride;
    }
}

// A warp's 32 blocks g0 .. g0 + 31 written from warp_scores' sums: the sum
// of (block b, slot (n, e)) goes to dst[n] + e * out_stride + b where b <
// upto[n][e] (rows by slot_row); bad: the blocks whose page entry is
// outside the cache. R = sum_replicas, E = sum_slots of the rows' padded
// heads: the R lanes that hold a sum share its writes, lane t taking the
// entries (m, j) with (2 m + j) % R == t % R, so every lane writes 4 E / R
// of its (m, j, e) entries a tile.
template <int NT, int R, int E>
__device__ __forceinline__ void write_sums(const ScoreParams& p, int g0, u32 bad, const float (&sum)[2][NT][4],
                                           float* const (&dst)[NT], const int (&upto)[NT][2], int lane) {
    const int g = lane >> 2, rho = lane & (R - 1);
#pragma unroll
    for (int q0 = 0; q0 < 4; q0 += R) {
        const int q = q0 + rho;  // the entry (m, j) = (q >> 1, q & 1)
        const int i = 16 * (q >> 1) + g + 8 * (q & 1), b = g0 + i;
        const bool bad_i = (bad >> i) & 1u;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < E; ++e) {
                float s;
                if (R == 1) {
                    s = sum[q0 >> 1][n][2 * (q0 & 1) + e];
                } else if (R == 2) {  // m = q0 / 2, j = rho
                    s = rho ? sum[q0 >> 1][n][2] : sum[q0 >> 1][n][0];
                } else {  // m = rho / 2, j = rho % 2
                    const float s0 = rho & 1 ? sum[0][n][2] : sum[0][n][0];
                    const float s1 = rho & 1 ? sum[1][n][2] : sum[1][n][0];
                    s = rho & 2 ? s1 : s0;
                }
                if (b < upto[n][e]) dst[n][e * p.out_stride + b] = finish_score(s, bad_i, p.scale);
            }
    }
}

// The scorer's row checks: the row's V, or -1 for a row whose device values
// are out of range (a negative position, V > blocks, a sequence outside the
// page table, more pages than a table row has); seq: its sequence (paged).
__device__ __forceinline__ int row_visible(const ScoreParams& p, int row, int& seq) {
    const long long t = ((const int*)p.positions)[row];
    long long v = t < 0 ? -1 : (t + 1) / p.ratio;
    seq = 0;
    if (v > p.blocks) v = -1;
    if (v >= 0 && p.page_table != 0) {
        seq = ((const int*)p.seq_ids)[row];
        const long long pages = (v + p.per_page - 1) / p.per_page;
        if (seq < 0 || seq >= p.sequences || pages > p.max_pages) v = -1;
    }
    return (int)v;
}

// A group's row row0 + threadIdx.x: its V (vis) and sequence (seqs), and in
// the fused form (CTAs of tile 0) the position the selection reads (-1: a
// row out of range).
__device__ __forceinline__ void check_row(const ScoreParams& p, int row0, int* vis, int* seqs) {
    const int i = threadIdx.x, row = row0 + i;
    int seq;
    const int v = row_visible(p, row, seq);
    vis[i] = v;
    seqs[i] = seq;
    if (p.skip_upto >= 0 && blockIdx.x == 0) ((int*)p.positions_out)[row] = v < 0 ? -1 : ((const int*)p.positions)[row];
}

// The plain form's fill of a group's blocks [tile0, tile_end) past each
// row's V: -inf, all of a bad row NaN. Every thread calls it.
__device__ __forceinline__ void fill_past_visible(const ScoreParams& p, int row0, int nrows, const int* vis, int tile0,
                                                  int tile_end) {
    for (int rr = 0; rr < nrows; ++rr) {
        const int v = vis[rr];
        float* out = (float*)p.out + (long long)(row0 + rr) * p.out_stride;
        const float fill = v < 0 ? __uint_as_float(0x7fc00000u) : __uint_as_float(0xff800000u);
        for (int b = max(tile0, v) + threadIdx.x; b < tile_end; b += SCORE_THREADS) out[b] = fill;
    }
}

// Bytes of the B fragments of NT column tiles (the host's query_frag_bytes).
template <bool Q_BF16, int D, int NT>
__host__ __device__ constexpr int query_frag_bytes() { return (Q_BF16 ? 1 : 3) * (D / 16) * NT * 32 * 8; }

// One run of a row group: len consecutive rows (group rows r0 ..) that read
// keys from one source (table: their page-table row), scored over blocks
// [tile0, end) with NT column tiles (len * hp <= 8 NT). vis: the group's
// rows' V; rows with V <= lim write nothing. Every thread calls it.
template <bool Q_BF16, class K, int D, int NT>
__device__ __forceinline__ void score_run(const ScoreParams& p, const int* vis, int row0, int r0, int len,
                                          const int* table, int tile0, int end, int lim, uint2* qf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hp = padded_heads(p.heads);
    __syncthreads();  // the previous run's fragments are read
    load_query_frags<Q_BF16, D, NT>(p, row0 + r0, len, 0, p.heads, qf);
    __syncthreads();
    // The rows of this lane's sums: their outputs (slot e 1, for hp 1 only,
    // is the next row) and the blocks they write (V, or 0 for a slot that
    // writes nothing).
    // f32 keys (registers): the first replica writes every sum; others: the
    // replicas share the writes.
    constexpr bool SHARED = K::TERMS == 1;
    float* dst[NT];
    int upto[NT][2];
    lane_slots<NT>(p, hp, lane, SHARED, (long long)row0 + r0, [&](int rr) {
        const int v = rr < len ? vis[r0 + rr] : 0;
        return v > lim ? v : 0;
    }, dst, upto);
#pragma unroll 1
    for (int g0 = tile0 + warp * 32; g0 < end; g0 += SCORE_WARPS * 32) {
        bool bad_page;
        const unsigned char* key_at = key_address<K, D>(p, table, g0 + lane, end, bad_page);
        const u32 bad = __ballot_sync(FULL_MASK, bad_page);
        float sum[2][NT][4];
        warp_scores<Q_BF16, K, D, NT>(key_at, qf, p.heads, lane, sum);
        switch (SHARED ? hp : 1) {  // warp-uniform
        case 1: write_sums<NT, 1, 2>(p, g0, bad, sum, dst, upto, lane); break;
        case 2: write_sums<NT, 1, 1>(p, g0, bad, sum, dst, upto, lane); break;
        case 4: write_sums<NT, 2, 1>(p, g0, bad, sum, dst, upto, lane); break;
        default: write_sums<NT, 4, 1>(p, g0, bad, sum, dst, upto, lane); break;
        }
    }
}

// The kernel body: Q the query dtype (true: bf16, false: f32), K the key
// type. gridDim.y CTAs loop over the row groups of group_rows(hp,
// GROUP_NT) rows; a run whose columns fit one tile (len * hp <= 8: a
// decode row, rows of distinct sequences) is scored with one tile, so that
// no mma multiplies padding (the bits are the same: a column's sum does
// not depend on the tile that holds it); f32 keys keep GROUP_NT tiles.
template <bool Q_BF16, class K, int D>
__device__ __forceinline__ void score_impl(const ScoreParams& p) {
    uint2* qf = reinterpret_cast<uint2*>(dyn_smem);  // query_frag_bytes<Q_BF16, D, GROUP_NT>()
    __shared__ int vis[MAX_GROUP_ROWS], seqs[MAX_GROUP_ROWS];
    __shared__ int run_len[MAX_GROUP_ROWS];  // a run's rows share the key source
    const int tid = threadIdx.x;
    const int tile0 = blockIdx.x * p.blocks_per_cta;
    const int tile_end = min(tile0 + p.blocks_per_cta, p.blocks);
    const bool fused = p.skip_upto >= 0;
    const int hp = padded_heads(p.heads), gr = group_rows(hp, GROUP_NT);
    const int groups = (p.rows + gr - 1) / gr;
    for (int grp = blockIdx.y; grp < groups; grp += gridDim.y) {
        const int row0 = grp * gr, nrows = min(gr, p.rows - row0);
        if (tid < nrows) check_row(p, row0, vis, seqs);
        __syncthreads();
        if (tid == 0) {
            // Runs of consecutive rows that read keys from one source.
            int i = 0;
            while (i < nrows) {
                int j = i + 1;
                while (j < nrows && vis[i] >= 0 && vis[j] >= 0 && seqs[j] == seqs[i]) ++j;
                run_len[i] = j - i;
                i = j;
            }
        }
        __syncthreads();
        // The plain form fills the blocks past each row's V (all of a bad
        // row: NaN); the fused form writes neither.
        if (!fused) fill_past_visible(p, row0, nrows, vis, tile0, tile_end);
        // Rows with V <= lim write nothing (fused: the rows the selection
        // copies; plain: none).
        const int lim = fused ? p.skip_upto : -1;
        for (int r0 = 0; r0 < nrows; r0 += run_len[r0]) {
            const int len = run_len[r0];
            int vmax = 0;
            for (int rr = r0; rr < r0 + len; ++rr)
                if (vis[rr] > lim) vmax = max(vmax, vis[rr]);
            const int end = min(tile_end, vmax);
            if (vis[r0] < 0 || end <= tile0) continue;
            const int* table = (const int*)p.page_table + (long long)seqs[r0] * p.max_pages;
            if (K::TERMS == 1 && len * hp <= 8)  // f32 keys: one form (registers)
                score_run<Q_BF16, K, D, 1>(p, vis, row0, r0, len, table, tile0, end, lim, qf);
            else
                score_run<Q_BF16, K, D, GROUP_NT>(p, vis, row0, r0, len, table, tile0, end, lim, qf);
        }
        __syncthreads();  // vis, seqs, run_len and qf are rewritten for the next group
    }
}

}  // namespace qsa

#endif  // FLASHSEL_INDEXER_QSA_SCORE_CUH
