/*
 * arena: a bump allocator over one 2 MiB-aligned anonymous mapping that the kernel is asked to
 * back with transparent huge pages (MADV_HUGEPAGE, then MADV_COLLAPSE).
 *
 * Why: packing several small, very hot arrays into one huge page costs one TLB entry for all of
 * them, where separate malloc()s would spread them over many 4 KiB pages (the "compaction" scheme).
 *
 * Freeing: arena_free() gives space back only in two cases, which covers per-call scratch buffers
 * and per-phase array sets: the most recent allocation is freed (its space is reused by the next
 * allocation), or every live allocation has been freed (the arena starts over from its base).
 * Otherwise freed space stays unused until that happens.
 *
 * All functions are thread-safe. The mapping is never returned to the kernel before
 * arena_destroy(), so an arena's address range is stable for monitoring.
 */
#ifndef WORKLOADS_ARENA_H
#define WORKLOADS_ARENA_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#define ARENA_HUGE_PAGE_SIZE ((size_t)2 << 20)

struct arena {
	unsigned char *base;    /* 2 MiB-aligned start of the mapping (NULL: no arena) */
	size_t size;            /* bytes, a multiple of 2 MiB */
	size_t top;             /* offset of the first free byte */
	size_t last_start;      /* offset of the most recent live allocation... */
	size_t last_prev_top;   /* ...and `top` before it was made (for LIFO reuse) */
	bool last_valid;
	size_t live;            /* allocations not yet freed */
	bool huge;              /* true when MADV_COLLAPSE (or the first fault) gave huge pages */
	pthread_mutex_t lock;
};

/*
 * Maps `size` bytes (rounded up to 2 MiB) at a 2 MiB boundary and asks for huge pages. `who`
 * prefixes the one-line stderr message printed when huge pages cannot be had; the arena still
 * works then, on 4 KiB pages. With the environment variable ARENA_REPORT set (non-empty), one
 * line "<who>: arena start=0x... end=0x... huge=0|1" goes to stderr either way.
 * Returns 0, or -1 (errno set, message printed) if the mapping itself failed.
 */
int arena_init(struct arena *a, size_t size, const char *who);

/* `size` bytes aligned to `align` (a power of two, at most 4096); NULL when the arena is full. */
void *arena_alloc(struct arena *a, size_t size, size_t align);

/* arena_alloc() then zero the bytes (reused space is not zero). */
void *arena_calloc(struct arena *a, size_t size, size_t align);

/* See the note on freeing above. `ptr` must come from this arena (or be NULL). */
void arena_free(struct arena *a, void *ptr);

/* true if `ptr` lies inside the arena's mapping. */
bool arena_owns(const struct arena *a, const void *ptr);

void arena_destroy(struct arena *a);

#endif
