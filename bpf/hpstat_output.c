// SPDX-License-Identifier: GPL-2.0-only
/* hpstat's JSON lines and tables. See hpstat_output.h. */
#include <stdio.h>
#include <string.h>

#include "hpstat_output.h"
#include "tracefs_names.h"

/* ---- names ---- */

void hp_load_names(struct hp_output *out)
{
	struct hp_names *n = &out->names;

	memset(n, 0, sizeof(*n));
	tracefs_enum_names("huge_memory/mm_collapse_huge_page", "status", n->status, HP_MAX_STATUS);
	tracefs_enum_names("huge_memory/mm_khugepaged_scan_pmd", "status", n->status, HP_MAX_STATUS);
	tracefs_enum_names("compaction/mm_compaction_end", "status", n->compact, HP_MAX_STATUS);
	tracefs_enum_names("tlb/tlb_flush", "reason", n->tlb, HP_MAX_REASON);
	enum_names_fill_fallback(n->status, HP_MAX_STATUS, "status");
	enum_names_fill_fallback(n->compact, HP_MAX_STATUS, "status");
	enum_names_fill_fallback(n->tlb, HP_MAX_REASON, "reason");
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

static void print_json(const char *type, const struct hp_output *o,
		       const struct hp_stats *cur, const struct hp_stats *prev,
		       double elapsed_s, double span_s, bool target_exited)
{
	const struct hp_names *n = &o->names;
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

static void print_table(const char *type, const struct hp_output *o,
			const struct hp_stats *cur, const struct hp_stats *prev,
			double elapsed_s, double span_s)
{
	const struct hp_names *n = &o->names;
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

/* ---- records ---- */

void hp_print_record(const struct hp_output *o, const char *type, const struct hp_stats *cur,
		     const struct hp_stats *prev, double elapsed_s, double span_s,
		     bool target_exited)
{
	if (o->table)
		print_table(type, o, cur, prev, elapsed_s, span_s);
	else
		print_json(type, o, cur, prev, elapsed_s, span_s, target_exited);
	fflush(stdout);
}

/* ---- the start line ---- */

void hp_print_start(const struct hp_output *o, const struct hp_tracepoint *tps, int ntps)
{
	bool first;

	if (o->table) {
		if (o->pid)
			printf("hpstat: tracing pid %d", o->pid);
		else
			printf("hpstat: tracing the whole system");
		printf(" every %.2f s; Ctrl-C for the summary\n", o->interval_s);
		for (int i = 0; i < ntps; i++)
			if (!tps[i].attached)
				printf("hpstat: %s is not in this kernel; not counted\n",
				       tps[i].event);
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
		for (int i = 0; i < ntps; i++) {
			if (tps[i].attached == (pass == 1))
				continue;
			printf("%s\"%s\"", first ? "" : ",", tps[i].event);
			first = false;
		}
		putchar(']');
	}
	printf("}\n");
	fflush(stdout);
}
