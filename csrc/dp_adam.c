/* dp_adam.c - instantiates dp_adam_tmpl.h for float and double (see dp_adam.h). */
#include "dp_adam.h"

#include <math.h>

#define T float
#define S _f32
#define SQRT sqrtf
#include "dp_adam_tmpl.h"
#undef SQRT
#undef S
#undef T

#define T double
#define S _f64
#define SQRT sqrt
#include "dp_adam_tmpl.h"
#undef SQRT
#undef S
#undef T
