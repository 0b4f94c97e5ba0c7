// flashsel selection kernels: exact, deterministic top-k by streaming filter.
//
// ALGORITHM
//   A CTA owns one contiguous range of one row. It streams the range once, in
//   tiles of FS_BLOCK * ITEMS elements. Each element becomes a 64-bit composite
//       c = key << 32 | (0xffffffff - column)
//   whose unsigned order is the contract's total order (larger key first, then
//   lower column first; docs/semantics.md). An element is pushed into the CTA's
//   candidate buffer iff c >= lb, the running lower bound, tested as one float
//   compare per element (Bound; where every tie at lb's key passes, as under
//   a sampled bound, one >= compare, two at a time for the 16-bit types, in a
//   loop of its own: the fast run). A push stores the element's raw bits
//   (the key transform runs later on whole warps: to_keys). Barriers come
//   only between segments of tiles;
//   an optimistic segment that overflows the buffer is streamed again. When the
//   next tiles might not fit, the buffer is compacted: an MSD radix select
//   (8-bit digits, 256-bin shared histogram) keeps a prefix of the largest
//   composites and lb rises to that prefix.
//   Long ranges start from a sampled bound: a sample rank chosen so that clearly
//   more than k elements are expected above it (its column scaled from the
//   sample to the range, for plateaus of ties); if fewer pass, the range (or
//   row) is selected again from a wider sampled bound (RESCUE_SD), and
//   from lb = 0 if that fails too.
//   The finish selects and sorts the top min(k, n) in one bucket-rank pass
//   (bucket_rank; radix select + bitonic sort when the candidates do not
//   spread out), then writes indices and values (values rebuilt from keys).
//   Kernels:
//     fs_scan_*   one CTA per row (prefill): stream, finish (score order:
//                 composite descending; index order: the low word descending,
//                 i.e. column ascending), write.
//     fs_prep_*   one CTA per split row, before fs_split_*: zero the row's
//                 counters, take the row-wide sampled bound.
//     fs_split_*  several CTAs per row: each streams its chunk from the row's
//                 bound and appends its top min(k, n) to the row's slots; the
//                 CTA that finishes last merges the slots (a copy when they
//                 fit its buffer, else the same filter) and writes the row.
//     fs_grid_init_all, fs_grid_*, fs_grid8_*, fs_grid4_f32   few rows
//                 whose chunks fit the registers (16, 8 or 4 elements a
//                 thread):
//                 the row's CTAs (one cooperative launch) radix-select the
//                 row together over a global histogram per pass (the first
//                 over the keys above a bound all of them take from the same
//                 row-wide sample), then place the selection by counting
//                 (its own header, below).
//
// INVARIANTS
//   - Composites are unique within a row (the column is in the low word), so the
//     k-th largest is well defined and the selected set is exactly the contract's.
//   - The buffer is a cache, never a decision: a compaction only raises lb to
//     a prefix that at least k buffered composites reach, so it never rejects an
//     element of the true top k, and it drops only elements with >= k better
//     ones. A sampled seed is the one bound not proven by the buffer: unless
//     min(k, len) elements passed it, the range (or row) is selected again
//     (a wider sampled bound, checked the same way, then lb = 0).
//   - capacity C >= 2k + TILE, so after a compaction (count <= (C - TILE + k)
//     / 2) at least one tile fits: (C - count) / TILE tiles is a safe segment.
//     Longer (optimistic) segments store nothing past C and are redone when
//     the count says they overflowed.
//   - During a stream the buffer's entries pushed since the last checkpoint
//     are raw (the element's bits where the key goes); only compact, after
//     to_keys and a barrier, and the callers of a finished stream read them,
//     and every entry they read is a composite.
//   - Every loop bound that contains __syncthreads or a warp collective is
//     uniform over the CTA. Decisions taken from sh.count (compact or not, how
//     many tiles until the next barrier) are read by every thread between two
//     barriers, before any push can move it (compute-sanitizer racecheck found
//     the version without the second barrier).
//   - The top-k of a union is the top-k of the union of each part's top-k, so
//     the split rows' one merge round returns the same set as one CTA would.
//
// COST
//   Reads: each score once, plus one sampled tile per long range; a split
//   row's candidates once more (about k (1 + margin) of them, at most
//   chunks x k).
//   Writes: <= k composites per split CTA, k indices (+ values) per row.
//   Compute per element: one float compare and an equality flag, a bit in the
//   thread's mask (16-bit types: one packed compare and one packed equality
//   per two elements); per warp and tile a vote, per lane with passes one
//   shared atomic and a raw store per passing element; the key transform
//   once per buffered element, on whole warps (to_keys).
//   A compaction costs up to 8 histogram passes over <= C shared entries
//   (usually 1-2 for an intermediate one). The bucket-rank finish: ~6
//   barriers, 3 passes over the candidates, a bucket's size per element.
//
// BUFFERS
//   FS_GLOBAL_BUF = 0: the buffer is dynamic shared memory (k <= the planner's
//   shared limit), followed on the row path by the load ring (P.stage), whose
//   room the finish also uses. FS_GLOBAL_BUF = 1: the buffer is a per-CTA
//   slice of the workspace, for any k; same code, slower memory. Either way
//   cap + 1 composites: the last takes the pushes past cap.
//
// Compile-time options (the host passes them as -D):
//   FS_BLOCK        threads per CTA (multiple of 32, <= 1024)
//   FS_GLOBAL_BUF   0 or 1, as above
//   FS_PROFILE      1: accumulate clock64() phase counters in fs_prof
//   FS_HOST_STAGE_BYTES  the ring's size (the host's plan::STAGE_BYTES;
//                   always passed; not a switch)
//   FS_HOST_GRID_*  the host's grid layout (always passed; not a switch)

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#ifndef FS_BLOCK
#define FS_BLOCK 512
#endif
#ifndef FS_GLOBAL_BUF
#define FS_GLOBAL_BUF 0
#endif
#ifndef FS_PROFILE
#define FS_PROFILE 0
#endif
// The streaming filter's knobs, at their measured values (enumerators: no
// device variables).
enum : int { SEG = 32 };  // longest optimistic segment, tiles (16 and 64 measured no faster)
enum : int { SAMPLE_SD = 3 };  // sampled bounds' margin, deviations (2.5: -0.5%, twice the restarts; 2: +10% f32)
enum : int { RESCUE_SD = 8 };  // a failed sampled bound: again from one this wide (~2x the survivors), then lb = 0
enum : int { ROW_SAMPLE = 1 };  // tiles in a one-CTA row's sample (sample_lb's ST; 2: +4% f32, +11% bf16)
enum : int { PREP_SAMPLE = 1 };  // split rows: tiles in fs_prep_*'s row-wide sample (2: +0.8 us on 64 x 131,072)
// Programmatic dependent launch (sm_90+): the host launches fs_split_* with
// programmatic stream serialisation, so its CTAs start while fs_prep_* runs;
// they ask L2 for their chunk, then wait for prep's results.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_ON 1
#else
#define PDL_TRIGGER() ((void)0)
#define PDL_WAIT() ((void)0)
#define PDL_ON 0
#endif
// Calls chained by PDL (sm_90+): the host launches
// a call's first kernel (fs_grid_init_all, fs_prep_*, the row path's
// fs_scan_*) programmatically too, so it is resident before the stream's
// previous kernel ends; it waits for that kernel (CHAIN_WAIT) before it
// reads or writes anything, and only then lets its own dependents start.
// A call's last kernel (fs_grid8_*, fs_grid4_f32, fs_split_*,
// fs_scan_*) also lets the stream's next kernel launch as it starts
// (CHAIN_TRIGGER): a programmatic successor waits for this grid's completion
// anyway. Not fs_grid_*, whose CTA takes a whole SM's registers, so no CTA
// of the next kernel can wait beside it: there the early launch measured
// +0.3 us on 1 x 1,048,576 (132 CTAs).
#if PDL_ON
#define CHAIN_WAIT() PDL_WAIT()
#else
#define CHAIN_WAIT() ((void)0)
#endif
#if PDL_ON
#define CHAIN_TRIGGER() PDL_TRIGGER()
#else
#define CHAIN_TRIGGER() ((void)0)
#endif
// Two scan CTAs per SM (<= 64 registers) with a shared buffer; the global-
// buffer variant (large k) addresses the buffer generically and gets room.
#if FS_GLOBAL_BUF
#define SCAN_MIN_CTAS 1
#else
#define SCAN_MIN_CTAS 2
#endif

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#if FS_PROFILE
// 0 row cycles, 1 in-loop compaction cycles, 2 in-loop compactions, 3 finish
// cycles, 4 CTA rows, 5 optimistic segments redone, 6 row-path sample
// restarts, 7 split-row exact fallbacks, bucket passes' cycles: 8 ranges,
// 15 histogram and scan, 17 scatter, 31 rank (thread 0),
// 9 last-CTA merge cycles, 10/11/12 finish: exact compaction / sort / write
// cycles, 13 candidates at the finish, 14 bucket-rank finishes, 16 histogram passes (thread 0 of each CTA counts).
// Grid rows (CTA 0 of each row, %globaltimer ns): 20 rows, 21 passes, 22 load,
// 23 pass work, 25 pass decisions (the histogram reads that wait for the
// row's CTAs),
// 26 gather, 27 gather barrier wait, 30 staging and T, 18 placement's counts,
// 28 its writes, 29 whole CTA; 19 whole CTA in cycles; 32 the row sample's
// load and bound (the sampled pass), 33 rows whose sampled pass resolved, 34
// rows that fell back from it to the exact passes; 36 the sample's loads
// (thread 0's), 40 the warps' top sample keys and the CTA barrier after
// them, 37 the bound's rank, then 32 holds the PDL wait only; 38 the
// gather's list atomic (26 then holds its writes).
__device__ unsigned long long fs_prof[48];
#define PROF_ADD(i, v) atomicAdd(&fs_prof[(i)], (unsigned long long)(v))
#define PROF_CLOCK() clock64()
#define PROF_NS() global_ns()
#else
#define PROF_NS() 0ull
#define PROF_ADD(i, v) ((void)(v))
#define PROF_CLOCK() 0ll
#endif
// In a FS_PROFILE build and where `on`: adds the time since `last` (a
// variable) to fs_prof[slot] and moves `last` to now; `now` reads a clock
// (PROF_NS or PROF_CLOCK).
#define PROF_STAMP(on, now, last, slot)       \
    do {                                      \
        if (FS_PROFILE && (on)) {             \
            const auto t_ = (now);            \
            PROF_ADD(slot, t_ - (last));      \
            (last) = t_;                      \
        }                                     \
    } while (0)

enum : int { WARPS = FS_BLOCK / 32 };
#define FULL_MASK 0xffffffffu

// ---------------------------------------------------------------------------
// Parameters (mirrored by #[repr(C)] structs in src/cuda/launch.rs).

struct ScanParams {
    const void* scores;      // rows x row_stride elements of the dtype
    long long row_stride;    // elements
    const int* lengths;      // nullable; rows entries
    int* out_idx;            // rows x k
    void* out_val;           // nullable; rows x k of the dtype
    u64* cand;               // split rows: rows x chunks x k candidate slots;
                             // grid rows: rows x (k + 256) list entries
    u32* row_count;          // split rows: candidates appended so far, per row;
                             // grid rows: rows x GRID_STATE_WORDS of state
    u32* row_done;           // split rows: CTAs of the row that have finished
    u64* gbuf;               // FS_GLOBAL_BUF: gridDim.x * gridDim.y * cap
    u64* row_lb;             // split rows: per-row key bound from fs_prep_*
    int rows;
    int cols;
    int k;
    int chunks;              // CTAs per row (== gridDim.x of the scan)
    int cap;                 // buffer capacity in composites
    int nan_largest;         // NaN policy: 1 = above +inf, 0 = below -inf
    int order_index;         // 1: output by ascending column
    int stage;               // 1: the load ring (FS_HOST_STAGE_BYTES) follows
                             // the shared buffer (cta_buffer, ring_offset)
};
// The host mirror (src/cuda/launch.rs) asserts the same layout.
static_assert(sizeof(ScanParams) == 112, "ScanParams layout changed: update launch.rs");

// ---------------------------------------------------------------------------
// Keys: raw float bits -> unsigned key ordered as the float, -0 == +0, one NaN.

template <int BITS>
struct FloatBits;
template <>
struct FloatBits<32> {
    static constexpr u32 SIGN = 0x80000000u, EXP = 0x7f800000u, MAN = 0x007fffffu;
};
template <>
struct FloatBits<16> {  // bf16
    static constexpr u32 SIGN = 0x8000u, EXP = 0x7f80u, MAN = 0x007fu;
};
template <>
struct FloatBits<15> {  // f16 (tag 15: 16-bit storage, IEEE half layout)
    static constexpr u32 SIGN = 0x8000u, EXP = 0x7c00u, MAN = 0x03ffu;
};

template <int TAG>
__device__ __forceinline__ u32 order_key(u32 bits, int nan_largest) {
    typedef FloatBits<TAG> F;
    const u32 all = F::SIGN | F::EXP | F::MAN;
    const u32 mag = bits & (F::EXP | F::MAN);
    u32 key = (bits & F::SIGN) ? (~bits & all) : (bits | F::SIGN);
    key = (mag == 0) ? F::SIGN : key;
    key = (mag > F::EXP) ? (nan_largest ? all : 0u) : key;
    return key;
}

// The raw bits whose key is `key`: order_key's inverse, exact except for the
// keys it merges (zero: -0 and +0 both give +0; NaN: one payload).
template <int TAG>
__device__ __forceinline__ u32 key_bits(u32 key) {
    typedef FloatBits<TAG> F;
    return (key & F::SIGN) ? (key & ~F::SIGN) : (~key & (F::SIGN | F::EXP | F::MAN));
}

__device__ __forceinline__ u64 composite(u32 key, u32 col) {
    return ((u64)key << 32) | (u64)(0xffffffffu - col);
}
__device__ __forceinline__ u32 composite_col(u64 c) { return 0xffffffffu - (u32)c; }

// Raw element access for the three dtypes (no cuda_fp16 headers needed).
template <int TAG>
struct Elem;
template <>
struct Elem<32> {
    typedef u32 raw;
    static constexpr int VEC = 4;              // elements per 16-byte load
    static constexpr int ITEMS = 8;            // elements per thread per tile
    static constexpr int TOP_BIT = 63;         // highest composite bit in use
    static constexpr u32 NEG_INF = 0xff800000u;
};
template <>
struct Elem<16> {
    typedef u16 raw;
    static constexpr int VEC = 8;
    static constexpr int ITEMS = 8;
    static constexpr int TOP_BIT = 47;
    static constexpr u32 NEG_INF = 0xff80u;
};
template <>
struct Elem<15> : Elem<16> {  // f16: the bf16 storage, its own -inf
    static constexpr u32 NEG_INF = 0xfc00u;
};

template <int TAG>
__device__ __forceinline__ u32 load_bits(const void* base, long long i) {
    typedef typename Elem<TAG>::raw R;
    return (u32)__ldg(((const R*)base) + i);
}
template <int TAG>
__device__ __forceinline__ void store_bits(void* base, long long i, u32 bits) {
    typedef typename Elem<TAG>::raw R;
    ((R*)base)[i] = (R)bits;
}


__device__ __forceinline__ u32 word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The q-th element's raw bits from a 16-byte group.
template <int TAG>
__device__ __forceinline__ u32 unpack(const uint4& v, int q) {
    if (TAG == 32) return word(v, q);
    return (word(v, q >> 1) >> ((q & 1) * 16)) & 0xffffu;
}

// Loads the 16-byte group of elements [e0, e0 + VEC): one vector load when
// aligned and in range, else element by element (zeros past `end`). Offsets
// within a row are u32 (a row has at most 2^31 - 1 columns: the contract);
// measured 2-4% faster than 64-bit offsets in the streaming loop (perf-log v15).
template <int TAG>
__device__ __forceinline__ uint4 load_vec(const void* row, u32 e0, u32 end, bool aligned) {
    constexpr int VEC = Elem<TAG>::VEC;
    if (aligned && e0 + VEC <= end) {
        return __ldg((const uint4*)((const char*)row + (size_t)e0 * sizeof(typename Elem<TAG>::raw)));
    }
    u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int q = 0; q < VEC; ++q) {
        const u32 b = (e0 + q < end) ? load_bits<TAG>(row, e0 + q) : 0u;
        if (TAG == 32) {
            w[q] = b;
        } else {
            w[q >> 1] |= b << ((q & 1) * 16);
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The q-th element of a 16-byte group as a float, exactly (bf16 and f16 widen
// without rounding), for the fast filter.
template <int TAG>
__device__ __forceinline__ float elem_float(const uint4& v, int q) {
    if (TAG == 32) return __uint_as_float(word(v, q));
    const u32 w = word(v, q >> 1);
    if (TAG == 16) return __uint_as_float((q & 1) ? (w & 0xffff0000u) : (w << 16));
    float f;
    const u32 h = (q & 1) ? (w >> 16) : (w & 0xffffu);
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "r"(h));
    return f;
}

template <int TAG>
__device__ __forceinline__ float bits_float(u32 bits) {
    if (TAG == 32) return __uint_as_float(bits);
    if (TAG == 16) return __uint_as_float(bits << 16);
    float f;
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "r"(bits));
    return f;
}

// The filter's view of a lower bound lb (taken at a barrier).
//   Exact test: c >= lb  <=>  key > key(lb), or key == key(lb) and
//   column <= tie_col.
//   Fast test, valid when `fast`: the element's float x against t, the float
//   whose key is key(lb) (clamped to -inf below it): x > t passes, x < t fails,
//   and x == t (a key tie; -0 and +0 are one key) passes iff its column is
//   <= tie_col. NaN passes iff `unord` (its key, all ones or zero, is then
//   above key(lb)).
//   Not `fast` when key(lb) is above +inf's key (only NaNs can pass, with a
//   column test) or is the NaN-lowest key with a column part: the exact test
//   then runs on every element.
//   `all_ties` (tie_col covers every column, as a sampled bound usually
//   does: its descent stops at a key digit): x >= t passes, one compare per
//   element and no tie flag (ge_mask).
struct Bound {
    u32 key;
    u32 tie_col;
    float t;
    u32 t2;  // 16-bit types: t's bits in both halves (packed compares)
    bool fast;
    bool unord;
    bool all_ties;
};

template <int TAG>
__device__ __forceinline__ Bound make_bound(u64 lb, int nan_largest) {
    typedef FloatBits<TAG> F;
    const u32 all = F::SIGN | F::EXP | F::MAN;
    const u32 key_ninf = ~(F::SIGN | F::EXP) & all;
    const u32 key_pinf = F::SIGN | F::EXP;
    Bound b;
    b.key = (u32)(lb >> 32);
    b.tie_col = 0xffffffffu - (u32)lb;
    b.fast = !(b.key > key_pinf || (b.key == 0 && lb != 0));
    b.unord = nan_largest || lb == 0;
    const u32 bits = key_bits<TAG>(b.key);
    b.t = b.key <= key_ninf ? __uint_as_float(0xff800000u) : bits_float<TAG>(bits);
    // Below -inf's key, -inf (x == t) passes whatever its column; likewise
    // +-0 when key(lb) is the unused key just below zero's (t is then -0.0).
    if (b.key < key_ninf || bits == F::SIGN) b.tie_col = 0xffffffffu;
    b.all_ties = b.tie_col == 0xffffffffu;
    const u32 t16 = b.key <= key_ninf ? Elem<TAG>::NEG_INF : bits;
    b.t2 = TAG == 32 ? 0u : (t16 | (t16 << 16));
    return b;
}

// ---------------------------------------------------------------------------
// Per-CTA shared state.

struct Shared {
    u32 hist[256];
    u32 count;       // composites in the buffer
    u32 digit;       // radix select: the crossing digit
    u32 above;       // radix select: composites in bins above it
    u32 bincnt;      // radix select: composites in its bin
    u64 lb;          // accept c >= lb
    u32 slot;        // split rows: where this CTA's candidates go
    u32 last;        // split rows: this CTA finishes the row
};

extern __shared__ __align__(16) u64 dyn_smem[];

// Dynamic shared memory of the scan and split kernels (shared buffer):
// [buffer: cap + 1 composites, padded to 16 bytes][load ring:
// FS_HOST_STAGE_BYTES when P.stage]. The buffer's last slot (index cap)
// takes the pushes past cap, which are never read (see push_tile). A global
// buffer is a slice of cap + 1 composites of gbuf.
__device__ __forceinline__ u64* cta_buffer(u64* gbuf, int cap) {
#if FS_GLOBAL_BUF
    return gbuf + ((u64)blockIdx.y * gridDim.x + blockIdx.x) * ((u64)cap + 1);
#else
    return dyn_smem;
#endif
}
// The ring's byte offset in dynamic shared memory (plan::shared_bytes).
__device__ __forceinline__ u32 ring_offset(int cap) { return (((u32)cap + 2u) & ~1u) * 8u; }
// Composites of scratch the finish may use from the buffer's start: the
// buffer, or, once the stream is over, the ring's room too.
__device__ __forceinline__ int finish_cap(int cap, int stage) {
    return stage ? (int)((ring_offset(cap) + FS_HOST_STAGE_BYTES) / 8u) : cap;
}

// Warp-aggregated push: every lane of the warp must call it.
__device__ __forceinline__ void push(u64* buf, Shared& sh, bool pred, u64 c) {
    const u32 mask = __ballot_sync(FULL_MASK, pred);
    if (mask == 0) return;
    const int lane = threadIdx.x & 31;
    const int leader = __ffs(mask) - 1;
    u32 base = 0;
    if (lane == leader) base = atomicAdd(&sh.count, (u32)__popc(mask));
    base = __shfl_sync(FULL_MASK, base, leader);
    if (pred) buf[base + __popc(mask & ((1u << lane) - 1u))] = c;
}

// Adds the digit at `shift` of every composite matching `prefix` under `mask`
// to sh.hist, with plain shared atomics: warp-aggregated (__match_any_sync) and
// run-length variants measured slower (docs/perf-log.md, v2/v3).
__device__ __forceinline__ void hist_pass(const u64* buf, Shared& sh, u32 n, u64 prefix, u64 mask, int shift) {
    for (u32 i = threadIdx.x; i < n; i += FS_BLOCK) {
        const u64 c = buf[i];
        if ((c & mask) == prefix) atomicAdd(&sh.hist[(u32)(c >> shift) & 255u], 1u);
    }
}

// The 32-bit word holding element b (= j * VEC + q) of this thread's tile,
// picked from the registers with a select tree (a dynamic index would spill
// to local memory): the element's raw bits for f32; for the 16-bit types
// the element and its neighbour, the element in the high half iff b is odd
// (raw_bits takes it out).
template <int TAG, int NV>
__device__ __forceinline__ u32 pick(const uint4 (&cur)[NV], u32 b) {
    const u32 w_i = TAG == 32 ? b : b >> 1;  // word index over the NV groups
    uint4 v = cur[0];
#pragma unroll
    for (int j = 1; j < NV; ++j) v = (w_i >> 2) == (u32)j ? cur[j] : v;
    const u32 lo = (w_i & 1) ? v.y : v.x, hi = (w_i & 1) ? v.w : v.z;
    const u32 w = (w_i & 2) ? hi : lo;
    return w;
}

// An element's raw bits from the word pick() gave for it. 16-bit types:
// the high half iff the element's offset from its range's start is odd
// (tiles and 16-byte groups hold an even number of elements).
template <int TAG>
__device__ __forceinline__ u32 raw_bits(u32 w, u32 col, u32 start) {
    if (TAG == 32) return w;
    return ((col ^ start) & 1u) ? (w >> 16) : (w & 0xffffu);
}

// Pushes the elements of this thread's tile (`cur`: ITEMS elements as 16-byte
// groups; element j * VEC + q has column tile0 + (j * FS_BLOCK + tid) * VEC + q)
// whose bit is set in `pass`, with one shared atomic per lane that has any.
// Only the set bits are visited (a warp loops as often as its busiest lane has
// passes). What is pushed is the RAW composite, the word pick() gives for the
// element where the key goes (word << 32 | low word): the element's bits
// (raw_bits) and their key transform are taken later, on whole
// warps, over every entry pushed since the last checkpoint (to_keys, called
// by stream_range before a compaction and before it returns). Pushes at or
// past `cap` all land in the spare slot buf[cap]: sh.count then exceeds cap
// and the streaming loop redoes the segment (see stream_range).
template <int TAG, int NV>
__device__ __forceinline__ void push_tile(u64* buf, Shared& sh, u32 pass, const uint4 (&cur)[NV], u32 tile0,
                                          u32 cap) {
    constexpr int VEC = Elem<TAG>::VEC;
    // One shared atomic per lane that has passes (a few per warp and tile at
    // the sampled bound's rate; measured faster than a warp scan and one
    // atomic per warp: docs/perf-log.md, v12).
    if (pass == 0) return;
    u32 pos = atomicAdd(&sh.count, (u32)__popc(pass));
    // The thread's first column, once; bits from the top (the buffer's order
    // does not matter); with one 16-byte group (NV == 1) bit b is column
    // offset b. (bf16: 41 instructions per push in v19, 28 in v21, 18 with
    // the key transform moved to to_keys (v22), 13 storing the whole word
    // (v24): perf-log, eighth and ninth sessions.)
    const u32 low0 = 0xffffffffu - (tile0 + threadIdx.x * VEC);  // the composite's low word at offset 0
    while (pass) {
        const u32 b = 31 - __clz(pass);
        pass ^= 1u << b;
        const u32 off = NV == 1 ? b : (b / VEC) * (FS_BLOCK * VEC) + (b % VEC);
        // Past cap: into the spare slot buf[cap], never read (no branch).
        buf[pos < cap ? pos : cap] = ((u64)pick<TAG>(cur, b) << 32) | (u64)(low0 - off);
        ++pos;
    }
}

// Turns the raw composites buf[from, to) that push_tile wrote for the range
// starting at column `start` into composites (the key transform of their
// high words); every thread calls it, and the caller puts a barrier between
// it and any read of those entries.
template <int TAG>
__device__ __forceinline__ void to_keys(u64* buf, u32 from, u32 to, u32 start, int nan_largest) {
    for (u32 i = from + threadIdx.x; i < to; i += FS_BLOCK) {
        const u64 c = buf[i];
        const u32 bits = raw_bits<TAG>((u32)(c >> 32), composite_col(c), start);
        buf[i] = ((u64)order_key<TAG>(bits, nan_largest) << 32) | (u64)(u32)c;
    }
}

// The MSD descent of a compaction, over composites wherever they are:
// add_hist(prefix, mask, shift) adds to sh.hist the digit at `shift` of each
// composite matching `prefix` under `mask` (every thread calls it; it needs
// no barrier). Returns the prefix: at least m composites are >= it, and at
// most max_keep unless the descent reached the last digit (then exactly m).
template <int TOP_BIT, typename AddHist>
__device__ u64 msd_prefix(Shared& sh, u32 m, u32 max_keep, AddHist add_hist) {
    const int tid = threadIdx.x;
    u64 prefix = 0, mask = 0;
    u32 need = m;
    for (int shift = TOP_BIT - 7;; shift -= 8) {
        for (int i = tid; i < 256; i += FS_BLOCK) sh.hist[i] = 0;
        __syncthreads();
        if (tid == 0) PROF_ADD(16, 1);
        add_hist(prefix, mask, shift);
        __syncthreads();
        if (tid < 32) {
            // Lane l owns bins 8l .. 8l+7; find the bin where the count from the
            // top crosses `need`.
            u32 h[8];
            u32 sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                h[j] = sh.hist[tid * 8 + j];
                sum += h[j];
            }
            u32 incl = sum;  // sum over lanes >= tid
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u32 v = __shfl_down_sync(FULL_MASK, incl, o);
                if (tid + o < 32) incl += v;
            }
            const u32 above_lane = incl - sum;
            if (above_lane < need && need <= incl) {
                u32 acc = above_lane;
#pragma unroll
                for (int j = 7; j >= 0; --j) {
                    if (acc < need && acc + h[j] >= need) {
                        sh.digit = tid * 8 + j;
                        sh.above = acc;
                        sh.bincnt = h[j];
                    }
                    acc += h[j];
                }
            }
        }
        __syncthreads();
        need -= sh.above;
        prefix |= (u64)sh.digit << shift;
        mask |= (u64)255 << shift;
        // Kept if we stop here: (m - need) above the bin, plus the whole bin.
        if (m - need + sh.bincnt <= max_keep || shift == 0) break;
    }
    return prefix;
}

// Compaction of buf[0..n) to a prefix of its largest composites: at least m,
// at most max_keep (m <= max_keep < n). With max_keep == m it is exact: the m
// largest. The MSD descent stops at the first digit whose crossing bin lets
// everything >= the bin's lower bound fit in max_keep, so an intermediate
// compaction (max_keep > m) usually takes one or two histogram passes.
// All threads call it; ends with a barrier; leaves sh.count = the number kept
// and raises sh.lb to the kept prefix.
template <int TOP_BIT>
__device__ void compact(u64* buf, Shared& sh, u32 n, u32 m, u32 max_keep) {
    const int tid = threadIdx.x;
    const u64 prefix = msd_prefix<TOP_BIT>(
        sh, m, max_keep, [&](u64 pre, u64 mask, int shift) { hist_pass(buf, sh, n, pre, mask, shift); });
    // Everything >= prefix is kept: between m and max_keep composites (exactly
    // m when the descent reached the last digit: prefix is the m-th itself).
    // In-place compaction in rounds: a round reads R*FS_BLOCK entries into
    // registers, then writes its survivors below the running count, which is
    // never past what has been read.
    __syncthreads();
    if (tid == 0) sh.count = 0;
    __syncthreads();
    constexpr int R = 8;
    for (u32 base = 0; base < n; base += R * FS_BLOCK) {
        u64 v[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const u32 i = base + j * FS_BLOCK + tid;
            v[j] = (i < n) ? buf[i] : 0ull;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < R; ++j) push(buf, sh, v[j] >= prefix && v[j] != 0ull, v[j]);
        __syncthreads();
    }
    if (tid == 0) sh.lb = prefix > sh.lb ? prefix : sh.lb;
    __syncthreads();
}

// A descending bitonic sort for m <= 4 * FS_BLOCK (the finish's general path
// for k in (1024, 2048]), with the data in registers: thread t holds elements
// 4t .. 4t+3. Compare-exchange partners at distance 1-2 are in the thread, at
// 4-64 in the warp (shuffles, no barrier), and only distances >= 128 go
// through shared memory. 20 barriers for 2048 elements instead of 66.
__device__ __forceinline__ u64 umax64(u64 a, u64 b) { return a > b ? a : b; }
__device__ __forceinline__ u64 umin64(u64 a, u64 b) { return a < b ? a : b; }
// Orders (a, b) descending when `down`, ascending otherwise.
__device__ __forceinline__ void cmp_swap(u64& a, u64& b, bool down) {
    const u64 hi = umax64(a, b), lo = umin64(a, b);
    a = down ? hi : lo;
    b = down ? lo : hi;
}

__device__ void sort_desc_regs(u64* buf, u32 m, int order_index) {
    constexpr u32 N = 4 * FS_BLOCK;
    const u32 t4 = 4 * threadIdx.x;
    u64 r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 e = t4 + j;
        u64 c = e < m ? buf[e] : 0ull;
        if (order_index && e < m) c = (c << 32) | (c >> 32);
        r[j] = c;
    }
    __syncthreads();
    for (u32 size = 2; size <= N; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            if (stride >= 128) {
#pragma unroll
                for (int j = 0; j < 4; ++j) buf[t4 + j] = r[j];
                __syncthreads();
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const u32 e = t4 + j;
                    const u64 o = buf[e ^ stride];
                    const bool keep_max = ((e & stride) == 0) == ((e & size) == 0);
                    r[j] = keep_max ? umax64(r[j], o) : umin64(r[j], o);
                }
                __syncthreads();
            } else if (stride >= 4) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const u32 e = t4 + j;
                    const u64 o = __shfl_xor_sync(FULL_MASK, r[j], stride >> 2);
                    const bool keep_max = ((e & stride) == 0) == ((e & size) == 0);
                    r[j] = keep_max ? umax64(r[j], o) : umin64(r[j], o);
                }
            } else {
                // Within the thread; (t4 + j) & size is the same for all j when
                // size >= 4, and for size 2 only stride 1 occurs.
                if (stride == 2) {
                    const bool up = (t4 & size) == 0;
                    cmp_swap(r[0], r[2], up);
                    cmp_swap(r[1], r[3], up);
                } else {
                    cmp_swap(r[0], r[1], ((t4 + 0) & size) == 0);
                    cmp_swap(r[2], r[3], ((t4 + 2) & size) == 0);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) buf[t4 + j] = r[j];
    __syncthreads();
}

// The output value of a selected element of key `key` at column `col`: the
// key gives the value back, except where the key merged several encodings
// (zero: -0 and +0; NaN: every payload): only those are read from the row.
template <int TAG>
__device__ __forceinline__ u32 value_bits(u32 key, const void* row_scores, u32 col) {
    typedef FloatBits<TAG> F;
    const u32 all = F::SIGN | F::EXP | F::MAN;
    return (key == F::SIGN || key == 0u || key == all) ? load_bits<TAG>(row_scores, col) : key_bits<TAG>(key);
}

// Output slot o past the row's selection: index -1, value -inf.
template <int TAG>
__device__ __forceinline__ void write_padding(int* out_idx, void* out_val, long long o) {
    out_idx[o] = -1;
    if (out_val) store_bits<TAG>(out_val, o, Elem<TAG>::NEG_INF);
}

// Writes the final row: the m sorted composites, then padding to k.
template <int TAG>
__device__ void write_row(const u64* buf, u32 m, int order_index, int k, int* out_idx, void* out_val,
                          const void* row_scores, long long row) {
    for (u32 j = threadIdx.x; j < (u32)k; j += FS_BLOCK) {
        const long long o = row * (long long)k + j;
        if (j < m) {
            u64 c = buf[j];
            if (order_index) c = (c << 32) | (c >> 32);
            const u32 col = composite_col(c);
            out_idx[o] = (int)col;
            if (out_val) store_bits<TAG>(out_val, o, value_bits<TAG>((u32)(c >> 32), row_scores, col));
        } else {
            write_padding<TAG>(out_idx, out_val, o);
        }
    }
}

// Row `row`'s first score.
template <int TAG>
__device__ __forceinline__ const void* row_start(const ScanParams& P, int row) {
    return (const char*)P.scores + (long long)row * P.row_stride * (long long)sizeof(typename Elem<TAG>::raw);
}
__device__ __forceinline__ bool aligned16(const void* p) { return (((unsigned long long)p) & 15ull) == 0; }

// The row's length, or 0 for an out-of-range length (the host cannot check
// device-resident lengths without a synchronisation; such a row comes out as
// all padding).
__device__ __forceinline__ int row_length(const int* lengths, int row, int cols) {
    if (!lengths) return cols;
    const int len = lengths[row];
    return (len < 0 || len > cols) ? 0 : len;
}

// Chunk p of a row of length len cut into `chunks`: [start, end), each chunk
// ceil(len / chunks) rounded up to 8 elements (16-byte aligned starts), so
// work follows the active length, not the buffer width. I: the caller's offset
// type (long long, or u32 for the grid path: a row has < 2^31 columns).
template <typename I>
__device__ __forceinline__ void chunk_range(int len, int chunks, int p, I& start, I& end) {
    const long long per = ((long long)len + chunks - 1) / chunks;
    const long long L = (per + 7) & ~7ll;
    start = (I)((long long)p * L < len ? (long long)p * L : len);
    end = (I)(start + L < (I)len ? start + L : (I)len);
}

// Descending bitonic sort of a[0..len) in place, any len: the variant whose
// merges all run one way (a mirror step, then half-cleaners), so the virtual
// padding past len (below everything) never has to move and is not stored.
// log2(N) (log2(N) + 1) / 2 steps of N/2 compare-exchanges, N = pow2 >= len,
// a barrier after each.
__device__ void sort_desc_range(u64* a, u32 len) {
    u32 n = 1;
    while (n < len) n <<= 1;
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 i = threadIdx.x; i < n / 2; i += FS_BLOCK) {
                u32 lo, hi;
                if (stride == size >> 1) {  // mirror step
                    const u32 blk = i / stride, off = i % stride;
                    lo = blk * size + off;
                    hi = blk * size + size - 1 - off;
                } else {
                    lo = 2 * i - (i & (stride - 1));
                    hi = lo + stride;
                }
                if (hi < len) {
                    const u64 x = a[lo], y = a[hi];
                    if (x < y) {
                        a[lo] = y;
                        a[hi] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// buf[0..m) in output order: descending by composite (score order), or, for
// index order, with the words swapped first, so that the low word
// (0xffffffff - column) leads and descending means ascending column.
__device__ void sort_desc(u64* buf, u32 m, int order_index) {
    if (order_index) {
        for (u32 i = threadIdx.x; i < m; i += FS_BLOCK) buf[i] = (buf[i] << 32) | (buf[i] >> 32);
        __syncthreads();
    }
    sort_desc_range(buf, m);
}

// BUCKET-RANK FINISH. Selects and sorts in one pass when the candidates spread
// out: n composites -> the m largest, in descending order.
//   1. the range of the n composites' key words and column words; the bucket
//      of c is the top of its key offset, followed, when the keys span fewer
//      than NB_BITS bits, by the top of its column offset (Buckets), so
//      buckets are ordered as the composites (and tied keys, as in bf16,
//      still spread out by column).
//   2. histogram, then an exclusive scan from the top bucket down: where each
//      bucket's elements go in the output.
//   3. scatter into bucket order (tmp), then each element's rank inside its
//      bucket (how many of the bucket are larger: one pass over the bucket)
//      gives its output position; positions >= m are dropped.
//   4. a bucket that reaches into the top m with more than RANK_MAX elements
//      (a plateau of tied keys among spread ones) goes through the same pass
//      on its own, where its keys are equal and its columns spread it out
//      (bucket_big); at most BIG_MAX of them.
// Returns false, having changed nothing in its input, when more buckets are
// that big or the scratch space is short; the caller then takes the general
// path (radix select + bitonic sort). Scratch past the input, in the buffer:
// tmp (n composites) and two NB-entry u32 tables, per level.
// Cost: ~6 barriers, 3 passes over n, and a bucket's size in shared reads per
// element.
enum : int { NB_BITS = 11 };  // bucket-rank buckets, bits (10 and 12 measured slower)
#define NB (1 << NB_BITS)
enum : int { RANK_MAX = 64 };  // largest bucket ranked in place (32 and 128 measured no faster)
#define BIG_MAX 4
#define BIG_LIST 128  // sh.hist[BIG_LIST ..]: the big buckets' ids
static_assert(NB % FS_BLOCK == 0, "bucket table must split evenly over the threads");

__device__ __forceinline__ int bit_len(u32 x) { return 32 - __clz(x); }


// The bucket of a composite, monotone in it (a larger composite never falls
// in a lower bucket).
// p = key offset << t | column offset >> s2 (where the
// key offsets span fewer than NB_BITS bits, as many column bits as fit in 32;
// else none), and the bucket p * scale
// / 2^32 with scale = floor(NB 2^32 / (pmax + 1)): the whole range of p
// spread over all NB buckets (p itself when pmax < NB). Power-of-two
// shifts instead round the range up and leave up to half the buckets empty:
// measured (H200, 2048 x 131,072, k 2048) the rank step 6.8K -> 5.8K cycles
// (f32) and 7.0K -> 6.0K (bf16) with the scale, the row -0.8% and -2.7%;
// ReLU-few +0.6% (the scale's divide, in each of its two passes).
struct Buckets {
    u32 kmin, lmin;
    int s1, s2, t2;
    u32 scale;
    __device__ __forceinline__ u32 of(u64 c) const {
        const u32 kd = (u32)(c >> 32) - kmin;
        const u32 p = t2 ? (kd << t2) | (((u32)c - lmin) >> s2) : kd;
        return scale ? __umulhi(p, scale) : p;
    }
    __device__ __forceinline__ void init(u32 kmin_, u32 kmax, u32 lmin_, u32 lmax) {
        kmin = kmin_;
        lmin = lmin_;
        const int kb = bit_len(kmax - kmin), lb = bit_len(lmax - lmin);
        // Column bits only where the keys span fewer than NB_BITS bits
        // (as below): a plateau of tied keys among spread ones stays one
        // bucket (one second pass), not a few. t2 <= 31: the composites
        // are unique and bucket_rank takes n >= 2, so kb >= 1 when the
        // low words span 32 bits (index order's swapped words).
        if (kb >= NB_BITS) {
            t2 = 0;  // p = kd
            s2 = 0;
        } else {
            s2 = kb + lb > 32 ? kb + lb - 32 : 0;
            t2 = lb - s2;
        }
        s1 = 0;
        const u32 pmax = t2 ? ((kmax - kmin) << t2) | ((lmax - lmin) >> s2) : kmax - kmin;  // >= every p
        // In float, from below (the u64 division cost ~750 cycles a
        // pass): the approximate divide is within 2 ulp, the rounding of
        // pmax 1, so 0.99998 keeps scale under the exact quotient and
        // every bucket under NB. Exactness needs only monotone buckets.
        scale = pmax < (u32)NB ? 0u
                               : (u32)(__fdividef((float)NB * 4294967296.0f, (float)pmax + 1.0f) * 0.99998f);
    }
};

// One bucket pass: in[0..n) -> out[0..m). Big buckets are left to the caller:
// their ids in sh.hist[BIG_LIST ..], their count in the return value (or
// ~0u when there are more than BIG_MAX: nothing was written then).
// tab: 2 NB u32 (counts, then ends after the scatter); tmp: n composites.
__device__ __noinline__ u32 bucket_pass(const u64* in, u32 n, u64* out, u32 m, u64* tmp, u32* tab, Shared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32* cnt = tab;
    u32* pos = tab + NB;
    u32* red = sh.hist;  // 4 x WARPS partials (the histogram is free here)
    long long t_prof = PROF_CLOCK();
    // Cycles since the last stamp into fs_prof[slot] (thread 0).
#define BUCKET_STAMP(slot) PROF_STAMP(tid == 0, PROF_CLOCK(), t_prof, slot)
    // 1. key and column ranges.
    u32 kmin = ~0u, kmax = 0, lmin = ~0u, lmax = 0;
    for (u32 i = tid; i < n; i += FS_BLOCK) {
        const u64 c = in[i];
        const u32 hi = (u32)(c >> 32), lo = (u32)c;
        kmin = min(kmin, hi);
        kmax = max(kmax, hi);
        lmin = min(lmin, lo);
        lmax = max(lmax, lo);
    }
    kmin = __reduce_min_sync(FULL_MASK, kmin);
    kmax = __reduce_max_sync(FULL_MASK, kmax);
    lmin = __reduce_min_sync(FULL_MASK, lmin);
    lmax = __reduce_max_sync(FULL_MASK, lmax);
    if (lane == 0) {
        red[warp] = kmin;
        red[WARPS + warp] = kmax;
        red[2 * WARPS + warp] = lmin;
        red[3 * WARPS + warp] = lmax;
    }
    for (u32 i = tid; i < NB; i += FS_BLOCK) cnt[i] = 0;
    if (tid == 0) sh.above = 0;  // big buckets reaching into the top m
    __syncthreads();
    Buckets bk;
    // Every warp reduces the partials, a lane each.
    static_assert(WARPS <= 32, "one lane per warp partial");
    {
        const bool in = lane < WARPS;
        kmin = __reduce_min_sync(FULL_MASK, in ? red[lane] : ~0u);
        kmax = __reduce_max_sync(FULL_MASK, in ? red[WARPS + lane] : 0u);
        lmin = __reduce_min_sync(FULL_MASK, in ? red[2 * WARPS + lane] : ~0u);
        lmax = __reduce_max_sync(FULL_MASK, in ? red[3 * WARPS + lane] : 0u);
    }
    bk.init(kmin, kmax, lmin, lmax);
    BUCKET_STAMP(8);
    // 2. histogram and the scan from the top bucket down.
    for (u32 i = tid; i < n; i += FS_BLOCK) atomicAdd(&cnt[bk.of(in[i])], 1u);
    __syncthreads();
    constexpr int PER = NB / FS_BLOCK;
    u32 sum = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) sum += cnt[NB - 1 - (tid * PER + j)];
    u32 incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += v;
    }
    __syncthreads();  // every thread has read `red` before it is reused
    u32* wsum = sh.hist;
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    u32 run = incl - sum + __reduce_add_sync(FULL_MASK, lane < warp ? wsum[lane] : 0u);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const u32 b = NB - 1 - (tid * PER + j);
        const u32 cb = cnt[b];
        pos[b] = run;  // becomes the bucket's end after the scatter
        if (run < m && cb > RANK_MAX) {
            const u32 t = atomicAdd(&sh.above, 1u);
            if (t < BIG_MAX) sh.hist[BIG_LIST + t] = b;
        }
        run += cb;
    }
    __syncthreads();
    const u32 nbig = sh.above;
    BUCKET_STAMP(15);
    if (nbig > BIG_MAX) return ~0u;  // uniform; nothing written
    // 3. scatter into bucket order, then rank inside the bucket.
    for (u32 i = tid; i < n; i += FS_BLOCK) {
        const u64 v = in[i];
        tmp[atomicAdd(&pos[bk.of(v)], 1u)] = v;
    }
    __syncthreads();
    BUCKET_STAMP(17);
    for (u32 i = tid; i < n; i += FS_BLOCK) {
        const u64 v = tmp[i];
        const u32 b = bk.of(v);
        const u32 end = pos[b], s0 = end - cnt[b];
        if (s0 >= m || end - s0 > RANK_MAX) continue;
        u32 r = s0;
        for (u32 q = s0; q < end; ++q) r += tmp[q] > v;
        if (r < m) out[r] = v;
    }
    __syncthreads();
    BUCKET_STAMP(31);
#undef BUCKET_STAMP
    return nbig;
}

// The whole finish: buf[0..n) -> buf[0..m) sorted, two levels deep: a big
// bucket of the first pass gets a pass of its own (scratch permitting), and a
// big bucket of that one a bitonic sort. False: nothing changed.
__device__ bool bucket_rank(u64* buf, Shared& sh, u32 n, u32 m, u32 cap) {
    if (n < 2 || 2 * n + NB > cap) return false;  // uniform
    u64* tmp = buf + n;
    u32* tab = (u32*)(buf + 2 * n);
    const u32 nbig = bucket_pass(buf, n, buf, m, tmp, tab, sh);
    if (nbig == ~0u) return false;
    u32 big[BIG_MAX];
#pragma unroll
    for (int t = 0; t < BIG_MAX; ++t) big[t] = t < (int)nbig ? sh.hist[BIG_LIST + t] : 0;
    __syncthreads();  // big[] read before the next pass rewrites the list
    const u32 used = 2 * n + NB;  // buffer entries in use: buf, tmp, tables
    for (u32 t = 0; t < nbig; ++t) {  // uniform
        const u32 b = big[t];
        const u32 end = tab[NB + b], s0 = end - tab[b], len = end - s0;
        const u32 take = min(end, m) - s0;
        u32 nbig2 = ~0u;
        if (used + len + NB <= cap) {
            u64* tmp2 = buf + used;
            nbig2 = bucket_pass(tmp + s0, len, buf + s0, take, tmp2, (u32*)(tmp2 + len), sh);
            for (u32 t2 = 0; nbig2 != ~0u && t2 < nbig2; ++t2) {
                const u32 b2 = sh.hist[BIG_LIST + t2];
                u32* tab2 = (u32*)(tmp2 + len);
                const u32 e2 = tab2[NB + b2], z2 = e2 - tab2[b2];
                sort_desc_range(tmp2 + z2, e2 - z2);
                for (u32 i = threadIdx.x; z2 + i < min(e2, take); i += FS_BLOCK) buf[s0 + z2 + i] = tmp2[z2 + i];
                __syncthreads();
            }
        }
        if (nbig2 == ~0u) {  // no room or too many big buckets: sort the bucket
            sort_desc_range(tmp + s0, len);
            for (u32 i = threadIdx.x; i < take; i += FS_BLOCK) buf[s0 + i] = tmp[s0 + i];
            __syncthreads();
        }
    }
    return true;
}

// Finishes a row: the top min(k, count) in output order, then indices and
// values. Bucket-rank when the candidates spread out (after an intermediate
// compaction if the buffer lacks its scratch space), else an exact radix
// select and a bitonic sort. Index order sorts the selected set again by
// column (words swapped: the low word, 0xffffffff - column, leads).
template <int TAG>
__device__ void finish_row(u64* buf, Shared& sh, int k, int cap, int order_index, int* out_idx, void* out_val,
                           const void* row_scores, long long row) {
    __syncthreads();
    u32 n = sh.count;
    const u32 m = n < (u32)k ? n : (u32)k;
    const long long t0 = PROF_CLOCK();
    if (n > m && 2 * n + NB > (u32)cap) {
        compact<Elem<TAG>::TOP_BIT>(buf, sh, n, m, ((u32)cap - NB) / 2);
        n = sh.count;
    }
    const long long t1 = PROF_CLOCK();
    // (!!: the form of the measured build; a plain bool from the call compiles differently.)
    bool sorted = !!bucket_rank(buf, sh, n, m, (u32)cap);
    if (sorted && order_index) {
        for (u32 i = threadIdx.x; i < m; i += FS_BLOCK) buf[i] = (buf[i] << 32) | (buf[i] >> 32);
        __syncthreads();
        if (!bucket_rank(buf, sh, m, m, (u32)cap)) sort_desc(buf, m, 0);
    } else if (!sorted) {
        if (n > m) compact<Elem<TAG>::TOP_BIT>(buf, sh, n, m, m);
        if (m > 2 * FS_BLOCK && m <= 4 * FS_BLOCK) {  // the buffer holds >= 8 * FS_BLOCK entries
            sort_desc_regs(buf, m, order_index);
        } else {
            sort_desc(buf, m, order_index);
        }
    }
    const long long t2 = PROF_CLOCK();
    write_row<TAG>(buf, m, order_index, k, out_idx, out_val, row_scores, row);
    __syncthreads();
    if (threadIdx.x == 0) {
        PROF_ADD(10, t1 - t0);
        PROF_ADD(11, t2 - t1);
        PROF_ADD(12, PROF_CLOCK() - t2);
        PROF_ADD(13, n);
        PROF_ADD(14, sorted ? 1 : 0);
    }
}

__device__ __forceinline__ void reset(Shared& sh) {
    if (threadIdx.x == 0) {
        sh.count = 0;
        sh.lb = 0;
    }
    __syncthreads();
}

// Whether a range of `range` elements is long enough for a sampled bound
// (sample_lb's 16 blocks fit, and k is a small share of it). The one test
// for the row path, fs_prep_*, and the rescue (plan::plan_with's `sampled`
// is the same on the buffer width).
template <int TAG>
__device__ __forceinline__ bool sampling_applies(long long range, int k) {
    return range >= 16LL * FS_BLOCK * Elem<TAG>::ITEMS && 8LL * k <= range;
}

// A sampled bound let fewer than min(k, len) elements through: empty the
// buffer and drop the bound, so the caller streams its range again exactly
// (fs_prof[slot] counts it).
__device__ __forceinline__ void restart(Shared& sh, int slot) {
    __syncthreads();
    if (threadIdx.x == 0) PROF_ADD(slot, 1);
    reset(sh);
}

// Seeds sh.lb from a sample of [start, end): 16 blocks spread over the range,
// ST tiles in all (S elements), held in registers. The bound is the key of
// sample rank j, with j chosen so that clearly more than k elements of the
// range are expected above it (expected j * range / S; j adds SAMPLE_SD standard
// deviations and 4), found by compact's MSD descent with its histograms
// filled from the registers: the buffer is not touched. Out of line: it runs
// once per range and would otherwise crowd the streaming loop's registers.
template <int TAG, int ST>
__device__ __noinline__ u32 sample_lb(Shared& sh, const void* row_scores, long long start, long long end, bool aligned,
                                       int k, int nan_largest, float sd = (float)SAMPLE_SD) {
    typedef Elem<TAG> E;
    constexpr int VEC = E::VEC;
    static_assert(ST >= 1 && ST <= 16, "eligible ranges (>= 16 tiles) hold 16 sample blocks of ST / 16 tiles");
    constexpr int S = FS_BLOCK * E::ITEMS * ST;  // sample size: ST tiles
    constexpr int BLK = S / VEC / 16;           // vectors per sample block
    const long long range = end - start;
    const long long spacing = (range / 16) & ~7ll;
    // The sample stays in registers as composites (0: past the range, which
    // ranks below every composite that counts).
    u64 c[E::ITEMS * ST];
    u32 valid = 0;
#pragma unroll
    for (int j = 0; j < E::ITEMS * ST / VEC; ++j) {
        const int v = j * FS_BLOCK + threadIdx.x;
        const long long e0 = start + (v / BLK) * spacing + (long long)(v % BLK) * VEC;
        const uint4 w = load_vec<TAG>(row_scores, (u32)e0, (u32)end, aligned);
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const bool in = e0 + q < end;
            c[j * VEC + q] = in ? composite(order_key<TAG>(unpack<TAG>(w, q), nan_largest), (u32)(e0 + q)) : 0ull;
            valid += in;
        }
    }
    valid = __reduce_add_sync(FULL_MASK, valid);
    if ((threadIdx.x & 31) == 0) atomicAdd(&sh.count, valid);
    __syncthreads();
    const float expect = (float)k * (float)S / (float)range;
    const u32 j = (u32)(expect + sd * sqrtf(expect) + 4.0f);
    const u32 n = sh.count;
    // The bound: the prefix a compaction of the sample to j .. j + j/4 would
    // keep (the same descent, its histograms filled from the registers).
    if (j < n) {
        const u64 prefix = msd_prefix<E::TOP_BIT>(sh, j, j + j / 4, [&](u64 pre, u64 mask, int shift) {
#pragma unroll
            for (int i = 0; i < E::ITEMS * ST; ++i)
                if (c[i] != 0ull && (c[i] & mask) == pre) atomicAdd(&sh.hist[(u32)(c[i] >> shift) & 255u], 1u);
        });
        if (threadIdx.x == 0) sh.lb = prefix > sh.lb ? prefix : sh.lb;
        __syncthreads();
    }
    // On a plateau of ties (ReLU zeros, all-equal rows) the bound's key is
    // the plateau's and its column says how many of the sample's tied elements
    // it admits. The sample's columns are not the row's, so the column is
    // mapped from the bound's place among the sample positions to the same
    // fraction of the range: about as many of the row's ties pass as the
    // sample rank asked for, not the whole plateau. (A sampled bound is never
    // trusted: too few passing elements send the caller to the exact path.)
    if (threadIdx.x == 0) {
        const u64 lb = sh.lb;
        u32 low = 0;  // column part 0: every element of the bound's key passes
        if ((u32)lb != 0u) {
            constexpr u32 SPAN = S / 16;  // elements per sample block
            const u32 rel = (0xffffffffu - (u32)lb) - (u32)start;  // columns < 2^31
            u32 b = rel / (u32)spacing;
            b = b > 15u ? 15u : b;
            u32 o = rel - b * (u32)spacing;
            o = o > SPAN - 1 ? SPAN - 1 : o;
            const u64 scaled = ((u64)(b * SPAN + o + 1) * (u64)range + S - 1) / S;
            u32 col = (u32)start + (u32)scaled;
            col = col > (u32)(end - 1) ? (u32)(end - 1) : col;
            low = 0xffffffffu - col;
        }
        sh.lb = ((lb >> 32) << 32) | low;
        sh.count = 0;
    }
    // The pushes per tile the bound is expected to let through: j per S
    // sampled elements, a tile being S / ST of them.
    return (j + ST - 1) / ST;
}

// tie_col as an offset from column c0, clamped to [-1, 2^31): an element at
// c0 + rel (rel >= 0) has column <= tie_col iff rel <= the result.
__device__ __forceinline__ int tie_offset(u32 tie_col, u32 c0) {
    return tie_col < c0 ? -1 : (int)min(tie_col - c0, 0x7fffffffu);
}

// The exact filter over one tile: bit j * VEC + q set iff the element passes
// c >= lb (elements at offsets >= lim are outside the range).
template <int TAG, int NV>
__device__ __forceinline__ u32 exact_mask(const uint4 (&cur)[NV], u32 tile0, u32 lim, const Bound& bd,
                                          int nan_largest) {
    constexpr int VEC = Elem<TAG>::VEC;
    // Offsets relative to this thread's first element, so that each element's
    // tests are against an immediate (no register per element).
    const u32 t0 = threadIdx.x * VEC;
    const int olim = lim <= t0 ? -1 : (int)min(lim - t0 - 1, 0x7fffffffu);
    const int otie = tie_offset(bd.tie_col, tile0 + t0);
    u32 pass = 0;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const int rel = j * FS_BLOCK * VEC + q;
            const u32 key = order_key<TAG>(unpack<TAG>(cur[j], q), nan_largest);
            // Bitwise, not short-circuit: no branch per element.
            const u32 ok = (u32)(rel <= olim) & ((u32)(key > bd.key) | ((u32)(key == bd.key) & (u32)(rel <= otie)));
            pass |= ok << (j * VEC + q);
        }
    }
    return pass;
}

// Packed compares of the two 16-bit elements of w against t2 (t in both
// halves): each half of the result is all ones where the compare holds.
// packed_gt: greater, packed_ge: greater or equal (either one or unordered
// with UNORD); packed_eq: equal. One body for the ordered pair, by the PTX
// comparison's name.
#define PACKED_COMPARE(NAME, OP)                                                          \
    template <int TAG, bool UNORD>                                                           \
    __device__ __forceinline__ u32 NAME(u32 w, u32 t2) {                                     \
        u32 d;                                                                               \
        if (TAG == 16) {                                                                     \
            if (UNORD) asm("set." OP "u.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2)); \
            else asm("set." OP ".u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));        \
        } else {                                                                             \
            if (UNORD) asm("set." OP "u.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));  \
            else asm("set." OP ".u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));         \
        }                                                                                    \
        return d;                                                                            \
    }
PACKED_COMPARE(packed_gt, "gt")
PACKED_COMPARE(packed_ge, "ge")
#undef PACKED_COMPARE
template <int TAG>
__device__ __forceinline__ u32 packed_eq(u32 w, u32 t2) {
    u32 d;
    if (TAG == 16) asm("set.eq.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));
    else asm("set.eq.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));
    return d;
}

// Packed masks (16-bit types): word w of 16-byte group j holds elements
// j * 8 + 2w (low half) and j * 8 + 2w + 1 (high half); a packed compare's
// results are kept at bits j * 8 + 2w and 16 + j * 8 + 2w (pair_bits), and
// one fold at the end interleaves the two halves into bit = element.
__device__ __forceinline__ constexpr u32 pair_bits(int j, int w) {
    return (1u << (j * 8 + 2 * w)) | (1u << (16 + j * 8 + 2 * w));
}
template <int NV>
__device__ __forceinline__ u32 fold_pairs(u32 acc) {
    static_assert(NV == 1, "one fold covers 8 elements per thread");
    return (acc & 0x55u) | ((acc >> 15) & 0xaau);
}

// bf16x2 compares need sm_90; f16x2 ones run everywhere.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PACKED_BF16 1
#else
#define PACKED_BF16 0
#endif

// The filter over one full tile in the float domain (see Bound). Without
// TIES: one compare per element plus an equality flag (`tie`); a warp where
// some element equals t runs it again WITH TIES, which adds the column test
// for those elements. Exact whenever the bound is `fast`.
// 16-bit types compare two elements per instruction on the
// untied pass, with the same NaN and signed-zero semantics (IEEE compares of
// the exact bf16 / f16 values; no flush of subnormals).
template <int TAG, bool UNORD, bool TIES, int NV>
__device__ __forceinline__ u32 fast_mask(const uint4 (&cur)[NV], const Bound& bd, u32 tile0, bool& tie) {
    constexpr int VEC = Elem<TAG>::VEC;
    if constexpr (TAG != 32 && !TIES && (TAG == 16 ? PACKED_BF16 : 1)) {
        u32 acc = 0, eq = 0;  // see pair_bits
#pragma unroll
        for (int j = 0; j < NV; ++j) {
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const u32 x = word(cur[j], w);
                acc |= packed_gt<TAG, UNORD>(x, bd.t2) & pair_bits(j, w);
                eq |= packed_eq<TAG>(x, bd.t2);
            }
        }
        tie |= eq != 0;
        return fold_pairs<NV>(acc);
    }
    const int otie = TIES ? tie_offset(bd.tie_col, tile0 + threadIdx.x * VEC) : 0;
    u32 pass = 0;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const float x = elem_float<TAG>(cur[j], q);
            u32 ok = (u32)(UNORD ? !(x <= bd.t) : (x > bd.t));
            if (TIES) {
                ok |= (u32)(x == bd.t) & (u32)(j * FS_BLOCK * VEC + q <= otie);
            } else {
                tie |= x == bd.t;
            }
            pass |= ok << (j * VEC + q);
        }
    }
    return pass;
}

// The filter over one full tile when every tie at t passes (Bound::
// all_ties, `fast`): x >= t, or unordered (UNORD); no tie flag, no second
// pass. 16-bit types two at a time, as in fast_mask.
template <int TAG, bool UNORD, int NV>
__device__ __forceinline__ u32 ge_mask(const uint4 (&cur)[NV], const Bound& bd) {
    constexpr int VEC = Elem<TAG>::VEC;
    if constexpr (TAG != 32 && (TAG == 16 ? PACKED_BF16 : 1)) {
        u32 acc = 0;  // see pair_bits
#pragma unroll
        for (int j = 0; j < NV; ++j) {
#pragma unroll
            for (int w = 0; w < 4; ++w) acc |= packed_ge<TAG, UNORD>(word(cur[j], w), bd.t2) & pair_bits(j, w);
        }
        return fold_pairs<NV>(acc);
    }
    u32 pass = 0;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const float x = elem_float<TAG>(cur[j], q);
            pass |= (u32)(UNORD ? !(x < bd.t) : (x >= bd.t)) << (j * VEC + q);
        }
    }
    return pass;
}

template <int TAG>
__device__ __forceinline__ void load_tile(uint4 (&v)[Elem<TAG>::ITEMS / Elem<TAG>::VEC], const void* row_scores,
                                          u32 base, u32 end, bool aligned) {
#pragma unroll
    for (int j = 0; j < Elem<TAG>::ITEMS / Elem<TAG>::VEC; ++j)
        v[j] = load_vec<TAG>(row_scores, base + (u32)(j * FS_BLOCK + threadIdx.x) * Elem<TAG>::VEC, end,
                             aligned);
}

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
// Measured (perf-log, eighth session): the bf16 prefill's wait on the next
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
    // could not be measured after the ninth session's last device run.
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

// The fast run of stream_range: r tiles from base, each whole with its ring
// successor, filtered by ge_mask.
template <int TAG, bool UNORD>
__device__ __forceinline__ void fast_run(Stage<TAG>& ring, u64* buf, Shared& sh, const void* row_scores, u32 base,
                                         u32 r, const Bound& bd, u32 cap) {
    constexpr int NV = Elem<TAG>::ITEMS / Elem<TAG>::VEC;
    constexpr int TILE = FS_BLOCK * Elem<TAG>::ITEMS;
    constexpr int DEPTH = Stage<TAG>::DEPTH;
    // Single tiles until the ring is at slot 0, then DEPTH tiles a round
    // with every slot a constant.
    for (; r > 0 && ring.slot != 0; --r, base += TILE) {  // uniform
        uint4 cur[NV];
        ring.next_whole(cur, row_scores, base);
        push_tile<TAG>(buf, sh, ge_mask<TAG, UNORD>(cur, bd), cur, base, cap);
    }
    const char* ahead = (const char*)row_scores +
                        (size_t)(base + (u32)((DEPTH - 1) * TILE) + threadIdx.x * Elem<TAG>::VEC) *
                            sizeof(typename Elem<TAG>::raw);
    constexpr size_t STEP = (size_t)TILE * sizeof(typename Elem<TAG>::raw);
    for (; r >= (u32)DEPTH; r -= DEPTH) {
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            uint4 cur[NV];
            ring.next_at(cur, ahead, (u32)s);
            push_tile<TAG>(buf, sh, ge_mask<TAG, UNORD>(cur, bd), cur, base, cap);
            ahead += STEP;
            base += TILE;
        }
    }
    for (u32 t = 0; t < r; ++t, base += TILE) {
        uint4 cur[NV];
        ring.next_whole(cur, row_scores, base);
        push_tile<TAG>(buf, sh, ge_mask<TAG, UNORD>(cur, bd), cur, base, cap);
    }
}

// Streams [start, end) of one row through the filter into the buffer.
// Out of line, so that the streaming loop keeps its registers whatever the
// caller holds.
//
// SEGMENTS. Barriers come only at checkpoints between segments of tiles. At a
// checkpoint with n composites buffered, (cap - n) / TILE tiles fit whatever
// passes (a safe segment); when the last segment pushed few, a longer,
// optimistic segment runs, sized for twice the measured pushes per tile
// (at most SEG tiles). Pushes past cap are not kept; if the count
// exceeds cap at the next checkpoint, the segment is discarded (count reset)
// and streamed again as a safe one. Either way nothing is lost, and lb is read
// only at checkpoints (between them it is stale-low: admits more, never fewer).
template <int TAG, bool STAGED>
__device__ __noinline__ void stream_range(u64* buf, Shared& sh, const void* row_scores, u32 start,
                                          u32 end, bool aligned, int cap, int k, int nan_largest, u32 rate0) {
    typedef Elem<TAG> E;
    constexpr int NV = E::ITEMS / E::VEC;
    constexpr int TILE = FS_BLOCK * E::ITEMS;
    const int tid = threadIdx.x;
    // Unstaged: the next tile's loads are in flight, in registers, while this
    // tile is filtered (deeper register pipelines measured no faster in the
    // split kernel: docs/perf-log.md, v12).
    uint4 nxt[NV];
    // Staged: the tiles ahead are in flight into the ring (Stage).
    Stage<TAG> ring(cap);
    u32 base = start;
    if constexpr (STAGED) ring.fill(row_scores, base, end, aligned);
    else load_tile<TAG>(nxt, row_scores, base, end, aligned);
    u32 left = 0;  // tiles before the next checkpoint (uniform)
    u32 seg_base = start;
    u32 seg_n = 0, rate = rate0;  // pushes per tile: expected (a sampled bound) or TILE
    // Entries below `keyed` hold composites, those from it on raw ones (see
    // push_tile); set at the first checkpoint, before any push.
    u32 keyed = ~0u;
    u32 n = 0;
    Bound bd;
    for (;;) {
        if (left == 0 || base >= end) {  // uniform
            __syncthreads();
            n = sh.count;
            if (keyed == ~0u) keyed = n;
            // Nobody pushes (moving sh.count) before every thread has read it.
            __syncthreads();
            if (n > (u32)cap) {
                // The optimistic segment overflowed: drop it, redo it safely.
                if (tid == 0) sh.count = seg_n;
                n = seg_n;
                base = seg_base;
                if constexpr (STAGED) {
                    ring.drain();
                    ring.fill(row_scores, base, end, aligned);
                } else {
                    load_tile<TAG>(nxt, row_scores, base, end, aligned);
                }
                rate = TILE;
                if (tid == 0) PROF_ADD(5, 1);
            } else if (base > seg_base) {
                rate = (n - seg_n) / (u32)((base - seg_base + TILE - 1) / TILE);
            }
            if (base >= end) break;
            if (n + TILE > (u32)cap) {
                const long long t0 = PROF_CLOCK();
                to_keys<TAG>(buf, keyed, n, start, nan_largest);
                __syncthreads();
                compact<E::TOP_BIT>(buf, sh, n, (u32)k, ((u32)cap - TILE + (u32)k) / 2);
                n = sh.count;
                keyed = n;
                if (tid == 0) {
                    PROF_ADD(1, PROF_CLOCK() - t0);
                    PROF_ADD(2, 1);
                }
            }
            const u32 safe = ((u32)cap - n) / TILE;
            const u32 opt = ((u32)cap - n) / (2 * rate + 64);
            left = safe > (opt < SEG ? opt : SEG) ? safe : (opt < SEG ? opt : SEG);
            seg_base = base;
            seg_n = n;
            bd = make_bound<TAG>(sh.lb, nan_largest);
            __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
            if constexpr (STAGED) {
                // THE FAST RUN: the segment's tiles that are whole, with the
                // tile the ring starts for each whole too, under a bound that
                // every tie passes, in a loop of their own with every uniform
                // test of the loop below hoisted out (per tile: the ring,
                // ge_mask, the pushes). Tested here, once per segment, so the
                // loop below pays nothing for it.
                if (aligned && bd.fast && bd.all_ties &&
                    end - base >= (u32)(Stage<TAG>::DEPTH * TILE)) {  // uniform
                    u32 r = (end - base - (u32)((Stage<TAG>::DEPTH - 1) * TILE)) / TILE;
                    r = r < left ? r : left;
                    if (bd.unord) {
                        fast_run<TAG, true>(ring, buf, sh, row_scores, base, r, bd, (u32)cap);
                    } else {
                        fast_run<TAG, false>(ring, buf, sh, row_scores, base, r, bd, (u32)cap);
                    }
                    base += r * TILE;
                    left -= r;
                    if (left == 0 || base >= end) continue;  // uniform: the next checkpoint
                }
            }
#endif
        }
        uint4 cur[NV];
        if constexpr (STAGED) {
            ring.next(cur, row_scores, base, end, aligned);
        } else {
#pragma unroll
            for (int j = 0; j < NV; ++j) cur[j] = nxt[j];
            if (base + TILE < end) load_tile<TAG>(nxt, row_scores, base + TILE, end, aligned);
        }
        const u32 tile0 = base;
        const bool full = base + TILE <= end;
        u32 pass;
        if (full && bd.fast && bd.all_ties) {  // uniform
            pass = bd.unord ? ge_mask<TAG, true>(cur, bd) : ge_mask<TAG, false>(cur, bd);
        } else if (full && bd.fast) {  // uniform
            bool tie = false;
            pass = bd.unord ? fast_mask<TAG, true, false>(cur, bd, tile0, tie)
                            : fast_mask<TAG, false, false>(cur, bd, tile0, tie);
            if (__any_sync(FULL_MASK, tie))
                pass = bd.unord ? fast_mask<TAG, true, true>(cur, bd, tile0, tie)
                                : fast_mask<TAG, false, true>(cur, bd, tile0, tie);
        } else {
            pass = exact_mask<TAG>(cur, tile0, full ? 0xffffffffu : end - base, bd, nan_largest);
        }
        push_tile<TAG>(buf, sh, pass, cur, tile0, (u32)cap);
        base += TILE;
        --left;
    }
    if constexpr (STAGED) ring.drain();  // nothing may land in the ring after this returns
    // The last checkpoint read n with no push after it: key what is raw.
    to_keys<TAG>(buf, keyed, n, start, nan_largest);
    __syncthreads();
}

// A range's stream, through the ring when the launch has one.
// RING: the kernel is built with the staged loop (the row path's; the split
// kernel without it: its code alone, never run, measured 1 us slower on 64 x
// 131,072).
template <int TAG, bool RING>
__device__ __forceinline__ void stream(u64* buf, Shared& sh, const void* row_scores, u32 start, u32 end,
                                       bool aligned, const ScanParams& P, u32 rate0) {
    if constexpr (RING && !FS_GLOBAL_BUF && Stage<TAG>::DEPTH >= 2) {
        if (P.stage) {  // uniform
            stream_range<TAG, true>(buf, sh, row_scores, start, end, aligned, P.cap, P.k, P.nan_largest, rate0);
            return;
        }
    }
    stream_range<TAG, false>(buf, sh, row_scores, start, end, aligned, P.cap, P.k, P.nan_largest, rate0);
}

// A sampled bound let fewer than `want` elements of [start, end) through, so
// it may have dropped some of the top k: the buffer is emptied and the range
// selected again, first from a fresh sample's bound with a margin of
// RESCUE_SD deviations (about twice the survivors; a cache checked the
// same way), and from lb = 0 only if that one fails too. The cost of a
// failure is then about one more sampled stream, not an exact stream from
// lb = 0 that pushes and compacts most of the range. fs_prof[slot] counts
// rescues, fs_prof[30] the ones that fell through to lb = 0. (The row path
// does the same in scan_impl's attempt loop.)
template <int TAG>
__device__ __noinline__ void rescue(u64* buf, Shared& sh, const void* row_scores, long long start, long long end,
                                    bool aligned, int cap, int k, int nan_largest, long long want, int slot) {
    // Scalars, not the ScanParams reference: a reference passed to an
    // out-of-line function makes the kernel copy its parameters to the stack
    // at entry (128 bytes per thread, paid on every launch).
    constexpr int TILE = FS_BLOCK * Elem<TAG>::ITEMS;
    const long long range = end - start;
    restart(sh, slot);
    if (sampling_applies<TAG>(range, k)) {  // uniform
        const u32 rate = sample_lb<TAG, 1>(sh, row_scores, start, end, aligned, k, nan_largest, (float)RESCUE_SD);
        __syncthreads();
        stream_range<TAG, false>(buf, sh, row_scores, (u32)start, (u32)end, aligned, cap, k, nan_largest, rate);
        __syncthreads();
        if ((long long)sh.count >= want) return;  // uniform
        restart(sh, 30);
    }
    stream_range<TAG, false>(buf, sh, row_scores, (u32)start, (u32)end, aligned, cap, k, nan_largest, (u32)TILE);
}

// ---------------------------------------------------------------------------
// Split rows, the last CTA's merge. Every CTA of a split row appends its exact
// top-min(k, n) to the row's candidate slots (at most chunks x k: no overflow)
// and counts itself done; the CTA that finishes last selects the row from the
// appended candidates. The top k of a union is the top k of the union of the
// parts' top k, so this one merge round is exact; with the row-wide bound the
// candidates number about k (1 + margin) in all, and at worst chunks x k.
// Visibility: candidates are written, fenced, then counted; the last CTA
// fences and reads them through L2 (ld.cg).

// Candidates base + j * FS_BLOCK + threadIdx.x of the row's slots (0 past
// total), all N loads issued before any is used.
template <int N>
__device__ __forceinline__ void load_slots(u64 (&c)[N], const u64* slots, u32 base, u32 total) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const u32 i = base + j * FS_BLOCK + threadIdx.x;
        c[j] = i < total ? __ldcg(slots + i) : 0ull;
    }
}

template <int TAG>
__device__ __forceinline__ void split_finish(const ScanParams& P, u64* buf, Shared& sh, int row, const void* row_scores,
                             bool aligned) {
    constexpr int ITEMS = 8;
    constexpr int TILE = FS_BLOCK * ITEMS;
    const int tid = threadIdx.x;
    __syncthreads();
    const u32 n = sh.count;
    const u32 m = n < (u32)P.k ? n : (u32)P.k;
    if (n > m) compact<Elem<TAG>::TOP_BIT>(buf, sh, n, m, m);
    if (tid == 0) sh.slot = atomicAdd(&P.row_count[row], m);
    __syncthreads();
    u64* slots = P.cand + (long long)row * P.chunks * P.k;
    for (u32 j = tid; j < m; j += FS_BLOCK) slots[sh.slot + j] = buf[j];
    __threadfence();
    __syncthreads();
    if (tid == 0) sh.last = atomicAdd(&P.row_done[row], 1u) == (u32)P.chunks - 1;
    __syncthreads();
    if (!sh.last) return;  // uniform
    __threadfence();
    const long long t_m = PROF_CLOCK();
    const u32 total = __ldcg(&P.row_count[row]);
    reset(sh);
    // With room for every candidate and a tile to spare, nothing is compacted
    // and lb stays 0, so the filter below would keep them all: copy them
    // (the buffer's order does not matter to the finish).
    // (The two loops below are the two ways, one of them empty; the measured
    // build has this form, an if/else compiles differently.)
    const bool copy = total + TILE <= (u32)P.cap;  // uniform
    for (u32 base = 0; copy && base < total; base += TILE) {
        u64 c[ITEMS];
        load_slots(c, slots, base, total);
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            const u32 i = base + j * FS_BLOCK + tid;
            if (i < total) buf[i] = c[j];
        }
    }
    if (copy && tid == 0) sh.count = total;
    for (u32 base = 0; !copy && base < total; base += TILE) {
        __syncthreads();
        const u32 cnt = sh.count;
        __syncthreads();  // read by all before anyone pushes: a uniform decision
        if (cnt + TILE > (u32)P.cap) compact<Elem<TAG>::TOP_BIT>(buf, sh, cnt, (u32)P.k, ((u32)P.cap - TILE + (u32)P.k) / 2);
        const u64 lb = sh.lb;
        // All ITEMS loads in flight before the first push: a push (ballot,
        // shared atomic, store) between two loads would make each wait out an
        // L2 round trip (this loop took ~5.7K cycles so, ~2.5K now).
        u64 c[ITEMS];
        load_slots(c, slots, base, total);
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) push(buf, sh, base + j * FS_BLOCK + tid < total && c[j] >= lb, c[j]);
    }
    __syncthreads();
    const int len = row_length(P.lengths, row, P.cols);
    if (P.row_lb[row] != 0ull && (int)sh.count < (len < P.k ? len : P.k)) {
        // The row's sampled bound admitted fewer than min(k, len) elements (a
        // sample unrepresentative by over SAMPLE_SD standard deviations:
        // ~1.6e-4 of random rows; flashsel check builds such data): this CTA
        // selects the whole row again (rescue).
        rescue<TAG>(buf, sh, row_scores, 0, len, aligned, P.cap, P.k, P.nan_largest, len < P.k ? len : P.k, 7);
    }
    finish_row<TAG>(buf, sh, P.k, finish_cap(P.cap, P.stage), P.order_index, P.out_idx, P.out_val, row_scores, row);
    if (tid == 0) PROF_ADD(9, PROF_CLOCK() - t_m);
}

// ---------------------------------------------------------------------------
// Scan: grid (chunks, row slots). CTA (p, y) handles chunk p of rows
// y, y + gridDim.y, ...; chunk p of a row of length len is
// [p * L, min(len, (p + 1) * L)) with L = roundup(ceil(len / chunks), 8), so
// work follows the active length, not the buffer width.

template <int TAG, bool SPLIT>
__device__ void scan_impl(const ScanParams& P) {
    typedef Elem<TAG> E;
    constexpr int TILE = FS_BLOCK * E::ITEMS;
    __shared__ Shared sh;
    u64* buf = cta_buffer(P.gbuf, P.cap);
    const int tid = threadIdx.x;
    const int p = blockIdx.x;
    constexpr bool split = SPLIT;  // the host launches fs_split_* iff chunks > 1
    // A row-path call's only kernel: wait for the stream's previous kernel
    // (the call chain) before the lengths and scores. Both kernels let the
    // next call's first kernel launch now; it waits for this grid.
    if (!split) CHAIN_WAIT();
    CHAIN_TRIGGER();

    for (int row = blockIdx.y; row < P.rows; row += gridDim.y) {
        reset(sh);
        const int len = row_length(P.lengths, row, P.cols);
        long long start, end;
        chunk_range(len, P.chunks, p, start, end);
        const void* row_scores = row_start<TAG>(P, row);
        const bool aligned = aligned16(row_scores);

        const long long t_row = PROF_CLOCK();
        // SAMPLING. A split row's CTAs all start from the row-wide key bound
        // (fs_prep_*). A long range of a one-CTA row takes its own sample: lb
        // starts at the bound, the stream keeps about k (1 + margin) survivors
        // and rarely compacts; if fewer than min(k, range) elements pass, the
        // range is streamed again from a wider sampled bound, then from lb = 0
        // (exact either way; fs_prof[6] counts restarts, fs_prof[30] those
        // that fell through to lb = 0).
        const long long range = end - start;
        if (split) {
            if (PDL_ON) {
                // Until prep is done: ask L2 for this CTA's chunk.
                const char* r = (const char*)row_scores + (long long)start * (long long)sizeof(typename E::raw);
                const long long bytes = (end - start) * (long long)sizeof(typename E::raw);
                for (long long o = (long long)tid * 128; o < bytes; o += FS_BLOCK * 128)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(r + o));
                PDL_WAIT();
            }
            if (tid == 0) sh.lb = P.row_lb[row];
            __syncthreads();
        }
        bool sampled = !split && sampling_applies<TAG>(range, P.k);
        const long long want = range < P.k ? range : P.k;
        // Attempts (one call site each for the sample and the stream: the
        // kernel is at its register limit): the sampled bound; if it lets
        // fewer than `want` through, a fresh sample's bound RESCUE_SD
        // deviations wide (about twice the survivors); then lb = 0.
        float sd = (float)SAMPLE_SD;
        for (int attempt = 0;; ++attempt) {  // uniform
            u32 rate0 = TILE;  // the first segment's pushes per tile, before any is measured
            if (sampled) {
                rate0 = sample_lb<TAG, ROW_SAMPLE>(sh, row_scores, start, end, aligned, P.k, P.nan_largest, sd);
                __syncthreads();
            }
            stream<TAG, !SPLIT>(buf, sh, row_scores, (u32)start, (u32)end, aligned, P, rate0);
            __syncthreads();
            if (!sampled || (long long)sh.count >= want) break;
            restart(sh, attempt == 0 ? 6 : 30);
            sampled = attempt == 0;
            sd = (float)RESCUE_SD;
        }
        const long long t_fin = PROF_CLOCK();
        if (split) {
            split_finish<TAG>(P, buf, sh, row, row_scores, aligned);
        } else {
            finish_row<TAG>(buf, sh, P.k, finish_cap(P.cap, P.stage), P.order_index, P.out_idx, P.out_val, row_scores,
                            row);
        }
        if (tid == 0) {
            PROF_ADD(3, PROF_CLOCK() - t_fin);
            PROF_ADD(0, PROF_CLOCK() - t_row);
            PROF_ADD(4, 1);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------
// Prep (split rows): grid (1, row slots), before the scan. Zeroes the row's
// candidate and done counters and writes row_lb[row]: the key bound of
// sample_lb over the whole active length, or 0 when the row is too short for a
// sample to pay (16 tiles, k at most an eighth of it).

template <int TAG>
__device__ void prep_impl(const ScanParams& P) {
    __shared__ Shared sh;
    // The call's first kernel: the stream's previous kernel is done (its
    // scores and lengths written) before anything is read.
    CHAIN_WAIT();
    // fs_split_* may launch now; it waits for this grid before reading its
    // results (its chunk's scores it may read at once).
    PDL_TRIGGER();
    for (int row = blockIdx.y; row < P.rows; row += gridDim.y) {
        reset(sh);
        const int len = row_length(P.lengths, row, P.cols);
        const void* row_scores = row_start<TAG>(P, row);
        const bool aligned = aligned16(row_scores);
        const bool eligible = sampling_applies<TAG>(len, P.k);
        if (eligible) {
            sample_lb<TAG, PREP_SAMPLE>(sh, row_scores, 0, len, aligned, P.k, P.nan_largest);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            P.row_lb[row] = eligible ? sh.lb : 0ull;
            P.row_count[row] = 0;
            P.row_done[row] = 0;
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------
// Grid rows: fs_grid_init_all, then fs_grid_*. A cooperative launch of
// `chunks` CTAs per row (all resident: the host launches with the cooperative
// attribute, at most one CTA per SM), for rows whose chunk fits the CTA's
// registers (<= FS_BLOCK * GRID_ITEMS elements).
//
// ALGORITHM
//   Every CTA loads its chunk once, into registers, as order keys, and with
//   it the row-wide sample: the same VEC elements per thread in every CTA of
//   the row (rows of at least 4 x 512 x VEC elements whose
//   k needs at most GRID_SAMPLE_TOPS sample keys a warp). The row's
//   CTAs then run an exact MSD radix select together on the grid composite
//       g = key << 32 | (len - 1 - column)
//   (the contract's order: larger key, then lower column; the low word needs
//   only bit_width(len - 1) bits, so a plateau costs passes only for the bits
//   its columns use). Each pass: every CTA histograms (shared memory) the next
//   digit (<= 11 bits) of its composites that match the prefix decided so
//   far and adds the non-zero bins to the row's global histogram of that
//   pass; then each CTA reads the whole histogram until its counts add up to
//   the composites the pass counts (len, then the previous crossing bin's
//   count: no barrier needed, counts only grow) and, identically, finds
//   the crossing bin:
//   the one that holds the r-th largest (r: how many the prefix still
//   needs). The passes stop
//   when that bin is wanted whole or holds at most GRID_SMALL composites
//   (random f32 rows: 2 passes; the last possible pass has one-composite
//   bins, so the loop ends: at most 6).
//   The sampled pass, where a row has its sample, comes first: each CTA
//   takes its warps' largest sample keys (a warp's top `tops`), and the
//   rs-th largest of those (ranked by warp 0 alone), rs = the sample keys
//   expected at or above the k-th plus GRID_SAMPLE_SD deviations, is the
//   bound s_lo: at least rs sample keys reach it. Bins of 2^s_shift keys
//   from s_lo (s_lo a multiple
//   of it; the sample's largest key in the lower half of the 2048 bins; the
//   last bin takes everything above) count the keys >= s_lo, and a tally
//   word (CTAs added, keys counted) tells the readers the total to wait
//   for. A crossing bin other than the last is a key prefix, so the passes
//   go on below it as below any pass's crossing bin (random f32 rows: none
//   needed, the bin holds ~3-30 keys). Fewer than m counted, or the k-th
//   in the last bin: the bound missed, and the passes run from the top as
//   without a sample (the histograms have a slot each). A bound tied in the
//   sample (a plateau: ReLU zeros, equal rows) takes one key a bin, so the
//   plateau's key is decided by this pass and only column passes follow.
//   Gather: each CTA appends its composites at or above the crossing bin's
//   lower edge to the row's list (<= k - 1 + GRID_SMALL entries: the bins
//   above, then the crossing bin), one global atomic per CTA; one more
//   barrier. Where the sampled pass decided the crossing bin (random rows),
//   the list is laid out by its bins instead, with no counter:
//   bin d starts at the count of the bins above it,
//   each CTA's keys of d at the place its flush's atomic on d returned.
//   Every CTA copies the list to shared memory. Index order only: if the
//   crossing bin is not wanted whole, its r-th largest T is found there by
//   counting (<= GRID_SMALL^2 compares); the selection is exactly
//   { g >= T }.
//   Place: each CTA places its share of the list, a warp counting the
//   entries ahead of each. Score order: the entries with a larger g, i.e.
//   the entry's rank in the list; it is selected and written there iff the
//   rank is below m (no T). Index order: the selected entries with a larger
//   low word (a lower column). Values come back from the keys, except where a key merged
//   several encodings (zeros, NaNs): those are read from the row (their own
//   bits: NaN payloads, -0.0).
//
// INVARIANTS
//   - Grid composites are unique in a row, so ranks and T are exact and the
//     positions are a permutation of 0..m, whatever order the list was
//     appended in: the output does not depend on scheduling.
//   - Every CTA of a row takes the same decisions from the same global
//     histogram (read only once complete: its total is the count of
//     composites the pass counts, and no bin exceeds its final count);
//     barrier and loop bounds are uniform over the row's CTAs.
//   - The sample's bound decides nothing: every CTA computes the same s_lo
//     and s_shift from the same elements, and the crossing bin it yields
//     is the exact one whenever the pass counts at least m keys and the
//     k-th is not in the last bin; otherwise the exact passes run from the
//     top. The tally is read with the histogram: once every CTA has added,
//     the bins are trusted only when they add up to its total.
//   - Global state (barrier and list counters, the tally, one histogram per
//     pass) is zeroed by fs_grid_init_all before each run, never assumed; a
//     barrier or histogram read that waits over 4 s traps rather than hangs
//     (co-residency broken).
//   - The shared histogram is all zero at the start of every pass: the CTA
//     clears it once, and each pass clears the bins it filled as it adds
//     them to the global histogram.
//
// COST
//   Reads: each score once (+ one read per selected zero or NaN value), and
//   the sample (512 x 16 bytes) by every CTA of the row. The sampled pass:
//   a warp max and one CTA barrier for the bound, then a histogram of the
//   keys >= s_lo (about 1% of the row). Per pass: a
//   shared histogram over the CTA's matching composites, <= 2048 global
//   atomics per CTA, reads of the global histogram (one 16-byte load per
//   thread each) until it is complete (the sampled pass: one thread polls
//   the tally word until every CTA has added). Then one
//   atomic (none with the bin layout) and one barrier for the list, and the
//   placement: about (k + GRID_SMALL)^2 / chunks compares per CTA (the
//   planner bounds it). The work per element is unrolled over a thread's
//   elements: fs_grid8_* (8 a thread) for chunks of at most FS_BLOCK x 8
//   issue about half the instructions of fs_grid_*'s 16 in those phases.

enum : int { GRID_SAMPLE_SD = 4 };  // the sampled pass's margin in its rank, standard deviations
// A CTA whose placement reads at least this many staged entries (its entries
// x the padded list) places two a warp (see the placement's measurements).
enum : int { GRID_PLACE_PAIR = 32768 };
// The host's grid layout (compile.rs passes plan::GRID_MAX_K, GRID_SMALL and
// GRID_STATE_WORDS): the most k, the list's room past k, the state per row.
#if !defined(FS_HOST_GRID_MAX_K) || !defined(FS_HOST_GRID_SMALL) || !defined(FS_HOST_GRID_STATE_WORDS)
#error "the host passes FS_HOST_GRID_MAX_K, FS_HOST_GRID_SMALL and FS_HOST_GRID_STATE_WORDS"
#endif
// The placement reads the staged list GRID_STEP entries a round (8 per
// lane); the stage is padded to a multiple of it.
#define GRID_STEP 256
// Stage loads per thread: the longest list, rounded up to GRID_STEP, over
// FS_BLOCK threads.
#define GRID_STAGE_ROUNDS \
    ((FS_HOST_GRID_MAX_K + FS_HOST_GRID_SMALL + GRID_STEP - 1) / GRID_STEP * GRID_STEP / FS_BLOCK + 1)
enum : int { GRID_SMALL = 256 };  // a crossing bin this small ends the passes (the most the host sizes for)
#define GRID_ITEMS 16   // elements per thread in registers
#define GRID_BINS 2048  // 11-bit digits
#define GRID_PASSES 6   // ceil(32 / 11) key passes + ceil(31 / 11) column passes
#define GRID_SLOTS (1 + GRID_PASSES)  // histograms: slot 0 the sampled pass's, slot 1 + i pass i's
#define GRID_SAMPLE_TOPS 4  // the sampled pass: at most this many sample keys a warp (else no sample)
// Per row: barrier and list counters (line 0), the sampled pass's tally
// (line 1), then GRID_SLOTS histograms.
#define GRID_HDR 64  // two 128-byte lines: barrier and list counters; the sampled pass's tally
#define GRID_STATE_WORDS (GRID_HDR + GRID_SLOTS * GRID_BINS)
static_assert(FS_BLOCK == 512, "grid_crossing: one 16-byte histogram load per thread, 16 warps");
static_assert(GRID_SMALL <= FS_HOST_GRID_SMALL, "the host sizes each row's list for k + FS_HOST_GRID_SMALL");
static_assert(GRID_STATE_WORDS == FS_HOST_GRID_STATE_WORDS, "the host's state layout differs");

__device__ __forceinline__ u32 ld_acquire_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add(u32* p, u32 v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The row's CTAs meet: returns when all `chunks` of them have arrived
// `target / chunks` times. Writes (and atomics) before it, by any thread of
// these CTAs, are visible to every thread of them after it: bar.sync, then
// thread 0's release add; its acquire poll, then bar.sync.
__device__ __forceinline__ void grid_barrier(u32* counter, u32 target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        red_release_add(counter, 1u);
        const unsigned long long t0 = global_ns();
        while (ld_acquire_u32(counter) < target) {
            if (global_ns() - t0 > 4000000000ull) __trap();
        }
    }
    __syncthreads();
}

struct GridShared {
    u32 hist[GRID_BINS];
    u32 part[WARPS];
    u32 bin, above, cnt, base, nsmall;
    u32 scand[GRID_SAMPLE_TOPS * WARPS];  // each warp's largest sample keys
    u32 admitted;                             // the CTA's keys in the sampled pass
    u32 s_lo, s_shift;                        // warp 0's bound for the CTA
    u64 T;
    u64 tally;  // the row's tally word as last read
    u64 small[GRID_SMALL];
    // The list by bin: bin b's first list entry for this CTA (the keys of
    // the row in bins above b, then the other CTAs' keys in b before it).
    u32 binpos[GRID_BINS];
};

struct GridInitParams {
    u32* state;       // rows x GRID_STATE_WORDS
    long long words;
};
// Zeroes every row's grid state (grid: any; each thread strides). Lets a
// programmatically dependent fs_grid_* start at once.
extern "C" __global__ void __launch_bounds__(FS_BLOCK) fs_grid_init_all(const GridInitParams p) {
    // The stream's previous kernel (which may be the last call's fs_grid_*,
    // reading this state; or the one writing the scores that fs_grid_*
    // loads before its own wait) is done before fs_grid_* may start.
    CHAIN_WAIT();
    PDL_TRIGGER();
    for (long long i = (long long)blockIdx.x * FS_BLOCK + threadIdx.x; i < p.words; i += (long long)gridDim.x * FS_BLOCK)
        p.state[i] = 0u;
}

__device__ __forceinline__ uint4 ld_relaxed_v4(const u32* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_relaxed_u32(const u32* p) {
    u32 v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 ld_relaxed_u64(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// The sampled pass's tally word: each CTA adds GRID_TALLY_ONE plus the keys
// it counted, so the word says how many CTAs have added and what they
// counted in all.
#define GRID_TALLY_ONE (1ull << 40)
#define GRID_NO_BIN 0xffffffffu

// The crossing bin of a row's global histogram of nbins (<= GRID_BINS)
// bins, from the top: the bin b with above < r <= above + cnt, above = the
// count in bins above b. Every thread returns the same (b, above, cnt);
// b = GRID_NO_BIN where the histogram holds fewer than r.
// expected == 0 and no tally: complete (a grid barrier came first).
// expected > 0: the row's CTAs may still be adding to it; it
// is read again until its counts add up to `expected`, the composites the
// pass counts. Counts only grow, so a read whose total is `expected` saw
// every bin's final count: the reads replace the pass's grid barrier.
// tally (the sampled pass, whose total no CTA knows in advance): as
// expected > 0, with `expected` the total the tally word gives once all
// `chunks` CTAs have added to it.
// Adds the CTA's non-zero shared bins (of nbins) to the row's histogram
// ghist and clears them, so the shared histogram is zero for the next pass.
// place[j]: bin threadIdx.x + j * FS_BLOCK's count before this CTA's add,
// i.e. the CTA's place among the row's keys of that bin (0 where the CTA
// has none). A caller that ignores it gets reductions, not returning atomics.
#define GRID_FLUSH_J (GRID_BINS / FS_BLOCK)
__device__ __forceinline__ void grid_flush(GridShared& gs, u32* ghist, u32 nbins, u32 (&place)[GRID_FLUSH_J]) {
#pragma unroll
    for (int j = 0; j < GRID_FLUSH_J; ++j) {
        const u32 b = threadIdx.x + (u32)j * FS_BLOCK;
        place[j] = 0u;
        if (b < nbins) {
            const u32 v = gs.hist[b];
            if (v) {
                place[j] = atomicAdd(&ghist[b], v);
                gs.hist[b] = 0u;
            }
        }
    }
}

__device__ __forceinline__ void grid_crossing(GridShared& gs, const u32* ghist, u32 nbins, u32 r, u32& b, u32& above,
                                              u32& cnt, u32 expected, const u64* tally = nullptr, u32 chunks = 0,
                                              u32* above_out = nullptr) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool poll = expected || tally;  // uniform
    const unsigned long long t0 = poll && tid == 0 ? global_ns() : 0ull;
    if (tid == 0) gs.bin = GRID_NO_BIN;  // read after the loop's CTA barriers
    // Until every CTA has added to the tally, one thread
    // reads its word alone; the histogram reads below then start from a
    // total that is final (the bins themselves may still lag behind it).
    if (tally) {
        if (tid == 0) {
            while ((u32)(ld_relaxed_u64(tally) / GRID_TALLY_ONE) < chunks) {
                if (global_ns() - t0 > 4000000000ull) __trap();
            }
        }
        __syncthreads();
    }
    // Thread t holds bins nbins-1-4t .. nbins-4-4t (c[0] the highest).
    u32 c[4], s, before;
    for (;;) {  // uniform
        c[0] = c[1] = c[2] = c[3] = 0u;
        if (tally && tid == 0) gs.tally = ld_relaxed_u64(tally);
        if (nbins >= 4) {
            if ((u32)(4 * tid) < nbins) {
                const u32* at = ghist + nbins - 4 * (tid + 1);
                const uint4 w = poll ? ld_relaxed_v4(at) : __ldcg((const uint4*)at);
                c[0] = w.w, c[1] = w.z, c[2] = w.y, c[3] = w.x;
            }
        } else if (tid == 0) {
#pragma unroll
            for (u32 q = 0; q < 4; ++q)
                if (q < nbins) c[q] = poll ? ld_relaxed_u32(ghist + nbins - 1 - q) : __ldcg(ghist + nbins - 1 - q);
        }
        s = c[0] + c[1] + c[2] + c[3];
        u32 incl = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 v = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += v;
        }
        if (lane == 31) gs.part[warp] = incl;
        __syncthreads();
        const u32 part = lane < WARPS ? gs.part[lane] : 0u;
        before = __reduce_add_sync(FULL_MASK, lane < warp ? part : 0u) + incl - s;
        if (!poll) break;
        u32 want = expected;
        if (tally) {
            const u64 t = gs.tally;
            want = (u32)(t / GRID_TALLY_ONE) == chunks ? (u32)(t % GRID_TALLY_ONE) : 0xffffffffu;
        }
        if (__reduce_add_sync(FULL_MASK, part) == want) break;
        // The same co-residency guard as grid_barrier's.
        if (tid == 0 && global_ns() - t0 > 4000000000ull) __trap();
        __syncthreads();  // gs.part is rewritten by the next read
    }
    if (above_out) {  // each bin's count of the bins above it
        u32 acc = before;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if ((u32)(4 * tid + q) < nbins) above_out[nbins - 1 - (4 * tid + q)] = acc;
            acc += c[q];
        }
    }
    if (before < r && r <= before + s) {  // exactly one thread
        u32 acc = before;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (acc < r && r <= acc + c[q]) {
                gs.bin = nbins - 1 - (4 * tid + q);
                gs.above = acc;
                gs.cnt = c[q];
            }
            acc += c[q];
        }
    }
    __syncthreads();
    b = gs.bin, above = gs.above, cnt = gs.cnt;
    __syncthreads();  // gs is rewritten by the next call
}

// PLACE (grid rows): entries [e_lo, e_hi) of the row's staged list, a warp
// per EPW entries, its lanes counting the entries ahead of each in the n_pad
// staged ones (every staged entry read is compared with the EPW entries: EPW
// 2 halves the shared reads, GRID_PLACE_PAIR). Score order: ahead is the
// entry's rank in the list, and it is selected iff ahead < m. Index order:
// only entries >= T are selected, and ahead counts the selected ones with
// lower columns. Either way the count is the entry's output slot.
template <int TAG, int EPW>
__device__ __forceinline__ void grid_place(const ScanParams& P, const u64* stage, u32 e_lo, u32 e_hi, u32 n_pad, u64 T,
                                           u32 m, int row, u32 lenm1, const void* row_scores, bool prof,
                                           unsigned long long& t_prev) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
        PROF_STAMP(prof, PROF_NS(), t_prev, 18);
#pragma unroll
        for (int a = 0; a < EPW; ++a) {
            const u32 ahead = __reduce_add_sync(FULL_MASK, c[a]);
            if (lane == a && x[a] != ~0ull && ahead < m) {  // (index order: always below m)
                const long long o = (long long)row * P.k + ahead;
                const u32 col = lenm1 - (u32)x[a];
                P.out_idx[o] = (int)col;
                if (P.out_val) store_bits<TAG>(P.out_val, o, value_bits<TAG>((u32)(x[a] >> 32), row_scores, col));
            }
        }
    }
}

// ITEMS: elements a thread holds (fs_grid_*: GRID_ITEMS, fs_grid8_*: 8 for
// chunks of at most FS_BLOCK x 8, whose per-item phases then issue half the
// instructions; fs_grid4_f32: 4, f32 chunks of at most FS_BLOCK x 4).
template <int TAG, int ITEMS>
__device__ void grid_impl(const ScanParams& P) {
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
    const int len = row_length(P.lengths, row, P.cols);
    const u32 m = (u32)(len < P.k ? len : P.k);
    const bool prof = FS_PROFILE && p == 0 && tid == 0;
    unsigned long long t_prev = PROF_NS();
    const unsigned long long t_start = t_prev;
    const long long c_start = PROF_CLOCK();
    // ns since the last stamp into fs_prof[slot] (CTA 0, thread 0).
#define GRID_STAMP(slot) PROF_STAMP(prof, PROF_NS(), t_prev, slot)
    u32 start, end;
    chunk_range(len, chunks, p, start, end);
    const void* row_scores = row_start<TAG>(P, row);
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
        GRID_STAMP(22);
        // Each warp's `tops` largest sample keys (a round: the warp's
        // largest, struck from the lane that holds it) into gs.scand; the
        // bound is the rs-th largest of those nc = tops * WARPS keys, so
        // at least rs sample keys are at or above it, and smax the largest.
        u32 sk[VEC];
#pragma unroll
        for (int q = 0; q < VEC; ++q) sk[q] = order_key<TAG>(unpack<TAG>(sample_vec, q), P.nan_largest);
        if (prof && sk[0] == 0x5eed5eedu) PROF_ADD(39, 1);  // FS_PROFILE: the stamp waits for the sample's loads
        GRID_STAMP(36);
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
        GRID_STAMP(40);
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
        GRID_STAMP(37);
    }
    const u32 lenm1 = len > 0 ? (u32)len - 1u : 0u;
    const u32 mine = end > start ? end - start : 0u;  // elements of this CTA
    // Element i's offset in the chunk and grid composite.
#define GRID_OFF(i) ((u32)(((i) / VEC) * FS_BLOCK + tid) * VEC + (u32)((i) % VEC))
#define GRID_G(i) (((u64)key[i] << 32) | (u64)(lenm1 - (start + GRID_OFF(i))))

    // fs_grid_init_all's zeroes must be visible before the first global write.
    PDL_WAIT();
    u32* state = P.row_count + (long long)row * GRID_STATE_WORDS;
    u32* bar = state;
    u32* list_count = state + 1;
    // The sampled pass's tally, on a line of its own: the CTAs poll it while
    // others add to the list counter (state is 8-byte aligned).
    u64* tally = (u64*)(state + 32);
    u64* list = P.cand + (long long)row * (P.k + FS_HOST_GRID_SMALL);
    u32 barriers = 0;
    __syncthreads();
    if (sampled) {  // uniform; written by warp 0 before the barrier
        s_lo = gs.s_lo;
        s_shift = gs.s_shift;
    }
    GRID_STAMP(sampled ? 32 : 22);  // sampled: 32 holds the wait for fs_grid_init_all's zeroes

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
            GRID_STAMP(23);
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
                if (prof) PROF_ADD(33, 1);
            } else if (prof) {
                PROF_ADD(34, 1);
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
            if (prof) PROF_ADD(21, 1);
            GRID_STAMP(25);
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
            GRID_STAMP(23);
            if (prof) PROF_ADD(21, 1);
            u32 b, above;
            grid_crossing(gs, ghist, nbins, r, b, above, cnt, matching);
            matching = cnt;
            r -= above;
            edge |= (u64)b << lo;
            lo_last = lo;
            GRID_STAMP(25);
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
        GRID_STAMP(38);
    } else {
        const u32 nsel = __reduce_add_sync(FULL_MASK, (u32)__popc(sel_mask));
        const u32 warp_sel = __reduce_or_sync(FULL_MASK, sel_mask);
        u32 wbase = 0;
        if (lane == 0 && nsel) wbase = atomicAdd(&gs.nsmall, nsel);  // nsmall doubles as the CTA's count
        __syncthreads();
        if (tid == 0 && gs.nsmall) gs.base = atomicAdd(list_count, gs.nsmall);
        __syncthreads();
        GRID_STAMP(38);
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
    GRID_STAMP(26);
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
    GRID_STAMP(27);
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
    GRID_STAMP(30);

    // PLACE this CTA's share of the list, then its share of the padding.
    // Pairs where the CTA's shared reads (its entries x the staged list)
    // are many: 1 x 1,048,576 k 2048 (16 x 2,304) -0.2 us, 1 x 131,072 k
    // 2048 -1.2 us; a CTA of 10 entries of 1,280 measured 0.2 us slower.
    if ((u64)(e_hi - e_lo) * n_pad >= (u64)GRID_PLACE_PAIR)
        grid_place<TAG, 2>(P, stage, e_lo, e_hi, n_pad, T, m, row, lenm1, row_scores, prof, t_prev);
    else
        grid_place<TAG, 1>(P, stage, e_lo, e_hi, n_pad, T, m, row, lenm1, row_scores, prof, t_prev);
    const u32 npad = (u32)P.k - m;
    const u32 p_lo = (u32)((u64)npad * p / chunks), p_hi = (u32)((u64)npad * (p + 1) / chunks);
    for (u32 j = p_lo + tid; j < p_hi; j += FS_BLOCK) write_padding<TAG>(P.out_idx, P.out_val, (long long)row * P.k + m + j);
    GRID_STAMP(28);
    if (prof) {
        PROF_ADD(20, 1);
        PROF_ADD(29, PROF_NS() - t_start);
        PROF_ADD(19, PROF_CLOCK() - c_start);
    }
#undef GRID_STAMP
}

// Row path (one CTA per row): two CTAs per SM. Split path: room for the last
// CTA's merge; its grids are small (one row's CTAs spread over the GPU).
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_f32(const ScanParams p) { scan_impl<32, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_bf16(const ScanParams p) { scan_impl<16, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_f16(const ScanParams p) { scan_impl<15, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_f32(const ScanParams p) { scan_impl<32, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_bf16(const ScanParams p) { scan_impl<16, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_f16(const ScanParams p) { scan_impl<15, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_f32(const ScanParams p) { prep_impl<32>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_bf16(const ScanParams p) { prep_impl<16>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_f16(const ScanParams p) { prep_impl<15>(p); }
// Grid rows: one CTA per SM at most (cooperative launch).
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_f32(const ScanParams p) { grid_impl<32, GRID_ITEMS>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_bf16(const ScanParams p) { grid_impl<16, GRID_ITEMS>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_f16(const ScanParams p) { grid_impl<15, GRID_ITEMS>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_f32(const ScanParams p) { grid_impl<32, 8>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_bf16(const ScanParams p) { grid_impl<16, 8>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_f16(const ScanParams p) { grid_impl<15, 8>(p); }
// f32 only: a 16-bit type's VEC group is 8 elements.
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid4_f32(const ScanParams p) { grid_impl<32, 4>(p); }
