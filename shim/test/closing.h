/*
 * closing.h: what closeaccept.c, closeconnect.c and closepoll.c share. A
 * thread runs call() on an fd while the main thread, 200 ms later,
 * closes that fd and prints "closed" (the test waits for the line
 * before it makes the event the call waits for).
 */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

/* close_during starts call on a thread, closes fd 200 ms later, prints
 * "closed", and waits for the thread; 0, or -1 if no thread started. */
static int close_during(int fd, void *(*call)(void *))
{
	pthread_t t;
	if (pthread_create(&t, NULL, call, NULL) != 0) {
		fprintf(stderr, "pthread_create failed\n");
		return -1;
	}
	usleep(200 * 1000);
	close(fd);
	printf("closed\n");
	fflush(stdout);
	pthread_join(t, NULL);
	return 0;
}
