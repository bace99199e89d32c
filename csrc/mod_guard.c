/* mod_guard.c - what ends a process with a line that says why, where Python cannot run:
 *
 * 1. A deadline (_exit_later): a C thread that ends the process with a line unless cancelled
 *    in time, around a blocking call that holds the GIL (MPI_Init waiting for a rank that
 *    never starts it: no Python thread or signal handler runs meanwhile).
 *
 * 2. Memory-mapped input files that shrink under a run: named, not a bare SIGBUS.
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
 *
 * 3. Ctrl-C in an MPI job (_exit_on_interrupt). A rank's SIGINT may find it blocked in C (a
 *    collective, the results' gather, MPI_Finalize) waiting for a rank that has already
 *    handled its own SIGINT in Python and left: MPICH's launcher then kills the blocked one
 *    (SIGKILL) and the job ends with 9, not 130. From the rank's start (comm.launch) a C
 *    handler ends each rank at once, wherever it is: the first rank of
 *    the node to get there (an abstract Unix socket's name, bound: the same election as
 *    comm.mpi.first_on_node's) writes the line, each tells its node's watcher "said" (a
 *    descriptor, or -1), then, with the node's other ranks, _exit(130).
 *
 *
 *    Under MPICH's launcher (Hydra), once every rank of the node is in the handler (each
 *    binds the next of a row of names; up to 2 s), each tells its proxy on the PMI socket
 *    that it finalized ("cmd=finalize", PMI-1's wire form; it waits up to a second for the
 *    ack). The proxy kills the node's other ranks (SIGKILL) when a rank's PMI socket
 *    closes without that message: whichever rank left first, the ones still on
 *    their way out died by SIGKILL and the job ended 9. Leaving at one instant made that
 *    rare, not impossible: a CI run beside compile jobs, 3 ranks on 2 cores, still ended 9.
 *    A SIGINT that reaches one rank alone (kill -INT) sends no finalize: the proxy's kill
 *    still ends the others, which would wait for that rank forever. (Nor does a rank alone
 *    on its node. If it alone is signalled, the other nodes' ranks are left waiting for
 *    it, as they were before the finalize: checked with two one-rank "nodes" on one host.)
 *    socket(2), bind(2), connect(2), close(2), fstat(2), send(2), write(2), poll(2),
 *    read(2), pause(2), clock_gettime(2), clock_nanosleep(2) and _exit(2) are
 *    async-signal-safe.
 */
#include "mod_common.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#endif

/* ------------------------------------------------------------------ a deadline */

/* One armed deadline: its own thread and memory (freed by the thread), so that a new one may
 * be set while a cancelled one's thread has not yet woken. */
typedef struct {
    struct timespec at;
    int cancel, code;
    size_t len;
    char text[768];
} dp_deadline;

static pthread_mutex_t deadline_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t deadline_cond = PTHREAD_COND_INITIALIZER;
static dp_deadline *deadline_now; /* the armed one, or NULL */

static void *deadline_thread(void *arg)
{
    dp_deadline *d = arg;
    pthread_mutex_lock(&deadline_lock);
    int rc = 0;
    while (!d->cancel && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&deadline_cond, &deadline_lock, &d->at);
    int fire = !d->cancel;
    if (deadline_now == d) deadline_now = NULL;
    pthread_mutex_unlock(&deadline_lock);
    if (fire) {
        ssize_t done = write(2, d->text, d->len);
        (void)done;
        _exit(d->code);
    }
    free(d);
    return NULL;
}

static PyObject *py_exit_later(PyObject *module, PyObject *args)
{
    (void)module;
    double seconds;
    const char *text;
    Py_ssize_t len;
    int code = 1;
    if (!PyArg_ParseTuple(args, "ds#|i:_exit_later", &seconds, &text, &len, &code)) return NULL;
    if (!(seconds > 0 && seconds < 1e9) || len < 0 || (size_t)len >= sizeof((dp_deadline *)0)->text)
        return PyErr_Format(
                   PyExc_ValueError,
                   "_exit_later needs seconds in (0, 1e9) and a text of at most 767 bytes"),
               NULL;
    dp_deadline *d = calloc(1, sizeof *d);
    if (!d) return PyErr_NoMemory();
    memcpy(d->text, text, (size_t)len);
    d->len = (size_t)len;
    d->code = code;
    clock_gettime(CLOCK_REALTIME, &d->at);
    double whole = (double)(long long)seconds;
    d->at.tv_sec += (time_t)whole;
    d->at.tv_nsec += (long)((seconds - whole) * 1e9);
    if (d->at.tv_nsec >= 1000000000L) d->at.tv_sec++, d->at.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&deadline_lock);
    if (deadline_now) {
        pthread_mutex_unlock(&deadline_lock);
        free(d);
        return PyErr_Format(PyExc_RuntimeError, "_exit_later: a deadline is already set"), NULL;
    }
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, deadline_thread, d);
    pthread_attr_destroy(&attr);
    if (rc == 0) deadline_now = d;
    pthread_mutex_unlock(&deadline_lock);
    if (rc != 0) {
        free(d);
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *py_exit_later_cancel(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    pthread_mutex_lock(&deadline_lock);
    if (deadline_now) {
        deadline_now->cancel = 1;
        deadline_now = NULL;
        pthread_cond_broadcast(&deadline_cond);
    }
    pthread_mutex_unlock(&deadline_lock);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ mapped input files */

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
static int bus_said; /* a watched fault's line is being written */
static int installed;

static void on_bus(int sig, siginfo_t *info, void *context)
{
    (void)context;
    uintptr_t at = (uintptr_t)info->si_addr;
    for (int i = 0; i < WATCHED_MAX; i++)
        if (watched[i].hi && at >= watched[i].lo && at < watched[i].hi) {
            /* one line per process: a second thread faulting at once waits for the first
             * one's _exit instead of cutting its line short */
            if (__atomic_exchange_n(&bus_said, 1, __ATOMIC_ACQ_REL))
                for (;;) pause();
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
    PyObject *str;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "O!U:watch_mapping", &PyArray_Type, &a, &str)) return NULL;
    const char *text = PyUnicode_AsUTF8AndSize(str, &len); /* a str only: its UTF-8 bytes */
    if (!text) return NULL;
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

/* ------------------------------------------------------------------ Ctrl-C, an MPI job's end */

#ifdef __linux__
static struct {
    char line[512];
    size_t len;
    struct sockaddr_un addr;
    socklen_t addrlen;
    int said_fd, pmi_fd, local_ranks;
} interrupt_end;

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void sleep_until_ns(long long ns)
{
    struct timespec at = {.tv_sec = (time_t)(ns / 1000000000LL),
                          .tv_nsec = (long)(ns % 1000000000LL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {}
}

/* The abstract name of the node's k-th rank to reach the handler: the election's own name
 * for the first (comm.mpi.first_on_node binds it too), NAME#k after. 0: it does not fit. */
static socklen_t arrival_name(int k, struct sockaddr_un *a)
{
    *a = interrupt_end.addr;
    size_t at = (size_t)interrupt_end.addrlen - offsetof(struct sockaddr_un, sun_path);
    char digits[12];
    int n = 0;
    if (k > 0) {
        do digits[n++] = (char)('0' + k % 10);
        while ((k /= 10) && n < 11);
        if (at + 1 + (size_t)n > sizeof a->sun_path) return 0;
        a->sun_path[at++] = '#';
        while (n) a->sun_path[at++] = digits[--n];
    }
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + at);
}

static void on_interrupt(int sig)
{
    (void)sig;
    /* Once per process: the handler blocks SIGINT in its own thread only, and a second
     * SIGINT taken by another thread (MPICH's and UCX's own threads do not block it) would
     * bind a second name of the row, so that the node looked whole with a rank missing. */
    static volatile int entered;
    if (__atomic_exchange_n(&entered, 1, __ATOMIC_SEQ_CST))
        for (;;) pause(); /* the first entry ends the process */
    int local = interrupt_end.local_ranks, arrival = -1;
    struct sockaddr_un a;
    /* Each rank binds the first free name of 0, 1, ... (local - 1) and keeps it until it
     * ends: 0 is the election's winner, and the last name bound means the whole node is here.
     * No rank ends before that (or 2 s), so none takes a name a leaver freed: the line
     * is written once, where a rank that left first had let a late one win again. */
    for (int k = 0; k < (local > 0 ? local : 1) && arrival < 0; k++) {
        socklen_t len = arrival_name(k, &a);
        int s = len ? socket(AF_UNIX, SOCK_DGRAM, 0) : -1;
        if (s < 0) break;
        if (bind(s, (const struct sockaddr *)&a, len) == 0)
            arrival = k;
        else
            close(s);
    }
    if (arrival == 0) {
        ssize_t done = write(2, interrupt_end.line, interrupt_end.len);
        (void)done;
    }
    if (interrupt_end.said_fd >= 0) {
        ssize_t done = write(interrupt_end.said_fd, "said\n", 5);
        (void)done;
    }
    int all_here = 0;
    socklen_t last = local > 0 && arrival >= 0 ? arrival_name(local - 1, &a) : 0;
    for (long long give_up = now_ns() + 2000000000LL; last;) {
        int probe = socket(AF_UNIX, SOCK_DGRAM, 0);
        if (probe < 0) break;
        all_here = connect(probe, (const struct sockaddr *)&a, last) == 0;
        close(probe);
        if (all_here || now_ns() > give_up) break;
        sleep_until_ns(now_ns() + 1000000LL);
    }
    /* Every rank of the node is leaving with 130: tell the proxy so. Where one is not (a
     * SIGINT sent to one rank alone), the proxy must still end the others, by its kill; a
     * node of one rank has no other to keep from it. The descriptor must still be a socket
     * (not one that a closed PMI connection's number went to). */
    struct stat st;
    if (all_here && local > 1 && interrupt_end.pmi_fd >= 0 &&
        fstat(interrupt_end.pmi_fd, &st) == 0 && S_ISSOCK(st.st_mode)) {
        static const char finalize[] = "cmd=finalize\n";
        if (send(interrupt_end.pmi_fd, finalize, sizeof finalize - 1, MSG_NOSIGNAL) ==
            (ssize_t)(sizeof finalize - 1)) {
            /* the ack: the proxy has read the message before this rank's socket closes */
            struct pollfd p = {.fd = interrupt_end.pmi_fd, .events = POLLIN};
            char ack[64];
            if (poll(&p, 1, 1000) == 1) {
                ssize_t got = read(interrupt_end.pmi_fd, ack, sizeof ack);
                (void)got;
            }
        }
    }
    /* The node's ranks leave at one instant: the first 100 ms mark of the shared monotonic
     * clock at least 50 ms away (their SIGINTs, forwarded one by one, arrive well within
     * that). Without the finalize, a rank that left first had MPICH's proxy kill (SIGKILL)
     * the ones still on their way out: 1 run in 60 here ended 9. */
    long long ns = now_ns(), step = 100000000LL;
    sleep_until_ns((ns + step / 2) / step * step + step);
    _exit(130);
}
#endif

static PyObject *py_exit_on_interrupt(PyObject *module, PyObject *args)
{
    (void)module;
    const char *line, *name;
    Py_ssize_t len, nlen;
    int said_fd, pmi_fd = -1, local_ranks = 0;
    if (!PyArg_ParseTuple(args, "y#y#i|ii:_exit_on_interrupt", &line, &len, &name, &nlen, &said_fd,
                          &pmi_fd, &local_ranks))
        return NULL;
#ifdef __linux__
    if ((size_t)len >= sizeof interrupt_end.line || nlen < 1 ||
        (size_t)nlen > sizeof interrupt_end.addr.sun_path)
        return PyErr_Format(PyExc_ValueError,
                            "_exit_on_interrupt needs a line of at most 511 bytes and a socket "
                            "name of 1 to %d bytes",
                            (int)sizeof interrupt_end.addr.sun_path),
               NULL;
    memcpy(interrupt_end.line, line, (size_t)len);
    interrupt_end.len = (size_t)len;
    memset(&interrupt_end.addr, 0, sizeof interrupt_end.addr);
    interrupt_end.addr.sun_family = AF_UNIX;
    memcpy(interrupt_end.addr.sun_path, name, (size_t)nlen);
    interrupt_end.addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)nlen);
    interrupt_end.said_fd = said_fd;
    interrupt_end.pmi_fd = pmi_fd;
    interrupt_end.local_ranks = local_ranks;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_TRUE;
#else
    (void)line, (void)name, (void)len, (void)nlen, (void)said_fd, (void)pmi_fd, (void)local_ranks;
    Py_RETURN_FALSE;
#endif
}

PyMethodDef mod_guard_functions[] = {
    {"_exit_on_interrupt", py_exit_on_interrupt, METH_VARARGS,
     "_exit_on_interrupt(line, name, said_fd, pmi_fd=-1, local_ranks=0) -> bool: from now on "
     "SIGINT ends the process at once with 130, in C wherever it is: the first process to bind "
     "the abstract Unix socket name writes line to stderr, each writes 'said' to said_fd (-1: "
     "none), waits up to 2 s for the node's local_ranks (0: unknown) and, where all came and "
     "pmi_fd >= 0, sends PMI-1's finalize to its launcher's proxy (MPICH's Hydra). False "
     "where there is no such handler (not Linux). Private: it ends the process that calls it, "
     "so it is tested by tests/test_faults.py, not by the fuzzer"},
    {"_exit_later", py_exit_later, METH_VARARGS,
     "_exit_later(seconds, text, code=1): unless _exit_later_cancel() is called within "
     "seconds, a C thread writes text to stderr and ends the process with code (it runs while "
     "a blocking call holds the GIL). Private: it ends the process that calls it, so hostile "
     "arguments are tested by tests/test_faults.py, not by the fuzzer"},
    {"_exit_later_cancel", py_exit_later_cancel, METH_NOARGS,
     "_exit_later_cancel(): the deadline _exit_later set no longer ends the process"},
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
