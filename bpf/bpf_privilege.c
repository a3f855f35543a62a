// SPDX-License-Identifier: GPL-2.0-only
/* Explaining a refusal to load BPF programs. See bpf_privilege.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bpf_privilege.h"

#define CAP_SYS_ADMIN_BIT 21
#define CAP_PERFMON_BIT 38
#define CAP_BPF_BIT 39

/* CapEff bit test from /proc/self/status. */
static bool has_cap(int cap)
{
	unsigned long long eff = 0;
	char line[256];
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &eff) == 1)
			break;
	fclose(f);
	return eff & (1ULL << cap);
}

bool bpf_privilege_check(const char *tool, char *msg, size_t size)
{
	if (has_cap(CAP_SYS_ADMIN_BIT) || (has_cap(CAP_BPF_BIT) && has_cap(CAP_PERFMON_BIT)))
		return true;
	snprintf(msg, size, "BPF is not permitted: %s runs as uid %d without CAP_SYS_ADMIN (or "
		 "CAP_BPF and CAP_PERFMON), which loading tracing programs requires. "
		 "Run it as root (sudo).", tool, (int)geteuid());
	return false;
}

/* The active mode in /sys/kernel/security/lockdown ("none [integrity] confidentiality"). */
static const char *lockdown_mode(void)
{
	static char buf[128];
	FILE *f = fopen("/sys/kernel/security/lockdown", "r");
	char *open, *close;

	if (!f)
		return NULL;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	open = strchr(buf, '[');
	close = open ? strchr(open, ']') : NULL;
	if (!close)
		return NULL;
	*close = 0;
	return open + 1;
}

bool bpf_explain_refusal(const char *tool, int err, char *msg, size_t size)
{
	const char *lock = lockdown_mode();

	if (lock && strcmp(lock, "confidentiality") == 0) {
		snprintf(msg, size, "BPF is not permitted: kernel lockdown is in 'confidentiality' "
			 "mode, which forbids BPF programs that read kernel memory (%s). Boot "
			 "without lockdown=confidentiality to use %s.", strerror(err), tool);
		return true;
	}
	if (err == EPERM || err == EACCES) {
		snprintf(msg, size, "BPF is not permitted: the kernel refused to load %s's programs "
			 "(%s) although this process has the capabilities; a security module "
			 "(SELinux, AppArmor, BPF LSM) or a container seccomp policy may forbid "
			 "bpf(). Run with -v to see libbpf's log.", tool, strerror(err));
		return true;
	}
	return false;
}
