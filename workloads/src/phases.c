/*
 * phases: ground truth for "does the agent follow a moving hot set".
 *
 * N equal regions, each its own 2 MiB-aligned anonymous mapping, all written once at start. The
 * run is a sequence of timed phases; in phase i every thread reads random cache lines of region
 * i mod N only, so the hot set jumps from region to region and the previous one goes cold. Each
 * phase's range and its start time are printed as a JSON line the moment the switch happens, so
 * a scorer can line DAMON's snapshots up against the truth. SIGUSR1 ends the current phase at
 * once, so a test can move the hot set when it has seen what it waits for, not on a timer. No
 * madvise here.
 *
 * --lazy writes each region only when the run first reaches it, and writes the regions no phase
 * reads (N > M) page by page together with the region of their index modulo M: their frames
 * then interleave in physical memory with a hot set's, and are faulted in at the same time,
 * which is the hard case for an access source that sees physical memory.
 */
#include <stdatomic.h>

#include "microbench.h"

#define PROG "phases"
#define BATCH 1024

struct worker {
	struct mb_worker mb;
	uint64_t sink;
	char pad[64];
};

static atomic_bool stop;
/* The region the workers read now; the main thread swaps it at each phase boundary. */
static _Atomic(const uint64_t *) current;
static uint64_t lines_per_region;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: phases [--regions N] [--region-size SIZE] [--phase-seconds S] [--phases M]\n"
		"              [--threads T] [--lazy]\n"
		"  Maps N regions (separate anonymous mmaps, 2 MiB-aligned, no madvise), writes every\n"
		"  4 KiB page of each once, then runs M phases of S seconds; in phase i, T threads read\n"
		"  random 64-byte lines of region i mod N only.\n"
		"  --regions N        number of regions, 1..4096 (default 4)\n"
		"  --region-size SIZE size of each region (default 64M); suffixes K, M, G (1024-based)\n"
		"  --phase-seconds S  length of a phase, fractions allowed, > 0 (default 5)\n"
		"  --phases M         number of phases (default N; 0 = cycle until SIGINT/SIGTERM)\n"
		"  --threads T        reader threads, 1..1024 (default 1)\n"
		"  --lazy             write each region when its first phase starts, not at start;\n"
		"                     a region no phase reads (N > M > 0) is written page by page\n"
		"                     together with region (its index mod M)\n"
		"  SIGUSR1 ends the current phase early; SIGINT/SIGTERM end the run.\n"
		"stdout, one JSON object per line:\n"
		"  at start:  {\"pid\":P,\"regions\":[{\"start\":A,\"end\":B},...]}\n"
		"  per phase: {\"phase\":I,\"region\":R,\"start\":A,\"end\":B,\"t_mono\":S,\"t_wall\":W}\n"
		"             (t_mono: CLOCK_MONOTONIC seconds, t_wall: CLOCK_REALTIME seconds since\n"
		"             the epoch, both taken when the workers are switched to the region)\n"
		"  at end:    {\"phases\":K,\"ops\":N,\"seconds\":T,\"ops_per_s\":R,\"stopped_by\":...}\n"
		"Addresses are decimal, end exclusive. Exit status: 0 done, 1 runtime failure,\n"
		"2 bad arguments.\n");
}


/* Write region r, and page by page with it every never-read region q (q >= nread, q mod nread ==
 * r), so that their frames come from the allocator in turn. */
static void write_with_companions(uint64_t **regions, long long nregions, long long nread,
				  long long r, uint64_t size)
{
	for (uint64_t off = 0; off < size; off += MB_PAGE) {
		((volatile unsigned char *)regions[r])[off] = (unsigned char)(r + 1);
		for (long long q = nread + r; nread > 0 && q < nregions; q += nread)
			((volatile unsigned char *)regions[q])[off] = (unsigned char)(q + 1);
	}
}

static void *reader(void *arg)
{
	struct worker *w = arg;
	uint64_t state = w->mb.seed, sum = 0;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		const uint64_t *region = atomic_load_explicit(&current, memory_order_acquire);
		sum += mb_read_random_lines(region, lines_per_region, &state, BATCH);
		atomic_fetch_add_explicit(&w->mb.ops, BATCH, memory_order_relaxed);
	}
	w->sink = sum;
	return NULL;
}

int main(int argc, char **argv)
{
	long long nregions = 4, nphases = -1, threads = 1;
	bool lazy = false;
	uint64_t region_size = 64ULL << 20;
	double phase_seconds = 5;
	const struct mb_arg args[] = {
		{ "regions", MB_ARG_COUNT, &nregions, 1, 4096, 0, "a number from 1 to 4096" },
		{ "region-size", MB_ARG_SIZE, &region_size, MB_LINE, 0, 0,
		  "a size >= 64 (e.g. 64M)" },
		{ "phase-seconds", MB_ARG_SECONDS, &phase_seconds, 1e-6, 0, 0,
		  "a number of seconds > 0" },
		{ "phases", MB_ARG_COUNT, &nphases, 0, 0, 0, "a count >= 0" },
		{ "threads", MB_ARG_COUNT, &threads, 1, 1024, 0, "a number from 1 to 1024" },
		{ .name = "lazy", .kind = MB_ARG_FLAG, .value = &lazy },
		{ 0 },
	};
	mb_parse_args(PROG, usage, argc, argv, args);
	if (nphases < 0)
		nphases = nregions;

	sigset_t stopset;
	mb_block_stop_signals(&stopset);
	/* Blocked before the workers start, so that only the main thread's sigtimedwait takes it. */
	sigaddset(&stopset, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &stopset, NULL);

	uint64_t **regions = calloc((size_t)nregions, sizeof(*regions));
	struct worker *w = calloc((size_t)threads, sizeof(*w));
	if (!regions || !w) {
		fprintf(stderr, "phases: out of memory for bookkeeping\n");
		return 1;
	}
	for (long long r = 0; r < nregions; r++) {
		regions[r] = mb_map_aligned(region_size);
		if (!regions[r]) {
			fprintf(stderr, "phases: mmap of region %lld (%" PRIu64 " bytes) failed: %s\n",
				r, region_size, strerror(errno));
			return 1;
		}
		if (!lazy)
			mb_touch_pages(regions[r], region_size, (unsigned char)(r + 1));
	}
	/* With --lazy: the regions a phase reads (all of them when phases cycle or outnumber them) */
	long long nread = nphases == 0 || nphases >= nregions ? nregions : nphases;
	char *written = calloc((size_t)nregions, 1);
	if (!written) {
		fprintf(stderr, "phases: out of memory for bookkeeping\n");
		return 1;
	}
	if (lazy) {
		write_with_companions(regions, nregions, nread, 0, region_size);
		written[0] = 1;
	}
	lines_per_region = region_size / MB_LINE;

	printf("{\"pid\":%d,\"regions\":[", (int)getpid());
	for (long long r = 0; r < nregions; r++)
		printf("%s{\"start\":%" PRIuPTR ",\"end\":%" PRIuPTR "}", r ? "," : "",
		       (uintptr_t)regions[r], (uintptr_t)regions[r] + (uintptr_t)region_size);
	printf("]}\n");
	fflush(stdout);

	atomic_store(&current, regions[0]);
	double t0 = mb_now(CLOCK_MONOTONIC);
	for (long long i = 0; i < threads; i++)
		w[i].mb.seed = 0x9a5e0000ULL + (uint64_t)i;
	if (mb_start_workers(PROG, w, sizeof(*w), threads, reader, &stop))
		return 1;

	int sig = 0;
	long long phase;
	for (phase = 0; nphases == 0 || phase < nphases; phase++) {
		long long r = phase % nregions;
		if (lazy && !written[r]) {
			write_with_companions(regions, nregions, nread, r, region_size);
			written[r] = 1;
		}
		atomic_store_explicit(&current, regions[r], memory_order_release);
		double mono = mb_now(CLOCK_MONOTONIC), wall = mb_now(CLOCK_REALTIME);
		printf("{\"phase\":%lld,\"region\":%lld,\"start\":%" PRIuPTR ",\"end\":%" PRIuPTR
		       ",\"t_mono\":%.6f,\"t_wall\":%.6f}\n",
		       phase, r, (uintptr_t)regions[r], (uintptr_t)regions[r] + (uintptr_t)region_size,
		       mono, wall);
		fflush(stdout);
		sig = mb_wait_signal(&stopset, phase_seconds);
		if (sig == SIGUSR1) {
			sig = 0;
			continue;
		}
		if (sig) {
			phase++;
			break;
		}
	}
	uint64_t ops = mb_stop_workers(w, sizeof(*w), threads, &stop);
	char lead[40];
	snprintf(lead, sizeof(lead), "\"phases\":%lld,", phase);
	mb_print_ops_line(lead, ops, mb_now(CLOCK_MONOTONIC) - t0, sig);
	for (long long r = 0; r < nregions; r++)
		mb_unmap_aligned(regions[r], region_size);
	free(regions);
	free(written);
	free(w);
	return 0;
}
