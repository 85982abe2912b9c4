/*
 * The conformance suite's harness: test registration, checks that record
 * file:line and continue, skips with a reason, and the processes a test
 * runs in.
 *
 * Every test runs in a process of its own (forked by the runner), so a
 * crash or a hang fails that test only. A two-sided test forks its peer
 * from there with peer_start(); the peer's checks count toward the test.
 * Both processes get an alarm() as the last guard against a hang, and the
 * runner kills whatever is left of a test's process group and reaps it.
 *
 * Rule for two-sided tests: fork the peer before this process opens a NIC
 * (a library with threads running must not be forked).
 */
#ifndef CONFORMANCE_HARNESS_H
#define CONFORMANCE_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "vipl.h"

/* ---- Tests ---------------------------------------------------------------- */

struct test {
    const char *area;
    const char *name;
    void (*fn)(int arg);
    int arg;
    /* Seconds before the test's alarm fires (0: the default). */
    unsigned limit;
};

/* Each area's table, ended by an entry with a NULL name. */
extern const struct test nic_tests[];
extern const struct test ptag_tests[];
extern const struct test mem_tests[];
extern const struct test vi_tests[];
extern const struct test data_tests[];
extern const struct test rdma_tests[];
extern const struct test rel_tests[];
extern const struct test cq_tests[];
extern const struct test notify_tests[];
extern const struct test cm_tests[];
extern const struct test ns_tests[];
extern const struct test internal_tests[];
extern const struct test hostile_tests[];

/* ---- What the run is about ------------------------------------------------ */

/* The device under test, and the device the peer of a two-sided test opens
 * (the same unless the runner says otherwise), and the network namespace
 * the peer enters first (NULL: none). */
extern const char *g_device;
extern const char *g_peer_device;
extern const char *g_peer_netns;

/* The device's attributes, read once by the runner (in a process of its
 * own). LocalNicAddress points at g_nic_address. */
extern VIP_NIC_ATTRIBUTES g_nic;
extern char g_nic_address[VIPL_HOST_ADDRESS_LEN + 1];
/* "shm", "udp" or "xdp": the provider behind g_device. */
extern const char *g_provider;

extern const struct test *g_test;
extern int g_verbose;

/* ---- Checks --------------------------------------------------------------- */

void h_count(void);
void h_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Ends the test (or the peer) now: REQUIRE failed or the test skips. */
void h_finish(void) __attribute__((noreturn));
void h_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* True in a peer's process. */
int h_is_peer(void);
/* Removes path when this process's part of the test ends. */
void h_unlink_at_end(const char *path);
/* A line for -v runs. */
void h_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

const char *vip_ret_name(VIP_RETURN r);
/* "DONE|OP_RECEIVE|LENGTH_ERROR"; the buffer is the caller's. */
const char *status_name(uint32_t status, char *buf, size_t len);
const char *state_name(VIP_VI_STATE s);
/* The same without the operation: "DONE|LENGTH_ERROR". */
const char *bits_name(uint32_t status, char *buf, size_t len);

#define CHECK(cond)                                                            \
    do {                                                                       \
        h_count();                                                             \
        if (!(cond))                                                           \
            h_fail(__FILE__, __LINE__, "%s", #cond);                           \
    } while (0)

#define CHECKF(cond, ...)                                                      \
    do {                                                                       \
        h_count();                                                             \
        if (!(cond))                                                           \
            h_fail(__FILE__, __LINE__, __VA_ARGS__);                           \
    } while (0)

/* A call's VIP_RETURN against the one expected; evaluates to the result. */
#define CHECK_RET(expr, want)                                                  \
    check_ret(__FILE__, __LINE__, #expr, (expr), (want))
VIP_RETURN check_ret(const char *file, int line, const char *what, VIP_RETURN got,
                     VIP_RETURN want);

#define CHECK_EQ(got, want)                                                    \
    do {                                                                       \
        unsigned long long g_ = (unsigned long long)(got);                     \
        unsigned long long w_ = (unsigned long long)(want);                    \
        h_count();                                                             \
        if (g_ != w_)                                                          \
            h_fail(__FILE__, __LINE__, "%s: expected %s = %llu (0x%llx), got %llu (0x%llx)", \
                   #got, #want, w_, w_, g_, g_);                               \
    } while (0)

/* A VI's state against the one expected. */
#define CHECK_STATE(vi, want) check_state(__FILE__, __LINE__, #vi, (vi), (want))
void check_state(const char *file, int line, const char *what, VIP_VI_HANDLE vi,
                 VIP_VI_STATE want);

/*
 * A completed descriptor's status: VIP_STATUS_DONE, the operation `op`
 * (VIP_STATUS_OP_*), exactly the error bits `err`, the immediate bit when
 * `imm` is 1 and not when it is 0 (-1: either), no reserved bit.
 */
#define CHECK_STATUS(desc, op, err, imm)                                       \
    check_status(__FILE__, __LINE__, #desc, (desc), (op), (err), (imm))
void check_status(const char *file, int line, const char *what, const VIP_DESCRIPTOR *d,
                  uint32_t op, uint32_t err, int imm);

/* Like CHECK, but ends the test when the condition fails. */
#define REQUIRE(cond)                                                          \
    do {                                                                       \
        h_count();                                                             \
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

/* ---- Processes -------------------------------------------------------------- */

/*
 * A peer process and the channel to it: framed messages over two pipes.
 * Messages carry a tag and up to CHAN_MAX bytes.
 */
#define CHAN_MAX 512

struct chan {
    int rfd, wfd;
};

struct peer {
    pid_t pid;
    struct chan c;
    int result_fd;
    int done;
};

/* Forks a peer that runs fn(channel to the test, arg) and exits. The peer's
 * checks are merged into the test's when it is reaped. */
void peer_start(struct peer *p, void (*fn)(struct chan *c, void *arg), void *arg);
/* Waits up to ms for the peer to exit and reaps it (killed, and a failure
 * recorded, if it is still running then). */
void peer_end(struct peer *p, int ms);
/* Kills the peer at once (kill -9) and reaps it; no failure. */
void peer_kill(struct peer *p);

/* Sends a message; 0 on success. */
int chan_send(struct chan *c, int tag, const void *data, size_t len);
/* Waits up to ms for a message; returns its tag (>= 0) and copies up to max
 * bytes into buf (length in *len if not NULL), or -1 on timeout or EOF. */
int chan_recv(struct chan *c, int ms, void *buf, size_t max, size_t *len);
/* Waits for a message with tag `tag`, failing the check otherwise; the
 * message's bytes go to buf. Returns 0 if it came. */
#define CHAN_EXPECT(c, ms, tag, buf, max)                                      \
    chan_expect(__FILE__, __LINE__, (c), (ms), (tag), (buf), (max))
int chan_expect(const char *file, int line, struct chan *c, int ms, int tag, void *buf,
                size_t max);

/* Milliseconds on a monotonic clock. */
long long now_ms(void);
void sleep_ms(int ms);

#endif
