/* dp_buffers.c - instantiates dp_buffers_tmpl.h for float and double (see dp_buffers.h). */
#include "dp_buffers.h"

#include <string.h>

#define T float
#define S _f32
#include "dp_buffers_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_buffers_tmpl.h"
#undef S
#undef T

/* ---- bfloat16 (dp_buffers.h), one build per ISA like the rest */
#define K(name) name
#define BF16_CHUNK 2048

void KV(dp_to_bf16)(uint16_t *out, const float *x, ptrdiff_t n)
{
    // out[i] = the high half of x[i] rounded to nearest even (dp_bf16_round_bits)
    for (ptrdiff_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        out[i] = (uint16_t)(dp_bf16_round_bits(u) >> 16);
    }
}

void KV(dp_from_bf16)(float *out, const uint16_t *x, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)x[i] << 16;
        memcpy(&out[i], &u, sizeof u);
    }
}

void KV(dp_sum_bf16)(uint16_t *out, const uint16_t *const *ins, int k, ptrdiff_t start,
                     ptrdiff_t stop, float scale)
{
    // out[start:stop] = bf16(scale * sum of the k inputs widened to float, left to right), in
    // chunks that keep the running sum in L1 (as dp_sum_buffers); out may be an input
    for (ptrdiff_t c0 = start; c0 < stop; c0 += BF16_CHUNK) {
        ptrdiff_t len = stop - c0 < BF16_CHUNK ? stop - c0 : BF16_CHUNK;
        float acc[BF16_CHUNK];
        for (ptrdiff_t i = 0; i < len; i++) acc[i] = 0;
        for (int q = 0; q < k; q++) {
            const uint16_t *a = ins[q] + c0;
            for (ptrdiff_t i = 0; i < len; i++) {
                uint32_t u = (uint32_t)a[i] << 16;
                float f;
                memcpy(&f, &u, sizeof f);
                acc[i] += f;
            }
        }
        if (scale != 1)
            for (ptrdiff_t i = 0; i < len; i++) acc[i] *= scale;
        KV(dp_to_bf16)(out + c0, acc, len);
    }
}

#ifndef DP_VEC_PASS
DP_BF16_VEC(DP_VEC_DEFINE, float, )
#endif
#undef BF16_CHUNK
#undef K
