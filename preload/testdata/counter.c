// counter interposes socket() as another preload library a workload may
// already have would (a tracer, a proxy's shim): it notes each call on
// stderr and passes it on to the next definition.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>

int socket(int domain, int type, int protocol)
{
	int (*next)(int, int, int) = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");

	(void)!write(2, "counter: socket\n", 16);
	return next(domain, type, protocol);
}
