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

void dp_augment_draw(uint64_t seed, int64_t epoch, int64_t id, int pad, int *oy, int *ox,
                     int *flipped)
{
    uint64_t r = dp_mix64(dp_mix64(dp_mix64(seed) ^ (uint64_t)epoch) ^ (uint64_t)id);
    uint64_t span = 2 * (uint64_t)pad + 1;
    *oy = (int)((r & 0xffff) % span);
    *ox = (int)(((r >> 16) & 0xffff) % span);
    *flipped = (int)((r >> 32) & 1);
}

void dp_augment_images(void *dst, const void *src, const int64_t *ids, ptrdiff_t n, int C, int H,
                       int W, int itemsize, int pad, int flip, uint64_t seed, int64_t epoch)
{
    const size_t row = (size_t)C * H * W * itemsize, line = (size_t)W * itemsize;
    for (ptrdiff_t i = 0; i < n; i++) {
        int oy, ox, f;
        dp_augment_draw(seed, epoch, ids[i], pad, &oy, &ox, &f);
        f &= flip;
        const char *s = (const char *)src + (size_t)i * row;
        char *d = (char *)dst + (size_t)i * row;
        int dy = oy - pad, dx = ox - pad;
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++) {
                char *out = d + ((size_t)c * H + y) * line;
                int sy = y + dy;
                if (sy < 0 || sy >= H) {
                    memset(out, 0, line);
                    continue;
                }
                const char *in = s + ((size_t)c * H + sy) * line;
                if (!f) { /* the shifted line: a run of copied elements between zeros */
                    int x0 = dx < 0 ? -dx : 0, x1 = dx > 0 ? W - dx : W;
                    if (x1 < x0) x1 = x0;
                    memset(out, 0, (size_t)x0 * itemsize);
                    memcpy(out + (size_t)x0 * itemsize, in + (size_t)(x0 + dx) * itemsize,
                           (size_t)(x1 - x0) * itemsize);
                    memset(out + (size_t)x1 * itemsize, 0, (size_t)(W - x1) * itemsize);
                    continue;
                }
                /* mirrored: out[x] = in[W - 1 - x + dx], 0 outside; as integers of the
                 * element's width (a copy of its bits), a memcpy per element where neither */
                int x0 = dx > 0 ? dx : 0, x1 = dx < 0 ? W + dx : W; /* x with sx inside */
                if (x1 < x0) x1 = x0;
                memset(out, 0, (size_t)x0 * itemsize);
                memset(out + (size_t)x1 * itemsize, 0, (size_t)(W - x1) * itemsize);
                if (itemsize == 4) {
                    uint32_t *o = (uint32_t *)(void *)out;
                    const uint32_t *v = (const uint32_t *)(const void *)in;
                    for (int x = x0; x < x1; x++) o[x] = v[W - 1 - x + dx];
                } else if (itemsize == 8) {
                    uint64_t *o = (uint64_t *)(void *)out;
                    const uint64_t *v = (const uint64_t *)(const void *)in;
                    for (int x = x0; x < x1; x++) o[x] = v[W - 1 - x + dx];
                } else {
                    for (int x = x0; x < x1; x++)
                        memcpy(out + (size_t)x * itemsize, in + (size_t)(W - 1 - x + dx) * itemsize,
                               (size_t)itemsize);
                }
            }
    }
}

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
