/* test_watchdog.h - the time limit after which test_core / test_model call themselves hung.
 *
 * The default suits a native run. Under user-mode QEMU (check-aarch64) the same work takes
 * several times longer, and more when the test suite runs beside it at nice 10 on a 2-core
 * CI machine (a CI run hit test_core's 120 s there): the Makefile passes a longer limit in
 * DP_TEST_WATCHDOG_S rather than every run waiting that long for a real hang. */
#ifndef DP_TEST_WATCHDOG_H
#define DP_TEST_WATCHDOG_H

#include <stdio.h>
#include <stdlib.h>

static unsigned watchdog_seconds(unsigned fallback)
{
    const char *s = getenv("DP_TEST_WATCHDOG_S");
    if (!s || !*s) return fallback;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*end || v == 0 || v > 86400) {
        fprintf(stderr, "DP_TEST_WATCHDOG_S=%s: expected whole seconds in 1..86400\n", s);
        exit(2);
    }
    return (unsigned)v;
}

#endif
