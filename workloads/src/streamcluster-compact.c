/*
 * streamcluster-compact: streamcluster with the thesis's second scheme, compaction. The small,
 * very hot arrays (workloads-spec.md A.17: switch_membership, is_center, center_table and the
 * per-pgain work_mem) come from one 2 MiB arena backed by a single huge page, instead of from
 * separate malloc()s. Everything else is streamcluster.c unchanged, included below.
 *
 * Native needs 1.2 MB of these arrays at once, so one huge page holds them. If a request does not
 * fit (custom, larger arguments), or the arena cannot be mapped, the allocation falls back to
 * malloc with a one-line message on stderr; without huge pages the arena works on 4 KiB pages
 * (lib/arena.c says so on stderr).
 */
#define _GNU_SOURCE /* as streamcluster.c, whose own define comes after these includes */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "arena.h"

#define HOT_ALIGN 64 /* a cache line per array: no false sharing between them */

static struct arena hot_arena;
static int hot_arena_state; /* 0: not mapped yet, 1: mapped, -1: mapping failed */
static bool hot_overflow_reported;

/* The first call comes from the main thread before any worker exists, so the lazy setup needs
 * no lock; the arena itself is thread-safe. */
static void *hot_alloc(size_t size, bool zero)
{
	if (hot_arena_state == 0)
		hot_arena_state = arena_init(&hot_arena, ARENA_HUGE_PAGE_SIZE,
					     "streamcluster-compact") == 0 ? 1 : -1;
	if (hot_arena_state > 0) {
		void *ptr = zero ? arena_calloc(&hot_arena, size, HOT_ALIGN)
				 : arena_alloc(&hot_arena, size, HOT_ALIGN);
		if (ptr)
			return ptr;
		if (!hot_overflow_reported) {
			fprintf(stderr, "streamcluster-compact: %zu bytes do not fit in the arena's "
				"free space; taking them (and any later overflow) from malloc\n", size);
			hot_overflow_reported = true;
		}
	}
	return zero ? calloc(size, 1) : malloc(size);
}

static void hot_free(void *ptr)
{
	if (arena_owns(&hot_arena, ptr))
		arena_free(&hot_arena, ptr);
	else
		free(ptr);
}

#define SC_HOT_MALLOC(size) hot_alloc((size), false)
#define SC_HOT_CALLOC(count, size) hot_alloc((count) * (size), true)
#define SC_HOT_FREE(ptr) hot_free(ptr)

#include "streamcluster.c"
