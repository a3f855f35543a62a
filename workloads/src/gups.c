/*
 * gups: random read-modify-write over one big table, the classic TLB-bound kernel.
 *
 * A table of 64-bit words in one 2 MiB-aligned anonymous mapping is filled once, then threads
 * XOR random words with random values, either for a fixed number of updates (the benchmark mode:
 * same work every run) or for a fixed time. Threads race on the table without locks, as in HPCC
 * RandomAccess; a lost update now and then does not change the memory behaviour.
 *
 * --hugepage makes the program madvise(MADV_HUGEPAGE) the table before filling it: with the host's
 * THP mode "madvise" that is how this one process gets huge pages without a global switch.
 *
 * --sparse adds a second mapping touched one page per --stride (a fragmented heap beside the
 * table), which THP "always" would back with whole huge pages: so one run shows what a policy keeps
 * of THP's speed on the table and what it saves of THP's memory on the heap.
 */
#include <stdatomic.h>

#include "microbench.h"

#define PROG "gups"
#define BATCH 1024

struct worker {
	struct mb_worker mb; /* mb.ops: updates done */
	uint64_t *table;
	uint64_t words;
	uint64_t quota; /* updates to do; 0 = until stopped */
	char pad[64];
};

static atomic_bool stop;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gups [--size SIZE] [--updates N | --seconds S] [--threads T] [--hugepage]\n"
		"            [--sparse SIZE [--stride SIZE]]\n"
		"  Random read-modify-write (XOR) of 64-bit words of a SIZE-byte table (one 2 MiB-aligned\n"
		"  anonymous mmap, filled once before timing starts).\n"
		"  --size SIZE   table size (default 1G); suffixes K, M, G (1024-based)\n"
		"  --updates N   do N updates in total, split over the threads (fixed work)\n"
		"  --seconds S   or run S seconds (default 10 when --updates is not given;\n"
		"                0 = until SIGINT/SIGTERM)\n"
		"  --threads T   updater threads, 1..1024 (default 1)\n"
		"  --hugepage    madvise(MADV_HUGEPAGE) the table before filling it (default: no madvise)\n"
		"  --sparse SIZE also map a sparse region of SIZE (never madvised), of which only the\n"
		"                first 4 KiB page of every STRIDE bytes is written once (default 0: none)\n"
		"  --stride SIZE a multiple of 4K (default 64K: 1/16 of the sparse region resident)\n"
		"stdout, one JSON object per line:\n"
		"  at start: {\"pid\":P,\"table\":{\"start\":A,\"end\":B}}   (decimal, end exclusive);\n"
		"            with --sparse also \"sparse\":{\"start\":E,\"end\":F,\"stride\":S,\"touched_pages\":T}\n"
		"  each second (--seconds S > 0): {\"progress\":{\"t\":T,\"ops\":N,\"cpu_s\":C}}\n"
		"  at end:   {\"size\":B,\"threads\":T,\"hugepage\":bool,\"updates\":N,\"seconds\":S,\"cpu_s\":C,\n"
		"             \"ns_per_update\":X,\"gups\":G,\"anon_huge_kb\":K,\"stopped_by\":...}\n"
		"  ns_per_update = wall time / total updates (all threads together); S and C: wall and\n"
		"  CPU seconds of the update phase (after the fill);\n"
		"  anon_huge_kb = AnonHugePages of the table's mapping at the end (null if unreadable).\n"
		"Exit status: 0 done, 1 runtime failure, 2 bad arguments.\n");
}

#define bad_args(...) mb_bad_args(PROG, usage, __VA_ARGS__)

static void *updater(void *arg)
{
	struct worker *w = arg;
	uint64_t state = w->mb.seed, n = 0;
	uint64_t *t = w->table;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		uint64_t batch = BATCH;
		if (w->quota && w->quota - n < batch)
			batch = w->quota - n;
		for (uint64_t i = 0; i < batch; i++) {
			uint64_t r = mb_rand(&state);
			t[(uint64_t)(((unsigned __int128)r * w->words) >> 64)] ^= r;
		}
		n += batch;
		atomic_store_explicit(&w->mb.ops, n, memory_order_relaxed);
		if (w->quota && n >= w->quota)
			break;
	}
	return NULL;
}

/* AnonHugePages (kB) of the mapping that starts at `start`, from /proc/self/smaps; -1 if absent. */
static long long anon_huge_kb(uintptr_t start)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	if (!f)
		return -1;
	char line[512];
	int in_vma = 0;
	long long kb = -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in_vma = (lo == start);
			continue;
		}
		if (in_vma && sscanf(line, "AnonHugePages: %lld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
}

int main(int argc, char **argv)
{
	uint64_t size = 1ULL << 30, sparse_size = 0, stride = MB_SPARSE_STRIDE;
	long long threads = 1, updates = -1;
	double seconds = -1;
	bool hugepage = false;
	const struct mb_arg args[] = {
		{ "size", MB_ARG_SIZE, &size, sizeof(uint64_t), 0, 0, "a size >= 8 (e.g. 2G)" },
		{ "updates", MB_ARG_COUNT, &updates, 1, 0, 0, "a count >= 1" },
		{ "seconds", MB_ARG_SECONDS, &seconds, 0, 0, 0, "a number of seconds >= 0" },
		{ "threads", MB_ARG_COUNT, &threads, 1, 1024, 0, "a number from 1 to 1024" },
		{ .name = "hugepage", .kind = MB_ARG_FLAG, .value = &hugepage },
		{ "sparse", MB_ARG_SIZE, &sparse_size, 0, 0, 0, "a size >= 0 (e.g. 1G)" },
		{ "stride", MB_ARG_SIZE, &stride, 1, 0, MB_PAGE, "a multiple of 4K > 0 (e.g. 64K)" },
		{ 0 },
	};
	mb_parse_args(PROG, usage, argc, argv, args);
	if (updates > 0 && seconds >= 0)
		bad_args("--updates and --seconds exclude each other");
	if (updates < 0 && seconds < 0)
		seconds = 10;

	sigset_t stopset;
	mb_block_stop_signals(&stopset);

	uint64_t words = size / sizeof(uint64_t);
	uint64_t *table = mb_map_aligned(size);
	if (!table) {
		fprintf(stderr, "gups: mmap of %" PRIu64 " bytes failed: %s\n", size, strerror(errno));
		return 1;
	}
	if (hugepage && madvise(table, (size + MB_PAGE - 1) & ~(MB_PAGE - 1), MADV_HUGEPAGE)) {
		fprintf(stderr, "gups: madvise(MADV_HUGEPAGE) failed: %s (THP not built in or set to "
			"'never'?); continuing on 4 KiB pages\n", strerror(errno));
		hugepage = false;
	}
	unsigned char *sparse = NULL;
	if (sparse_size) {
		sparse = mb_map_aligned(sparse_size);
		if (!sparse) {
			fprintf(stderr, "gups: mmap of %" PRIu64 " bytes failed: %s\n", sparse_size,
				strerror(errno));
			return 1;
		}
		mb_touch_sparse(sparse, sparse_size, stride, true);
	}
	for (uint64_t i = 0; i < words; i++)
		table[i] = i;

	char sparse_json[160];
	mb_sparse_json(sparse_json, sizeof(sparse_json), sparse, sparse_size, stride);
	printf("{\"pid\":%d,\"table\":{\"start\":%" PRIuPTR ",\"end\":%" PRIuPTR "}%s}\n",
	       (int)getpid(), (uintptr_t)table, (uintptr_t)table + (uintptr_t)size, sparse_json);
	fflush(stdout);

	struct worker *w = mb_alloc_workers(PROG, threads, sizeof(*w));
	if (!w)
		return 1;
	double t0 = mb_phase_start();
	for (long long i = 0; i < threads; i++) {
		w[i].table = table;
		w[i].words = words;
		if (updates > 0)
			w[i].quota = (uint64_t)updates / (uint64_t)threads +
				     ((uint64_t)i < (uint64_t)updates % (uint64_t)threads);
		w[i].mb.seed = 0x6a050000ULL + (uint64_t)i;
		w[i].mb.idle = updates > 0 && !w[i].quota;
	}
	if (mb_start_workers(PROG, w, sizeof(*w), threads, updater, &stop))
		return 1;
	int sig = 0;
	if (updates > 0) {
		/* Fixed work: the main thread only watches for a stop request until all are done. */
		while (mb_workers_ops(w, sizeof(*w), threads) < (uint64_t)updates)
			if ((sig = mb_wait_signal(&stopset, 0.01)))
				break;
	} else {
		sig = mb_wait_progress(&stopset, seconds, t0, w, sizeof(*w), threads);
	}
	uint64_t done = mb_stop_workers(w, sizeof(*w), threads, &stop);
	double elapsed = mb_now(CLOCK_MONOTONIC) - t0;
	double cpu_s = mb_phase_cpu();
	long long huge_kb = anon_huge_kb((uintptr_t)table);
	char huge_buf[32];
	if (huge_kb >= 0)
		snprintf(huge_buf, sizeof(huge_buf), "%lld", huge_kb);
	else
		snprintf(huge_buf, sizeof(huge_buf), "null");
	printf("{\"size\":%" PRIu64 ",\"threads\":%lld,\"hugepage\":%s,\"updates\":%" PRIu64
	       ",\"seconds\":%.6f,\"cpu_s\":%.4f,\"ns_per_update\":%.3f,\"gups\":%.6f,"
	       "\"anon_huge_kb\":%s,\"stopped_by\":\"%s\"}\n",
	       size, threads, hugepage ? "true" : "false", done, elapsed, cpu_s,
	       done ? elapsed * 1e9 / (double)done : 0.0, elapsed > 0 ? (double)done / elapsed / 1e9 : 0.0,
	       huge_buf,
	       mb_stopped_by(sig, updates > 0 ? "done" : "timeout"));
	fflush(stdout);
	free(w);
	mb_unmap_aligned(table, size);
	if (sparse)
		mb_unmap_aligned(sparse, sparse_size);
	return 0;
}
