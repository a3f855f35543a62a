/*
 * libthp-allow.so: lets a program that turns THP off for itself keep it on. Opt-in, one process
 * (and its children) at a time; nothing global changes.
 *
 *   LD_PRELOAD=workloads/bin/libthp-allow.so mariadbd ...
 *
 * MariaDB (10.11 in Debian 12, and no server option changes it) calls
 * prctl(PR_SET_THP_DISABLE, 1) at start-up, after which the kernel refuses every MADV_COLLAPSE
 * of the process (EINVAL) and `THP_enabled: 0` shows in /proc/PID/status. This shim interposes
 * prctl: PR_SET_THP_DISABLE with a non-zero argument returns 0 without reaching the kernel, so
 * the process's THP setting stays what it inherited; every other call goes to the kernel as is.
 * A flag set before exec (the experiment's thp-never arm sets it in the launcher) is inherited
 * and stays set: the shim only ignores the program's own request.
 *
 * Covers calls through glibc's prctl() (mariadbd imports it dynamically); not a raw
 * syscall(SYS_prctl) or a statically linked program. THP_ALLOW_DEBUG=1 prints one line on
 * stderr per ignored call.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int prctl(int option, ...)
{
	va_list ap;
	unsigned long a2, a3, a4, a5;

	va_start(ap, option);
	a2 = va_arg(ap, unsigned long);
	a3 = va_arg(ap, unsigned long);
	a4 = va_arg(ap, unsigned long);
	a5 = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == PR_SET_THP_DISABLE && a2 != 0) {
		const char *d = getenv("THP_ALLOW_DEBUG");

		if (d && *d == '1')
			fprintf(stderr, "thp-allow: ignored prctl(PR_SET_THP_DISABLE, %lu) of pid %d\n",
				a2, (int)getpid());
		return 0;
	}
	return (int)syscall(SYS_prctl, option, a2, a3, a4, a5);
}
