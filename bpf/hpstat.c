// SPDX-License-Identifier: GPL-2.0-only
/*
 * hpstat: count what transparent huge pages do to a process (or the system):
 * user page faults, THP scans and collapses by status (khugepaged and
 * MADV_COLLAPSE), compaction and direct-reclaim stalls as log2 latency
 * histograms, TLB flushes by reason, madvise/process_madvise calls by advice.
 *
 * Prints one JSON object per line: a "start" line once every tracepoint is
 * attached, an "interval" line every -i seconds and a "summary" line at the end
 * (SIGINT, SIGTERM, -d elapsed, or the target exited). --table prints the same
 * for people.
 *
 * Exit codes: 0 ok, 1 runtime failure, 2 usage or environment problem (BPF not
 * permitted, no such process, tracefs unavailable).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <bpf/libbpf.h>
#include "hpstat.h"
#include "hpstat.skel.h"

#define EXIT_RUNTIME 1
#define EXIT_ENV 2

#define TRACEFS "/sys/kernel/tracing"
#define PID_FS_MAGIC 0x50494446
#define MAX_PROGS 32

static const char usage[] =
	"Usage: hpstat [-p PID] [-i SECONDS] [-d SECONDS] [--table] [-v]\n"
	"\n"
	"Count huge-page, page-fault, compaction, reclaim, TLB-flush and madvise events\n"
	"with BPF tracepoints, for one process and all its threads (-p) or system-wide.\n"
	"\n"
	"  -p, --pid PID         only events of this process (its threads included);\n"
	"                        THP scans/collapses and process_madvise calls count\n"
	"                        when they act on its memory, whoever performs them\n"
	"  -i, --interval SECS   print a record every SECS seconds (default 1)\n"
	"  -d, --duration SECS   stop after SECS seconds (default: until Ctrl-C,\n"
	"                        SIGTERM, or the target process exits)\n"
	"  -t, --table           human-readable tables instead of JSON lines\n"
	"  -v, --verbose         show libbpf's debug output (verifier log on failure)\n"
	"      --exit-with-parent  end (with the summary) when the parent process dies,\n"
	"                        for programs that run hpstat in the background\n"
	"  -h, --help            this text\n"
	"\n"
	"Output: JSON lines: {\"type\":\"start\",...} once attached, then\n"
	"{\"type\":\"interval\",...} per interval and {\"type\":\"summary\",...} at the end.\n"
	"Latency buckets: lo_us <= duration < hi_us.\n"
	"\n"
	"Exit codes: 0 ok, 1 runtime failure, 2 usage or environment error\n"
	"(BPF not permitted, no such process, tracefs unavailable).\n";

struct options {
	int pid;
	double interval_s;
	double duration_s;
	bool table;
	bool verbose;
	bool exit_with_parent;
};

/* Names for the kernel's enum values, read from the tracepoints' print formats so
 * they are right for the running kernel (the enums grow between versions). */
struct names {
	char *status[HP_MAX_STATUS];     /* huge_memory scan_result */
	char *compact[HP_MAX_STATUS];    /* compaction compact_result */
	char *tlb[HP_MAX_REASON];        /* tlb_flush_reason */
};

struct prog_state {
	const char *event;   /* "category/name" */
	bool attached;
};

static volatile sig_atomic_t stop_requested;
static bool verbose;

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static int print_libbpf(enum libbpf_print_level level, const char *fmt, va_list args)
{
	if (level == LIBBPF_DEBUG && !verbose)
		return 0;
	return vfprintf(stderr, fmt, args);
}

static void die_env(const char *fmt, ...)
{
	va_list ap;

	fputs("hpstat: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(EXIT_ENV);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static bool parse_seconds(const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || v < 0)
		return false;
	*out = v;
	return true;
}

static void parse_args(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
		{ "pid", required_argument, NULL, 'p' },
		{ "interval", required_argument, NULL, 'i' },
		{ "duration", required_argument, NULL, 'd' },
		{ "table", no_argument, NULL, 't' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ "exit-with-parent", no_argument, NULL, 'P' },
		{ NULL, 0, NULL, 0 },
	};
	char *end;
	long v;
	int c;

	o->pid = 0;
	o->interval_s = 1.0;
	o->duration_s = 0;
	o->table = false;
	o->verbose = false;
	o->exit_with_parent = false;
	while ((c = getopt_long(argc, argv, "p:i:d:tvh", longopts, NULL)) != -1) {
		switch (c) {
		case 'p':
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || *end || v <= 0 || v > 0x3fffffff)
				die_env("invalid PID '%s': expected a positive process id", optarg);
			o->pid = (int)v;
			break;
		case 'i':
			if (!parse_seconds(optarg, &o->interval_s) || o->interval_s < 0.01)
				die_env("invalid interval '%s': expected seconds >= 0.01", optarg);
			break;
		case 'd':
			if (!parse_seconds(optarg, &o->duration_s))
				die_env("invalid duration '%s': expected seconds >= 0", optarg);
			break;
		case 't':
			o->table = true;
			break;
		case 'v':
			o->verbose = true;
			break;
		case 'P':
			o->exit_with_parent = true;
			break;
		case 'h':
			fputs(usage, stdout);
			exit(0);
		default:
			fputs(usage, stderr);
			exit(EXIT_ENV);
		}
	}
	if (optind < argc)
		die_env("unexpected argument '%s' (see hpstat --help)", argv[optind]);
}

/* CapEff bit test from /proc/self/status, to explain a refusal before the kernel does. */
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

#define CAP_SYS_ADMIN_BIT 21
#define CAP_PERFMON_BIT 38
#define CAP_BPF_BIT 39

static void check_privileges(void)
{
	if (has_cap(CAP_SYS_ADMIN_BIT) || (has_cap(CAP_BPF_BIT) && has_cap(CAP_PERFMON_BIT)))
		return;
	die_env("BPF is not permitted: hpstat runs as uid %d without CAP_SYS_ADMIN (or "
		"CAP_BPF and CAP_PERFMON), which loading tracing programs requires. "
		"Run it as root (sudo).", (int)geteuid());
}

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

static void explain_load_failure(int err)
{
	const char *lock = lockdown_mode();

	if (lock && strcmp(lock, "confidentiality") == 0)
		die_env("BPF is not permitted: kernel lockdown is in 'confidentiality' mode, which "
			"forbids BPF programs that read kernel memory (%s). Boot without "
			"lockdown=confidentiality to use hpstat.", strerror(err));
	if (err == EPERM || err == EACCES)
		die_env("BPF is not permitted: the kernel refused to load hpstat's programs (%s) "
			"although this process has the capabilities; a security module (SELinux, "
			"AppArmor, BPF LSM) or a container seccomp policy may forbid bpf(). Run "
			"with -v to see libbpf's log.", strerror(err));
	fprintf(stderr, "hpstat: loading the BPF programs failed (%s); run with -v to see the "
		"verifier log\n", strerror(err));
	exit(EXIT_RUNTIME);
}

static void ensure_tracefs(void)
{
	if (access(TRACEFS "/events", R_OK | X_OK) == 0)
		return;
	if (mount("nodev", TRACEFS, "tracefs", 0, NULL) != 0)
		die_env("tracefs is not mounted at " TRACEFS " and mounting it failed (%s); "
			"mount it with: mount -t tracefs nodev " TRACEFS, strerror(errno));
}

static bool event_exists(const char *event)
{
	char path[256];

	snprintf(path, sizeof(path), TRACEFS "/events/%s/id", event);
	return access(path, R_OK) == 0;
}

/* "tp/cat/name" or "raw_tp/name" -> "cat/name" for the existence check. */
static const char *event_of_section(const char *sec)
{
	if (strncmp(sec, "tp/", 3) == 0)
		return sec + 3;
	if (strcmp(sec, "raw_tp/sched_switch") == 0)
		return "sched/sched_switch";
	return NULL;
}

static char *slurp(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return NULL;
	n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = 0;
	return buf;
}

static const char *skip_space(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n')
		p++;
	return p;
}

/* Fill names[] from `__print_symbolic(REC->field, {0, "failed"}, ...)` in an
 * event's format file; names become snake_case JSON keys. */
static void load_symbols(const char *event, const char *field, char **names, int nr)
{
	static char buf[65536];
	char path[256], key[64];
	const char *p, *q;
	char *end, *name;
	long v;

	snprintf(path, sizeof(path), TRACEFS "/events/%s/format", event);
	if (!slurp(path, buf, sizeof(buf)))
		return;
	snprintf(key, sizeof(key), "__print_symbolic(REC->%s,", field);
	p = strstr(buf, key);
	if (!p)
		return;
	p += strlen(key);
	for (;;) {
		p = skip_space(p);
		if (*p != '{')
			break;
		v = strtol(p + 1, &end, 0);
		p = skip_space(end);
		if (*p != ',')
			break;
		p = skip_space(p + 1);
		if (*p != '"')
			break;
		q = strchr(++p, '"');
		if (!q)
			break;
		if (v >= 0 && v < nr && !names[v]) {
			name = strndup(p, q - p);
			/* kernels differ in case ("local MM shootdown" vs "local mm shootdown") */
			for (char *c = name; *c; c++)
				*c = (*c == ' ' || *c == '-') ? '_' : tolower((unsigned char)*c);
			names[v] = name;
		}
		p = skip_space(q + 1);
		if (*p != '}')
			break;
		p = skip_space(p + 1);
		if (*p == ',')
			p++;
	}
}

static void fill_fallback(char **names, int nr, const char *prefix)
{
	char buf[48];

	for (int i = 0; i < nr; i++) {
		if (names[i])
			continue;
		snprintf(buf, sizeof(buf), "%s_%d", prefix, i);
		names[i] = strdup(buf);
	}
}

static void load_names(struct names *n)
{
	memset(n, 0, sizeof(*n));
	load_symbols("huge_memory/mm_collapse_huge_page", "status", n->status, HP_MAX_STATUS);
	load_symbols("huge_memory/mm_khugepaged_scan_pmd", "status", n->status, HP_MAX_STATUS);
	load_symbols("compaction/mm_compaction_end", "status", n->compact, HP_MAX_STATUS);
	load_symbols("tlb/tlb_flush", "reason", n->tlb, HP_MAX_REASON);
	fill_fallback(n->status, HP_MAX_STATUS, "status");
	fill_fallback(n->compact, HP_MAX_STATUS, "status");
	fill_fallback(n->tlb, HP_MAX_REASON, "reason");
}

/* MADV_* is user ABI: fixed numbers, so a table is right here. */
static const char *advice_name(int adv)
{
	static const struct { int v; const char *name; } tab[] = {
		{ 0, "MADV_NORMAL" }, { 1, "MADV_RANDOM" }, { 2, "MADV_SEQUENTIAL" },
		{ 3, "MADV_WILLNEED" }, { 4, "MADV_DONTNEED" }, { 8, "MADV_FREE" },
		{ 9, "MADV_REMOVE" }, { 10, "MADV_DONTFORK" }, { 11, "MADV_DOFORK" },
		{ 12, "MADV_MERGEABLE" }, { 13, "MADV_UNMERGEABLE" }, { 14, "MADV_HUGEPAGE" },
		{ 15, "MADV_NOHUGEPAGE" }, { 16, "MADV_DONTDUMP" }, { 17, "MADV_DODUMP" },
		{ 18, "MADV_WIPEONFORK" }, { 19, "MADV_KEEPONFORK" }, { 20, "MADV_COLD" },
		{ 21, "MADV_PAGEOUT" }, { 22, "MADV_POPULATE_READ" }, { 23, "MADV_POPULATE_WRITE" },
		{ 24, "MADV_DONTNEED_LOCKED" }, { 25, "MADV_COLLAPSE" }, { 100, "MADV_HWPOISON" },
		{ 101, "MADV_SOFT_OFFLINE" }, { 102, "MADV_GUARD_INSTALL" },
		{ 103, "MADV_GUARD_REMOVE" },
	};
	static char other[32];

	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
		if (tab[i].v == adv)
			return tab[i].name;
	if (adv == HP_MAX_ADVICE - 1)
		return "other";
	snprintf(other, sizeof(other), "advice_%d", adv);
	return other;
}

static const char *const source_names[HP_NR_SRC] = { "khugepaged", "madv_collapse" };
static const char *const compact_names[HP_NR_COMPACT] = { "direct", "kthread" };

/* ---- JSON output ---- */

static void json_counts(const char *key, const unsigned long long *cur,
			const unsigned long long *prev, int nr, char **names,
			const char *(*name_of)(int))
{
	bool first = true;

	printf("\"%s\":{", key);
	for (int i = 0; i < nr; i++) {
		unsigned long long d = cur[i] - prev[i];

		if (!d)
			continue;
		printf("%s\"%s\":%llu", first ? "" : ",", names ? names[i] : name_of(i), d);
		first = false;
	}
	printf("}");
}

static void json_hist(const char *key, const struct hp_hist *cur, const struct hp_hist *prev)
{
	bool first = true;

	printf("\"%s\":{\"count\":%llu,\"total_us\":%.3f,\"buckets\":[", key,
	       cur->count - prev->count, (cur->total_ns - prev->total_ns) / 1000.0);
	for (int i = 0; i < HP_HIST_SLOTS; i++) {
		unsigned long long d = cur->slots[i] - prev->slots[i];

		if (!d)
			continue;
		printf("%s{\"lo_us\":%llu,\"hi_us\":%llu,\"count\":%llu}", first ? "" : ",",
		       i ? 1ULL << i : 0ULL, 1ULL << (i + 1), d);
		first = false;
	}
	printf("]}");
}

static unsigned long long sum(const unsigned long long *v, int nr)
{
	unsigned long long s = 0;

	for (int i = 0; i < nr; i++)
		s += v[i];
	return s;
}

static void print_json(const char *type, const struct options *o, const struct names *n,
		       const struct hp_stats *cur, const struct hp_stats *prev,
		       double elapsed_s, double span_s, bool target_exited)
{
	unsigned long long scans;

	printf("{\"type\":\"%s\",\"pid\":", type);
	if (o->pid)
		printf("%d", o->pid);
	else
		printf("null");
	printf(",\"elapsed_s\":%.3f,\"span_s\":%.3f,", elapsed_s, span_s);
	printf("\"page_faults_user\":%llu,", cur->page_faults_user - prev->page_faults_user);
	scans = sum(cur->scan_pmd[HP_SRC_KHUGEPAGED], HP_MAX_STATUS) -
		sum(prev->scan_pmd[HP_SRC_KHUGEPAGED], HP_MAX_STATUS) +
		sum(cur->scan_file[HP_SRC_KHUGEPAGED], HP_MAX_STATUS) -
		sum(prev->scan_file[HP_SRC_KHUGEPAGED], HP_MAX_STATUS);
	printf("\"khugepaged_scans\":%llu,\"thp\":{", scans);
	for (int s = 0; s < HP_NR_SRC; s++) {
		printf("%s\"%s\":{", s ? "," : "", source_names[s]);
		json_counts("scan_pmd", cur->scan_pmd[s], prev->scan_pmd[s], HP_MAX_STATUS,
			    (char **)n->status, NULL);
		putchar(',');
		json_counts("collapse", cur->collapse[s], prev->collapse[s], HP_MAX_STATUS,
			    (char **)n->status, NULL);
		putchar(',');
		json_counts("scan_file", cur->scan_file[s], prev->scan_file[s], HP_MAX_STATUS,
			    (char **)n->status, NULL);
		putchar(',');
		json_counts("collapse_file", cur->collapse_file[s], prev->collapse_file[s],
			    HP_MAX_STATUS, (char **)n->status, NULL);
		putchar('}');
	}
	printf("},\"compaction\":{");
	for (int k = 0; k < HP_NR_COMPACT; k++) {
		json_hist(compact_names[k], &cur->compaction[k], &prev->compaction[k]);
		putchar(',');
	}
	json_counts("result", cur->compaction_result, prev->compaction_result, HP_MAX_STATUS,
		    (char **)n->compact, NULL);
	printf("},\"direct_reclaim\":{");
	json_hist("stalls", &cur->direct_reclaim, &prev->direct_reclaim);
	printf(",\"pages_reclaimed\":%llu},",
	       cur->direct_reclaim_pages - prev->direct_reclaim_pages);
	json_counts("tlb_flush", cur->tlb_flush, prev->tlb_flush, HP_MAX_REASON,
		    (char **)n->tlb, NULL);
	putchar(',');
	json_counts("madvise", cur->madvise, prev->madvise, HP_MAX_ADVICE, NULL, advice_name);
	putchar(',');
	json_counts("process_madvise", cur->process_madvise, prev->process_madvise,
		    HP_MAX_ADVICE, NULL, advice_name);
	printf(",\"unmatched_end\":%llu", cur->unmatched_end - prev->unmatched_end);
	if (strcmp(type, "summary") == 0)
		printf(",\"target_exited\":%s", target_exited ? "true" : "false");
	printf("}\n");
}

/* ---- table output ---- */

static void table_counts(const char *label, const unsigned long long *cur,
			 const unsigned long long *prev, int nr, char **names,
			 const char *(*name_of)(int))
{
	bool any = false;

	for (int i = 0; i < nr; i++) {
		unsigned long long d = cur[i] - prev[i];

		if (!d)
			continue;
		if (!any)
			printf("  %-34s", label);
		printf("%s%s %llu", any ? ", " : "", names ? names[i] : name_of(i), d);
		any = true;
	}
	if (any)
		putchar('\n');
}

static void table_hist(const char *label, const struct hp_hist *cur, const struct hp_hist *prev,
		       bool bars)
{
	unsigned long long count = cur->count - prev->count, max = 0;

	if (!count)
		return;
	printf("  %-34s%llu, total %.3f ms, mean %.1f us\n", label, count,
	       (cur->total_ns - prev->total_ns) / 1e6,
	       (cur->total_ns - prev->total_ns) / 1e3 / count);
	if (!bars)
		return;
	for (int i = 0; i < HP_HIST_SLOTS; i++)
		if (cur->slots[i] - prev->slots[i] > max)
			max = cur->slots[i] - prev->slots[i];
	for (int i = 0; i < HP_HIST_SLOTS; i++) {
		unsigned long long d = cur->slots[i] - prev->slots[i];
		int width = (int)(d * 30 / max);

		if (!d)
			continue;
		printf("      %10llu .. %-10llu us : %-8llu |%.*s|\n", i ? 1ULL << i : 0ULL,
		       1ULL << (i + 1), d, width, "******************************");
	}
}

static void print_table(const char *type, const struct options *o, const struct names *n,
			const struct hp_stats *cur, const struct hp_stats *prev,
			double elapsed_s, double span_s)
{
	bool summary = strcmp(type, "summary") == 0;
	char label[64];

	if (o->pid)
		printf("hpstat %s: pid %d, %.2f s%s\n", type, o->pid, span_s,
		       summary ? " in total" : "");
	else
		printf("hpstat %s: system-wide, %.2f s%s\n", type, span_s,
		       summary ? " in total" : "");
	(void)elapsed_s;
	printf("  %-34s%llu\n", "user page faults", cur->page_faults_user - prev->page_faults_user);
	for (int s = 0; s < HP_NR_SRC; s++) {
		snprintf(label, sizeof(label), "THP collapses (%s)", source_names[s]);
		table_counts(label, cur->collapse[s], prev->collapse[s], HP_MAX_STATUS,
			     (char **)n->status, NULL);
		snprintf(label, sizeof(label), "THP PMD scans (%s)", source_names[s]);
		table_counts(label, cur->scan_pmd[s], prev->scan_pmd[s], HP_MAX_STATUS,
			     (char **)n->status, NULL);
		snprintf(label, sizeof(label), "THP file collapses (%s)", source_names[s]);
		table_counts(label, cur->collapse_file[s], prev->collapse_file[s], HP_MAX_STATUS,
			     (char **)n->status, NULL);
		snprintf(label, sizeof(label), "THP file scans (%s)", source_names[s]);
		table_counts(label, cur->scan_file[s], prev->scan_file[s], HP_MAX_STATUS,
			     (char **)n->status, NULL);
	}
	table_hist("compaction, direct (stalls task)", &cur->compaction[HP_COMPACT_DIRECT],
		   &prev->compaction[HP_COMPACT_DIRECT], summary);
	table_hist("compaction, kernel thread", &cur->compaction[HP_COMPACT_KTHREAD],
		   &prev->compaction[HP_COMPACT_KTHREAD], summary);
	table_counts("compaction results", cur->compaction_result, prev->compaction_result,
		     HP_MAX_STATUS, (char **)n->compact, NULL);
	table_hist("direct reclaim stalls", &cur->direct_reclaim, &prev->direct_reclaim, summary);
	table_counts("TLB flushes", cur->tlb_flush, prev->tlb_flush, HP_MAX_REASON,
		     (char **)n->tlb, NULL);
	table_counts("madvise calls", cur->madvise, prev->madvise, HP_MAX_ADVICE, NULL,
		     advice_name);
	table_counts("process_madvise calls", cur->process_madvise, prev->process_madvise,
		     HP_MAX_ADVICE, NULL, advice_name);
	putchar('\n');
}

static void print_record(const char *type, const struct options *o, const struct names *n,
			 const struct hp_stats *cur, const struct hp_stats *prev,
			 double elapsed_s, double span_s, bool target_exited)
{
	if (o->table)
		print_table(type, o, n, cur, prev, elapsed_s, span_s);
	else
		print_json(type, o, n, cur, prev, elapsed_s, span_s, target_exited);
	fflush(stdout);
}

static void print_start(const struct options *o, const struct prog_state *progs, int nprogs)
{
	bool first;

	if (o->table) {
		if (o->pid)
			printf("hpstat: tracing pid %d", o->pid);
		else
			printf("hpstat: tracing the whole system");
		printf(" every %.2f s; Ctrl-C for the summary\n", o->interval_s);
		for (int i = 0; i < nprogs; i++)
			if (!progs[i].attached)
				printf("hpstat: %s is not in this kernel; not counted\n",
				       progs[i].event);
		fflush(stdout);
		return;
	}
	printf("{\"type\":\"start\",\"pid\":");
	if (o->pid)
		printf("%d", o->pid);
	else
		printf("null");
	printf(",\"interval_s\":%.3f,\"duration_s\":", o->interval_s);
	if (o->duration_s > 0)
		printf("%.3f", o->duration_s);
	else
		printf("null");
	for (int pass = 0; pass < 2; pass++) {
		printf(",\"%s\":[", pass ? "unavailable" : "attached");
		first = true;
		for (int i = 0; i < nprogs; i++) {
			if (progs[i].attached == (pass == 1))
				continue;
			printf("%s\"%s\"", first ? "" : ",", progs[i].event);
			first = false;
		}
		putchar(']');
	}
	printf("}\n");
	fflush(stdout);
}

static int open_target(int pid, unsigned long long *pidfs_ino)
{
	struct statfs sfs;
	struct stat st;
	int fd;

	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (fd < 0) {
		if (errno == ESRCH)
			die_env("no process with PID %d (it may have exited)", pid);
		die_env("cannot open PID %d with pidfd_open (%s)", pid, strerror(errno));
	}
	*pidfs_ino = 0;
	/* Before Linux 6.9 pidfds are anonymous inodes that do not identify the process. */
	if (fstatfs(fd, &sfs) == 0 && sfs.f_type == PID_FS_MAGIC && fstat(fd, &st) == 0)
		*pidfs_ino = st.st_ino;
	return fd;
}

int main(int argc, char **argv)
{
	static struct hp_stats prev, cur, zero;
	struct prog_state progs[MAX_PROGS];
	struct bpf_link *links[MAX_PROGS];
	unsigned long long pidfs_ino = 0;
	struct hpstat_bpf *skel;
	struct bpf_program *prog;
	bool target_exited = false;
	double start, last, next, end;
	struct sigaction sa;
	struct options o;
	struct names names;
	int nprogs = 0, pidfd = -1, err;

	parse_args(argc, argv, &o);
	if (o.exit_with_parent) {
		pid_t parent = getppid();

		/* SIGTERM runs the normal stop path; the check closes the race with an early exit */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			stop_requested = 1;
	}
	verbose = o.verbose;
	setvbuf(stdout, NULL, _IOLBF, 0);
	libbpf_set_print(print_libbpf);

	check_privileges();
	if (o.pid)
		pidfd = open_target(o.pid, &pidfs_ino);
	ensure_tracefs();
	load_names(&names);

	skel = hpstat_bpf__open();
	if (!skel) {
		fprintf(stderr, "hpstat: opening the BPF object failed (%s)\n", strerror(errno));
		return EXIT_RUNTIME;
	}
	skel->rodata->targ_tgid = (unsigned int)o.pid;
	skel->rodata->targ_pidfs_ino = pidfs_ino;

	/* A tracepoint this kernel lacks is reported as unavailable, not fatal. */
	bpf_object__for_each_program(prog, skel->obj) {
		const char *event = event_of_section(bpf_program__section_name(prog));
		bool want = event && event_exists(event);

		if (strcmp(bpf_program__name(prog), "on_sched_switch") == 0) {
			/* only needed to learn the target's mm */
			bpf_program__set_autoload(prog, want && o.pid);
			continue;
		}
		if (nprogs < MAX_PROGS)
			progs[nprogs++] = (struct prog_state){ .event = event, .attached = false };
		bpf_program__set_autoload(prog, want);
	}

	err = hpstat_bpf__load(skel);
	if (err)
		explain_load_failure(-err);

	nprogs = 0;
	int nlinks = 0;
	bpf_object__for_each_program(prog, skel->obj) {
		bool is_switch = strcmp(bpf_program__name(prog), "on_sched_switch") == 0;
		struct bpf_link *link;

		if (!bpf_program__autoload(prog)) {
			if (!is_switch)
				nprogs++;
			continue;
		}
		link = bpf_program__attach(prog);
		if (!link) {
			err = errno;
			if (err == EPERM || err == EACCES)
				die_env("BPF is not permitted: attaching %s failed (%s)",
					bpf_program__section_name(prog), strerror(err));
			fprintf(stderr, "hpstat: attaching %s failed (%s)\n",
				bpf_program__section_name(prog), strerror(err));
			return EXIT_RUNTIME;
		}
		links[nlinks++] = link;
		if (!is_switch)
			progs[nprogs++].attached = true;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	print_start(&o, progs, nprogs);
	start = last = now_s();
	next = start + o.interval_s;
	end = o.duration_s > 0 ? start + o.duration_s : 0;

	while (!stop_requested) {
		double wake = end && end < next ? end : next;
		double wait_s = wake - now_s();
		struct pollfd pfd = { .fd = pidfd, .events = POLLIN };
		double t;

		if (wait_s > 0) {
			int r = poll(&pfd, pidfd >= 0 ? 1 : 0, (int)(wait_s * 1000) + 1);

			if (r < 0 && errno != EINTR) {
				perror("hpstat: poll");
				break;
			}
			if (r > 0) {
				target_exited = true;
				break;
			}
		}
		if (stop_requested)
			break;
		t = now_s();
		if (end && t >= end)
			break;
		if (t < next)
			continue;
		memcpy(&cur, &skel->bss->stats, sizeof(cur));
		print_record("interval", &o, &names, &cur, &prev, t - start, t - last, false);
		prev = cur;
		last = t;
		next += o.interval_s;
		if (next < t)
			next = t + o.interval_s;
	}

	/* The tail since the last full interval, so the intervals add up to the summary. */
	memcpy(&cur, &skel->bss->stats, sizeof(cur));
	double t = now_s();

	if (t - last > 0.001)
		print_record("interval", &o, &names, &cur, &prev, t - start, t - last, false);
	print_record("summary", &o, &names, &cur, &zero, t - start, t - start, target_exited);

	for (int i = 0; i < nlinks; i++)
		bpf_link__destroy(links[i]);
	hpstat_bpf__destroy(skel);
	if (pidfd >= 0)
		close(pidfd);
	return 0;
}
