/*
 * The harness's checks, processes and sides (see harness.h).
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *g_domain;
const struct test *g_test;
int g_verbose;

/* This process's failures (the test's or its peer's) and whether it is a
 * peer. */
static int failures;
static int is_peer;

#define MAX_PEERS 4
static struct peer *peers[MAX_PEERS];

/* ---- Checks --------------------------------------------------------------- */

void h_fail(const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    failures++;
    /* One write, so that the lines of the two processes do not mix. */
    char line_buf[1400];
    int n = snprintf(line_buf, sizeof line_buf, "  %s/%s%s at %s:%d: %s\n",
                     g_test ? g_test->area : "-", g_test ? g_test->name : "-",
                     is_peer ? " (peer)" : "", file, line, msg);
    if (n > 0)
        (void)!write(2, line_buf, (size_t)n < sizeof line_buf ? (size_t)n : sizeof line_buf - 1);
}

void h_note(const char *fmt, ...)
{
    if (!g_verbose)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char line_buf[1200];
    int n = snprintf(line_buf, sizeof line_buf, "  # %s%s\n", is_peer ? "(peer) " : "", msg);
    if (n > 0)
        (void)!write(2, line_buf, (size_t)n < sizeof line_buf ? (size_t)n : sizeof line_buf - 1);
}

void h_finish(void)
{
    /* A test that ends early takes its peers with it. */
    for (int i = 0; i < MAX_PEERS; i++)
        if (peers[i] && !peers[i]->done)
            peer_kill(peers[i]);
    _exit(failures > 100 ? 100 : failures);
}

const char *ret_name(long long r)
{
    static char buf[4][96];
    static int k;
    k = (k + 1) % 4;
    if (r >= 0)
        snprintf(buf[k], sizeof buf[k], "%lld", r);
    else
        snprintf(buf[k], sizeof buf[k], "-%lld (%s)", -r, fi_strerror((int)-r));
    return buf[k];
}

long long check_ret(const char *file, int line, const char *what, long long got, long long want)
{
    if (got != want)
        h_fail(file, line, "%s: expected %s, got %s", what, ret_name(want), ret_name(got));
    return got;
}

void fill(uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = pattern(seed, i);
}

void check_pattern(const char *file, int line, const uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern(seed, i)) {
            h_fail(file, line, "byte %zu of %zu: expected 0x%02x, got 0x%02x", i, len,
                   pattern(seed, i), p[i]);
            return;
        }
}

/* ---- Time ----------------------------------------------------------------- */

long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void sleep_ms(int ms)
{
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

/* ---- Processes ------------------------------------------------------------ */

static int write_all(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n > 0) {
        ssize_t k = write(fd, b, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Reads n bytes by the deadline; 0 on success. */
static int read_all(int fd, void *p, size_t n, long long deadline)
{
    char *b = p;
    while (n > 0) {
        /* A deadline already passed still gets one look. */
        long long left = deadline - now_ms();
        if (left < 0)
            left = 0;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t k = read(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

void peer_start(struct peer *p, void (*fn)(struct chan *c))
{
    int down[2], up[2];
    memset(p, 0, sizeof *p);
    if (pipe2(down, O_CLOEXEC) || pipe2(up, O_CLOEXEC)) {
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
        /* The peer dies with its test, and on its own after the limit. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        alarm(g_test->limit ? g_test->limit : 20);
        is_peer = 1;
        failures = 0;
        for (int i = 0; i < MAX_PEERS; i++)
            peers[i] = NULL;
        struct chan c = {.rfd = down[0], .wfd = up[1]};
        fn(&c);
        h_finish();
    }
    close(down[0]);
    close(up[1]);
    p->pid = pid;
    p->c.rfd = up[0];
    p->c.wfd = down[1];
    for (int i = 0; i < MAX_PEERS; i++)
        if (!peers[i]) {
            peers[i] = p;
            break;
        }
}

static void peer_forget(struct peer *p)
{
    p->done = 1;
    close(p->c.rfd);
    close(p->c.wfd);
    for (int i = 0; i < MAX_PEERS; i++)
        if (peers[i] == p)
            peers[i] = NULL;
}

void peer_end(struct peer *p, int ms)
{
    if (p->done)
        return;
    long long deadline = now_ms() + ms;
    int st = 0;
    pid_t w = 0;
    while ((w = waitpid(p->pid, &st, WNOHANG)) == 0 && now_ms() < deadline)
        sleep_ms(5);
    if (w == 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &st, 0);
        h_fail(__FILE__, __LINE__, "the peer still ran after %d ms (killed)", ms);
    } else if (WIFSIGNALED(st)) {
        h_fail(__FILE__, __LINE__, "the peer died of signal %d (%s)", WTERMSIG(st),
               strsignal(WTERMSIG(st)));
    } else if (WIFEXITED(st)) {
        /* Its failures were reported by the peer itself. */
        failures += WEXITSTATUS(st);
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

int chan_send(struct chan *c, const void *data, size_t len)
{
    uint8_t frame[1 + 255];
    if (len > 255)
        return -1;
    frame[0] = (uint8_t)len;
    memcpy(frame + 1, data, len);
    return write_all(c->wfd, frame, 1 + len);
}

int chan_recv(struct chan *c, int ms, void *buf, size_t max)
{
    long long deadline = now_ms() + ms;
    uint8_t n;
    uint8_t body[255];
    if (read_all(c->rfd, &n, 1, deadline) != 0)
        return -1;
    if (read_all(c->rfd, body, n, deadline) != 0)
        return -1;
    memcpy(buf, body, n < max ? n : max);
    return n;
}

int chan_expect(const char *file, int line, struct chan *c, int ms, void *buf, size_t len)
{
    int n = chan_recv(c, ms, buf, len);
    if (n != (int)len) {
        h_fail(file, line, "expected a %zu-byte message from the other side within %d ms, got %d",
               len, ms, n);
        return -1;
    }
    return 0;
}

/* ---- Sides ---------------------------------------------------------------- */

/* The interface version the suite asks for: FI_CONFORMANCE_API
 * ("major.minor", e.g. "2.0" to run as a libfabric 2.x program under a 2.x
 * library), else the headers' own. */
static uint32_t api_version(void)
{
    const char *v = getenv("FI_CONFORMANCE_API");
    unsigned major, minor;
    if (v != NULL && sscanf(v, "%u.%u", &major, &minor) == 2)
        return FI_VERSION(major, minor);
    return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
}

int api_before_1_5(void)
{
    return api_version() < FI_VERSION(1, 5);
}

ssize_t eq_err_entry_size(void)
{
    return api_before_1_5() ? (ssize_t)offsetof(struct fi_eq_err_entry, err_data_size)
                            : (ssize_t)sizeof(struct fi_eq_err_entry);
}

struct fi_info *domain_info(void)
{
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    REQUIRE(hints != NULL);
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG | FI_RMA;
    hints->addr_format = FI_SOCKADDR_IN;
    uint32_t version = api_version();
    if (version < FI_VERSION(1, 5)) {
        /* A program of interface 1.4 or older says the same in the old
         * words: local buffers registered (a mode bit), the basic map. */
        hints->mode = FI_LOCAL_MR;
        hints->domain_attr->mr_mode = FI_MR_BASIC;
    } else {
        hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    }
    hints->domain_attr->name = strdup(g_domain);
    hints->fabric_attr->prov_name = strdup("uvia");
    int r = fi_getinfo(version, NULL, NULL, 0, hints, &info);
    fi_freeinfo(hints);
    if (r != 0) {
        h_fail(__FILE__, __LINE__,
               "fi_getinfo %u.%u for domain %s: %s (FI_PROVIDER_PATH set?)",
               FI_MAJOR(version), FI_MINOR(version), g_domain, ret_name(r));
        h_finish();
    }
    REQUIRE(info != NULL);
    REQUIRE(strcmp(info->domain_attr->name, g_domain) == 0);
    return info;
}

void side_open(struct side *s, enum fi_wait_obj eq_wait)
{
    memset(s, 0, sizeof *s);
    s->info = domain_info();
    REQUIRE_RET(fi_fabric(s->info->fabric_attr, &s->fabric, NULL), 0);
    struct fi_eq_attr ea = {.size = 64, .wait_obj = eq_wait};
    REQUIRE_RET(fi_eq_open(s->fabric, &ea, &s->eq, NULL), 0);
}

void side_listen(struct side *s, struct sockaddr_in *addr)
{
    REQUIRE_RET(fi_passive_ep(s->fabric, s->info, &s->pep, NULL), 0);
    REQUIRE_RET(fi_pep_bind(s->pep, &s->eq->fid, 0), 0);
    REQUIRE_RET(fi_listen(s->pep), 0);
    size_t len = sizeof *addr;
    REQUIRE_RET(fi_getname(&s->pep->fid, addr, &len), 0);
    CHECK_EQ(len, sizeof *addr);
    CHECK_EQ(addr->sin_family, AF_INET);
    CHECK(addr->sin_port != 0);
    CHECK_EQ(ntohl(addr->sin_addr.s_addr), INADDR_LOOPBACK);
}

void side_domain(struct side *s, struct fi_info *info)
{
    if (info != s->info) {
        fi_freeinfo(s->info);
        s->info = info;
    }
    REQUIRE_RET(fi_domain(s->fabric, s->info, &s->domain, NULL), 0);
    struct fi_cq_attr ca = {.size = 256, .format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_UNSPEC};
    REQUIRE_RET(fi_cq_open(s->domain, &ca, &s->cq, NULL), 0);
}

void side_endpoint(struct side *s)
{
    REQUIRE_RET(fi_endpoint(s->domain, s->info, &s->ep, NULL), 0);
    REQUIRE_RET(fi_ep_bind(s->ep, &s->eq->fid, 0), 0);
    REQUIRE_RET(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV), 0);
    REQUIRE_RET(fi_enable(s->ep), 0);
}

void side_close(struct side *s)
{
    if (s->ep)
        CHECK_RET(fi_close(&s->ep->fid), 0);
    if (s->pep)
        CHECK_RET(fi_close(&s->pep->fid), 0);
    if (s->cq)
        CHECK_RET(fi_close(&s->cq->fid), 0);
    if (s->domain)
        CHECK_RET(fi_close(&s->domain->fid), 0);
    if (s->eq)
        CHECK_RET(fi_close(&s->eq->fid), 0);
    if (s->fabric)
        CHECK_RET(fi_close(&s->fabric->fid), 0);
    if (s->info)
        fi_freeinfo(s->info);
    memset(s, 0, sizeof *s);
}

static const char *event_name(uint32_t e)
{
    switch (e) {
    case FI_CONNREQ:
        return "FI_CONNREQ";
    case FI_CONNECTED:
        return "FI_CONNECTED";
    case FI_SHUTDOWN:
        return "FI_SHUTDOWN";
    default:
        return "another event";
    }
}

ssize_t eq_expect(const char *file, int line, struct fid_eq *eq, uint32_t want, void *buf,
                  size_t len, int ms)
{
    long long deadline = now_ms() + ms;
    for (;;) {
        uint32_t ev = 0;
        ssize_t n = fi_eq_sread(eq, &ev, buf, len, 100, 0);
        if (n >= 0) {
            if (ev != want)
                h_fail(file, line, "expected %s, got %s (%u)", event_name(want), event_name(ev),
                       ev);
            return n;
        }
        if (n == -FI_EAVAIL) {
            struct fi_eq_err_entry e = {0};
            ssize_t k = fi_eq_readerr(eq, &e, 0);
            h_fail(file, line, "expected %s, got an error entry (readerr %s): err %s", event_name(want),
                   ret_name(k), ret_name(-e.err));
            return n;
        }
        if (n != -FI_EAGAIN) {
            h_fail(file, line, "fi_eq_sread: %s", ret_name(n));
            return n;
        }
        if (now_ms() >= deadline) {
            h_fail(file, line, "no %s within %d ms", event_name(want), ms);
            return n;
        }
    }
}

struct fi_info *take_request(struct side *s, const void *data, size_t len)
{
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 128];
    ssize_t n = EQ_EXPECT(s->eq, FI_CONNREQ, buf, sizeof buf, 10000);
    if (n < 0)
        h_finish();
    struct fi_eq_cm_entry *e = (struct fi_eq_cm_entry *)buf;
    /* The request's private data follows the entry. */
    CHECK_EQ(n, sizeof *e + len);
    CHECK(e->fid == &s->pep->fid);
    REQUIRE(e->info != NULL);
    CHECK(e->info->handle != NULL);
    CHECK(e->info->domain_attr != NULL && strcmp(e->info->domain_attr->name, g_domain) == 0);
    if ((size_t)n == sizeof *e + len)
        CHECK(len == 0 || memcmp(e->data, data, len) == 0);
    return e->info;
}

void side_accept(struct side *s, struct fi_info *req, const void *data, size_t len,
                 void (*post)(struct side *s))
{
    side_domain(s, req);
    side_endpoint(s);
    if (post)
        post(s);
    REQUIRE_RET(fi_accept(s->ep, data, len), 0);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 128];
    ssize_t n = EQ_EXPECT(s->eq, FI_CONNECTED, buf, sizeof buf, 10000);
    if (n < 0)
        h_finish();
    struct fi_eq_cm_entry *e = (struct fi_eq_cm_entry *)buf;
    CHECK(e->fid == &s->ep->fid);
}

size_t side_connect(struct side *s, const struct sockaddr_in *to, const void *data, size_t len,
                    void *got, size_t max)
{
    side_domain(s, s->info);
    side_endpoint(s);
    REQUIRE_RET(fi_connect(s->ep, to, data, len), 0);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 128];
    ssize_t n = EQ_EXPECT(s->eq, FI_CONNECTED, buf, sizeof buf, 10000);
    if (n < 0)
        h_finish();
    struct fi_eq_cm_entry *e = (struct fi_eq_cm_entry *)buf;
    CHECK(e->fid == &s->ep->fid);
    REQUIRE((size_t)n >= sizeof *e);
    size_t k = (size_t)n - sizeof *e;
    if (got)
        memcpy(got, e->data, k < max ? k : max);
    return k;
}

ssize_t cq_take(struct fid_cq *cq, struct fi_cq_data_entry *e, struct fi_cq_err_entry *err,
                int ms)
{
    long long deadline = now_ms() + ms;
    for (;;) {
        ssize_t n = fi_cq_read(cq, e, 1);
        if (n == 1)
            return 1;
        if (n == -FI_EAVAIL) {
            /* A buffer of the caller's for the error data (fi_cq(3)):
             * kept in place, filled with at most its size. */
            char data[16];
            memset(err, 0, sizeof *err);
            err->err_data = data;
            err->err_data_size = sizeof data;
            ssize_t k = fi_cq_readerr(cq, err, 0);
            CHECK_RET(k, 1);
            if (api_before_1_5()) {
                /* The entry of 1.0: no buffer of the caller's, and the
                 * provider has no data of its own. */
                CHECK(err->err_data == NULL);
            } else {
                CHECK(err->err_data == data);
                CHECK(err->err_data_size <= sizeof data);
            }
            err->err_data = NULL;
            return -FI_EAVAIL;
        }
        if (n != -FI_EAGAIN) {
            h_fail(__FILE__, __LINE__, "fi_cq_read: %s", ret_name(n));
            return n;
        }
        if (now_ms() >= deadline)
            return -FI_EAGAIN;
    }
}

int cq_expect(const char *file, int line, struct fid_cq *cq, struct fi_cq_data_entry *e, int ms)
{
    struct fi_cq_err_entry err;
    ssize_t n = cq_take(cq, e, &err, ms);
    if (n == 1)
        return 0;
    if (n == -FI_EAVAIL) {
        char text[256] = "";
        fi_cq_strerror(cq, err.prov_errno, err.err_data, text, sizeof text);
        h_fail(file, line, "a completion error: err %s, flags 0x%llx (%s)", ret_name(-err.err),
               (unsigned long long)err.flags, text);
    } else {
        h_fail(file, line, "no completion within %d ms (%s)", ms, ret_name(n));
    }
    return -1;
}

void region_reg(struct side *s, struct region *r, size_t len, uint64_t access)
{
    memset(r, 0, sizeof *r);
    r->len = len;
    r->buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
    REQUIRE(r->buf != NULL);
    memset(r->buf, 0, len);
    REQUIRE_RET(fi_mr_reg(s->domain, r->buf, len, access, 0, 0, 0, &r->mr, NULL), 0);
    r->desc = fi_mr_desc(r->mr);
    r->key = fi_mr_key(r->mr);
}

void region_close(struct region *r)
{
    if (r->mr)
        CHECK_RET(fi_close(&r->mr->fid), 0);
    free(r->buf);
    memset(r, 0, sizeof *r);
}
