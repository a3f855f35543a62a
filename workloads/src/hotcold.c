/*
 * hotcold: ground truth for "is the agent backing the right range with huge pages".
 *
 * Two separate 2 MiB-aligned anonymous mappings: a hot one, read at random cache lines by every
 * thread for the whole run, and a cold one, written once per 4 KiB page at start and never again.
 * Both ranges are printed as one JSON line on stdout before the hot loop starts; the throughput
 * follows as a second JSON line at the end (also on SIGINT/SIGTERM). Nothing here madvises:
 * which range gets huge pages is what the agent is being scored on.
 *
 * --sparse adds a third mapping touched one page per --stride, as a fragmented heap: a program
 * whose hot set gains from huge pages and whose idle heap THP "always" would inflate, so that one
 * run measures both what a policy keeps of THP's speed and what it saves of THP's memory.
 */
#include <stdatomic.h>

#include "microbench.h"

#define PROG "hotcold"
#define DEFAULT_HOT (64ULL << 20)
#define DEFAULT_COLD (256ULL << 20)
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
		"usage: hotcold [--hot SIZE] [--cold SIZE] [--sparse SIZE [--stride SIZE]]\n"
		"               [--threads N] [--seconds S]\n"
		"  Maps a hot and a cold region (separate anonymous mmaps, 2 MiB-aligned, no madvise),\n"
		"  writes every 4 KiB page of both once, then reads random 64-byte lines of the hot\n"
		"  region from N threads for S seconds (S = 0: until SIGINT/SIGTERM).\n"
		"  --hot SIZE     hot region size (default 64M); suffixes K, M, G (1024-based)\n"
		"  --cold SIZE    cold region size (default 256M)\n"
		"  --sparse SIZE  also map a sparse region of SIZE, of which only the first 4 KiB page\n"
		"                 of every STRIDE bytes is written once at start (default 0: none)\n"
		"  --stride SIZE  a multiple of 4K (default 64K: 1/16 of the sparse region resident)\n"
		"  --threads N    reader threads, 1..1024 (default 1)\n"
		"  --seconds S    run time in seconds, fractions allowed (default 10)\n"
		"stdout, one JSON object per line:\n"
		"  at start: {\"pid\":P,\"hot\":{\"start\":A,\"end\":B},\"cold\":{\"start\":C,\"end\":D}}\n"
		"            (decimal virtual addresses, end exclusive); with --sparse also\n"
		"            \"sparse\":{\"start\":E,\"end\":F,\"stride\":S,\"touched_pages\":T}\n"
		"  each second (S > 0): {\"progress\":{\"t\":T,\"ops\":N,\"cpu_s\":C}}\n"
		"  at end:   {\"ops\":N,\"seconds\":T,\"ops_per_s\":R,\"cpu_s\":C,\"stopped_by\":\"timeout\"|\"SIGTERM\"|\"SIGINT\"}\n"
		"            (T and C: wall and CPU seconds of the read phase, after the set-up)\n"
		"Exit status: 0 done, 1 runtime failure, 2 bad arguments.\n");
}


static void *reader(void *arg)
{
	struct worker *w = arg;
	uint64_t state = w->mb.seed, sum = 0;
	/* At least one batch per thread, so a run stopped before a thread was first scheduled
	 * (a loaded machine) still reports reads it really made rather than ops = 0. */
	do {
		sum += mb_read_random_lines(w->hot, w->lines, &state, BATCH);
		atomic_fetch_add_explicit(&w->mb.ops, BATCH, memory_order_relaxed);
	} while (!atomic_load_explicit(&stop, memory_order_relaxed));
	w->sink = sum;
	return NULL;
}

int main(int argc, char **argv)
{
	uint64_t hot_size = DEFAULT_HOT, cold_size = DEFAULT_COLD, sparse_size = 0;
	uint64_t stride = MB_SPARSE_STRIDE;
	long long threads = 1;
	double seconds = 10;
	const struct mb_arg args[] = {
		{ "hot", MB_ARG_SIZE, &hot_size, MB_LINE, 0, 0, "a size >= 64 (e.g. 64M)" },
		{ "cold", MB_ARG_SIZE, &cold_size, 1, 0, 0, "a size > 0 (e.g. 256M)" },
		{ "sparse", MB_ARG_SIZE, &sparse_size, 0, 0, 0, "a size >= 0 (e.g. 1G)" },
		{ "stride", MB_ARG_SIZE, &stride, 1, 0, MB_PAGE, "a multiple of 4K > 0 (e.g. 64K)" },
		{ "threads", MB_ARG_COUNT, &threads, 1, 1024, 0, "a number from 1 to 1024" },
		{ "seconds", MB_ARG_SECONDS, &seconds, 0, 0, 0, "a number of seconds >= 0" },
		{ 0 },
	};
	mb_parse_args(PROG, usage, argc, argv, args);

	sigset_t stopset;
	mb_block_stop_signals(&stopset);

	/* Hot first, then cold: two mmaps, so each is its own VMA and DAMON region candidate. */
	uint64_t *hot = mb_map_aligned(hot_size);
	unsigned char *cold = mb_map_aligned(cold_size);
	unsigned char *sparse = sparse_size ? mb_map_aligned(sparse_size) : NULL;
	if (!hot || !cold || (sparse_size && !sparse)) {
		fprintf(stderr, "hotcold: mmap of %" PRIu64 " + %" PRIu64 " + %" PRIu64
			" bytes failed: %s\n", hot_size, cold_size, sparse_size, strerror(errno));
		return 1;
	}
	if (sparse)
		mb_touch_sparse(sparse, sparse_size, stride, true);
	mb_touch_pages(cold, cold_size, 1);
	/* Writing the hot region makes its pages real: random reads of untouched anonymous memory
	 * would all hit the shared zero page and never become resident. */
	mb_touch_pages(hot, hot_size, 2);

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
		w[i].mb.seed = 0x5eed0000ULL + (uint64_t)i;
	}
	if (mb_start_workers(PROG, w, sizeof(*w), threads, reader, &stop))
		return 1;
	int sig = mb_wait_progress(&stopset, seconds, t0, w, sizeof(*w), threads);
	uint64_t ops = mb_stop_workers(w, sizeof(*w), threads, &stop);
	mb_print_ops_line("", ops, mb_now(CLOCK_MONOTONIC) - t0, sig);
	free(w);
	mb_unmap_aligned(hot, hot_size);
	mb_unmap_aligned(cold, cold_size);
	if (sparse)
		mb_unmap_aligned(sparse, sparse_size);
	return 0;
}
