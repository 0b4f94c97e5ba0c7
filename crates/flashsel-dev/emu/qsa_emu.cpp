// The QSA scorer (kernels/indexer/qsa/score.cuh, the 18 entries of
// indexer/qsa_scores.cu; its staged form, qsa/staged.cuh, the 8 entries of
// indexer/qsa_staged.cu) run on the host under shim.h, one CTA at a time with
// 256 threads, real warp barriers and shuffles, and the tensor-core mma by
// shim.h's model, against a reference written here from the documented
// device order (score.cuh's header: the bf16 terms, the dimensions of each
// 16-dimension step, the step and term order, relu, the pairwise head tree,
// one scale; NaN canonical; -inf past V; a bad row NaN, a bad page NaN).
// The model's sums are not the hardware's bits; what the digests prove is
// the data movement: every fragment, dimension, term, head and row in its
// place.
// Every case compares bits: the plain form (every block written) and the
// fused form (rows with V <= skip_upto and blocks past V untouched, the
// positions the selection reads). Tiles of several groups a warp, rows
// looped over a short grid, paged keys with bad entries, specials in the
// keys and queries. No GPU needed: bash crates/flashsel-dev/emu/run.sh
#include "shim.h"
#include "kern_qsa.cpp"  // kernels/indexer/qsa_scores.cu, rewritten by run.sh
#include "kern_staged.cpp"  // kernels/indexer/qsa_staged.cu
alignas(16) u64 dyn_smem[16384];
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

namespace {

using Kernel = void (*)(const qsa::ScoreParams);

// The entries by (q bf16, key dtype 0 f32 / 1 bf16 / 2 e4m3, d).
Kernel entry(bool qb, int kd, int d) {
    static const Kernel t[2][3][3] = {
        {{qsa_scores_qf32_kf32_d64, qsa_scores_qf32_kf32_d128, qsa_scores_qf32_kf32_d256},
         {qsa_scores_qf32_kbf16_d64, qsa_scores_qf32_kbf16_d128, qsa_scores_qf32_kbf16_d256},
         {qsa_scores_qf32_ke4m3_d64, qsa_scores_qf32_ke4m3_d128, qsa_scores_qf32_ke4m3_d256}},
        {{qsa_scores_qbf16_kf32_d64, qsa_scores_qbf16_kf32_d128, qsa_scores_qbf16_kf32_d256},
         {qsa_scores_qbf16_kbf16_d64, qsa_scores_qbf16_kbf16_d128, qsa_scores_qbf16_kbf16_d256},
         {qsa_scores_qbf16_ke4m3_d64, qsa_scores_qbf16_ke4m3_d128, qsa_scores_qbf16_ke4m3_d256}}};
    return t[qb][kd][d == 64 ? 0 : d == 128 ? 1 : 2];
}
// The staged form's entries (null: no staged form at that width) by (q
// bf16, key dtype, d, padded heads).
Kernel staged_entry(bool qb, int kd, int d, int heads) {
#define FS_H(q, k, d) {qsa_staged_##q##_##k##_##d##_h1, qsa_staged_##q##_##k##_##d##_h2, qsa_staged_##q##_##k##_##d##_h4, qsa_staged_##q##_##k##_##d##_h8, qsa_staged_##q##_##k##_##d##_h16}
    static const Kernel t[2][2][2][5] = {
        {{FS_H(qf32, kbf16, d64), FS_H(qf32, kbf16, d128)}, {FS_H(qf32, ke4m3, d64), FS_H(qf32, ke4m3, d128)}},
        {{FS_H(qbf16, kbf16, d64), FS_H(qbf16, kbf16, d128)}, {FS_H(qbf16, ke4m3, d64), FS_H(qbf16, ke4m3, d128)}}};
#undef FS_H
    const int hp = heads <= 1 ? 0 : heads <= 2 ? 1 : heads <= 4 ? 2 : heads <= 8 ? 3 : 4;
    return d == 256 || kd == 0 ? nullptr : t[qb][kd - 1][d == 64 ? 0 : 1][hp];
}

const unsigned NAN_BITS = 0x7fc00000u, NEG_INF = 0xff800000u, POISON = 0x5a5a5a5au;

float e4m3_exact(unsigned b) {
    if ((b & 0x7f) == 0x7f) return NAN;
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    return (float)((b & 0x80) ? -v : v);
}

struct Case {
    std::string name;
    bool qb;
    int kd, d, heads, rows, blocks, ratio, bpc, grid_y;
    bool paged, fused, specials;
    int skip_upto = -1;
    bool staged = false;  // the staged form (staged.cuh); bpc a multiple of 64
};

struct Data {
    std::vector<unsigned char> q, kbar;
    std::vector<int> positions, table, seq_ids;
    int max_pages = 0, per_page = 1, cache_pages = 0, sequences = 0;
};

// A value's bf16 term i (0 hi, 1 mid, 2 lo: truncations, their sum the
// value exactly; a NaN or an infinity is its hi term alone; bf16 and e4m3
// values are their own hi term).
float term(float x, int i) { return bf16_term(x, i); }

float qval(const Case& c, const Data& x, long long i) {
    if (c.qb) { unsigned short b; std::memcpy(&b, &x.q[2 * i], 2); return __uint_as_float((unsigned)b << 16); }
    float f; std::memcpy(&f, &x.q[4 * i], 4); return f;
}
float kval(const Case& c, const Data& x, long long i) {
    if (c.kd == 0) { float f; std::memcpy(&f, &x.kbar[4 * i], 4); return f; }
    if (c.kd == 1) { unsigned short b; std::memcpy(&b, &x.kbar[2 * i], 2); return __uint_as_float((unsigned)b << 16); }
    return e4m3_exact(x.kbar[i]);
}

// The contract's score of every block of every row (plain form), as bits.
std::vector<unsigned> reference(const Case& c, const Data& x, float scale) {
    std::vector<unsigned> out((size_t)c.rows * c.blocks);
    for (int r = 0; r < c.rows; ++r) {
        const long long t = x.positions[r];
        long long v = t < 0 ? -1 : (t + 1) / c.ratio;
        int seq = 0;
        if (v > c.blocks) v = -1;
        if (v >= 0 && c.paged) {
            seq = x.seq_ids[r];
            const long long pages = (v + x.per_page - 1) / x.per_page;
            if (seq < 0 || seq >= x.sequences || pages > x.max_pages) v = -1;
        }
        for (int b = 0; b < c.blocks; ++b) {
            unsigned& o = out[(size_t)r * c.blocks + b];
            if (v < 0) { o = NAN_BITS; continue; }
            if (b >= v) { o = NEG_INF; continue; }
            long long at = b;
            if (c.paged) {
                const int page = x.table[(size_t)seq * x.max_pages + b / x.per_page];
                if (page < 0 || page >= x.cache_pages) { o = NAN_BITS; continue; }
                at = (long long)page * x.per_page + b % x.per_page;
            }
            // The device order: per head an f32 accumulator over the
            // 16-dimension steps, one emulated mma (shim.h: the 16 exact
            // products summed in double, then added in f32) per step and
            // (key term, query term) pair; relu; the pairwise head tree.
            const int hp = c.heads <= 1 ? 1 : c.heads <= 2 ? 2 : c.heads <= 4 ? 4 : c.heads <= 8 ? 8 : 16;
            const int tq = c.qb ? 1 : 3, tk = c.kd == 0 ? 3 : 1;
            float hs[16] = {};
            for (int h = 0; h < c.heads; ++h) {
                float acc = 0.f;
                for (int ks = 0; ks < c.d / 16; ++ks)
                    for (int a = 0; a < tk; ++a)
                        for (int e = 0; e < tq; ++e) {
                            double sum = 0;
                            for (int kk = 0; kk < 16; ++kk) {
                                const int dim = 32 * (ks >> 1) + 8 * ((kk & 7) >> 1) + 4 * (ks & 1) + 2 * (kk >> 3) + (kk & 1);
                                const float kv = kval(c, x, at * c.d + dim);
                                const float qv = qval(c, x, ((long long)r * c.heads + h) * c.d + dim);
                                float tkv = term(kv, c.kd == 0 ? a : 0), tqv = term(qv, c.qb ? 0 : e);
                                if (e > 0 && std::isinf(tkv)) tkv = 0.f;  // an infinite key meets only q's hi term
                                sum += (double)tkv * tqv;
                            }
                            acc = (float)((double)acc + sum);
                        }
                hs[h] = (acc > 0.f || std::isnan(acc)) ? acc : 0.f;
            }
            for (int w = 1; w < hp; w *= 2)
                for (int h = 0; h < hp; h += 2 * w) hs[h] = hs[h] + hs[h + w];
            const float s = hs[0];
            const float score = s * scale;
            o = std::isnan(score) ? NAN_BITS : __float_as_uint(score);
        }
    }
    return out;
}

Data make(const Case& c, std::mt19937& g) {
    Data x;
    std::normal_distribution<float> n(0.f, 1.f);
    std::uniform_int_distribution<int> u(0, 1 << 30);
    const int kb = c.kd == 0 ? 4 : c.kd == 1 ? 2 : 1, qb = c.qb ? 2 : 4;
    auto put = [](std::vector<unsigned char>& v, long long i, int bytes, float f) {
        if (bytes == 4) std::memcpy(&v[4 * i], &f, 4);
        else { unsigned short b = (unsigned short)(__float_as_uint(f) >> 16); std::memcpy(&v[2 * i], &b, 2); }
    };
    const long long nq = (long long)c.rows * c.heads * c.d;
    x.q.resize(nq * qb);
    for (long long i = 0; i < nq; ++i) put(x.q, i, qb, n(g));
    int key_rows = c.blocks;
    if (c.paged) {
        x.per_page = 16;
        x.sequences = 2;
        x.max_pages = (c.blocks + x.per_page - 1) / x.per_page;
        x.cache_pages = x.sequences * x.max_pages + 3;
        key_rows = x.cache_pages * x.per_page;
        std::vector<int> perm(x.cache_pages);
        for (int i = 0; i < x.cache_pages; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), g);
        x.table.resize((size_t)x.sequences * x.max_pages);
        for (size_t i = 0; i < x.table.size(); ++i) x.table[i] = perm[i];
        // Bad entries: past the cache, negative.
        x.table[3] = x.cache_pages;
        x.table[x.max_pages + 1] = -7;
        for (int r = 0; r < c.rows; ++r) x.seq_ids.push_back(r % 3 == 2 && c.rows > 3 ? 5 : r % 2);
    }
    const long long nk = (long long)key_rows * c.d;
    x.kbar.resize(nk * kb);
    for (long long i = 0; i < nk; ++i) {
        if (kb == 1) x.kbar[i] = (unsigned char)(u(g) & 0xff);
        else put(x.kbar, i, kb, n(g));
    }
    if (c.specials) {
        // A NaN, an inf, a -0 and repeated rows (ties) in the keys; a NaN in a query.
        if (kb != 1) {
            put(x.kbar, 5 * c.d + 3, kb, NAN);
            put(x.kbar, 9 * c.d + 1, kb, INFINITY);
            put(x.kbar, 11 * c.d, kb, -0.f);
            for (int b = 40; b < 48; ++b) std::memcpy(&x.kbar[(size_t)b * c.d * kb], &x.kbar[(size_t)39 * c.d * kb], (size_t)c.d * kb);
        } else {
            x.kbar[7 * c.d + 2] = 0x7f;
            x.kbar[8 * c.d] = 0x80;
        }
        put(x.q, c.d + 5, qb, NAN);
        // A value with zero mid and lo terms against an infinity: the inf
        // key (block 9, dimension 1) against 1.0 in every row's last head.
        for (int r = 0; r < c.rows; ++r) put(x.q, ((long long)r * c.heads + c.heads - 1) * c.d + 1, qb, 1.f);
    }
    // Positions: V from 0 to all blocks, one past the keys, one negative.
    for (int r = 0; r < c.rows; ++r) {
        int t;
        if (r == 0) t = c.blocks * c.ratio - 1;               // V = blocks
        else if (r == 1) t = (c.blocks / 2) * c.ratio + 1;    // a partial tile
        else if (r == 2) t = 3;                                // V small
        else if (r == 3) t = -1;                               // bad
        else if (r == 4) t = (c.blocks + 1) * c.ratio;         // past the keys
        else t = u(g) % (c.blocks * c.ratio);
        x.positions.push_back(t);
    }
    return x;
}

bool run(const Case& c, unsigned seed) {
    std::mt19937 g(seed);
    const Data x = make(c, g);
    const float scale = (float)(1.0 / std::sqrt((double)c.d));
    const std::vector<unsigned> want = reference(c, x, scale);
    const long long stride = c.blocks + 5;
    std::vector<unsigned> out((size_t)c.rows * stride, POISON);
    std::vector<int> pos_out(c.rows, 0x5a5a5a5a);
    qsa::ScoreParams p{};
    p.q = (u64)x.q.data();
    p.kbar = (u64)x.kbar.data();
    p.positions = (u64)x.positions.data();
    p.out = (u64)out.data();
    p.page_table = c.paged ? (u64)x.table.data() : 0;
    p.seq_ids = c.paged ? (u64)x.seq_ids.data() : 0;
    p.positions_out = (u64)pos_out.data();
    p.out_stride = stride;
    p.rows = c.rows;
    p.heads = c.heads;
    p.blocks = c.blocks;
    p.ratio = c.ratio;
    p.max_pages = x.max_pages;
    p.per_page = x.per_page;
    p.cache_pages = x.cache_pages;
    p.sequences = x.sequences;
    p.skip_upto = c.fused ? c.skip_upto : -1;
    p.scale = scale;
    p.blocks_per_cta = c.bpc;
    const Kernel k = c.staged ? staged_entry(c.qb, c.kd, c.d, c.heads) : entry(c.qb, c.kd, c.d);
    if (!k) std::abort();
    launch2(k, (unsigned)((c.blocks + c.bpc - 1) / c.bpc), (unsigned)c.grid_y, p);
    long long bad = 0, checked = 0;
    for (int r = 0; r < c.rows; ++r) {
        const long long t = x.positions[r];
        long long v = t < 0 ? -1 : (t + 1) / c.ratio;
        if (v > c.blocks) v = -1;
        if (c.paged && v >= 0) {
            const int seq = x.seq_ids[r];
            if (seq < 0 || seq >= x.sequences || (v + x.per_page - 1) / x.per_page > x.max_pages) v = -1;
        }
        for (int b = 0; b < c.blocks; ++b) {
            unsigned w = want[(size_t)r * c.blocks + b];
            if (c.fused && (v < 0 || v <= c.skip_upto || b >= v)) w = POISON;
            const unsigned got = out[(size_t)r * stride + b];
            ++checked;
            if (got != w && bad++ < 5)
                std::printf("  %s row %d block %d: got %08x want %08x\n", c.name.c_str(), r, b, got, w);
        }
        for (long long b = c.blocks; b < stride; ++b)
            if (out[(size_t)r * stride + b] != POISON && bad++ < 5) std::printf("  %s row %d: stride padding written\n", c.name.c_str(), r);
        const int pw = c.fused ? (v < 0 ? -1 : (int)t) : 0x5a5a5a5a;
        if (pos_out[r] != pw && bad++ < 5) std::printf("  %s row %d: positions_out %d want %d\n", c.name.c_str(), r, pos_out[r], pw);
    }
    std::printf("%-44s %s (%lld blocks checked)\n", c.name.c_str(), bad ? "MISMATCH" : "ok", checked);
    return bad == 0;
}

}  // namespace

int main() {
    g_smem = reinterpret_cast<unsigned char*>(dyn_smem);  // shared addresses (ldmatrix, cp.async) are offsets from it
    std::vector<Case> cases;
    const char* kn[3] = {"f32", "bf16", "e4m3"};
    // Every entry: plain form, 3 groups a warp (768-block tiles), rows looped
    // over a grid of 2.
    for (int qb = 0; qb < 2; ++qb)
        for (int kd = 0; kd < 3; ++kd)
            for (int d : {64, 128, 256}) {
                Case c{std::string("q") + (qb ? "bf16" : "f32") + " k" + kn[kd] + " d" + std::to_string(d) + " h4",
                       qb == 1, kd, d, 4, 3, 1700, 4, 768, 2, false, false, kd != 2 || d == 128};
                cases.push_back(c);
            }
    // Heads: every padded width (1, 2, 4, 8, 16) and partial ones (3, 5,
    // 12), rows past one group (a group holds 16 / hp rows).
    for (int h : {1, 2, 3, 5, 8, 12, 16}) {
        Case c{"qbf16 kbf16 d128 h" + std::to_string(h), true, 1, 128, h, 19, 1100, 4, 512, 3, false, false, true};
        cases.push_back(c);
    }
    // Runs whose columns fit one tile (rows x padded heads <= 8: the
    // one-tile form): decode rows, partial heads.
    cases.push_back({"one tile: 1 row qbf16 kbf16 d128 h4", true, 1, 128, 4, 1, 1700, 4, 768, 1, false, false, true});
    cases.push_back({"one tile: 1 row qf32 ke4m3 d128 h8", false, 2, 128, 8, 1, 1300, 4, 512, 1, false, false, true});
    cases.push_back({"one tile: 2 rows qbf16 kf32 d64 h3", true, 0, 64, 3, 2, 900, 4, 256, 1, false, false, true});
    cases.push_back({"qf32 kf32 d256 h16 (8 stages x 4 passes)", false, 0, 256, 16, 2, 600, 4, 256, 2, false, false, true});
    // Paged keys (bad page entries, a bad sequence), plain and fused.
    cases.push_back({"paged qbf16 kbf16 d128 h4", true, 1, 128, 4, 6, 1300, 4, 768, 4, true, false, true});
    cases.push_back({"paged qbf16 ke4m3 d128 h4", true, 2, 128, 4, 6, 1300, 4, 768, 4, true, false, true});
    Case f{"fused qbf16 kbf16 d128 h4 skip 300", true, 1, 128, 4, 6, 1700, 4, 768, 6, false, true, true};
    f.skip_upto = 300;
    cases.push_back(f);
    Case fp{"fused paged qbf16 kf32 d64 h4 skip 40", true, 0, 64, 4, 6, 1300, 4, 1024, 3, true, true, true};
    fp.skip_upto = 40;
    cases.push_back(fp);
    Case r1{"fused qf32 kbf16 d128 h4 ratio 1", false, 1, 128, 4, 5, 900, 1, 256, 5, false, true, false};
    r1.skip_upto = 0;
    cases.push_back(r1);
    // The staged form: every entry (rows past one super-group of 4 row
    // groups), heads of every padded width, paged keys (two sequences and a
    // bad one: several passes a super-group, bad page entries), fused.
    const size_t staged0 = cases.size();
    for (int qb = 0; qb < 2; ++qb)
        for (int kd = 0; kd < 3; ++kd)
            for (int d : {64, 128}) {
                if (!staged_entry(qb == 1, kd, d, 4)) continue;
                Case c{std::string("staged q") + (qb ? "bf16" : "f32") + " k" + kn[kd] + " d" + std::to_string(d) + " h4",
                       qb == 1, kd, d, 4, 37, 1000, 4, 384, 2, false, false, kd != 2 || d == 128};
                c.staged = true;
                cases.push_back(c);
            }
    {
        Case c{"staged qf32 ke4m3 d64 h16 (one row a group)", false, 2, 64, 16, 9, 500, 4, 256, 2, false, false, false};
        c.staged = true;
        cases.push_back(c);
    }
    for (int h : {1, 2, 3, 5, 8, 16}) {
        Case c{"staged qbf16 kbf16 d128 h" + std::to_string(h), true, 1, 128, h, h == 1 ? 133 : 21, 700, 4, 256, 2,
               false, false, true};
        c.staged = true;
        cases.push_back(c);
    }
    // Head trees that cross lanes (f32 queries hold 4 columns a lane, bf16
    // 8), with padded heads in the part a lane holds.
    for (auto [qb, h] : {std::pair{false, 6}, std::pair{false, 12}, std::pair{true, 12}}) {
        Case c{std::string("staged q") + (qb ? "bf16" : "f32") + " kbf16 d64 h" + std::to_string(h), qb, 1, 64, h, 19, 700,
               4, 256, 2, false, false, true};
        c.staged = true;
        cases.push_back(c);
    }
    for (int kd : {1, 2, 1}) {
        const int d = cases.size() % 2 ? 64 : 128;
        Case c{std::string("staged paged qbf16 k") + kn[kd] + " d" + std::to_string(d) + " h4", true, kd, d, 4, 40, 900, 4, 512, 1, true, false, true};
        c.staged = true;
        cases.push_back(c);
    }
    Case sf{"staged fused paged qf32 kbf16 d128 h4 skip 100", false, 1, 128, 4, 36, 900, 4, 320, 2, true, true, true};
    sf.skip_upto = 100;
    sf.staged = true;
    cases.push_back(sf);
    Case sr{"staged fused qbf16 ke4m3 d128 h2 ratio 1", true, 2, 128, 2, 70, 600, 1, 192, 1, false, true, false};
    sr.skip_upto = 0;
    sr.staged = true;
    cases.push_back(sr);
    int fails = 0;
    unsigned seed = 1;
    for (const Case& c : cases) fails += !run(c, seed++);
    // Copies that land only at their waits (none early).
    g_land_early = false;
    fails += !run(cases[7], 99);
    fails += !run(cases[staged0 - 3], 98);
    fails += !run(cases[staged0 + 1], 97);
    fails += !run(cases[cases.size() - 2], 96);
    std::printf("%d of %zu cases failed\n", fails, cases.size() + 4);
    return fails != 0;
}
