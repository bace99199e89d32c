/* dp_act.c - instantiates dp_act_tmpl.h for float and double (see dp_act.h). */
#include "dp_act.h"

#define T float
#define S _f32
#include "dp_act_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_act_tmpl.h"
#undef S
#undef T
