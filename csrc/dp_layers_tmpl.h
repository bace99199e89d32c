/* dp_layers_tmpl.h - bodies of dp_layers.h for one dtype (T, S defined by dp_layers.c). */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

void K(dp_avgpool2_forward)(T *y, const T *x, ptrdiff_t planes, int H, int W)
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

void K(dp_avgpool2_backward)(T *dx, const T *dy, ptrdiff_t planes, int H, int W)
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

void K(dp_gap_forward)(T *y, const T *x, ptrdiff_t planes, int n)
{
    // x is (planes, n), y (planes,)
    for (ptrdiff_t p = 0; p < planes; p++) {
        const T *xp = x + p * n;
        double s = 0;
        for (int i = 0; i < n; i++) s += (double)xp[i];
        y[p] = (T)(s / n);
    }
}

void K(dp_gap_backward)(T *dx, const T *dy, ptrdiff_t planes, int n)
{
    for (ptrdiff_t p = 0; p < planes; p++) {
        T g = (T)((double)dy[p] / n);
        T *xp = dx + p * n;
        for (int i = 0; i < n; i++) xp[i] = g;
    }
}

void K(dp_dropout_forward)(T *y, uint8_t *mask, const T *x, int rows, int n, double p,
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

void K(dp_dropout_backward)(T *dx, const T *dy, const uint8_t *mask, int rows, int n, double p)
{
    T scale = (T)(1.0 / (1.0 - p));
    ptrdiff_t total = (ptrdiff_t)rows * n;
    for (ptrdiff_t i = 0; i < total; i++) dx[i] = mask[i] ? dy[i] * scale : (T)0;
}

void K(dp_layernorm_forward)(T *y, double *stats, const T *x, const T *gamma, const T *beta,
                             int rows, int n)
{
    // x, y are (rows, n); gamma, beta (n,); stats (rows, 2)
    for (int r = 0; r < rows; r++) {
        const T *xr = x + (ptrdiff_t)r * n;
        T *yr = y + (ptrdiff_t)r * n;
        double s = 0, q = 0;
        for (int i = 0; i < n; i++) s += (double)xr[i];
        double mean = s / n;
        for (int i = 0; i < n; i++) {
            double c = (double)xr[i] - mean;
            q += c * c;
        }
        double rstd = 1.0 / sqrt(q / n + DP_LAYERNORM_EPS);
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
        for (int i = 0; i < n; i++) {
            T h = (T)(((double)xr[i] - mean) * rstd);
            yr[i] = h * gamma[i] + beta[i];
        }
    }
}

void K(dp_layernorm_backward_dx)(T *dx, const T *dy, const T *x, const double *stats,
                                 const T *gamma, int rows, int n)
{
    for (int r = 0; r < rows; r++) {
        const T *xr = x + (ptrdiff_t)r * n, *gr = dy + (ptrdiff_t)r * n;
        T *dr = dx + (ptrdiff_t)r * n;
        double mean = stats[2 * r], rstd = stats[2 * r + 1], a = 0, b = 0;
        for (int i = 0; i < n; i++) {
            double g = (double)gr[i] * (double)gamma[i];
            double h = (double)(T)(((double)xr[i] - mean) * rstd);
            a += g;
            b += g * h;
        }
        a /= n;
        b /= n;
        for (int i = 0; i < n; i++) {
            double g = (double)gr[i] * (double)gamma[i];
            double h = (double)(T)(((double)xr[i] - mean) * rstd);
            dr[i] = (T)(rstd * (g - a - h * b));
        }
    }
}

void K(dp_layernorm_backward_params)(T *dgamma, T *dbeta, const T *dy, const T *x,
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

#undef K
