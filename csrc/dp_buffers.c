/* dp_buffers.c - instantiates dp_buffers_tmpl.h for float and double (see dp_buffers.h). */
#include "dp_buffers.h"
#include "dp_sync.h"

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
