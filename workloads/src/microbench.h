/* Shared helpers of the ground-truth microbenchmarks (hotcold, phases, gups, sparse).
 * Header-only so that each benchmark stays a single translation unit. */
#ifndef MICROBENCH_H
#define MICROBENCH_H

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MB_PAGE 4096UL
#define MB_HUGE (2UL << 20)
#define MB_LINE 64UL

/*
 * A bad command line: "<prog>: <message>" and the program's usage on stderr, then exit 2.
 * A program wraps it once: #define bad_args(...) mb_bad_args(PROG, usage, __VA_ARGS__)
 */
static inline __attribute__((noreturn, format(printf, 3, 4)))
void mb_bad_args(const char *prog, void (*usage)(FILE *), const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	usage(stderr);
	exit(2);
}

static inline double mb_now(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "64M", "1G", "4096", "512k": 1024-based suffixes, optional trailing "B"/"iB". 0 on error. */
static inline uint64_t mb_parse_size(const char *s)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return 0;
	unsigned shift = 0;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: break;
	}
	if (shift && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B'))
		end += 2;
	else if (*end == 'b' || *end == 'B')
		end++;
	if (*end)
		return 0;
	if (shift && v > (UINT64_MAX >> shift))
		return 0;
	return (uint64_t)v << shift;
}

/* Non-negative decimal integer; -1 on error. */
static inline long long mb_parse_count(const char *s)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return -1;
	long long v = strtoll(s, &end, 10);
	if (errno || *end || v < 0)
		return -1;
	return v;
}

/* Non-negative decimal number of seconds (fractions allowed); -1 on error. */
static inline double mb_parse_seconds(const char *s)
{
	char *end;
	errno = 0;
	if (!s || !*s)
		return -1;
	double v = strtod(s, &end);
	if (errno || *end || !(v >= 0) || v > 1e9)
		return -1;
	return v;
}

/*
 * The benchmarks' command lines, as tables: one entry per --option, the value it fills and the
 * range it accepts, so that every program rejects a bad value the same way and names what a
 * good one looks like ("--hot: '0' is not a size > 0 (e.g. 64M)").
 */
enum mb_arg_kind { MB_ARG_SIZE, MB_ARG_COUNT, MB_ARG_SECONDS, MB_ARG_FLAG };

struct mb_arg {
	const char *name;
	enum mb_arg_kind kind;
	void *value;      /* uint64_t *, long long *, double * or bool *, by kind */
	double min, max;  /* accepted range; max 0: no upper bound */
	uint64_t multiple; /* sizes only: must be a multiple of this (0: any) */
	const char *want; /* the end of "'X' is not ...": what a good value is */
};

static inline bool mb_arg_set(const struct mb_arg *a, const char *s)
{
	double v;
	switch (a->kind) {
	case MB_ARG_SIZE: {
		uint64_t size = mb_parse_size(s);
		if (!size || (a->multiple && size % a->multiple))
			return false;
		*(uint64_t *)a->value = size;
		v = (double)size;
		break;
	}
	case MB_ARG_COUNT:
		*(long long *)a->value = mb_parse_count(s);
		v = (double)*(long long *)a->value;
		break;
	case MB_ARG_SECONDS:
		v = *(double *)a->value = mb_parse_seconds(s);
		break;
	default:
		*(bool *)a->value = true;
		return true;
	}
	return v >= 0 && v >= a->min && (a->max == 0 || v <= a->max);
}

/*
 * Fills the values of `args` (ended by an entry without a name) from argv. --help prints the
 * usage on stdout and exits 0; an unknown option, a missing or bad value or a stray argument
 * exits 2 with the usage on stderr.
 */
static inline void mb_parse_args(const char *prog, void (*usage)(FILE *), int argc, char **argv,
				 const struct mb_arg *args)
{
	enum { HELP = 1, FIRST = 256 };
	size_t n = 0;
	while (args[n].name)
		n++;
	struct option *opts = calloc(n + 2, sizeof(*opts));
	if (!opts) {
		fprintf(stderr, "%s: out of memory\n", prog);
		exit(1);
	}
	for (size_t i = 0; i < n; i++)
		opts[i] = (struct option){ args[i].name,
			args[i].kind == MB_ARG_FLAG ? no_argument : required_argument, NULL,
			FIRST + (int)i };
	opts[n] = (struct option){ "help", no_argument, NULL, HELP };
	int opt;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (opt == HELP) {
			usage(stdout);
			exit(0);
		}
		if (opt < FIRST)
			mb_bad_args(prog, usage, "unknown or incomplete option '%s'", argv[optind - 1]);
		const struct mb_arg *a = &args[opt - FIRST];
		if (!mb_arg_set(a, optarg))
			mb_bad_args(prog, usage, "--%s: '%s' is not %s", a->name, optarg, a->want);
	}
	if (optind < argc)
		mb_bad_args(prog, usage, "unexpected argument '%s'", argv[optind]);
	free(opts);
}

/*
 * A private anonymous mapping of `size` bytes (rounded up to 4 KiB) starting on a 2 MiB boundary,
 * so that huge pages can back it, with a PROT_NONE guard page on each side. The guards keep the
 * kernel from merging it with a neighbouring anonymous mapping, so /proc/PID/maps shows exactly
 * this range as its own line. No madvise here: whether it gets huge pages is the caller's (or
 * the agent's) decision.
 */
static inline void *mb_map_aligned(uint64_t size)
{
	size = (size + MB_PAGE - 1) & ~(MB_PAGE - 1);
	uint64_t total = size + MB_HUGE + 2 * MB_PAGE;
	char *raw = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (raw == MAP_FAILED)
		return NULL;
	uintptr_t start = ((uintptr_t)raw + MB_PAGE + MB_HUGE - 1) & ~(MB_HUGE - 1);
	char *lo = (char *)start - MB_PAGE, *hi = (char *)start + size + MB_PAGE;
	if (lo > raw)
		munmap(raw, lo - raw);
	if (raw + total > hi)
		munmap(hi, raw + total - hi);
	if (mprotect((void *)start, size, PROT_READ | PROT_WRITE)) {
		munmap(lo, hi - lo);
		return NULL;
	}
	return (void *)start;
}

static inline void mb_unmap_aligned(void *p, uint64_t size)
{
	size = (size + MB_PAGE - 1) & ~(MB_PAGE - 1);
	munmap((char *)p - MB_PAGE, size + 2 * MB_PAGE);
}

/* Write one byte in every 4 KiB page so the whole range is resident (and not the zero page). */
static inline void mb_touch_pages(void *p, uint64_t size, unsigned char val)
{
	volatile unsigned char *c = p;
	for (uint64_t off = 0; off < size; off += MB_PAGE)
		c[off] = val;
}

/*
 * A heap after most of its objects were freed: one byte of the first 4 KiB page of every `stride`
 * bytes is written (or, on a retouch, read). On 4 KiB pages such a region costs size/stride pages;
 * on huge pages all of it, since every 2 MiB holds a touched page: the memory THP "always" wastes.
 */
#define MB_SPARSE_STRIDE (64ULL << 10)

static inline void mb_touch_sparse(void *p, uint64_t size, uint64_t stride, bool write)
{
	volatile unsigned char *c = p;
	for (uint64_t off = 0; off < size; off += stride) {
		if (write)
			c[off] = 1;
		else
			(void)c[off];
	}
}

/* The start line's "sparse" member, with the leading comma, or "" when there is no region. */
static inline void mb_sparse_json(char *buf, size_t len, const void *p, uint64_t size,
				  uint64_t stride)
{
	if (!size) {
		buf[0] = 0;
		return;
	}
	snprintf(buf, len, ",\"sparse\":{\"start\":%" PRIuPTR ",\"end\":%" PRIuPTR ",\"stride\":%"
		 PRIu64 ",\"touched_pages\":%" PRIu64 "}", (uintptr_t)p, (uintptr_t)p + (uintptr_t)size,
		 stride, (size + stride - 1) / stride);
}

/* splitmix64: one 64-bit state per thread, good enough to pick cache lines at random. */
static inline uint64_t mb_rand(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Uniform in [0, n) without a division. */
static inline uint64_t mb_below(uint64_t *state, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)mb_rand(state) * n) >> 64);
}

/* Reads the first word of `n` random 64-byte lines of a region of `lines` lines (the random-read
 * load of the hot-set benchmarks) and returns their sum, so the reads cannot be optimised away. */
static inline uint64_t mb_read_random_lines(const uint64_t *region, uint64_t lines,
					    uint64_t *state, int n)
{
	const uint64_t words_per_line = MB_LINE / sizeof(uint64_t);
	uint64_t sum = 0;
	for (int i = 0; i < n; i++)
		sum += region[mb_below(state, lines) * words_per_line];
	return sum;
}

/*
 * SIGINT/SIGTERM are blocked in every thread (call before creating threads) and collected by
 * the main thread with mb_wait_signal, so a stop request ends the run with its final line.
 */
static inline void mb_block_stop_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, set, NULL);
}

/* Wait up to `seconds` (0 = forever) for SIGINT/SIGTERM. Returns the signal, or 0 on timeout. */
static inline int mb_wait_signal(const sigset_t *set, double seconds)
{
	if (seconds <= 0) {
		int sig;
		while (sigwait(set, &sig))
			;
		return sig;
	}
	double deadline = mb_now(CLOCK_MONOTONIC) + seconds;
	for (;;) {
		double left = deadline - mb_now(CLOCK_MONOTONIC);
		if (left <= 0)
			return 0;
		struct timespec ts = { (time_t)left, (long)((left - (double)(time_t)left) * 1e9) };
		int sig = sigtimedwait(set, NULL, &ts);
		if (sig > 0)
			return sig;
		if (errno != EINTR && errno != EAGAIN)
			return 0;
	}
}

/*
 * Worker threads. A program's worker record begins with a struct mb_worker, and its workers are
 * one array of such records, `size` bytes apart (sizeof the program's record), which the helpers
 * below walk. Every worker polls the program's stop flag and counts its work in `ops`.
 */
struct mb_worker {
	pthread_t tid;
	uint64_t seed;        /* the worker's mb_rand state at start */
	_Atomic uint64_t ops; /* work done so far: written by the worker, summed by the main thread */
	bool idle;            /* set before mb_start_workers: this one has no work and is not started */
	bool started;
};

static inline struct mb_worker *mb_worker_at(void *records, size_t size, long long i)
{
	return (struct mb_worker *)((char *)records + (size_t)i * size);
}

/* `n` zeroed worker records of `size` bytes, or NULL with "<prog>: out of memory ..." on stderr. */
static inline void *mb_alloc_workers(const char *prog, long long n, size_t size)
{
	void *records = calloc((size_t)n, size);
	if (!records)
		fprintf(stderr, "%s: out of memory for %lld thread records\n", prog, n);
	return records;
}

/*
 * Runs fn(record) in a thread for each record not marked idle. If a thread cannot be created:
 * "<prog>: cannot start thread I: why" on stderr, *stop set, the started workers joined, and -1
 * returned (the caller exits 1). 0 when all started.
 */
static inline int mb_start_workers(const char *prog, void *records, size_t size, long long n,
				   void *(*fn)(void *), atomic_bool *stop)
{
	for (long long i = 0; i < n; i++) {
		struct mb_worker *w = mb_worker_at(records, size, i);
		if (w->idle)
			continue;
		int err = pthread_create(&w->tid, NULL, fn, w);
		if (err) {
			fprintf(stderr, "%s: cannot start thread %lld: %s\n", prog, i, strerror(err));
			atomic_store(stop, true);
			for (long long j = 0; j < i; j++) {
				struct mb_worker *v = mb_worker_at(records, size, j);
				if (v->started)
					pthread_join(v->tid, NULL);
			}
			return -1;
		}
		w->started = true;
	}
	return 0;
}

/* The work done so far by all workers together. */
static inline uint64_t mb_workers_ops(void *records, size_t size, long long n)
{
	uint64_t ops = 0;
	for (long long i = 0; i < n; i++)
		ops += atomic_load_explicit(&mb_worker_at(records, size, i)->ops, memory_order_relaxed);
	return ops;
}

/* Sets *stop, waits for every started worker to finish, and returns their total work. */
static inline uint64_t mb_stop_workers(void *records, size_t size, long long n, atomic_bool *stop)
{
	atomic_store(stop, true);
	uint64_t ops = 0;
	for (long long i = 0; i < n; i++) {
		struct mb_worker *w = mb_worker_at(records, size, i);
		if (w->started)
			pthread_join(w->tid, NULL);
		ops += atomic_load(&w->ops);
	}
	return ops;
}

/*
 * The measured phase: the process CPU time at its start (after the set-up's first touch), so the
 * final line and the progress lines report the CPU time of the phase alone. A THP policy's cost
 * differs most in the set-up (faulting in huge pages, direct compaction), which a per-operation
 * CPU figure over the whole process would mix into the speed it is meant to measure.
 */
static double mb_phase_cpu0 = -1;

/* Marks the start of the measured phase; returns its CLOCK_MONOTONIC time. */
static inline double mb_phase_start(void)
{
	mb_phase_cpu0 = mb_now(CLOCK_PROCESS_CPUTIME_ID);
	return mb_now(CLOCK_MONOTONIC);
}

/* CPU seconds of all threads since mb_phase_start (-1 before it). */
static inline double mb_phase_cpu(void)
{
	return mb_phase_cpu0 < 0 ? -1 : mb_now(CLOCK_PROCESS_CPUTIME_ID) - mb_phase_cpu0;
}

/*
 * Like mb_wait_signal, but prints one line a second while it waits,
 *   {"progress":{"t":T,"ops":N,"cpu_s":C}}   (T since t0, C since mb_phase_start)
 * so that a reader can tell the speed of a late part of the phase from that of the whole: a
 * policy that backs the hot set with huge pages only some seconds into the run is slow before
 * and fast after, and the average over the phase hides when. Only for a bounded run
 * (seconds > 0): an unbounded one under a reader that never drains stdout would block on it.
 */
static inline int mb_wait_progress(const sigset_t *set, double seconds, double t0,
				   void *records, size_t size, long long n)
{
	if (seconds <= 0)
		return mb_wait_signal(set, 0);
	double end = t0 + seconds;
	for (;;) {
		double wait = 1.0;
		double left = end - mb_now(CLOCK_MONOTONIC);
		if (left <= 0)
			return 0;
		if (left < wait)
			wait = left;
		int sig = mb_wait_signal(set, wait);
		if (sig)
			return sig;
		uint64_t ops = mb_workers_ops(records, size, n);
		printf("{\"progress\":{\"t\":%.3f,\"ops\":%" PRIu64 ",\"cpu_s\":%.4f}}\n",
		       mb_now(CLOCK_MONOTONIC) - t0, ops, mb_phase_cpu());
		fflush(stdout);
	}
}

/* What ended a run, for the final line's "stopped_by": the stop signal's name, or `otherwise`. */
static inline const char *mb_stopped_by(int sig, const char *otherwise)
{
	return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : otherwise;
}

/*
 * The final line of a timed run, flushed:
 *   {<lead>"ops":N,"seconds":T,"ops_per_s":R,["cpu_s":C,]"stopped_by":"timeout"|"SIGTERM"|"SIGINT"}
 * cpu_s (the measured phase's CPU time) only after mb_phase_start.
 * `lead` is "" or the program's own leading members, each followed by a comma.
 */
static inline void mb_print_ops_line(const char *lead, uint64_t ops, double elapsed, int sig)
{
	char cpu[40] = "";
	if (mb_phase_cpu0 >= 0)
		snprintf(cpu, sizeof(cpu), "\"cpu_s\":%.4f,", mb_phase_cpu());
	printf("{%s\"ops\":%" PRIu64 ",\"seconds\":%.6f,\"ops_per_s\":%.1f,%s\"stopped_by\":\"%s\"}\n",
	       lead, ops, elapsed, elapsed > 0 ? (double)ops / elapsed : 0.0, cpu,
	       mb_stopped_by(sig, "timeout"));
	fflush(stdout);
}

#endif
