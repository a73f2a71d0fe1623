/*
 * What a JetStream acknowledgement per message costs nats-server: the
 * same messages published with a reply subject on every one (an ack each,
 * as wpd's exporter does), on every 64th only, or on none, and with wpd's
 * headers, only the message id, or no headers at all. A plain-TCP NATS
 * client (the protocol is text: CONNECT, HPUB/PUB, MSG/HMSG, PING/PONG),
 * so that nothing of a client library is in the figures.
 *
 * Each message is what the exporter sends for a hit: subject
 * wpd.<host>.hit, a 150-byte payload, the headers Wpd-Host, Content-Type,
 * Wpd-Seq, Wpd-Time-Ns, Wpd-Kind, Wpd-Pid, Wpd-Tid, Wpd-Process,
 * Wpd-Thread and Nats-Msg-Id (<journal id>-<seq>), the reply subject
 * <inbox>.<seq>; at most 1,024 messages are unacknowledged at once (the
 * exporter's WINDOW), the acknowledgements read by a second thread.
 *
 * For each case the program creates a stream of its own through the
 * JetStream API ($JS.API.STREAM.CREATE.<name>: file storage, subjects
 * wpd.>, duplicate window 120 s, as the exporter creates it), publishes N
 * messages, then asks $JS.API.STREAM.INFO.<name> until the stream holds
 * N (or stops growing for 2 s), and deletes the stream. It prints the wall
 * time from the first publish to the count, the CPU nats-server used
 * meanwhile (utime + stime of /proc/<pid>/stat) and the client's own, per
 * message, the acknowledgements received and the final count. After the
 * nine cases, a second case "every 64th, wpd's headers" publishes its last
 * 1,000 messages
 * again (same ids, a reply on every 64th) and checks that the stream's
 * count did not move and what the acknowledgements say ("duplicate":
 * true).
 *
 * The server is started as the tests start it (tests/src/nats.rs):
 *
 *   cc -O2 -pthread -o /tmp/nats-acks docs/experiments/nats-acks.c
 *   for order in forward reverse; do
 *     d=$(mktemp -d /var/tmp/nats-acks.XXXXXX)
 *     nats-server -js -a 127.0.0.1 -p 4299 -sd $d/store >$d/log 2>&1 & pid=$!
 *     sleep 1
 *     for r in 1 2 3; do uptime; /tmp/nats-acks 4299 $pid 200000 $order; done
 *     uptime; kill $pid; wait $pid; rm -rf $d
 *   done
 *
 * ("reverse" runs the cases in the opposite order.) One case alone, under
 * perf, on a server started the same way:
 *
 *   for c in a c; do perf record -F 2999 -g -p $pid -o /tmp/na-$c.data -- \
 *     /tmp/nats-acks 4299 $pid 200000 $c; done
 *   perf report -i /tmp/na-a.data --no-children -n --sort dso --stdio
 *   perf report -i /tmp/na-a.data --children -n --sort sym --stdio -g none
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WINDOW 1024
#define PAYLOAD 150

static int sock;
static pthread_mutex_t wlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
/* Guarded by lock. */
static uint64_t acked_upto; /* highest seq acknowledged */
static uint64_t acks, dups, errs;
static char *api_reply;
static int api_ready;
static int closed;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void write_all(const char *p, size_t n)
{
	pthread_mutex_lock(&wlock);
	while (n > 0) {
		ssize_t k = write(sock, p, n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			die("write: %s", strerror(errno));
		}
		p += k;
		n -= (size_t)k;
	}
	pthread_mutex_unlock(&wlock);
}

/* The publisher's output buffer. */
static char obuf[1 << 16];
static size_t olen;

static void flush(void)
{
	if (olen) {
		write_all(obuf, olen);
		olen = 0;
	}
}

/* Room for n more bytes: the buffer is flushed only between whole
 * commands, so that the reader thread's PONG never lands inside one. */
static void reserve(size_t n)
{
	if (olen + n > sizeof obuf)
		flush();
}

static void out(const char *p, size_t n)
{
	if (olen + n > sizeof obuf)
		flush();
	memcpy(obuf + olen, p, n);
	olen += n;
}

/* Input: the reader thread's buffer. */
static char ibuf[1 << 20];
static size_t ipos, iend;

static int fill_input(void)
{
	if (ipos > 0) {
		memmove(ibuf, ibuf + ipos, iend - ipos);
		iend -= ipos;
		ipos = 0;
	}
	if (iend == sizeof ibuf)
		die("a protocol line longer than the input buffer");
	ssize_t k = read(sock, ibuf + iend, sizeof ibuf - iend);
	if (k <= 0)
		return -1;
	iend += (size_t)k;
	return 0;
}

/* The next line (without \r\n), NUL-terminated in place; NULL at the end. */
static char *line(void)
{
	for (;;) {
		char *e = memmem(ibuf + ipos, iend - ipos, "\r\n", 2);
		if (e) {
			char *l = ibuf + ipos;
			*e = 0;
			ipos = (size_t)(e - ibuf) + 2;
			return l;
		}
		if (fill_input())
			return NULL;
	}
}

/* The next n bytes and their \r\n; valid until the next read. */
static char *bytes(size_t n)
{
	while (iend - ipos < n + 2)
		if (fill_input())
			return NULL;
	char *p = ibuf + ipos;
	ipos += n + 2;
	return p;
}

static void on_msg(const char *subject, const char *payload, size_t n)
{
	pthread_mutex_lock(&lock);
	if (strncmp(subject, "_INBOX.acks.", 12) == 0) {
		uint64_t seq = strtoull(subject + 12, NULL, 10);
		acks++;
		/* The server writes "duplicate": true (a space after the colon). */
		const char *d = memmem(payload, n, "\"duplicate\":", 12);
		if (d) {
			d += 12;
			while (d < payload + n && *d == ' ')
				d++;
			if (payload + n - d >= 4 && memcmp(d, "true", 4) == 0)
				dups++;
		}
		if (memmem(payload, n, "\"error\"", 7)) {
			if (errs++ == 0)
				fprintf(stderr, "ack error: %.*s\n", (int)n, payload);
		}
		if (seq > acked_upto)
			acked_upto = seq;
	} else if (strncmp(subject, "_INBOX.api.", 11) == 0) {
		free(api_reply);
		api_reply = strndup(payload, n);
		api_ready = 1;
	}
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
}

static void *reader(void *arg)
{
	(void)arg;
	char *l;
	while ((l = line())) {
		if (strncmp(l, "PING", 4) == 0) {
			write_all("PONG\r\n", 6);
		} else if (strncmp(l, "MSG ", 4) == 0 || strncmp(l, "HMSG ", 5) == 0) {
			/* MSG subject sid [reply] len / HMSG subject sid [reply] hlen len */
			char *tok[6];
			int nt = 0;
			for (char *s = strtok(l, " "); s && nt < 6; s = strtok(NULL, " "))
				tok[nt++] = s;
			char subject[256];
			snprintf(subject, sizeof subject, "%s", tok[1]);
			size_t len = strtoull(tok[nt - 1], NULL, 10);
			size_t hlen = tok[0][0] == 'H' ? strtoull(tok[nt - 2], NULL, 10) : 0;
			char *p = bytes(len);
			if (!p)
				break;
			on_msg(subject, p + hlen, len - hlen);
		} else if (strncmp(l, "-ERR", 4) == 0) {
			fprintf(stderr, "server: %s\n", l);
		}
		/* +OK (not asked for), PONG, INFO: nothing to do. */
	}
	pthread_mutex_lock(&lock);
	closed = 1;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
	return NULL;
}

/* A request to the JetStream API; the reply's text (the caller frees it). */
static char *api(const char *subject, const char *body)
{
	static int n;
	char head[512];
	int hl = snprintf(head, sizeof head, "PUB %s _INBOX.api.%d %zu\r\n", subject, ++n,
			  strlen(body));
	pthread_mutex_lock(&lock);
	api_ready = 0;
	pthread_mutex_unlock(&lock);
	flush();
	out(head, (size_t)hl);
	out(body, strlen(body));
	out("\r\n", 2);
	flush();
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 10;
	pthread_mutex_lock(&lock);
	while (!api_ready && !closed)
		if (pthread_cond_timedwait(&cond, &lock, &dl) == ETIMEDOUT)
			die("no reply to %s", subject);
	if (closed)
		die("connection closed");
	char *r = api_reply;
	api_reply = NULL;
	pthread_mutex_unlock(&lock);
	return r;
}

static long stream_messages(const char *stream)
{
	char subj[128];
	snprintf(subj, sizeof subj, "$JS.API.STREAM.INFO.%s", stream);
	char *r = api(subj, "");
	char *s = strstr(r, "\"state\"");
	char *m = s ? strstr(s, "\"messages\":") : NULL;
	long v = m ? atol(m + 11) : -1;
	if (v < 0)
		fprintf(stderr, "stream info: %s\n", r);
	free(r);
	return v;
}

static double server_cpu(int pid)
{
	char path[64], buf[2048];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		die("%s: %s", path, strerror(errno));
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	/* Fields after the command's closing parenthesis: state is field 3. */
	char *p = strrchr(buf, ')') + 2;
	unsigned long long ut = 0, st = 0;
	for (int field = 3; field <= 15; field++) {
		if (field == 14)
			ut = strtoull(p, NULL, 10);
		if (field == 15)
			st = strtoull(p, NULL, 10);
		p = strchr(p, ' ') + 1;
	}
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* The same in ns, summed over the server's live threads (schedstat): fine
 * enough for 1,000 messages. */
static double server_cpu_ns(int pid)
{
	char path[96];
	double sum = 0;
	snprintf(path, sizeof path, "/proc/%d/task", pid);
	DIR *d = opendir(path);
	if (!d)
		die("%s: %s", path, strerror(errno));
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char p[300];
		snprintf(p, sizeof p, "/proc/%d/task/%s/schedstat", pid, e->d_name);
		FILE *f = fopen(p, "r");
		unsigned long long run = 0;
		if (f) {
			if (fscanf(f, "%llu", &run) == 1)
				sum += (double)run;
			fclose(f);
		}
	}
	closedir(d);
	return sum / 1e9;
}

static double own_cpu(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
	       u.ru_stime.tv_usec / 1e6;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

enum headers { FULL, ID_ONLY, NONE };
static const char *hname[] = {"wpd's headers", "Nats-Msg-Id only", "no headers"};
static char journal_id[40];
static const char *host = "bench-host-01";
static char payload[PAYLOAD];

/* Publishes messages first..last; a reply subject on those seq % every == 0
 * (every 0: none); waits for the window. */
static void publish(uint64_t first, uint64_t last, int every, enum headers h)
{
	char subject[128];
	snprintf(subject, sizeof subject, "wpd.%s.hit", host);
	char hdr[1024], cmd[512];
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	uint64_t t0 = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
	for (uint64_t seq = first; seq <= last; seq++) {
		int reply = every > 0 && seq % (uint64_t)every == 0;
		if (every > 0) {
			pthread_mutex_lock(&lock);
			if (seq > acked_upto + WINDOW) {
				pthread_mutex_unlock(&lock);
				flush();
				pthread_mutex_lock(&lock);
				while (seq > acked_upto + WINDOW && !closed)
					pthread_cond_wait(&cond, &lock);
			}
			pthread_mutex_unlock(&lock);
		}
		int hl = 0;
		if (h == FULL)
			hl = snprintf(hdr, sizeof hdr,
				      "NATS/1.0\r\nWpd-Host: %s\r\nContent-Type: application/x-protobuf; "
				      "messageType=wpd.v1.StreamEventsResponse\r\nWpd-Seq: %llu\r\n"
				      "Wpd-Time-Ns: %llu\r\nWpd-Kind: hit\r\nWpd-Pid: 2345678\r\n"
				      "Wpd-Tid: 2345679\r\nWpd-Process: ct-pie\r\nWpd-Thread: ct-pie\r\n"
				      "Nats-Msg-Id: %s-%llu\r\n\r\n",
				      host, (unsigned long long)seq,
				      (unsigned long long)(t0 + seq * 3000), journal_id,
				      (unsigned long long)seq);
		else if (h == ID_ONLY)
			hl = snprintf(hdr, sizeof hdr, "NATS/1.0\r\nNats-Msg-Id: %s-%llu\r\n\r\n",
				      journal_id, (unsigned long long)seq);
		char rs[64] = "";
		if (reply)
			snprintf(rs, sizeof rs, " _INBOX.acks.%llu", (unsigned long long)seq);
		int cl = h == NONE ? snprintf(cmd, sizeof cmd, "PUB %s%s %d\r\n", subject, rs, PAYLOAD)
				   : snprintf(cmd, sizeof cmd, "HPUB %s%s %d %d\r\n", subject, rs, hl,
					      hl + PAYLOAD);
		reserve((size_t)cl + (size_t)hl + PAYLOAD + 2);
		out(cmd, (size_t)cl);
		out(hdr, (size_t)hl);
		memcpy(payload, &seq, sizeof seq);
		out(payload, PAYLOAD);
		out("\r\n", 2);
	}
	flush();
}

/* Waits for the acknowledgement of message `seq`. */
static void wait_ack(uint64_t seq)
{
	pthread_mutex_lock(&lock);
	while (acked_upto < seq && !closed)
		pthread_cond_wait(&cond, &lock);
	pthread_mutex_unlock(&lock);
}

/* The stream's count once it reaches `want` or stops growing for 2 s. */
static long settle(const char *stream, long want)
{
	long last = -1;
	double since = now();
	for (;;) {
		long c = stream_messages(stream);
		if (c >= want)
			return c;
		if (c != last) {
			last = c;
			since = now();
		} else if (now() - since > 2) {
			return c;
		}
		usleep(20000);
	}
}

static void new_id(void)
{
	FILE *f = fopen("/proc/sys/kernel/random/uuid", "r");
	if (!f || !fgets(journal_id, sizeof journal_id, f))
		die("uuid");
	fclose(f);
	journal_id[strcspn(journal_id, "\n")] = 0;
}

static void one_case(int pid, long n, int every, enum headers h, int dup_check)
{
	static int k;
	char stream[64], subj[128], cfg[512];
	snprintf(stream, sizeof stream, "ACKS%d_%d", (int)getpid(), ++k);
	snprintf(subj, sizeof subj, "$JS.API.STREAM.CREATE.%s", stream);
	snprintf(cfg, sizeof cfg,
		 "{\"name\":\"%s\",\"subjects\":[\"wpd.>\"],\"storage\":\"file\","
		 "\"retention\":\"limits\",\"discard\":\"old\",\"num_replicas\":1,"
		 "\"duplicate_window\":120000000000}",
		 stream);
	char *r = api(subj, cfg);
	if (strstr(r, "\"error\""))
		die("stream create: %s", r);
	free(r);
	new_id();
	pthread_mutex_lock(&lock);
	acked_upto = 0;
	acks = dups = errs = 0;
	pthread_mutex_unlock(&lock);

	double s0 = server_cpu(pid), c0 = own_cpu(), w0 = now();
	publish(1, (uint64_t)n, every, h);
	if (every > 0)
		wait_ack((uint64_t)(n / every * every));
	long count = settle(stream, n);
	double w = now() - w0, s = server_cpu(pid) - s0, c = own_cpu() - c0;
	const char *how = every == 1 ? "every message" : every > 1 ? "every 64th" : "none";
	printf("| %s | %s | %ld | %.2f | %.0f | %.2f | %.2f | %llu (%llu duplicate, %llu error) | %ld |\n",
	       how, hname[h], n, w, n / w, s * 1e6 / n, c * 1e6 / n, (unsigned long long)acks,
	       (unsigned long long)dups, (unsigned long long)errs, count);
	fflush(stdout);

	if (dup_check) {
		uint64_t from = (uint64_t)n - 999;
		pthread_mutex_lock(&lock);
		acks = dups = errs = 0;
		acked_upto = from - 1;
		pthread_mutex_unlock(&lock);
		double d0 = server_cpu_ns(pid);
		publish(from, (uint64_t)n, every, h);
		wait_ack((uint64_t)(n / every * every));
		double ds = server_cpu_ns(pid) - d0;
		pthread_mutex_lock(&lock);
		uint64_t a = acks, d = dups, e = errs;
		pthread_mutex_unlock(&lock);
		long mid = stream_messages(stream);
		/* One new message after them, acknowledged: the stream takes its
		 * messages in order, so every repeat has been looked at. */
		publish((uint64_t)n + 1, (uint64_t)n + 1, 1, h);
		wait_ack((uint64_t)n + 1);
		long after = stream_messages(stream);
		printf("\nthe last 1,000 again (ids %llu..%ld, a reply on every %dth): %llu "
		       "acknowledgements, %llu of them \"duplicate\":true, %llu errors; nats-server %.2f "
		       "µs per message (its threads' schedstat); stream count %ld before, %ld after them, %ld after one new "
		       "message\n\n",
		       (unsigned long long)from, n, every, (unsigned long long)a,
		       (unsigned long long)d, (unsigned long long)e, ds * 1e6 / 1000, count, mid,
		       after);
		fflush(stdout);
	}
	snprintf(subj, sizeof subj, "$JS.API.STREAM.DELETE.%s", stream);
	free(api(subj, ""));
}

int main(int argc, char **argv)
{
	if (argc != 4 && argc != 5)
		die("usage: %s PORT NATS_SERVER_PID MESSAGES [reverse | a | b | c]", argv[0]);
	const char *order = argc == 5 ? argv[4] : "forward";
	int port = atoi(argv[1]);
	int pid = atoi(argv[2]);
	long n = atol(argv[3]);
	for (int i = 0; i < PAYLOAD; i++)
		payload[i] = (char)(i * 37 + 11);
	sock = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	if (connect(sock, (struct sockaddr *)&a, sizeof a))
		die("connect: %s", strerror(errno));
	int one = 1;
	setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	char *info = line();
	if (!info || strncmp(info, "INFO ", 5))
		die("no INFO from the server");
	const char *connect_cmd =
		"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,"
		"\"no_responders\":true,\"lang\":\"c\",\"version\":\"0\",\"protocol\":1}\r\n"
		"SUB _INBOX.acks.* 1\r\nSUB _INBOX.api.* 2\r\nPING\r\n";
	write_all(connect_cmd, strlen(connect_cmd));
	for (char *l; (l = line());) {
		if (strncmp(l, "PONG", 4) == 0)
			break;
		if (strncmp(l, "-ERR", 4) == 0)
			die("server: %s", l);
	}
	pthread_t rt;
	pthread_create(&rt, NULL, reader, NULL);

	printf("| replies | headers | messages | wall s | messages/s | nats-server CPU µs/msg | "
	       "client CPU µs/msg | acks | stream count |\n|---|---|---:|---:|---:|---:|---:|---|---:|\n");
	int every[] = {1, 64, 0};
	if (strlen(order) == 1) {
		/* One case alone (wpd's headers), e.g. under perf. */
		one_case(pid, n, every[order[0] - 'a'], FULL, 0);
	} else if (strcmp(order, "reverse") == 0) {
		one_case(pid, n, 64, FULL, 1);
		for (int h = NONE; h >= FULL; h--)
			for (int i = 2; i >= 0; i--)
				one_case(pid, n, every[i], (enum headers)h, 0);
	} else {
		for (int h = FULL; h <= NONE; h++)
			for (int i = 0; i < 3; i++)
				one_case(pid, n, every[i], (enum headers)h, 0);
		one_case(pid, n, 64, FULL, 1);
	}
	shutdown(sock, SHUT_RDWR);
	pthread_join(rt, NULL);
	return 0;
}
