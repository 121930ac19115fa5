// Part of model_kernels.cu (included there in this order, after
// model_common.cuh; not a standalone header): the embedding and the residual
// add + RMSNorm kernels.
#pragma once

// out[t] = table[ids[t]]; grid T, block any.
extern "C" __global__ void embedding_bf16(bf16* __restrict__ out, const bf16* __restrict__ table,
                                          const int32_t* __restrict__ ids, int hidden) {
    const int64_t t = blockIdx.x;
    const bf16* row = table + (int64_t)ids[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = row[i];
}

// Zero-centred RMSNorm with the residual add in front:
//   if delta: residual = bf16(residual + delta)      (HF: hidden = residual + hidden)
//   out = bf16(residual / rms(residual) * (1 + w))
// grid T, block 256, dynamic shared memory hidden floats.
extern "C" __global__ void add_rmsnorm_bf16(bf16* __restrict__ out, bf16* __restrict__ residual,
                                            const bf16* __restrict__ delta,
                                            const float* __restrict__ weight, int hidden,
                                            float eps) {
    extern __shared__ float xs[];
    const int64_t base = (int64_t)blockIdx.x * hidden;
    float ss = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float x = f(residual[base + i]);
        if (delta != nullptr) {
            x = rbf(x + f(delta[base + i]));
            residual[base + i] = bf(x);
        }
        xs[i] = x;
        ss += x * x;
    }
    const float r = rsqrtf(block_sum(ss) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[base + i] = bf(xs[i] * r * (1.f + weight[i]));
}

// add_rmsnorm_bf16 for rows of hidden % 8 == 0 and hidden <= 8 * 1024: each
// thread keeps 8 consecutive values in registers (one 16-byte load of the
// residual and of delta), so a row costs one round trip to memory instead of
// hidden / 256 dependent ones. Why: a decode step runs 65 norms over one row
// each; the strided loop above took 9.7 us a row on the H200 (ncu,
// 2026-12-01), 15% of the batch-1 step. grid T, block hidden / 8 rounded up
// to a warp, no shared memory beyond block_sum's.
extern "C" __global__ void add_rmsnorm_vec8_bf16(bf16* __restrict__ out, bf16* __restrict__ residual,
                                                 const bf16* __restrict__ delta,
                                                 const float* __restrict__ weight, int hidden,
                                                 float eps) {
    const int64_t base = (int64_t)blockIdx.x * hidden;
    const int i0 = threadIdx.x * 8;
    const bool active = i0 < hidden;
    float x[8];
    float ss = 0.f;
    if (active) {
        uint4 rv = *reinterpret_cast<const uint4*>(residual + base + i0);
        bf16* r8 = reinterpret_cast<bf16*>(&rv);
        if (delta != nullptr) {
            const uint4 dv = *reinterpret_cast<const uint4*>(delta + base + i0);
            const bf16* d8 = reinterpret_cast<const bf16*>(&dv);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                x[e] = rbf(f(r8[e]) + f(d8[e]));
                r8[e] = bf(x[e]);
            }
            *reinterpret_cast<uint4*>(residual + base + i0) = rv;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = f(r8[e]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += x[e] * x[e];
    }
    const float r = rsqrtf(block_sum(ss) / hidden + eps);
    if (active) {
        const float4 w0 = *reinterpret_cast<const float4*>(weight + i0);
        const float4 w1 = *reinterpret_cast<const float4*>(weight + i0 + 4);
        const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        uint4 ov;
        bf16* o8 = reinterpret_cast<bf16*>(&ov);
#pragma unroll
        for (int e = 0; e < 8; ++e) o8[e] = bf(x[e] * r * (1.f + w[e]));
        *reinterpret_cast<uint4*>(out + base + i0) = ov;
    }
}
