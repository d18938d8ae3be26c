/*
 * noshim.h: the environment a test program gives a child it starts
 * without the shim: its own, less LD_PRELOAD.
 */
#include <string.h>

/* env_without_shim fills out (room entries) with environ's entries but
 * LD_PRELOAD's, ended by NULL, and returns out. */
static inline char **env_without_shim(char **out, int room)
{
	extern char **environ;
	int k = 0;
	for (char **e = environ; *e && k < room - 1; e++)
		if (strncmp(*e, "LD_PRELOAD=", 11) != 0)
			out[k++] = *e;
	out[k] = NULL;
	return out;
}
