/* dp_layers_tmpl.h - bodies of dp_layers.h for one dtype (T, S defined by dp_layers.c). */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

/* The reductions below sum in LANES interleaved partial sums (value i into lane i % LANES,
 * the lanes then added in a fixed tree): a single running sum is a chain of dependent adds
 * the compiler may not reorder, LANES of them are one vector. The same bits on every build. */
#define LANES 8

DP_INLINE double K(lanes_total)(const double *acc)
{
    double a[LANES];
    for (int j = 0; j < LANES; j++) a[j] = acc[j];
    for (int h = LANES / 2; h >= 1; h /= 2)
        for (int j = 0; j < h; j++) a[j] += a[j + h];
    return a[0];
}

/* sum of x[0:n] (as doubles) */
DP_INLINE double K(sum_lanes)(const T *x, int n)
{
    double acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += (double)x[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += (double)x[i];
    return K(lanes_total)(acc);
}

/* sum of (x[i] - mean)^2 */
DP_INLINE double K(sq_lanes)(const T *x, int n, double mean)
{
    double acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            double c = (double)x[i + j] - mean;
            acc[j] += c * c;
        }
    for (int j = 0; i < n; i++, j++) {
        double c = (double)x[i] - mean;
        acc[j] += c * c;
    }
    return K(lanes_total)(acc);
}

void KV(dp_avgpool2_forward)(T *y, const T *x, ptrdiff_t planes, int H, int W)
{
    // x is (planes, H, W), y (planes, H / 2, W / 2)
    int OH = H / 2, OW = W / 2;
    for (ptrdiff_t p = 0; p < planes; p++) {
        const T *xp = x + p * H * W;
        T *yp = y + p * OH * OW;
        for (int i = 0; i < OH; i++) {
            const T *r0 = xp + (ptrdiff_t)2 * i * W, *r1 = r0 + W;
            for (int j = 0; j < OW; j++)
                yp[i * OW + j] =
                    (((r0[2 * j] + r0[2 * j + 1]) + r1[2 * j]) + r1[2 * j + 1]) * (T)0.25;
        }
    }
}

void KV(dp_avgpool2_backward)(T *dx, const T *dy, ptrdiff_t planes, int H, int W)
{
    // dy is (planes, H / 2, W / 2), dx (planes, H, W), written
    int OH = H / 2, OW = W / 2;
    for (ptrdiff_t p = 0; p < planes; p++) {
        T *xp = dx + p * H * W;
        const T *yp = dy + p * OH * OW;
        memset(xp, 0, sizeof(T) * (size_t)H * W);
        for (int i = 0; i < OH; i++) {
            T *r0 = xp + (ptrdiff_t)2 * i * W, *r1 = r0 + W;
            for (int j = 0; j < OW; j++) {
                T g = yp[i * OW + j] * (T)0.25;
                r0[2 * j] = r0[2 * j + 1] = r1[2 * j] = r1[2 * j + 1] = g;
            }
        }
    }
}

void KV(dp_gap_forward)(T *y, const T *x, ptrdiff_t planes, int n)
{
    // x is (planes, n), y (planes,)
    for (ptrdiff_t p = 0; p < planes; p++) {
        const T *xp = x + p * n;
        y[p] = (T)(K(sum_lanes)(xp, n) / n);
    }
}

void KV(dp_gap_backward)(T *dx, const T *dy, ptrdiff_t planes, int n)
{
    for (ptrdiff_t p = 0; p < planes; p++) {
        T g = (T)((double)dy[p] / n);
        T *xp = dx + p * n;
        for (int i = 0; i < n; i++) xp[i] = g;
    }
}

void KV(dp_dropout_forward)(T *y, uint8_t *mask, const T *x, int rows, int n, double p,
                            uint64_t seed, int64_t step, int64_t row0, int layer)
{
    // x, y are (rows, n), mask (rows, n): 1 where the value is kept
    uint32_t thr = dp_dropout_threshold(p);
    T scale = (T)(1.0 / (1.0 - p));
    for (int r = 0; r < rows; r++) {
        uint64_t key = dp_dropout_key(seed, step, row0 + r, layer);
        const T *xr = x + (ptrdiff_t)r * n;
        T *yr = y + (ptrdiff_t)r * n;
        uint8_t *mr = mask + (ptrdiff_t)r * n;
        for (int u = 0; u < n; u++) {
            int keep = dp_dropout_bits(key, u) >= thr;
            mr[u] = (uint8_t)keep;
            yr[u] = keep ? xr[u] * scale : (T)0;
        }
    }
}

void KV(dp_dropout_backward)(T *dx, const T *dy, const uint8_t *mask, int rows, int n, double p)
{
    T scale = (T)(1.0 / (1.0 - p));
    ptrdiff_t total = (ptrdiff_t)rows * n;
    for (ptrdiff_t i = 0; i < total; i++) dx[i] = mask[i] ? dy[i] * scale : (T)0;
}

void KV(dp_layernorm_forward)(T *y, double *stats, const T *x, const T *gamma, const T *beta,
                              int rows, int n)
{
    // x, y are (rows, n); gamma, beta (n,); stats (rows, 2)
    for (int r = 0; r < rows; r++) {
        const T *xr = x + (ptrdiff_t)r * n;
        T *yr = y + (ptrdiff_t)r * n;
        double mean = K(sum_lanes)(xr, n) / n;
        double rstd = 1.0 / sqrt(K(sq_lanes)(xr, n, mean) / n + DP_LAYERNORM_EPS);
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
        for (int i = 0; i < n; i++) {
            T h = (T)(((double)xr[i] - mean) * rstd);
            yr[i] = h * gamma[i] + beta[i];
        }
    }
}

void KV(dp_layernorm_backward_dx)(T *dx, const T *dy, const T *x, const double *stats,
                                  const T *gamma, int rows, int n)
{
    for (int r = 0; r < rows; r++) {
        const T *xr = x + (ptrdiff_t)r * n, *gr = dy + (ptrdiff_t)r * n;
        T *dr = dx + (ptrdiff_t)r * n;
        double mean = stats[2 * r], rstd = stats[2 * r + 1], sa[LANES] = {0}, sb[LANES] = {0};
        int i = 0;
        for (; i + LANES <= n; i += LANES)
            for (int j = 0; j < LANES; j++) {
                double g = (double)gr[i + j] * (double)gamma[i + j];
                double h = (double)(T)(((double)xr[i + j] - mean) * rstd);
                sa[j] += g;
                sb[j] += g * h;
            }
        for (int j = 0; i < n; i++, j++) {
            double g = (double)gr[i] * (double)gamma[i];
            double h = (double)(T)(((double)xr[i] - mean) * rstd);
            sa[j] += g;
            sb[j] += g * h;
        }
        double a = K(lanes_total)(sa) / n, b = K(lanes_total)(sb) / n;
        for (int i = 0; i < n; i++) {
            double g = (double)gr[i] * (double)gamma[i];
            double h = (double)(T)(((double)xr[i] - mean) * rstd);
            dr[i] = (T)(rstd * (g - a - h * b));
        }
    }
}

void KV(dp_layernorm_backward_params)(T *dgamma, T *dbeta, const T *dy, const T *x,
                                      const double *stats, int rows, int n, int c0, int c1)
{
    for (int r = 0; r < rows; r++) {
        const T *xr = x + (ptrdiff_t)r * n, *gr = dy + (ptrdiff_t)r * n;
        double mean = stats[2 * r], rstd = stats[2 * r + 1];
        for (int i = c0; i < c1; i++) {
            T h = (T)(((double)xr[i] - mean) * rstd);
            dgamma[i] += gr[i] * h;
            dbeta[i] += gr[i];
        }
    }
}

/* Batch norm's row sums in BN_LANES partial sums, value i into lane i % BN_LANES (with one
 * vector of lanes, each add waited on the one before, and the sums were a third of the
 * layer's time), then a fixed tree: the same bits on every build. The lanes are held as
 * vectors of this build's register width, BN_PASS_LANES of them per pass over the row (4
 * registers for each of the two sums: the row, in L1, is read once per pass). With 64-byte
 * vectors on AVX2, GCC moved every lane through the stack and general registers. */
#define BN_LANES 32
#define BN_VD (DP_VEC_BYTES / 8)
#define BN_PASS_LANES (4 * BN_VD)

DP_INLINE double K(bn_total)(double *acc)
{
    for (int h = BN_LANES / 2; h >= 1; h /= 2)
        for (int j = 0; j < h; j++) acc[j] += acc[j + h];
    return acc[0];
}

/* BN_VD values of T and of double: GNU vectors, the loads whole (GCC built the lanes' loads
 * one value at a time from the scalar loops) */
typedef T K(tvd) __attribute__((vector_size(BN_VD * sizeof(T))));
typedef double K(dvd) __attribute__((vector_size(BN_VD * 8)));

DP_INLINE K(dvd) K(load_dvd)(const T *p)
{
    K(tvd) v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, K(dvd));
}

/* lanes [l0, l0 + BN_PASS_LANES) of (sum a, sum a b) over HW values (b NULL: a^2), the
 * BN_LANES-blocks only; the tail's values go to their lanes after */
DP_INLINE void K(bn_lane_pass)(double *acc1, double *acc2, const T *a, const T *b, int HW, int l0)
{
    K(dvd) s1[4] = {{0}}, s2[4] = {{0}};
    for (int i = 0; i + BN_LANES <= HW; i += BN_LANES)
        for (int q = 0; q < 4; q++) {
            K(dvd) v = K(load_dvd)(a + i + l0 + BN_VD * q);
            s1[q] += v;
            s2[q] += v * (b ? K(load_dvd)(b + i + l0 + BN_VD * q) : v);
        }
    memcpy(acc1 + l0, s1, sizeof s1);
    memcpy(acc2 + l0, s2, sizeof s2);
}

/* (sum a, sum a b) (b NULL: a^2) in the lanes, each through bn_total's tree */
DP_INLINE void K(bn_pair_sums)(double *out1, double *out2, const T *a, const T *b, int HW)
{
    double acc1[BN_LANES], acc2[BN_LANES];
    for (int l0 = 0; l0 < BN_LANES; l0 += BN_PASS_LANES) K(bn_lane_pass)(acc1, acc2, a, b, HW, l0);
    for (int i = HW - HW % BN_LANES, j = 0; i < HW; i++, j++) {
        double v = (double)a[i];
        acc1[j] += v;
        acc2[j] += v * (b ? (double)b[i] : v);
    }
    *out1 = K(bn_total)(acc1);
    *out2 = K(bn_total)(acc2);
}

void KV(dp_bn_row_sums)(double *sums, const T *x, int rows, int C, int HW)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) {
            ptrdiff_t o = (ptrdiff_t)r * C + c;
            K(bn_pair_sums)(sums + 2 * o, sums + 2 * o + 1, x + o * HW, NULL, HW);
        }
}

void KV(dp_bn_normalize)(T *y, const T *x, const double *mr, const T *gamma, const T *beta,
                         int rows, int C, int HW, int relu)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) {
            /* (x - mean) rstd gamma + beta as one multiply-add in T: x sc + sh */
            ptrdiff_t o = ((ptrdiff_t)r * C + c) * HW;
            double k = mr[2 * c + 1] * (double)gamma[c];
            T sc = (T)k, sh = (T)((double)beta[c] - mr[2 * c] * k);
            if (relu) { /* dp_relu_forward's test: NaN stays NaN */
                for (int i = 0; i < HW; i++) {
                    T v = x[o + i] * sc + sh;
                    y[o + i] = v <= 0 ? (T)0 : v;
                }
            } else {
                for (int i = 0; i < HW; i++) y[o + i] = x[o + i] * sc + sh;
            }
        }
}

void KV(dp_bn_grad_row_sums)(double *sums, T *dy, const T *x, const double *mr, int rows, int C,
                             int HW, const T *relu_y)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) {
            /* sum dy xhat = rstd (sum dy x - mean sum dy) */
            ptrdiff_t o = ((ptrdiff_t)r * C + c) * HW;
            if (relu_y) /* dp_relu_backward in place, the row in L1 for the sums after */
                for (int i = 0; i < HW; i++) dy[o + i] = relu_y[o + i] > 0 ? dy[o + i] : (T)0;
            double mean = mr[2 * c], rstd = mr[2 * c + 1], a, ab;
            K(bn_pair_sums)(&a, &ab, dy + o, x + o, HW);
            sums[((ptrdiff_t)r * C + c) * 2] = a;
            sums[((ptrdiff_t)r * C + c) * 2 + 1] = rstd * (ab - mean * a);
        }
}

void KV(dp_bn_backward_dx)(T *dx, const T *dy, const T *x, const double *mr, const double *tot,
                           const T *gamma, double count, int rows, int C, int HW, T *rsum)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) {
            /* k (dy - a - xhat b) with xhat = (x - mean) rstd, as dy c1 + x c2 + c3 in T */
            ptrdiff_t o = ((ptrdiff_t)r * C + c) * HW;
            double mean = mr[2 * c], rstd = mr[2 * c + 1];
            double a = tot[2 * c] / count, b = tot[2 * c + 1] / count, k = (double)gamma[c] * rstd;
            T c1 = (T)k, c2 = (T)(-k * b * rstd), c3 = (T)(k * (b * rstd * mean - a));
            for (int i = 0; i < HW; i++) dx[o + i] = dy[o + i] * c1 + x[o + i] * c2 + c3;
            if (rsum) { /* the row's sum (dp_add_row_sums's additions) while it is in L1 */
                rsum[(ptrdiff_t)r * C + c] = 0;
                KV(dp_add_row_sums)(rsum + (ptrdiff_t)r * C + c, dx + o, 1, HW);
            }
        }
}

#ifndef DP_VEC_PASS
DP_LAYERS_VEC(DP_VEC_DEFINE, T, S)
#endif

#undef LANES
#undef BN_LANES
#undef BN_VD
#undef BN_PASS_LANES
#undef K
