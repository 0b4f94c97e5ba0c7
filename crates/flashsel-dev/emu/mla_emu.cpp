// The sparse MLA kernels (kernels/attention/sparse_mla.cu) run on the host under
// shim.h (one CTA at a time, 256 threads, real barriers and warp exchanges)
// against a float64 reference written here: prefill and decode, every
// format, strides, splits, sinks, lengths, and the derived-length bit test.
// No GPU needed: bash crates/flashsel-dev/emu/run.sh
// Every tensor-core case the 64-head CTA takes (fp8 caches, h_q > 32 where
// 64-head groups pad no more heads; two KV buffers, 512 threads) runs on it
// and on the 32-head CTA: the bits must be the same.
// Each run prints a digest of its result's bits (#xxxxxxxx): a kernel change
// meant to keep the bits (reordered independent work) must leave every
// digest as it was.
#include "shim.h"
namespace { alignas(16) float smem[56000]; }  // the 64-head CTA's 222,976 bytes
#include "kern.cpp"  // kernels/attention/sparse_mla.cu, rewritten by run.sh
#include <cstdio>
#include <random>
#include <string>
using namespace fsattn;

struct Prob {
    int rows, h_q, d_qk, topk, s_q_div = 1; bool per_row = true;
    int fmt_q, fmt_kv;   // 0 f32, 1 bf16, 2 fp8
    long long bound, page_size, page_stride, token_stride;  // bytes
    std::vector<unsigned char> kv;
    std::vector<unsigned char> q;   // bytes
    std::vector<int> idx, lens; bool has_lens = false;
    std::vector<float> sink; bool has_sink = false;
    float scale;
    bool maxl = true;
};

static double qval(const Prob& p, long long i) {
    if (p.fmt_q == 0) { float f; memcpy(&f, &p.q[4 * i], 4); return f; }
    unsigned short b; memcpy(&b, &p.q[2 * i], 2); return __uint_as_float((unsigned)b << 16);
}
static double e4m3(unsigned c) { return e4m3_to_f32(c); }
static void key(const Prob& p, long long off, std::vector<double>& k) {
    const unsigned char* t = p.kv.data() + off;
    for (int d = 0; d < p.d_qk; ++d) {
        if (p.fmt_kv == 0) { float f; memcpy(&f, t + 4 * d, 4); k[d] = f; }
        else if (p.fmt_kv == 1) { unsigned short b; memcpy(&b, t + 2 * d, 2); k[d] = __uint_as_float((unsigned)b << 16); }
        else if (d < 512) { float s; memcpy(&s, t + 512 + 4 * (d / 128), 4); k[d] = e4m3(t[d]) * (double)s; }
        else { unsigned short b; memcpy(&b, t + 528 + 2 * (d - 512), 2); k[d] = __uint_as_float((unsigned)b << 16); }
    }
}
static long long offset(const Prob& p, long long i) { long long pg = i / p.page_size; return pg * p.page_stride + (i - pg * p.page_size) * p.token_stride; }

struct Out { std::vector<double> out, lse, maxl; };
static Out reference(const Prob& p) {
    Out o; o.out.assign((size_t)p.rows * p.h_q * 512, 0); o.lse.assign((size_t)p.rows * p.h_q, 0); o.maxl = o.lse;
    std::vector<double> k(p.d_qk);
    for (int r = 0; r < p.rows; ++r) {
        int L = p.topk;
        if (p.has_lens) L = p.lens[p.per_row ? r : r / p.s_q_div];
        std::vector<std::vector<double>> keys;
        for (int j = 0; j < L; ++j) { long long i = p.idx[(size_t)r * p.topk + j]; if (i >= 0 && i < p.bound) { key(p, offset(p, i), k); keys.push_back(k); } }
        int b = r / p.s_q_div, s = r % p.s_q_div;
        for (int h = 0; h < p.h_q; ++h) {
            long long li = ((long long)b * p.h_q + h) * p.s_q_div + s, mi = (long long)r * p.h_q + h;
            if (keys.empty()) { o.lse[li] = INFINITY; o.maxl[mi] = -INFINITY; continue; }
            std::vector<double> l(keys.size());
            double m = -INFINITY;
            for (size_t j = 0; j < keys.size(); ++j) { double d = 0; for (int x = 0; x < p.d_qk; ++x) d += qval(p, ((long long)r * p.h_q + h) * p.d_qk + x) * keys[j][x]; l[j] = (double)p.scale * d; m = std::isnan(m) || std::isnan(l[j]) ? NAN : std::max(m, l[j]); }
            double sum = 0; for (double x : l) sum += std::exp(x - m);
            double lse = m + std::log(sum);
            double f = p.has_sink ? 1.0 / (1.0 + std::exp((double)p.sink[h] - lse)) : 1.0;
            for (size_t j = 0; j < keys.size(); ++j) { double w = std::exp(l[j] - m) / sum * f; for (int c = 0; c < 512; ++c) o.out[mi * 512 + c] += w * keys[j][c]; }
            o.lse[li] = lse; o.maxl[mi] = m;
        }
    }
    return o;
}

struct Got { std::vector<float> out, lse, maxl; };
// The path the engine takes (ops/mla/device.rs, MlaPlan::new_for): bf16 q
// with a bf16 or fp8 cache on tensor cores (16 heads a CTA for h_q <= 16, else
// 32), everything else on the f32 kernel (8 heads a CTA). g_f32 forces the
// f32 kernel (to compare the two).
static bool g_f32 = false;
// g_wide: the 64-head CTA where it may run (ops/mla/device.rs,
// MlaPlan::on_device: 32-head plans over an fp8 cache whose 64-head groups
// pad no more heads; the engine also asks for sm_90's shared memory and
// enough CTAs), with the 32-head plan's split.
static bool g_wide = false;
static bool widens(const Prob& p) {
    return p.fmt_q == 1 && p.fmt_kv == 2 && p.h_q > 32 && (p.h_q + 63) / 64 * 2 == (p.h_q + 31) / 32;
}
static Got run(const Prob& p, int force_splits = 0) {
    const bool tc = !g_f32 && p.fmt_q == 1 && p.fmt_kv != 0;
    const int mr = !tc ? 8 : p.h_q <= 16 ? 16 : 32;
    const bool wide = tc && g_wide && widens(p);
    int groups = (p.h_q + mr - 1) / mr, tiles = std::max(1, (p.topk + 31) / 32);
    long long base = (long long)p.rows * groups;
    long long want = base >= 264 ? 1 : (264 + base - 1) / base;
    want = std::min<long long>(want, tiles); want = std::max(1LL, std::min(want, 32LL));
    if (force_splits) want = std::min(force_splits, tiles);
    int ct = (tiles + want - 1) / want; int splits = (tiles + ct - 1) / ct;
    int osz = p.fmt_q == 0 ? 4 : 2;
    std::vector<unsigned char> out((size_t)p.rows * p.h_q * 512 * osz, 0xff);
    std::vector<float> lse((size_t)p.rows * p.h_q, NAN), maxl((size_t)p.rows * p.h_q, NAN);
    std::vector<float> ws(splits > 1 ? (size_t)p.rows * p.h_q * splits * 514 : 1, NAN);
    MlaParams P{};
    P.q = p.q.data(); P.kv = p.kv.data(); P.indices = p.idx.data(); P.lengths = p.has_lens ? p.lens.data() : nullptr;
    P.sink = p.has_sink ? p.sink.data() : nullptr; P.out = out.data(); P.max_logits = p.maxl ? maxl.data() : nullptr; P.lse = lse.data();
    P.ws = ws.data(); P.bound = p.bound; P.page_size = p.page_size; P.page_stride = p.page_stride; P.token_stride = p.token_stride;
    P.rows = p.rows; P.h_q = p.h_q; P.d_qk = p.d_qk; P.topk = p.topk; P.s_q = p.s_q_div; P.len_per_row = p.per_row;
    P.groups = wide ? (p.h_q + 63) / 64 : groups; P.splits = splits; P.chunk = ct * 32; P.sm_scale = p.scale;
    void (*k)(const MlaParams) = nullptr;
    if (p.fmt_q == 0) k = p.fmt_kv == 0 ? mla_fwd_qf32_kvf32 : p.fmt_kv == 1 ? mla_fwd_qf32_kvbf16 : mla_fwd_qf32_kvfp8;
    else k = p.fmt_kv == 0 ? mla_fwd_qbf16_kvf32 : p.fmt_kv == 1 ? mla_fwd_qbf16_kvbf16 : mla_fwd_qbf16_kvfp8;
    if (tc) {
        if (mr == 16) k = p.fmt_kv == 1 ? mla_tc_fwd_m16_qbf16_kvbf16 : mla_tc_fwd_m16_qbf16_kvfp8;
        else k = p.fmt_kv == 1 ? mla_tc_fwd_m32_qbf16_kvbf16 : mla_tc_fwd_m32_qbf16_kvfp8;
        if (wide) k = mla_tc_fwd_m64_qbf16_kvfp8;
    }
    launch(k, (unsigned)(p.rows * P.groups * splits), P, wide ? 512u : 256u);
    if (splits > 1) launch(p.fmt_q == 0 ? mla_combine_f32 : mla_combine_bf16, (unsigned)(p.rows * p.h_q), P);
    Got g; g.lse = lse; g.maxl = maxl; g.out.resize((size_t)p.rows * p.h_q * 512);
    for (size_t i = 0; i < g.out.size(); ++i) {
        if (osz == 4) memcpy(&g.out[i], &out[4 * i], 4);
        else { unsigned short b; memcpy(&b, &out[2 * i], 2); g.out[i] = __uint_as_float((unsigned)b << 16); }
    }
    // The result's bits as one FNV-1a digest: a change that must keep the
    // bits (a reordering of independent work) shows as an unchanged line.
    unsigned long long h = 1469598103934665603ull;
    auto mix = [&](const void* d, size_t n) { for (size_t i = 0; i < n; ++i) h = (h ^ ((const unsigned char*)d)[i]) * 1099511628211ull; };
    mix(out.data(), out.size()); mix(lse.data(), lse.size() * 4); mix(maxl.data(), maxl.size() * 4);
    std::printf("  (%s%s splits %d #%08llx)", tc ? "tc" : "f32", wide ? "/64" : "", splits, h & 0xffffffffull);
    return g;
}

static int fails = 0;
static void cmp(const char* what, const std::vector<float>& g, const std::vector<double>& w, double abs_t, double rel_t) {
    int bad = 0; double worst = 0; size_t at = 0;
    for (size_t i = 0; i < w.size(); ++i) {
        double a = g[i], b = w[i];
        if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
            bool same = (std::isnan(a) && std::isnan(b)) || a == b;
            if (!same) { if (!bad) at = i; ++bad; worst = INFINITY; }
            continue;
        }
        double e = std::fabs(a - b);
        if (!(e < abs_t || e / (std::fabs(b) + 1e-6) < rel_t)) { if (e > worst) { worst = e; at = i; } ++bad; }
    }
    if (bad) { ++fails; std::printf("\n  FAIL %s: %d bad, worst %g at %zu (got %g want %g)", what, bad, worst, at, g[at], w[at]); }
}
static bool same_bits(const Got& a, const Got& b) {
    return memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0 && memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0 && memcmp(a.maxl.data(), b.maxl.data(), a.maxl.size() * 4) == 0;
}

static std::mt19937_64 rng(7);
static float nrm() { static std::normal_distribution<float> n(0, 1); return n(rng); }
static unsigned below(unsigned n) { return n ? rng() % n : 0; }
static void put_q(Prob& p) {
    size_t n = (size_t)p.rows * p.h_q * p.d_qk; p.q.resize(n * (p.fmt_q == 0 ? 4 : 2));
    for (size_t i = 0; i < n; ++i) { float f = nrm(); if (p.fmt_q == 0) memcpy(&p.q[4 * i], &f, 4); else { unsigned short b = f32_to_bf16_bits(f); memcpy(&p.q[2 * i], &b, 2); } }
}
// g_gap: positions 32 .. 63 of every row invalid (a whole tile skipped
// between attended ones).
static bool g_gap = false;
static void put_idx(Prob& p) {
    const int bad[] = {INT32_MIN, -123456, -1, INT32_MAX, (int)std::min<long long>(p.bound, INT32_MAX)};
    p.idx.resize((size_t)p.rows * p.topk);
    for (int r = 0; r < p.rows; ++r) {
        int valid = below(50) == 0 ? 0 : 1 + below(p.topk);
        for (int j = 0; j < p.topk; ++j) {
            int v = j < valid ? (below(30) == 0 && j + 1 < valid ? -1 : (int)below(p.bound)) : bad[(r + j) % 5];
            p.idx[(size_t)r * p.topk + j] = g_gap && j >= 32 && j < 64 ? -1 : v;
        }
    }
}
// Fills the cache: NaN bytes everywhere, real tokens at every slot.
static void put_kv(Prob& p, long long slots) {
    long long len = offset(p, slots - 1) + p.token_stride + 1000;
    p.kv.assign(len, 0xff);
    for (long long s = 0; s < slots; ++s) {
        unsigned char* t = p.kv.data() + offset(p, s);
        for (int d = 0; d < p.d_qk; ++d) {
            float f = nrm();
            if (p.fmt_kv == 0) memcpy(t + 4 * d, &f, 4);
            else if (p.fmt_kv == 1) { unsigned short b = f32_to_bf16_bits(f); memcpy(t + 2 * d, &b, 2); }
            else if (d < 512) t[d] = (unsigned char)(((rng() & 1) << 7) | ((3 + below(8)) << 3) | below(8));
            else { unsigned short b = f32_to_bf16_bits(f); memcpy(t + 528 + 2 * (d - 512), &b, 2); }
        }
        if (p.fmt_kv == 2) for (int x = 0; x < 4; ++x) { float sc = std::ldexp(1.f, -(int)below(4)); memcpy(t + 512 + 4 * x, &sc, 4); }
    }
}
// NaN into every slot no attended entry reads.
static void poison(Prob& p, long long slots) {
    std::vector<bool> used(slots);
    for (int r = 0; r < p.rows; ++r) {
        int L = p.has_lens ? p.lens[p.per_row ? r : r / p.s_q_div] : p.topk;
        for (int j = 0; j < L; ++j) { long long i = p.idx[(size_t)r * p.topk + j]; if (i >= 0 && i < p.bound) used[i] = true; }
    }
    int w = p.fmt_kv == 0 ? 4 * p.d_qk : p.fmt_kv == 1 ? 2 * p.d_qk : 656;
    for (long long s = 0; s < slots; ++s) if (!used[s]) memset(p.kv.data() + offset(p, s), 0xff, w);
}

// nan_key: a NaN in the first value of row 0's first attended key (its
// logits are NaN: the row's heads come out NaN, the other rows as usual).
static void test(const char* name, Prob p, long long slots, int lens_mode, bool sink, int force = 0, bool nan_key = false) {
    std::printf("%s", name);
    put_q(p); put_idx(p);
    if (lens_mode) { p.has_lens = true; int n = p.per_row ? p.rows : p.rows / p.s_q_div; p.lens.resize(n); for (auto& l : p.lens) l = below(p.topk + 1); }
    if (sink) { p.has_sink = true; p.sink.resize(p.h_q); for (int h = 0; h < p.h_q; ++h) p.sink[h] = h == 1 ? INFINITY : h == 2 ? -INFINITY : nrm(); }
    put_kv(p, slots); poison(p, slots);
    if (nan_key) {
        int L = p.has_lens ? p.lens[0] : p.topk;
        for (int j = 0; j < L; ++j) {
            long long i = p.idx[j];
            if (i < 0 || i >= p.bound) continue;
            unsigned char* t = p.kv.data() + offset(p, i);
            if (p.fmt_kv == 2) t[0] = 0x7f; else if (p.fmt_kv == 1) { t[0] = 0xc0; t[1] = 0x7f; } else { float f = NAN; memcpy(t, &f, 4); }
            std::printf(" (NaN key at slot %lld)", i);
            break;
        }
    }
    Out w = reference(p);
    const bool both = p.fmt_q == 1 && p.fmt_kv != 0;
    if (both) {  // the f32 kernel on the same problem
        g_f32 = true;
        Got f = run(p, force);
        g_f32 = false;
        double oa = 8e-4, orl = 3.01 / 128;
        cmp("out f32", f.out, w.out, oa, orl);
        cmp("lse f32", f.lse, w.lse, 1e-6, 2.01 / 65536);
    }
    Got g = run(p, force);
    if (widens(p)) {  // the 64-head CTA: the same bits
        g_wide = true;
        Got w = run(p, force);
        g_wide = false;
        if (!same_bits(g, w)) { ++fails; std::printf("\n  FAIL the 64-head CTA's bits differ from the 32-head CTA's"); }
    }
    double oa = p.fmt_q == 1 ? 8e-4 : 2e-5, orl = p.fmt_q == 1 ? 3.01 / 128 : 1e-4;
    cmp("out", g.out, w.out, oa, orl);
    cmp("lse", g.lse, w.lse, 1e-6, 2.01 / 65536);
    if (p.maxl) cmp("max_logits", g.maxl, w.maxl, 1e-6, 2.01 / 65536);
    if (!lens_mode) {
        Prob e = p; e.has_lens = true; e.per_row = true; e.lens.resize(p.rows);
        for (int r = 0; r < p.rows; ++r) { int L = 0; for (int j = 0; j < p.topk; ++j) { long long i = p.idx[(size_t)r * p.topk + j]; if (i >= 0 && i < p.bound) L = j + 1; } e.lens[r] = L; }
        Got g2 = run(e, force);
        if (!same_bits(g, g2)) { ++fails; std::printf("\n  FAIL derived != explicit bits"); }
    }
    std::printf("\n");
}

int main() {
    g_smem = (unsigned char*)smem;
    {   // prefill f32, h_q 3, topk 100, s_kv 50 (< topk), unaligned stride
        Prob p{}; p.rows = 5; p.h_q = 3; p.d_qk = 512; p.topk = 100; p.fmt_q = 0; p.fmt_kv = 0; p.bound = 50; p.page_size = 50; p.page_stride = 0; p.token_stride = (512 + 3) * 4; p.scale = 1 / std::sqrt(512.f);
        test("prefill f32 h3 topk100 s_kv50 pad3", p, 50, 0, true, 1);
        test("prefill f32 same split 3", p, 50, 0, true, 3);
        test("prefill f32 lens", p, 50, 1, false, 2);
    }
    {   // prefill bf16 h_q 16 d 576 topk 64, aligned
        Prob p{}; p.rows = 4; p.h_q = 16; p.d_qk = 576; p.topk = 64; p.fmt_q = 1; p.fmt_kv = 1; p.bound = 300; p.page_size = 300; p.page_stride = 0; p.token_stride = 576 * 2; p.scale = 1 / 24.f;
        test("prefill bf16 h16 d576", p, 300, 0, true, 1);
        test("prefill bf16 h16 d576 auto split", p, 300, 1, true, 0);
        p.token_stride = 579 * 2;
        test("prefill bf16 unaligned stride", p, 300, 0, false, 1);
    }
    {   // decode fp8, b 2 s_q 2, h 9, page 17, strided tokens and pages
        Prob p{}; p.rows = 4; p.s_q_div = 2; p.h_q = 9; p.d_qk = 576; p.topk = 96; p.fmt_q = 1; p.fmt_kv = 2; p.page_size = 17; p.token_stride = 659; p.page_stride = 17 * 659 + 5; p.bound = 17 * 12; p.scale = 1 / 24.f; p.maxl = false;
        test("decode fp8 unaligned", p, p.bound, 0, true, 1);
        p.per_row = false;
        test("decode fp8 lens per request split", p, p.bound, 1, true, 3);
        p.token_stride = 656; p.page_stride = 17 * 656 + 48;
        p.per_row = true;
        test("decode fp8 aligned auto", p, p.bound, 0, false, 0);
    }
    {   // decode bf16 / f32 caches, f32 q
        Prob p{}; p.rows = 3; p.s_q_div = 1; p.h_q = 8; p.d_qk = 512; p.topk = 40; p.fmt_q = 0; p.fmt_kv = 1; p.page_size = 1; p.token_stride = 1024; p.page_stride = 1024 + 32; p.bound = 100; p.scale = 0.05f; p.maxl = false;
        test("decode q f32 bf16 cache page 1", p, 100, 1, true, 1);
        p.fmt_kv = 0; p.token_stride = 2048; p.page_stride = 2048;
        test("decode q f32 f32 cache", p, 100, 0, false, 2);
    }
    {   // tensor-core shapes: h_q 1, 20 (masked rows of a 32-head block), 40 (two blocks), 64; d_qk 512 and 576
        for (int h : {1, 20, 40, 64}) {
            Prob p{}; p.rows = 3; p.h_q = h; p.d_qk = h == 20 ? 512 : 576; p.topk = 80; p.fmt_q = 1; p.fmt_kv = 1; p.bound = 200; p.page_size = 200; p.page_stride = 0; p.token_stride = p.d_qk * 2; p.scale = 1 / 24.f;
            char name[64]; std::snprintf(name, sizeof name, "tc prefill bf16 h%d d%d", h, p.d_qk);
            test(name, p, 200, 0, true, 1);
            std::snprintf(name, sizeof name, "tc prefill bf16 h%d lens split 2", h);
            test(name, p, 200, 1, h == 40, 2);
        }
        Prob p{}; p.rows = 2; p.s_q_div = 2; p.h_q = 33; p.d_qk = 576; p.topk = 70; p.fmt_q = 1; p.fmt_kv = 2; p.page_size = 16; p.token_stride = 656; p.page_stride = 16 * 656 + 32; p.bound = 16 * 10; p.scale = 1 / 24.f; p.maxl = false;
        test("tc decode fp8 h33 auto", p, p.bound, 0, true, 0);
        p.h_q = 128; p.rows = 1; p.s_q_div = 1;
        test("tc decode fp8 h128 split 3", p, p.bound, 0, true, 3);
        test("tc decode fp8 h128 NaN key", p, p.bound, 0, false, 1, true);
        // h_q 64 with an unaligned stride and s_kv < topk (many skipped
        // tiles), then the 64-head CTA's unaligned fp8 path (decoded from
        // global memory) and a decode whose lengths skip tiles.
        Prob u{}; u.rows = 2; u.h_q = 64; u.d_qk = 576; u.topk = 150; u.fmt_q = 1; u.fmt_kv = 1; u.bound = 90; u.page_size = 90; u.page_stride = 0; u.token_stride = 579 * 2; u.scale = 1 / 24.f;
        test("tc prefill bf16 h64 unaligned s_kv < topk", u, 90, 0, true, 1);
        u.d_qk = 512; u.token_stride = 512 * 2;
        test("tc prefill bf16 h64 d512 lens split 3", u, 90, 1, false, 3);
        Prob f{}; f.rows = 2; f.s_q_div = 1; f.h_q = 128; f.d_qk = 576; f.topk = 130; f.fmt_q = 1; f.fmt_kv = 2; f.page_size = 13; f.token_stride = 659; f.page_stride = 13 * 659 + 7; f.bound = 13 * 9; f.scale = 1 / 24.f; f.maxl = false;
        test("tc decode fp8 h128 unaligned", f, f.bound, 0, true, 1);
        f.h_q = 64; f.token_stride = 656; f.page_stride = 13 * 656 + 16;
        test("tc decode fp8 h64 lens split 2", f, f.bound, 1, false, 2);
        g_gap = true;
        test("tc decode fp8 h64 a skipped tile", f, f.bound, 0, true, 1);
        g_gap = false;
        Prob b{}; b.rows = 3; b.h_q = 32; b.d_qk = 576; b.topk = 64; b.fmt_q = 1; b.fmt_kv = 1; b.bound = 200; b.page_size = 200; b.page_stride = 0; b.token_stride = 576 * 2; b.scale = 1 / 24.f;
        test("tc prefill bf16 h32 NaN key", b, 200, 0, false, 1, true);
    }
    std::printf("fails %d\n", fails);
    return fails != 0;
}
