/*
 * fi_msg_bw: one-way bandwidth over a libfabric connected endpoint
 * (FI_EP_MSG), measured as `uvia bw` measures uvia's: a sender keeps up to
 * a window of sends in flight, the receiver answers each batch of messages
 * with a small acknowledgement, and the sender times the batches.
 *
 * Debian's libfabric-bin ships fi_pingpong only (libfabric's own bandwidth
 * tests come with fabtests, which Debian does not package), and a
 * ping-pong's bytes per second are not a stream's: `uvia fabric` builds
 * this program to set a libfabric provider's streaming bandwidth beside
 * `uvia bw`'s.
 *
 * The program forks before its first libfabric call: the parent receives
 * (the listener), the child sends; the listener's address goes to the
 * child through a pipe. By default every message uses one send and one
 * receive buffer, as `uvia bw` does; with -c each message in flight has
 * its own, filled with a pattern of its number and checked whole on
 * arrival, with its length.
 *
 * Output, from the sender, one line:
 *   size <bytes> iters <messages> seconds <s> MB/s <10^6 bytes/s> msgs/s <n>
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

struct opts {
    const char *prov;
    const char *domain;
    size_t size;
    long iters;
    long warm;
    long batches;
    int window;
    int check;
    int server_core, client_core;
    unsigned timeout;
};

/* One side's libfabric objects. */
struct side {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_eq *eq;
    struct fid_pep *pep;
    struct fid_domain *domain;
    struct fid_cq *txcq, *rxcq;
    struct fid_ep *ep;
    struct fid_mr *mr, *ack_mr;
    char *buf;
    uint64_t ack;
};

static const char *g_role = "fi_msg_bw";

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fi_msg_bw: %s: ", g_role);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* A libfabric call that must return 0. */
#define CALL(expr)                                                                   \
    do {                                                                             \
        int r_ = (int)(expr);                                                        \
        if (r_ != 0)                                                                 \
            die("%s: %s (%d)", #expr, fi_strerror(-r_), r_);                         \
    } while (0)

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "fi_msg_bw: gave up: the run took longer than -t allows\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(1);
}

/* The receiver ends at once when the sender fails: it would wait for it. */
static void on_child(int sig)
{
    (void)sig;
    int saved = errno;
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
        _exit(1);
    if (p > 0)
        signal(SIGCHLD, SIG_DFL);
    errno = saved;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fi_msg_bw [options]\n"
            "One-way bandwidth over a libfabric FI_EP_MSG endpoint on this host: the\n"
            "sender keeps a window of sends in flight, the receiver acknowledges each\n"
            "batch, the sender times the batches (as `uvia bw`). Forks its two sides.\n"
            "  -p PROV    provider (default uvia; FI_PROVIDER_PATH finds it)\n"
            "  -d DOMAIN  domain name (uvia: shm, udp, xdp:<interface>)\n"
            "  -S SIZE    message size in bytes (default 1048576)\n"
            "  -I N       timed messages (default 10000)\n"
            "  -w N       untimed messages first (default: a tenth of -I, 10 to 10000)\n"
            "  -W N       sends in flight at most (default 64)\n"
            "  -b N       batches, each acknowledged (default: 20, at most -I)\n"
            "  -c         a buffer per message in flight, every byte checked\n"
            "  -s CORE    pin the receiver to CORE   -C CORE  the sender\n"
            "  -t SECS    give up after SECS (default 120)\n");
}

static long number(const char *s, const char *what, long min, long max)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "fi_msg_bw: %s must be a number from %ld to %ld, not \"%s\"\n", what,
                min, max, s);
        exit(2);
    }
    return v;
}

static void pin(int core)
{
    if (core < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "fi_msg_bw: %s: warning: cannot pin to core %d (%s); running unpinned\n",
                g_role, core, strerror(errno));
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static struct fi_info *get_info(const struct opts *o, const char *node, uint64_t flags)
{
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    if (hints == NULL)
        die("fi_allocinfo: out of memory");
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG;
    hints->addr_format = FI_SOCKADDR_IN;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(o->prov);
    /* Queues for the window and the acknowledgement: a provider that has
     * no such depth says so here rather than refusing posts later. */
    hints->tx_attr->size = (size_t)o->window + 1;
    hints->rx_attr->size = (size_t)o->window + 1;
    if (o->domain != NULL)
        hints->domain_attr->name = strdup(o->domain);
    int r = fi_getinfo(FI_VERSION(1, 17), node, NULL, flags, hints, &info);
    fi_freeinfo(hints);
    if (r != 0)
        die("fi_getinfo for provider %s%s%s: %s (is it on FI_PROVIDER_PATH, with that domain "
            "and queues %d deep for -W %d?)",
            o->prov, o->domain ? ", domain " : "", o->domain ? o->domain : "", fi_strerror(-r),
            o->window + 1, o->window);
    return info;
}

/* Waits for the event `want` on the side's EQ; the entry's info, if any. */
static struct fi_info *expect_event(struct side *s, uint32_t want, const char *name)
{
    /* Room for private data a provider may add to the event. */
    union {
        struct fi_eq_cm_entry e;
        uint8_t bytes[sizeof(struct fi_eq_cm_entry) + 512];
    } buf;
    uint32_t ev = 0;
    for (;;) {
        ssize_t n = fi_eq_sread(s->eq, &ev, &buf, sizeof buf, 1000, 0);
        /* (EINTR: the sender ended and SIGCHLD came in.) */
        if (n == -FI_EAGAIN || n == -FI_EINTR)
            continue;
        if (n == -FI_EAVAIL) {
            struct fi_eq_err_entry err = {0};
            fi_eq_readerr(s->eq, &err, 0);
            die("waiting for %s: %s", name, fi_strerror(err.err));
        }
        if (n < 0)
            die("fi_eq_sread waiting for %s: %s", name, fi_strerror((int)-n));
        if (ev != want)
            die("waiting for %s, got event %u", name, ev);
        return buf.e.info;
    }
}

static void open_objects(struct side *s, const struct opts *o, size_t buf_len)
{
    CALL(fi_domain(s->fabric, s->info, &s->domain, NULL));
    struct fi_cq_attr ca = {
        .size = (size_t)o->window * 2 + 16,
        .format = FI_CQ_FORMAT_MSG,
        .wait_obj = FI_WAIT_NONE,
    };
    CALL(fi_cq_open(s->domain, &ca, &s->txcq, NULL));
    CALL(fi_cq_open(s->domain, &ca, &s->rxcq, NULL));
    CALL(fi_endpoint(s->domain, s->info, &s->ep, NULL));
    CALL(fi_ep_bind(s->ep, &s->eq->fid, 0));
    CALL(fi_ep_bind(s->ep, &s->txcq->fid, FI_TRANSMIT));
    CALL(fi_ep_bind(s->ep, &s->rxcq->fid, FI_RECV));
    CALL(fi_enable(s->ep));
    s->buf = aligned_alloc(4096, (buf_len + 4095) / 4096 * 4096);
    if (s->buf == NULL)
        die("allocating %zu bytes", buf_len);
    memset(s->buf, 0, buf_len);
    /* Keys 1 and 2 for providers that take the caller's (FI_MR_PROV_KEY unset). */
    CALL(fi_mr_reg(s->domain, s->buf, buf_len, FI_SEND | FI_RECV, 0, 1, 0, &s->mr, NULL));
    CALL(fi_mr_reg(s->domain, &s->ack, sizeof s->ack, FI_SEND | FI_RECV, 0, 2, 0, &s->ack_mr,
                   NULL));
}

static void close_side(struct side *s)
{
    struct fid *fids[] = {
        s->ep ? &s->ep->fid : NULL,         s->mr ? &s->mr->fid : NULL,
        s->ack_mr ? &s->ack_mr->fid : NULL, s->txcq ? &s->txcq->fid : NULL,
        s->rxcq ? &s->rxcq->fid : NULL,     s->pep ? &s->pep->fid : NULL,
        s->domain ? &s->domain->fid : NULL, s->eq ? &s->eq->fid : NULL,
        s->fabric ? &s->fabric->fid : NULL,
    };
    for (size_t i = 0; i < sizeof fids / sizeof fids[0]; i++)
        if (fids[i] != NULL)
            fi_close(fids[i]);
    fi_freeinfo(s->info);
    free(s->buf);
}

/* One completion from `cq` (spinning); its length, and its context in
 * `ctx` if asked. */
static size_t reap_ctx(struct fid_cq *cq, const char *what, void **ctx)
{
    struct fi_cq_msg_entry e;
    for (;;) {
        ssize_t n = fi_cq_read(cq, &e, 1);
        if (n == 1) {
            if (ctx != NULL)
                *ctx = e.op_context;
            return e.len;
        }
        if (n == -FI_EAGAIN)
            continue;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            fi_cq_readerr(cq, &err, 0);
            die("%s completed with an error: %s", what, fi_strerror(err.err));
        }
        die("fi_cq_read (%s): %s", what, fi_strerror((int)-n));
    }
}

static size_t reap(struct fid_cq *cq, const char *what)
{
    return reap_ctx(cq, what, NULL);
}

/* The pattern of message `i`: its number, then bytes that depend on it. */
static void fill(char *p, size_t n, uint64_t i)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (char)(i * 131 + k * 7 + k / 4099);
    if (n >= sizeof i)
        memcpy(p, &i, sizeof i);
}

static void check(const char *p, size_t n, uint64_t i)
{
    uint64_t got = 0;
    if (n >= sizeof got) {
        memcpy(&got, p, sizeof got);
        if (got != i)
            die("message %llu arrived as number %llu (out of order or lost)",
                (unsigned long long)i, (unsigned long long)got);
    }
    for (size_t k = n >= sizeof i ? sizeof i : 0; k < n; k++)
        if (p[k] != (char)(i * 131 + k * 7 + k / 4099))
            die("message %llu: byte %zu differs from what was sent", (unsigned long long)i, k);
}

/* Posts a receive into slot `slot` (with -c; else the one buffer), the
 * slot plus one its context. The queue was asked for the window's depth,
 * so a refusal is an error, not a wait. */
static void post_recv(struct side *s, const struct opts *o, size_t slot)
{
    char *at = s->buf + (o->check ? slot * o->size : 0);
    ssize_t r = fi_recv(s->ep, at, o->size, fi_mr_desc(s->mr), 0, (void *)(uintptr_t)(slot + 1));
    if (r != 0)
        die("fi_recv: %s", fi_strerror((int)-r));
}

static void send_ack(struct side *s)
{
    ssize_t r;
    while ((r = fi_send(s->ep, &s->ack, sizeof s->ack, fi_mr_desc(s->ack_mr), 0, NULL)) ==
           -FI_EAGAIN)
        fi_cq_read(s->txcq, NULL, 0);
    if (r != 0)
        die("fi_send (acknowledgement): %s", fi_strerror((int)-r));
    reap(s->txcq, "the acknowledgement's send");
}

/* Messages per batch and batches, warm-up (one batch) first. */
static void batches(const struct opts *o, long *nb, long *per)
{
    *nb = o->batches < o->iters ? o->batches : o->iters;
    *per = (o->iters + *nb - 1) / *nb;
}

/* 0 once the sender has ended well (or the SIGCHLD handler reaped it,
 * which it does only then), 1 if it failed. */
static int wait_sender(pid_t child)
{
    signal(SIGCHLD, SIG_DFL);
    int st = 0;
    pid_t p;
    while ((p = waitpid(child, &st, 0)) < 0 && errno == EINTR)
        ;
    return p == child && (!WIFEXITED(st) || WEXITSTATUS(st) != 0);
}

static int receiver(const struct opts *o, int wfd, pid_t child)
{
    g_role = "receiver";
    pin(o->server_core);
    struct side s = {0};
    s.info = get_info(o, "127.0.0.1", FI_SOURCE);
    CALL(fi_fabric(s.info->fabric_attr, &s.fabric, NULL));
    struct fi_eq_attr ea = {.size = 16, .wait_obj = FI_WAIT_UNSPEC};
    CALL(fi_eq_open(s.fabric, &ea, &s.eq, NULL));
    CALL(fi_passive_ep(s.fabric, s.info, &s.pep, NULL));
    CALL(fi_pep_bind(s.pep, &s.eq->fid, 0));
    CALL(fi_listen(s.pep));
    char name[128];
    size_t len = sizeof name;
    CALL(fi_getname(&s.pep->fid, name, &len));
    if (write(wfd, &len, sizeof len) != sizeof len || write(wfd, name, len) != (ssize_t)len)
        die("handing the address to the sender: %s", strerror(errno));
    close(wfd);

    struct fi_info *req = expect_event(&s, FI_CONNREQ, "the connection request");
    fi_freeinfo(s.info);
    s.info = req;
    open_objects(&s, o, o->check ? o->size * (size_t)o->window : o->size);
    long nb, per;
    batches(o, &nb, &per);
    long total = o->warm + nb * per;
    long posted = 0;
    for (; posted < o->window && posted < total; posted++)
        post_recv(&s, o, (size_t)posted);
    CALL(fi_accept(s.ep, NULL, 0));
    expect_event(&s, FI_CONNECTED, "the connection");

    for (long i = 0; i < total; i++) {
        void *ctx = NULL;
        size_t n = reap_ctx(s.rxcq, "a receive", &ctx);
        size_t slot = ctx != NULL ? (uintptr_t)ctx - 1 : 0;
        if (n != o->size)
            die("message %ld: %zu bytes where %zu were sent", i, n, o->size);
        /* (Messages on a connected endpoint arrive in order: the number
         * checks that too.) */
        if (o->check)
            check(s.buf + slot * o->size, n, (uint64_t)i);
        if (posted < total) {
            post_recv(&s, o, slot);
            posted++;
        }
        long timed = i + 1 - o->warm;
        if (i + 1 == o->warm || (timed > 0 && timed % per == 0))
            send_ack(&s);
    }
    /* The sender closes first, once it has the last acknowledgement: its
     * end, not an FI_SHUTDOWN (some providers report none to a program
     * that reads only its EQ), says it is done with the connection. */
    int rc = wait_sender(child);
    close_side(&s);
    return rc;
}

static int sender(const struct opts *o, int rfd)
{
    g_role = "sender";
    pin(o->client_core);
    size_t len = 0;
    char name[128];
    if (read(rfd, &len, sizeof len) != sizeof len || len > sizeof name ||
        read(rfd, name, len) != (ssize_t)len)
        die("no address from the receiver (it failed)");
    close(rfd);
    struct side s = {0};
    s.info = get_info(o, NULL, 0);
    CALL(fi_fabric(s.info->fabric_attr, &s.fabric, NULL));
    struct fi_eq_attr ea = {.size = 16, .wait_obj = FI_WAIT_UNSPEC};
    CALL(fi_eq_open(s.fabric, &ea, &s.eq, NULL));
    open_objects(&s, o, o->check ? o->size * (size_t)o->window : o->size);
    if (!o->check)
        memset(s.buf, 0x5a, o->size);
    CALL(fi_recv(s.ep, &s.ack, sizeof s.ack, fi_mr_desc(s.ack_mr), 0, NULL));
    CALL(fi_connect(s.ep, name, NULL, 0));
    expect_event(&s, FI_CONNECTED, "the connection");

    long nb, per;
    batches(o, &nb, &per);
    long sent = 0;
    int in_flight = 0;
    /* With -c, which slots a send still reads: a send's context names its
     * slot (plus one), as completions need not come in order. */
    char *busy = calloc((size_t)o->window, 1);
    if (busy == NULL)
        die("allocating %d bytes", o->window);
#define DONE_ONE()                                                                   \
    do {                                                                             \
        void *ctx_ = NULL;                                                           \
        reap_ctx(s.txcq, "a send", &ctx_);                                           \
        if (ctx_ != NULL)                                                            \
            busy[(uintptr_t)ctx_ - 1] = 0;                                           \
        in_flight--;                                                                 \
    } while (0)
    double timed_s = 0;
    for (long b = -1; b < nb; b++) {
        long count = b < 0 ? o->warm : per;
        if (count == 0)
            continue;
        double t0 = now_s();
        for (long k = 0; k < count; k++, sent++) {
            while (in_flight >= o->window)
                DONE_ONE();
            char *at = s.buf;
            void *ctx = NULL;
            if (o->check) {
                size_t slot = (size_t)(sent % o->window);
                while (busy[slot])
                    DONE_ONE();
                busy[slot] = 1;
                ctx = (void *)(uintptr_t)(slot + 1);
                at += slot * o->size;
                fill(at, o->size, (uint64_t)sent);
            }
            ssize_t r;
            while ((r = fi_send(s.ep, at, o->size, fi_mr_desc(s.mr), 0, ctx)) == -FI_EAGAIN) {
                if (in_flight > 0)
                    DONE_ONE();
            }
            if (r != 0)
                die("fi_send of message %ld: %s", sent, fi_strerror((int)-r));
            in_flight++;
        }
        while (in_flight > 0)
            DONE_ONE();
        reap(s.rxcq, "the acknowledgement");
        CALL(fi_recv(s.ep, &s.ack, sizeof s.ack, fi_mr_desc(s.ack_mr), 0, NULL));
        if (b >= 0)
            timed_s += now_s() - t0;
    }
#undef DONE_ONE
    free(busy);
    long msgs = nb * per;
    printf("size %zu iters %ld seconds %.6f MB/s %.3f msgs/s %.1f\n", o->size, msgs, timed_s,
           timed_s > 0 ? (double)o->size * (double)msgs / timed_s / 1e6 : 0.0,
           timed_s > 0 ? (double)msgs / timed_s : 0.0);
    fflush(stdout);
    close_side(&s);
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {
        .prov = "uvia",
        .size = 1 << 20,
        .iters = 10000,
        .warm = -1,
        .batches = 20,
        .window = 64,
        .server_core = -1,
        .client_core = -1,
        .timeout = 120,
    };
    int c;
    while ((c = getopt(argc, argv, "p:d:S:I:w:W:b:cs:C:t:h")) != -1) {
        switch (c) {
        case 'p':
            o.prov = optarg;
            break;
        case 'd':
            o.domain = optarg;
            break;
        case 'S':
            o.size = (size_t)number(optarg, "-S", 1, 1L << 32);
            break;
        case 'I':
            o.iters = number(optarg, "-I", 1, 1L << 40);
            break;
        case 'w':
            o.warm = number(optarg, "-w", 0, 1L << 40);
            break;
        case 'W':
            o.window = (int)number(optarg, "-W", 1, 4096);
            break;
        case 'b':
            o.batches = number(optarg, "-b", 1, 1L << 40);
            break;
        case 'c':
            o.check = 1;
            break;
        case 's':
            o.server_core = (int)number(optarg, "-s", 0, CPU_SETSIZE - 1);
            break;
        case 'C':
            o.client_core = (int)number(optarg, "-C", 0, CPU_SETSIZE - 1);
            break;
        case 't':
            o.timeout = (unsigned)number(optarg, "-t", 1, 86400);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    if (o.warm < 0) {
        o.warm = o.iters / 10;
        o.warm = o.warm < 10 ? 10 : o.warm > 10000 ? 10000 : o.warm;
    }
    if (o.check && o.size > ((size_t)1 << 34) / (size_t)o.window) {
        fprintf(stderr, "fi_msg_bw: with -c the window's buffers (-W x -S) are at most 16 GiB\n");
        return 2;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        perror("fi_msg_bw: pipe");
        return 1;
    }
    signal(SIGCHLD, on_child);
    pid_t child = fork();
    if (child < 0) {
        perror("fi_msg_bw: fork");
        return 1;
    }
    /* The last guard against a hang, in both processes. */
    signal(SIGALRM, on_alarm);
    alarm(o.timeout);
    if (child == 0) {
        /* And the sender when the receiver goes. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            return 1;
        close(fds[1]);
        return sender(&o, fds[0]);
    }
    close(fds[0]);
    return receiver(&o, fds[1], child);
}
