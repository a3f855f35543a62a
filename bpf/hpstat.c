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
 *
 * This file is the loader: options, open/load/attach the skeleton, read the
 * counters every interval. The lines are printed by hpstat_output.c; tracefs
 * (mount, tracepoint existence, enum names) is tracefs_names.c; why BPF is
 * refused is worked out by bpf_privilege.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <bpf/libbpf.h>
#include "bpf_privilege.h"
#include "hpstat.h"
#include "hpstat.skel.h"
#include "hpstat_output.h"
#include "tracefs_names.h"

#define EXIT_RUNTIME 1
#define EXIT_ENV 2

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

/* "tp/cat/name" or "raw_tp/name" -> "cat/name" for the existence check. */
static const char *event_of_section(const char *sec)
{
	if (strncmp(sec, "tp/", 3) == 0)
		return sec + 3;
	if (strcmp(sec, "raw_tp/sched_switch") == 0)
		return "sched/sched_switch";
	return NULL;
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
	struct hp_tracepoint progs[MAX_PROGS];
	struct bpf_link *links[MAX_PROGS];
	unsigned long long pidfs_ino = 0;
	struct hpstat_bpf *skel;
	struct bpf_program *prog;
	bool target_exited = false;
	double start, last, next, end;
	struct sigaction sa;
	struct options o;
	struct hp_output out;
	char msg[512];
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

	if (!bpf_privilege_check("hpstat", msg, sizeof(msg)))
		die_env("%s", msg);
	if (o.pid)
		pidfd = open_target(o.pid, &pidfs_ino);
	err = tracefs_mount();
	if (err)
		die_env("tracefs is not mounted at " TRACEFS " and mounting it failed (%s); "
			"mount it with: mount -t tracefs nodev " TRACEFS, strerror(-err));
	out = (struct hp_output){ .table = o.table, .pid = o.pid, .interval_s = o.interval_s,
				  .duration_s = o.duration_s };
	hp_load_names(&out);

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
		bool want = event && tracefs_event_exists(event);

		if (strcmp(bpf_program__name(prog), "on_sched_switch") == 0) {
			/* only needed to learn the target's mm */
			bpf_program__set_autoload(prog, want && o.pid);
			continue;
		}
		if (nprogs < MAX_PROGS)
			progs[nprogs++] = (struct hp_tracepoint){ .event = event, .attached = false };
		bpf_program__set_autoload(prog, want);
	}

	err = hpstat_bpf__load(skel);
	if (err) {
		if (bpf_explain_refusal("hpstat", -err, msg, sizeof(msg)))
			die_env("%s", msg);
		fprintf(stderr, "hpstat: loading the BPF programs failed (%s); run with -v to see the "
			"verifier log\n", strerror(-err));
		return EXIT_RUNTIME;
	}

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

	hp_print_start(&out, progs, nprogs);
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
		hp_print_record(&out, "interval", &cur, &prev, t - start, t - last, false);
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
		hp_print_record(&out, "interval", &cur, &prev, t - start, t - last, false);
	hp_print_record(&out, "summary", &cur, &zero, t - start, t - start, target_exited);

	for (int i = 0; i < nlinks; i++)
		bpf_link__destroy(links[i]);
	hpstat_bpf__destroy(skel);
	if (pidfd >= 0)
		close(pidfd);
	return 0;
}
