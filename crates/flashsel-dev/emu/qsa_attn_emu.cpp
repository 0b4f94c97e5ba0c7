// The QSA sparse attention kernels (kernels/attention/sparse_qsa.cu) run on
// the host under shim.h (one CTA at a time, 256 threads, real barriers and
// warp exchanges) against a float64 reference written here from the
// contract (crates/flashsel/src/ops/qsa_attention/mod.rs): grouped heads
// (a CTA's heads past its group masked), d 64 / 128 / 256, f32 and bf16 on
// both sides, paged caches with padded strides, splits, explicit and
// derived lengths (the same bits), empty rows (out 0, lse -inf), a NaN key.
// Each run prints a digest of its result's bits (#xxxxxxxx).
// No GPU needed: bash crates/flashsel-dev/emu/run.sh qsa-attn
#include "shim.h"
namespace { alignas(16) float smem[20000]; }  // 76,160 bytes at d 256
#include "kern_qsa_attn.cpp"  // kernels/attention/sparse_qsa.cu, rewritten by run.sh
#include <cstdio>
#include <random>
using namespace fsattn;

struct Prob {
    int rows, h_q, h_kv, d, width;
    int fmt_q, fmt_kv;  // 0 f32, 1 bf16
    long long slots, page_size, page_stride, token_stride;  // strides in elements
    std::vector<unsigned char> q, k, v;
    std::vector<int> idx, lens; bool has_lens = false;
    float scale;
};

static double val(const std::vector<unsigned char>& b, int fmt, long long i) {
    if (fmt == 0) { float f; memcpy(&f, &b[4 * i], 4); return f; }
    unsigned short h; memcpy(&h, &b[2 * i], 2); return __uint_as_float((unsigned)h << 16);
}
static void put(std::vector<unsigned char>& b, int fmt, long long i, float f) {
    if (fmt == 0) memcpy(&b[4 * i], &f, 4);
    else { unsigned short h = f32_to_bf16_bits(f); memcpy(&b[2 * i], &h, 2); }
}
static long long head_at(const Prob& p, long long s, int g) {
    return (s / p.page_size) * p.page_stride + (s % p.page_size) * p.token_stride + (long long)g * p.d;
}

struct Out { std::vector<double> out, lse; };
static Out reference(const Prob& p) {
    Out o; o.out.assign((size_t)p.rows * p.h_q * p.d, 0); o.lse.assign((size_t)p.rows * p.h_q, 0);
    const int group = p.h_q / p.h_kv;
    for (int r = 0; r < p.rows; ++r) {
        const int L = p.has_lens ? p.lens[r] : p.width;
        std::vector<long long> att;
        for (int j = 0; j < L; ++j) { long long i = p.idx[(size_t)r * p.width + j]; if (i >= 0 && i < p.slots) att.push_back(i); }
        for (int h = 0; h < p.h_q; ++h) {
            const long long rh = (long long)r * p.h_q + h; const int g = h / group;
            if (att.empty()) { o.lse[rh] = -INFINITY; continue; }
            std::vector<double> l(att.size()); double m = -INFINITY;
            for (size_t j = 0; j < att.size(); ++j) {
                double s = 0; for (int c = 0; c < p.d; ++c) s += val(p.q, p.fmt_q, rh * p.d + c) * val(p.k, p.fmt_kv, head_at(p, att[j], g) + c);
                l[j] = (double)p.scale * s; m = std::isnan(m) || std::isnan(l[j]) ? NAN : std::max(m, l[j]);
            }
            double sum = 0; for (double x : l) sum += std::exp(x - m);
            for (size_t j = 0; j < att.size(); ++j) { double w = std::exp(l[j] - m) / sum; for (int c = 0; c < p.d; ++c) o.out[rh * p.d + c] += w * val(p.v, p.fmt_kv, head_at(p, att[j], g) + c); }
            o.lse[rh] = m + std::log(sum);
        }
    }
    return o;
}

struct Got { std::vector<float> out, lse; };
// The path (ops/qsa_attention/device.rs, QsaAttnPlan): bf16 q and K / V with
// d 128 or 256 on tensor cores (16 heads a CTA), the rest on the f32 kernel
// (8); g_f32 forces the f32 kernel (to compare the two).
static bool g_f32 = false;
static bool tc_path(const Prob& p) { return !g_f32 && p.fmt_q == 1 && p.fmt_kv == 1 && (p.d == 128 || p.d == 256); }
// The plan (QsaAttnPlan: sparse MLA's split rule over rows * h_kv *
// ceil(group / heads a CTA) CTAs); force_splits overrides it.
static Got run(const Prob& p, int force_splits = 0) {
    const bool tc = tc_path(p);
    const int hpc = tc ? 16 : 8;
    const int group = p.h_q / p.h_kv, gpk = (group + hpc - 1) / hpc, groups = p.h_kv * gpk;
    const int tiles = std::max(1, (p.width + 31) / 32);
    long long base = (long long)p.rows * groups;
    long long want = base >= 264 ? 1 : (264 + base - 1) / base;
    want = std::max(1LL, std::min(std::min<long long>(want, tiles), 32LL));
    if (force_splits) want = std::min(force_splits, tiles);
    const int ct = (tiles + want - 1) / want, splits = (tiles + ct - 1) / ct;
    const int osz = p.fmt_q == 0 ? 4 : 2, eb = p.fmt_kv == 0 ? 4 : 2;
    std::vector<unsigned char> out((size_t)p.rows * p.h_q * p.d * osz, 0xff);
    std::vector<float> lse((size_t)p.rows * p.h_q, NAN);
    std::vector<float> ws(splits > 1 ? (size_t)p.rows * p.h_q * splits * (p.d + 2) : 1, NAN);
    QsaAttnParams P{};
    P.q = p.q.data(); P.k = p.k.data(); P.v = p.v.data(); P.indices = p.idx.data(); P.lengths = p.has_lens ? p.lens.data() : nullptr;
    P.out = out.data(); P.lse = lse.data(); P.ws = ws.data();
    P.bound = p.slots; P.page_size = p.page_size; P.page_stride = p.page_stride * eb; P.token_stride = p.token_stride * eb;
    P.rows = p.rows; P.h_q = p.h_q; P.d = p.d; P.width = p.width; P.group = group; P.gpk = gpk; P.groups = groups;
    P.splits = splits; P.chunk = ct * 32; P.scale = p.scale;
    void (*k)(const QsaAttnParams) = p.fmt_q == 0 ? (p.fmt_kv == 0 ? qsa_attn_fwd_qf32_kvf32 : qsa_attn_fwd_qf32_kvbf16)
                                                  : (p.fmt_kv == 0 ? qsa_attn_fwd_qbf16_kvf32 : qsa_attn_fwd_qbf16_kvbf16);
    if (tc) k = p.d == 128 ? qsa_attn_tc_fwd_d128 : qsa_attn_tc_fwd_d256;
    launch(k, (unsigned)(p.rows * groups * splits), P);
    if (splits > 1) launch(p.fmt_q == 0 ? qsa_attn_combine_f32 : qsa_attn_combine_bf16, (unsigned)(p.rows * p.h_q), P);
    Got g; g.lse = lse; g.out.resize((size_t)p.rows * p.h_q * p.d);
    for (size_t i = 0; i < g.out.size(); ++i) g.out[i] = (float)val(out, p.fmt_q, i);
    unsigned long long h = 1469598103934665603ull;
    auto mix = [&](const void* d, size_t n) { for (size_t i = 0; i < n; ++i) h = (h ^ ((const unsigned char*)d)[i]) * 1099511628211ull; };
    mix(out.data(), out.size()); mix(lse.data(), lse.size() * 4);
    std::printf("  (%s splits %d #%08llx)", tc ? "tc" : "f32", splits, h & 0xffffffffull);
    return g;
}

static int fails = 0;
static void cmp(const char* what, const std::vector<float>& g, const std::vector<double>& w, double abs_t, double rel_t) {
    int bad = 0; double worst = 0; size_t at = 0;
    for (size_t i = 0; i < w.size(); ++i) {
        double a = g[i], b = w[i];
        if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
            if (!((std::isnan(a) && std::isnan(b)) || a == b)) { if (!bad) at = i; ++bad; worst = INFINITY; }
            continue;
        }
        double e = std::fabs(a - b);
        if (!(e < abs_t || e / (std::fabs(b) + 1e-6) < rel_t)) { if (e > worst) { worst = e; at = i; } ++bad; }
    }
    if (bad) { ++fails; std::printf("\n  FAIL %s: %d bad, worst %g at %zu (got %g want %g)", what, bad, worst, at, g[at], w[at]); }
}
static bool same_bits(const Got& a, const Got& b) {
    return memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0 && memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

static std::mt19937_64 rng(11);
static float nrm() { static std::normal_distribution<float> n(0, 1); return n(rng); }
static unsigned below(unsigned n) { return n ? rng() % n : 0; }

// lens_mode 0: derived (and the derived lengths passed: the same bits); 1:
// random explicit. nan_key: a NaN in row 0's first attended key (KV head 0).
static void test(const char* name, Prob p, int lens_mode, int force = 0, bool nan_key = false) {
    std::printf("%s", name);
    const int eq = p.fmt_q == 0 ? 4 : 2, ek = p.fmt_kv == 0 ? 4 : 2;
    const size_t nq = (size_t)p.rows * p.h_q * p.d;
    p.q.resize(nq * eq); for (size_t i = 0; i < nq; ++i) put(p.q, p.fmt_q, i, nrm());
    const int bad[] = {INT32_MIN, -123456, -1, INT32_MAX, (int)p.slots};
    p.idx.resize((size_t)p.rows * p.width);
    for (int r = 0; r < p.rows; ++r) {
        int valid = below(40) == 0 ? 0 : 1 + below(p.width);
        for (int j = 0; j < p.width; ++j)
            p.idx[(size_t)r * p.width + j] = j < valid ? (below(25) == 0 && j + 1 < valid ? -1 : (int)below(p.slots)) : bad[(r + j) % 5];
    }
    if (lens_mode) { p.has_lens = true; p.lens.resize(p.rows); for (auto& l : p.lens) l = below(p.width + 1); }
    const long long len = head_at(p, p.slots - 1, p.h_kv - 1) + p.d + 64;
    p.k.assign(len * ek, 0xff); p.v.assign(len * ek, 0xff);  // NaN everywhere
    std::vector<bool> used(p.slots);
    for (int r = 0; r < p.rows; ++r) {
        int L = p.has_lens ? p.lens[r] : p.width;
        for (int j = 0; j < L; ++j) { long long i = p.idx[(size_t)r * p.width + j]; if (i >= 0 && i < p.slots) used[i] = true; }
    }
    for (long long s = 0; s < p.slots; ++s) if (used[s])
        for (int g = 0; g < p.h_kv; ++g) for (int c = 0; c < p.d; ++c) { put(p.k, p.fmt_kv, head_at(p, s, g) + c, nrm()); put(p.v, p.fmt_kv, head_at(p, s, g) + c, nrm()); }
    if (nan_key) {
        int L = p.has_lens ? p.lens[0] : p.width;
        for (int j = 0; j < L; ++j) { long long i = p.idx[j]; if (i >= 0 && i < p.slots) { put(p.k, p.fmt_kv, head_at(p, i, 0), NAN); std::printf(" (NaN key at slot %lld)", i); break; } }
    }
    Out w = reference(p);
    if (tc_path(p)) {  // the f32 kernel on the same problem
        g_f32 = true;
        Got f = run(p, force);
        g_f32 = false;
        cmp("out f32", f.out, w.out, 8e-4, 3.01 / 128);
        cmp("lse f32", f.lse, w.lse, 1e-6, 2.01 / 65536);
    }
    Got g = run(p, force);
    double oa = p.fmt_q == 1 ? 8e-4 : 2e-5, orl = p.fmt_q == 1 ? 3.01 / 128 : 1e-4;
    cmp("out", g.out, w.out, oa, orl);
    cmp("lse", g.lse, w.lse, 1e-6, 2.01 / 65536);
    if (!lens_mode) {
        Prob e = p; e.has_lens = true; e.lens.resize(p.rows);
        for (int r = 0; r < p.rows; ++r) { int L = 0; for (int j = 0; j < p.width; ++j) { long long i = p.idx[(size_t)r * p.width + j]; if (i >= 0 && i < p.slots) L = j + 1; } e.lens[r] = L; }
        if (!same_bits(g, run(e, force))) { ++fails; std::printf("\n  FAIL derived != explicit bits"); }
    }
    std::printf("\n");
}

static Prob contiguous(int rows, int h_q, int h_kv, int d, int width, long long slots, int fq, int fkv) {
    Prob p{}; p.rows = rows; p.h_q = h_q; p.h_kv = h_kv; p.d = d; p.width = width; p.fmt_q = fq; p.fmt_kv = fkv;
    p.slots = slots; p.page_size = slots; p.token_stride = (long long)h_kv * d; p.page_stride = slots * p.token_stride;
    p.scale = 1 / std::sqrt((float)d);
    return p;
}

int main() {
    g_smem = (unsigned char*)smem;
    test("qsa 24/2 d256 bf16 one row auto split", contiguous(1, 24, 2, 256, 200, 500, 1, 1), 0);
    test("qsa 24/2 d256 bf16 lens split 3", contiguous(2, 24, 2, 256, 130, 300, 1, 1), 1, 3);
    test("qsa 12/1 d256 f32 q bf16 kv no split", contiguous(3, 12, 1, 256, 70, 90, 0, 1), 0, 1);
    test("gqa 16/4 d128 bf16 q f32 kv", contiguous(3, 16, 4, 128, 96, 150, 1, 0), 0, 2);
    test("mha 8/8 d64 f32", contiguous(4, 8, 8, 64, 33, 40, 0, 0), 1, 1);
    test("one head d256 width 1", contiguous(5, 1, 1, 256, 1, 3, 1, 1), 0, 1);
    test("gqa 10/2 d128 (a CTA of 5 heads) width 31", contiguous(3, 10, 2, 128, 31, 20, 1, 1), 0, 0);
    {   // paged: pages of 17 with token and page pads (unaligned rows)
        Prob p = contiguous(3, 12, 2, 128, 100, 17 * 6, 1, 1);
        p.page_size = 17; p.token_stride = 2 * 128 + 3; p.page_stride = 17 * p.token_stride + 5;
        test("paged 17 unaligned bf16", p, 0, 2);
        p.fmt_kv = 0; p.token_stride = 2 * 128 + 4; p.page_stride = 17 * p.token_stride + 8;
        test("paged 17 aligned f32 kv lens", p, 1, 1);
    }
    test("NaN key bf16", contiguous(2, 12, 1, 256, 64, 100, 1, 1), 0, 1, true);
    // Tensor cores: QSA's 24 / 2 (12 heads, 4 masked rows of the m16 tile),
    // 32 / 1 (two CTAs a KV head), 16 / 4 d 128 paged and unaligned, one
    // head, a width that is not a multiple of the tile, splits.
    test("tc 24/2 d256 auto split", contiguous(2, 24, 2, 256, 150, 400, 1, 1), 0, 0);
    test("tc 32/1 d256 lens split 2", contiguous(3, 32, 1, 256, 70, 120, 1, 1), 1, 2);
    test("tc 1/1 d128 width 33", contiguous(4, 1, 1, 128, 33, 50, 1, 1), 0, 1);
    {
        Prob p = contiguous(3, 16, 4, 128, 100, 17 * 6, 1, 1);
        p.page_size = 17; p.token_stride = 4 * 128 + 3; p.page_stride = 17 * p.token_stride + 5;
        test("tc paged 17 unaligned d128", p, 0, 2);
        p.token_stride = 4 * 128 + 8; p.page_stride = 17 * p.token_stride + 16;
        test("tc paged 17 aligned d128 lens", p, 1, 1);
    }
    test("NaN key f32 split 2", contiguous(2, 12, 1, 64, 64, 100, 0, 0), 0, 2, true);
    std::printf("fails %d\n", fails);
    return fails != 0;
}
