/*
 * The harness's checks and processes (see harness.h).
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* The counts of this process (the test's or a peer's). */
struct result h_result;
int h_role = ROLE_RUNNER;
int h_result_fd = -1;

#define MAX_PEERS 16
static struct peer *peers[MAX_PEERS];

/* ---- Output --------------------------------------------------------------- */

/* Writes a whole line at once, so lines of concurrent processes do not mix. */
void h_write(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = write(1, s, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        s += k;
        n -= (size_t)k;
    }
}

static void h_vline(const char *prefix, const char *fmt, va_list ap)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s", prefix);
    if (n < 0)
        return;
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    if (m < 0)
        return;
    size_t len = strlen(buf);
    if (len + 1 >= sizeof buf)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    h_write(buf, len);
}

int h_is_peer(void)
{
    return h_role == ROLE_PEER;
}

void h_count(void)
{
    h_result.checks++;
}

void h_fail(const char *file, int line, const char *fmt, ...)
{
    char prefix[512];
    h_result.fails++;
    snprintf(prefix, sizeof prefix, "FAIL %s/%s%s at %s:%d: ", g_test ? g_test->area : "-",
             g_test ? g_test->name : "-", h_role == ROLE_PEER ? " (peer)" : "", file, line);
    va_list ap;
    va_start(ap, fmt);
    h_vline(prefix, fmt, ap);
    va_end(ap);
}

void h_note(const char *fmt, ...)
{
    if (!g_verbose)
        return;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "     %s/%s%s: ", g_test ? g_test->area : "-",
             g_test ? g_test->name : "-", h_role == ROLE_PEER ? " (peer)" : "");
    va_list ap;
    va_start(ap, fmt);
    h_vline(prefix, fmt, ap);
    va_end(ap);
}

void h_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h_result.reason, sizeof h_result.reason, fmt, ap);
    va_end(ap);
    h_result.skipped = 1;
    h_finish();
}

static void write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += k;
        n -= (size_t)k;
    }
}

/* Reads exactly n bytes before the deadline; 0 on success. */
static int read_all(int fd, void *buf, size_t n, long long deadline)
{
    char *p = buf;
    while (n > 0) {
        long long left = deadline - now_ms();
        if (left < 0)
            left = 0;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)(left > 1000000 ? 1000000 : left));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static char unlink_paths[8][256];

void h_unlink_at_end(const char *path)
{
    for (int i = 0; i < 8; i++)
        if (!unlink_paths[i][0]) {
            snprintf(unlink_paths[i], sizeof unlink_paths[i], "%s", path);
            return;
        }
}

void h_finish(void)
{
    for (int i = 0; i < 8; i++)
        if (unlink_paths[i][0])
            unlink(unlink_paths[i]);
    if (h_role == ROLE_TEST) {
        /* Peers still running when the test ends are stopped quietly: the
         * test ended early (a REQUIRE or a skip), or peer_end was not due. */
        for (int i = 0; i < MAX_PEERS; i++)
            if (peers[i] && !peers[i]->done)
                peer_kill(peers[i]);
    }
    if (h_result_fd >= 0)
        write_all(h_result_fd, &h_result, sizeof h_result);
    _exit(0);
}

/* ---- Names ---------------------------------------------------------------- */

const char *vip_ret_name(VIP_RETURN r)
{
    static const char *const names[] = {
        "VIP_SUCCESS",          "VIP_NOT_DONE",
        "VIP_INVALID_PARAMETER", "VIP_ERROR_RESOURCE",
        "VIP_TIMEOUT",          "VIP_REJECT",
        "VIP_INVALID_RELIABILITY_LEVEL", "VIP_INVALID_MTU",
        "VIP_INVALID_QOS",      "VIP_INVALID_PTAG",
        "VIP_INVALID_RDMAREAD", "VIP_DESCRIPTOR_ERROR",
        "VIP_INVALID_STATE",    "VIP_ERROR_NAMESERVICE",
        "VIP_NO_MATCH",         "VIP_NOT_REACHABLE",
        "VIP_ERROR_NOT_SUPPORTED",
    };
    if ((unsigned)r < sizeof names / sizeof names[0])
        return names[r];
    static char other[3][32];
    static int k;
    k = (k + 1) % 3;
    snprintf(other[k], sizeof other[k], "VIP_RETURN(%d)", (int)r);
    return other[k];
}

const char *state_name(VIP_VI_STATE s)
{
    switch (s) {
    case VIP_STATE_IDLE:
        return "VIP_STATE_IDLE";
    case VIP_STATE_CONNECTED:
        return "VIP_STATE_CONNECTED";
    case VIP_STATE_CONNECT_PENDING:
        return "VIP_STATE_CONNECT_PENDING";
    case VIP_STATE_ERROR:
        return "VIP_STATE_ERROR";
    }
    return "VIP_VI_STATE(?)";
}

static const char *status_text(uint32_t st, char *buf, size_t len, int with_op);

const char *status_name(uint32_t st, char *buf, size_t len)
{
    return status_text(st, buf, len, 1);
}

const char *bits_name(uint32_t st, char *buf, size_t len)
{
    return status_text(st, buf, len, 0);
}

static const char *status_text(uint32_t st, char *buf, size_t len, int with_op)
{
    static const struct {
        uint32_t bit;
        const char *name;
    } bits[] = {
        {VIP_STATUS_DONE, "DONE"},
        {VIP_STATUS_FORMAT_ERROR, "FORMAT_ERROR"},
        {VIP_STATUS_PROTECTION_ERROR, "PROTECTION_ERROR"},
        {VIP_STATUS_LENGTH_ERROR, "LENGTH_ERROR"},
        {VIP_STATUS_PARTIAL_ERROR, "PARTIAL_ERROR"},
        {VIP_STATUS_DESC_FLUSHED_ERROR, "DESC_FLUSHED_ERROR"},
        {VIP_STATUS_TRANSPORT_ERROR, "TRANSPORT_ERROR"},
        {VIP_STATUS_RDMA_PROT_ERROR, "RDMA_PROT_ERROR"},
        {VIP_STATUS_REMOTE_DESC_ERROR, "REMOTE_DESC_ERROR"},
        {VIP_STATUS_IMMEDIATE, "IMMEDIATE"},
    };
    static const char *const ops[] = {"OP_SEND", "OP_RECEIVE", "OP_RDMA_WRITE",
                                      "OP_REMOTE_RDMA_WRITE", "OP_RDMA_READ", "OP(5)",
                                      "OP(6)", "OP(7)"};
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        if (st & bits[i].bit)
            n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", n ? "|" : "",
                                  bits[i].name);
    if (with_op)
        n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", n ? "|" : "",
                              ops[(st & VIP_STATUS_OP_MASK) >> 16]);
    if (st & VIP_STATUS_RESERVED)
        snprintf(buf + n, n < len ? len - n : 0, "|reserved 0x%x",
                 (unsigned)(st & VIP_STATUS_RESERVED));
    return buf;
}

/* ---- Checks ---------------------------------------------------------------- */

VIP_RETURN check_ret(const char *file, int line, const char *what, VIP_RETURN got,
                     VIP_RETURN want)
{
    h_count();
    if (got != want)
        h_fail(file, line, "%s: expected %s, got %s", what, vip_ret_name(want),
               vip_ret_name(got));
    return got;
}

void check_state(const char *file, int line, const char *what, VIP_VI_HANDLE vi,
                 VIP_VI_STATE want)
{
    VIP_VI_STATE st = (VIP_VI_STATE)-1;
    VIP_VI_ATTRIBUTES a;
    VIP_BOOLEAN se, re;
    VIP_RETURN r = VipQueryVi(vi, &st, &a, &se, &re);
    h_count();
    if (r != VIP_SUCCESS)
        h_fail(file, line, "state of %s: VipQueryVi returned %s (expected %s)", what,
               vip_ret_name(r), state_name(want));
    else if (st != want)
        h_fail(file, line, "state of %s: expected %s, got %s", what, state_name(want),
               state_name(st));
}

void check_status(const char *file, int line, const char *what, const VIP_DESCRIPTOR *d,
                  uint32_t op, uint32_t err, int imm)
{
    h_count();
    if (d == NULL) {
        h_fail(file, line, "status of %s: no descriptor", what);
        return;
    }
    uint32_t st = d->CS.Status;
    int ok = (st & VIP_STATUS_DONE) && (st & VIP_STATUS_OP_MASK) == op &&
             (st & VIP_STATUS_ERROR_MASK) == err && (st & VIP_STATUS_RESERVED) == 0;
    if (imm == 0 && (st & VIP_STATUS_IMMEDIATE))
        ok = 0;
    if (imm == 1 && !(st & VIP_STATUS_IMMEDIATE))
        ok = 0;
    if (!ok) {
        char g[256], w[256];
        uint32_t want = VIP_STATUS_DONE | op | err | (imm == 1 ? VIP_STATUS_IMMEDIATE : 0);
        h_fail(file, line, "status of %s: expected %s%s, got %s (0x%x)", what,
               status_name(want, w, sizeof w), imm < 0 ? " (immediate bit either way)" : "",
               status_name(st, g, sizeof g), (unsigned)st);
    }
}

/* ---- Time ------------------------------------------------------------------- */

long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- Peers ------------------------------------------------------------------ */

static void enter_peer_netns(void)
{
    if (!g_peer_netns)
        return;
    int fd = open(g_peer_netns, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        h_fail(__FILE__, __LINE__, "cannot enter the peer's network namespace %s: %s",
               g_peer_netns, strerror(errno));
        h_finish();
    }
    close(fd);
}

void peer_start(struct peer *p, void (*fn)(struct chan *c, void *arg), void *arg)
{
    int down[2], up[2], res[2];
    memset(p, 0, sizeof *p);
    if (pipe2(down, O_CLOEXEC) || pipe2(up, O_CLOEXEC) || pipe2(res, O_CLOEXEC)) {
        h_fail(__FILE__, __LINE__, "pipe: %s", strerror(errno));
        h_finish();
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        h_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
        h_finish();
    }
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        close(res[0]);
        /* The peer dies with its test, and on its own after the limit. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        alarm(test_limit(g_test));
        h_role = ROLE_PEER;
        memset(&h_result, 0, sizeof h_result);
        h_result_fd = res[1];
        for (int i = 0; i < MAX_PEERS; i++)
            peers[i] = NULL;
        memset(unlink_paths, 0, sizeof unlink_paths);
        enter_peer_netns();
        struct chan c = {.rfd = down[0], .wfd = up[1]};
        fn(&c, arg);
        h_finish();
    }
    close(down[0]);
    close(up[1]);
    close(res[1]);
    p->pid = pid;
    p->c.rfd = up[0];
    p->c.wfd = down[1];
    p->result_fd = res[0];
    for (int i = 0; i < MAX_PEERS; i++)
        if (!peers[i]) {
            peers[i] = p;
            break;
        }
}

static void peer_forget(struct peer *p)
{
    close(p->c.rfd);
    close(p->c.wfd);
    close(p->result_fd);
    p->done = 1;
    for (int i = 0; i < MAX_PEERS; i++)
        if (peers[i] == p)
            peers[i] = NULL;
}

void peer_end(struct peer *p, int ms)
{
    if (p->done)
        return;
    struct result r;
    long long deadline = now_ms() + ms;
    int got = read_all(p->result_fd, &r, sizeof r, deadline) == 0;
    int st = 0;
    /* The peer's ending is a check of its own. */
    h_count();
    if (!got) {
        /* No result: it crashed, or it is still running. */
        pid_t w = 0;
        while (now_ms() < deadline && (w = waitpid(p->pid, &st, WNOHANG)) == 0)
            sleep_ms(5);
        if (w == 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            h_fail(__FILE__, __LINE__, "peer (pid %d) still running after %d ms; killed",
                   (int)p->pid, ms);
        } else if (WIFSIGNALED(st)) {
            h_fail(__FILE__, __LINE__, "peer (pid %d) killed by signal %d%s", (int)p->pid,
                   WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (its alarm: it hung)" : "");
        } else {
            h_fail(__FILE__, __LINE__, "peer (pid %d) exited (status %d) without a result",
                   (int)p->pid, WEXITSTATUS(st));
        }
    } else {
        h_result.checks += r.checks;
        h_result.fails += r.fails;
        /* It has written its result and is exiting. */
        pid_t w = 0;
        while (now_ms() < deadline + 2000 && (w = waitpid(p->pid, &st, WNOHANG)) == 0)
            sleep_ms(2);
        if (w == 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            h_fail(__FILE__, __LINE__, "peer (pid %d) did not exit after its result; killed",
                   (int)p->pid);
        }
    }
    peer_forget(p);
}

void peer_kill(struct peer *p)
{
    if (p->done)
        return;
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    peer_forget(p);
}

/* ---- Channel ---------------------------------------------------------------- */

struct frame {
    int32_t tag;
    uint32_t len;
};

int chan_send(struct chan *c, int tag, const void *data, size_t len)
{
    char buf[sizeof(struct frame) + CHAN_MAX];
    struct frame f = {.tag = tag, .len = (uint32_t)(len > CHAN_MAX ? CHAN_MAX : len)};
    memcpy(buf, &f, sizeof f);
    if (f.len)
        memcpy(buf + sizeof f, data, f.len);
    size_t n = sizeof f + f.len;
    ssize_t k;
    do
        k = write(c->wfd, buf, n);
    while (k < 0 && errno == EINTR);
    return k == (ssize_t)n ? 0 : -1;
}

int chan_recv(struct chan *c, int ms, void *buf, size_t max, size_t *len)
{
    long long deadline = now_ms() + ms;
    struct frame f;
    if (read_all(c->rfd, &f, sizeof f, deadline) != 0 || f.len > CHAN_MAX)
        return -1;
    char body[CHAN_MAX];
    if (f.len && read_all(c->rfd, body, f.len, deadline + 1000) != 0)
        return -1;
    if (buf && max)
        memcpy(buf, body, f.len < max ? f.len : max);
    if (len)
        *len = f.len;
    return f.tag;
}

int chan_expect(const char *file, int line, struct chan *c, int ms, int tag, void *buf,
                size_t max)
{
    int got = chan_recv(c, ms, buf, max, NULL);
    h_count();
    if (got == tag)
        return 0;
    if (got < 0)
        h_fail(file, line, "expected message %d from the %s within %d ms: none (timeout or it ended)",
               tag, h_role == ROLE_PEER ? "test" : "peer", ms);
    else
        h_fail(file, line, "expected message %d from the %s, got %d", tag,
               h_role == ROLE_PEER ? "test" : "peer", got);
    return -1;
}
