/* dp_common.c - the aligned allocation and scratch-buffer helpers declared in dp_common.h. */
#include "dp_common.h"

#include <stdlib.h>

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
