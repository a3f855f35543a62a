/*
 * libthp-always.so: a per-process "THP always" for hosts whose global THP mode is `madvise`.
 *
 *   LD_PRELOAD=workloads/bin/libthp-always.so GLIBC_TUNABLES=glibc.malloc.hugetlb=1 PROGRAM ...
 *
 * Interposes mmap/mmap64: every successful private anonymous mapping of at least 2 MiB that
 * the program maps itself is madvised MADV_HUGEPAGE before the program sees it, so under the
 * global mode `madvise` its faults get huge pages, as under `always`. glibc's own mappings
 * (malloc's brk heap, arenas and large chunks) do not go through this symbol: the tunable
 * glibc.malloc.hugetlb=1 madvises those. Together they cover all anonymous memory a
 * dynamically linked program allocates, and nothing global is changed. Not covered: thread
 * stacks (glibc maps them internally), mremap growth, statically linked programs, raw
 * syscall(SYS_mmap). Reservations mapped PROT_NONE and opened later with mprotect (as the
 * microbenchmarks, jemalloc or a JVM do) are madvised at mmap time too. Mappings under 2 MiB
 * are left alone (no huge page fits in them; a flag on them would only stop VMA merging).
 * Inherited by children through the environment.
 *
 * THP_ALWAYS_DEBUG=1 prints one line per madvised mapping on stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HUGE_SIZE (2UL << 20)

static int debug = -1;

static void advise(void *addr, size_t len, int flags)
{
	if (addr == MAP_FAILED || len < HUGE_SIZE)
		return;
	if (!(flags & MAP_ANONYMOUS) || (flags & (MAP_SHARED | MAP_HUGETLB)))
		return;
	if ((flags & MAP_TYPE) != MAP_PRIVATE)
		return;
	int saved = errno;
	int rc = madvise(addr, len, MADV_HUGEPAGE);
	if (debug < 0) {
		const char *d = getenv("THP_ALWAYS_DEBUG");
		debug = d && *d == '1';
	}
	if (debug)
		fprintf(stderr, "thp-always: madvise(%p, %zu, MADV_HUGEPAGE) = %d\n", addr, len, rc);
	errno = saved;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	/* syscall() returns -1 with errno set on failure, which is MAP_FAILED */
	void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	advise(p, len, flags);
	return p;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap(addr, len, prot, flags, fd, off);
}
