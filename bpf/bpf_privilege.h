/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Why a BPF tool may not trace here, in words a user can act on: missing capabilities (checked
 * before loading, so the user hears it before the kernel's bare EPERM), kernel lockdown, or a
 * security policy that refuses bpf(). The caller prints the message and picks the exit code.
 */
#ifndef BPF_PRIVILEGE_H
#define BPF_PRIVILEGE_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Whether this process has what loading tracing programs needs: CAP_SYS_ADMIN, or CAP_BPF and
 * CAP_PERFMON (effective set, from /proc/self/status). If not, writes into msg why and what to do
 * ("BPF is not permitted: <tool> runs as uid ... Run it as root (sudo).") and returns false.
 */
bool bpf_privilege_check(const char *tool, char *msg, size_t size);

/*
 * After loading the tool's programs failed with errno `err`: whether the kernel refused it
 * (lockdown in confidentiality mode, or EPERM/EACCES despite the capabilities: an LSM or a
 * seccomp policy), with the explanation in msg ("BPF is not permitted: ..."). False for any
 * other failure (a verifier rejection, say), with msg untouched.
 */
bool bpf_explain_refusal(const char *tool, int err, char *msg, size_t size);

#endif /* BPF_PRIVILEGE_H */
