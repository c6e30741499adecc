/*
 * swarm-shim: the per-task supervisor that outlives the agent (swarm/runtime/shim.py).
 *
 *   swarm-shim REPORT_FD STATUS_DIR -- ARGV...
 *
 * The agent starts it exactly as it would start the task (same environment, working
 * directory, umask, log files as stdout/stderr, its own session), with REPORT_FD the
 * write end of a pipe (>= 3) among the descriptors it passes. The shim:
 *   1. ignores every signal it can (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, the
 *      job-control ones and the rest) except SIGCHLD: only SIGKILL ends it early;
 *   2. opens STATUS_DIR (the task's state directory), then forks the task: in the
 *      child, default dispositions, an empty signal mask, its own process group
 *      (pgid = its pid, so that the agent's signals to the task's group never reach
 *      the shim), REPORT_FD closed, then exec of ARGV searched in the PATH of its
 *      environment the way Python's subprocess does (no /bin/sh retry on ENOEXEC);
 *   3. writes ONE line to REPORT_FD and closes it:
 *        "started <taskpid>\n"          the exec succeeded
 *        "failed <errno> <strerror>\n"  it did not (then exit 127 is recorded below)
 *        "error <errno> <what>: <strerror>\n"  the shim itself could not (see below)
 *      then lets go of everything of the task's: chdir("/"), every descriptor closed
 *      but STATUS_DIR's, 0/1/2 on /dev/null (a pipe passed for the task sees EOF when
 *      the task closes it; a log file or a mount is not held by the shim);
 *   4. waits for the task's leader; when it exits, SIGKILLs what is left of its
 *      process group (stragglers, as the agent does), while the leader is still an
 *      unreaped zombie, so that its pid (the group's id) cannot have been reused;
 *   5. writes STATUS_DIR/exit durably (exit.tmp, fsync, rename, fsync of the dir),
 *      mode 0600, one "key value" line each, in this order:
 *        pid <taskpid>
 *        exit <code>   or   signal <number>
 *        error <errno>                 (only when the task could not be started)
 *        fenced 1                      (only when the shim killed it: its lease lapsed)
 *        ended <unix seconds>.<ns>     (CLOCK_REALTIME, when the leader ended)
 *      then ends the way the task did: its exit code, or death by its signal (the
 *      exit file may be missing, on a full disk: a parent still learns the end).
 * Fencing (--at-most-once, node/fencing.py): when STATUS_DIR/lease exists at the start
 * it holds a deadline, "<CLOCK_MONOTONIC ns>\n", which the agent moves forward (a
 * new file renamed over it) while the task's home renews the runner's lease. The
 * shim reads it at least every 100 ms; once the clock passes the latest deadline it
 * read, it SIGKILLs the task's process group and records "fenced 1". It keeps doing so
 * while the agent is paused, killed or cut off: that is its point. A deadline only
 * moves forward; a missing or unreadable file keeps the last one. A lease that has
 * lapsed before the start starts nothing: "error 62 lease lapsed before the start"
 * (ETIME) and an exit file with "fenced 1".
 * Before STATUS_DIR is open it can only report ("error ...") and exit 1; a usage error
 * (no report possible) exits 2. A failure to create the pipe or to fork after that is
 * reported ("error ...") and recorded as "pid 0", "exit 126", "error <errno>".
 *
 * It trusts nothing from the task: it reads nothing the task writes, and the status
 * directory is the agent's (the task cannot write it when it runs as another user).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int report_fd = -1;

static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* the agent is gone (EPIPE): the task runs on regardless */
        buf += w;
        len -= (size_t)w;
    }
}

static void report(const char *line) {
    if (report_fd < 0) return;
    write_all(report_fd, line, strlen(line));
    close(report_fd);
    report_fd = -1;
}

/* "failed": the exec's own error, as Popen would raise it; "error": the shim's */
static void report_failed(const char *word, int err, const char *what) {
    char line[256];
    snprintf(line, sizeof line, "%s %d %s%s%s\n", word, err, what ? what : "", what ? ": " : "",
             strerror(err));
    report(line);
}

/* The status file, durably: a restarted agent believes what it finds there. */
static int write_exit(int dirfd, pid_t pid, const char *how, int code, int err, int fenced,
                      const struct timespec *ended) {
    char buf[256];
    int n = snprintf(buf, sizeof buf, "pid %ld\n%s %d\n", (long)pid, how, code);
    if (err) n += snprintf(buf + n, sizeof buf - (size_t)n, "error %d\n", err);
    if (fenced) n += snprintf(buf + n, sizeof buf - (size_t)n, "fenced 1\n");
    n += snprintf(buf + n, sizeof buf - (size_t)n, "ended %lld.%09ld\n",
                  (long long)ended->tv_sec, (long)ended->tv_nsec);
    int fd = openat(dirfd, "exit.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                    0600);
    if (fd < 0) return -1;
    const char *p = buf;
    size_t left = (size_t)n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) < 0 || close(fd) < 0) return -1;
    if (renameat(dirfd, "exit.tmp", dirfd, "exit") < 0) return -1;
    if (fsync(dirfd) < 0) return -1;
    return 0;
}

/* The lease's deadline (CLOCK_MONOTONIC ns) from STATUS_DIR/lease, or `last` when
 * there is no readable, well-formed, later one. */
static long long read_lease(int dirfd, long long last) {
    int fd = openat(dirfd, "lease", O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return last;
    char buf[32];
    ssize_t n;
    do n = read(fd, buf, sizeof buf - 1);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0) return last;
    buf[n] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || end == buf || v < 0 || (*end != '\n' && *end != '\0')) return last;
    return v > last ? v : last;
}

static long long mono_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* Wait for the leader to end (WNOWAIT: it stays a zombie), fencing it on the way when
 * a lease was given: returns 1 when the shim killed it for a lapsed lease. */
static int wait_leader(pid_t pid, int dirfd, long long deadline, siginfo_t *si, int *w) {
    int fenced = 0;
    while (deadline >= 0 && !fenced) {
        memset(si, 0, sizeof *si);
        *w = waitid(P_PID, (id_t)pid, si, WEXITED | WNOWAIT | WNOHANG);
        if (*w < 0 && errno == EINTR) continue;
        if (*w < 0 || si->si_pid != 0) return 0; /* it ended (or cannot be waited for) */
        deadline = read_lease(dirfd, deadline);
        long long left = deadline - mono_ns();
        if (left <= 0) {
            kill(-pid, SIGKILL);
            fenced = 1;
            break;
        }
        if (left > 100000000LL) left = 100000000LL;
        struct timespec nap = {0, (long)left};
        nanosleep(&nap, NULL);
    }
    do {
        memset(si, 0, sizeof *si);
        *w = waitid(P_PID, (id_t)pid, si, WEXITED | WNOWAIT);
    } while (*w < 0 && errno == EINTR);
    return fenced;
}

static void set_all_signals(void (*how)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    for (int s = 1; s < NSIG; s++) {
        if (s == SIGKILL || s == SIGSTOP) continue;
        sa.sa_handler = (s == SIGCHLD) ? SIG_DFL : how; /* SIG_IGN on SIGCHLD: no status */
        sigaction(s, &sa, NULL); /* EINVAL for the C library's own signals: fine */
    }
}

/* exec as Python's subprocess does: ARGV[0] with a '/' as is, else each entry of the
 * environment's PATH (default /bin:/usr/bin); the first error other than ENOENT and
 * ENOTDIR wins, else the last one. */
static void exec_search(char **cmd) {
    if (strchr(cmd[0], '/')) {
        execve(cmd[0], cmd, environ);
        return;
    }
    const char *path = getenv("PATH");
    if (path == NULL) path = "/bin:/usr/bin";
    size_t clen = strlen(cmd[0]);
    int saved = 0;
    for (const char *p = path;;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        char full[PATH_MAX];
        if (dlen + 1 + clen + 1 <= sizeof full) {
            if (dlen == 0) {
                memcpy(full, cmd[0], clen + 1); /* an empty entry: the working directory */
            } else {
                memcpy(full, p, dlen);
                full[dlen] = '/';
                memcpy(full + dlen + 1, cmd[0], clen + 1);
            }
            execve(full, cmd, environ);
        } else {
            errno = ENAMETOOLONG;
        }
        if (errno != ENOENT && errno != ENOTDIR && saved == 0) saved = errno;
        if (!colon) break;
        p = colon + 1;
    }
    if (saved) errno = saved;
}

static void child(int errpipe, char **cmd) {
    set_all_signals(SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    close(report_fd);
    int err = 0;
    if (setpgid(0, 0) < 0) {
        err = errno;
    } else {
        exec_search(cmd);
        err = errno;
    }
    write_all(errpipe, (const char *)&err, sizeof err);
    _exit(127);
}

/* Hold nothing of the task's: not its working directory, not its log files, not a
 * pipe passed for it (whose reader waits for EOF), not the report pipe. */
static void let_go(int keep) {
    if (chdir("/") < 0) { /* nothing to do about it: "/" always exists */
    }
    int done = 0;
#ifdef SYS_close_range
    done = (keep <= 3 || syscall(SYS_close_range, 3U, (unsigned)keep - 1, 0U) == 0) &&
           syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U) == 0;
#endif
    if (!done) {
        long max = sysconf(_SC_OPEN_MAX);
        if (max < 0 || max > 1 << 20) max = 1 << 20;
        for (int fd = 3; fd < max; fd++)
            if (fd != keep) close(fd);
    }
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3; fd++) {
        if (null >= 0) dup2(null, fd); /* dup2 clears FD_CLOEXEC on the copy */
        else close(fd);
    }
    if (null > 2) close(null);
}

/* The shim's own end says the task's: the same exit code, or death by the same signal
 * (no core dump of the shim). A parent that cannot read the exit file (a full disk:
 * found by the chaos suite's disk-full scenario) still learns how the task ended. */
static int mirror(int exited, int status) {
    if (exited) return status;
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(status, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, status);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(status);
    return 128 + status; /* a signal that does not end a process (none ends a task so) */
}

int main(int argc, char **argv) {
    set_all_signals(SIG_IGN);
    if (argc < 5 || strcmp(argv[3], "--") != 0) {
        fputs("swarm-shim: usage: REPORT_FD STATUS_DIR -- ARGV...\n", stderr);
        return 2;
    }
    char *end;
    errno = 0;
    long rfd = strtol(argv[1], &end, 10);
    if (errno || *argv[1] == '\0' || *end != '\0' || rfd < 3 || rfd > INT_MAX ||
        fcntl((int)rfd, F_SETFD, FD_CLOEXEC) < 0) {
        fputs("swarm-shim: bad REPORT_FD\n", stderr);
        return 2;
    }
    report_fd = (int)rfd;

    int dirfd = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd >= 0 && dirfd < 3) { /* keep it clear of 0/1/2, which go to /dev/null */
        int high = fcntl(dirfd, F_DUPFD_CLOEXEC, 3);
        close(dirfd);
        dirfd = high;
    }
    if (dirfd < 0) {
        report_failed("error", errno, "cannot open the status directory");
        return 1;
    }

    struct timespec ended;
    long long deadline = read_lease(dirfd, -1); /* -1: no lease, never fenced */
    if (deadline >= 0 && deadline <= mono_ns()) {
        report_failed("error", ETIME, "lease lapsed before the start");
        let_go(dirfd);
        clock_gettime(CLOCK_REALTIME, &ended);
        return write_exit(dirfd, 0, "exit", 126, ETIME, 1, &ended) < 0 ? 1 : 0;
    }
    int errpipe[2];
    pid_t pid = -1;
    const char *what = "cannot create a pipe";
    if (pipe2(errpipe, O_CLOEXEC) == 0) {
        what = "cannot fork";
        pid = fork();
        if (pid == 0) {
            close(errpipe[0]);
            child(errpipe[1], argv + 4);
        }
        if (pid < 0) {
            int err = errno;
            close(errpipe[0]);
            close(errpipe[1]);
            errno = err;
        }
    }
    if (pid < 0) {
        int err = errno;
        report_failed("error", err, what);
        let_go(dirfd);
        clock_gettime(CLOCK_REALTIME, &ended);
        return write_exit(dirfd, 0, "exit", 126, err, 0, &ended) < 0 ? 1 : 0;
    }
    close(errpipe[1]);
    int err = 0;
    ssize_t r;
    do r = read(errpipe[0], &err, sizeof err);
    while (r < 0 && errno == EINTR);
    close(errpipe[0]);
    int started = r == 0; /* EOF: the exec closed the write end */
    if (!started && r != (ssize_t)sizeof err) err = r < 0 ? errno : EIO;
    if (started) {
        char line[64];
        snprintf(line, sizeof line, "started %ld\n", (long)pid);
        report(line);
    } else {
        report_failed("failed", err, NULL);
    }
    let_go(dirfd);

    siginfo_t si;
    int w = 0;
    int fenced = wait_leader(pid, dirfd, started ? deadline : -1, &si, &w);
    int werr = w < 0 ? errno : 0;
    clock_gettime(CLOCK_REALTIME, &ended);
    if (started && w == 0) kill(-pid, SIGKILL); /* the stragglers; the zombie leader pins the pgid */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }

    if (!started) {
        write_exit(dirfd, pid, "exit", 127, err, 0, &ended);
        return 127;
    }
    if (w < 0) { /* cannot happen for our own child; record something rather than nothing */
        write_exit(dirfd, pid, "exit", 127, werr, fenced, &ended);
        return 127;
    }
    int exited = si.si_code == CLD_EXITED;
    write_exit(dirfd, pid, exited ? "exit" : "signal", si.si_status, 0, fenced, &ended);
    return mirror(exited, si.si_status);
}
