// The DSA indexer's scores (kernels/indexer/dsa_scores.cu, the tensor-core
// kernel of indexer/dsa/score.cuh) run on the host under shim.h (128
// threads, real warp exchanges, the mma by shim.h's model) against the
// device order written here from the contract (crates/flashsel/src/ops/dsa/
// mod.rs, "The CUDA engine's order": the bf16 terms and the dimensions of
// each 16-dimension step, relu, the weight, the head chunks, lane pairs and
// quad tree, the running sum, one scale, the canonical NaN). The model's
// mma sums are not the hardware's bits; what equal bits prove is the data
// movement: every fragment, dimension, term, head and key in its place.
// Cases: every q / k format pair, head counts that are not a multiple of 8,
// d 64 / 128 / 256, several head chunks, ranges of every kind (empty,
// whole, prefixes, windows, across the 512-key chunks), with and without
// key scales, NaN and infinite inputs, the paged cache.
// No GPU needed: bash crates/flashsel-dev/emu/run.sh dsa
#include "shim.h"
#include "kern_dsa.cpp"  // kernels/indexer/dsa_scores.cu, rewritten by run.sh
alignas(16) u64 dyn_smem[16384];
#include <cstdio>
#include <random>

static std::mt19937_64 rng(13);
static float nrm() { static std::normal_distribution<float> n(0, 1); return n(rng); }
static unsigned below(unsigned n) { return n ? rng() % n : 0; }

// An element of format f (0 f32, 1 bf16, 2 e4m3) holding about x.
static void put(std::vector<unsigned char>& b, int f, size_t i, float x) {
    if (f == 0) memcpy(&b[4 * i], &x, 4);
    else if (f == 1) { unsigned short h = fsattn::f32_to_bf16_bits(x); memcpy(&b[2 * i], &h, 2); }
    else b[i] = (unsigned char)(((x < 0) << 7) | ((1 + below(13)) << 3) | below(8));  // normal codes
}
static float get(const std::vector<unsigned char>& b, int f, size_t i) {
    if (f == 0) { float x; memcpy(&x, &b[4 * i], 4); return x; }
    if (f == 1) { unsigned short h; memcpy(&h, &b[2 * i], 2); return __uint_as_float((unsigned)h << 16); }
    return fsattn::e4m3_to_f32(b[i]);
}

// The CUDA engine's score of (t, s) in the device order (ops/dsa/mod.rs,
// "The CUDA engine's order"; indexer/dsa/score.cuh): per head an f32
// accumulator over the 16-dimension steps, one emulated mma (shim.h: the 16
// exact products summed in double, then added in f32) per step and (key
// term, query term) pair, key term outer; p_h = w_h * relu(dot_h); the
// heads in chunks of 8 NT (NT 4, 2 with f32 keys), lane sums
// of column pairs, the quad tree, the running sum from +0.0; one scale.
static float dev_score(const std::vector<unsigned char>& q, int qf, const std::vector<unsigned char>& k, int kf,
                       const float* sc, const std::vector<float>& w, int t, long long s, int H, int d) {
    const int NT = kf == 0 ? 2 : 4, HC = 8 * NT;
    const int tq = qf == 0 ? 3 : 1, tk = kf == 0 ? 3 : 1;
    float run = 0.f;
    std::vector<float> p(HC);
    for (int h0 = 0; h0 < H; h0 += HC) {
        for (int c = 0; c < HC; ++c) {
            const int h = h0 + c;
            if (h >= H) { p[c] = 0.f; continue; }
            float acc = 0.f;
            for (int ks = 0; ks < d / 16; ++ks)
                for (int a = 0; a < tk; ++a)
                    for (int e = 0; e < tq; ++e) {
                        double sum = 0;
                        for (int kk = 0; kk < 16; ++kk) {
                            const int dim = 32 * (ks >> 1) + 8 * ((kk & 7) >> 1) + 4 * (ks & 1) + 2 * (kk >> 3) + (kk & 1);
                            float tkv = bf16_term(get(k, kf, (size_t)s * d + dim), a);
                            const float tqv = bf16_term(get(q, qf, ((size_t)t * H + h) * d + dim), e);
                            if (e > 0 && std::isinf(tkv)) tkv = 0.f;  // an infinite key meets only q's hi term
                            sum += (double)tkv * tqv;
                        }
                        acc = (float)((double)acc + sum);
                    }
            const float r = acc > 0.f || acc != acc ? acc : 0.f;
            p[c] = w[(size_t)t * H + h] * r;
        }
        float S[4];
        for (int i = 0; i < 4; ++i) {
            float x = 0.f;
            for (int n = 0; n < NT; ++n) {
                const float pair = p[8 * n + 2 * i] + p[8 * n + 2 * i + 1];
                x = n == 0 ? pair : x + pair;
            }
            S[i] = x;
        }
        run = run + ((S[0] + S[1]) + (S[2] + S[3]));
    }
    if (sc) run *= sc[s];
    return run != run ? __uint_as_float(0x7fc00000u) : run;
}

static int fails = 0;
static void test(const char* name, int rows, int H, int d, long long keys, int qf, int kf, bool scale, int special) {
    const int es[3] = {4, 2, 1};
    std::vector<unsigned char> q((size_t)rows * H * d * es[qf]), k((size_t)keys * d * es[kf]);
    for (size_t i = 0; i < (size_t)rows * H * d; ++i) put(q, qf, i, nrm());
    for (size_t i = 0; i < (size_t)keys * d; ++i) put(k, kf, i, nrm());
    if (special == 1 && kf != 2) {  // a NaN key, an infinite key
        float nan = NAN, inf = INFINITY;
        if (kf == 0) { memcpy(&k[4 * 5], &nan, 4); memcpy(&k[4 * (d + 3)], &inf, 4); }
        else { put(k, 1, 5, nan); put(k, 1, d + 3, inf); }
    }
    if (special == 1 && kf == 2) { k[5] = 0x7f; }
    std::vector<float> w((size_t)rows * H), sc(keys);
    for (auto& x : w) x = nrm();
    if (special == 1) w[1] = 0.f;  // +-inf times a zero weight
    for (auto& x : sc) x = 0.25f + (float)(rng() % 1000) / 500.f;
    std::vector<int> st(rows), en(rows);
    for (int t = 0; t < rows; ++t) {
        switch (t % 4) {
            case 0: st[t] = en[t] = (int)below(keys + 1); break;  // empty
            case 1: st[t] = 0; en[t] = (int)keys; break;
            case 2: st[t] = 0; en[t] = 1 + (int)below(keys); break;
            default: st[t] = (int)below(keys); en[t] = st[t] + (int)below(keys - st[t] + 1);
        }
    }
    std::vector<float> out((size_t)rows * keys, 12345.f);  // poisoned
    DsaParams P{};
    P.q = q.data(); P.k = k.data(); P.k_scale = scale ? sc.data() : nullptr; P.weights = w.data();
    P.starts = st.data(); P.ends = en.data(); P.out = out.data(); P.keys = keys; P.rows = rows; P.heads = H; P.dim = d;
    void (*kern[3][3])(const DsaParams) = {
        {dsa_scores_qf32_kf32, dsa_scores_qf32_kbf16, dsa_scores_qf32_ke4m3},
        {dsa_scores_qbf16_kf32, dsa_scores_qbf16_kbf16, dsa_scores_qbf16_ke4m3},
        {dsa_scores_qe4m3_kf32, dsa_scores_qe4m3_kbf16, dsa_scores_qe4m3_ke4m3}};
    launch2(kern[qf][kf], (unsigned)rows, (unsigned)((keys + 511) / 512), P, dsa_tc::TC_THREADS);
    int bad = 0;
    unsigned long long h = 1469598103934665603ull;
    for (int t = 0; t < rows; ++t) for (long long s = 0; s < keys; ++s) {
        float want = s >= st[t] && s < en[t] ? dev_score(q, qf, k, kf, scale ? sc.data() : nullptr, w, t, s, H, d) : -INFINITY;
        float got = out[(size_t)t * keys + s];
        if (__float_as_uint(got) != __float_as_uint(want)) {
            if (!bad) std::printf("\n  FAIL row %d key %lld: got %g (%08x) want %g (%08x)", t, s, got, __float_as_uint(got), want, __float_as_uint(want));
            ++bad;
        }
        unsigned u = __float_as_uint(got);
        for (int i = 0; i < 4; ++i) h = (h ^ ((u >> (8 * i)) & 255)) * 1099511628211ull;
    }
    if (bad) { ++fails; std::printf("\n  %d scores differ", bad); }
    std::printf("%s  (#%08llx)\n", name, h & 0xffffffffull);
}

// The paged entries: the keys of test()'s contiguous problem (e4m3, scaled)
// laid out in DeepGEMM's paged cache (pages of ps tokens in a shuffled
// order, two sequences sharing the pages, an unused NaN page); the scores
// must be the contiguous ones' bits. Rows of sequence 1 get a page entry past
// the cache for their last page: those keys score -inf.
static void test_paged(const char* name, int rows, int H, int d, long long keys, int qf, int ps) {
    const int es[3] = {4, 2, 1};
    std::vector<unsigned char> q((size_t)rows * H * d * es[qf]), k((size_t)keys * d);
    for (size_t i = 0; i < (size_t)rows * H * d; ++i) put(q, qf, i, nrm());
    for (size_t i = 0; i < (size_t)keys * d; ++i) put(k, 2, i, nrm());
    std::vector<float> w((size_t)rows * H), sc(keys);
    for (auto& x : w) x = nrm();
    for (auto& x : sc) x = 0.25f + (float)(rng() % 1000) / 500.f;
    const int pages = (int)((keys + ps - 1) / ps), pb = ps * (d + 4);
    std::vector<int> perm(pages);
    for (int i = 0; i < pages; ++i) perm[i] = i;
    for (int i = pages - 1; i > 0; --i) std::swap(perm[i], perm[below(i + 1)]);
    std::vector<unsigned char> cache((size_t)(pages + 1) * pb, 0x7f);
    for (long long s = 0; s < keys; ++s) {
        const int p = perm[s / ps], j = (int)(s % ps);
        memcpy(&cache[(size_t)p * pb + (size_t)j * d], &k[(size_t)s * d], d);
        memcpy(&cache[(size_t)p * pb + (size_t)ps * d + 4 * j], &sc[s], 4);
    }
    std::vector<int> table(2 * pages);
    for (int i = 0; i < pages; ++i) { table[i] = perm[i]; table[pages + i] = i + 1 < pages ? perm[i] : pages + 7; }
    std::vector<int> seq(rows), st(rows), en(rows);
    for (int t = 0; t < rows; ++t) {
        seq[t] = t % 2;
        st[t] = (int)below(keys / 2);
        en[t] = t % 3 == 0 ? (int)keys : st[t] + (int)below(keys - st[t] + 1);
    }
    std::vector<float> out((size_t)rows * keys, 12345.f);
    DsaParams P{};
    P.q = q.data(); P.k = cache.data(); P.weights = w.data(); P.starts = st.data(); P.ends = en.data(); P.out = out.data();
    P.table = table.data(); P.seq_ids = seq.data(); P.keys = keys; P.max_pages = pages; P.rows = rows; P.heads = H; P.dim = d;
    P.page_size = ps; P.num_pages = pages + 1; P.sequences = 2;
    void (*kern[3])(const DsaParams) = {dsa_scores_paged_qf32, dsa_scores_paged_qbf16, dsa_scores_paged_qe4m3};
    launch2(kern[qf], (unsigned)rows, (unsigned)((keys + 511) / 512), P, dsa_tc::TC_THREADS);
    int bad = 0;
    for (int t = 0; t < rows; ++t) for (long long s = 0; s < keys; ++s) {
        const bool lost = seq[t] == 1 && s / ps == pages - 1;  // a page entry past the cache
        float want = s >= st[t] && s < en[t] && !lost ? dev_score(q, qf, k, 2, sc.data(), w, t, s, H, d) : -INFINITY;
        float got = out[(size_t)t * keys + s];
        if (__float_as_uint(got) != __float_as_uint(want)) {
            if (!bad) std::printf("\n  FAIL row %d key %lld: got %g want %g", t, s, got, want);
            ++bad;
        }
    }
    if (bad) { ++fails; std::printf("\n  %d scores differ", bad); }
    std::printf("%s\n", name);
}

int main() {
    const char* fm[3] = {"f32", "bf16", "e4m3"};
    for (int qf = 0; qf < 3; ++qf) for (int kf = 0; kf < 3; ++kf) {
        char name[96];
        std::snprintf(name, sizeof name, "q %s k %s h6 d64 keys 1500 scaled", fm[qf], fm[kf]);
        test(name, 5, 6, 64, 1500, qf, kf, true, 0);
    }
    test("q e4m3 k e4m3 h64 d128 keys 2100 (DeepSeek-V3.2)", 4, 64, 128, 2100, 2, 2, true, 0);
    test("q bf16 k bf16 h3 d256 keys 40 no scale", 7, 3, 256, 40, 1, 1, false, 0);
    test("q f32 k e4m3 h40 d256 keys 200 (three head chunks, the last of 8)", 3, 40, 256, 200, 0, 2, true, 0);
    test("q f32 k f32 h1 d128 keys 1024 NaN and inf keys", 6, 5, 128, 1024, 0, 0, true, 1);
    test("q e4m3 k e4m3 h9 d64 NaN key code", 5, 9, 64, 300, 2, 2, false, 1);
    test_paged("paged q e4m3 h64 d128 pages of 64", 6, 64, 128, 1100, 2, 64);
    test_paged("paged q bf16 h5 d64 pages of 18", 7, 5, 64, 300, 1, 18);
    test_paged("paged q f32 h3 d256 pages of 2", 4, 3, 256, 40, 0, 2);
    std::printf("fails %d\n", fails);
    return fails != 0;
}
