/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tracefs for BPF tools: make sure it is mounted, ask whether a tracepoint exists, and read the
 * names of a tracepoint's enum values from its print format, so that a tool prints the running
 * kernel's names (the kernel's enums grow between versions).
 */
#ifndef TRACEFS_NAMES_H
#define TRACEFS_NAMES_H

#include <stdbool.h>

#define TRACEFS "/sys/kernel/tracing"

/* 0 when tracefs is (or now is) mounted at TRACEFS, else -errno of the failed mount. */
int tracefs_mount(void);

/* Whether tracepoint "category/name" exists in this kernel. */
bool tracefs_event_exists(const char *event);

/*
 * Fills the still-empty names[v] (0 <= v < nr) from `__print_symbolic(REC-><field>, {v, "text"},
 * ...)` in the event's format file, as snake_case ("local MM shootdown" -> "local_mm_shootdown").
 * An event or field that is missing leaves names[] as it was. The strings are malloc'ed.
 */
void tracefs_enum_names(const char *event, const char *field, char **names, int nr);

/* Gives every still-empty names[i] the name "<prefix>_<i>". */
void enum_names_fill_fallback(char **names, int nr, const char *prefix);

#endif /* TRACEFS_NAMES_H */
