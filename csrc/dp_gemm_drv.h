/* dp_gemm_drv.h - the blocked GEMM driver for one dtype (BLIS's three outer loops plus
 * threading). Included by dp_gemm.c with T, DSUF (_f32/_f64), KC, MC, NC and the names of
 * the ISA builds of the packing routines and macro-kernel (suffixes _generic, _avx2 and,
 * with DP_HAVE_X86_FAST, _avx512); the build and its MR x NR come from dp_isa_active().
 *
 * Loop order: jc over NC-column panels of B, pc over KC-deep slices (B panel packed once,
 * lives in L3/L2), ic over MC-row blocks of A (packed, lives in L2), then the macro-kernel.
 * Threads: the problem is cut into T sub-GEMMs along N (whole NR micro-panels) or, when N is
 * too narrow, along M; each thread packs into its own buffers, so there is no shared write.
 */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define D(name) CAT(name, DSUF)
#define ISA(name, isa) CAT(CAT(name, DSUF), isa)
#define IMPL(isa, mr, nr)   \
    {ISA(pack_a, isa),      \
     ISA(pack_b, isa),      \
     ISA(macrokernel, isa), \
     ISA(macro_patch, isa), \
     ISA(round_bf16, isa),  \
     mr,                    \
     nr,                    \
     NULL}
/* the chosen build's micro-tile, inside functions that have a job */
#define MR (job->impl.mr)
#define NR (job->impl.nr)

typedef struct {
    void (*pack_a)(T *, const T *, ptrdiff_t, ptrdiff_t, int, int);
    void (*pack_b)(T *, const T *, ptrdiff_t, ptrdiff_t, int, int);
    void (*macro)(T *, ptrdiff_t, const T *, ptrdiff_t, ptrdiff_t, ptrdiff_t, const T *, ptrdiff_t,
                  ptrdiff_t, const T *, int, int, int, T, T);
    void (*macro_patch)(T *, ptrdiff_t, const T *, const ptrdiff_t *, const ptrdiff_t *, const T *,
                        int, int, int, T, T);
    void (*round_bf16)(float *, size_t);
    int mr, nr;                 /* the build's micro-tile */
    const dp_gemm_dot_fns *dot; /* bfloat16 inputs on the dot path (float only), or NULL */
} D(gemm_impl);

static D(gemm_impl) D(pick_impl)(void)
{
    int mr, nr, kc, mc, nc;
    dp_gemm_blocking((int)sizeof(T), &mr, &nr, &kc, &mc, &nc);
#ifdef DP_HAVE_X86_FAST
    switch (dp_isa_active()) {
    case DP_ISA_AVX512: {
        D(gemm_impl) w = IMPL(_avx512, mr, nr);
        return w;
    }
    case DP_ISA_AVX2: {
        D(gemm_impl) f = IMPL(_avx2, mr, nr);
        return f;
    }
    default: break;
    }
#endif
    D(gemm_impl) g = IMPL(_generic, mr, nr);
    return g;
}

/* pick_impl, with the dot path's functions when a float GEMM with bfloat16 inputs can take
 * it (its micro-tile, 12 x 32, is the AVX-512 float build's, which packs for it) */
static D(gemm_impl) D(pick_impl_for)(int bf16)
{
    D(gemm_impl) impl = D(pick_impl)();
    if (bf16 && sizeof(T) == sizeof(float) && impl.mr == 12 && impl.nr == 32) impl.dot = dot_pick();
    return impl;
}

typedef struct {
    dp_ctx *ctx;
    D(gemm_impl) impl;
    T *C;
    ptrdiff_t ldc;
    const T *A, *B;
    ptrdiff_t rsa, csa, rsb, csb;
    int M, N, K;
    T alpha, beta;
    int split_n; /* 1: threads own column ranges, 0: row ranges */
    int bf16;    /* round the packed A and B to bfloat16 (float only: dp_ctx.bf16_inputs) */
    int kc;      /* balanced depth of a K slice */
} D(gemm_job);

static int D(round_up)(int x, int m) { return (x + m - 1) / m * m; }

/* dp_threads_part (part t of n of [0, total) in whole `unit`s) on the GEMM's int sizes */
static void D(part)(int total, int unit, int t, int n, int *lo, int *hi)
{
    ptrdiff_t l, h;
    dp_threads_part(total, unit, t, n, &l, &h);
    *lo = (int)l;
    *hi = (int)h;
}

/* Balanced block size: the count of blocks is what MAXB dictates, the size is spread evenly. */
static int D(balanced)(int total, int maxb, int unit)
{
    int nb = (total + maxb - 1) / maxb;
    if (nb < 1) nb = 1;
    return D(round_up)((total + nb - 1) / nb, unit);
}

/* How many threads a GEMM takes (at least min_flops of work each, at most one per block of
 * C), and whether they split C's columns (*split_n = 1) or its rows, in mr x nr blocks. */
static int D(plan_threads)(int threads, int M, int N, int K, int mr, int nr, long long min_flops,
                           int *split_n)
{
    threads = dp_threads_for(threads, 2LL * M * N * K, min_flops);
    int nblocks = (N + nr - 1) / nr, mblocks = (M + mr - 1) / mr;
    *split_n = nblocks >= threads || nblocks >= mblocks;
    int units = *split_n ? nblocks : mblocks;
    if (threads > units) threads = units;
    return threads < 1 ? 1 : threads;
}

/* An operand read in place instead of packed where its panels are used at most this many
 * times (it was 2: the skinny shapes): the CNN's mid-sized GEMMs gained, 512^3 and larger
 * are packed either way; a 1024^3 read in place lost a fifth of its speed. */
#define IN_PLACE_REUSE 16

/* 1 where an operand's step between rows or between columns (the larger, in elements) is a
 * multiple of 4 KB: read in place, a panel's rows all land in a few sets of L1 and L2, so it
 * is packed. */
static int D(critical_stride)(ptrdiff_t rs, ptrdiff_t cs)
{
    ptrdiff_t step = (rs > cs ? rs : cs) * (ptrdiff_t)sizeof(T);
    return step % 4096 == 0;
}

/* Part t of n of C: its rows [*m0, *m1) and columns [*n0, *n1) (empty for a part past the
 * blocks). */
static void D(part_of)(const D(gemm_job) * job, int t, int n, int *m0, int *m1, int *n0, int *n1)
{
    *m0 = 0, *m1 = job->M, *n0 = 0, *n1 = job->N;
    if (job->split_n)
        D(part)(job->N, NR, t, n, n0, n1);
    else
        D(part)(job->M, MR, t, n, m0, m1);
}

/* The block [m0, m1) x [n0, n1) of C, packing into the buffers of `slot` (a thread's). */
static void D(gemm_block)(const D(gemm_job) * job, int slot, int m0, int m1, int n0, int n1)
{
    int M = m1 - m0, N = n1 - n0, kcb = job->kc;
    int mcb = D(balanced)(M, MC, MR);
    T *Ap = job->ctx->pack[2 * slot].ptr, *Bp = job->ctx->pack[2 * slot + 1].ptr;
    const T *A = job->A + (ptrdiff_t)m0 * job->rsa;
    const T *B = job->B + (ptrdiff_t)n0 * job->csb;
    T *C = job->C + (ptrdiff_t)m0 * job->ldc + n0;
    /* Packing pays when an operand is reused many times: A once per NR-column panel of B, B
     * once per MR-row panel of A. A skinny problem uses one of them (nearly) once (the output
     * layer's N = 10, its weight gradient's M = 10, K = 27 convs), and up to IN_PLACE_REUSE
     * uses the micro-kernel reads it where it is (from L2) for less than the copy costs,
     * unless its rows are a multiple of 4 KB apart (critical_stride). */
    int pack_a = N > 2 * NR && (N > IN_PLACE_REUSE * NR || D(critical_stride)(job->rsa, job->csa));
    int pack_b = !(job->csb == 1 &&
                   (M <= 2 * MR || (M <= IN_PLACE_REUSE * MR && !D(critical_stride)(job->rsb, 1))));
    /* bfloat16 inputs: both operands are packed, and rounded where they are packed (the
     * zero padding stays 0); the f64 build never sets job->bf16, so the casts never run */
    if (job->bf16) pack_a = pack_b = 1;
    /* and on the dot path, then paired (dp_gemm_dot_tmpl.h) */
    const dp_gemm_dot_fns *dot = job->bf16 ? job->impl.dot : NULL;
    for (int jc = 0; jc < N; jc += NC) {
        int nc = N - jc < NC ? N - jc : NC;
        for (int pc = 0; pc < job->K; pc += kcb) {
            int kc = job->K - pc < kcb ? job->K - pc : kcb;
            T beta = pc == 0 ? job->beta : (T)1;
            const T *Bpc = B + (ptrdiff_t)pc * job->rsb + (ptrdiff_t)jc * job->csb;
            const T *bsrc = Bp, *bedge = NULL;
            ptrdiff_t bks = NR, bpanel = (ptrdiff_t)NR * kc;
            if (pack_b && dot && job->csb == 1) {
                dot->pack_pair_b((float *)Bp, (const float *)Bpc, job->rsb, kc, nc);
            } else if (pack_b && dot && job->rsb == 1) {
                dot->tpack_pair_b((float *)Bp, (const float *)Bpc, job->csb, kc, nc);
            } else if (pack_b) {
                job->impl.pack_b(Bp, Bpc, job->rsb, job->csb, kc, nc);
                if (dot) /* rounds as it pairs */
                    dot->pair_b((float *)Bp, (nc + NR - 1) / NR, kc);
                else if (job->bf16)
                    job->impl.round_bf16((float *)Bp, (size_t)D(round_up)(nc, NR) * kc);
            } else {
                bsrc = Bpc;
                bks = job->rsb;
                bpanel = NR;
                if (nc % NR) {
                    int last = nc / NR * NR;
                    job->impl.pack_b(Bp, Bpc + last, job->rsb, job->csb, kc, nc - last);
                    bedge = Bp;
                }
            }
            for (int ic = 0; ic < M; ic += mcb) {
                int mc = M - ic < mcb ? M - ic : mcb;
                const T *Aic = A + (ptrdiff_t)ic * job->rsa + (ptrdiff_t)pc * job->csa;
                if (pack_a) {
                    if (dot && job->rsa == 1) {
                        dot->pack_pair_a((float *)Ap, (const float *)Aic, job->csa, mc, kc);
                    } else if (dot && job->csa == 1) {
                        dot->tpack_pair_a((float *)Ap, (const float *)Aic, job->rsa, mc, kc);
                    } else {
                        job->impl.pack_a(Ap, Aic, job->rsa, job->csa, mc, kc);
                        if (dot) /* rounds as it pairs */
                            dot->pair_a((float *)Ap, (mc + MR - 1) / MR, kc);
                        else if (job->bf16)
                            job->impl.round_bf16((float *)Ap, (size_t)D(round_up)(mc, MR) * kc);
                    }
                    if (dot) {
                        dot->macro((float *)(C + (ptrdiff_t)ic * job->ldc + jc), job->ldc,
                                   (const float *)Ap, (ptrdiff_t)MR * kc, (const float *)Bp,
                                   (ptrdiff_t)NR * kc, mc, nc, kc, (float)job->alpha, (float)beta);
                        continue;
                    }
                    job->impl.macro(C + (ptrdiff_t)ic * job->ldc + jc, job->ldc, Ap, 1, MR,
                                    (ptrdiff_t)MR * kc, bsrc, bks, bpanel, bedge, mc, nc, kc,
                                    job->alpha, beta);
                } else {
                    job->impl.macro(C + (ptrdiff_t)ic * job->ldc + jc, job->ldc, Aic, job->rsa,
                                    job->csa, (ptrdiff_t)MR * job->rsa, bsrc, bks, bpanel, bedge,
                                    mc, nc, kc, job->alpha, beta);
                }
            }
        }
    }
}

static void D(gemm_task)(void *arg, int t, int n)
{
    const D(gemm_job) *job = arg;
    int m0, m1, n0, n1;
    D(part_of)(job, t, n, &m0, &m1, &n0, &n1);
    if (m0 < m1 && n0 < n1) D(gemm_block)(job, t, m0, m1, n0, n1);
}

/* The packing buffers of `slot` for a block of M x N of C: mcb x kc of A, ncb x kc of B. */
static int D(block_scratch)(const D(gemm_job) * job, int slot, int M, int N)
{
    int mcb = D(balanced)(M > 0 ? M : 1, MC, MR);
    int ncb = D(round_up)(N < NC ? (N > 0 ? N : 1) : NC, NR);
    if (!dp_scratch_get(&job->ctx->pack[2 * slot], sizeof(T) * (size_t)mcb * job->kc) ||
        !dp_scratch_get(&job->ctx->pack[2 * slot + 1], sizeof(T) * (size_t)ncb * job->kc))
        return DP_ENOMEM;
    return DP_OK;
}

/* Part t's packing buffers (of `threads` parts). */
static int D(gemm_scratch)(const D(gemm_job) * job, int t, int threads)
{
    int m0, m1, n0, n1;
    D(part_of)(job, t, threads, &m0, &m1, &n0, &n1);
    return D(block_scratch)(job, t, m1 - m0, n1 - n0);
}

/* A matrix-vector product (N == 1 or M == 1) whose matrix has a unit stride, on the logistic
 * kernel's halves (dp_gemv_rows / dp_gemv_cols, dp_gemm.h): the blocked path packs the
 * matrix for a micro-tile that the vector fills 1 / NR of, a fraction of OpenBLAS's speed.
 * The vector is copied into scratch where it is strided, the result is written with alpha
 * and beta. Not one row times a transposed matrix of several columns (a dense layer's
 * forward on one sample, x w^T): that takes the blocked path, whose sums are the ones every
 * batch of more rows takes (each output's k in order), so that a sample's outputs are the
 * same bits whatever batch it is in (batch-invariant inference); these dot products would
 * reassociate them. (A row times B's rows, X^T v, stays here: a one-output layer's weight
 * gradient, not a forward.)
 * Returns GEMV_DECLINE where neither operand layout fits (then the blocked path runs). */
#define GEMV_DECLINE 1
/* Several threads split the rows of X v, or the columns of X^T v in whole units of 64 (the
 * last thread takes the columns past the last whole unit): every row's (column's) sum is
 * taken in the same order on any part of it that is at least one vector wide, so the bits
 * are the same on any number of threads. */
#define GEMV_ROWS_UNIT 16
#define GEMV_COLS_UNIT 64

typedef struct {
    T *out;
    const T *X;
    ptrdiff_t ldx;
    const T *v;
    int rows, len, by_rows;
} D(gemv_job);

static void D(gemv_task)(void *arg, int t, int n)
{
    const D(gemv_job) *job = arg;
    int lo, hi;
    if (job->by_rows) {
        D(part)(job->rows, GEMV_ROWS_UNIT, t, n, &lo, &hi);
        if (lo < hi)
            D(dp_gemv_rows)(job->out + lo, job->X + (ptrdiff_t)lo * job->ldx, job->ldx, job->v,
                            hi - lo, job->len);
    } else {
        D(part)(job->len / GEMV_COLS_UNIT * GEMV_COLS_UNIT, GEMV_COLS_UNIT, t, n, &lo, &hi);
        if (t == n - 1) hi = job->len;
        if (lo < hi)
            D(dp_gemv_cols)(job->out + lo, job->X + lo, job->ldx, job->v, job->rows, hi - lo);
    }
}

static int D(gemv)(dp_ctx *ctx, T *C, ptrdiff_t ldc, const T *A, ptrdiff_t rsa, ptrdiff_t csa,
                   const T *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K, T alpha, T beta)
{
    /* the matrix X (its rows contiguous, ldx apart), the vector v (K or the rows' count long,
     * stride vs) and whether out = X v (rows) or X^T v (cols); out has `len_out` values */
    const T *X, *v;
    ptrdiff_t ldx, vs;
    int rows, len, by_rows, len_out = M == 1 ? N : M;
    if (M == 1) { /* c (1, N) = a (1, K) B (K, N) */
        v = A, vs = csa;
        if (csb == 1)
            X = B, ldx = rsb, rows = K, len = N, by_rows = 0; /* B rows */
        else if (rsb == 1 && N == 1)
            X = B, ldx = csb, rows = N, len = K, by_rows = 1; /* B^T rows: one */
        else /* a dense layer's forward on one sample: see above */
            return GEMV_DECLINE;
    } else { /* c (M, 1) = A (M, K) b (K, 1) */
        v = B, vs = rsb;
        if (csa == 1)
            X = A, ldx = rsa, rows = M, len = K, by_rows = 1;
        else if (rsa == 1)
            X = A, ldx = csa, rows = K, len = M, by_rows = 0;
        else
            return GEMV_DECLINE;
    }
    T *out = dp_scratch_get(&ctx->ct, sizeof(T) * ((size_t)len_out + (vs != 1 ? (size_t)K : 0)));
    if (!out) return DP_ENOMEM;
    if (vs != 1) {
        T *vc = out + len_out;
        for (int k = 0; k < K; k++) vc[k] = v[(ptrdiff_t)k * vs];
        v = vc;
    }
    D(gemv_job) job = {out, X, ldx, v, rows, len, by_rows};
    /* threads: GEMM_THREAD_FLOPS each at least, and one unit of rows or columns */
    int units = by_rows ? (rows + GEMV_ROWS_UNIT - 1) / GEMV_ROWS_UNIT : len / GEMV_COLS_UNIT;
    int threads = dp_threads_for(ctx->threads, 2LL * rows * len, GEMM_THREAD_FLOPS);
    if (threads > units) threads = units;
    dp_threads_run(ctx->team, threads < 1 ? 1 : threads, D(gemv_task), &job);
    ptrdiff_t cs = M == 1 ? 1 : ldc; /* C's stride along the vector */
    for (int i = 0; i < len_out; i++) {
        T r = out[i] * alpha;
        if (beta != 0) r += C[(ptrdiff_t)i * cs] * beta;
        C[(ptrdiff_t)i * cs] = r;
    }
    return DP_OK;
}

/* C = beta C where no product is added (K = 0 or alpha = 0); beta 0 never reads C */
static void D(scale_c)(T *C, ptrdiff_t ldc, int M, int N, T beta)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(ptrdiff_t)i * ldc + j] = beta == 0 ? (T)0 : beta * C[(ptrdiff_t)i * ldc + j];
}

int D(dp_gemm)(dp_ctx *ctx, T *C, ptrdiff_t ldc, const T *A, ptrdiff_t rsa, ptrdiff_t csa,
               const T *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K, T alpha, T beta)
{
    // A is (M, K) via (rsa, csa), B is (K, N) via (rsb, csb), C is (M, N) with row stride ldc
    if (M <= 0 || N <= 0) return DP_OK;
    if (K <= 0 || alpha == 0) {
        D(scale_c)(C, ldc, M, N, beta);
        return DP_OK;
    }
    dp_ctx local;
    int own = 0;
    if (!ctx) ctx = dp_ctx_default();
    if (!ctx) {
        int rc = dp_ctx_init(&local, 1);
        if (rc) return rc;
        ctx = &local;
        own = 1;
    }
    int bf16 = ctx->bf16_inputs && sizeof(T) == sizeof(float);
    if (!bf16 && (M == 1 || N == 1)) {
        int rc = D(gemv)(ctx, C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, alpha, beta);
        if (rc != GEMV_DECLINE) {
            if (own) dp_ctx_free(&local);
            return rc;
        }
    }
    /* bfloat16 inputs on AMX's tiles where they run (dp_gemm_amx_tmpl.h; float only), for a
     * K of at least one whole 32-k chunk: with less, packing and storing C outweigh the
     * tiles' speed (a first conv layer's K = 27 was slower there than on the rounding path) */
    amx_gemm_fn amx = bf16 && K >= DP_GEMM_AMX_MIN_K ? amx_pick() : NULL;
    if (amx) {
        int rc = amx(ctx, (float *)C, ldc, (const float *)A, rsa, csa, (const float *)B, rsb, csb,
                     M, N, K, (float)alpha, (float)beta);
        if (own) dp_ctx_free(&local);
        return rc;
    }
    D(gemm_job)
    job = {ctx,  D(pick_impl_for)(bf16), C, ldc, A, B, rsa, csa, rsb, csb, M, N, K, alpha, beta, 1,
           bf16, D(balanced)(K, KC, 1)};
    int threads = D(plan_threads)(ctx->threads, M, N, K, job.impl.mr, job.impl.nr,
                                  GEMM_THREAD_FLOPS, &job.split_n);
    /* Scratch is sized in the caller so that no thread can fail. */
    for (int t = 0; t < threads; t++)
        if (D(gemm_scratch)(&job, t, threads)) {
            if (own) dp_ctx_free(&local);
            return DP_ENOMEM;
        }
    dp_threads_run(ctx->team, threads, D(gemm_task), &job);
    if (own) dp_ctx_free(&local);
    return DP_OK;
}

/* dp_gemm_part's cut along K, for an accumulation (alpha = beta = 1: the weight gradient,
 * whose K is the batch) whose C has too few blocks for n parts (a 256 x 784 weight's 25
 * column panels keep 16 threads 78 % busy, a 128-row one's 11 row panels 11 of 16 threads,
 * each packing the whole batch): the K slices of one thread's product (balanced(K, KC)) times
 * C's NR-column panels are the work items, dealt out in contiguous runs; each item's product
 * goes to the slice's own partial C (beta 0), and after a barrier every part adds the
 * partials of its rows of C in slice order. That is the one-thread sum, whose every slice
 * adds its product to C in turn, so the bits are those of one thread.
 * Returns the slices (0: no cut along K) where it cuts more evenly than the blocks, by 10 %
 * at least (the partials cost a pass over C per slice). */
static int D(ksplit_slices)(const D(gemm_impl) * impl, int M, int N, int K, T alpha, T beta, int n)
{
    if (n <= 1 || alpha != 1 || beta != 1 || M <= 1 || N <= 1) return 0;
    int kc = D(balanced)(K, KC, 1), slices = (K + kc - 1) / kc, split_n;
    if (slices < 2) return 0;
    int threads = D(plan_threads)(n, M, N, K, impl->mr, impl->nr, GEMM_THREAD_FLOPS, &split_n);
    if (threads < 2) return 0;
    /* the busiest part's share of the work, blocks against items (in 1/1000s) */
    long long blocks = split_n ? (N + impl->nr - 1) / impl->nr : (M + impl->mr - 1) / impl->mr;
    long long items = (long long)slices * ((N + impl->nr - 1) / impl->nr);
    long long busiest_blocks = 1000 * ((blocks + threads - 1) / threads) / blocks;
    long long busiest_items = 1000 * ((items + n - 1) / n) / items;
    return 10 * busiest_items < 9 * busiest_blocks ? slices : 0;
}

size_t D(dp_gemm_part_scratch)(int n, int M, int N, int K, T alpha, T beta)
{
    D(gemm_impl) impl = D(pick_impl_for)(0);
    return (size_t)D(ksplit_slices)(&impl, M, N, K, alpha, beta, n) * (size_t)M * (size_t)N;
}

int D(dp_gemm_part)(dp_ctx *ctx, T *partials, int t, int n, T *C, ptrdiff_t ldc, const T *A,
                    ptrdiff_t rsa, ptrdiff_t csa, const T *B, ptrdiff_t rsb, ptrdiff_t csb, int M,
                    int N, int K, T alpha, T beta)
{
    // part t of dp_gemm over the n parts of a region: every part calls it alike and computes
    // its own block of C, dp_gemm's on n threads (the same sums); the caller's barrier ends it
    if (n <= 1 || M <= 1 || N <= 1 || K <= 0 || alpha == 0 ||
        (ctx->bf16_inputs && sizeof(T) == sizeof(float)))
        /* the empty, matrix-vector and bfloat16 paths: whole on the first part */
        return t == 0 ? D(dp_gemm)(ctx, C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, alpha, beta)
                      : DP_OK;
    D(gemm_job)
    job = {ctx, D(pick_impl_for)(0),  C, ldc, A, B, rsa, csa, rsb, csb, M, N, K, alpha, beta, 1,
           0,   D(balanced)(K, KC, 1)};
    int slices = partials ? D(ksplit_slices)(&job.impl, M, N, K, alpha, beta, n) : 0;
    if (!slices) {
        int threads =
            D(plan_threads)(n, M, N, K, job.impl.mr, job.impl.nr, GEMM_THREAD_FLOPS, &job.split_n);
        if (t >= threads) return DP_OK;
        int rc = D(gemm_scratch)(&job, t, threads);
        if (rc == DP_OK) D(gemm_task)(&job, t, threads);
        return rc;
    }
    /* items: slice-major, then NR-column panels; this part's run [i0, i1) */
    int nr = job.impl.nr, panels = (N + nr - 1) / nr, kc = job.kc, rc = DP_OK, i0, i1;
    D(part)(slices * panels, 1, t, n, &i0, &i1);
    for (int i = i0; i < i1 && rc == DP_OK;) {
        int slice = i / panels, p0 = i % panels;
        int p1 = panels < p0 + (i1 - i) ? panels : p0 + (i1 - i);
        int pc = slice * kc, c0 = p0 * nr, c1 = p1 * nr < N ? p1 * nr : N;
        D(gemm_job)
        sub = job;
        sub.C = partials + (size_t)slice * M * N + c0;
        sub.ldc = N;
        sub.A = A + (ptrdiff_t)pc * csa;
        sub.B = B + (ptrdiff_t)pc * rsb + (ptrdiff_t)c0 * csb;
        sub.N = c1 - c0;
        sub.K = kc < K - pc ? kc : K - pc;
        sub.kc = sub.K;
        sub.beta = 0;
        rc = D(block_scratch)(&sub, t, M, sub.N);
        if (rc == DP_OK) D(gemm_block)(&sub, t, 0, M, 0, sub.N);
        i += p1 - p0;
    }
    dp_threads_barrier(ctx->team, n);
    int r0, r1;
    D(part)(M, 1, t, n, &r0, &r1);
    for (int slice = 0; slice < slices; slice++) {
        const T *P = partials + (size_t)slice * M * N;
        for (int r = r0; r < r1; r++) {
            T *c = C + (ptrdiff_t)r * ldc;
            const T *q = P + (ptrdiff_t)r * N;
            for (int j = 0; j < N; j++) c[j] += q[j];
        }
    }
    return rc;
}

int D(dp_gemm_patch)(dp_ctx *ctx, T *C, ptrdiff_t ldc, const T *x, const ptrdiff_t *aoff,
                     const ptrdiff_t *koff, const T *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N,
                     int K, T alpha, T beta)
{
    // C (M, N) = alpha A B + beta C on the calling thread, A (M, K) read in place: element
    // (i, k) at x[aoff[i] + koff[k]]
    if (M <= 0 || N <= 0) return DP_OK;
    if (K <= 0 || alpha == 0) {
        D(scale_c)(C, ldc, M, N, beta);
        return DP_OK;
    }
    if (!ctx) ctx = dp_ctx_default();
    if (!ctx) return DP_ENOMEM;
    D(gemm_impl) impl = D(pick_impl)();
    /* the blocking of dp_gemm on one thread: the same K slices, so the same sums */
    int mr = impl.mr, nr = impl.nr, kcb = D(balanced)(K, KC, 1), mcb = D(balanced)(M, MC, mr);
    T *Bp = dp_scratch_get(&ctx->pack[1],
                           sizeof(T) * (size_t)D(round_up)(N < NC ? N : NC, nr) * (size_t)kcb);
    if (!Bp) return DP_ENOMEM;
    for (int jc = 0; jc < N; jc += NC) {
        int nc = N - jc < NC ? N - jc : NC;
        for (int pc = 0; pc < K; pc += kcb) {
            int kc = K - pc < kcb ? K - pc : kcb;
            impl.pack_b(Bp, B + (ptrdiff_t)pc * rsb + (ptrdiff_t)jc * csb, rsb, csb, kc, nc);
            for (int ic = 0; ic < M; ic += mcb) {
                int mc = M - ic < mcb ? M - ic : mcb;
                impl.macro_patch(C + (ptrdiff_t)ic * ldc + jc, ldc, x, aoff + ic, koff + pc, Bp, mc,
                                 nc, kc, alpha, pc == 0 ? beta : (T)1);
            }
        }
    }
    return DP_OK;
}

void D(dp_gemm_naive)(T *C, ptrdiff_t ldc, const T *A, ptrdiff_t rsa, ptrdiff_t csa, const T *B,
                      ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K, T alpha, T beta)
{
    // A is (M, K), B is (K, N), C is (M, N); accumulates each dot product in T. As the fast
    // path and BLAS: alpha == 0 never reads A or B, beta == 0 never reads C
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            if (alpha == 0 || K <= 0) {
                T *c = &C[(ptrdiff_t)i * ldc + j];
                *c = beta == 0 ? (T)0 : beta * *c;
                continue;
            }
            T s = 0;
            for (int k = 0; k < K; k++)
                s += A[(ptrdiff_t)i * rsa + (ptrdiff_t)k * csa] *
                     B[(ptrdiff_t)k * rsb + (ptrdiff_t)j * csb];
            T *c = &C[(ptrdiff_t)i * ldc + j];
            *c = beta == 0 ? alpha * s : alpha * s + beta * *c;
        }
}

#undef GEMV_DECLINE
#undef GEMV_ROWS_UNIT
#undef GEMV_COLS_UNIT
#undef IN_PLACE_REUSE
#undef MR
#undef NR
#undef D
#undef ISA
#undef IMPL
