// The DSA indexer's scores on tensor cores (module IndexerDsa:
// indexer/dsa_scores.cu): for each query row t and key s of its range [starts[t], ends[t]),
//     score[t, s] = k_scale[s] * sum over h of w[t, h] * relu(q[t, h, :] . k[s, :]),
// -inf elsewhere, in the CUDA engine's device order (ops/dsa/mod.rs, "The
// CUDA engine's order"; its error bound: device_error_bound).
//
// ALGORITHM
//   Grid (rows, chunks of TC_KEYS keys). A CTA (128 threads, 4 warps) writes
//   its chunk of row t: -inf outside the row's range; inside it the warps
//   take runs of 32 keys (warp w: the runs starting at lo + 32 w, lo + 32 w
//   + 128, ...). The heads go in chunks of 32 (four 8-column tiles; 16 with f32
//   keys); for
//   each chunk the CTA builds the chunk's query fragments (bf16 terms, zero
//   columns past H) and weights in shared memory once, then every warp runs
//   its keys against them (indexer/common/key_mma.cuh's warp_dots: keys in
//   the A rows, heads in the B columns) and reduces each key's 64 columns:
//     p_h  = w[t, h] * relu(dot_h)                       (f32, rounded; +0.0 past H)
//     S_t  = (P_0 + P_1 + ... + P_{NT-1}), left to right, P_n = p_{8n+2t} + p_{8n+2t+1}
//            (lane t = lane & 3 of the key's quad holds columns 8n + 2t, +1)
//     S    = (S_0 + S_1) + (S_2 + S_3)                  (xor butterflies 1, 2)
//   and adds it to the key's running sum, acc = (+0.0 + S_chunk0) +
//   S_chunk1 ... (a warp's keys are its own in every chunk: kept in shared
//   memory between chunks, no barrier). Then score = acc * k_scale[s]
//   (with a scale), a NaN written as 0x7fc00000, a key whose page entry is
//   outside the cache -inf.
//
// INVARIANTS
//   - Every output element of the rows is written exactly once.
//   - Only keys inside a row's range are read (a lane past it loads
//     nothing); device ranges are clamped into 0..keys; a paged row whose
//     sequence is outside the table, or a key whose page is past the row's
//     pages or outside the cache, reads nothing and scores -inf.
//   - A score is a pure function of its row's and its key's values: the
//     same bits in any batch, chunk or run position (an mma's output
//     element depends on its own row and column only).
//
// COST
//   Per 32 keys and 64 heads: (d / 16) * terms(q) * terms(k) * 16 mma
//   (128 at d 128, bf16 or e4m3 q and k; each A pair decoded once for 4
//   tiles, each key read twice for 64 heads, the second from L1 / L2), 64 relu-weight products and 64
//   adds a lane, 3 shuffles; each key read once per head chunk; the
//   query fragments built once a CTA and chunk (TC_KEYS keys).
#ifndef FLASHSEL_INDEXER_DSA_TC_CUH
#define FLASHSEL_INDEXER_DSA_TC_CUH

#include "indexer/common/key_mma.cuh"

namespace dsa_tc {

using namespace fsidx;

enum : int {
    TC_THREADS = 128,   // 4 warps; four CTAs an SM (128 registers)
    TC_WARPS = TC_THREADS / 32,
    TC_KEYS = 512,      // keys a CTA (the host's TC_CHUNK)
    TC_HEADS = 32,      // heads of the widest chunk (head_tiles)
};

// Column tiles of a head chunk (registers: at most 128 a thread, no
// spills): 4 (32 heads), 2 (16 heads) with f32 keys.
template <class Q, class K>
__host__ __device__ constexpr int head_tiles() { return K::TERMS > 1 ? 2 : 4; }

// A query format: TERMS bf16 terms a value; term(q, i, tq): value i's term.
struct QF32 {
    static constexpr int TERMS = 3;
    static __device__ __forceinline__ u32 term(const void* q, long long i, int tq) {
        return f32_term(((const float*)q)[i], tq);
    }
};
struct QBf16 {
    static constexpr int TERMS = 1;
    static __device__ __forceinline__ u32 term(const void* q, long long i, int) {
        return ((const unsigned short*)q)[i];
    }
};
struct QE4m3 {
    static constexpr int TERMS = 1;
    static __device__ __forceinline__ u32 term(const void* q, long long i, int) {
        return KeyE4m3::bf16_of(((const unsigned char*)q)[i]);
    }
};

// The query fragments of row t's heads h0 .. h0 + 63 (zero past H) at
// frag_index(tq, ks, n, lane, d / 16, NT), and their weights (0 past H).
// Every thread calls it.
template <class Q, int NT>
__device__ __forceinline__ void load_head_chunk(const DsaParams& P, int t, int h0, uint2* qf, float* w_s) {
    const int KS = P.dim / 16, H = P.heads;
    const int total = Q::TERMS * KS * NT * 32;
    for (int i = threadIdx.x; i < total; i += TC_THREADS) {
        const int lane = i & 31, n = (i >> 5) % NT, ks = ((i >> 5) / NT) % KS, tq = (i >> 5) / (NT * KS);
        const int h = h0 + 8 * n + (lane >> 2);
        u32 v[4] = {0u, 0u, 0u, 0u};
        if (h < H) {
            const long long at = ((long long)t * H + h) * P.dim + frag_dim0(ks, lane);
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = Q::term(P.q, at + e, tq);
        }
        qf[i] = make_uint2(pack2(v[0], v[1]), pack2(v[2], v[3]));
    }
    if (threadIdx.x < 8 * NT) {
        const int h = h0 + threadIdx.x;
        w_s[threadIdx.x] = h < H ? __ldg(P.weights + (long long)t * H + h) : 0.f;
    }
}

// Key s's first byte (paged: through the table) and its scale (1 without
// one); null where the key is not read (s >= hi, or a page outside the
// table or the cache).
template <class K, bool PAGED>
__device__ __forceinline__ const unsigned char* tc_key(const DsaParams& P, int seq, long long s, long long hi,
                                                       float* scale) {
    *scale = 1.f;
    if (s >= hi) return nullptr;
    if (!PAGED) {
        if (P.k_scale != nullptr) *scale = __ldg(P.k_scale + s);
        return (const unsigned char*)P.k + s * (long long)P.dim * K::BYTES;
    }
    const int pi = (int)s / P.page_size, j = (int)s - pi * P.page_size;  // keys < 2^31
    int page = -1;
    if (seq >= 0 && pi < P.max_pages) page = __ldg(P.table + (long long)seq * P.max_pages + pi);
    if (page < 0 || page >= P.num_pages) return nullptr;
    const unsigned char* base = (const unsigned char*)P.k + (long long)page * P.page_size * (P.dim + 4);
    *scale = __ldg((const float*)(base + (long long)P.page_size * P.dim) + j);
    return base + (long long)j * P.dim;
}

// The relu-weighted head sum S of the chunk's columns (order in the
// header; a column past H holds +0.0) of the warp's key `lane`: the quad of lanes 4 g holds keys 16 m +
// g + 8 j; each sum goes from lane 4 g to the lane of its key as soon as it
// is made.
template <int NT>
__device__ __forceinline__ float head_sum(const float (&acc)[2][NT][4], const float* w_s, int lane) {
    const int t = lane & 3, src = 4 * (lane & 7), mj = lane >> 3;  // lane = 16 m + 8 j + g
    float v = 0.f;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float s = 0.f;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int c = 8 * n + 2 * t;
                const float p0 = __fmul_rn(w_s[c], relu(acc[m][n][2 * j]));
                const float p1 = __fmul_rn(w_s[c + 1], relu(acc[m][n][2 * j + 1]));
                const float pair = __fadd_rn(p0, p1);
                s = n == 0 ? pair : __fadd_rn(s, pair);
            }
            s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, 1));
            s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, 2));
            s = __shfl_sync(FULL_MASK, s, src);
            if (mj == 2 * m + j) v = s;
        }
    return v;
}

template <class Q, class K, bool PAGED>
__device__ __forceinline__ void tc_impl(const DsaParams& P) {
    uint2* qf = reinterpret_cast<uint2*>(dyn_smem);  // Q::TERMS * (d / 16) * head_tiles<Q, K>() * 32 fragments
    __shared__ float w_s[TC_HEADS];
    __shared__ float acc_s[TC_KEYS];  // running sums between head chunks
    __shared__ const unsigned char* key_s[TC_KEYS];  // each key's first byte (null: bad page)
    __shared__ float scale_s[TC_KEYS];
    const int t = blockIdx.x;
    const long long c0 = (long long)blockIdx.y * TC_KEYS;
    const long long c1 = min(c0 + TC_KEYS, P.keys);
    const long long a = min(max((long long)__ldg(P.starts + t), 0ll), P.keys);
    const long long b = min(max((long long)__ldg(P.ends + t), a), P.keys);
    float* row = P.out + (long long)t * P.keys + c0;  // the chunk's first column
    const long long lo = max(a, c0), hi = min(b, c1);
    // The chunk's keys lo .. hi - 1 as offsets i_lo .. n_hi - 1 from c0.
    const int i_lo = (int)(lo - c0), n_hi = (int)(hi - c0);
    int seq = 0;
    if (PAGED) {
        seq = __ldg(P.seq_ids + t);
        if (seq < 0 || seq >= P.sequences) seq = -1;
    }
    // -inf outside the range; inside it each key's address and scale, once.
    for (int i = threadIdx.x; i < (int)(c1 - c0); i += TC_THREADS) {
        if (i < i_lo || i >= n_hi) {
            row[i] = __uint_as_float(0xff800000u);
            continue;
        }
        key_s[i] = tc_key<K, PAGED>(P, seq, c0 + i, hi, &scale_s[i]);
    }
    if (lo >= hi) return;  // CTA-uniform
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int NT = head_tiles<Q, K>(), HC = 8 * NT;
    for (int h0 = 0; h0 < P.heads; h0 += HC) {
        const bool last = h0 + HC >= P.heads;
        __syncthreads();  // the previous chunk's fragments are read; key_s is written
        load_head_chunk<Q, NT>(P, t, h0, qf, w_s);
        __syncthreads();
#pragma unroll 1
        for (int i0 = i_lo + 32 * warp; i0 < n_hi; i0 += 32 * TC_WARPS) {
            const int i = i0 + lane;
            float acc[2][NT][4];
            warp_dots<Q::TERMS, K, NT, 1>(i < n_hi ? key_s[i] : nullptr, qf, P.dim / 32, lane, acc);
            // A column past H is +0.0 (its zero query times an infinite or
            // NaN key would be NaN; its weight is 0).
            if (P.heads - h0 < HC) {
                const int hn = P.heads - h0, c0 = 2 * (lane & 3);
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (8 * n + c0 + (e & 1) >= hn) acc[0][n][e] = acc[1][n][e] = 0.f;
            }
            const float v = head_sum<NT>(acc, w_s, lane);
            if (i >= n_hi) continue;
            const float run = __fadd_rn(h0 == 0 ? 0.f : acc_s[i], v);
            if (!last) {
                acc_s[i] = run;
                continue;
            }
            float score = PAGED || P.k_scale != nullptr ? __fmul_rn(run, scale_s[i]) : run;
            if (score != score) score = __uint_as_float(0x7fc00000u);
            row[i] = key_s[i] == nullptr ? __uint_as_float(0xff800000u) : score;
        }
    }
}

}  // namespace dsa_tc

#endif  // FLASHSEL_INDEXER_DSA_TC_CUH
