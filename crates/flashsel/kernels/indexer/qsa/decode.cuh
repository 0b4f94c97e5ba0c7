// The fused decode indexer: a row's block scores (score.cuh's arithmetic,
// the same bits) kept in shared memory, selected exactly across the row's
// CTAs, and written as token ids: the [rows, NB] scores never reach global
// memory. Its bytes are qsa_select(qsa_scores(...)) on the same inputs
// (ops/indexer/device.rs; the ids contract is select/tokens.cuh's).
//
// Grid: P CTAs a row (`ctas`), R rows in flight (`slots`): CTA x serves
// rows x / P, x / P + R, ...; the launch is cooperative (every CTA
// resident), so a row's CTAs can wait on each other.
//
// Algorithm, per row with V > k (the selection's length; other rows select
// nothing and write only their tail tokens or -1):
//   1. SCORE: the CTA's chunk of [0, V) (chunk_range: work follows V, not
//      the buffer) is scored by score.cuh's warp loop into shared memory as
//      order keys (the selection's order_key<32> of the f32 score).
//   2. SELECT: MSD radix passes over the 32-bit keys, digits of 11, 11 and
//      10 bits: each CTA's histogram of the keys under the decided prefix
//      goes to the row's global histogram of the pass (atomics), the row's
//      CTAs meet (grid_barrier), and every CTA finds the same crossing bin
//      from the top. The passes stop when the crossing bin is wanted whole
//      or is one key. Then each CTA publishes its count of keys above the
//      crossing bin (gt) and in it (eq), and the row's CTAs meet once more:
//      the crossing bin's r wanted keys are its lowest columns, and chunks
//      are column ranges in CTA order, so CTA p takes
//      min(eq_p, r - min(r, sum of eq before p)) of its own, lowest first.
//   3. WRITE: index order: one ordered scan of the chunk collects CTA p's
//      selected blocks in column order in shared memory; then every thread
//      writes their ids at slots from (gt and taken before p), so the
//      page-table loads of mapped ids overlap. Score order: the same scan
//      writes the row's composites (key, column) to a list, the CTAs meet,
//      and each ranks its share of the list against all of it (the entries
//      above it: a unique rank, the select contract's order). Then each CTA
//      writes its share of the tail tokens and -1 padding; CTA 0 the count.
//
// The host zeroes the rows' state with fs_grid_init_all just before; on
// sm_90+ this kernel launches programmatically, scores, and waits for the
// zeroes (PDL_WAIT) before its first use of the state.
//
// The cluster form (P.cluster, sm_90+; rows of at most DEC_CLUSTER_MAX CTAs
// of at most 512 blocks, in batches of at most a CTA an SM,
// ops/indexer/device.rs decode_plan): a
// row's CTAs are one thread-block cluster, so they meet at cluster barriers
// and read each other's histograms and counts from shared memory
// (common/cluster.cuh): no state, no init kernel, no cooperative launch.
// Every step above is the same but the digits, four of 8 bits (256 bins: a
// pass's clear, scan and remote reads one bin a thread), so are the bytes
// (the selection is exact whatever its digits); the histograms alternate
// between two halves of the scratch by pass, a CTA's half being read by the
// others until the next pass's barrier. Measured (perf-log v44): 1 x 4,096
// tokens 12.19 -> 9.72 us against the grid form; slower with 8 CTAs a row
// (a pass's remote reads grow with the CTAs) and where the batch's clusters
// do not all fit at once.
//
// Invariants: exact on every input (the radix passes count every key, no
// bound or sample decides anything); a row's CTAs agree on every uniform
// decision (all read the same positions and the same global histograms);
// the state (per row, DEC_STATE_WORDS words) is zeroed before its use;
// device values out of range pad the row (score.cuh's and tokens.cuh's
// rules, in the chain's order) and read nothing out of bounds.
//
// Cost: the scorer's (each visible block's key read once) plus, per row,
// 2 to 5 global row barriers (the cluster form: 2 to 6 cluster barriers,
// and one more a CTA at its end) and, per CTA, three to six passes over its
// chunk in shared memory; global traffic besides the keys is the histograms' bins,
// the ids, and (score order) the k composites. Measured (perf-log v37):
// the selection adds ~11 us to the scoring at 1M tokens (264 CTAs), its
// passes' latency chains.
#ifndef FLASHSEL_INDEXER_QSA_DECODE_CUH
#define FLASHSEL_INDEXER_QSA_DECODE_CUH

#include "common/cluster.cuh"
#include "common/keys.cuh"
#include "common/pdl.cuh"
#include "common/sync.cuh"
#include "indexer/qsa/score.cuh"
#include "select/tokens.cuh"

namespace qsa {

enum : int {
    DEC_THREADS = SCORE_THREADS,
    DEC_WARPS = DEC_THREADS / 32,
    DEC_BINS = 2048,      // the widest digit, 11 bits
    DEC_DIGIT = 11,       // bits a digit (the last one: what is left)
    DEC_PASSES = (32 + DEC_DIGIT - 1) / DEC_DIGIT,  // 3: digits of 11, 11 and 10 bits
    DEC_CLUSTER_DIGIT = 8,                          // the cluster form's: 256 bins, one a thread
    DEC_CLUSTER_PASSES = 32 / DEC_CLUSTER_DIGIT,    // 4
    DEC_MAX_CTAS = 1024,  // CTAs a row (the per-CTA counts' room)
    DEC_HDR = 32,         // the barrier counter's 128-byte line
    DEC_STATE_WORDS = DEC_HDR + DEC_PASSES * DEC_BINS + 2 * DEC_MAX_CTAS,
    DEC_MAX_K = 4096,     // score order stages k composites in the stage buffers
    DEC_CLUSTER_MAX = 4,  // CTAs a row in the cluster form (the host's DECODE_CLUSTER_MAX_CTAS)
};
enum : int { DEC_SCRATCH_BYTES = 32768 };  // the histogram and picked columns, or the staged list
static_assert(DEC_MAX_K * 8 <= DEC_SCRATCH_BYTES, "the staged list fits the scratch");
static_assert(DEC_CLUSTER_PASSES * DEC_CLUSTER_DIGIT == 32 && (1 << DEC_CLUSTER_DIGIT) == DEC_THREADS,
              "the cluster form's digits: whole, one bin a thread");
static_assert(2 * DEC_BINS * 4 + DEC_MAX_K * 4 <= DEC_SCRATCH_BYTES, "two histograms and the picked columns fit the scratch");

// The launch's parameter block (ops/indexer/device.rs DecodeParams).
// tok_row (select/tokens.cuh) reads tok, lengths, cols and k.
struct DecodeParams {
    ScoreParams s;        // the scorer's (out, positions_out and blocks_per_cta unused)
    Tokens tok;           // the ids (tok.positions == s.positions)
    int* ids;             // i32 [rows, tok.width]
    u32* state;           // [rows, DEC_STATE_WORDS], zero at the launch
    u64* list;            // score order: [rows, k] composites; else unused
    const int* lengths;   // null (tok_row's range rows only)
    int cols;             // NB
    int k;                // k_blocks (<= DEC_MAX_K)
    int ctas;             // P, CTAs a row (<= DEC_MAX_CTAS)
    int slots;            // R, rows in flight: gridDim.x == P * R
    int tile_cap;         // the most blocks a CTA's chunk holds (a multiple of 8)
    int nan_largest;
    int order_index;
    int cluster;          // 1: the cluster form (a row's CTAs are one cluster; state unused)
};
static_assert(sizeof(DecodeParams) == 240, "DecodeParams layout (ops/indexer/device.rs)");

// Scratch after the chunk's keys in dynamic shared memory.
struct DecShared {
    TokRow tr;
    int key_seq;
    u32 part_a[DEC_WARPS], part_b[DEC_WARPS];
    u32 bin, above, cnt, pad_;
    u32 gt_mine, eq_mine;  // the cluster form: this CTA's counts, read by the others
};
static_assert(sizeof(DecShared) <= 128, "the host's decode_fixed_smem reserves 128 bytes");

// Every thread gets the CTA's sums of a and b (two barriers).
__device__ __forceinline__ void dec_sum2(DecShared& sh, u32& a, u32& b) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 wa = __reduce_add_sync(FULL_MASK, a), wb = __reduce_add_sync(FULL_MASK, b);
    if (lane == 0) {
        sh.part_a[warp] = wa;
        sh.part_b[warp] = wb;
    }
    __syncthreads();
    a = 0;
    b = 0;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) {
        a += sh.part_a[w];
        b += sh.part_b[w];
    }
    __syncthreads();
}

// Thread t's bins [t per, t per + per) of the row's histogram of a pass
// (per = nb / DEC_THREADS): the row's global sums `gh` (the grid form: per
// 8 or 4), or the sums over the cluster's CTAs of their shared histograms
// at `hist` (the cluster form: per 1; in rank order, integer sums: any
// order is exact).
__device__ __forceinline__ void dec_bins(const DecodeParams& P, const u32* gh, const u32* hist, u32 per,
                                         u32 (&c)[8]) {
    const int tid = threadIdx.x;
    uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0;
    if (P.cluster) {
        // Every rank's load issued before the first sum (in flight at once:
        // one remote round trip, not one a rank).
        const u32 at = smem_at(hist + tid);
        u32 x[DEC_CLUSTER_MAX];
#pragma unroll
        for (int q = 0; q < DEC_CLUSTER_MAX; ++q) x[q] = q < P.ctas ? cluster_ld(cluster_map(at, (u32)q)) : 0u;
#pragma unroll
        for (int q = 0; q < DEC_CLUSTER_MAX; ++q) v0.x += x[q];
    } else {
        v0 = ld_relaxed_v4(gh + tid * per);
        if (per == 8) v1 = ld_relaxed_v4(gh + tid * per + 4);
    }
    c[0] = v0.x, c[1] = v0.y, c[2] = v0.z, c[3] = v0.w;
    c[4] = v1.x, c[5] = v1.y, c[6] = v1.z, c[7] = v1.w;
}

// The crossing bin of the row's histogram (nb bins: 2048 or 1024, the
// cluster form 256; thread t
// holding bins [t per, t per + per) in c, dec_bins) from the top: the bin b
// with above < r <= above + cnt, above the count in the bins above b.
// Every thread returns the same triple.
__device__ __forceinline__ void dec_crossing(DecShared& sh, const u32 (&c)[8], u32 per, u32 r, u32& b, u32& above,
                                             u32& cnt) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32 s = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) s += c[j];
    // Suffix sums: the bins of the threads above this one.
    u32 incl = s;  // this thread's and the higher lanes' of the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 y = __shfl_down_sync(FULL_MASK, incl, o);
        if (lane + o < 32) incl += y;
    }
    if (lane == 0) sh.part_a[warp] = incl;  // the warp's total
    __syncthreads();
    u32 higher = 0;  // the warps above this one
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) higher += w > warp ? sh.part_a[w] : 0u;
    const u32 top = higher + incl - s;  // above this thread's bins
    if (top < r && r <= top + s) {
        u32 acc = top;
#pragma unroll
        for (int j = 7; j >= 0; --j) {
            if ((u32)j < per && acc < r && r <= acc + c[j]) {
                sh.bin = tid * per + j;
                sh.above = acc;
                sh.cnt = c[j];
            }
            if ((u32)j < per) acc += c[j];
        }
    }
    __syncthreads();
    b = sh.bin;
    above = sh.above;
    cnt = sh.cnt;
    __syncthreads();
}

// Row `row`'s selection of its k best blocks among [0, V), the CTA's part
// (steps 1 to 3 of the header); returns after its ids are written.
// The CTA's chunk [start, end) of row `row` scored into sk as order keys:
// one column tile; more than eight heads in two passes (heads 0 .. 7, then
// the rest), whose sums add as score.cuh's sixteen-head tree does (the pass
// keeps its half in sk as f32 bits; the same lane writes both).
template <bool Q_BF16, class K, int D>
__device__ __forceinline__ void score_chunk(const DecodeParams& P, int row, int key_seq, u32 start, u32 end, uint2* qf,
                                            u32* sk) {
    const ScoreParams& p = P.s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int* table = (const int*)p.page_table + (long long)key_seq * p.max_pages;
    const int passes = p.heads > 8 ? 2 : 1;
#pragma unroll 1
    for (int pass = 0; pass < passes; ++pass) {
        const int h0 = 8 * pass, hn = passes == 1 ? p.heads : min(8, p.heads - h0);
        if (pass > 0) __syncthreads();  // every warp is done with the first half's fragments
        load_query_frags<Q_BF16, D, 1>(p, row, 1, h0, hn, qf);
        __syncthreads();
        // This lane holds row 0's sums; its R replicas share the writes, lane
        // t taking the entries (m, j) with (2 m + j) % R == t % R.
        const int hp = padded_heads(hn), R = sum_replicas(hp), rho = lane & (R - 1);
        const bool mine = slot_row(hp, lane, 0, 0) == 0;
#pragma unroll 1
        for (u32 g0 = start + (u32)warp * 32u; g0 < end; g0 += SCORE_WARPS * 32) {
            bool bad_page;
            const unsigned char* key_at = key_address<K, D>(p, table, (int)g0 + lane, (int)end, bad_page);
            const u32 bad = __ballot_sync(FULL_MASK, bad_page);
            float sum[2][1][4];
            warp_scores<Q_BF16, K, D, 1>(key_at, qf, hn, lane, sum);
            if (!mine) continue;
#pragma unroll 1
            for (int q0 = 0; q0 < 4; q0 += R) {  // R is warp-uniform
                const int q = q0 + rho;  // the entry (m, j) = (q >> 1, q & 1)
                const int i = 16 * (q >> 1) + (lane >> 2) + 8 * (q & 1);
                const u32 b = g0 + (u32)i;
                if (b < end) {
                    const float s0 = q & 1 ? sum[0][0][2] : sum[0][0][0], s1 = q & 1 ? sum[1][0][2] : sum[1][0][0];
                    float s = q & 2 ? s1 : s0;
                    u32& o = sk[b - start];
                    if (passes == 2 && pass == 0) {
                        o = __float_as_uint(s);
                        continue;
                    }
                    if (passes == 2) s = __uint_as_float(o) + s;
                    o = order_key<32>(__float_as_uint(finish_score(s, (bad >> i) & 1u, p.scale)), P.nan_largest);
                }
            }
        }
    }
}

template <bool Q_BF16, class K, int D>
__device__ __forceinline__ void decode_select(const DecodeParams& P, int row, int cta, const TokRow& tr, int key_seq,
                                              uint2* qf, unsigned char* bufs, u32* sk, DecShared& sh) {
    const ScoreParams& p = P.s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int len = tr.len;
    const u32 m = (u32)P.k;
    const u32 lenm1 = (u32)len - 1u;
    u32 start, end;
    chunk_range(len, P.ctas, cta, start, end);
    const u32 n = end - start;
    if (n > (u32)P.tile_cap) __trap();  // the host sizes tile_cap for every chunk

    // 1. SCORE into sk as order keys.
    score_chunk<Q_BF16, K, D>(P, row, key_seq, start, end, qf, sk);
    __syncthreads();

    // 2. SELECT: the radix passes.
    u32* st = P.state + (long long)row * DEC_STATE_WORDS;
    u32* bar = st;
    u32 arrivals = 0;
    u32 r = m, prefix = 0;
    int hi = 32;
    PDL_WAIT();  // the state's zeroes (fs_grid_init_all) before its first use
    // Digits from the top: 11, 11 and 10 bits (the grid form: each pass a
    // row barrier), or 8 bits four times (the cluster form: a pass's clear,
    // scan and remote reads one bin a thread; its barriers are cheap).
    const int digit = P.cluster ? DEC_CLUSTER_DIGIT : DEC_DIGIT;
    const int passes = P.cluster ? DEC_CLUSTER_PASSES : DEC_PASSES;
#pragma unroll 1
    for (int pass = 0; pass < passes; ++pass) {
        const int lo = hi > digit ? hi - digit : 0;
        const u32 nb = 1u << (hi - lo);
        // The CTA's histogram of the pass, in the scratch's two halves by
        // pass parity: the cluster form's CTAs read each other's after the
        // pass's barrier, so a half is cleared again only after the next
        // pass's barrier (or the next row's), once every CTA has read it.
        u32* hist = reinterpret_cast<u32*>(bufs) + (pass & 1) * DEC_BINS;
        for (u32 i = tid; i < nb; i += DEC_THREADS) hist[i] = 0u;
        __syncthreads();
        for (u32 i = tid; i < n; i += DEC_THREADS) {
            const u32 x = sk[i];
            if (hi >= 32 || (x >> hi) == prefix) atomicAdd(&hist[(x >> lo) & (nb - 1u)], 1u);
        }
        u32* gh = st + DEC_HDR + pass * DEC_BINS;  // (the grid form: pass < DEC_PASSES)
        if (P.cluster) {
            cluster_sync();  // every CTA's bins counted
        } else {
            __syncthreads();
            for (u32 i = tid; i < nb; i += DEC_THREADS) {
                const u32 c = hist[i];
                if (c) atomicAdd(gh + i, c);
            }
            arrivals += (u32)P.ctas;
            grid_barrier(bar, arrivals);
        }
        const u32 per = nb / DEC_THREADS;  // bins a thread
        u32 c[8];
        dec_bins(P, gh, hist, per, c);
        u32 b, above, cnt;
        dec_crossing(sh, c, per, r, b, above, cnt);
        r -= above;
        prefix = (prefix << (hi - lo)) | b;
        hi = lo;
        if (cnt == r) break;  // uniform: the bin is wanted whole
    }
    // Keys with (key >> hi) > prefix are selected; of those == prefix (the
    // crossing bin), r: the lowest columns.
    u32 gt = 0, eq = 0;
    for (u32 i = tid; i < n; i += DEC_THREADS) {
        const u32 top = sk[i] >> hi;
        gt += top > prefix;
        eq += top == prefix;
    }
    dec_sum2(sh, gt, eq);
    u32 gt_before = 0, eq_before = 0;
    if (P.cluster) {
        // (Another CTA rewrites its counts only in a later row, after that
        // row's first pass barrier, which this CTA reaches after these reads.)
        if (tid == 0) {
            sh.gt_mine = gt;
            sh.eq_mine = eq;
        }
        cluster_sync();
        if (tid < cta) {  // cta < DEC_CLUSTER_MAX < DEC_THREADS
            gt_before = cluster_ld(cluster_map(smem_at(&sh.gt_mine), (u32)tid));
            eq_before = cluster_ld(cluster_map(smem_at(&sh.eq_mine), (u32)tid));
        }
    } else {
        u32* gts = st + DEC_HDR + DEC_PASSES * DEC_BINS;
        u32* eqs = gts + DEC_MAX_CTAS;
        if (tid == 0) {
            gts[cta] = gt;
            eqs[cta] = eq;
        }
        arrivals += (u32)P.ctas;
        grid_barrier(bar, arrivals);
        for (int q = tid; q < cta; q += DEC_THREADS) {
            gt_before += __ldcg(gts + q);
            eq_before += __ldcg(eqs + q);
        }
    }
    dec_sum2(sh, gt_before, eq_before);
    const u32 taken_before = eq_before < r ? eq_before : r;
    const u32 take = eq < r - taken_before ? eq : r - taken_before;  // this CTA's crossing-bin keys selected
    const u32 base = gt_before + taken_before;                         // this CTA's first slot
    int* out_row = P.ids + (long long)row * P.tok.width;
    u64* list = P.list + (long long)row * P.k;

    // 3. WRITE: one ordered scan of the chunk (rounds of DEC_THREADS keys)
    // puts the CTA's selected columns in order (index order: into shared
    // memory, then written by every thread at once, so the page-table loads
    // of mapped ids overlap instead of waiting a round each; score order:
    // the composites into the row's list).
    u32* picked = reinterpret_cast<u32*>(bufs) + 2 * DEC_BINS;  // after the histograms: <= k columns
    const u32 mine = gt + take;
    if (mine > 0) {  // uniform
        u32 gt_run = 0, eq_run = 0;  // the CTA's keys above / in the bin before this round
        const u32 lt_mask = (1u << lane) - 1u;
#pragma unroll 1
        for (u32 i0 = 0; i0 < n; i0 += DEC_THREADS) {
            const u32 i = i0 + tid;
            const u32 x = i < n ? sk[i] : 0u;
            const u32 top = x >> hi;
            const bool g = i < n && top > prefix, e = i < n && top == prefix;
            const u32 bg = __ballot_sync(FULL_MASK, g), be = __ballot_sync(FULL_MASK, e);
            if (lane == 0) {
                sh.part_a[warp] = __popc(bg);
                sh.part_b[warp] = __popc(be);
            }
            __syncthreads();
            u32 og = gt_run, oe = eq_run, tg = 0, te = 0;
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) {
                const u32 a = sh.part_a[w], c = sh.part_b[w];
                og += w < warp ? a : 0u;
                oe += w < warp ? c : 0u;
                tg += a;
                te += c;
            }
            __syncthreads();
            const u32 gb = og + __popc(bg & lt_mask), eb = oe + __popc(be & lt_mask);
            if (g || (e && eb < take)) {
                const u32 at = gb + (eb < take ? eb : take);  // the CTA's selected keys before it
                const u32 col = start + i;
                if (P.order_index)
                    picked[at] = col;
                else
                    list[base + at] = composite(x, col);
            }
            gt_run += tg;
            eq_run += te;
            if (gt_run == gt && eq_run >= take) break;  // uniform: nothing selected further on
        }
        if (P.order_index) {
            __syncthreads();
#pragma unroll 1
            for (u32 e = tid; e < mine; e += DEC_THREADS) tok_put(P.tok, tr, out_row, base + e, picked[e]);
        }
    }
    if (!P.order_index) {
        // Score order: rank this CTA's share of the row's list against all of it.
        if (P.cluster) {
            cluster_sync();  // the list's global writes, at cluster scope
        } else {
            arrivals += (u32)P.ctas;
            grid_barrier(bar, arrivals);
        }
        u64* stage = reinterpret_cast<u64*>(bufs);
        for (u32 j = tid; j < m; j += DEC_THREADS) stage[j] = __ldcg(list + j);
        __syncthreads();
        const u32 e_lo = (u32)((u64)m * cta / P.ctas), e_hi = (u32)((u64)m * (cta + 1) / P.ctas);
#pragma unroll 1
        for (u32 e = e_lo + warp; e < e_hi; e += DEC_WARPS) {  // a warp an entry
            const u64 x = stage[e];
            u32 above_x = 0;
            for (u32 j = lane; j < m; j += 32) above_x += stage[j] > x;
            above_x = __reduce_add_sync(FULL_MASK, above_x);
            const int base_tok = tr.start + (int)composite_col(x) * P.tok.ratio;
            for (int t = lane; t < P.tok.ratio; t += 32)
                out_row[above_x * (u32)P.tok.ratio + t] = tok_id(P.tok, tr, base_tok + t);
        }
    }
}

// The kernel body: Q the query dtype (true: bf16), K the key type.
template <bool Q_BF16, class K, int D>
__device__ __forceinline__ void decode_impl(const DecodeParams& P) {
    const ScoreParams& p = P.s;
    const int tid = threadIdx.x;
    const int cta = (int)blockIdx.x % P.ctas, slot = (int)blockIdx.x / P.ctas;
    // Dynamic shared memory (the host's decode_fixed_smem): the row's query
    // fragments (one column tile), the scratch (the histogram or
    // the staged list), the chunk's keys, DecShared.
    uint2* qf = reinterpret_cast<uint2*>(dyn_smem);
    unsigned char* bufs = reinterpret_cast<unsigned char*>(dyn_smem) + query_frag_bytes<Q_BF16, D, 1>();
    u32* sk = reinterpret_cast<u32*>(bufs + DEC_SCRATCH_BYTES);
    DecShared& sh = *reinterpret_cast<DecShared*>(sk + P.tile_cap);
    if (P.cluster) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
        __trap();  // the planner takes clusters on sm_90+ only
#endif
        // No state to wait for: the inputs are the stream's earlier work.
        CHAIN_WAIT();
        CHAIN_TRIGGER();
    }
#pragma unroll 1
    for (int row = slot; row < p.rows; row += P.slots) {
        if (tid == 0) {
            // The chain's order: the scorer's checks (a bad row: padding),
            // then the selection's (tok_row).
            int seq;
            const int v = row_visible(p, row, seq);
            sh.tr = v < 0 ? TokRow{0, 0, 0, 0, 0} : tok_row(P, row);
            sh.key_seq = seq;
        }
        __syncthreads();
        const TokRow tr = sh.tr;
        const int key_seq = sh.key_seq;
        const u32 m = tr.len > 0 ? (u32)P.k : 0u;  // tr.len: V when V > k, else 0
        if (m > 0) decode_select<Q_BF16, K, D>(P, row, cta, tr, key_seq, qf, bufs, sk, sh);
        // This CTA's share of what follows the selection: tail tokens, -1.
        int* out_row = P.ids + (long long)row * P.tok.width;
        const u32 sel = m * (u32)P.tok.ratio, rest = (u32)P.tok.width - sel;
        const u32 p_lo = (u32)((u64)rest * cta / P.ctas), p_hi = (u32)((u64)rest * (cta + 1) / P.ctas);
        for (u32 j = p_lo + tid; j < p_hi; j += DEC_THREADS) out_row[sel + j] = tok_rest(P.tok, tr, j);
        if (cta == 0 && tid == 0 && P.tok.counts) P.tok.counts[row] = tok_count(P.tok, tr, m);
        __syncthreads();  // sh and the shared buffers are rewritten for the next row
    }
    // The cluster form: no CTA exits while another may still read its
    // shared memory (its counts, read after the last row's count barrier).
    if (P.cluster) cluster_sync();
}

}  // namespace qsa

#endif  // FLASHSEL_INDEXER_QSA_DECODE_CUH
