// The context-parallel merge (module ShardMerge): R ranks' exact local top-k
// of each row (global ids and their values, the wire of src/ops/shard:
// ids i32 [R, rows, k], values [R, rows, k] in the score dtype's bits), to
// the exact global top-k under flashsel's contract: the same bytes as one
// device selecting over the whole row.
//
// ALGORITHM (three launches on one stream, src/ops/shard/device.rs)
//   1. sh_pack_b32 / sh_pack_b16, grid (rows, R): CTA (row, r) finds the
//      valid count n_q of every rank q <= r's block (a 32-way ballot search
//      for the first id < 0: a warp per rank, about log32(k) rounds), so
//      its block's offset o_r = sum_{q<r} n_q in the row's compacted list,
//      and copies its n_r ids and value bits there (row stride R * k).
//      CTA (row, R - 1) writes the row's length sum_q n_q. Each CTA also
//      checks its block (below) and writes its row-rank flag.
//   2. The select engine (CudaEngine::select_device) over the compacted
//      values: rows x (R * k) columns, the lengths of 1., the request's k,
//      NaN policy and order; its indices are positions in the compacted
//      row, its values the output values.
//   3. sh_write, grid (rows): each selected position becomes the id stored
//      there (plain), or (QSA, positions != 0) the block's `ratio` tokens,
//      then the row's unscored tail, -1, counts and page-table slots,
//      through the select kernels' own token write (select/tokens.cuh).
//
// INVARIANTS
//   - The wire the device merge takes: each rank's block lists its ids in
//     ascending order (flashsel's ranks select in index order), padded with
//     -1; the shards are contiguous and in rank order. So the compacted row
//     lists the candidates by ascending global id, and the engine's order
//     on it (larger key first, ties to the lower position; index order =
//     ascending position) is the contract's order on the ids: ties across
//     ranks to the lower global id, NaN by the policy, -0.0 == +0.0, values
//     keeping their bits, min(k, candidates) entries then -1 / -inf. The
//     global top k lies in the union of the ranks' top k (see
//     src/ops/shard/mod.rs), so the result is the whole row's selection,
//     whatever R, the shard sizes or k: nothing here is a fixed-size buffer
//     that could decide the answer.
//   - Device-resident wires cannot be checked by the host. A row where any
//     rank's block is not that form (an id outside [0, cols), a valid id
//     after a -1, ids not ascending within a block or across the ranks, a
//     QSA id outside the row's visible blocks) comes out as all -1 (values
//     -inf, count 0), as the select kernels treat out-of-range device
//     values; nothing out of bounds is read or written.
//   - Every loop with a barrier has a CTA-uniform bound.
//
// COST
//   Pack: each candidate read and written once (8 or 6 bytes), plus R
//   searches of ~3 dependent loads per CTA, in parallel over warps. The
//   engine: one selection over R * k columns a row (a short row: one CTA
//   a row in shared memory while it fits, the streaming paths beyond).
//   Write: k positions a row and one id load each (ratio ids and a page
//   load per id with a page table).
//
// A rank's local step (sh_local_len, sh_globalize, at the end of the file):
// its candidates clipped to its shard before its select, and its ids made
// global after it, for the NCCL-driven form.
//
// Compile-time values: FS_BLOCK (threads per CTA, for the shared headers).

#include "common/types.cuh"
#include "select/tokens.cuh"

struct MergeParams {
    const int* ids;       // [ranks, rows, k] global ids, -1 padded
    const void* values;   // [ranks, rows, k] value bits
    int* c_ids;           // [rows, ranks * k] compacted ids
    void* c_vals;         // [rows, ranks * k] compacted value bits
    int* c_len;           // [rows] compacted lengths
    int* bad;             // [rows, ranks] 1: the rank's block is malformed
    const int* pos;       // [rows, k] the engine's positions (sh_write)
    int* out_ids;         // [rows, width] the merged ids (sh_write)
    void* out_vals;       // nullable: [rows, k] the engine's values (sh_write: -inf on a bad row)
    const int* lengths;   // always null (tokens.cuh's row descriptor reads it for ranges)
    int ranks;
    int rows;
    int k;
    int cols;             // the global columns (QSA: the blocks NB)
    int elem;             // value bytes: 4 or 2
    int neg_inf;          // the dtype's -inf bits (a bad row's values)
    Tokens tok;           // QSA: positions, counts, ratio, width, pages; plain: width = k
};
static_assert(sizeof(MergeParams) == 168, "MergeParams layout changed: update src/ops/shard/device.rs");

// The first j in [0, k) with block[j] < 0 (k if none), assuming that
// predicate is monotone (a padded block); any value in [0, k] otherwise.
// The whole warp calls it with the same block.
__device__ __forceinline__ int valid_count(const int* block, int k, int lane) {
    int lo = 0, hi = k;  // the answer lies in [lo, hi]
    while (lo < hi) {
        const int step = (hi - lo + 31) / 32;
        const int j = lo + lane * step;
        const bool p = j < hi ? block[j] < 0 : true;
        const u32 m = __ballot_sync(FULL_MASK, p);
        if (m == 0) {
            lo = lo + 31 * step + 1;
        } else {
            const int f = __ffs(m) - 1;
            const int jf = lo + f * step;
            hi = jf < hi ? jf : hi;
            lo = f == 0 ? lo : lo + (f - 1) * step + 1;
        }
    }
    return lo;
}

// sh_pack: CTA (row, r) compacts rank r's block of the row.
template <typename Raw>
__device__ __forceinline__ void pack_impl(const MergeParams& P) {
    __shared__ long long s_off[WARPS];
    __shared__ int s_max[WARPS];
    __shared__ int s_n;
    __shared__ int s_bad;
    const int row = blockIdx.x, r = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long k = P.k;
    const long long plane = (long long)P.rows * k;
    // Ranks q < r: their counts (the offset) and the largest last id.
    long long off = 0;
    int last = -1;
    for (int q = warp; q <= r; q += WARPS) {
        const int* block = P.ids + q * plane + row * k;
        const int n = valid_count(block, P.k, lane);
        if (q < r) {
            off += n;
            if (n > 0) {
                const int l = block[n - 1];
                last = l > last ? l : last;
            }
        } else if (lane == 0) {
            s_n = n;
        }
    }
    if (lane == 0) {
        s_off[warp] = off;
        s_max[warp] = last;
    }
    if (threadIdx.x == 0) s_bad = 0;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < WARPS; ++w) {
            s_off[0] += s_off[w];
            s_max[0] = s_max[w] > s_max[0] ? s_max[w] : s_max[0];
        }
    }
    __syncthreads();
    const long long o = s_off[0];
    const int prev = s_max[0];
    const int n = s_n;
    const int* ids = P.ids + r * plane + row * k;
    const Raw* vals = (const Raw*)P.values + r * plane + row * k;
    const long long rk = (long long)P.ranks * k;
    int* cid = P.c_ids + row * rk + o;
    Raw* cval = (Raw*)P.c_vals + row * rk + o;
    bool bad = false;
    for (int j = threadIdx.x; j < P.k; j += FS_BLOCK) {
        const int id = ids[j];
        if (j < n) {
            const int before = j > 0 ? ids[j - 1] : prev;
            bad |= id < 0 || id >= P.cols || id <= before;
            cid[j] = id;
            cval[j] = vals[j];
        } else {
            bad |= id != -1;
        }
    }
    if (bad) s_bad = 1;
    __syncthreads();
    if (threadIdx.x == 0) {
        P.bad[(long long)row * P.ranks + r] = s_bad;
        if (r == P.ranks - 1) P.c_len[row] = (int)(o + n);
    }
}

extern "C" __global__ void __launch_bounds__(FS_BLOCK) sh_pack_b32(const MergeParams p) { pack_impl<u32>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK) sh_pack_b16(const MergeParams p) { pack_impl<u16>(p); }

// sh_write: CTA row writes the row's merged ids (plain: the ids at the
// engine's positions; QSA: their tokens, the tail, -1, counts, slots).
extern "C" __global__ void __launch_bounds__(FS_BLOCK) sh_write(const MergeParams P) {
    __shared__ int s_bad;
    __shared__ int s_m;
    const int row = blockIdx.x;
    const long long k = P.k;
    const int* pos = P.pos + row * k;
    const int* cid = P.c_ids + row * (long long)P.ranks * k;
    const bool qsa = P.tok.positions != nullptr;
    TokRow tr = {0, 0, 0, 0, 0};
    if (qsa) tr = tok_row(P, row);
    if (threadIdx.x == 0) {
        s_bad = 0;
        s_m = 0;
    }
    __syncthreads();
    // The row's flags; the selected count m (positions >= 0 come first).
    int bad = 0, m = 0;
    for (int q = threadIdx.x; q < P.ranks; q += FS_BLOCK) bad |= P.bad[(long long)row * P.ranks + q];
    for (int j = threadIdx.x; j < P.k; j += FS_BLOCK) {
        const int p = pos[j];
        if (p >= 0) {
            ++m;
            // A QSA block beyond the row's visible ones (or any on a row
            // that selects none): a malformed wire.
            if (qsa && cid[p] >= tr.len) bad = 1;
        }
    }
    if (bad) atomicOr(&s_bad, 1);
    if (m) atomicAdd(&s_m, m);
    __syncthreads();
    const bool dead = s_bad != 0;
    m = s_m;
    if (!qsa) {
        int* out = P.out_ids + row * k;
        for (int j = threadIdx.x; j < P.k; j += FS_BLOCK) {
            const int p = pos[j];
            out[j] = (dead || p < 0) ? -1 : cid[p];
        }
        if (dead && P.out_vals) {
            for (int j = threadIdx.x; j < P.k; j += FS_BLOCK) {
                if (P.elem == 4) {
                    ((u32*)P.out_vals)[row * k + j] = (u32)P.neg_inf;
                } else {
                    ((u16*)P.out_vals)[row * k + j] = (u16)P.neg_inf;
                }
            }
        }
        return;
    }
    const Tokens& T = P.tok;
    int* out = P.out_ids + (long long)row * T.width;
    if (dead || tr.tail_hi == 0) {
        // A malformed wire or an out-of-range row: only -1, count 0.
        for (int u = threadIdx.x; u < T.width; u += FS_BLOCK) out[u] = -1;
        if (T.counts && threadIdx.x == 0) T.counts[row] = 0;
        return;
    }
    const u32 sel = (u32)m * (u32)T.ratio;
    for (int j = threadIdx.x; j < m; j += FS_BLOCK) tok_put(T, tr, out, (u32)j, (u32)cid[pos[j]]);
    for (u32 u = sel + threadIdx.x; u < (u32)T.width; u += FS_BLOCK) out[u] = tok_rest(T, tr, u - sel);
    if (T.counts && threadIdx.x == 0) T.counts[row] = tok_count(T, tr, (u32)m);
}

// ---------------------------------------------------------------------------
// A rank's local step of the distributed selection (src/ops/shard/nccl.rs):
// sh_local_len before the rank's select, sh_globalize after it. Each thread
// one row (lengths) or one entry (ids); nothing else is read or written.

struct LocalParams {
    const int* lengths;    // nullable: i32 [rows] global candidate counts (topk)
    const int* positions;  // nullable: i32 [rows] query positions (QSA)
    int* local_len;        // i32 [rows] out: the row's candidates in the shard
    int* ids;              // i32 [rows, k]: local ids in, global ids out
    int rows;
    int k;
    int offset;            // the shard's first global column
    int shard_cols;        // its columns (0: nothing was selected)
    int cols;              // the global columns
    int ratio;             // QSA
    int k_blocks;          // QSA: rows with V <= k_blocks rank nothing
    int pad_;
};
static_assert(sizeof(LocalParams) == 64, "LocalParams layout changed: update src/ops/shard/nccl.rs");

// Row i's candidates in the shard: its global candidates 0 .. n clipped to
// offset .. offset + shard_cols, where n is lengths[i] (topk; 0 outside
// 0 ..= cols, so a bad row ranks nothing here and the merge pads it) or, for
// QSA, V = (t + 1) / ratio when V > k_blocks and 0 .. V is inside the row
// (else 0: a copy row reads no score; a bad row is padded by the merge).
extern "C" __global__ void __launch_bounds__(FS_BLOCK) sh_local_len(const LocalParams P) {
    const int i = blockIdx.x * FS_BLOCK + threadIdx.x;
    if (i >= P.rows) return;
    long long n;
    if (P.positions) {
        const long long t = P.positions[i];
        const long long v = t < 0 ? 0 : (t + 1) / P.ratio;
        n = (v > P.k_blocks && v <= P.cols) ? v : 0;
    } else {
        const long long l = P.lengths[i];
        n = (l < 0 || l > P.cols) ? 0 : l;
    }
    long long m = n - P.offset;
    m = m < 0 ? 0 : (m > P.shard_cols ? P.shard_cols : m);
    P.local_len[i] = (int)m;
}

// The rank's ids made global in place (-1 stays -1); an empty shard
// selected nothing, so its whole block is padding.
extern "C" __global__ void __launch_bounds__(FS_BLOCK) sh_globalize(const LocalParams P) {
    const long long j = (long long)blockIdx.x * FS_BLOCK + threadIdx.x;
    if (j >= (long long)P.rows * P.k) return;
    const int id = P.ids[j];
    P.ids[j] = (P.shard_cols == 0 || id < 0) ? -1 : id + P.offset;
}
