// Online softmax over tiles of logits, and the output of one head from its
// running state (shared by the one-pass kernels and the split-KV combine).
//
// ALGORITHM
//   A head's state after some tiles is (m, sum, O): m the largest logit seen
//   (NaN-propagating), sum = sum_j exp(l_j - m), O = sum_j exp(l_j - m) v_j.
//   A tile with maximum t moves m to m' = max(m, t) and rescales sum and O by
//   alpha = exp(m - m'). A tile whose entries are all unattended (logit -inf)
//   leaves the state's bits unchanged (alpha = exp(0) = 1, p = 0), and while
//   no entry has been attended (m' = -inf) alpha = 1, p = 0 (no NaN from
//   -inf - -inf). A head ends as
//       empty (m = -inf):  out = 0, lse = +inf, max_logits = -inf
//       else:              lse = m + ln(sum), out = O * f / sum,
//                          f = 1 / (1 + exp(sink - lse)) (1 without a sink)
//   so a sink of -inf changes nothing and +inf gives out = 0; lse and
//   max_logits ignore the sink.
//
// COST
//   Two expf per attended logit and tile; one logf per head.
#ifndef FLASHSEL_ATTENTION_COMMON_SOFTMAX_CUH
#define FLASHSEL_ATTENTION_COMMON_SOFTMAX_CUH

#include "attention/common/types.cuh"

namespace fsattn {

// One warp's step of a head over a tile of 32 logits (lane j holds logit j):
// updates (m, sum) in place (every lane the same bits) and returns lane's
// probability exp(l - m'); *alpha gets the rescale of O.
__device__ __forceinline__ float softmax_step(float l, float& m, float& sum, float* alpha) {
    const float m_new = nan_max(m, warp_max_nan(l));
    const bool none = m_new == -fsa_inf();
    const float a = none ? 1.f : expf(m - m_new);
    const float p = none ? 0.f : expf(l - m_new);
    sum = sum * a + warp_sum(p);
    m = m_new;
    *alpha = a;
    return p;
}

// The output scale of a head with final state (m, sum): lse, and the factor
// that multiplies O (0 for an empty head).
struct HeadOut {
    float lse;
    float scale;
    bool empty;
};

__device__ __forceinline__ HeadOut head_out(float m, float sum, const float* sink, int h) {
    HeadOut o;
    o.empty = m == -fsa_inf();
    if (o.empty) {
        o.lse = fsa_inf();
        o.scale = 0.f;
        return o;
    }
    o.lse = m + logf(sum);
    const float f = sink ? 1.f / (1.f + expf(__ldg(sink + h) - o.lse)) : 1.f;
    o.scale = f / sum;
    return o;
}

}  // namespace fsattn

#endif  // FLASHSEL_ATTENTION_COMMON_SOFTMAX_CUH
