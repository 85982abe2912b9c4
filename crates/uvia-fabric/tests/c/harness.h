/*
 * The libfabric suite's harness: checks that record file:line and carry
 * on, the processes a test runs in, and the objects of one side of a
 * connection (fabric, EQ, listener, domain, CQ, endpoint) over the uvia
 * provider's domain under test.
 *
 * Every test runs in a process of its own (forked by the runner), so a
 * crash or a hang fails that test only; an alarm() is the last guard in
 * it and in its peer. A two-sided test forks its peer with peer_start()
 * before it makes its first libfabric call (a library with threads
 * running must not be forked); the peer's failures count toward the test.
 */
#ifndef FI_CONFORMANCE_HARNESS_H
#define FI_CONFORMANCE_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* ---- Tests ---------------------------------------------------------------- */

struct test {
    const char *area;
    const char *name;
    void (*fn)(void);
    /* Seconds before the test's alarm fires (0: the default, 20). */
    unsigned limit;
};

/* The domain under test ("shm", "udp"). */
extern const char *g_domain;
extern const struct test *g_test;
extern int g_verbose;

/* ---- Checks --------------------------------------------------------------- */

void h_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Ends this process's part of the test now (a REQUIRE failed). */
void h_finish(void) __attribute__((noreturn));
/* A line for -v runs. */
void h_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "-FI_EAGAIN (Resource temporarily unavailable)" for a return code. */
const char *ret_name(long long r);

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond))                                                           \
            h_fail(__FILE__, __LINE__, "%s", #cond);                           \
    } while (0)

#define CHECKF(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond))                                                           \
            h_fail(__FILE__, __LINE__, __VA_ARGS__);                           \
    } while (0)

#define CHECK_EQ(got, want)                                                    \
    do {                                                                       \
        unsigned long long g_ = (unsigned long long)(got);                     \
        unsigned long long w_ = (unsigned long long)(want);                    \
        if (g_ != w_)                                                          \
            h_fail(__FILE__, __LINE__, "%s: expected %s = %llu (0x%llx), got %llu (0x%llx)", \
                   #got, #want, w_, w_, g_, g_);                               \
    } while (0)

/* A libfabric call's return code against the one expected (0, -FI_E...);
 * evaluates to the code. */
#define CHECK_RET(expr, want) check_ret(__FILE__, __LINE__, #expr, (expr), (want))
long long check_ret(const char *file, int line, const char *what, long long got, long long want);

#define REQUIRE(cond)                                                          \
    do {                                                                       \
        if (!(cond)) {                                                         \
            h_fail(__FILE__, __LINE__, "required: %s", #cond);                 \
            h_finish();                                                        \
        }                                                                      \
    } while (0)

#define REQUIRE_RET(expr, want)                                                \
    do {                                                                       \
        if (check_ret(__FILE__, __LINE__, #expr, (expr), (want)) != (want))    \
            h_finish();                                                        \
    } while (0)

/* ---- Processes ------------------------------------------------------------ */

/* A channel between a test and its peer: length-framed messages over two
 * pipes. */
struct chan {
    int rfd, wfd;
};

struct peer {
    pid_t pid;
    struct chan c;
    int done;
};

/* Forks a peer that runs fn(channel to the test) and exits with its
 * failure count. */
void peer_start(struct peer *p, void (*fn)(struct chan *c));
/* Waits up to ms for the peer to exit and counts its failures (killed,
 * and a failure, if it still runs then). */
void peer_end(struct peer *p, int ms);
/* Kills the peer at once (SIGKILL) and reaps it; no failure. */
void peer_kill(struct peer *p);

/* Sends a message of up to 255 bytes; 0 on success. */
int chan_send(struct chan *c, const void *data, size_t len);
/* Waits up to ms for a message and copies up to max bytes of it into buf;
 * its length, or -1 on timeout or end of file. */
int chan_recv(struct chan *c, int ms, void *buf, size_t max);
/* Waits for a message of exactly len bytes (a failure otherwise). */
#define CHAN_EXPECT(c, ms, buf, len)                                           \
    chan_expect(__FILE__, __LINE__, (c), (ms), (buf), (len))
int chan_expect(const char *file, int line, struct chan *c, int ms, void *buf, size_t len);

long long now_ms(void);
void sleep_ms(int ms);

/* ---- One side's libfabric objects ----------------------------------------- */

struct side {
    struct fi_info *info;   /* the domain's info (getinfo's, or a request's) */
    struct fid_fabric *fabric;
    struct fid_eq *eq;
    struct fid_pep *pep;
    struct fid_domain *domain;
    struct fid_cq *cq;      /* both queues of the endpoint report here */
    struct fid_ep *ep;
};

/* The info of the domain under test (FI_EP_MSG, messages and RMA); the
 * caller frees it. */
struct fi_info *domain_info(void);
/* True when the suite asks for an interface older than 1.5
 * (FI_CONFORMANCE_API=1.4): registration in the old words, and error
 * entries of 1.0, which end before err_data_size and carry no buffer of
 * the caller's. */
int api_before_1_5(void);
/* The bytes fi_eq_readerr returns for one error entry at that interface. */
ssize_t eq_err_entry_size(void);
/* Fabric and EQ (wait object eq_wait); the info is getinfo's. */
void side_open(struct side *s, enum fi_wait_obj eq_wait);
/* A listener bound to the EQ; its address in *addr. */
void side_listen(struct side *s, struct sockaddr_in *addr);
/* Domain and CQ from info (kept in s->info, which the side frees). */
void side_domain(struct side *s, struct fi_info *info);
/* An endpoint on s->info bound to the EQ and the CQ, enabled. */
void side_endpoint(struct side *s);
/* Closes what is open, endpoint first. */
void side_close(struct side *s);

/* Reads the EQ until event `want` arrives (up to ms), into buf of len
 * bytes; the read's length. An error entry (fi_eq_readerr) is a failure
 * and returns -FI_EAVAIL. */
#define EQ_EXPECT(eq, want, buf, len, ms)                                      \
    eq_expect(__FILE__, __LINE__, (eq), (want), (buf), (len), (ms))
ssize_t eq_expect(const char *file, int line, struct fid_eq *eq, uint32_t want, void *buf,
                  size_t len, int ms);

/* A listener's side: waits for a request, checks its private data, and
 * returns the request's info (the caller answers it). */
struct fi_info *take_request(struct side *s, const void *data, size_t len);
/* Accepts `req` (whose info the side keeps) on a new endpoint with private
 * data, and waits for FI_CONNECTED. post() runs between enable and accept
 * (receives posted before the peer can send). */
void side_accept(struct side *s, struct fi_info *req, const void *data, size_t len,
                 void (*post)(struct side *s));
/* The connecting side: domain, endpoint, fi_connect with private data, and
 * FI_CONNECTED; the accept's private data goes to got (up to max bytes),
 * its length is returned. */
size_t side_connect(struct side *s, const struct sockaddr_in *to, const void *data, size_t len,
                    void *got, size_t max);

/* Takes one completion within ms: 1 with the entry, -FI_EAVAIL with the
 * error entry in *err, -FI_EAGAIN after ms with neither. */
ssize_t cq_take(struct fid_cq *cq, struct fi_cq_data_entry *e, struct fi_cq_err_entry *err,
                int ms);
/* Takes one completion and fails the test unless it is a success. */
#define CQ_EXPECT(cq, e, ms) cq_expect(__FILE__, __LINE__, (cq), (e), (ms))
int cq_expect(const char *file, int line, struct fid_cq *cq, struct fi_cq_data_entry *e, int ms);

/* A registered buffer. */
struct region {
    uint8_t *buf;
    size_t len;
    struct fid_mr *mr;
    void *desc;
    uint64_t key;
};

void region_reg(struct side *s, struct region *r, size_t len, uint64_t access);
void region_close(struct region *r);
/* The byte pattern `seed` names at offset i. */
static inline uint8_t pattern(unsigned seed, size_t i)
{
    return (uint8_t)(i * 7 + seed * 13 + (i >> 8));
}
void fill(uint8_t *p, size_t len, unsigned seed);
/* Checks len bytes against the pattern; the first difference is a failure. */
#define CHECK_PATTERN(p, len, seed) check_pattern(__FILE__, __LINE__, (p), (len), (seed))
void check_pattern(const char *file, int line, const uint8_t *p, size_t len, unsigned seed);

#endif
