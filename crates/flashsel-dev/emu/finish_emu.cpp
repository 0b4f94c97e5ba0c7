// Host emulation of the filter's index-order finish
// (kernels/select/filter/index_order.cuh) and of the bucket-rank finish it
// stands beside (bucket.cuh), one CTA of 256 threads: on candidate sets
// built to reach each branch (spread keys, tied keys spread by column, a
// plateau crossing m, m = n, wide column ranges, short scratch) and on 150
// random ones (sizes, k, key spreads and column ranges drawn), every
// result against the reference written from the contract (the top m
// composites, in column order, words swapped); where index_select declines,
// the buffer must be untouched. Nothing may be written past the scratch.
#include "shim.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "select/filter/index_order.cuh"

u64 dyn_smem[1];  // types.cuh's declaration (unused here)

struct Args {
    u64* buf;
    u32 n, m, cap;
    int old_path;  // bucket_rank by score, then by column (finish.cuh's fallback)
};
Shared g_sh;
bool g_taken;

void kern(const Args a) {
    if (!a.old_path) {
        const bool r = index_select(a.buf, g_sh, a.n, a.m, a.cap);
        if (threadIdx.x == 0) g_taken = r;
        return;
    }
    const bool r = bucket_rank(a.buf, g_sh, a.n, a.m, a.cap);
    if (threadIdx.x == 0) g_taken = r;
    if (!r) return;
    for (u32 i = threadIdx.x; i < a.m; i += FS_BLOCK) a.buf[i] = (a.buf[i] << 32) | (a.buf[i] >> 32);
    __syncthreads();
    if (!bucket_rank(a.buf, g_sh, a.m, a.m, a.cap)) sort_desc(a.buf, a.m, 0);
}

struct Case {
    const char* what;
    std::vector<u64> c;  // unique composites: key << 32 | (0xffffffff - column)
    u32 m, cap;
    int expect;  // 1: index_select must take it, 0: must decline, -1: either
};

static std::mt19937_64 rng(12345);

// n composites with distinct columns from [c0, c0 + span) and keys from key(i).
template <class Key>
static std::vector<u64> make(u32 n, u32 c0, u32 span, Key key) {
    // Both ends of the range, then distinct random columns.
    std::vector<u32> cols{c0, c0 + span - 1};
    std::vector<u32> seen = cols;
    std::sort(seen.begin(), seen.end());
    while (cols.size() < n) {
        const u32 c = c0 + (u32)(rng() % span);
        auto it = std::lower_bound(seen.begin(), seen.end(), c);
        if (it != seen.end() && *it == c) continue;
        seen.insert(it, c);
        cols.push_back(c);
    }
    cols.resize(n);
    std::shuffle(cols.begin(), cols.end(), rng);
    std::vector<u64> out(n);
    for (u32 i = 0; i < n; ++i) out[i] = ((u64)key(i) << 32) | (u64)(0xffffffffu - cols[i]);
    return out;
}

// The order key of a positive float (flashsel's key transform on f32 >= 0).
static u32 fkey(float f) {
    u32 u;
    std::memcpy(&u, &f, 4);
    return u | 0x80000000u;
}

static std::vector<u64> want_of(std::vector<u64> c, u32 m) {
    std::sort(c.begin(), c.end(), std::greater<u64>());
    c.resize(m);
    for (auto& x : c) x = (x << 32) | (x >> 32);
    std::sort(c.begin(), c.end(), std::greater<u64>());
    return c;
}

int main() {
    std::vector<Case> cases;
    const u32 big = 30000;
    std::exponential_distribution<float> ex(1.0f);
    for (u32 n : {2u, 3u, 100u, 700u, 3060u, 5000u}) {
        for (u32 m : {1u, n / 2, 512u, 2048u, n}) {
            if (m == 0 || m > n) continue;
            // A merge's tail of normal scores over the bitmap's widest range,
            // and over DSA's 131,072 columns (past it: declined).
            cases.push_back({"f32 tail, 65,536 columns", make(n, 1, 65536, [&](u32) { return fkey(2.0f + ex(rng)); }), m, big, 1});
            cases.push_back({"f32 tail, 131,072 columns", make(n, 1, 131072, [&](u32) { return fkey(2.0f + ex(rng)); }), m, big, 0});
            cases.push_back({"random keys, 65,536 columns", make(n, 0, 65536, [&](u32) { return (u32)rng(); }), m, big, 1});
            // Few distinct keys (bf16 scores): buckets split ties by column.
            cases.push_back({"40 key values", make(n, 7, 131072, [&](u32) { return 0x80000000u + (u32)(rng() % 40); }), m, big, -1});
            cases.push_back({"dense columns", make(n, 100, n + 3, [&](u32) { return fkey(ex(rng)); }), m, big, 1});
        }
    }
    // A plateau of equal keys crossing m among spread keys: declined.
    for (u32 n : {700u, 3060u}) {
        const u32 m = n / 2;
        cases.push_back({"plateau across m", make(n, 0, 131072, [&](u32 i) { return i < n / 4 ? fkey(9.0f + ex(rng)) : (i < 3 * n / 4 ? fkey(1.0f) : fkey(ex(rng) * 0.5f)); }), m, big, 0});
    }
    // A plateau wholly above m: its bucket is taken whole.
    cases.push_back({"plateau above m", make(3060, 0, 65536, [&](u32 i) { return i < 1000 ? fkey(5.0f) : fkey(ex(rng)); }), 2048, big, 1});
    // Column ranges past the bitmap: declined.
    cases.push_back({"columns past the bitmap", make(3060, 0, 2048 * 32 + 1, [&](u32) { return (u32)rng(); }), 2048, big, 0});
    cases.push_back({"columns at the bitmap", make(3060, 5, 2048 * 32, [&](u32) { return (u32)rng(); }), 2048, big, 1});
    // Short scratch: the tables (the bitmap of at most NB words fits theirs).
    cases.push_back({"no room for the tables", make(3060, 0, 65536, [&](u32) { return (u32)rng(); }), 2048, 3060 + 2048 + 64 + 2047, 0});
    cases.push_back({"room for the tables", make(3060, 0, 65536, [&](u32) { return (u32)rng(); }), 2048, 3060 + 2048 + 64 + 2048, 1});

    // Random sets: sizes, k, key spreads (from all-distinct to a handful of
    // values) and column ranges drawn at random.
    for (int i = 0; i < 150; ++i) {
        const u32 n = 2 + (u32)(rng() % 6000), m = 1 + (u32)(rng() % n);
        const u32 values = 1u << (rng() % 33 > 31 ? 31 : rng() % 32);  // distinct keys at most
        const u32 span = n + (u32)(rng() % (rng() % 2 ? 400000 : 4 * n + 1));
        const u32 base = 0x80000000u + (u32)(rng() % 1000);
        cases.push_back({"random", make(n, (u32)(rng() % 1000), span, [&](u32) {
                             return base + (values >= 0x40000000u ? (u32)(rng() % 0x7fff0000u) : (u32)(rng() % values));
                         }), m, big, -1});
    }

    int fails = 0, taken = 0, declined = 0;
    for (const Case& cs : cases) {
        const u32 n = (u32)cs.c.size();
        for (int old_path = 0; old_path < 2; ++old_path) {
            const u64 guard = 0x5a5a5a5a5a5a5a5aull;
            std::vector<u64> buf(cs.cap + 64, guard);
            std::copy(cs.c.begin(), cs.c.end(), buf.begin());
            // Scratch poisoned (the guard pattern) past the input.
            launch(kern, 1, Args{buf.data(), n, cs.m, cs.cap, old_path});
            const bool took = g_taken;
            bool ok = true;
            const char* why = "";
            for (u32 i = cs.cap; i < cs.cap + 64; ++i) ok = ok && buf[i] == guard;
            if (!ok) why = "wrote past the scratch";
            if (ok && took) {
                const auto want = want_of(cs.c, cs.m);
                ok = std::equal(want.begin(), want.end(), buf.begin());
                if (!ok) why = "wrong selection or order";
            } else if (ok) {
                ok = std::equal(cs.c.begin(), cs.c.end(), buf.begin());
                if (!ok) why = "declined but changed the input";
            }
            if (!old_path && cs.expect >= 0 && took != (cs.expect == 1)) {
                ok = false;
                why = cs.expect ? "declined a case it must take" : "took a case it must decline";
            }
            if (!old_path) (took ? taken : declined)++;
            if (!ok) {
                ++fails;
                std::printf("FAIL %s: n %u m %u cap %u (%s): %s\n", cs.what, n, cs.m, cs.cap,
                            old_path ? "bucket rank" : "index_select", why);
            }
        }
    }
    std::printf("finish emulation: %zu cases, index_select took %d, declined %d (each also through bucket rank): %d failed\n",
                cases.size(), taken, declined, fails);
    return fails ? 1 : 0;
}
