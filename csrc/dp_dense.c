/* dp_dense.c - instantiates dp_dense_tmpl.h for float and double (see dp_dense.h). */
#include "dp_dense.h"

#include <string.h>

#define T float
#define S _f32
#include "dp_dense_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_dense_tmpl.h"
#undef S
#undef T
