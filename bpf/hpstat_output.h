/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * hpstat's output: the start line, one record per interval and the summary, as JSON lines (what
 * damon-hp parses, agent/damon_hp/hpstat.py) or as tables for people. A record prints the
 * difference of two snapshots of the kernel side's counters.
 */
#ifndef HPSTAT_OUTPUT_H
#define HPSTAT_OUTPUT_H

#include <stdbool.h>

#include "hpstat.h"

/* Names for the kernel's enum values, read from the tracepoints' print formats so
 * they are right for the running kernel (the enums grow between versions). */
struct hp_names {
	char *status[HP_MAX_STATUS];     /* huge_memory scan_result */
	char *compact[HP_MAX_STATUS];    /* compaction compact_result */
	char *tlb[HP_MAX_REASON];        /* tlb_flush_reason */
};

/* What every line says besides the counters; set once by the loader. */
struct hp_output {
	bool table;          /* human-readable tables instead of JSON lines */
	int pid;             /* the traced process; 0 = system-wide */
	double interval_s;
	double duration_s;   /* 0 = until stopped */
	struct hp_names names;
};

/* A tracepoint hpstat counts, and whether it is attached (else this kernel lacks it). */
struct hp_tracepoint {
	const char *event;   /* "category/name" */
	bool attached;
};

/* Reads out->names from tracefs (mounted); a value without a name there gets "status_<n>" or
 * "reason_<n>". */
void hp_load_names(struct hp_output *out);

/* The start line: what is attached and what this kernel lacks. */
void hp_print_start(const struct hp_output *out, const struct hp_tracepoint *tps, int ntps);

/* One record, flushed: `type` is "interval" or "summary"; counts are cur - prev; elapsed_s is
 * since start, span_s what the record covers; target_exited is printed on the summary only. */
void hp_print_record(const struct hp_output *out, const char *type, const struct hp_stats *cur,
		     const struct hp_stats *prev, double elapsed_s, double span_s,
		     bool target_exited);

#endif /* HPSTAT_OUTPUT_H */
