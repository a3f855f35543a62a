// SPDX-License-Identifier: GPL-2.0-only
/*
 * hpstat kernel side: counts huge-page, fault, compaction, reclaim, TLB and
 * madvise events for one process (all its threads) or the whole system.
 *
 * Only tracepoints and raw tracepoints are used: fentry/fexit need BPF
 * trampolines, which some kernels (ours included) refuse.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "hpstat.h"

/* Stable kernel ABI values that vmlinux.h (types only) does not carry. */
#define PF_KTHREAD 0x00200000
#define PID_FS_MAGIC 0x50494446
#define PIDFD_SELF_THREAD -10000
#define PIDFD_SELF_THREAD_GROUP -20000

/* Set by the loader before load; 0 means system-wide. */
const volatile __u32 targ_tgid = 0;
/* Inode number of the target's pidfs inode: every pidfd of one process shares it
 * (Linux 6.9+), so process_madvise calls aimed at the target can be recognised. */
const volatile __u64 targ_pidfs_ino = 0;

/* The target's mm, learned the first time one of its threads runs under us.
 * khugepaged and process_madvise work on the target's memory from another task's
 * context, so the mm (not the current task) identifies them. */
__u64 targ_mm = 0;

struct hp_stats stats = {};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} compact_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} reclaim_start SEC(".maps");

static __always_inline __u32 slot_of(long value, __u32 nr_slots)
{
	if (value < 0 || value >= nr_slots)
		return nr_slots - 1;
	/* every nr_slots is a power of two; the mask proves the bound to the verifier */
	return (__u32)value & (nr_slots - 1);
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;

	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) r += 1;
	return r;
}

static __always_inline bool current_is_target(void)
{
	if (!targ_tgid)
		return true;
	return (bpf_get_current_pid_tgid() >> 32) == targ_tgid;
}

static __always_inline bool current_is_kthread(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	return BPF_CORE_READ(task, flags) & PF_KTHREAD;
}

/* Call only when current belongs to the target. */
static __always_inline void learn_target_mm(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 mm = (__u64)BPF_CORE_READ(task, mm);

	if (mm)
		targ_mm = mm;
}

static __always_inline bool mm_is_target(const void *mm)
{
	if (!targ_tgid)
		return true;
	return targ_mm && (__u64)mm == targ_mm;
}

static __always_inline void hist_add(struct hp_hist *h, __u64 delta_ns)
{
	__u32 slot = slot_of(log2_u64(delta_ns / 1000), HP_HIST_SLOTS);

	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->total_ns, delta_ns);
	__sync_fetch_and_add(&h->slots[slot], 1);
}

static __always_inline enum hp_source collapse_source(void)
{
	return current_is_kthread() ? HP_SRC_KHUGEPAGED : HP_SRC_MADV_COLLAPSE;
}

SEC("tp/exceptions/page_fault_user")
int on_page_fault_user(void *ctx __attribute__((unused)))
{
	if (!current_is_target())
		return 0;
	if (targ_tgid)
		learn_target_mm();
	__sync_fetch_and_add(&stats.page_faults_user, 1);
	return 0;
}

/* A target that takes no fault and makes no syscall we trace still gets scheduled. */
SEC("raw_tp/sched_switch")
int on_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
	/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, ...) */
	struct task_struct *next = (struct task_struct *)ctx->args[2];
	__u64 mm;

	if ((__u32)BPF_CORE_READ(next, tgid) != targ_tgid)
		return 0;
	mm = (__u64)BPF_CORE_READ(next, mm);
	if (mm)
		targ_mm = mm;
	return 0;
}

SEC("tp/huge_memory/mm_khugepaged_scan_pmd")
int on_scan_pmd(struct trace_event_raw_mm_khugepaged_scan_pmd *ctx)
{
	if (!mm_is_target(ctx->mm))
		return 0;
	__sync_fetch_and_add(&stats.scan_pmd[collapse_source()][slot_of(ctx->status, HP_MAX_STATUS)], 1);
	return 0;
}

SEC("tp/huge_memory/mm_collapse_huge_page")
int on_collapse(struct trace_event_raw_mm_collapse_huge_page *ctx)
{
	if (!mm_is_target(ctx->mm))
		return 0;
	__sync_fetch_and_add(&stats.collapse[collapse_source()][slot_of(ctx->status, HP_MAX_STATUS)], 1);
	return 0;
}

SEC("tp/huge_memory/mm_khugepaged_scan_file")
int on_scan_file(struct trace_event_raw_mm_khugepaged_scan_file *ctx)
{
	if (!mm_is_target(ctx->mm))
		return 0;
	__sync_fetch_and_add(&stats.scan_file[collapse_source()][slot_of(ctx->result, HP_MAX_STATUS)], 1);
	return 0;
}

SEC("tp/huge_memory/mm_khugepaged_collapse_file")
int on_collapse_file(struct trace_event_raw_mm_khugepaged_collapse_file *ctx)
{
	if (!mm_is_target(ctx->mm))
		return 0;
	__sync_fetch_and_add(&stats.collapse_file[collapse_source()][slot_of(ctx->result, HP_MAX_STATUS)], 1);
	return 0;
}

static __always_inline void span_begin(void *map)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 now = bpf_ktime_get_ns();

	if (!current_is_target())
		return;
	bpf_map_update_elem(map, &tid, &now, BPF_ANY);
}

/* Returns the span's duration in ns, or 0 when its begin was not seen. */
static __always_inline __u64 span_end(void *map)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 *start, delta;

	start = bpf_map_lookup_elem(map, &tid);
	if (!start) {
		if (current_is_target())
			__sync_fetch_and_add(&stats.unmatched_end, 1);
		return 0;
	}
	delta = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(map, &tid);
	/* a zero-length span still counts: keep it distinguishable from "not seen" */
	return delta ? delta : 1;
}

SEC("tp/compaction/mm_compaction_begin")
int on_compaction_begin(void *ctx __attribute__((unused)))
{
	span_begin(&compact_start);
	return 0;
}

SEC("tp/compaction/mm_compaction_end")
int on_compaction_end(struct trace_event_raw_mm_compaction_end *ctx)
{
	__u64 delta = span_end(&compact_start);
	int kind;

	if (!delta)
		return 0;
	kind = current_is_kthread() ? HP_COMPACT_KTHREAD : HP_COMPACT_DIRECT;
	hist_add(&stats.compaction[kind], delta);
	__sync_fetch_and_add(&stats.compaction_result[slot_of(ctx->status, HP_MAX_STATUS)], 1);
	return 0;
}

SEC("tp/vmscan/mm_vmscan_direct_reclaim_begin")
int on_reclaim_begin(void *ctx __attribute__((unused)))
{
	span_begin(&reclaim_start);
	return 0;
}

SEC("tp/vmscan/mm_vmscan_direct_reclaim_end")
int on_reclaim_end(struct trace_event_raw_mm_vmscan_direct_reclaim_end_template *ctx)
{
	__u64 delta = span_end(&reclaim_start);

	if (!delta)
		return 0;
	hist_add(&stats.direct_reclaim, delta);
	__sync_fetch_and_add(&stats.direct_reclaim_pages, ctx->nr_reclaimed);
	return 0;
}

SEC("tp/tlb/tlb_flush")
int on_tlb_flush(struct trace_event_raw_tlb_flush *ctx)
{
	if (!current_is_target())
		return 0;
	__sync_fetch_and_add(&stats.tlb_flush[slot_of(ctx->reason, HP_MAX_REASON)], 1);
	return 0;
}

SEC("tp/syscalls/sys_enter_madvise")
int on_madvise(struct trace_event_raw_sys_enter *ctx)
{
	if (!current_is_target())
		return 0;
	if (targ_tgid)
		learn_target_mm();
	__sync_fetch_and_add(&stats.madvise[slot_of((long)ctx->args[2], HP_MAX_ADVICE)], 1);
	return 0;
}

/* The process (thread-group leader) behind a pidfs inode: i_private is the struct pid,
 * whose PIDTYPE_TGID list holds the leader through its pid_links[PIDTYPE_TGID] node. */
static __always_inline struct task_struct *pidfs_task(struct inode *inode)
{
	struct pid *pid = BPF_CORE_READ(inode, i_private);
	struct hlist_node *node;

	if (!pid)
		return NULL;
	node = BPF_CORE_READ(pid, tasks[PIDTYPE_TGID].first);
	if (!node)
		return NULL;
	return (struct task_struct *)((void *)node -
				      bpf_core_field_offset(struct task_struct, pid_links) -
				      PIDTYPE_TGID * sizeof(struct hlist_node));
}

/* Does the caller's file descriptor `fd` name the target process? When it does, the
 * target's mm is learned from it too, so work on a target that never runs is seen. */
static __always_inline bool pidfd_is_target(int fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *target;
	struct file **fds, *file = NULL;
	struct fdtable *fdt;
	struct inode *inode;
	__u64 mm;

	if (fd == PIDFD_SELF_THREAD || fd == PIDFD_SELF_THREAD_GROUP)
		return current_is_target();
	if (fd < 0 || !targ_pidfs_ino)
		return false;
	fdt = BPF_CORE_READ(task, files, fdt);
	if ((unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return false;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]) || !file)
		return false;
	inode = BPF_CORE_READ(file, f_inode);
	if (BPF_CORE_READ(inode, i_sb, s_magic) != PID_FS_MAGIC)
		return false;
	if (BPF_CORE_READ(inode, i_ino) != targ_pidfs_ino)
		return false;
	target = pidfs_task(inode);
	if (target && (__u32)BPF_CORE_READ(target, tgid) == targ_tgid) {
		mm = (__u64)BPF_CORE_READ(target, mm);
		if (mm)
			targ_mm = mm;
	}
	return true;
}

/* Counted when it acts on the target's memory, whoever the caller is. */
SEC("tp/syscalls/sys_enter_process_madvise")
int on_process_madvise(struct trace_event_raw_sys_enter *ctx)
{
	if (targ_tgid && !pidfd_is_target((int)ctx->args[0]))
		return 0;
	__sync_fetch_and_add(&stats.process_madvise[slot_of((long)ctx->args[3], HP_MAX_ADVICE)], 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
