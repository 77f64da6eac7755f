// sockets opens one socket of each kind the preload library must or must
// not change, prints the protocol the kernel gives each, and, given an
// address and port, connects a TCP socket there and sends a line: a C
// program that knows nothing of MPTCP.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void show(const char *name, int domain, int type, int protocol)
{
	int fd = socket(domain, type, protocol);
	int proto = -1;
	socklen_t len = sizeof(proto);

	if (fd < 0) {
		printf("%s error\n", name);
		return;
	}
	getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len);
	printf("%s %d\n", name, proto);
	close(fd);
}

int main(int argc, char **argv)
{
	show("inet-stream", AF_INET, SOCK_STREAM, 0);
	show("inet-stream-tcp", AF_INET, SOCK_STREAM, IPPROTO_TCP);
	show("inet6-stream-flags", AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	show("inet-dgram", AF_INET, SOCK_DGRAM, 0);
	show("unix-stream", AF_UNIX, SOCK_STREAM, 0);
	show("inet-stream-sctp-like", AF_INET, SOCK_STREAM, 132);
	if (argc == 3) {
		struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		const char *line = "hello from a program that knows nothing of MPTCP\n";

		inet_pton(AF_INET, argv[1], &to.sin_addr);
		if (fd < 0 || connect(fd, (struct sockaddr *)&to, sizeof(to)) < 0 ||
		    write(fd, line, strlen(line)) != (ssize_t)strlen(line)) {
			perror("connect");
			return 1;
		}
		close(fd);
		printf("sent\n");
	}
	return 0;
}
