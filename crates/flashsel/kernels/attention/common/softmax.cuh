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

// One warp's step of R heads over a tile of 32 logits each (lane j holds
// logit j of every head): updates each head's (m, sum) in place (every lane
// the same bits), sets p[r] to the lane's probability exp(l - m') and
// alpha[r] to the rescale of O. The R heads' butterflies are interleaved
// (straight-line code, selects instead of branches), so their shuffle
// latencies overlap; each head's values are those of a step of its own.
// m is NaN-propagating (a NaN logit makes the head NaN, as the reference's
// max does).
// exp(0) = 1 and exp(-inf) = 0 exactly, so a head with nothing attended yet
// gets alpha 1 and p 0 without a branch.
template <int R>
__device__ __forceinline__ void softmax_steps(const float (&l)[R], float (&m)[R], float (&sum)[R], float (&alpha)[R],
                                              float (&p)[R]) {
    // The tile's maximum: fmaxf butterflies, then NaN if any lane's logit is
    // (the logits are arithmetic results, so a NaN one is the canonical NaN).
    float t[R];
    bool nan[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        t[r] = l[r];
        nan[r] = __any_sync(FSA_FULL, l[r] != l[r]);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) t[r] = fmaxf(t[r], __shfl_xor_sync(FSA_FULL, t[r], o));
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float m_new = nan_max(m[r], nan[r] ? fsa_nan() : t[r]);
        const bool none = m_new == -fsa_inf();
        alpha[r] = expf(none ? 0.f : m[r] - m_new);
        p[r] = expf(none ? -fsa_inf() : l[r] - m_new);
        m[r] = m_new;
        t[r] = p[r];
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) t[r] += __shfl_xor_sync(FSA_FULL, t[r], o);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) sum[r] = sum[r] * alpha[r] + t[r];
}

// One head's step (softmax_steps of one).
__device__ __forceinline__ float softmax_step(float l, float& m, float& sum, float* alpha) {
    float ls[1] = {l}, ms[1] = {m}, ss[1] = {sum}, as[1], ps[1];
    softmax_steps<1>(ls, ms, ss, as, ps);
    m = ms[0];
    sum = ss[0];
    *alpha = as[0];
    return ps[0];
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
