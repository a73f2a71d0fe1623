/*
 * What one journal batch's write(2) costs the writing thread, by how the
 * segment file is written: buffered appends (what the journal does),
 * buffered appends into space reserved with fallocate(FALLOC_FL_KEEP_SIZE),
 * and O_DIRECT. Records are 144 bytes (a hit's record on disk), written in
 * batches of 128 KiB (about what the journal's writer takes at a time at
 * full hit rate), fdatasync every 2 MiB; the batches are filled either by
 * the writing thread itself ("warm") or by a thread on the other CPU just
 * before ("cold", as the daemon's drain fills the journal's queue).
 *
 *   cc -O2 -pthread -o /tmp/jwm docs/experiments/journal-write-modes.c
 *   for r in 1 2 3; do for c in 0 1; do for m in 0 1 3; do
 *     /tmp/jwm $m 400000 /var/tmp/jwm.dat $c; done; done; done
 *
 * Prints the writing thread's CPU time (CLOCK_THREAD_CPUTIME_ID, around
 * the writes and syncs only) per 144-byte record, then the part of it in
 * the writes and in the syncs, and the pages the machine's allocating
 * tasks reclaimed meanwhile (pgsteal_direct of /proc/vmstat: a write that
 * has to free page cache to get a page costs many times more).
 *
 * Modes 4-8 write the same batches through a shared mapping of the
 * segment instead: the file is given its whole length first with
 * fallocate(mode 0) (blocks allocated, so a full disk fails there and not
 * as a SIGBUS on a store), mapped MAP_SHARED, and each batch memcpy'd into
 * the mapping. Every 2 MiB the range written since the last sync is made
 * durable:
 *   4  mapping, pages faulted in by the memcpy, msync(MS_SYNC) of the range
 *   5  mapping, the next 2 MiB pre-faulted with madvise(MADV_POPULATE_WRITE)
 *      when the writer enters a 2 MiB chunk, msync(MS_SYNC) of the range
 *   6  as 5, with fdatasync(fd) instead of msync
 *   7  as 4, with fdatasync(fd) instead of msync
 *   8  as 5, the pre-faulting done by a thread on the other CPU, kept
 *      2-4 MiB ahead of the writer (which waits for it if it is behind);
 *      its CPU is printed on a line of its own and as "populate"
 * The line printed then splits the writer's CPU into the copy (with its
 * page faults in modes 4 and 7), the madvise pre-faulting and the syncs,
 * and counts the thread's minor faults. After each batch (outside the
 * timing) another descriptor of the file reads the batch's last record
 * back with pread(2) and compares it with what was copied into the mapping
 * (coherence, before any msync); at the end the file's size and the
 * bytes after the last record are reported.
 *
 *   uptime; for r in 1 2 3; do for c in 0 1; do for m in 0 1 3 4 5 6 7 8; do
 *     /tmp/jwm $m 400000 /var/tmp/jwm.dat $c; done; done; done; uptime
 *
 * What a crash leaves for the journal's recovery when the segment was
 * preallocated: `jwm segment FILE RECORDS SIZE` writes a segment in the
 * journal's format, RECORDS valid records and zeros up to SIZE; the
 * daemon's start then scans it (the time from exec to "journal opened" in
 * its log, against the same records without the zeros):
 *
 *   for r in 1 2 3; do for size in 67108864 0; do
 *     rm -rf /var/tmp/jr; mkdir -p -m 700 /var/tmp/jr/state/journal
 *     /tmp/jwm segment /var/tmp/jr/state/journal/00000000000000000001.wpj 100000 $size
 *     cat /proc/sys/kernel/random/uuid > /var/tmp/jr/state/journal/id
 *     chmod -R go-rwx /var/tmp/jr/state; date +%T.%N
 *     target/release/wpd --listen unix:/var/tmp/jr/wpd.sock \
 *       --state-dir /var/tmp/jr/state > /var/tmp/jr/log 2>&1 & p=$!
 *     sleep 3; kill $p; grep -E 'torn|journal opened' /var/tmp/jr/log
 *     ls -l /var/tmp/jr/state/journal; done; done; rm -rf /var/tmp/jr
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define NB 8
static const size_t batch = 128 * 1024;
static const size_t chunk = 2 << 20;
static char *bufs[NB];
static pthread_barrier_t barrier;
static long rounds;
static int cold;

static void pin(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *fill(void *arg)
{
	(void)arg;
	pin(cold ? 0 : 1);
	for (long r = 0; r < rounds; r++) {
		for (int i = 0; i < NB; i++)
			memset(bufs[i], (int)(r + i), batch);
		pthread_barrier_wait(&barrier);
		pthread_barrier_wait(&barrier);
	}
	return NULL;
}

static double thread_cpu(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static long thread_minflt(void);

/* Mode 8: a thread on the other CPU keeps the mapping faulted in ahead of
 * the writer. Guarded by pm. */
static pthread_mutex_t pm = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pc = PTHREAD_COND_INITIALIZER;
static char *pmap;
static size_t pmaplen, prefaulted, pwanted;
static int pdone;
static double helper_cpu;
static long helper_faults;

static void *prefault(void *arg)
{
	(void)arg;
	pin(0);
	double c0 = thread_cpu();
	long f0 = thread_minflt();
	pthread_mutex_lock(&pm);
	for (;;) {
		while (!pdone && prefaulted >= pwanted + 2 * chunk)
			pthread_cond_wait(&pc, &pm);
		if (pdone || prefaulted >= pmaplen)
			break;
		size_t at = prefaulted;
		pthread_mutex_unlock(&pm);
		if (madvise(pmap + at, chunk, MADV_POPULATE_WRITE)) {
			perror("madvise");
			exit(1);
		}
		pthread_mutex_lock(&pm);
		prefaulted = at + chunk;
		pthread_cond_broadcast(&pc);
	}
	pthread_mutex_unlock(&pm);
	helper_cpu = thread_cpu() - c0;
	helper_faults = thread_minflt() - f0;
	return NULL;
}

/* Pages reclaimed by allocating tasks, machine-wide (/proc/vmstat). */
static long direct_reclaim(void)
{
	FILE *f = fopen("/proc/vmstat", "r");
	char name[64];
	long v, sum = 0;
	while (f && fscanf(f, "%63s %ld", name, &v) == 2)
		if (strcmp(name, "pgsteal_direct") == 0)
			sum += v;
	if (f)
		fclose(f);
	return sum;
}

/* CRC-32 (IEEE, what the journal's records carry). */
static uint32_t crc32(const unsigned char *p, size_t n)
{
	uint32_t c = 0xffffffffu;
	while (n--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0xedb88320u & -(c & 1));
	}
	return ~c;
}

/* A segment in the journal's format (daemon/src/journal/segment.rs): the
 * header, `records` records of a 120-byte payload (144 bytes each), sequence
 * numbers from 1, then zeros up to `size` bytes: what a segment written
 * through a preallocated mapping holds after a crash. */
static int make_segment(const char *path, long records, long size)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return 1;
	unsigned char rec[144];
	fwrite("WPDJRNL1\1\0\0\0\0\0\0\0", 1, 16, f);
	for (uint64_t seq = 1; seq <= (uint64_t)records; seq++) {
		uint32_t len = 120;
		uint64_t t = 1796000000000000000ull + seq;
		memcpy(rec + 8, &seq, 8);
		memcpy(rec + 16, &t, 8);
		for (int i = 0; i < 120; i++)
			rec[24 + i] = (unsigned char)(seq + (uint64_t)i);
		uint32_t crc = crc32(rec + 8, 136);
		memcpy(rec, &len, 4);
		memcpy(rec + 4, &crc, 4);
		fwrite(rec, 1, sizeof rec, f);
	}
	long written = ftell(f);
	if (fclose(f) || (size > written && truncate(path, size)))
		return 1;
	printf("%s: %ld bytes of records, %ld bytes in all\n", path, written,
	       size > written ? size : written);
	return 0;
}

static long thread_minflt(void)
{
	struct rusage u;
	getrusage(RUSAGE_THREAD, &u);
	return u.ru_minflt;
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "segment") == 0)
		return make_segment(argv[2], atol(argv[3]), atol(argv[4]));
	if (argc != 5) {
		fprintf(stderr, "usage: %s MODE(0 buffered, 1 fallocate, 3 O_DIRECT, "
				"4-8 mapping: see the source) RECORDS FILE COLD(0|1)\n"
				"       %s segment FILE RECORDS SIZE\n",
			argv[0], argv[0]);
		return 2;
	}
	int mode = atoi(argv[1]);
	long records = atol(argv[2]);
	const char *path = argv[3];
	cold = atoi(argv[4]);
	rounds = records * 144 / batch / NB;
	int mapped = mode >= 4 && mode <= 8;
	int populate = mode == 5 || mode == 6;
	int use_msync = mode == 4 || mode == 5 || mode == 8;
	for (int i = 0; i < NB; i++)
		if (posix_memalign((void **)&bufs[i], 4096, batch))
			return 1;
	unlink(path);
	int flags = (mapped ? O_RDWR : O_WRONLY) | O_CREAT | O_TRUNC | (mode == 3 ? O_DIRECT : 0);
	int fd = open(path, flags, 0600);
	if (fd < 0) {
		perror("open");
		return 1;
	}
	if (mode == 1 && fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 128 << 20)) {
		perror("fallocate");
		return 1;
	}
	size_t total = (size_t)rounds * NB * batch;
	size_t maplen = (total + chunk - 1) / chunk * chunk + chunk;
	char *map = NULL;
	int rfd = -1;
	if (mapped) {
		if (fallocate(fd, 0, 0, (off_t)maplen)) {
			perror("fallocate");
			return 1;
		}
		map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (map == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
		rfd = open(path, O_RDONLY);
	}
	pin(1);
	pthread_barrier_init(&barrier, NULL, 2);
	pthread_t filler, helper;
	pthread_create(&filler, NULL, fill, NULL);
	long stalls = 0;
	if (mode == 8) {
		pmap = map;
		pmaplen = maplen;
		pthread_create(&helper, NULL, prefault, NULL);
	}
	double spent = 0, t_copy = 0, t_pop = 0, t_sync = 0;
	long flt0 = thread_minflt();
	long reclaim0 = direct_reclaim();
	long incoherent = 0;
	off_t off = 0, synced = 0;
	size_t populated = 0;
	if (populate) {
		double t0 = thread_cpu();
		if (madvise(map, chunk, MADV_POPULATE_WRITE)) {
			perror("madvise");
			return 1;
		}
		populated = chunk;
		t_pop += thread_cpu() - t0;
		spent += thread_cpu() - t0;
	}
	for (long r = 0; r < rounds; r++) {
		pthread_barrier_wait(&barrier);
		double t0 = thread_cpu();
		for (int i = 0; i < NB; i++) {
			if (!mapped) {
				double c0 = thread_cpu();
				if (pwrite(fd, bufs[i], batch, off) != (ssize_t)batch) {
					perror("pwrite");
					return 1;
				}
				t_copy += thread_cpu() - c0;
			} else {
				if (populate && (size_t)off + batch + chunk > populated &&
				    populated < maplen) {
					/* Entering the last populated chunk: fault the next one in. */
					double p0 = thread_cpu();
					if (madvise(map + populated, chunk, MADV_POPULATE_WRITE)) {
						perror("madvise");
						return 1;
					}
					populated += chunk;
					t_pop += thread_cpu() - p0;
				}
				if (mode == 8) {
					pthread_mutex_lock(&pm);
					pwanted = (size_t)off + batch;
					pthread_cond_broadcast(&pc);
					if (prefaulted < pwanted)
						stalls++;
					while (prefaulted < pwanted)
						pthread_cond_wait(&pc, &pm);
					pthread_mutex_unlock(&pm);
				}
				double c0 = thread_cpu();
				memcpy(map + off, bufs[i], batch);
				t_copy += thread_cpu() - c0;
			}
			off += batch;
		}
		if (r % 2 == 1) {
			double s0 = thread_cpu();
			if (use_msync) {
				off_t from = synced & ~(off_t)4095;
				if (msync(map + from, (size_t)(off - from), MS_SYNC)) {
					perror("msync");
					return 1;
				}
			} else {
				fdatasync(fd);
			}
			synced = off;
			t_sync += thread_cpu() - s0;
		}
		spent += thread_cpu() - t0;
		if (mapped) {
			char rec[144];
			if (pread(rfd, rec, sizeof rec, off - 144) != 144 ||
			    memcmp(rec, map + off - 144, 144) != 0 ||
			    memcmp(rec, bufs[NB - 1] + batch - 144, 144) != 0)
				incoherent++;
		}
		pthread_barrier_wait(&barrier);
	}
	long flt = thread_minflt() - flt0;
	long reclaimed = direct_reclaim() - reclaim0;
	pthread_join(filler, NULL);
	if (mode == 8) {
		pthread_mutex_lock(&pm);
		pdone = 1;
		pthread_cond_broadcast(&pc);
		pthread_mutex_unlock(&pm);
		pthread_join(helper, NULL);
		t_pop = helper_cpu;
	}
	double n = rounds * NB * batch / 144.0;
	if (!mapped) {
		printf("mode %d %s: writer CPU %.1f ns per 144-byte record (write %.1f, sync %.1f; "
		       "minor faults %ld; pages reclaimed directly, machine-wide: %ld)\n",
		       mode, cold ? "cold" : "warm", spent * 1e9 / n, t_copy * 1e9 / n,
		       t_sync * 1e9 / n, flt, reclaimed);
	} else {
		struct stat st;
		fstat(fd, &st);
		/* What a crash-recovery scan of this file would find after the last record. */
		long nonzero = 0;
		char tail[65536];
		for (off_t o = off; o < st.st_size; o += sizeof tail) {
			ssize_t k = pread(rfd, tail, sizeof tail, o);
			for (ssize_t j = 0; j < k; j++)
				nonzero += tail[j] != 0;
		}
		if (mode == 8)
			printf("mode 8 %s: pre-faulting thread on the other CPU %.1f ns per record, "
			       "%ld minor faults; the writer waited for it at %ld of %ld batches\n",
			       cold ? "cold" : "warm", helper_cpu * 1e9 / n, helper_faults, stalls,
			       rounds * NB);
		printf("mode %d %s: writer CPU %.1f ns per 144-byte record "
		       "(copy %.1f, populate %.1f, sync %.1f; minor faults %ld = %.2f per 4 KiB written); "
		       "pread != mapping: %ld of %ld batches; file size %lld for %lld written, "
		       "%lld bytes after them, %ld non-zero; pages reclaimed directly, machine-wide: "
		       "%ld\n",
		       mode, cold ? "cold" : "warm", spent * 1e9 / n, t_copy * 1e9 / n,
		       t_pop * 1e9 / n, t_sync * 1e9 / n, flt, flt * 4096.0 / (double)off,
		       incoherent, rounds, (long long)st.st_size, (long long)off,
		       (long long)(st.st_size - off), nonzero, reclaimed);
		munmap(map, maplen);
		close(rfd);
	}
	close(fd);
	unlink(path);
	return 0;
}
