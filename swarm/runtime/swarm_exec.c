/*
 * swarm-exec: start one task as its user, for a root agent (swarm/runtime/exechelper.py).
 *
 * The agent runs this with an EMPTY environment (so the dynamic loader reads nothing
 * the submitter chose) on Python's vfork path, which a preexec_fn would rule out. In
 * this order it: joins the task's cgroups (still root; the paths are the agent's own),
 * drops to the user (supplementary groups, gid, uid), enters the working directory
 * as the user (the kernel's permission checks decide), reads the task's environment
 * from a descriptor (never from argv, which every local user can read in /proc), and
 * execs the command, searching the task's own PATH. Nothing it is given is
 * interpreted: no shell, no expansion.
 *
 *   swarm-exec UID GID GROUPS CWD ENVFD STATUSFD [CGROUP_PROCS...] -- ARGV...
 *
 * GROUPS: comma-separated gids, or "-" for none. ENVFD: a file of NUL-terminated
 * NAME=VALUE strings (a memfd). STATUSFD: the write end of a pipe, close-on-exec here:
 * a successful exec closes it unread; a failure writes one line saying why, then
 * exits 126 (127: command not found).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int status_fd = -1;

static void fail(int code, const char *what, const char *arg, int err) {
    char msg[8192];
    int n = snprintf(msg, sizeof msg, "%s%s%s%s%s", what, arg ? " " : "", arg ? arg : "",
                     err ? ": " : "", err ? strerror(err) : "");
    if (n < 0) n = 0;
    if (n > (int)sizeof msg - 1) n = (int)sizeof msg - 1;
    if (status_fd >= 0) {
        ssize_t w = write(status_fd, msg, (size_t)n);
        (void)w;
    }
    _exit(code);
}

static long number(const char *s, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v < 0) fail(126, "swarm-exec: bad", what, 0);
    return v;
}

static char **read_env(int fd) {
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) fail(126, "cannot read the task's environment", NULL, ENOMEM);
    if (lseek(fd, 0, SEEK_SET) < 0) fail(126, "cannot read the task's environment", NULL, errno);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            char *more = realloc(buf, cap + 1);
            if (!more) fail(126, "cannot read the task's environment", NULL, ENOMEM);
            buf = more;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail(126, "cannot read the task's environment", NULL, errno);
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    size_t count = 0;
    for (size_t i = 0; i < len; i++)
        if (buf[i] == '\0') count++;
    char **env = calloc(count + 1, sizeof *env);
    if (!env) fail(126, "cannot read the task's environment", NULL, ENOMEM);
    size_t k = 0;
    for (size_t i = 0; i < len && k < count;) {
        env[k++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    env[k] = NULL;
    return env;
}

static const char *env_path(char **env) {
    for (char **e = env; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) return *e + 5;
    return "/bin:/usr/bin"; /* Python's os.defpath, as subprocess would use */
}

int main(int argc, char **argv) {
    if (argc < 9) {
        fputs("swarm-exec: usage: UID GID GROUPS CWD ENVFD STATUSFD [CGROUP...] -- ARGV...\n",
              stderr);
        return 126;
    }
    status_fd = (int)number(argv[6], "STATUSFD");
    if (fcntl(status_fd, F_SETFD, FD_CLOEXEC) < 0) fail(126, "swarm-exec: status fd", NULL, errno);
    uid_t uid = (uid_t)number(argv[1], "UID");
    gid_t gid = (gid_t)number(argv[2], "GID");
    const char *cwd = argv[4];
    int env_fd = (int)number(argv[5], "ENVFD");
    int sep = 7;
    while (sep < argc && strcmp(argv[sep], "--") != 0) sep++;
    if (sep >= argc - 1) fail(126, "swarm-exec: no command after --", NULL, 0);

    /* 1. the task's cgroups, as root */
    char pid[32];
    int pidlen = snprintf(pid, sizeof pid, "%d", (int)getpid());
    for (int i = 7; i < sep; i++) {
        int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, pid, (size_t)pidlen) != pidlen)
            fail(126, "cannot put the process in its cgroup:", argv[i], errno);
        close(fd);
    }

    /* 2. the user */
    gid_t groups[NGROUPS_MAX];
    size_t ngroups = 0;
    if (strcmp(argv[3], "-") != 0) {
        char *list = argv[3];
        for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
            if (ngroups == NGROUPS_MAX) fail(126, "swarm-exec: too many groups", NULL, 0);
            groups[ngroups++] = (gid_t)number(tok, "GROUPS");
        }
    }
    if (setgroups(ngroups, groups) < 0) fail(126, "cannot switch to its user", NULL, errno);
    if (setresgid(gid, gid, gid) < 0) fail(126, "cannot switch to its user", NULL, errno);
    if (setresuid(uid, uid, uid) < 0) fail(126, "cannot switch to its user", NULL, errno);
    if (setuid(0) == 0 && uid != 0) fail(126, "cannot switch to its user: root kept", NULL, 0);

    /* 3. the working directory, as the user */
    if (chdir(cwd) < 0) {
        char what[64];
        snprintf(what, sizeof what, "(as uid %ld)", (long)uid);
        char msg[PATH_MAX + 64];
        snprintf(msg, sizeof msg, "%s: %s %s", cwd, strerror(errno), what);
        fail(126, "cannot enter working directory", msg, 0);
    }

    /* 4. the environment, then the command (its own PATH, like execvpe) */
    char **env = read_env(env_fd);
    char **cmd = argv + sep + 1;
    if (strchr(cmd[0], '/')) {
        execve(cmd[0], cmd, env);
        fail(errno == ENOENT ? 127 : 126, errno == ENOENT ? "command not found:" :
             "permission denied:", cmd[0], 0);
    }
    const char *path = env_path(env);
    int saw_eacces = 0;
    size_t clen = strlen(cmd[0]);
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        char full[PATH_MAX];
        if (dlen + 1 + clen + 1 <= sizeof full) {
            if (dlen == 0) {
                memcpy(full, cmd[0], clen + 1); /* empty entry: the current directory */
            } else {
                memcpy(full, p, dlen);
                full[dlen] = '/';
                memcpy(full + dlen + 1, cmd[0], clen + 1);
            }
            execve(full, cmd, env);
            if (errno == EACCES) saw_eacces = 1;
            else if (errno != ENOENT && errno != ENOTDIR && errno != ELOOP &&
                     errno != ENAMETOOLONG)
                fail(126, "cannot start process:", cmd[0], errno);
        }
        if (!colon) break;
        p = colon + 1;
    }
    if (saw_eacces) fail(126, "permission denied:", cmd[0], 0);
    fail(127, "command not found:", cmd[0], 0);
    return 127;
}
