/* dp_common.c - the aligned allocation and scratch-buffer helpers declared in dp_common.h,
 * and the row gather that assembles a shuffled batch. */
#include "dp_common.h"

#include <stdlib.h>
#include <string.h>

void *dp_aligned_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = DP_ALIGN;
#if defined(_WIN32)
    p = _aligned_malloc(bytes, DP_ALIGN);
#else
    if (posix_memalign(&p, DP_ALIGN, bytes) != 0) p = NULL;
#endif
    return p;
}

void dp_aligned_free(void *p)
{
#if defined(_WIN32)
    _aligned_free(p);
#else
    free(p);
#endif
}

void *dp_scratch_get(dp_scratch *s, size_t bytes)
{
    if (bytes <= s->cap && s->ptr) return s->ptr;
    dp_aligned_free(s->ptr);
    s->ptr = dp_aligned_alloc(bytes);
    s->cap = s->ptr ? bytes : 0;
    return s->ptr;
}

void dp_scratch_free(dp_scratch *s)
{
    dp_aligned_free(s->ptr);
    s->ptr = NULL;
    s->cap = 0;
}

/* dp_gather_rows reads rows in a shuffled order: each is a miss to memory, one after the
 * other unless rows further on are prefetched. The rows GATHER_AHEAD further are (their first
 * GATHER_PF_BYTES: the hardware prefetcher follows a longer row), into L2 (locality 1: into
 * L1, prefetcht0, was barely faster than none). 32 rows ahead took most of the gain that 64
 * did; the rows of MNIST and CIFAR-10 gain too, less (bench/README.md, "Design
 * measurements"). */
#define GATHER_AHEAD 32
#define GATHER_PF_BYTES 4096

/* Prefetches the first min(len, GATHER_PF_BYTES) bytes from p */
static void gather_prefetch(const char *p, size_t len)
{ dp_prefetch_range(p, len < GATHER_PF_BYTES ? len : GATHER_PF_BYTES); }

void dp_gather_rows(void *dst, const void *src, const int64_t *ix, ptrdiff_t n, size_t row_bytes)
{
    const char *s = src;
    char *d = dst;
    if (row_bytes == 0) return;
    for (ptrdiff_t i = 0; i < n && i < GATHER_AHEAD; i++)
        gather_prefetch(s + (size_t)ix[i] * row_bytes, row_bytes);
    for (ptrdiff_t i = 0; i < n; i++) {
        if (i + GATHER_AHEAD < n)
            gather_prefetch(s + (size_t)ix[i + GATHER_AHEAD] * row_bytes, row_bytes);
        memcpy(d + (size_t)i * row_bytes, s + (size_t)ix[i] * row_bytes, row_bytes);
    }
}
