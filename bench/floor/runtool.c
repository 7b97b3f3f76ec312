/* runtool OUTFILE TIMEOUT_S CMD [ARGS...]
 *
 * Not a floor program: the measuring launcher of bench/run.py. Forks, runs CMD in
 * its own process group (stdin/stdout/stderr inherited), waits with wait4() and
 * writes `wall_ns user_us sys_us maxrss_kib status timed_out` to OUTFILE.
 * A small C process is the parent so that the peak RSS reported for CMD is CMD's
 * own: a child forked from Python starts with Python's RSS high-water mark.
 * After TIMEOUT_S seconds (0 = none), or when runtool gets SIGTERM/SIGINT/SIGHUP, the
 * process group gets SIGKILL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile pid_t child;
static volatile sig_atomic_t timed_out;

static void on_alarm(int sig) {
    (void)sig;
    timed_out = 1;
    if (child > 0) kill(-child, SIGKILL);
}

/* The bench was interrupted: take the tool down with us. */
static void on_term(int sig) {
    if (child > 0) kill(-child, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: runtool OUTFILE TIMEOUT_S CMD [ARGS...]\n");
        return 2;
    }
    double timeout = atof(argv[2]);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) {
        perror("runtool: fork");
        return 2;
    }
    if (pid == 0) {
        setpgid(0, 0);
        execvp(argv[3], argv + 3);
        fprintf(stderr, "runtool: exec %s: %m\n", argv[3]);
        _exit(127);
    }
    child = pid;
    setpgid(pid, pid);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGHUP, on_term);
    if (timeout > 0) {
        signal(SIGALRM, on_alarm);
        struct itimerval it = {{0, 0}, {(time_t)timeout, (suseconds_t)((timeout - (time_t)timeout) * 1e6)}};
        setitimer(ITIMER_REAL, &it, NULL);
    }
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("runtool: wait4");
            return 2;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror("runtool: open OUTFILE");
        return 2;
    }
    long long wall = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    fprintf(f, "%lld %lld %lld %ld %d %d\n", wall,
            (long long)ru.ru_utime.tv_sec * 1000000LL + ru.ru_utime.tv_usec,
            (long long)ru.ru_stime.tv_sec * 1000000LL + ru.ru_stime.tv_usec, ru.ru_maxrss, status,
            (int)timed_out);
    fclose(f);
    return 0;
}
