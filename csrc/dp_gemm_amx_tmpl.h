/* dp_gemm_amx_tmpl.h - the bfloat16 GEMM's AMX path: float32 GEMMs with dp_ctx.bf16_inputs
 * computed on Intel AMX's tiles (AMX-TILE, AMX-BF16: tdpbf16ps), where the CPU has them, the
 * OS lends the tile state (dp_gemm.c: amx_ready) and the AVX-512 build is the active ISA.
 * Included by dp_gemm.c, after the float builds, with these macros defined (undefined at the
 * end):
 *   ASFX       name suffix: _amx (the instructions) or _amxemul (csrc/tests' wide build: the
 *              same tiles emulated in plain C, so that the packing, the edges and the driver
 *              run on any CPU)
 *   AMX_TGT    the function attribute of the build (empty for _amxemul)
 *   AMX_HW     1: AMX through its intrinsics; 0: the emulation
 *   AMX_PACKB  the float build's pack_b whose 32-column panels feed the conversion
 *   AMX_VF, AMX_STORE  the float build's vector type and store_tile (alpha, beta, the edges:
 *              12 x 32 at a time)
 *
 * Tiles (Intel SDM vol. 1 ch. 3, TDPBF16PS): a tile is 16 rows of 64 bytes. tdpbf16ps
 * C += A . B takes C as 16 x 16 floats, A as 16 rows of 32 bfloat16 (32 k), B as 16 rows of
 * 16 bfloat16 pairs: B's row r holds k = 2r (the low half) and 2r + 1 of each of 16 columns.
 * Each C block of 32 x 32 uses all 8 tiles: 4 accumulators (tiles 0-3), 2 A (4, 5), 2 B (6, 7).
 *
 * Packing. Both operands are packed to whole 1 KB tiles, zero-padded: A as [16-row tile][32-k
 * chunk][16 rows][32], B as [16-column tile][32-k chunk][16 pair rows][16 columns][2]. Rows
 * of a row-major operand are rounded to bfloat16 (round to nearest even) and, for B, paired,
 * straight from the operand. A transposed one (A^T or B^T stored) goes through the float
 * build's pack_b first, 32 columns at a time, which transposes in registers and pads with
 * zeros: A through it as a "kc x nc" panel of mc rows and 32 k (each packed row is then one
 * tile row), B as itself.
 *
 * The arithmetic. The K slices are the float path's (balanced, at most KC_F32), each padded
 * to a multiple of 32 with zeros, and alpha and beta are applied per slice by the same
 * store_tile. The emulation adds each k's product one after the other, each rounded, as the
 * float micro-kernel does: its results are the rounding path's bits (csrc/tests checks it).
 * The hardware sums otherwise: measured on a Sapphire Rapids class Xeon, its results agree
 * with neither order of one-by-one rounded sums but more often with the exact sum, so it
 * keeps more precision inside an instruction. They are
 * the same for the same shapes on every run (one instruction sequence), and within the float
 * summation bound of the rounded operands. It reads denormal inputs as 0, as vdpbf16ps does,
 * and its packing's vcvtne2ps2bf16 reads a denormal float as 0 before rounding it (where
 * the other paths round 0x007fffff up to the smallest normal). There, on one thread, it ran
 * the MLP's GEMMs several times faster than the float path, and the MLP's and the CNN's
 * training steps faster (bench/bench_bf16.py). Row-major operands go straight into tiles,
 * not through pack_b, which had cost the A^T and plain shapes about half their time.
 */

#define ACAT_(a, b) a##b
#define ACAT(a, b) ACAT_(a, b)
#define AF(name) ACAT(name, ASFX)

#define AMX_TILE 512 /* bfloat16 in a tile: 16 rows x 32 */

typedef AMX_VF AF(amx_vf);

/* float -> bfloat16 bits, round to nearest even (dp_bf16_round_bits) */
#if AMX_HW
/* 32 floats of a row (already zero-padded) -> 32 bfloat16 */
AMX_TGT DP_INLINE void AF(amx_row)(uint16_t *dst, const float *src)
{
    __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
    _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* 16 floats of row k and 16 of row k + 1 -> 16 pairs, k in the low half */
AMX_TGT DP_INLINE void AF(amx_pairs)(uint16_t *dst, const float *even, const float *odd)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 e = even ? _mm512_loadu_ps(even) : _mm512_setzero_ps();
    __m512 o = odd ? _mm512_loadu_ps(odd) : _mm512_setzero_ps();
    __m512i w = (__m512i)_mm512_cvtne2ps_pbh(o, e); /* words 0-15: e, 16-31: o */
    _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(idx, w));
}
#else
DP_INLINE uint16_t AF(amx_bf)(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(dp_bf16_round_bits(u) >> 16);
}

static void AF(amx_row)(uint16_t *dst, const float *src)
{
    for (int i = 0; i < 32; i++) dst[i] = AF(amx_bf)(src[i]);
}

static void AF(amx_pairs)(uint16_t *dst, const float *even, const float *odd)
{
    for (int j = 0; j < 16; j++) {
        dst[2 * j] = even ? AF(amx_bf)(even[j]) : 0;
        dst[2 * j + 1] = odd ? AF(amx_bf)(odd[j]) : 0;
    }
}
#endif

/* Chunk q of A's tiles (dst: its first row tile's, nq chunks apart) from the mc rows of kq
 * <= 32 floats at src, rs apart; rows past mc zero. A partial chunk goes through pad (32
 * floats, zero past kq: no array on these AVX-512 functions' stacks, where under
 * AddressSanitizer GCC 13's realigned frame crashed on one, at its zeroing); pad NULL: the
 * rows are readable, and zero, up to 32 (pack_b's padding). */
AMX_TGT static void AF(amx_rows)(uint16_t *dst, int nq, const float *src, ptrdiff_t rs, int mc,
                                 int kq, float *pad)
{
    int copy = kq < 32 && pad;
    if (copy) memset(pad, 0, 32 * sizeof(float));
    for (int t = 0; t < (mc + 15) / 16; t++) {
        uint16_t *tile = dst + (ptrdiff_t)t * nq * AMX_TILE;
        for (int r = 0; r < 16; r++) {
            int i = 16 * t + r;
            const float *row = src + (ptrdiff_t)i * rs;
            if (i >= mc) {
                memset(tile + 32 * r, 0, 64);
                continue;
            }
            if (copy) row = memcpy(pad, row, (size_t)kq * sizeof(float));
            AF(amx_row)(tile + 32 * r, row);
        }
    }
}

/* The mc x kc block of A (element (i, k) at A[i * rsa + k * csa]) as tiles: nq = ceil(kc / 32)
 * chunks, ceil(mc / 16) row tiles. A row-major A is read in place; a transposed one goes
 * through pack_b, as a "kc x nc" = mc x 32 panel per chunk (row i's 32 k in stage[32 i ..],
 * zero past the chunk). stage: 32 x mc floats (at least 32). */
AMX_TGT static void AF(amx_pack_a)(uint16_t *dst, float *stage, const float *A, ptrdiff_t rsa,
                                   ptrdiff_t csa, int mc, int kc)
{
    int nq = (kc + 31) / 32;
    for (int q = 0; q < nq; q++) {
        int kq = kc - 32 * q < 32 ? kc - 32 * q : 32;
        const float *a = A + (ptrdiff_t)32 * q * csa;
        if (csa == 1) {
            AF(amx_rows)(dst + (ptrdiff_t)q * AMX_TILE, nq, a, rsa, mc, kq, stage);
        } else {
            AMX_PACKB(stage, a, rsa, csa, mc, kq);
            AF(amx_rows)(dst + (ptrdiff_t)q * AMX_TILE, nq, stage, 32, mc, kq, NULL);
        }
    }
}

/* The column tiles (dst: the first's, nq chunks each) of the kc x nc panel of a row-major B
 * (rows rs floats apart): row pair r of each holds rows 2r (low halves) and 2r + 1 of 16
 * columns, zero past kc. A partial last tile's columns go through pad (32 floats); pad NULL:
 * the rows are readable, and zero, up to a multiple of 16 columns (pack_b's padding). */
AMX_TGT static void AF(amx_pair_rows)(uint16_t *dst, const float *B, ptrdiff_t rs, int kc, int nc,
                                      float *pad)
{
    int nq = (kc + 31) / 32;
    for (int h = 0; h < (nc + 15) / 16; h++) {
        uint16_t *col = dst + (ptrdiff_t)h * nq * AMX_TILE;
        int w = nc - 16 * h < 16 ? nc - 16 * h : 16, copy = w < 16 && pad;
        if (copy) memset(pad, 0, 32 * sizeof(float));
        for (int r = 0; r < 16 * nq; r++) {
            int k = 2 * r;
            const float *even = k < kc ? B + (ptrdiff_t)k * rs + 16 * h : NULL;
            const float *odd = k + 1 < kc ? B + (ptrdiff_t)(k + 1) * rs + 16 * h : NULL;
            if (copy) {
                if (even) even = memcpy(pad, even, (size_t)w * sizeof(float));
                if (odd) odd = memcpy(pad + 16, odd, (size_t)w * sizeof(float));
            }
            AF(amx_pairs)(col + (ptrdiff_t)32 * r, even, odd);
        }
    }
}

/* The kc x nc panel of B (element (k, j) at B[k * rsb + j * csb]) as tiles of pairs:
 * ceil(nc / 16) column tiles of nq chunks. A row-major B is read in place; a transposed one
 * goes through pack_b, 32 columns at a time (kc rows of 32 in stage, zero past nc). stage:
 * 32 x kc floats (at least 32). */
AMX_TGT static void AF(amx_pack_b)(uint16_t *dst, float *stage, const float *B, ptrdiff_t rsb,
                                   ptrdiff_t csb, int kc, int nc)
{
    if (csb == 1) {
        AF(amx_pair_rows)(dst, B, rsb, kc, nc, stage);
        return;
    }
    int nq = (kc + 31) / 32;
    for (int j0 = 0; j0 < nc; j0 += 32) {
        int nr = nc - j0 < 32 ? nc - j0 : 32;
        AMX_PACKB(stage, B + (ptrdiff_t)j0 * csb, rsb, csb, kc, nr);
        AF(amx_pair_rows)(dst + (ptrdiff_t)(j0 / 16) * nq * AMX_TILE, stage, 32, kc, nr, NULL);
    }
}

#if AMX_HW
#define TILES_DECL
#define TZERO(t) _tile_zero(t)
#define TLOAD(t, p) _tile_loadd(t, p, 64)
#define TDP(c, a, b) _tile_dpbf16ps(c, a, b)
#define TSTORE(t, p, ld) _tile_stored(t, p, (ld) * (int)sizeof(float))
#else
/* the emulated tiles: 4 accumulators, 4 operand tiles (4, 5: A; 6, 7: B) */
typedef struct {
    float c[4][16][16];
    uint16_t ab[4][16][32];
} AF(amx_tiles);

DP_INLINE float AF(amx_f)(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* c += a . b, per element k after k (the pair's low half first), each product added and
 * rounded: the float micro-kernel's order */
static void AF(amx_dp)(float c[16][16], uint16_t a[16][32], uint16_t b[16][32])
{
    for (int m = 0; m < 16; m++)
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 16; n++) {
                c[m][n] += AF(amx_f)(a[m][2 * r]) * AF(amx_f)(b[r][2 * n]);
                c[m][n] += AF(amx_f)(a[m][2 * r + 1]) * AF(amx_f)(b[r][2 * n + 1]);
            }
}

static void AF(amx_st)(float *out, ptrdiff_t ld, float c[16][16])
{
    for (int m = 0; m < 16; m++) memcpy(out + ld * m, c[m], 64);
}

#define TILES_DECL AF(amx_tiles) tl_;
#define TZERO(tc) memset(tl_.c[tc], 0, sizeof tl_.c[tc])
#define TLOAD(tab, p) memcpy(tl_.ab[(tab) - 4], (p), 1024)
#define TDP(tc, ta, tb) AF(amx_dp)(tl_.c[tc], tl_.ab[(ta) - 4], tl_.ab[(tb) - 4])
#define TSTORE(tc, p, ld) AF(amx_st)((p), (ld), tl_.c[tc])
#endif

/* out[0:16 MT][0:16 NT] (rows ld floats apart) = the (16 MT) x (16 NT) block of A . B over nq
 * chunks: a is the block's first row tile (its second nq tiles on), b its first column tile.
 * Tile numbers are immediates, hence one function per shape. */
#define AMX_KERNEL(MT, NT)                                                                   \
    AMX_TGT static void AF(amx_kernel_##MT##NT)(float *out, ptrdiff_t ld, const uint16_t *a, \
                                                const uint16_t *b, int nq)                   \
    {                                                                                        \
        TILES_DECL                                                                           \
        TZERO(0);                                                                            \
        if (NT > 1) TZERO(1);                                                                \
        if (MT > 1) TZERO(2);                                                                \
        if (MT > 1 && NT > 1) TZERO(3);                                                      \
        for (int q = 0; q < nq; q++) {                                                       \
            TLOAD(4, a + (ptrdiff_t)q * AMX_TILE);                                           \
            TLOAD(6, b + (ptrdiff_t)q * AMX_TILE);                                           \
            if (MT > 1) TLOAD(5, a + (ptrdiff_t)(nq + q) * AMX_TILE);                        \
            if (NT > 1) TLOAD(7, b + (ptrdiff_t)(nq + q) * AMX_TILE);                        \
            TDP(0, 4, 6);                                                                    \
            if (NT > 1) TDP(1, 4, 7);                                                        \
            if (MT > 1) TDP(2, 5, 6);                                                        \
            if (MT > 1 && NT > 1) TDP(3, 5, 7);                                              \
        }                                                                                    \
        TSTORE(0, out, ld);                                                                  \
        if (NT > 1) TSTORE(1, out + 16, ld);                                                 \
        if (MT > 1) TSTORE(2, out + 16 * ld, ld);                                            \
        if (MT > 1 && NT > 1) TSTORE(3, out + 16 * ld + 16, ld);                             \
    }
AMX_KERNEL(1, 1)
AMX_KERNEL(1, 2)
AMX_KERNEL(2, 1)
AMX_KERNEL(2, 2)
#undef AMX_KERNEL

/* C[0:mr, 0:nr] = alpha * out + beta * C through the float build's store_tile, 12 rows at a
 * time (its tile), so that alpha, beta and the edges are the float path's to the bit */
AMX_TGT static void AF(amx_store)(float *C, ptrdiff_t ldc, const float *out, int mr, int nr,
                                  float alpha, float beta)
{
    typedef AF(amx_vf) V;
    for (int i0 = 0; i0 < mr; i0 += 12) {
        V acc[12][2];
        int rows = mr - i0 < 12 ? mr - i0 : 12;
        for (int i = 0; i < 12; i++) {
            const float *row = out + (ptrdiff_t)32 * (i0 + (i < rows ? i : 0));
            memcpy(&acc[i][0], row, sizeof acc[i][0]);
            memcpy(&acc[i][1], row + 16, sizeof acc[i][1]);
        }
        AMX_STORE(C + (ptrdiff_t)i0 * ldc, ldc, acc, rows, nr, alpha, beta);
    }
}

/* The tile configuration: palette 1, the 8 tiles 16 rows x 64 bytes (Intel SDM: LDTILECFG's
 * 64-byte memory operand). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AF(amx_cfg);

typedef struct {
    dp_ctx *ctx;
    float *C;
    ptrdiff_t ldc;
    const float *A, *B;
    ptrdiff_t rsa, csa, rsb, csb;
    int M, N, K;
    float alpha, beta;
    int split_n; /* 1: threads own column ranges (whole 32-column blocks), 0: row ranges */
    int kc, mc;  /* the K slice (the float path's) and the row block */
} AF(amx_job);

/* A thread's 32 x 32 floats of C on their way to store_tile (out): in its scratch, not on
 * the stack (GCC 13's AddressSanitizer build crashed on a stack array in these AVX-512
 * functions' realigned frames) */
#define AMX_OUT_BYTES (32 * 32 * sizeof(float))

/* bytes of one thread's scratch: [2t] the A tiles, then the staging floats; [2t + 1] out,
 * then the B tiles of an NC-column panel (the shared scheme below: [2t] out, then staging) */
static size_t AF(amx_a_bytes)(int mc, int kc)
{
    size_t stage = (size_t)32 * (mc > kc ? mc : kc) * sizeof(float);
    return (size_t)((mc + 15) / 16) * ((kc + 31) / 32) * AMX_TILE * 2 + stage;
}

static size_t AF(amx_b_bytes)(int nc, int kc)
{ return (size_t)((nc + 31) / 32) * 2 * ((kc + 31) / 32) * AMX_TILE * 2; }

/* The tiles configured for this thread (every tile 16 rows of 64 bytes), and released after:
 * back to their init state, with no 8 KB to save at a context switch. */
AMX_TGT DP_INLINE void AF(amx_tiles_on)(void)
{
#if AMX_HW
    AF(amx_cfg) cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
#endif
}

AMX_TGT DP_INLINE void AF(amx_tiles_off)(void)
{
#if AMX_HW
    _tile_release();
#endif
}

/* One block of C, c[0:mr, 0:nr] (mr, nr <= 32), from its row tiles a and column tiles b over
 * nq chunks: stored from the tiles in place where it is whole and C = the sums (alpha 1,
 * beta 0: store_tile's bits), else through out and store_tile */
AMX_TGT DP_INLINE void AF(amx_block)(const AF(amx_job) * job, float *out, const uint16_t *a,
                                     const uint16_t *b, int nq, float *c, int mr, int nr,
                                     float beta)
{
    if (mr == 32 && nr == 32 && job->alpha == 1 && beta == 0) {
        AF(amx_kernel_22)(c, job->ldc, a, b, nq);
        return;
    }
    if (mr > 16 && nr > 16)
        AF(amx_kernel_22)(out, 32, a, b, nq);
    else if (mr > 16)
        AF(amx_kernel_21)(out, 32, a, b, nq);
    else if (nr > 16)
        AF(amx_kernel_12)(out, 32, a, b, nq);
    else
        AF(amx_kernel_11)(out, 32, a, b, nq);
    AF(amx_store)(c, job->ldc, out, mr, nr, job->alpha, beta);
}

AMX_TGT static void AF(amx_task)(void *arg, int t, int n)
{
    AF(amx_job) *job = arg;
    int m0 = 0, m1 = job->M, n0 = 0, n1 = job->N;
    if (job->split_n)
        part_f32(job->N, 32, t, n, &n0, &n1);
    else
        part_f32(job->M, 32, t, n, &m0, &m1);
    if (m0 >= m1 || n0 >= n1) return;
    AF(amx_tiles_on)();
    int M = m1 - m0, N = n1 - n0;
    uint16_t *At = job->ctx->pack[2 * t].ptr;
    float *out = job->ctx->pack[2 * t + 1].ptr;
    uint16_t *Bt = (uint16_t *)((char *)out + AMX_OUT_BYTES);
    const float *A = job->A + (ptrdiff_t)m0 * job->rsa;
    const float *B = job->B + (ptrdiff_t)n0 * job->csb;
    float *C = job->C + (ptrdiff_t)m0 * job->ldc + n0;
    for (int jc = 0; jc < N; jc += NC_F32) {
        int nc = N - jc < NC_F32 ? N - jc : NC_F32;
        for (int pc = 0; pc < job->K; pc += job->kc) {
            int kc = job->K - pc < job->kc ? job->K - pc : job->kc, nq = (kc + 31) / 32;
            float beta = pc == 0 ? job->beta : 1.0f;
            float *stage =
                (float *)(At + (size_t)((job->mc + 15) / 16) * ((job->kc + 31) / 32) * AMX_TILE);
            AF(amx_pack_b)(Bt, stage, B + (ptrdiff_t)pc * job->rsb + (ptrdiff_t)jc * job->csb,
                           job->rsb, job->csb, kc, nc);
            for (int ic = 0; ic < M; ic += job->mc) {
                int mc = M - ic < job->mc ? M - ic : job->mc;
                AF(amx_pack_a)(At, stage, A + (ptrdiff_t)ic * job->rsa + (ptrdiff_t)pc * job->csa,
                               job->rsa, job->csa, mc, kc);
                for (int j0 = 0; j0 < nc; j0 += 32) {
                    int nr = nc - j0 < 32 ? nc - j0 : 32;
                    const uint16_t *b = Bt + (ptrdiff_t)(j0 / 16) * nq * AMX_TILE;
                    for (int i0 = 0; i0 < mc; i0 += 32) {
                        int mr = mc - i0 < 32 ? mc - i0 : 32;
                        AF(amx_block)(job, out, At + (ptrdiff_t)(i0 / 16) * nq * AMX_TILE, b, nq,
                                      C + (ptrdiff_t)(ic + i0) * job->ldc + jc + j0, mr, nr, beta);
                    }
                }
            }
        }
    }
    AF(amx_tiles_off)();
}

/* ---- several threads: both operands packed once, shared ----
 * With its own packing, each thread packed all of the operand the threads share (a split
 * along N: all of A): the 2-thread MLP step ran slower than the 1-thread one. So the
 * threads first pack disjoint parts of A and B into one buffer (ctx->ct), then compute
 * disjoint parts of C from it: the same slices, tiles, kernels and stores, hence the same
 * bits as one thread. Slice s's tiles: A's [row tile][chunk], then B's [column tile][chunk],
 * at s * AF(amx_slice_tiles) tiles. Above AMX_SHARED_BYTES the per-thread packing runs. */
#ifndef AMX_SHARED_BYTES
#define AMX_SHARED_BYTES (8 << 20)
#endif

typedef struct {
    AF(amx_job) * job;
    uint16_t *tiles;
    int nq_max, mt; /* chunks of a whole slice, A's row tiles */
    size_t slice;   /* tiles per slice */
} AF(amx_shared);

AMX_TGT static void AF(amx_pack_task)(void *arg, int t, int n)
{
    AF(amx_shared) *sh = arg;
    AF(amx_job) *job = sh->job;
    int m0, m1, n0, n1;
    part_f32(job->M, 32, t, n, &m0, &m1);
    part_f32(job->N, 32, t, n, &n0, &n1);
    float *stage = (float *)((char *)job->ctx->pack[2 * t].ptr + AMX_OUT_BYTES);
    for (int pc = 0, s = 0; pc < job->K; pc += job->kc, s++) {
        int kc = job->K - pc < job->kc ? job->K - pc : job->kc, nq = (kc + 31) / 32;
        uint16_t *at = sh->tiles + (size_t)s * sh->slice * AMX_TILE;
        uint16_t *bt = at + (size_t)sh->mt * nq * AMX_TILE;
        if (m0 < m1)
            AF(amx_pack_a)(at + (ptrdiff_t)(m0 / 16) * nq * AMX_TILE, stage,
                           job->A + (ptrdiff_t)m0 * job->rsa + (ptrdiff_t)pc * job->csa, job->rsa,
                           job->csa, m1 - m0, kc);
        if (n0 < n1)
            AF(amx_pack_b)(bt + (ptrdiff_t)(n0 / 16) * nq * AMX_TILE, stage,
                           job->B + (ptrdiff_t)pc * job->rsb + (ptrdiff_t)n0 * job->csb, job->rsb,
                           job->csb, kc, n1 - n0);
    }
}

AMX_TGT static void AF(amx_compute_task)(void *arg, int t, int n)
{
    AF(amx_shared) *sh = arg;
    AF(amx_job) *job = sh->job;
    int m0 = 0, m1 = job->M, n0 = 0, n1 = job->N;
    if (job->split_n)
        part_f32(job->N, 32, t, n, &n0, &n1);
    else
        part_f32(job->M, 32, t, n, &m0, &m1);
    if (m0 >= m1 || n0 >= n1) return;
    AF(amx_tiles_on)();
    float *out = job->ctx->pack[2 * t].ptr;
    for (int pc = 0, s = 0; pc < job->K; pc += job->kc, s++) {
        int kc = job->K - pc < job->kc ? job->K - pc : job->kc, nq = (kc + 31) / 32;
        float beta = pc == 0 ? job->beta : 1.0f;
        const uint16_t *at = sh->tiles + (size_t)s * sh->slice * AMX_TILE;
        const uint16_t *bt = at + (size_t)sh->mt * nq * AMX_TILE;
        for (int j0 = n0; j0 < n1; j0 += 32)
            for (int i0 = m0; i0 < m1; i0 += 32)
                AF(amx_block)(job, out, at + (ptrdiff_t)(i0 / 16) * nq * AMX_TILE,
                              bt + (ptrdiff_t)(j0 / 16) * nq * AMX_TILE, nq,
                              job->C + (ptrdiff_t)i0 * job->ldc + j0, m1 - i0 < 32 ? m1 - i0 : 32,
                              n1 - j0 < 32 ? n1 - j0 : 32, beta);
    }
    AF(amx_tiles_off)();
}

/* C = alpha A B + beta C with bfloat16 inputs on the tiles (M, N, K >= 1, alpha != 0). */
static int AF(amx_gemm)(dp_ctx *ctx, float *C, ptrdiff_t ldc, const float *A, ptrdiff_t rsa,
                        ptrdiff_t csa, const float *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N,
                        int K, float alpha, float beta)
{
    AF(amx_job)
    job = {ctx, C, ldc, A, B,     rsa,  csa, rsb,
           csb, M, N,   K, alpha, beta, 1,   balanced_f32(K, KC_F32, 1),
           0};
    /* at least 4x the float path's work per thread: the tiles do about 4x its flop (on the
     * Xeon, the bfloat16 MLP step gained nothing from more threads at a smaller share) */
    int threads =
        plan_threads_f32(ctx->threads, M, N, K, 32, 32, 4 * GEMM_THREAD_FLOPS, &job.split_n);
    int nblocks = (N + 31) / 32, mblocks = (M + 31) / 32;
    int rows = job.split_n ? M : 32 * ((mblocks + threads - 1) / threads);
    job.mc = balanced_f32(rows, 128, 32);
    int cols = job.split_n ? 32 * ((nblocks + threads - 1) / threads) : N;
    int nslices = (K + job.kc - 1) / job.kc, nq_max = (job.kc + 31) / 32;
    AF(amx_shared)
    sh = {&job, NULL, nq_max, (M + 15) / 16, (size_t)((M + 15) / 16 + 2 * nblocks) * nq_max};
    size_t shared = (size_t)nslices * sh.slice * AMX_TILE * 2;
    if (threads > 1 && shared <= AMX_SHARED_BYTES) {
        /* a thread's staging: 32 floats by its rows of A, or by the K slice for B */
        int part_rows = 32 * ((mblocks + threads - 1) / threads);
        size_t stage =
            (size_t)32 * (part_rows > job.kc ? part_rows : job.kc) * sizeof(float) + AMX_OUT_BYTES;
        sh.tiles = dp_scratch_get(&ctx->ct, shared);
        for (int t = 0; sh.tiles && t < threads; t++)
            if (!dp_scratch_get(&ctx->pack[2 * t], stage)) sh.tiles = NULL;
        if (!sh.tiles) return DP_ENOMEM;
        dp_threads_run(ctx->team, threads, AF(amx_pack_task), &sh);
        dp_threads_run(ctx->team, threads, AF(amx_compute_task), &sh);
        return DP_OK;
    }
    for (int t = 0; t < threads; t++)
        if (!dp_scratch_get(&ctx->pack[2 * t], AF(amx_a_bytes)(job.mc, job.kc)) ||
            !dp_scratch_get(&ctx->pack[2 * t + 1],
                            AMX_OUT_BYTES + AF(amx_b_bytes)(cols < NC_F32 ? cols : NC_F32, job.kc)))
            return DP_ENOMEM;
    dp_threads_run(ctx->team, threads, AF(amx_task), &job);
    return DP_OK;
}

#undef TILES_DECL
#undef TZERO
#undef TLOAD
#undef TDP
#undef TSTORE
#undef AMX_TILE
#undef AMX_SHARED_BYTES
#undef AMX_OUT_BYTES
#undef AF
#undef ACAT
#undef ACAT_
#undef ASFX
#undef AMX_TGT
#undef AMX_HW
#undef AMX_PACKB
#undef AMX_VF
#undef AMX_STORE
