// send is a C client that knows nothing of MPTCP unless told: `send ADDR
// PORT SECONDS [mptcp]` connects to ADDR:PORT (asking for IPPROTO_MPTCP
// itself with mptcp, as a program written for MPTCP does), writes for
// SECONDS, and prints the bytes it wrote.
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

int main(int argc, char **argv)
{
	static char buf[1 << 16];
	struct sockaddr_in to = {.sin_family = AF_INET};
	long long sent = 0;
	time_t end;
	int fd, i;

	if (argc < 4)
		return 2;
	for (i = 0; i < (int)sizeof(buf); i++)
		buf[i] = (char)(i * 131 + 7);
	to.sin_port = htons(atoi(argv[2]));
	inet_pton(AF_INET, argv[1], &to.sin_addr);
	fd = socket(AF_INET, SOCK_STREAM, argc > 4 && strcmp(argv[4], "mptcp") == 0 ? IPPROTO_MPTCP : 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&to, sizeof(to)) < 0) {
		perror("connect");
		return 1;
	}
	end = time(NULL) + atoi(argv[3]);
	while (time(NULL) < end) {
		ssize_t n = write(fd, buf, sizeof(buf));

		if (n < 0) {
			perror("write");
			return 1;
		}
		sent += n;
	}
	close(fd);
	printf("%lld\n", sent);
	return 0;
}
