/* mod_mapped.c - memory-mapped input files that shrink under a run: named, not a bare SIGBUS.
 *
 * A user's .npy is read through a memory map (a data set larger than RAM stays on disk). When
 * the file is truncated while the run reads it, the pages past its new end no longer exist
 * and the first read of one raises SIGBUS: the process dies without a word (on the thread
 * transport, every worker with it). watch_mapping registers an array that is such a map with
 * the line to print; a SIGBUS whose address lies in a registered array writes that line and
 * ends the process with DP_EXIT_TRUNCATED (a worker process's launcher names its rank and the
 * cause). A SIGBUS elsewhere is handed to the disposition found before (by default: death).
 *
 * The handler only reads the table and calls write(2) and _exit(2), which are
 * async-signal-safe. Registration happens before the workers read (the table grows in place;
 * unwatch_mapping clears an entry's range before its text).
 */
#include "mod_common.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#define DP_EXIT_TRUNCATED 74 /* sysexits.h's EX_IOERR */
#define WATCHED_MAX 32
#define WATCHED_TEXT 768

static struct {
    volatile uintptr_t lo, hi; /* [lo, hi): the array's bytes; hi == 0: a free entry */
    size_t len;
    int holders; /* the watch_mapping calls not yet undone (thread workers share an array) */
    char text[WATCHED_TEXT];
} watched[WATCHED_MAX];
static struct sigaction previous_bus;
static int installed;

static void on_bus(int sig, siginfo_t *info, void *context)
{
    (void)context;
    uintptr_t at = (uintptr_t)info->si_addr;
    for (int i = 0; i < WATCHED_MAX; i++)
        if (watched[i].hi && at >= watched[i].lo && at < watched[i].hi) {
            if (watched[i].len) {
                ssize_t done = write(2, watched[i].text, watched[i].len);
                (void)done;
            }
            _exit(DP_EXIT_TRUNCATED);
        }
    /* not a watched file: the disposition found before, for this fault and the next (the
     * instruction runs again on return and faults again, or the handler runs it now) */
    sigaction(SIGBUS, &previous_bus, NULL);
    if (previous_bus.sa_flags & SA_SIGINFO && previous_bus.sa_sigaction)
        previous_bus.sa_sigaction(sig, info, context);
    else if (previous_bus.sa_handler != SIG_DFL && previous_bus.sa_handler != SIG_IGN)
        previous_bus.sa_handler(sig);
}

static PyObject *py_watch_mapping(PyObject *module, PyObject *args)
{
    (void)module;
    PyArrayObject *a;
    const char *text;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "O!s#:watch_mapping", &PyArray_Type, &a, &text, &len)) return NULL;
    if (len < 0 || (size_t)len >= WATCHED_TEXT)
        return PyErr_Format(PyExc_ValueError, "the text must have 0 to %d bytes, got %zd",
                            WATCHED_TEXT - 1, len),
               NULL;
    uintptr_t lo = (uintptr_t)PyArray_DATA(a), hi = lo + (uintptr_t)PyArray_NBYTES(a);
    if (hi == lo) Py_RETURN_NONE; /* no byte to read, none to fault */
    int free_at = -1;
    for (int i = 0; i < WATCHED_MAX; i++) {
        if (watched[i].hi == hi && watched[i].lo == lo) {
            watched[i].holders++;
            return PyLong_FromLong(i);
        }
        if (!watched[i].hi && free_at < 0) free_at = i;
    }
    if (free_at < 0) Py_RETURN_NONE; /* full: that file's truncation stays a bare SIGBUS */
    memcpy(watched[free_at].text, text, (size_t)len);
    watched[free_at].len = (size_t)len;
    watched[free_at].holders = 1;
    watched[free_at].lo = lo;
    watched[free_at].hi = hi; /* last: the entry is whole before the handler may match it */
    if (!installed) {
        struct sigaction act;
        memset(&act, 0, sizeof act);
        act.sa_sigaction = on_bus;
        act.sa_flags = SA_SIGINFO;
        sigemptyset(&act.sa_mask);
        if (sigaction(SIGBUS, &act, &previous_bus) != 0) return PyErr_SetFromErrno(PyExc_OSError);
        installed = 1;
    }
    return PyLong_FromLong(free_at);
}

static PyObject *py_unwatch_mapping(PyObject *module, PyObject *arg)
{
    (void)module;
    long i = PyLong_AsLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= WATCHED_MAX)
        return PyErr_Format(PyExc_ValueError, "no watched mapping %ld", i), NULL;
    if (watched[i].holders > 0 && --watched[i].holders == 0) watched[i].hi = 0;
    Py_RETURN_NONE;
}

PyMethodDef mod_mapped_functions[] = {
    {"watch_mapping", py_watch_mapping, METH_VARARGS,
     "watch_mapping(array, text) -> int or None: a SIGBUS reading `array` (a view of a memory-"
     "mapped file) writes text to stderr (none: '') and ends the process with exit code 74 (the "
     "file "
     "was truncated under it); returns the entry to give unwatch_mapping (None: an empty "
     "array, or the table is full)"},
    {"unwatch_mapping", py_unwatch_mapping, METH_O,
     "unwatch_mapping(entry): undoes one watch_mapping of that entry (the last one frees it)"},
    {NULL},
};
