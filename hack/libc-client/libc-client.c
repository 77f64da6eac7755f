// libc-client is a C client linked against the C library that knows nothing
// of MPTCP unless told: the workload the preload library is for.
//
//	libc-client [-m] [-c CONNS] (-n BYTES | -s SECONDS) ADDR PORT
//
// opens CONNS connections (default 1) to ADDR:PORT one after the other,
// with socket(AF_INET, SOCK_STREAM, 0) unless -m asks for IPPROTO_MPTCP as
// a program written for MPTCP does, and writes BYTES bytes, or for SECONDS
// seconds, on each. Byte i of every stream is pattern(i % 65536) below, so
// that a reader can hash what should have arrived from the count alone.
// For each connection it prints a JSON line: its number, local address and
// the bytes it wrote.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

#define BLOCK (1 << 16)

static char buf[BLOCK];

static int usage(void)
{
	fprintf(stderr, "usage: libc-client [-m] [-c CONNS] (-n BYTES | -s SECONDS) ADDR PORT\n");
	return 2;
}

// stream writes one connection's bytes: limit bytes, or until end when
// limit is negative. A short write continues the pattern where it stopped.
static int stream(const struct sockaddr_in *to, int protocol, long long limit, time_t end, int conn)
{
	struct sockaddr_in local;
	socklen_t len = sizeof(local);
	char addr[INET_ADDRSTRLEN];
	long long sent = 0;
	int fd;

	fd = socket(AF_INET, SOCK_STREAM, protocol);
	if (fd < 0 || connect(fd, (const struct sockaddr *)to, sizeof(*to)) < 0) {
		perror("connect");
		return 1;
	}
	if (getsockname(fd, (struct sockaddr *)&local, &len) < 0 ||
	    !inet_ntop(AF_INET, &local.sin_addr, addr, sizeof(addr))) {
		perror("getsockname");
		return 1;
	}
	while (limit < 0 ? time(NULL) < end : sent < limit) {
		size_t off = sent % BLOCK, want = BLOCK - off;
		ssize_t n;

		if (limit >= 0 && (long long)want > limit - sent)
			want = limit - sent;
		n = write(fd, buf + off, want);
		if (n < 0) {
			perror("write");
			return 1;
		}
		sent += n;
	}
	if (close(fd) < 0) {
		perror("close");
		return 1;
	}
	printf("{\"conn\":%d,\"local\":\"%s:%d\",\"bytes\":%lld}\n", conn, addr, ntohs(local.sin_port), sent);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in to = {.sin_family = AF_INET};
	int protocol = 0, conns = 1, seconds = -1, opt, i;
	long long limit = -1;

	while ((opt = getopt(argc, argv, "mc:n:s:")) != -1) {
		switch (opt) {
		case 'm':
			protocol = IPPROTO_MPTCP;
			break;
		case 'c':
			conns = atoi(optarg);
			break;
		case 'n':
			limit = atoll(optarg);
			break;
		case 's':
			seconds = atoi(optarg);
			break;
		default:
			return usage();
		}
	}
	if (argc - optind != 2 || conns < 1 || (limit < 0) == (seconds < 0))
		return usage();
	to.sin_port = htons(atoi(argv[optind + 1]));
	if (inet_pton(AF_INET, argv[optind], &to.sin_addr) != 1)
		return usage();
	for (i = 0; i < BLOCK; i++)
		buf[i] = (char)(i * 131 + 7);
	for (i = 0; i < conns; i++) {
		if (stream(&to, protocol, limit, time(NULL) + (seconds < 0 ? 0 : seconds), i))
			return 1;
	}
	return 0;
}
