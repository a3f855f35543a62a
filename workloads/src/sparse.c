/*
 * sparse: ground truth for "what do huge pages cost on memory that is mostly empty".
 *
 * Three separate 2 MiB-aligned anonymous mappings: a hot one, read at random cache lines by every
 * thread for the whole run (as in hotcold); a dense cold one, written once per 4 KiB page at start
 * (as in hotcold); and a sparse one, in which only the first 4 KiB page of every --stride bytes
 * (64 KiB by default) is written once at start, the way an allocator's heap looks after most of
 * its objects were freed. On 4 KiB pages the sparse region costs 1/16 of its size; backed by
 * huge pages it costs all of it, since every 2 MiB holds a touched page (32 of them). That 16x
 * is the memory bloat that THP "always" brings and that damon-hp should avoid.
 *
 * Nothing is madvised unless --madvise-hugepage is given: then every region is
 * madvise(MADV_HUGEPAGE)d before it is touched, so that under the host's THP mode "madvise" this
 * one process faults huge pages as THP "always" would, without a global switch.
 *
 * --retouch-seconds S (default 0: never) makes the main thread read one byte of every touched
 * sparse page every S seconds, so the sparse region is not fully idle: the live objects left on
 * a fragmented heap are still used now and then.
 */

#include "microbench.h"

#define PROG "sparse"
#define DEFAULT_HOT (64ULL << 20)
#define DEFAULT_COLD (64ULL << 20)
#define DEFAULT_SPARSE (1ULL << 30)
#define BATCH 4096

struct worker {
	struct mb_worker mb;
	const uint64_t *hot;
	uint64_t lines;
	uint64_t sink;
	char pad[64];
};

static atomic_bool stop;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sparse [--hot SIZE] [--cold SIZE] [--sparse SIZE] [--stride SIZE]\n"
		"              [--retouch-seconds S] [--madvise-hugepage] [--threads N] [--seconds S]\n"
		"  Maps a hot, a cold and a sparse region (separate anonymous mmaps, 2 MiB-aligned),\n"
		"  writes every 4 KiB page of the hot and cold regions once and only the first 4 KiB\n"
		"  page of every STRIDE bytes of the sparse region, then reads random 64-byte lines of\n"
		"  the hot region from N threads for S seconds (S = 0: until SIGINT/SIGTERM).\n"
		"  --hot SIZE            hot region size (default 64M); suffixes K, M, G (1024-based)\n"
		"  --cold SIZE           dense cold region size (default 64M)\n"
		"  --sparse SIZE         sparse region size (default 1G)\n"
		"  --stride SIZE         one page is touched per STRIDE bytes of the sparse region,\n"
		"                        a multiple of 4K (default 64K: 1/16 of the region)\n"
		"  --retouch-seconds S   read every touched sparse page again every S seconds,\n"
		"                        fractions allowed (default 0: never)\n"
		"  --madvise-hugepage    madvise(MADV_HUGEPAGE) every region before touching it\n"
		"                        (default: no madvise)\n"
		"  --threads N           reader threads, 1..1024 (default 1)\n"
		"  --seconds S           run time in seconds, fractions allowed (default 10)\n"
		"stdout, one JSON object per line:\n"
		"  at start: {\"pid\":P,\"hot\":{\"start\":A,\"end\":B},\"cold\":{\"start\":C,\"end\":D},\n"
		"             \"sparse\":{\"start\":E,\"end\":F,\"stride\":S,\"touched_pages\":T}}\n"
		"            (decimal virtual addresses, end exclusive)\n"
		"  each second (S > 0, no --retouch-seconds): {\"progress\":{\"t\":T,\"ops\":N,\"cpu_s\":C}}\n"
		"  at end:   {\"retouches\":K,\"ops\":N,\"seconds\":T,\"ops_per_s\":R,\"cpu_s\":C,\n"
		"             \"stopped_by\":\"timeout\"|\"SIGTERM\"|\"SIGINT\"}\n"
		"            (T and C: wall and CPU seconds of the read phase, after the set-up)\n"
		"Exit status: 0 done, 1 runtime failure, 2 bad arguments.\n");
}


static void *reader(void *arg)
{
	struct worker *w = arg;
	uint64_t state = w->mb.seed, sum = 0;
	/* At least one batch per thread, as in hotcold: a loaded machine still reports real reads. */
	do {
		sum += mb_read_random_lines(w->hot, w->lines, &state, BATCH);
		atomic_fetch_add_explicit(&w->mb.ops, BATCH, memory_order_relaxed);
	} while (!atomic_load_explicit(&stop, memory_order_relaxed));
	w->sink = sum;
	return NULL;
}

/* Maps a region and, when asked, madvises it before anything touches it. */
static void *map_region(const char *name, uint64_t size, bool *hugepage)
{
	void *p = mb_map_aligned(size);
	if (!p) {
		fprintf(stderr, "sparse: mmap of the %s region (%" PRIu64 " bytes) failed: %s\n", name,
			size, strerror(errno));
		exit(1);
	}
	if (*hugepage && madvise(p, (size + MB_PAGE - 1) & ~(MB_PAGE - 1), MADV_HUGEPAGE)) {
		fprintf(stderr, "sparse: madvise(MADV_HUGEPAGE) failed: %s (THP not built in?); "
			"continuing on 4 KiB pages\n", strerror(errno));
		*hugepage = false;
	}
	return p;
}

int main(int argc, char **argv)
{
	uint64_t hot_size = DEFAULT_HOT, cold_size = DEFAULT_COLD, sparse_size = DEFAULT_SPARSE;
	uint64_t stride = MB_SPARSE_STRIDE;
	long long threads = 1;
	double seconds = 10, retouch_seconds = 0;
	bool hugepage = false;
	const struct mb_arg args[] = {
		{ "hot", MB_ARG_SIZE, &hot_size, MB_LINE, 0, 0, "a size >= 64 (e.g. 64M)" },
		{ "cold", MB_ARG_SIZE, &cold_size, 1, 0, 0, "a size > 0 (e.g. 64M)" },
		{ "sparse", MB_ARG_SIZE, &sparse_size, 1, 0, 0, "a size > 0 (e.g. 1G)" },
		{ "stride", MB_ARG_SIZE, &stride, 1, 0, MB_PAGE, "a multiple of 4K > 0 (e.g. 64K)" },
		{ "retouch-seconds", MB_ARG_SECONDS, &retouch_seconds, 0, 0, 0,
		  "a number of seconds >= 0" },
		{ .name = "madvise-hugepage", .kind = MB_ARG_FLAG, .value = &hugepage },
		{ "threads", MB_ARG_COUNT, &threads, 1, 1024, 0, "a number from 1 to 1024" },
		{ "seconds", MB_ARG_SECONDS, &seconds, 0, 0, 0, "a number of seconds >= 0" },
		{ 0 },
	};
	mb_parse_args(PROG, usage, argc, argv, args);

	sigset_t stopset;
	mb_block_stop_signals(&stopset);

	/* Three mmaps, so each is its own VMA and DAMON region candidate. */
	uint64_t *hot = map_region("hot", hot_size, &hugepage);
	unsigned char *cold = map_region("cold", cold_size, &hugepage);
	unsigned char *sparse = map_region("sparse", sparse_size, &hugepage);
	mb_touch_sparse(sparse, sparse_size, stride, true);
	mb_touch_pages(cold, cold_size, 2);
	/* Writing the hot region makes its pages real, as in hotcold (not the shared zero page). */
	mb_touch_pages(hot, hot_size, 3);

	char sparse_json[160];
	mb_sparse_json(sparse_json, sizeof(sparse_json), sparse, sparse_size, stride);
	printf("{\"pid\":%d,\"hot\":{\"start\":%" PRIuPTR ",\"end\":%" PRIuPTR "},"
	       "\"cold\":{\"start\":%" PRIuPTR ",\"end\":%" PRIuPTR "}%s}\n",
	       (int)getpid(), (uintptr_t)hot, (uintptr_t)hot + (uintptr_t)hot_size,
	       (uintptr_t)cold, (uintptr_t)cold + (uintptr_t)cold_size, sparse_json);
	fflush(stdout);

	struct worker *w = mb_alloc_workers(PROG, threads, sizeof(*w));
	if (!w)
		return 1;
	double t0 = mb_phase_start();
	for (long long i = 0; i < threads; i++) {
		w[i].hot = hot;
		w[i].lines = hot_size / MB_LINE;
		w[i].mb.seed = 0x59a20000ULL + (uint64_t)i;
	}
	if (mb_start_workers(PROG, w, sizeof(*w), threads, reader, &stop))
		return 1;

	/* The main thread waits for the end, re-reading the sparse pages on the way if asked. */
	int sig;
	uint64_t retouches = 0;
	if (retouch_seconds > 0) {
		double end = seconds > 0 ? t0 + seconds : 0;
		for (;;) {
			double wait = retouch_seconds;
			if (end) {
				double left = end - mb_now(CLOCK_MONOTONIC);
				if (left <= 0) {
					sig = 0;
					break;
				}
				if (left < wait)
					wait = left;
			}
			if ((sig = mb_wait_signal(&stopset, wait)))
				break;
			if (end && mb_now(CLOCK_MONOTONIC) >= end)
				break;
			mb_touch_sparse(sparse, sparse_size, stride, false);
			retouches++;
		}
	} else {
		sig = mb_wait_progress(&stopset, seconds, t0, w, sizeof(*w), threads);
	}
	uint64_t ops = mb_stop_workers(w, sizeof(*w), threads, &stop);
	char lead[48];
	snprintf(lead, sizeof(lead), "\"retouches\":%" PRIu64 ",", retouches);
	mb_print_ops_line(lead, ops, mb_now(CLOCK_MONOTONIC) - t0, sig);
	free(w);
	mb_unmap_aligned(hot, hot_size);
	mb_unmap_aligned(cold, cold_size);
	mb_unmap_aligned(sparse, sparse_size);
	return 0;
}
