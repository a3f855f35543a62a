/*
 * streamcluster: streaming k-median clustering, a clean-room reimplementation of the PARSEC 3.0
 * kernel (pthreads build), written from workloads-spec.md Part A. Section numbers (A.n) below
 * refer to that document.
 *
 *   streamcluster k1 k2 d n chunksize clustersize infile outfile nproc
 *
 * It keeps the original's command line, allocation sizes and order, threads, access pattern,
 * lrand48 consumption and output file, because DAMON sees exactly those. Additions, none of which
 * changes the clustering: one "checksum" line on stdout (see workloads/README.md), an optional
 * counter dump (STREAMCLUSTER_COUNTERS=1, A.18's counts, on stderr) and an optional stop at exit
 * (STREAMCLUSTER_PAUSE_AT_EXIT=1: SIGSTOP itself after the output is written, so a test can read
 * /proc/PID/smaps of the finished run; SIGCONT resumes).
 *
 * streamcluster-compact.c builds the same code with the SC_HOT_* allocation hooks below pointed
 * at a huge-page arena; nothing else differs between the two programs.
 *
 * Arithmetic follows A.14 exactly (float vs double at every step, sums in index order), so the
 * output is reproducible bit for bit; do not build with -ffast-math or FMA contraction.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Allocation hooks for the small, hot arrays (A.17: switch_membership, is_center, center_table,
 * work_mem). The compaction variant redefines them before including this file. */
#ifndef SC_HOT_MALLOC
#define SC_HOT_MALLOC(size) malloc(size)
#define SC_HOT_CALLOC(count, size) calloc((count), (size))
#define SC_HOT_FREE(ptr) free(ptr)
#endif

#define SP 1   /* extra pspeedy attempts before z is lowered (A.8 steps 6-7) */
#define ITER 3 /* iteration factor of pFL and of the feasible-set size (A.8, A.10) */
#define CACHE_LINE_DOUBLES 4
#define BARRIER_SPINS 35000

/* A.5: 32-byte point record and 24-byte point set, laid out as in the original. */
typedef struct {
	float weight;
	float *coord;
	long assign;
	float cost;
} Point;

typedef struct {
	long num;
	int dim;
	Point *p;
} Points;

_Static_assert(sizeof(Point) == 32, "Point must be 32 bytes (A.5)");
_Static_assert(sizeof(Points) == 24, "Points must be 24 bytes (A.5)");

/* ---- barrier: spin a while, then block (A.7 says that is closest to the original's CPU use) */

struct barrier {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int parties;
	int waiting;
	atomic_uint generation;
};

static void barrier_init(struct barrier *b, int parties)
{
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->cond, NULL);
	b->parties = parties;
	b->waiting = 0;
	atomic_init(&b->generation, 0);
}

static void barrier_destroy(struct barrier *b)
{
	pthread_mutex_destroy(&b->lock);
	pthread_cond_destroy(&b->cond);
}

static void barrier_wait(struct barrier *b)
{
	if (b->parties == 1)
		return;
	pthread_mutex_lock(&b->lock);
	unsigned gen = atomic_load(&b->generation);
	if (++b->waiting == b->parties) {
		b->waiting = 0;
		atomic_store(&b->generation, gen + 1);
		pthread_cond_broadcast(&b->cond);
		pthread_mutex_unlock(&b->lock);
		return;
	}
	pthread_mutex_unlock(&b->lock);
	/* A plain load per iteration, as the original's spin on a volatile flag: with a pause
	 * instruction the same count would spin tens of times longer on recent CPUs. */
	for (int i = 0; i < BARRIER_SPINS; i++)
		if (atomic_load_explicit(&b->generation, memory_order_acquire) != gen)
			return;
	pthread_mutex_lock(&b->lock);
	while (atomic_load(&b->generation) == gen)
		pthread_cond_wait(&b->cond, &b->lock);
	pthread_mutex_unlock(&b->lock);
}

/* ---- program-wide state (A.5) ---- */

static bool *switch_membership;
static bool *is_center;
static int *center_table;
static int nproc;
static struct barrier barrier;

/* Shared among the threads of one localSearch. `shared_k` deliberately survives between calls:
 * the trivial path reports the previous call's value (A.5 quirk). */
static long shared_k;
static int *shared_feasible;
static int shared_numfeasible;
static double *shared_hizs;
static double *speedy_costs;
static double speedy_totalcost;
static long speedy_open; /* candidate T0 just opened, or num when the pass is over */
static double *work_mem;
static double gl_cost_of_opening_x;
static int gl_number_of_centers_to_close;

/* A.18 counters, updated by thread 0 (or main) only. */
static struct {
	long pgain, pgain_accepted, pspeedy, speedy_opened, pfl_iterations, bisection_steps;
	long intermediate_centres;
} counters;

/* Sum over all chunks of the clustering cost after localSearch, and that of the final pass. */
static double chunk_cost_total;
static double final_cost;
/* What outcenterIDs wrote: number of centres and the sum of their weights. */
static long output_centres;
static double output_weight;

/* A.4: the one normalised draw; (float)INT_MAX is 2^31, so u is in [0, 1]. */
static float draw_unit(void)
{
	return (float)lrand48() / (float)INT_MAX;
}

/* Squared Euclidean distance in float, coordinates summed in order (A.1, A.14). */
static float dist(const Point *a, const Point *b, int dim)
{
	float result = 0.0f;
	for (int i = 0; i < dim; i++) {
		float diff = a->coord[i] - b->coord[i];
		result += diff * diff;
	}
	return result;
}

/* A.7 block partition: equal blocks, the last thread takes the remainder. */
static void block_of(long num, int pid, long *lo, long *hi)
{
	long bsize = num / nproc;
	*lo = bsize * pid;
	*hi = (pid == nproc - 1) ? num : *lo + bsize;
}

/* A.4: swap whole Point records, drawing num - 1 numbers. */
static void shuffle(Points *points)
{
	for (long i = 0; i < points->num - 1; i++) {
		long j = (lrand48() % (points->num - i)) + i;
		Point tmp = points->p[i];
		points->p[i] = points->p[j];
		points->p[j] = tmp;
	}
}

/* A.4: draws len numbers, one for every position including the last. */
static void intshuffle(int *a, int len)
{
	for (int i = 0; i < len; i++) {
		int j = (int)((lrand48() % (len - i)) + i);
		int tmp = a[i];
		a[i] = a[j];
		a[j] = tmp;
	}
}

/* A.9: greedy initial solution with facility cost z. */
static float pspeedy(Points *points, float z, long *kcenter, int pid)
{
	long lo, hi;
	block_of(points->num, pid, &lo, &hi);
	Point *p = points->p;
	int dim = points->dim;

	barrier_wait(&barrier);
	for (long j = lo; j < hi; j++) {
		p[j].cost = dist(&p[j], &p[0], dim) * p[j].weight;
		p[j].assign = 0;
	}
	if (pid == 0) {
		*kcenter = 1;
		speedy_costs = malloc(sizeof(double) * nproc);
		speedy_open = 0;
		counters.pspeedy++;
	}
	barrier_wait(&barrier);

	/* T0 tests candidates in order and stops at each one that opens; every thread then
	 * applies that opening to its block before T0 tests the next candidate. */
	for (;;) {
		if (pid == 0) {
			long i = speedy_open + 1;
			for (; i < points->num; i++) {
				float u = draw_unit();
				if (u < p[i].cost / z)
					break;
			}
			speedy_open = i;
			if (i < points->num) {
				(*kcenter)++;
				counters.speedy_opened++;
			}
		}
		barrier_wait(&barrier);
		long i = speedy_open;
		if (i >= points->num)
			break;
		for (long j = lo; j < hi; j++) {
			float distance = dist(&p[i], &p[j], dim) * p[j].weight;
			if (distance < p[j].cost) {
				p[j].cost = distance;
				p[j].assign = i;
			}
		}
		barrier_wait(&barrier);
	}

	barrier_wait(&barrier);
	double mycost = 0.0;
	for (long j = lo; j < hi; j++)
		mycost += p[j].cost;
	speedy_costs[pid] = mycost;
	barrier_wait(&barrier);
	if (pid == 0) {
		speedy_totalcost = z * *kcenter;
		for (int t = 0; t < nproc; t++)
			speedy_totalcost += speedy_costs[t];
		free(speedy_costs);
	}
	barrier_wait(&barrier);
	return (float)speedy_totalcost;
}

/* A.12: gain of opening a centre at x (>= 0); applies the move when it pays. */
static double pgain(long x, Points *points, double z, long *numcenters, int pid)
{
	Point *p = points->p;
	int dim = points->dim;

	barrier_wait(&barrier);
	long lo, hi;
	block_of(points->num, pid, &lo, &hi);
	int stride = (int)(*numcenters + 2);
	stride = (stride + CACHE_LINE_DOUBLES - 1) / CACHE_LINE_DOUBLES * CACHE_LINE_DOUBLES;
	int K = stride - 2;

	if (pid == 0) {
		work_mem = SC_HOT_MALLOC(stride * (nproc + 1) * sizeof(double));
		gl_cost_of_opening_x = 0;
		gl_number_of_centers_to_close = 0;
		counters.pgain++;
	}
	barrier_wait(&barrier);

	/* Dense numbering of the centres, first per block, then offset by a prefix sum. */
	int count = 0;
	for (long j = lo; j < hi; j++)
		if (is_center[j])
			center_table[j] = count++;
	work_mem[pid * stride] = count;
	barrier_wait(&barrier);

	if (pid == 0) {
		double accum = 0;
		for (int t = 0; t < nproc; t++) {
			double tmp = work_mem[t * stride];
			work_mem[t * stride] = accum;
			accum += tmp;
		}
	}
	barrier_wait(&barrier);

	for (long j = lo; j < hi; j++)
		if (is_center[j])
			center_table[j] += (int)work_mem[pid * stride];

	memset(switch_membership + lo, 0, (size_t)(hi - lo) * sizeof(bool));
	for (int i = 0; i < stride; i++)
		work_mem[pid * stride + i] = 0;
	if (pid == 0)
		for (int i = 0; i < stride; i++)
			work_mem[nproc * stride + i] = 0;
	barrier_wait(&barrier);

	double *lower = &work_mem[pid * stride];
	double *gl_lower = &work_mem[nproc * stride];
	double cost_of_opening_x = 0;
	for (long j = lo; j < hi; j++) {
		float x_cost = dist(&p[j], &p[x], dim) * p[j].weight;
		float current_cost = p[j].cost;
		if (x_cost < current_cost) {
			switch_membership[j] = 1;
			cost_of_opening_x += x_cost - current_cost;
		} else {
			lower[center_table[p[j].assign]] += current_cost - x_cost;
		}
	}
	barrier_wait(&barrier);

	int number_of_centers_to_close = 0;
	for (long j = lo; j < hi; j++) {
		if (!is_center[j])
			continue;
		double low = z;
		for (int t = 0; t < nproc; t++)
			low += work_mem[center_table[j] + t * stride];
		gl_lower[center_table[j]] = low;
		if (low > 0) {
			number_of_centers_to_close++;
			cost_of_opening_x -= low;
		}
	}
	work_mem[pid * stride + K] = number_of_centers_to_close;
	work_mem[pid * stride + K + 1] = cost_of_opening_x;
	barrier_wait(&barrier);

	if (pid == 0) {
		gl_cost_of_opening_x = z;
		for (int t = 0; t < nproc; t++) {
			gl_number_of_centers_to_close += (int)work_mem[t * stride + K];
			gl_cost_of_opening_x += work_mem[t * stride + K + 1];
		}
	}
	barrier_wait(&barrier);

	double verdict = gl_cost_of_opening_x;
	if (verdict < 0) {
		for (long j = lo; j < hi; j++) {
			bool close_center = gl_lower[center_table[p[j].assign]] > 0;
			if (switch_membership[j] || close_center) {
				p[j].cost = p[j].weight * dist(&p[j], &p[x], dim);
				p[j].assign = x;
			}
		}
		for (long j = lo; j < hi; j++)
			if (is_center[j] && gl_lower[center_table[j]] > 0)
				is_center[j] = false;
		if (x >= lo && x < hi)
			is_center[x] = true;
		if (pid == 0) {
			*numcenters = *numcenters + 1 - gl_number_of_centers_to_close;
			counters.pgain_accepted++;
		}
	} else if (pid == 0) {
		gl_cost_of_opening_x = 0;
	}
	barrier_wait(&barrier);
	double saving = -gl_cost_of_opening_x;
	if (pid == 0)
		SC_HOT_FREE(work_mem);
	return saving;
}

/* A.11: facility-location local search until the relative improvement drops below e. */
static float pFL(Points *points, int *feasible, int numfeasible, float z, long *k, double cost,
		 long iter, float e, int pid)
{
	barrier_wait(&barrier);
	double change = cost;
	while (change / cost > e) {
		change = 0;
		if (pid == 0) {
			intshuffle(feasible, numfeasible);
			counters.pfl_iterations++;
		}
		barrier_wait(&barrier);
		for (long t = 0; t < iter; t++)
			change += pgain(feasible[t % numfeasible], points, z, k, pid);
		cost -= change;
		barrier_wait(&barrier);
	}
	return (float)cost;
}

/* A.10: candidate centres drawn by weight (T0 only). */
static int selectfeasible_fast(Points *points, int **feasible, long kmin)
{
	long num = points->num;
	int numfeasible = (int)num;
	double limit = (double)(ITER * kmin) * log((double)kmin);
	if (numfeasible > limit)
		numfeasible = (int)limit;
	*feasible = malloc(numfeasible * sizeof(int));

	if (numfeasible == num) {
		for (int i = 0; i < numfeasible; i++)
			(*feasible)[i] = i;
		return numfeasible;
	}

	float *accumweight = malloc(num * sizeof(float));
	accumweight[0] = points->p[0].weight;
	for (long i = 1; i < num; i++)
		accumweight[i] = accumweight[i - 1] + points->p[i].weight;
	float totalweight = accumweight[num - 1];

	for (int f = 0; f < numfeasible; f++) {
		float w = draw_unit() * totalweight;
		if (accumweight[0] > w) {
			(*feasible)[f] = 0;
			continue;
		}
		long l = 0, r = num - 1;
		while (l + 1 < r) {
			long m = (l + r) / 2;
			if (accumweight[m] > w)
				r = m;
			else
				l = m;
		}
		(*feasible)[f] = (int)r;
	}
	free(accumweight);
	return numfeasible;
}

/* A.8: cluster one point set into [kmin, kmax] centres by bisecting the facility cost. */
static double pkmedian(Points *points, long kmin, long kmax, long *kfinal, int pid)
{
	Point *p = points->p;
	long num = points->num;
	long lo, hi;
	block_of(num, pid, &lo, &hi);

	if (pid == 0)
		shared_hizs = calloc(nproc, sizeof(double));
	barrier_wait(&barrier);

	double myhiz = 0;
	for (long j = lo; j < hi; j++)
		myhiz += dist(&p[j], &p[0], points->dim) * p[j].weight;
	shared_hizs[pid] = myhiz;
	barrier_wait(&barrier);

	double hiz = 0.0, loz = 0.0;
	for (int t = 0; t < nproc; t++)
		hiz += shared_hizs[t];
	double z = (hiz + loz) / 2.0;

	if (num <= kmax) {
		for (long j = lo; j < hi; j++) {
			p[j].assign = j;
			p[j].cost = 0;
		}
		/* Not in the original, whose T0 frees hizs while others may still read it. */
		barrier_wait(&barrier);
		if (pid == 0) {
			free(shared_hizs);
			*kfinal = shared_k;
		}
		return 0;
	}

	if (pid == 0)
		shuffle(points);
	double cost = pspeedy(points, (float)z, &shared_k, pid);
	int i = 0;
	while (shared_k < kmin && i < SP) {
		cost = pspeedy(points, (float)z, &shared_k, pid);
		i++;
	}
	while (shared_k < kmin) {
		if (i >= SP) {
			hiz = z;
			z = (hiz + loz) / 2.0;
			i = 0;
		}
		if (pid == 0)
			shuffle(points);
		cost = pspeedy(points, (float)z, &shared_k, pid);
		i++;
	}

	if (pid == 0) {
		shared_numfeasible = selectfeasible_fast(points, &shared_feasible, kmin);
		for (long j = 0; j < num; j++)
			is_center[p[j].assign] = true;
	}
	barrier_wait(&barrier);

	long iter = (long)((double)(ITER * kmax) * log((double)kmax));
	for (;;) {
		if (pid == 0)
			counters.bisection_steps++;
		cost = pFL(points, shared_feasible, shared_numfeasible, (float)z, &shared_k, cost,
			   iter, 0.1f, pid);
		if ((shared_k <= 1.1 * kmax && shared_k >= 0.9 * kmin) ||
		    (shared_k <= kmax + 2 && shared_k >= kmin - 2)) {
			cost = pFL(points, shared_feasible, shared_numfeasible, (float)z, &shared_k,
				   cost, iter, 0.001f, pid);
		}
		if (shared_k > kmax) {
			loz = z;
			z = (hiz + loz) / 2.0;
			cost += (z - loz) * shared_k;
		}
		if (shared_k < kmin) {
			hiz = z;
			z = (hiz + loz) / 2.0;
			cost += (z - hiz) * shared_k;
		}
		if ((shared_k <= kmax && shared_k >= kmin) || loz >= 0.999 * hiz)
			break;
		barrier_wait(&barrier);
	}

	if (pid == 0) {
		free(shared_feasible);
		free(shared_hizs);
		*kfinal = shared_k;
	}
	return cost;
}

struct worker_arg {
	Points *points;
	long kmin, kmax;
	long *kfinal;
	int pid;
};

static void *localsearch_worker(void *argp)
{
	struct worker_arg *arg = argp;
	pkmedian(arg->points, arg->kmin, arg->kmax, arg->kfinal, arg->pid);
	return NULL;
}

/* A.7: nproc fresh threads per call; the caller only creates and joins them. */
static void localSearch(Points *points, long kmin, long kmax, long *kfinal)
{
	pthread_t *threads = malloc(nproc * sizeof(pthread_t));
	struct worker_arg *args = malloc(nproc * sizeof(struct worker_arg));
	if (!threads || !args) {
		fprintf(stderr, "streamcluster: out of memory for %d threads\n", nproc);
		exit(1);
	}
	barrier_init(&barrier, nproc);
	for (int t = 0; t < nproc; t++) {
		args[t] = (struct worker_arg){ points, kmin, kmax, kfinal, t };
		int err = pthread_create(&threads[t], NULL, localsearch_worker, &args[t]);
		if (err) {
			fprintf(stderr, "streamcluster: cannot create thread %d of %d: %s\n", t, nproc,
				strerror(err));
			exit(1);
		}
	}
	for (int t = 0; t < nproc; t++)
		pthread_join(threads[t], NULL);
	barrier_destroy(&barrier);
	free(threads);
	free(args);
}

/* Clustering cost of the current assignment. Point.cost is always weight x dist to the assigned
 * centre (every writer keeps that true), so no coordinate is re-read for it. */
static double assignment_cost(const Points *points)
{
	double sum = 0;
	for (long j = 0; j < points->num; j++)
		sum += points->p[j].cost;
	return sum;
}

/* A.13: move each centre to the running weighted mean of itself and its members. */
static void contcenters(Points *points)
{
	Point *p = points->p;
	for (long j = 0; j < points->num; j++) {
		long a = p[j].assign;
		if (a == j)
			continue;
		float relweight = p[j].weight / (p[a].weight + p[j].weight);
		for (int c = 0; c < points->dim; c++) {
			p[a].coord[c] = (float)((double)p[a].coord[c] * (1.0 - (double)relweight));
			p[a].coord[c] += p[j].coord[c] * relweight;
		}
		p[a].weight += p[j].weight;
	}
}

/* A.13: append this chunk's centres to the centre store. */
static void copycenters(Points *points, Points *centers, long *centerIDs, long offset)
{
	size_t num = points->num > 0 ? (size_t)points->num : 0; /* (for the compiler) */
	bool *is_a_median = calloc(num, sizeof(bool));
	for (long j = 0; j < points->num; j++)
		is_a_median[points->p[j].assign] = true;
	long m = centers->num;
	for (long j = 0; j < points->num; j++) {
		if (!is_a_median[j])
			continue;
		memcpy(centers->p[m].coord, points->p[j].coord, points->dim * sizeof(float));
		centers->p[m].weight = points->p[j].weight;
		centerIDs[m] = j + offset;
		m++;
	}
	centers->num = m;
	free(is_a_median);
}

/* A.13: 4 lines per final centre. */
static void outcenterIDs(Points *centers, long *centerIDs, const char *outfile)
{
	FILE *fp = fopen(outfile, "w");
	if (!fp) {
		fprintf(stderr, "error opening %s\n", outfile);
		exit(1);
	}
	int *is_a_median = calloc(centers->num, sizeof(int));
	for (long i = 0; i < centers->num; i++)
		is_a_median[centers->p[i].assign] = 1;
	for (long i = 0; i < centers->num; i++) {
		if (!is_a_median[i])
			continue;
		fprintf(fp, "%u\n", (unsigned)centerIDs[i]);
		fprintf(fp, "%lf\n", centers->p[i].weight);
		for (int c = 0; c < centers->dim; c++)
			fprintf(fp, "%lf ", centers->p[i].coord[c]);
		fprintf(fp, "\n\n");
		output_centres++;
		output_weight += centers->p[i].weight;
	}
	fclose(fp);
}

/* ---- input streams (A.2, A.6 step 2.1) ---- */

struct stream {
	bool synthetic;
	long remaining; /* synthetic: points still to produce */
	FILE *fp;       /* file */
};

static struct stream *stream_open(long n, const char *infile)
{
	struct stream *s = calloc(1, sizeof(*s));
	if (!s) {
		fprintf(stderr, "streamcluster: out of memory\n");
		exit(1);
	}
	if (n > 0) {
		s->synthetic = true;
		s->remaining = n;
		return s;
	}
	s->fp = fopen(infile, "rb");
	if (!s->fp) {
		fprintf(stderr, "error opening file %s\n", infile);
		exit(1);
	}
	return s;
}

static size_t stream_read(struct stream *s, float *dest, int dim, long num)
{
	if (!s->synthetic)
		return fread(dest, sizeof(float) * dim, num, s->fp);
	long count = num < s->remaining ? num : s->remaining;
	for (long i = 0; i < count; i++)
		for (int c = 0; c < dim; c++)
			dest[i * dim + c] = draw_unit();
	s->remaining -= count;
	return count;
}

static bool stream_error(const struct stream *s)
{
	return s->synthetic ? false : ferror(s->fp) != 0;
}

static bool stream_eof(const struct stream *s)
{
	return s->synthetic ? s->remaining <= 0 : feof(s->fp) != 0;
}

static void stream_close(struct stream *s)
{
	if (!s->synthetic) {
		fprintf(stderr, "closing file stream\n");
		fclose(s->fp);
	}
	free(s);
}

/* A.6: the region of interest. */
static void streamCluster(struct stream *stream, long kmin, long kmax, int dim, long chunksize,
			  long centersize, const char *outfile)
{
	float *block = malloc(chunksize * dim * sizeof(float));
	if (!block) {
		fprintf(stderr, "not enough memory for a chunk!\n");
		exit(1);
	}
	float *centerBlock = malloc(centersize * dim * sizeof(float));
	long *centerIDs = malloc(centersize * dim * sizeof(long));

	Points points;
	points.dim = dim;
	points.num = chunksize;
	points.p = malloc(chunksize * sizeof(Point));
	Points centers;
	centers.dim = dim;
	centers.p = malloc(centersize * sizeof(Point));
	centers.num = 0;
	if (!centerBlock || !centerIDs || !points.p || !centers.p) {
		fprintf(stderr, "not enough memory for a chunk!\n");
		exit(1);
	}
	for (long i = 0; i < chunksize; i++)
		points.p[i].coord = &block[i * dim];
	for (long i = 0; i < centersize; i++) {
		centers.p[i].coord = &centerBlock[i * dim];
		centers.p[i].weight = 1.0;
	}

	long IDoffset = 0;
	long kfinal = 0;
	for (;;) {
		size_t numRead = stream_read(stream, block, dim, chunksize);
		fprintf(stderr, "read %zu points\n", numRead);
		if (stream_error(stream) || ((long)numRead < chunksize && !stream_eof(stream))) {
			fprintf(stderr, "error reading data!\n");
			exit(1);
		}

		/* p[i].coord is deliberately left as the last shuffle made it (A.6 step 2.3). */
		points.num = numRead;
		for (long i = 0; i < points.num; i++)
			points.p[i].weight = 1.0;

		switch_membership = SC_HOT_MALLOC(points.num * sizeof(bool));
		is_center = SC_HOT_CALLOC(points.num, sizeof(bool));
		center_table = SC_HOT_MALLOC(points.num * sizeof(int));

		localSearch(&points, kmin, kmax, &kfinal);
		chunk_cost_total += assignment_cost(&points);

		contcenters(&points);
		if (kfinal + centers.num > centersize) {
			fprintf(stderr, "oops! no more space for centers\n");
			exit(1);
		}
		copycenters(&points, &centers, centerIDs, IDoffset);
		IDoffset += numRead;

		SC_HOT_FREE(is_center);
		SC_HOT_FREE(switch_membership);
		SC_HOT_FREE(center_table);

		if (stream_eof(stream))
			break;
	}
	counters.intermediate_centres = centers.num;

	switch_membership = SC_HOT_MALLOC(centers.num * sizeof(bool));
	is_center = SC_HOT_CALLOC(centers.num, sizeof(bool));
	center_table = SC_HOT_MALLOC(centers.num * sizeof(int));
	localSearch(&centers, kmin, kmax, &kfinal);
	final_cost = assignment_cost(&centers);
	contcenters(&centers);
	outcenterIDs(&centers, centerIDs, outfile);
}

/* FNV-1a (64-bit) of a file's bytes; false if it cannot be read. */
static bool file_fnv1a64(const char *path, uint64_t *hash)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return false;
	uint64_t h = 0xcbf29ce484222325ULL;
	int c;
	while ((c = getc(f)) != EOF) {
		h ^= (unsigned char)c;
		h *= 0x100000001b3ULL;
	}
	fclose(f);
	*hash = h;
	return true;
}

/* The stdout line described in workloads/README.md. */
static void print_checksum(const char *outfile)
{
	uint64_t hash = 0;
	bool hashed = file_fnv1a64(outfile, &hash);
	printf("checksum: centres=%ld weight=%.0f chunk_cost=%.9e final_cost=%.9e "
	       "output_fnv1a64=", output_centres, output_weight, chunk_cost_total, final_cost);
	if (hashed)
		printf("%016llx\n", (unsigned long long)hash);
	else
		printf("unreadable\n");
}

static void usage(void)
{
	fprintf(stderr,
		"usage: streamcluster k1 k2 d n chunksize clustersize infile outfile nproc\n"
		"  k1:          least number of centres\n"
		"  k2:          most number of centres\n"
		"  d:           dimensions of a point\n"
		"  n:           number of points\n"
		"  chunksize:   points handled per chunk\n"
		"  clustersize: most intermediate centres kept\n"
		"  infile:      raw float32 points, d per record (ignored when n > 0)\n"
		"  outfile:     file the final centres are written to\n"
		"  nproc:       number of worker threads\n"
		"n > 0 clusters n random points instead of reading infile.\n");
}

int main(int argc, char **argv)
{
	fprintf(stderr, "PARSEC Benchmark Suite\n");
	if (argc < 10) {
		usage();
		return 1;
	}
	long kmin = atoi(argv[1]);
	long kmax = atoi(argv[2]);
	int dim = atoi(argv[3]);
	long n = atoi(argv[4]);
	long chunksize = atoi(argv[5]);
	long clustersize = atoi(argv[6]);
	const char *infile = argv[7];
	const char *outfile = argv[8];
	nproc = atoi(argv[9]);
	/* atoi semantics as in the original, but values that would crash it are refused. */
	/* (k1 = 1 makes the feasible set empty and the original divide by zero in pFL.) */
	if (nproc < 1 || dim < 1 || chunksize < 1 || kmin < 2) {
		fprintf(stderr, "streamcluster: need nproc, d, chunksize >= 1 and k1 >= 2 "
			"(got %d, %d, %ld, %ld)\n", nproc, dim, chunksize, kmin);
		usage();
		return 1;
	}

	srand48(1);
	struct stream *stream = stream_open(n, infile);
	streamCluster(stream, kmin, kmax, dim, chunksize, clustersize, outfile);
	stream_close(stream);

	print_checksum(outfile);
	const char *want_counters = getenv("STREAMCLUSTER_COUNTERS");
	if (want_counters && *want_counters && strcmp(want_counters, "0") != 0)
		fprintf(stderr, "counters: pgain=%ld pgain_accepted=%ld pspeedy=%ld speedy_opened=%ld "
			"pfl_iterations=%ld bisection_steps=%ld intermediate_centres=%ld\n",
			counters.pgain, counters.pgain_accepted, counters.pspeedy,
			counters.speedy_opened, counters.pfl_iterations, counters.bisection_steps,
			counters.intermediate_centres);
	const char *pause = getenv("STREAMCLUSTER_PAUSE_AT_EXIT");
	if (pause && *pause && strcmp(pause, "0") != 0) {
		fprintf(stderr, "streamcluster: pid %ld stopping itself (SIGSTOP); SIGCONT ends it\n",
			(long)getpid());
		fflush(NULL);
		raise(SIGSTOP);
	}
	return 0;
}
