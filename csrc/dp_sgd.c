/* dp_sgd.c - instantiates dp_sgd_tmpl.h for float and double (see dp_sgd.h). */
#include "dp_sgd.h"

#define T float
#define S _f32
#include "dp_sgd_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_sgd_tmpl.h"
#undef S
#undef T
