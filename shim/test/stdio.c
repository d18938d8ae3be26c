/*
 * stdio: connections written through the C library's own internal
 * calls: three lines written with dprintf and read back from an echo
 * server with read, and three written through stdio (fdopen, fprintf)
 * and read back with fgets, printed. Under the shim the second
 * connection goes to the kernel at fdopen (calls.c, "stdio"), and
 * dprintf writes through the stack; before, both wrote to the kernel's
 * socket under the fd, which was not connected: EPIPE, and SIGPIPE ended
 * the program.
 *
 * usage: stdio ADDR PORT
 */
#include "conform.h"

int main(int argc, char **argv)
{
	int r = peer_args(argc, argv);
	if (r)
		return r;
	/* dprintf, on a connection of its own, read back with read. */
	int d = dial();
	for (int i = 0; i < 3; i++) {
		char line[128];
		int n = dprintf(d, "line %d through dprintf\n", i);
		if (n <= 0) {
			perror("stdio: dprintf");
			return 1;
		}
		for (int got = 0; got < n;) {
			ssize_t r = read(d, line + got, n - got);
			if (r <= 0) {
				fprintf(stderr, "stdio: no echo of dprintf's line %d\n", i);
				return 1;
			}
			got += r;
		}
		fwrite(line, 1, n, stdout);
	}
	close(d);
	FILE *f = fdopen(dial(), "r+");
	if (!f) {
		perror("stdio: fdopen");
		return 1;
	}
	for (int i = 0; i < 3; i++) {
		char line[128];
		if (fprintf(f, "line %d through stdio\n", i) < 0 || fflush(f) != 0) {
			perror("stdio: fprintf");
			return 1;
		}
		if (!fgets(line, sizeof line, f)) {
			fprintf(stderr, "stdio: no echo of line %d\n", i);
			return 1;
		}
		fputs(line, stdout);
	}
	if (fclose(f) != 0) {
		perror("stdio: fclose");
		return 1;
	}
	return 0;
}
