// SPDX-License-Identifier: GPL-2.0-only
/* tracefs for BPF tools: mount, tracepoint existence, enum names. See tracefs_names.h. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "tracefs_names.h"

int tracefs_mount(void)
{
	if (access(TRACEFS "/events", R_OK | X_OK) == 0)
		return 0;
	if (mount("nodev", TRACEFS, "tracefs", 0, NULL) != 0)
		return -errno;
	return 0;
}

bool tracefs_event_exists(const char *event)
{
	char path[256];

	snprintf(path, sizeof(path), TRACEFS "/events/%s/id", event);
	return access(path, R_OK) == 0;
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

void tracefs_enum_names(const char *event, const char *field, char **names, int nr)
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

void enum_names_fill_fallback(char **names, int nr, const char *prefix)
{
	char buf[48];

	for (int i = 0; i < nr; i++) {
		if (names[i])
			continue;
		snprintf(buf, sizeof(buf), "%s_%d", prefix, i);
		names[i] = strdup(buf);
	}
}
