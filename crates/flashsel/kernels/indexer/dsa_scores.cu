// The DSA indexer's scores (module IndexerDsa): one entry per q format and
// k format (f32, bf16, fp8 e4m3), and three over DeepSeek-V3.2's paged fp8
// index-key cache (DeepGEMM's layout: a page of page_size tokens is
// page_size * d e4m3 bytes, then page_size f32 scales) by q format. The
// algorithm, its order and its cost: indexer/dsa/score.cuh.
#include "common/types.cuh"

// The parameter block (host: ops/dsa/device.rs, DsaParams; 112 bytes).
struct DsaParams {
    const void* q;         // [rows][heads][dim], the q format
    const void* k;         // [keys][dim], the k format; paged: the cache's bytes
    const float* k_scale;  // [keys], or null (paged: unused)
    const float* weights;  // [rows][heads]
    const int* starts;     // [rows]
    const int* ends;       // [rows]
    float* out;            // [rows][keys]
    const int* table;      // paged: [sequences][max_pages]
    const int* seq_ids;    // paged: [rows]
    long long keys;
    long long max_pages;
    int rows;
    int heads;
    int dim;
    int page_size;         // paged
    int num_pages;         // paged: pages of the cache
    int sequences;         // paged: rows of the table
};
static_assert(sizeof(DsaParams) == 112, "DsaParams mirrors the host's layout");

#include "indexer/dsa/score.cuh"

#define FSD_SCORES(NAME, Q, K)                                                                    \
    extern "C" __global__ void __launch_bounds__(dsa_tc::TC_THREADS, 4) NAME(const DsaParams P) { \
        dsa_tc::tc_impl<dsa_tc::Q, fsidx::K, false>(P);                                          \
    }
#define FSD_PAGED(NAME, Q)                                                                        \
    extern "C" __global__ void __launch_bounds__(dsa_tc::TC_THREADS, 4) NAME(const DsaParams P) { \
        dsa_tc::tc_impl<dsa_tc::Q, fsidx::KeyE4m3, true>(P);                                     \
    }

FSD_SCORES(dsa_scores_qf32_kf32, QF32, KeyF32)
FSD_SCORES(dsa_scores_qf32_kbf16, QF32, KeyBf16)
FSD_SCORES(dsa_scores_qf32_ke4m3, QF32, KeyE4m3)
FSD_SCORES(dsa_scores_qbf16_kf32, QBf16, KeyF32)
FSD_SCORES(dsa_scores_qbf16_kbf16, QBf16, KeyBf16)
FSD_SCORES(dsa_scores_qbf16_ke4m3, QBf16, KeyE4m3)
FSD_SCORES(dsa_scores_qe4m3_kf32, QE4m3, KeyF32)
FSD_SCORES(dsa_scores_qe4m3_kbf16, QE4m3, KeyBf16)
FSD_SCORES(dsa_scores_qe4m3_ke4m3, QE4m3, KeyE4m3)
FSD_PAGED(dsa_scores_paged_qf32, QF32)
FSD_PAGED(dsa_scores_paged_qbf16, QBf16)
FSD_PAGED(dsa_scores_paged_qe4m3, QE4m3)
