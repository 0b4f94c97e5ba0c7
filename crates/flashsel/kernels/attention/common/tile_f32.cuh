// The f32 kernels' arithmetic on one tile of KT gathered keys and values
// (sparse MLA's mla_fwd_*, QSA's qsa_attn_fwd_*): the logits of HG heads and
// the probability-weighted sum of the values.
//
// ALGORITHM
//   tile_dot: warp w computes q[h] . k[j] for its 4 keys j = 4w .. 4w + 3
//   and the HG = 8 heads, lane l summing the column pairs 2l + 64i (i <
//   d / 64) with FMAs, then one reduce-scatter over the warp: lane l returns
//   the dot of head l / 4 and key 4w + l % 4.
//   tile_pv: thread t rescales its C output columns of every head by the
//   tile's alpha, then adds p[h][j] * v[j][col .. col + C) for the KT keys in
//   order (C = 2: a float2 load a key).
//
// INVARIANTS
//   - q_s [HG][d], k_s / v_s [KT][stride] f32 in shared memory, written
//     before the caller's barrier; p_s [KT][HG], alpha [HG] likewise.
//   - Every sum runs in a fixed order (the lane's columns in increasing i,
//     the reduce-scatter's tree, the keys in increasing j): the bits are a
//     function of the inputs.
//
// COST
//   tile_dot: 4 HG d / 32 FMAs a lane and (HG + 4) d / 64 shared loads of 8
//   bytes, then 31 shuffles; tile_pv: HG KT C FMAs a thread and 3 KT shared
//   loads.
#ifndef FLASHSEL_ATTENTION_COMMON_TILE_F32_CUH
#define FLASHSEL_ATTENTION_COMMON_TILE_F32_CUH

#include "attention/common/types.cuh"

namespace fsattn {

template <int HG>
__device__ __forceinline__ float tile_dot(const float* q_s, const float* k_s, int d, int lane, int warp) {
    static_assert(HG * 4 == 32, "a lane per (head, key) pair of the warp's 4 keys");
    float acc[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) acc[k] = 0.f;
    const float* kb = k_s + (4 * warp) * d;
    const int n64 = d >> 6;
#pragma unroll 1
    for (int i = 0; i < n64; ++i) {
        const int c = 2 * lane + 64 * i;
        float2 kk[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) kk[jj] = *(const float2*)(kb + jj * d + c);
#pragma unroll
        for (int h = 0; h < HG; ++h) {
            const float2 qq = *(const float2*)(q_s + h * d + c);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                acc[h * 4 + jj] = fmaf(qq.y, kk[jj].y, fmaf(qq.x, kk[jj].x, acc[h * 4 + jj]));
            }
        }
    }
    return warp_reduce_scatter32(acc, lane);
}

template <int HG, int KT, int C>
__device__ __forceinline__ void tile_pv(float (&o)[HG][C], const float* alpha, const float* p_s, const float* v_s,
                                        int stride, int col) {
    static_assert(HG == 8 && (C == 1 || C == 2), "two float4 loads of p a key; one or two columns a thread");
#pragma unroll
    for (int h = 0; h < HG; ++h) {
        const float a = alpha[h];
#pragma unroll
        for (int c = 0; c < C; ++c) o[h][c] *= a;
    }
#pragma unroll 4
    for (int j = 0; j < KT; ++j) {
        const float4 pa = *(const float4*)(p_s + j * HG);
        const float4 pb = *(const float4*)(p_s + j * HG + 4);
        float v[C];
        if (C == 2) {
            const float2 w = *(const float2*)(v_s + j * stride + col);
            v[0] = w.x;
            v[C - 1] = w.y;
        } else {
            v[0] = v_s[j * stride + col];
        }
        const float pj[HG] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
        for (int h = 0; h < HG; ++h) {
#pragma unroll
            for (int c = 0; c < C; ++c) o[h][c] = fmaf(pj[h], v[c], o[h][c]);
        }
    }
}

}  // namespace fsattn

#endif  // FLASHSEL_ATTENTION_COMMON_TILE_F32_CUH
