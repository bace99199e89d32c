/* dp_layers.c - see dp_layers.h; instantiates dp_layers_tmpl.h for float and double (and
 * once per wider ISA by dp_vec_*.c). */
#include "dp_layers.h"
#include "dp_buffers.h" /* dp_add_row_sums (batch norm's fused bias sums) */

#include <math.h>
#include <string.h>

#ifndef DP_VEC_PASS /* the vector kernels' builds (dp_vec.h) need only the template */
/* keeps dropout's draws apart from augmentation's for the same seed ("dropout!") */
#define DROPOUT_DOMAIN 0x64726f706f757421ULL

uint64_t dp_dropout_key(uint64_t seed, int64_t step, int64_t row, int layer)
{
    uint64_t k = dp_mix64(dp_mix64(seed ^ DROPOUT_DOMAIN) ^ (uint64_t)step);
    return dp_mix64(dp_mix64(k ^ (uint64_t)row) ^ (uint64_t)(int64_t)layer);
}

uint32_t dp_dropout_threshold(double p)
{
    if (!(p > 0)) return 0;
    double t = floor(p * 4294967296.0);
    return t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
}
#endif

#define T float
#define S _f32
#include "dp_layers_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_layers_tmpl.h"
#undef S
#undef T
