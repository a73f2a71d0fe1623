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
 * the writes and syncs only) per 144-byte record.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NB 8
static const size_t batch = 128 * 1024;
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

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s MODE(0 buffered, 1 fallocate, 3 O_DIRECT) RECORDS FILE COLD(0|1)\n", argv[0]);
		return 2;
	}
	int mode = atoi(argv[1]);
	long records = atol(argv[2]);
	const char *path = argv[3];
	cold = atoi(argv[4]);
	rounds = records * 144 / batch / NB;
	for (int i = 0; i < NB; i++)
		if (posix_memalign((void **)&bufs[i], 4096, batch))
			return 1;
	unlink(path);
	int flags = O_WRONLY | O_CREAT | O_TRUNC | (mode == 3 ? O_DIRECT : 0);
	int fd = open(path, flags, 0600);
	if (fd < 0) {
		perror("open");
		return 1;
	}
	if (mode == 1 && fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 128 << 20)) {
		perror("fallocate");
		return 1;
	}
	pin(1);
	pthread_barrier_init(&barrier, NULL, 2);
	pthread_t filler;
	pthread_create(&filler, NULL, fill, NULL);
	double spent = 0;
	off_t off = 0;
	for (long r = 0; r < rounds; r++) {
		pthread_barrier_wait(&barrier);
		double t0 = thread_cpu();
		for (int i = 0; i < NB; i++) {
			if (pwrite(fd, bufs[i], batch, off) != (ssize_t)batch) {
				perror("pwrite");
				return 1;
			}
			off += batch;
		}
		if (r % 2 == 1)
			fdatasync(fd);
		spent += thread_cpu() - t0;
		pthread_barrier_wait(&barrier);
	}
	pthread_join(filler, NULL);
	printf("mode %d %s: writer CPU %.1f ns per 144-byte record\n", mode,
	       cold ? "cold" : "warm", spent * 1e9 / (rounds * NB * batch / 144.0));
	close(fd);
	unlink(path);
	return 0;
}
