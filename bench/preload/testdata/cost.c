// cost times what the preload library adds: `cost socket N [mptcp]` opens
// and closes N TCP sockets (with mptcp: asking for IPPROTO_MPTCP itself, as
// a program written for MPTCP does); `cost connect N PORT [mptcp]` connects
// N times to 127.0.0.1:PORT and closes. It prints nanoseconds per operation.
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

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	int connecting, n, port = 0, protocol = 0, i;
	double start;

	if (argc < 3)
		return 2;
	connecting = strcmp(argv[1], "connect") == 0;
	n = atoi(argv[2]);
	if (connecting)
		port = atoi(argv[3]);
	if (strcmp(argv[argc - 1], "mptcp") == 0)
		protocol = IPPROTO_MPTCP;
	start = now();
	for (i = 0; i < n; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, protocol);

		if (fd < 0) {
			perror("socket");
			return 1;
		}
		if (connecting) {
			struct sockaddr_in to = {.sin_family = AF_INET,
						 .sin_port = htons(port),
						 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

			if (connect(fd, (struct sockaddr *)&to, sizeof(to)) < 0) {
				perror("connect");
				return 1;
			}
		}
		close(fd);
	}
	printf("%.0f\n", (now() - start) / n);
	return 0;
}
