/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * hpstat: what the state both sides share. The kernel side adds into one
 * `struct hp_stats` kept in the program's .bss; the loader reads it through the
 * skeleton's memory map every interval and prints the difference.
 */
#ifndef HPSTAT_H
#define HPSTAT_H

/* Sized above every value the kernels we run emit (scan_result tops out near 30,
 * compact_result near 8, tlb_flush_reason near 6); larger values land in the last slot. */
#define HP_MAX_STATUS 64
#define HP_MAX_REASON 16
/* MADV_* values run to 103 (MADV_GUARD_REMOVE); anything above shares the last slot. */
#define HP_MAX_ADVICE 128
/* log2(microseconds): slot 31 is ~36 minutes, far past any stall worth a histogram. */
#define HP_HIST_SLOTS 32

/* Who drove a THP collapse: the khugepaged kernel thread, or a user task inside
 * madvise/process_madvise(MADV_COLLAPSE) (its cost is charged to that task). */
enum hp_source {
	HP_SRC_KHUGEPAGED = 0,
	HP_SRC_MADV_COLLAPSE = 1,
	HP_NR_SRC,
};

/* Compaction done by the allocating task stalls it; compaction in a kernel thread
 * (kcompactd, khugepaged) does not stall the workload directly. */
enum hp_compact_kind {
	HP_COMPACT_DIRECT = 0,
	HP_COMPACT_KTHREAD = 1,
	HP_NR_COMPACT,
};

struct hp_hist {
	unsigned long long count;
	unsigned long long total_ns;
	/* slot i counts durations d with log2(d in us) == i; slot 0 also holds d < 1 us */
	unsigned long long slots[HP_HIST_SLOTS];
};

struct hp_stats {
	unsigned long long page_faults_user;
	/* huge_memory tracepoints, by source and by the kernel's scan_result status */
	unsigned long long scan_pmd[HP_NR_SRC][HP_MAX_STATUS];
	unsigned long long collapse[HP_NR_SRC][HP_MAX_STATUS];
	unsigned long long scan_file[HP_NR_SRC][HP_MAX_STATUS];
	unsigned long long collapse_file[HP_NR_SRC][HP_MAX_STATUS];
	struct hp_hist compaction[HP_NR_COMPACT];
	unsigned long long compaction_result[HP_MAX_STATUS];
	struct hp_hist direct_reclaim;
	unsigned long long direct_reclaim_pages;
	unsigned long long tlb_flush[HP_MAX_REASON];
	unsigned long long madvise[HP_MAX_ADVICE];
	unsigned long long process_madvise[HP_MAX_ADVICE];
	/* an end event whose begin was not seen (it began before hpstat attached) */
	unsigned long long unmatched_end;
};

#endif /* HPSTAT_H */
