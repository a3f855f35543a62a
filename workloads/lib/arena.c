/* arena: see arena.h. */
#define _GNU_SOURCE
#include "arena.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older libc headers lack it */
#endif

/* AnonHugePages (kB) of the mapping containing `addr`, from /proc/self/smaps; -1 if unknown. */
static long anon_huge_kb(const void *addr)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	if (!f)
		return -1;
	char line[512];
	bool in_vma = false;
	long kb = -1;
	while (fgets(line, sizeof(line), f)) {
		uintptr_t lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
			in_vma = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
			continue;
		}
		long v;
		if (in_vma && sscanf(line, "AnonHugePages: %ld kB", &v) == 1) {
			kb = v;
			break;
		}
	}
	fclose(f);
	return kb;
}

int arena_init(struct arena *a, size_t size, const char *who)
{
	memset(a, 0, sizeof(*a));
	size = (size + ARENA_HUGE_PAGE_SIZE - 1) & ~(ARENA_HUGE_PAGE_SIZE - 1);
	if (size == 0)
		size = ARENA_HUGE_PAGE_SIZE;

	/* Over-map by one huge page, then trim both ends to a 2 MiB boundary: mmap itself only
	 * promises 4 KiB alignment, and only an aligned 2 MiB range can be a PMD mapping. */
	size_t span = size + ARENA_HUGE_PAGE_SIZE;
	unsigned char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				  -1, 0);
	if (raw == MAP_FAILED) {
		int err = errno;
		fprintf(stderr, "%s: cannot map a %zu-byte arena: %s\n", who, size, strerror(err));
		errno = err;
		return -1;
	}
	uintptr_t start = ((uintptr_t)raw + ARENA_HUGE_PAGE_SIZE - 1) & ~(ARENA_HUGE_PAGE_SIZE - 1);
	size_t head = start - (uintptr_t)raw;
	if (head)
		munmap(raw, head);
	if (span - head - size)
		munmap((unsigned char *)start + size, span - head - size);
	a->base = (unsigned char *)start;
	a->size = size;
	pthread_mutex_init(&a->lock, NULL);

	/* MADV_HUGEPAGE makes the first write fault take a huge page under THP mode "madvise";
	 * MADV_COLLAPSE then covers the other modes (it works even under "never"). Collapse needs
	 * at least one resident page per 2 MiB, hence the write to every huge page first. */
	const char *why = NULL;
	int err = 0;
	if (madvise(a->base, size, MADV_HUGEPAGE)) {
		why = "MADV_HUGEPAGE";
		err = errno;
	}
	for (size_t off = 0; off < size; off += ARENA_HUGE_PAGE_SIZE)
		a->base[off] = 0;
	if (!why && madvise(a->base, size, MADV_COLLAPSE)) {
		why = "MADV_COLLAPSE";
		err = errno;
	}
	if (!why) {
		a->huge = true;
	} else {
		/* The fault alone may have given a huge page even if collapse is unsupported. */
		long kb = anon_huge_kb(a->base);
		a->huge = kb >= 0 && (size_t)kb * 1024 >= size;
		if (!a->huge)
			fprintf(stderr, "%s: no huge page for the %zu KiB arena (%s: %s); "
				"continuing on 4 KiB pages\n", who, size >> 10, why, strerror(err));
	}

	const char *report = getenv("ARENA_REPORT");
	if (report && *report)
		fprintf(stderr, "%s: arena start=%p end=%p huge=%d\n", who, (void *)a->base,
			(void *)(a->base + size), a->huge ? 1 : 0);
	return 0;
}

void *arena_alloc(struct arena *a, size_t size, size_t align)
{
	if (!a->base || align == 0 || (align & (align - 1)) || align > 4096)
		return NULL;
	void *ptr = NULL;
	pthread_mutex_lock(&a->lock);
	size_t start = (a->top + align - 1) & ~(align - 1);
	if (start <= a->size && size <= a->size - start) {
		a->last_prev_top = a->top;
		a->last_start = start;
		a->last_valid = true;
		a->top = start + size;
		a->live++;
		ptr = a->base + start;
	}
	pthread_mutex_unlock(&a->lock);
	return ptr;
}

void *arena_calloc(struct arena *a, size_t size, size_t align)
{
	void *ptr = arena_alloc(a, size, align);
	if (ptr)
		memset(ptr, 0, size);
	return ptr;
}

void arena_free(struct arena *a, void *ptr)
{
	if (!ptr || !arena_owns(a, ptr))
		return;
	pthread_mutex_lock(&a->lock);
	size_t off = (size_t)((unsigned char *)ptr - a->base);
	if (a->live > 0)
		a->live--;
	if (a->live == 0) {
		a->top = 0;
		a->last_valid = false;
	} else if (a->last_valid && off == a->last_start) {
		a->top = a->last_prev_top;
		a->last_valid = false;
	}
	pthread_mutex_unlock(&a->lock);
}

bool arena_owns(const struct arena *a, const void *ptr)
{
	const unsigned char *p = ptr;
	return a->base && p >= a->base && p < a->base + a->size;
}

void arena_destroy(struct arena *a)
{
	if (!a->base)
		return;
	munmap(a->base, a->size);
	pthread_mutex_destroy(&a->lock);
	memset(a, 0, sizeof(*a));
}
