/*
 * water_nsquared: molecular dynamics of liquid water with O(N^2) pair forces, written from
 * /work/shared/workloads-spec.md Part B (a clean-room reimplementation of the SPLASH-2x program
 * shipped in PARSEC 3.0; no original code or data was used).
 *
 * Usage: water_nsquared [anything] < input      (10 fields; the 9th is the thread count)
 * Initial velocities come from ./random.in (workloads/water_inputs.py writes one).
 *
 * What matters for this project besides the numbers is the memory behaviour, so the layout and
 * the allocation calls follow the spec exactly (section B.7):
 *   - VAR: one malloc of 672 B per molecule (its own mmap once NMOL >= 196);
 *   - gl: one malloc of 2 622 264 B holding all locks, barriers and shared sums (its own mmap);
 *   - PFORCES: a 4-level pointer tree per thread built with one malloc per node, in the spec's
 *     order, so each thread's force rows are one contiguous run of 32-byte heap chunks.
 * Everything is allocated by the main thread before the workers start; nothing is freed.
 *
 * Output is the original's format (section B.16) followed by one "Checksum:" line: weighted sums
 * of the final positions and velocities, for comparing runs and the numpy reference.
 *
 * With WATER_NSQUARED_JSON set in the environment, two JSON lines go to stderr: before the
 * threads start, {"event":"layout",...} with the address ranges of VAR, gl and each thread's
 * PFORCES pointer table and node run (ground truth for what DAMON should find); at the end,
 * {"event":"stats",...} with the pair counts of all INTERF calls.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

/* ---- constants (spec B.4), internal units: Angstrom, 1e-15 s, amu ---- */
#define TEMP 298.0
#define RHO 0.9980
#define ROH 0.9572
#define ANGLE 1.824218
#define OMAS 15.99945
#define HMAS 1.007825
#define WTMOL (OMAS + 2.0 * HMAS)
#define UNITT 1.0e-15
#define UNITL 1.0e-8
#define UNITM 1.6605655e-24
#define BOLTZ 1.380662e-16

#define FC11 0.512596
#define FC33 0.048098
#define FC12 (-0.005823)
#define FC13 0.016452
#define FC111 (-0.57191)
#define FC333 (-0.007636)
#define FC112 (-0.001867)
#define FC113 (-0.002047)
#define FC123 (-0.03083)
#define FC133 (-0.0094245)
#define FC1111 0.8431
#define FC3333 (-0.00193)
#define FC1112 (-0.0030)
#define FC1122 0.0036
#define FC1113 (-0.012)
#define FC1123 0.0060
#define FC1133 (-0.0048)
#define FC1233 0.0211
#define FC1333 0.006263

#define QQ 0.07152158
#define QQ2 (2.0 * QQ)
#define QQ4 (2.0 * QQ2)
#define A1 455.313100
#define B1 5.15271070
#define A2 0.27879839
#define B2 2.76084370
#define A3 0.60895706
#define B3 2.96189550
#define A4 0.11447336
#define B4 2.23326410
#define AB1 (A1 * B1)
#define AB2 (A2 * B2)
#define AB3 (A3 * B3)
#define AB4 (A4 * B4)
#define CM 0.45682590
#define C1 (1.0 - CM)
#define C2 (0.5 * CM)

#define NATOMS 3
#define NDIR 3
#define NORDER_SUPPORTED 6
#define MXOD2 9
#define MAXPROCS 1024
#define MAXLCKS 65536

/* Atom order inside a molecule record, and the derivative slots used by name. */
enum { H1 = 0, OX = 1, H2 = 2 };
enum { DISP = 0, VEL = 1, ACC = 2, FORCES = 7 };

struct molecule {
	double vm[NDIR];			/* M site position */
	double f[MXOD2][NDIR][NATOMS];		/* scaled derivatives, slot 8 unused */
};
_Static_assert(sizeof(struct molecule) == 672, "molecule record must be 672 bytes (spec B.7)");

/* A mutex + condvar barrier as PARSEC's pthreads macros build it: no spinning. */
struct barrier {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned long count;
	unsigned long cycle;
};

/* The shared block, field for field as B.7 lists it (IO and FX/FY/FZ locks are unused but keep
 * the size and offsets). */
struct global {
	pthread_mutex_t io_lock, index_lock, intraf_vir_lock, interf_vir_lock;
	pthread_mutex_t fx_lock, fy_lock, fz_lock, kineti_sum_lock, poteng_sum_lock;
	pthread_mutex_t mol_lock[MAXLCKS];
	struct barrier start, interf_bar, poteng_bar;
	long index;
	double vir;
	double sum[NDIR];
	double pota, potr, potrf;
	unsigned long computestart, computeend, computetime;
	unsigned long trackstart, intraend, interend;
	unsigned long tracktime, intratime, intertime, othertime, steps_timed;
};
_Static_assert(sizeof(struct global) == 2622264, "gl must be 2 622 264 bytes (spec B.7)");

/* ---- run parameters and derived quantities (spec B.2, B.6) ---- */
static double TSTEP, CUTOFF;
static long NMOL, NSTEP, NORDER, NSAVE, NRST, NPRINT, NFMC, NumProcs;
static long NATMO, NATMO3, NMOL1;
static double FPOT, FKIN, BOXL, BOXH, CUT2, REF1, REF2, REF4, FHM, FOM;

static double binom[NORDER_SUPPORTED + 1][NORDER_SUPPORTED + 1];
static double PCC[NORDER_SUPPORTED + 1];

static struct molecule *VAR;
static struct global *gl;
static double ****PFORCES;
static long StartMol[MAXPROCS + 1];
static long MolsPerProc;

static double final_xtt;		/* thread 0's XTT, printed by main */
static unsigned long pairs_examined[MAXPROCS], pairs_interacting[MAXPROCS];

static unsigned long now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (unsigned long)tv.tv_sec * 1000000UL + (unsigned long)tv.tv_usec;
}

static void barrier_init(struct barrier *b)
{
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->cond, NULL);
	b->count = 0;
	b->cycle = 0;
}

static void barrier_wait(struct barrier *b, long nthreads)
{
	pthread_mutex_lock(&b->lock);
	unsigned long my_cycle = b->cycle;
	if (++b->count == (unsigned long)nthreads) {
		b->count = 0;
		b->cycle = !b->cycle;
		pthread_cond_broadcast(&b->cond);
	} else {
		while (b->cycle == my_cycle)
			pthread_cond_wait(&b->cond, &b->lock);
	}
	pthread_mutex_unlock(&b->lock);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: water_nsquared < INPUT   (run in a directory holding random.in)\n"
		"  Molecular dynamics of NMOL water molecules in a periodic box (SPLASH-2x\n"
		"  water_nsquared, reimplemented). INPUT holds 10 whitespace-separated fields:\n"
		"  TSTEP NMOL NSTEP NORDER NSAVE NRST NPRINT NFMC NUMPROCS CUTOFF\n"
		"  e.g. '1.5e-16 512 3 6 -1 3000 3 0 2 6.212752' runs 2 threads on 512 molecules.\n"
		"  NMOL must be a perfect cube, NORDER must be 6, 1 <= NUMPROCS <= min(NMOL, 1024).\n"
		"  random.in: 1 + 9*NMOL numbers (the first is skipped) giving raw initial\n"
		"  velocities; make one with: python3 workloads/water_inputs.py SET THREADS DIR.\n"
		"  Command-line arguments other than -h are ignored, as in the original.\n"
		"Exit status: 0 done, 2 bad input, 255 random.in missing or NMOL not a cube.\n");
}

static void die_input(const char *msg)
{
	fprintf(stderr, "water_nsquared: bad input: %s\n", msg);
	exit(2);
}

/* ---- setup ---- */

static void read_parameters(void)
{
	int got = scanf("%lf %ld %ld %ld %ld %ld %ld %ld %ld %lf", &TSTEP, &NMOL, &NSTEP, &NORDER,
			&NSAVE, &NRST, &NPRINT, &NFMC, &NumProcs, &CUTOFF);
	/* The original warns and goes on with uninitialised values; stopping is the documented
	 * deviation the spec allows. */
	if (got != 10) {
		fprintf(stderr, "water_nsquared: the input must have 10 fields (TSTEP NMOL NSTEP "
			"NORDER NSAVE NRST NPRINT NFMC NUMPROCS CUTOFF); read %d\n",
			got < 0 ? 0 : got);
		exit(2);
	}
	if (NMOL < 1)
		die_input("NMOL must be at least 1");
	if (NORDER != NORDER_SUPPORTED)
		die_input("only NORDER = 6 is supported");
	if (NPRINT < 1)
		die_input("NPRINT must be at least 1");
	if (NSTEP < 0)
		die_input("NSTEP must not be negative");
	if (NumProcs < 1 || NumProcs > MAXPROCS || NumProcs > NMOL) {
		fprintf(stderr, "water_nsquared: bad input: NUMPROCS = %ld; it must be between 1 and "
			"min(NMOL = %ld, %d) so that every thread owns a molecule\n",
			NumProcs, NMOL, MAXPROCS);
		exit(2);
	}
	if (!(TSTEP > 0))
		die_input("TSTEP must be positive");
	if (CUTOFF < 0)
		die_input("CUTOFF must not be negative");
}

/* Binomial coefficients for the predictor and the order-6 Gear corrector (spec B.4, B.8). */
static void constants(void)
{
	static const double pcc6[NORDER_SUPPORTED + 1] = {
		863.0 / 6048.0, 665.0 / 1008.0, 1.0, 25.0 / 36.0, 35.0 / 144.0, 1.0 / 24.0, 1.0 / 360.0,
	};

	for (int m = 0; m <= NORDER_SUPPORTED; m++) {
		binom[m][0] = 1.0;
		for (int k = 1; k <= m; k++)
			binom[m][k] = binom[m][k - 1] * (double)(m - k + 1) / (double)k;
	}
	memcpy(PCC, pcc6, sizeof(PCC));
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n);

	if (!p) {
		fprintf(stderr, "water_nsquared: out of memory allocating %zu bytes\n", n);
		exit(1);
	}
	return p;
}

/* Allocation sizes and order are part of the behaviour (spec B.7, "Allocation order"). */
static void allocate(void)
{
	VAR = xmalloc(sizeof(struct molecule) * (size_t)NMOL);
	gl = xmalloc(sizeof(struct global));

	PFORCES = xmalloc(sizeof(double ***) * (size_t)NumProcs);
	for (long p = 0; p < NumProcs; p++) {
		PFORCES[p] = xmalloc(sizeof(double **) * (size_t)NMOL);
		for (long mol = 0; mol < NMOL; mol++) {
			PFORCES[p][mol] = xmalloc(sizeof(double *) * NDIR);
			for (int dir = 0; dir < NDIR; dir++)
				PFORCES[p][mol][dir] = xmalloc(sizeof(double) * NATOMS);
		}
	}

	MolsPerProc = NMOL / NumProcs;
	for (long p = 0; p < NumProcs; p++)
		StartMol[p] = p * MolsPerProc;
	StartMol[NumProcs] = NMOL;
}

static void init_sync(void)
{
	pthread_mutex_t *singles[] = {
		&gl->io_lock, &gl->index_lock, &gl->intraf_vir_lock, &gl->interf_vir_lock, &gl->fx_lock,
		&gl->fy_lock, &gl->fz_lock, &gl->kineti_sum_lock, &gl->poteng_sum_lock,
	};
	long nlocks = NMOL < MAXLCKS ? NMOL : MAXLCKS;

	for (size_t i = 0; i < sizeof(singles) / sizeof(singles[0]); i++)
		pthread_mutex_init(singles[i], NULL);
	/* Only the locks that molecules map to are initialised, so only that part is touched. */
	for (long i = 0; i < nlocks; i++)
		pthread_mutex_init(&gl->mol_lock[i], NULL);
	barrier_init(&gl->start);
	barrier_init(&gl->interf_bar);
	barrier_init(&gl->poteng_bar);
	gl->index = 1;
}

static void derived_quantities(void)
{
	TSTEP = TSTEP / UNITT;
	NATMO = NATOMS * NMOL;
	NATMO3 = NATMO * 3;
	NMOL1 = NMOL - 1;
	FPOT = UNITM * pow(UNITL / UNITT, 2.0) / (BOLTZ * TEMP * (double)NATMO);
	FKIN = FPOT * 0.5 / (TSTEP * TSTEP);
	BOXL = pow((double)NMOL * WTMOL * UNITM / RHO, 1.0 / 3.0) / UNITL;
	BOXH = BOXL * 0.5;
	if (CUTOFF == 0.0)
		CUTOFF = BOXH;
	if (CUTOFF > 11.0)
		CUTOFF = 11.0;
	CUT2 = CUTOFF * CUTOFF;
	REF1 = -QQ / (CUTOFF * CUTOFF * CUTOFF);
	REF2 = 2.0 * REF1;
	REF4 = 2.0 * REF2;
	FHM = 0.5 * TSTEP * TSTEP / HMAS;
	FOM = 0.5 * TSTEP * TSTEP / OMAS;
}

static void print_header(double tstep_input)
{
	printf("Using %ld procs on %ld steps of %ld mols\n", NumProcs, NSTEP, NMOL);
	printf("Other parameters:\n");
	printf("\tTSTEP = %8.2e\n", tstep_input);
	printf("\tNORDER = %ld\n", NORDER);
	printf("\tNSAVE = %ld\n", NSAVE);
	printf("\tNRST = %ld\n", NRST);
	printf("\tNPRINT = %ld\n", NPRINT);
	printf("\tNFMC = %ld\n", NFMC);
	printf("\tCUTOFF = %lf\n\n\n", CUTOFF);
}

static void print_system(void)
{
	printf("%-27s= %8.2f K\n", "TEMPERATURE", TEMP);
	printf("%-27s= %8.5f G/C.C.\n", "DENSITY", RHO);
	printf("%-27s= %8ld\n", "NUMBER OF MOLECULES", NMOL);
	printf("%-27s= %8ld\n", "NUMBER OF PROCESSORS", NumProcs);
	printf("%-27s= %8.2e SEC\n", "TIME STEP", TSTEP);
	printf("%-27s= %8ld \n", "ORDER USED TO SOLVE F=MA", NORDER);
	printf("%-27s= %8ld \n", "NO. OF TIME STEPS", NSTEP);
	printf("%-27s= %8ld \n", "FREQUENCY OF DATA SAVING", NSAVE);
	printf("%-27s= %8ld \n", "FREQUENCY TO WRITE RST FILE", NRST);
	printf("%-27s= %8.4f ANGSTROM\n", "SPHERICAL CUTOFF RADIUS", CUTOFF);
	printf("\n");
}

static double atom_mass(int atom)
{
	return atom == OX ? OMAS : HMAS;
}

/* Lattice positions and normalised random velocities (spec B.8). */
static void initia(void)
{
	FILE *rf = fopen("random.in", "r");

	if (!rf) {
		fprintf(stderr, "Error in opening file random.in\n");
		exit(-1);
	}

	double ns = pow((double)NMOL, 1.0 / 3.0) - 0.00001;
	double xs = BOXL / ns;
	double zero = xs * 0.5;
	double wcos = ROH * cos(ANGLE * 0.5);
	double wsin = ROH * sin(ANGLE * 0.5);

	printf("NS = %.16f\n", ns);
	printf("BOXL = %10f\n", BOXL);
	printf("CUTOFF = %10f\n", CUTOFF);
	printf("XS = %10f\n", xs);
	printf("ZERO = %g\n", zero);
	printf("WCOS = %f\n", wcos);
	printf("WSIN = %f\n", wsin);
	printf("***** NEW RUN STARTING FROM REGULAR LATTICE *****\n");
	fflush(stdout);

	long n = 0;
	for (long i = 0; i < ns; i++)
		n++;
	/* The original overruns VAR before it notices a non-cube; check before writing. */
	if (n * n * n != NMOL) {
		printf("Lattice init error: total mol %ld != NMOL %ld\n", n * n * n, NMOL);
		fflush(stdout);
		exit(-1);
	}

	/* Coordinates by repeated addition of XS, as the original does. */
	double xt = zero;
	for (long i = 0; i < n; i++) {
		double yt = zero;
		for (long j = 0; j < n; j++) {
			double zt = zero;
			for (long k = 0; k < n; k++) {
				struct molecule *m = &VAR[(i * n + j) * n + k];
				double (*d)[NATOMS] = m->f[DISP];

				d[0][OX] = xt;
				d[1][OX] = yt;
				d[2][OX] = zt;
				d[0][H1] = xt + wcos;
				d[1][H1] = yt + wsin;
				d[2][H1] = zt;
				d[0][H2] = xt + wcos;
				d[1][H2] = yt - wsin;
				d[2][H2] = zt;
				zt += xs;
			}
			yt += xs;
		}
		xt += xs;
	}

	double first, sum[NDIR] = { 0, 0, 0 };
	if (fscanf(rf, "%lf", &first) != 1)
		first = 0;
	for (long mol = 0; mol < NMOL; mol++) {
		for (int atom = 0; atom < NATOMS; atom++) {
			for (int dir = 0; dir < NDIR; dir++) {
				double v;

				/* Missing numbers act as 0, like the original's never-written VAR. */
				if (fscanf(rf, "%lf", &v) != 1)
					v = 0.0;
				VAR[mol].f[VEL][dir][atom] = v;
				sum[dir] += v;
			}
			for (int slot = ACC; slot <= NORDER; slot++)
				for (int dir = 0; dir < NDIR; dir++)
					VAR[mol].f[slot][dir][atom] = 0.0;
		}
	}

	double fac = BOLTZ * TEMP * (double)NATMO / UNITM * pow(UNITT * TSTEP / UNITL, 2.0);
	for (int dir = 0; dir < NDIR; dir++) {
		double s = sum[dir] / (double)NATMO, q = 0.0;

		for (long mol = 0; mol < NMOL; mol++) {
			double (*v)[NATOMS] = VAR[mol].f[VEL];
			double h1 = v[dir][H1] - s, o = v[dir][OX] - s, h2 = v[dir][H2] - s;

			q += (h1 * h1 + h2 * h2) / HMAS + o * o / OMAS;
		}
		double scale = sqrt(fac / q);
		for (long mol = 0; mol < NMOL; mol++)
			for (int atom = 0; atom < NATOMS; atom++) {
				double *v = &VAR[mol].f[VEL][dir][atom];

				*v = (*v - s) * scale / atom_mass(atom);
			}
	}
	fclose(rf);
}

/* ---- per-thread work ---- */

/* Minimum-image convention along one axis: if |d| > BOXH, move d by one box towards 0.
 * Branch-free; gives exactly the values of the if/else form. */
static inline double min_image(double d)
{
	return d - BOXL * (double)((d > BOXH) - (d < -BOXH));
}

static void predic(long first, long end)
{
	for (int k = 0; k < NORDER; k++)
		for (long mol = first; mol < end; mol++)
			for (int dir = 0; dir < NDIR; dir++)
				for (int atom = 0; atom < NATOMS; atom++) {
					double (*f)[NDIR][NATOMS] = VAR[mol].f;
					double s = 0.0;

					for (int m = k + 1; m <= NORDER; m++)
						s += binom[m][k] * f[m][dir][atom];
					f[k][dir][atom] += s;
				}
}

static void correc(long first, long end)
{
	for (long mol = first; mol < end; mol++)
		for (int dir = 0; dir < NDIR; dir++)
			for (int atom = 0; atom < NATOMS; atom++) {
				double (*f)[NDIR][NATOMS] = VAR[mol].f;
				double y = f[FORCES][dir][atom] - f[ACC][dir][atom];

				for (int s = 0; s <= NORDER; s++)
					f[s][dir][atom] += PCC[s] * y;
			}
}

/* Bond and angle geometry of one molecule; also stores its M site. */
struct geometry {
	double e1[NDIR], e2[NDIR];	/* unit vectors H1->O and H2->O */
	double r1, r2, cos_t, sin_t;
	double a, b, t;			/* DR1, DR2, DT */
};

static void molecule_geometry(struct molecule *m, struct geometry *g)
{
	double (*d)[NATOMS] = m->f[DISP];
	double u1[NDIR], u2[NDIR], dot = 0.0, r1s = 0.0, r2s = 0.0;

	for (int dir = 0; dir < NDIR; dir++) {
		m->vm[dir] = C1 * d[dir][OX] + C2 * (d[dir][H1] + d[dir][H2]);
		u1[dir] = d[dir][OX] - d[dir][H1];
		u2[dir] = d[dir][OX] - d[dir][H2];
		r1s += u1[dir] * u1[dir];
		r2s += u2[dir] * u2[dir];
		dot += u1[dir] * u2[dir];
	}
	g->r1 = sqrt(r1s);
	g->r2 = sqrt(r2s);
	g->cos_t = dot / (g->r1 * g->r2);
	g->sin_t = sqrt(1.0 - g->cos_t * g->cos_t);
	g->t = (acos(g->cos_t) - ANGLE) * ROH;
	g->a = g->r1 - ROH;
	g->b = g->r2 - ROH;
	for (int dir = 0; dir < NDIR; dir++) {
		g->e1[dir] = u1[dir] / g->r1;
		g->e2[dir] = u2[dir] / g->r2;
	}
}

/* Generalised bond force for the bond whose stretch is a (the other is b). */
static double bond_force(double a, double b, double t)
{
	const double rho = ROH, rho2 = ROH * ROH;

	return FC11 * a + FC12 * b + FC13 * t +
	       (3.0 * FC111 * a * a + FC112 * (2.0 * a + b) * b + 2.0 * FC113 * a * t +
		FC123 * b * t + FC133 * t * t) / rho +
	       (4.0 * FC1111 * a * a * a + FC1112 * (3.0 * a * a + b * b) * b +
		2.0 * FC1122 * a * b * b + 3.0 * FC1113 * a * a * t +
		FC1123 * (2.0 * a + b) * b * t +
		(2.0 * FC1133 * a + FC1233 * b + FC1333 * t) * t * t) / rho2;
}

static double angle_force(double a, double b, double t)
{
	const double rho = ROH, rho2 = ROH * ROH;

	return FC33 * t + FC13 * (a + b) +
	       (3.0 * FC333 * t * t + FC113 * (a * a + b * b) + FC123 * a * b +
		2.0 * FC133 * (a + b) * t) / rho +
	       (4.0 * FC3333 * t * t * t + FC1113 * (a * a * a + b * b * b) +
		FC1123 * (a + b) * a * b + 2.0 * FC1133 * (a * a + b * b) * t +
		2.0 * FC1233 * a * b * t + 3.0 * FC1333 * (a + b) * t * t) / rho2;
}

static void intraf(long first, long end)
{
	for (long mol = first; mol < end; mol++) {
		struct molecule *m = &VAR[mol];
		struct geometry g;

		molecule_geometry(m, &g);
		double f1 = bond_force(g.a, g.b, g.t);
		double f2 = angle_force(g.a, g.b, g.t);
		double f3 = bond_force(g.b, g.a, g.t);
		double k1 = ROH / (g.r1 * g.sin_t), k3 = ROH / (g.r2 * g.sin_t);

		for (int dir = 0; dir < NDIR; dir++) {
			double g1 = (-g.e2[dir] + g.e1[dir] * g.cos_t) * k1;
			double g3 = (-g.e1[dir] + g.e2[dir] * g.cos_t) * k3;
			double h1 = f1 * g.e1[dir] + f2 * g1;
			double h2 = f3 * g.e2[dir] + f2 * g3;

			m->f[FORCES][dir][H1] = h1;
			m->f[FORCES][dir][H2] = h2;
			m->f[FORCES][dir][OX] = -(h1 + h2);
		}
	}

	double lvir = 0.0;
	for (long mol = first; mol < end; mol++)
		for (int dir = 0; dir < NDIR; dir++)
			for (int atom = 0; atom < NATOMS; atom++)
				lvir += VAR[mol].f[DISP][dir][atom] * VAR[mol].f[FORCES][dir][atom];
	pthread_mutex_lock(&gl->intraf_vir_lock);
	gl->vir += lvir;
	pthread_mutex_unlock(&gl->intraf_vir_lock);
}

/* Site pairs K = 0..13 (spec B.13): which site of A and which of B. Sites: H1, O, H2, M. */
enum { S_H1 = 0, S_O = 1, S_H2 = 2, S_M = 3 };
static const int site_a[14] = { S_M, S_M, S_M, S_H1, S_H2, S_H1, S_H1, S_H2, S_H2,
				S_O, S_O, S_O, S_H1, S_H2 };
static const int site_b[14] = { S_M, S_H1, S_H2, S_M, S_M, S_H1, S_H2, S_H1, S_H2,
				S_O, S_H1, S_H2, S_O, S_O };

/* The four sites of a molecule, [site][dir]: the 96 bytes VM + DISP that the pair loops read. */
struct sites {
	double s[4][NDIR];
};

static inline void load_sites(const struct molecule *m, struct sites *out)
{
	for (int dir = 0; dir < NDIR; dir++) {
		out->s[S_H1][dir] = m->f[DISP][dir][H1];
		out->s[S_O][dir] = m->f[DISP][dir][OX];
		out->s[S_H2][dir] = m->f[DISP][dir][H2];
		out->s[S_M][dir] = m->vm[dir];
	}
}

/*
 * Minimum-image separation vectors of the 14 site pairs of (a, b) and the squared lengths of the
 * first 9. Returns KC, how many of those 9 lie beyond the cutoff.
 */
static inline int pair_separations(const struct sites *a, const struct sites *b,
				   double d[14][NDIR], double rs[14])
{
	int kc = 0;

#pragma GCC unroll 14
	for (int k = 0; k < 14; k++)
		for (int dir = 0; dir < NDIR; dir++)
			d[k][dir] = min_image(a->s[site_a[k]][dir] - b->s[site_b[k]][dir]);
#pragma GCC unroll 9
	for (int k = 0; k < 9; k++) {
		rs[k] = d[k][0] * d[k][0] + d[k][1] * d[k][1] + d[k][2] * d[k][2];
		kc += rs[k] > CUT2;
	}
	return kc;
}

static inline double norm2(const double v[NDIR])
{
	return v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
}

/* Last partner index (before wrap-around) of molecule mol in the pair enumeration. */
static inline long last_partner(long mol)
{
	long half = NMOL / 2, last = mol + half;

	if (NMOL % 2 == 0) {
		if (mol >= half && mol % 2 == 0)
			last--;
		if (mol < half && last % 2 == 1)
			last--;
	}
	return last;
}

static void interf(long p, long first, long end, int dest)
{
	double ***pf = PFORCES[p];
	double lvir = 0.0;
	unsigned long examined = 0, interacting = 0;
	long last = first;

	for (long mol = 0; mol < NMOL; mol++)
		for (int dir = 0; dir < NDIR; dir++)
			for (int atom = 0; atom < NATOMS; atom++)
				pf[mol][dir][atom] = 0.0;

	for (long mol = first; mol < end; mol++) {
		struct sites a;

		load_sites(&VAR[mol], &a);
		last = last_partner(mol);
		for (long c = mol + 1; c <= last; c++) {
			long comp = c <= NMOL1 ? c : c % NMOL;
			struct sites b;
			double d[14][NDIR], rs[14], rl[14], ff[14] = { 0 };

			load_sites(&VAR[comp], &b);
			examined++;
			int kc = pair_separations(&a, &b, d, rs);
			if (kc == 9)
				continue;
			interacting++;

			if (rs[0] < CUT2) {
				ff[0] = QQ4 / (rs[0] * sqrt(rs[0])) + REF4;
				lvir += ff[0] * rs[0];
			}
			for (int k = 1; k <= 4; k++)
				if (rs[k] < CUT2) {
					ff[k] = -QQ2 / (rs[k] * sqrt(rs[k])) - REF2;
					lvir += ff[k] * rs[k];
				}
			for (int k = 5; k <= 8; k++)
				if (rs[k] <= CUT2) {
					rl[k] = sqrt(rs[k]);
					ff[k] = QQ / (rs[k] * rl[k]) + REF1;
					lvir += ff[k] * rs[k];
				}
			if (kc == 0) {
				rs[9] = norm2(d[9]);
				rl[9] = sqrt(rs[9]);
				ff[9] = AB1 * exp(-B1 * rl[9]) / rl[9];
				lvir += ff[9] * rs[9];
				for (int k = 10; k <= 13; k++) {
					int h = k - 5;
					double hh = AB2 * exp(-B2 * rl[h]) / rl[h];

					ff[h] += hh;
					lvir += hh * rs[h];
					rs[k] = norm2(d[k]);
					rl[k] = sqrt(rs[k]);
					ff[k] = (AB3 * exp(-B3 * rl[k]) - AB4 * exp(-B4 * rl[k])) / rl[k];
					lvir += ff[k] * rs[k];
				}
			}

			double **fa = pf[mol], **fb = pf[comp];
			for (int dir = 0; dir < NDIR; dir++) {
				double g[14];

				for (int k = 0; k < 14; k++)
					g[k] = ff[k] * d[k][dir];
				double ma = g[0] + g[1] + g[2];
				double mb = g[0] + g[3] + g[4];

				fa[dir][H1] += g[5] + g[6] + g[12] + g[3] + C2 * ma;
				fa[dir][OX] += g[9] + g[10] + g[11] + C1 * ma;
				fa[dir][H2] += g[7] + g[8] + g[13] + g[4] + C2 * ma;
				fb[dir][H1] -= g[5] + g[7] + g[10] + g[1] + C2 * mb;
				fb[dir][OX] -= g[9] + g[12] + g[13] + C1 * mb;
				fb[dir][H2] -= g[6] + g[8] + g[11] + g[2] + C2 * mb;
			}
		}
	}
	pairs_examined[p] += examined;
	pairs_interacting[p] += interacting;

	pthread_mutex_lock(&gl->interf_vir_lock);
	gl->vir += lvir;
	pthread_mutex_unlock(&gl->interf_vir_lock);

	/* Add this thread's rows into the shared array: first .. last, with wrap-around. */
	long ranges[2][2];
	int nranges;
	if (last > NMOL1) {
		long wrap_end = last % NMOL;

		if (wrap_end > first - 1)
			wrap_end = first - 1;
		ranges[0][0] = first;
		ranges[0][1] = NMOL1;
		ranges[1][0] = 0;
		ranges[1][1] = wrap_end;
		nranges = 2;
	} else {
		ranges[0][0] = first;
		ranges[0][1] = last;
		nranges = 1;
	}
	for (int r = 0; r < nranges; r++)
		for (long mol = ranges[r][0]; mol <= ranges[r][1]; mol++) {
			pthread_mutex_t *lock = &gl->mol_lock[mol % MAXLCKS];

			pthread_mutex_lock(lock);
			for (int dir = 0; dir < NDIR; dir++)
				for (int atom = 0; atom < NATOMS; atom++)
					VAR[mol].f[dest][dir][atom] += pf[mol][dir][atom];
			pthread_mutex_unlock(lock);
		}

	barrier_wait(&gl->interf_bar, NumProcs);

	for (long mol = first; mol < end; mol++)
		for (int dir = 0; dir < NDIR; dir++) {
			VAR[mol].f[dest][dir][H1] *= FHM;
			VAR[mol].f[dest][dir][OX] *= FOM;
			VAR[mol].f[dest][dir][H2] *= FHM;
		}
}

static void bndry(long first, long end)
{
	for (long mol = first; mol < end; mol++)
		for (int dir = 0; dir < NDIR; dir++) {
			double (*d)[NATOMS] = VAR[mol].f[DISP];

			if (d[dir][OX] > BOXL) {
				d[dir][H1] -= BOXL;
				d[dir][OX] -= BOXL;
				d[dir][H2] -= BOXL;
			} else if (d[dir][OX] < 0.0) {
				d[dir][H1] += BOXL;
				d[dir][OX] += BOXL;
				d[dir][H2] += BOXL;
			}
		}
}

static void kineti(long first, long end)
{
	double s[NDIR];

	for (int dir = 0; dir < NDIR; dir++) {
		s[dir] = 0.0;
		for (long mol = first; mol < end; mol++) {
			double (*v)[NATOMS] = VAR[mol].f[VEL];

			s[dir] += (v[dir][H1] * v[dir][H1] + v[dir][H2] * v[dir][H2]) * HMAS +
				  v[dir][OX] * v[dir][OX] * OMAS;
		}
	}
	pthread_mutex_lock(&gl->kineti_sum_lock);
	for (int dir = 0; dir < NDIR; dir++)
		gl->sum[dir] += s[dir];
	pthread_mutex_unlock(&gl->kineti_sum_lock);
}

static void poteng(long first, long end)
{
	double lpota = 0.0, lpotr = 0.0, lptrf = 0.0;
	const double rho = ROH, rho2 = ROH * ROH;

	for (long mol = first; mol < end; mol++) {
		struct geometry g;

		molecule_geometry(&VAR[mol], &g);
		double a = g.a, b = g.b, t = g.t, s = a + b;
		double a2 = a * a, b2 = b * b, t2 = t * t;

		lpota += 0.5 * (FC11 * (a2 + b2) + FC33 * t2) + FC12 * a * b + FC13 * s * t +
			 (FC111 * (a2 * a + b2 * b) + FC333 * t2 * t + FC112 * s * a * b +
			  FC113 * (a2 + b2) * t + FC123 * a * b * t + FC133 * s * t2) / rho +
			 (FC1111 * (a2 * a2 + b2 * b2) + FC3333 * t2 * t2 +
			  FC1112 * (a2 + b2) * a * b + FC1122 * a2 * b2 +
			  FC1113 * (a2 * a + b2 * b) * t + FC1123 * s * a * b * t +
			  FC1133 * (a2 + b2) * t2 + FC1233 * a * b * t2 + FC1333 * s * t2 * t) / rho2;
	}

	barrier_wait(&gl->poteng_bar, NumProcs);

	for (long mol = first; mol < end; mol++) {
		struct sites a;
		long last = last_partner(mol);

		load_sites(&VAR[mol], &a);
		for (long c = mol + 1; c <= last; c++) {
			long comp = c <= NMOL1 ? c : c % NMOL;
			struct sites b;
			double d[14][NDIR], rs[14], rl[14];

			load_sites(&VAR[comp], &b);
			int kc = pair_separations(&a, &b, d, rs);
			if (kc == 9)
				continue;
			for (int k = 0; k < 9; k++) {
				if (rs[k] <= CUT2) {
					rl[k] = sqrt(rs[k]);
				} else {
					rl[k] = CUTOFF;
					rs[k] = CUT2;
				}
			}
			lpotr += QQ4 / rl[0] - QQ2 * (1.0 / rl[1] + 1.0 / rl[2] + 1.0 / rl[3] + 1.0 / rl[4]) +
				 QQ * (1.0 / rl[5] + 1.0 / rl[6] + 1.0 / rl[7] + 1.0 / rl[8]);
			lptrf += -REF2 * rs[0] -
				 REF1 * (0.5 * (rs[5] + rs[6] + rs[7] + rs[8]) - rs[1] - rs[2] - rs[3] - rs[4]);
			if (kc == 0) {
				for (int k = 9; k < 14; k++)
					rl[k] = sqrt(norm2(d[k]));
				lpotr += A1 * exp(-B1 * rl[9]) +
					 A2 * (exp(-B2 * rl[5]) + exp(-B2 * rl[6]) + exp(-B2 * rl[7]) +
					       exp(-B2 * rl[8])) +
					 A3 * (exp(-B3 * rl[10]) + exp(-B3 * rl[11]) + exp(-B3 * rl[12]) +
					       exp(-B3 * rl[13])) -
					 A4 * (exp(-B4 * rl[10]) + exp(-B4 * rl[11]) + exp(-B4 * rl[12]) +
					       exp(-B4 * rl[13]));
			}
		}
	}
	pthread_mutex_lock(&gl->poteng_sum_lock);
	gl->pota += lpota;
	gl->potr += lpotr;
	gl->potrf += lptrf;
	pthread_mutex_unlock(&gl->poteng_sum_lock);
}

/* The time-step loop every thread runs (spec B.10). */
static void *mdmain(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&gl->index_lock);
	long p = gl->index++ % NumProcs;
	pthread_mutex_unlock(&gl->index_lock);

	long first = StartMol[p], end = StartMol[p + 1];
	double tkin = 0.0, tvir = 0.0, ttmv = 0.0, xtt = 0.0;

	/* Initial acceleration: intermolecular forces only; INTRAF's result in FORCES is
	 * overwritten by the first step's INTRAF (reproduced on purpose). */
	intraf(first, end);
	barrier_wait(&gl->start, NumProcs);
	interf(p, first, end, ACC);
	barrier_wait(&gl->start, NumProcs);

	for (long step = 1; step <= NSTEP; step++) {
		ttmv += 1.0;
		int timed = step > 1 && p == 0;

		if (p == 0) {
			gl->vir = 0.0;
			gl->pota = gl->potr = gl->potrf = 0.0;
			gl->sum[0] = gl->sum[1] = gl->sum[2] = 0.0;
			if (timed)
				gl->trackstart = now_us();
		}
		barrier_wait(&gl->start, NumProcs);

		predic(first, end);
		intraf(first, end);
		barrier_wait(&gl->start, NumProcs);
		if (timed)
			gl->intraend = now_us();

		interf(p, first, end, FORCES);
		if (timed)
			gl->interend = now_us();

		correc(first, end);
		bndry(first, end);
		kineti(first, end);
		barrier_wait(&gl->start, NumProcs);

		tkin += gl->sum[0] + gl->sum[1] + gl->sum[2];
		tvir -= gl->vir;

		if (step % NPRINT == 0 || (NSAVE > 0 && step % NSAVE == 0)) {
			poteng(first, end);
			barrier_wait(&gl->start, NumProcs);

			double pota = gl->pota * FPOT, potr = gl->potr * FPOT, potrf = gl->potrf * FPOT;
			double xvir = tvir * FPOT * 0.5 / ttmv;
			double avgt = tkin * FKIN * TEMP * 2.0 / (3.0 * ttmv);
			double ten = (gl->sum[0] + gl->sum[1] + gl->sum[2]) * FKIN;

			xtt = pota + potr + potrf + ten;
			if (step % NPRINT == 0 && p == 0) {
				printf("     %5ld TEN %14.5lf POTA %12.5lf POTR %12.5lf"
				       "                  POTRF %12.5lf\n",
				       step, ten, pota, potr, potrf);
				printf(" XTT %16.3lf AVGT %16.5lf XVIR %16.5lf\n", xtt, avgt, xvir);
				fflush(stdout);
			}
		}
		barrier_wait(&gl->start, NumProcs);

		if (timed) {
			unsigned long t = now_us();

			gl->tracktime += t - gl->trackstart;
			gl->intratime += gl->intraend - gl->trackstart;
			gl->intertime += gl->interend - gl->intraend;
			gl->steps_timed++;
		}
	}
	if (p == 0)
		final_xtt = xtt;
	return NULL;
}

/* Lowest and highest address (end exclusive) of thread p's PFORCES nodes and leaves. */
static void pforces_span(long p, uintptr_t *lo, uintptr_t *hi)
{
	*lo = UINTPTR_MAX;
	*hi = 0;
	for (long mol = 0; mol < NMOL; mol++) {
		uintptr_t node = (uintptr_t)PFORCES[p][mol];

		if (node < *lo)
			*lo = node;
		if (node + 3 * sizeof(double *) > *hi)
			*hi = node + 3 * sizeof(double *);
		for (int dir = 0; dir < NDIR; dir++) {
			uintptr_t leaf = (uintptr_t)PFORCES[p][mol][dir];

			if (leaf < *lo)
				*lo = leaf;
			if (leaf + NATOMS * sizeof(double) > *hi)
				*hi = leaf + NATOMS * sizeof(double);
		}
	}
}

static void print_layout(void)
{
	fprintf(stderr, "{\"event\":\"layout\",\"pid\":%ld,\"nmol\":%ld,\"threads\":%ld,"
		"\"VAR\":{\"start\":%lu,\"end\":%lu},\"gl\":{\"start\":%lu,\"end\":%lu},"
		"\"pforces\":[", (long)getpid(), NMOL, NumProcs,
		(unsigned long)(uintptr_t)VAR, (unsigned long)(uintptr_t)(VAR + NMOL),
		(unsigned long)(uintptr_t)gl, (unsigned long)(uintptr_t)(gl + 1));
	for (long p = 0; p < NumProcs; p++) {
		uintptr_t lo, hi, table = (uintptr_t)PFORCES[p];

		pforces_span(p, &lo, &hi);
		fprintf(stderr, "%s{\"thread\":%ld,\"table\":{\"start\":%lu,\"end\":%lu},"
			"\"nodes\":{\"start\":%lu,\"end\":%lu}}", p ? "," : "", p,
			(unsigned long)table, (unsigned long)(table + NMOL * sizeof(double **)),
			(unsigned long)lo, (unsigned long)hi);
	}
	fprintf(stderr, "]}\n");
	fflush(stderr);
}

/* Weighted sums of final positions and velocities, for comparing runs. */
static void print_checksum(void)
{
	double disp = 0.0, vel = 0.0;
	unsigned long idx = 0;

	for (long mol = 0; mol < NMOL; mol++)
		for (int dir = 0; dir < NDIR; dir++)
			for (int atom = 0; atom < NATOMS; atom++, idx++) {
				double w = (double)(idx % 7 + 1);

				disp += w * VAR[mol].f[DISP][dir][atom];
				vel += w * VAR[mol].f[VEL][dir][atom];
			}
	printf("Checksum: DISP %.10e VEL %.10e\n", disp, vel);
}

int main(int argc, char **argv)
{
	static pthread_t threads[MAXPROCS];

	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "-H") == 0)) {
		usage(stdout);
		return 0;
	}

	read_parameters();
	double tstep_input = TSTEP;
	print_header(tstep_input);
	if (NMOL > MAXLCKS)
		fprintf(stderr, "water_nsquared: warning: %ld molecules share %d locks; expect lock "
			"contention\n", NMOL, MAXLCKS);

	constants();
	allocate();
	init_sync();
	derived_quantities();
	print_system();
	initia();
	int json_report = getenv("WATER_NSQUARED_JSON") != NULL;
	if (json_report)
		print_layout();

	gl->computestart = now_us();
	for (long i = 1; i < NumProcs; i++) {
		int err = pthread_create(&threads[i], NULL, mdmain, NULL);

		if (err) {
			fprintf(stderr, "water_nsquared: cannot start thread %ld of %ld: %s\n", i + 1,
				NumProcs, strerror(err));
			exit(1);
		}
	}
	mdmain(NULL);
	for (long i = 1; i < NumProcs; i++)
		pthread_join(threads[i], NULL);
	gl->computeend = now_us();
	gl->computetime = gl->computeend - gl->computestart;
	gl->othertime = gl->tracktime - gl->intratime - gl->intertime;

	printf("COMPUTESTART (after initialization) = %lu\n", gl->computestart);
	printf("COMPUTEEND = %lu\n", gl->computeend);
	printf("COMPUTETIME (after initialization) = %lu\n", gl->computetime);
	printf("Measured Time (2nd timestep onward) = %lu\n", gl->tracktime);
	printf("Intramolecular time only (2nd timestep onward) = %lu\n", gl->intratime);
	printf("Intermolecular time only (2nd timestep onward) = %lu\n", gl->intertime);
	printf("Other time (2nd timestep onward) = %lu\n", gl->othertime);
	printf("\nExited Happily with XTT = %g (XTT is not meaningful when NPRINT > NSTEP)\n",
	       final_xtt);
	print_checksum();

	if (json_report) {
		unsigned long ex = 0, in = 0;

		for (long p = 0; p < NumProcs; p++) {
			ex += pairs_examined[p];
			in += pairs_interacting[p];
		}
		fprintf(stderr, "{\"event\":\"stats\",\"interf_calls\":%ld,\"pairs_examined\":%lu,"
			"\"pairs_interacting\":%lu}\n", NSTEP + 1, ex, in);
	}
	return 0;
}
