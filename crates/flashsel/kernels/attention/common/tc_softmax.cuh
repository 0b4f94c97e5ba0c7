// The tensor-core kernels' softmax over one tile (sparse MLA's
// sparse_mla_tc.cuh and QSA's sparse_qsa_tc.cuh): from the slices' partial
// logits to P and the head states.
//
// ALGORITHM
//   tc_softmax_tile: warp w owns rows w + NW i (i < ROWS); lane j sums key
//   j's SLICES partial logits in slice order, times the scale (-inf when not
//   attended), and softmax_steps updates the rows' f32 (m, sum) at once;
//   p = exp(l - m) goes to p_s as two bf16 terms, hi = bf16(p) and lo =
//   bf16(p - hi) (P V then takes both: one bf16 rounding of P misses the out
//   tolerance on rows with few keys), and lane 0 writes alpha, m and sum.
//   tc_rescale: an O fragment's two rows times their alpha.
//
// INVARIANTS
//   - sp_s [SLICES][MR][SLD] f32 partial logits (written before the
//     caller's barrier), p_s hi [MR][PLD] then lo [MR][PLD] bf16, st_s alpha
//     [MR], m [MR], sum [MR]: only warp w writes its rows' states; the
//     __syncwarp orders every lane's reads of them before lane 0's writes.
//   - The partials are summed in a fixed order: the bits are a function of
//     the inputs.
//
// COST
//   ROWS (SLICES + 4) shared loads a lane, ROWS interleaved butterflies.
#ifndef FLASHSEL_ATTENTION_COMMON_TC_SOFTMAX_CUH
#define FLASHSEL_ATTENTION_COMMON_TC_SOFTMAX_CUH

#include "attention/common/mma.cuh"
#include "attention/common/softmax.cuh"

namespace fsattn {

template <int ROWS, int SLICES, int MR, int SLD, int PLD, int NW>
__device__ __forceinline__ void tc_softmax_tile(const float* sp_s, u16* p_s, float* st_s, int warp, int lane, bool att,
                                                float scale) {
    float l[ROWS], m[ROWS], sum[ROWS], alpha[ROWS], p[ROWS];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        const int row = warp + NW * i;
        float dot = 0.f;
#pragma unroll
        for (int sl = 0; sl < SLICES; ++sl) dot += sp_s[(sl * MR + row) * SLD + lane];
        l[i] = att ? dot * scale : -fsa_inf();
        m[i] = st_s[MR + row];
        sum[i] = st_s[2 * MR + row];
    }
    softmax_steps<ROWS>(l, m, sum, alpha, p);
    // Every lane's reads of the rows' (m, sum) above happen before lane 0
    // overwrites them below (the shuffles order no memory).
    __syncwarp();
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        const int row = warp + NW * i;
        const u16 hi = f32_to_bf16_rn(p[i]);
        p_s[row * PLD + lane] = hi;
        p_s[(MR + row) * PLD + lane] = f32_to_bf16_rn(p[i] - bf16_bits_to_f32(hi));
        if (lane == 0) {
            st_s[row] = alpha[i];
            st_s[MR + row] = m[i];
            st_s[2 * MR + row] = sum[i];
        }
    }
}

template <int NB>
__device__ __forceinline__ void tc_rescale(float (&o)[NB][4], float a0, float a1) {
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        o[n][0] *= a0;
        o[n][1] *= a0;
        o[n][2] *= a1;
        o[n][3] *= a1;
    }
}

}  // namespace fsattn

#endif  // FLASHSEL_ATTENTION_COMMON_TC_SOFTMAX_CUH
