/*
 * The uvia libfabric provider's conformance suite, written against
 * libfabric's own headers (rdma/fabric.h and friends) only: what a program
 * sees of the provider, domain by domain (shm, udp; loopback only).
 *
 *     fi_conformance [-v] [-l] [-t PATTERN] DOMAIN
 *
 * prints `ok   area/name` or `FAIL area/name` per test, the failed checks
 * under it, and a summary line; it exits non-zero if anything failed.
 * FI_PROVIDER_PATH must name a folder holding libuvia-fi.so.
 *
 * Where libfabric leaves a choice to the provider, the test pins down the
 * provider's choice and says so in a comment ("uvia:").
 */
#include "harness.h"

#include <errno.h>
#include <fnmatch.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rdma/fi_atomic.h>
#include <rdma/fi_tagged.h>

/* What a server hands its client in the accept's private data: where its
 * region is. */
struct remote {
    uint64_t addr;
    uint64_t key;
    uint64_t len;
};

/* ---- Two-sided tests: the test process listens, its peer connects --------- */

/* Listens and tells the peer where. */
static void serve(struct side *s, struct peer *p, enum fi_wait_obj eq_wait)
{
    struct sockaddr_in a;
    side_open(s, eq_wait);
    side_listen(s, &a);
    REQUIRE(chan_send(&p->c, &a, sizeof a) == 0);
}

/* The peer's side of serve(): the listener's address. */
static void listener_address(struct chan *c, struct sockaddr_in *a)
{
    if (CHAN_EXPECT(c, 10000, a, sizeof *a) != 0)
        h_finish();
}

/* The peer's side of serve() up to the connection: opens `s` and connects
 * it to the listener with the request's private data, returning the
 * accept's length (copied into `got`, at most `cap` bytes). */
static size_t peer_connect(struct chan *c, struct side *s, const void *data, size_t len,
                           void *got, size_t cap)
{
    struct sockaddr_in a;
    listener_address(c, &a);
    side_open(s, FI_WAIT_UNSPEC);
    return side_connect(s, &a, data, len, got, cap);
}

/* A one-byte step between the two processes. */
static void step_send(struct chan *c)
{
    CHECK(chan_send(c, "s", 1) == 0);
}

static void step_wait(struct chan *c)
{
    char b;
    if (CHAN_EXPECT(c, 15000, &b, 1) != 0)
        h_finish();
}

/* step_wait() for the target of RDMA: the domains make progress in the
 * program's calls (FI_PROGRESS_MANUAL; uvia: on shm the target's side of
 * an RDMA read or write runs in its CQ reads), so the target keeps reading
 * its CQ, where nothing may appear, while it waits. */
static void step_wait_reading(struct chan *c, struct fid_cq *cq)
{
    char b;
    for (long long end = now_ms() + 15000; now_ms() < end;) {
        struct fi_cq_data_entry e;
        struct fi_cq_err_entry err;
        ssize_t n = cq_take(cq, &e, &err, 1);
        CHECKF(n == -FI_EAGAIN, "an unexpected completion (%s, err %s) at the target",
               ret_name(n), ret_name(-err.err));
        if (chan_recv(c, 0, &b, 1) == 1)
            return;
    }
    h_fail(__FILE__, __LINE__, "no word from the other side within 15 s");
    h_finish();
}

/* Connects a client to a listener in this one process (fi_connect returns
 * at once, so one thread can answer its own request). */
static void pair_open(struct side *server, struct side *client)
{
    struct sockaddr_in a;
    side_open(server, FI_WAIT_UNSPEC);
    side_listen(server, &a);
    side_open(client, FI_WAIT_UNSPEC);
    side_domain(client, client->info);
    side_endpoint(client);
    REQUIRE_RET(fi_connect(client->ep, &a, NULL, 0), 0);
    struct fi_info *req = take_request(server, NULL, 0);
    side_accept(server, req, NULL, 0, NULL);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    if (EQ_EXPECT(client->eq, FI_CONNECTED, buf, sizeof buf, 10000) < 0)
        h_finish();
}

/* ---- cm: connection events and private data -------------------------------- */

static const char request_data[] = "a request from the client";
static const char accept_data[] = "accepted, with the server's words";
static const char reject_data[] = "refused: come back later";

static void accept_peer(struct chan *c)
{
    struct sockaddr_in a;
    struct side s;
    listener_address(c, &a);
    side_open(&s, FI_WAIT_UNSPEC);
    char got[64];
    size_t n = side_connect(&s, &a, request_data, sizeof request_data, got, sizeof got);
    /* The accept's private data comes with FI_CONNECTED. */
    CHECK_EQ(n, sizeof accept_data);
    CHECK(n == sizeof accept_data && memcmp(got, accept_data, n) == 0);
    struct sockaddr_in peer;
    size_t len = sizeof peer;
    CHECK_RET(fi_getpeer(s.ep, &peer, &len), 0);
    CHECK(peer.sin_port == a.sin_port);
    step_send(c);
    step_wait(c);
    side_close(&s);
}

/* FI_CONNREQ carries the requester's private data and an info whose handle
 * is the request; fi_accept with data gives FI_CONNECTED on both sides,
 * the accept's data on the connecting side. */
static void t_accept_with_data(void)
{
    struct peer p;
    peer_start(&p, accept_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, request_data, sizeof request_data);
    /* The request's info names the requester (a loopback address). */
    CHECK(req->dest_addr != NULL && req->dest_addrlen == sizeof(struct sockaddr_in));
    if (req->dest_addr)
        CHECK_EQ(ntohl(((struct sockaddr_in *)req->dest_addr)->sin_addr.s_addr), INADDR_LOOPBACK);
    side_accept(&s, req, accept_data, sizeof accept_data, NULL);
    step_wait(&p.c);
    step_send(&p.c);
    peer_end(&p, 10000);
    side_close(&s);
}

/* Connects, then closes its endpoint (an fi_shutdown first, as a program
 * that is done would) and its objects. */
static void closing_peer(struct chan *c)
{
    struct side s;
    peer_connect(c, &s, NULL, 0, NULL, 0);
    step_wait(c);
    CHECK_RET(fi_shutdown(s.ep, 0), 0);
    side_close(&s);
    step_send(c);
}

/* A peer's shutdown reaches a side that reads nothing but its EQ (no CQ
 * read drives its endpoint) as FI_SHUTDOWN, within a bounded time. */
static void t_shutdown_seen_by_eq_reads(void)
{
    struct peer p;
    peer_start(&p, closing_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, NULL, 0);
    side_accept(&s, req, NULL, 0, NULL);
    step_send(&p.c);
    step_wait(&p.c);
    long long t0 = now_ms();
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    if (EQ_EXPECT(s.eq, FI_SHUTDOWN, buf, sizeof buf, 3000) >= 0) {
        struct fi_eq_cm_entry *e = (struct fi_eq_cm_entry *)buf;
        CHECK(e->fid == &s.ep->fid);
        h_note("FI_SHUTDOWN %lld ms after the peer closed", now_ms() - t0);
    }
    peer_end(&p, 10000);
    side_close(&s);
}

static void reject_peer(struct chan *c)
{
    struct sockaddr_in a;
    struct side s;
    listener_address(c, &a);
    side_open(&s, FI_WAIT_UNSPEC);
    side_domain(&s, s.info);
    side_endpoint(&s);
    REQUIRE_RET(fi_connect(s.ep, &a, request_data, sizeof request_data), 0);
    /* The refusal is an error entry: fi_eq_read says -FI_EAVAIL, and
     * fi_eq_readerr hands over the reject's data as err_data. */
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    uint32_t ev = 0;
    ssize_t n = -FI_EAGAIN;
    for (long long end = now_ms() + 10000; n == -FI_EAGAIN && now_ms() < end;)
        n = fi_eq_sread(s.eq, &ev, buf, sizeof buf, 100, 0);
    CHECK_RET(n, -FI_EAVAIL);
    struct fi_eq_err_entry e;
    /* Into a buffer of the caller's, shorter than the data: as much as
     * it holds (peeked, so that the read below takes the same error). */
    char part[8];
    memset(&e, 0, sizeof e);
    e.err_data = part;
    e.err_data_size = sizeof part;
    CHECK_RET(fi_eq_readerr(s.eq, &e, FI_PEEK), eq_err_entry_size());
    if (api_before_1_5()) {
        /* An entry of 1.0 has no size for a buffer of the caller's: the
         * provider's data, whole, and the size field left alone. */
        CHECK(e.err_data != NULL && memcmp(e.err_data, reject_data, sizeof reject_data) == 0);
        CHECK_EQ(e.err_data_size, sizeof part);
    } else {
        CHECK(e.err_data == part);
        CHECK_EQ(e.err_data_size, sizeof part);
        CHECK(memcmp(part, reject_data, sizeof part) == 0);
    }
    /* With none offered, the provider's, whole. */
    memset(&e, 0, sizeof e);
    CHECK_RET(fi_eq_readerr(s.eq, &e, 0), eq_err_entry_size());
    CHECK(e.fid == &s.ep->fid);
    CHECK_EQ(e.err, FI_ECONNREFUSED);
    if (api_before_1_5()) {
        CHECK(e.err_data != NULL && memcmp(e.err_data, reject_data, sizeof reject_data) == 0);
    } else {
        CHECK_EQ(e.err_data_size, sizeof reject_data);
        CHECK(e.err_data != NULL && e.err_data_size == sizeof reject_data &&
              memcmp(e.err_data, reject_data, sizeof reject_data) == 0);
    }
    char text[128] = "";
    fi_eq_strerror(s.eq, e.prov_errno, e.err_data, text, sizeof text);
    CHECK(text[0] != 0);
    /* Nothing more: the error was the answer. */
    CHECK_RET(fi_eq_read(s.eq, &ev, buf, sizeof buf, 0), -FI_EAGAIN);
    /* An endpoint that was refused cannot post. */
    CHECK_RET(fi_send(s.ep, buf, 1, NULL, 0, NULL), -FI_EOPBADSTATE);
    step_send(c);
    side_close(&s);
}

/* fi_reject with data: the connecting side gets an error entry,
 * FI_ECONNREFUSED, with the reject's data. */
static void t_reject_with_data(void)
{
    struct peer p;
    peer_start(&p, reject_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, request_data, sizeof request_data);
    CHECK_RET(fi_reject(s.pep, req->handle, reject_data, sizeof reject_data), 0);
    fi_freeinfo(req);
    step_wait(&p.c);
    peer_end(&p, 10000);
    /* The listener carries on: nothing else is queued. */
    uint32_t ev;
    uint8_t buf[128];
    CHECK_RET(fi_eq_read(s.eq, &ev, buf, sizeof buf, 0), -FI_EAGAIN);
    side_close(&s);
}

/* A second listener asking for a port another holds is refused
 * (-FI_EADDRINUSE), in fi_passive_ep or at the latest in fi_listen. */
static void t_listen_on_a_held_port(void)
{
    struct side first, second;
    struct sockaddr_in a;
    side_open(&first, FI_WAIT_UNSPEC);
    side_listen(&first, &a);
    side_open(&second, FI_WAIT_UNSPEC);
    struct fi_info *info = fi_dupinfo(second.info);
    REQUIRE(info != NULL);
    free(info->src_addr);
    info->src_addr = malloc(sizeof a);
    REQUIRE(info->src_addr != NULL);
    memcpy(info->src_addr, &a, sizeof a);
    info->src_addrlen = sizeof a;
    int r = fi_passive_ep(second.fabric, info, &second.pep, NULL);
    if (r == 0) {
        CHECK_RET(fi_pep_bind(second.pep, &second.eq->fid, 0), 0);
        r = fi_listen(second.pep);
    }
    CHECK_RET(r, -FI_EADDRINUSE);
    fi_freeinfo(info);
    side_close(&second);
    side_close(&first);
}

/* A side whose endpoint asks to connect to `to`. */
static void side_connecting(struct side *s, struct sockaddr_in *to)
{
    side_open(s, FI_WAIT_UNSPEC);
    side_domain(s, s->info);
    side_endpoint(s);
    REQUIRE_RET(fi_connect(s->ep, to, NULL, 0), 0);
}

/* Waits up to 10 s for `s`'s request to be refused: an error entry,
 * FI_ECONNREFUSED. */
static void expect_refused(struct side *s)
{
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    uint32_t ev = 0;
    ssize_t n = -FI_EAGAIN;
    for (long long end = now_ms() + 10000; n == -FI_EAGAIN && now_ms() < end;)
        n = fi_eq_sread(s->eq, &ev, buf, sizeof buf, 100, 0);
    CHECK_RET(n, -FI_EAVAIL);
    struct fi_eq_err_entry e;
    memset(&e, 0, sizeof e);
    CHECK_RET(fi_eq_readerr(s->eq, &e, 0), eq_err_entry_size());
    CHECK_EQ(e.err, FI_ECONNREFUSED);
}

/* A listener gone: a request to its address is refused at once
 * (FI_ECONNREFUSED), as a socket's connect is, not after the connect's
 * whole timeout: on shm nobody listens there any more; on udp, where each
 * listener is a socket of its own, nothing is bound at its port. */
static void t_connect_to_a_closed_listener(void)
{
    struct side keep, gone, c;
    struct sockaddr_in kept, a;
    side_open(&keep, FI_WAIT_UNSPEC);
    side_listen(&keep, &kept);
    side_open(&gone, FI_WAIT_UNSPEC);
    side_listen(&gone, &a);
    /* Two listeners, two ports. */
    CHECK(kept.sin_port != a.sin_port);
    side_close(&gone);
    long long t0 = now_ms();
    side_connecting(&c, &a);
    expect_refused(&c);
    long long took = now_ms() - t0;
    CHECKF(took < 2000, "refused after %lld ms", took);
    h_note("refused after %lld ms", took);
    side_close(&c);
    side_close(&keep);
}

/* uvia: up to 64 bytes of private data each way (FI_OPT_CM_DATA_SIZE). */
static void t_private_data_limits(void)
{
    struct side s;
    side_open(&s, FI_WAIT_UNSPEC);
    side_domain(&s, s.info);
    side_endpoint(&s);
    size_t size = 0, len = sizeof size;
    CHECK_RET(fi_getopt(&s.ep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &size, &len), 0);
    CHECK_EQ(size, 64);
    char data[65] = {0};
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(9),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_RET(fi_connect(s.ep, &to, data, sizeof data), -FI_EINVAL);
    /* A length with no bytes. */
    CHECK_RET(fi_connect(s.ep, &to, NULL, 8), -FI_EINVAL);
    size = 65;
    CHECK_RET(fi_setopt(&s.ep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &size, sizeof size),
              -FI_EINVAL);
    /* An endpoint opened without a request has nothing to accept. */
    CHECK_RET(fi_accept(s.ep, NULL, 0), -FI_EINVAL);
    side_close(&s);
}

/* ---- rma: RDMA write with remote CQ data, RDMA read ------------------------ */

enum { RMA_LEN = 65536, READ_LEN = 100000 };
static const uint64_t IMM = 0x5eed1234;

static struct region g_target, g_small;
static int recv_ctx[2];

static void post_two_receives(struct side *s)
{
    for (int i = 0; i < 2; i++)
        REQUIRE_RET(fi_recv(s->ep, g_small.buf + 64 * i, 64, g_small.desc, 0, &recv_ctx[i]), 0);
}

static void writedata_peer(struct chan *c)
{
    struct side s;
    struct remote r;
    REQUIRE(peer_connect(c, &s, NULL, 0, &r, sizeof r) == sizeof r);
    CHECK_EQ(r.len, RMA_LEN);
    struct region l;
    region_reg(&s, &l, RMA_LEN, FI_WRITE | FI_SEND);
    fill(l.buf, RMA_LEN, 1);
    int ctx;
    struct fi_cq_data_entry e;
    REQUIRE_RET(fi_writedata(s.ep, l.buf, RMA_LEN, l.desc, IMM, 0, r.addr, r.key, &ctx), 0);
    if (CQ_EXPECT(s.cq, &e, 10000) == 0) {
        CHECK(e.op_context == &ctx);
        CHECK_EQ(e.flags, FI_RMA | FI_WRITE);
    }
    step_wait(c);
    /* A write without data, then a message: the write consumes no receive. */
    fill(l.buf, 4096, 2);
    REQUIRE_RET(fi_write(s.ep, l.buf, 4096, l.desc, 0, r.addr + 8192, r.key, &ctx), 0);
    if (CQ_EXPECT(s.cq, &e, 10000) == 0)
        CHECK_EQ(e.flags, FI_RMA | FI_WRITE);
    memcpy(l.buf, "after the write", 16);
    REQUIRE_RET(fi_send(s.ep, l.buf, 16, l.desc, 0, &ctx), 0);
    if (CQ_EXPECT(s.cq, &e, 10000) == 0)
        CHECK_EQ(e.flags, FI_SEND | FI_MSG);
    step_wait(c);
    /* Three inject writes (no entry each), then a message. */
    for (int i = 0; i < 3; i++) {
        uint8_t b[8];
        memset(b, 0x30 + i, sizeof b);
        REQUIRE_RET(fi_inject_write(s.ep, b, sizeof b, 0, r.addr + 16384 + 8 * i, r.key), 0);
    }
    memcpy(l.buf, "after the injects", 18);
    REQUIRE_RET(fi_send(s.ep, l.buf, 18, l.desc, 0, &ctx), 0);
    if (CQ_EXPECT(s.cq, &e, 10000) == 0)
        CHECK_EQ(e.flags, FI_SEND | FI_MSG);
    step_wait(c);
    region_close(&l);
    side_close(&s);
}

/* fi_writedata: the bytes land in the target's region, and the target's CQ
 * reports FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA with the data. uvia: as in
 * VIA, a write with immediate data consumes a posted receive, and the
 * entry is that receive's (its context; no bytes land in its buffer; len is
 * the write's). A write without data consumes none and writes no entry; inject
 * writes write none either, and land before a message sent after them. */
static void t_writedata(void)
{
    struct peer p;
    peer_start(&p, writedata_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, NULL, 0);
    side_domain(&s, req);
    region_reg(&s, &g_target, RMA_LEN, FI_REMOTE_WRITE | FI_REMOTE_READ);
    region_reg(&s, &g_small, 128, FI_RECV);
    memset(g_small.buf, 0xee, 128);
    side_endpoint(&s);
    post_two_receives(&s);
    struct remote r = {(uint64_t)(uintptr_t)g_target.buf, g_target.key, RMA_LEN};
    REQUIRE_RET(fi_accept(s.ep, &r, sizeof r), 0);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    if (EQ_EXPECT(s.eq, FI_CONNECTED, buf, sizeof buf, 10000) < 0)
        h_finish();

    struct fi_cq_data_entry e;
    if (CQ_EXPECT(s.cq, &e, 10000) == 0) {
        CHECK(e.op_context == &recv_ctx[0]);
        CHECKF((e.flags & (FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA | FI_RMA)) ==
                   (FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA | FI_RMA),
               "flags 0x%llx", (unsigned long long)e.flags);
        CHECK((e.flags & FI_RECV) == 0);
        CHECK_EQ(e.data, IMM);
        CHECK_EQ(e.len, RMA_LEN);
        h_note("writedata's entry: flags 0x%llx len %zu", (unsigned long long)e.flags, e.len);
    }
    CHECK_PATTERN(g_target.buf, RMA_LEN, 1);
    /* The receive's own buffer is untouched. */
    CHECK(g_small.buf[0] == 0xee && g_small.buf[63] == 0xee);
    step_send(&p.c);

    /* The message takes the second receive: the plain write took none. */
    if (CQ_EXPECT(s.cq, &e, 10000) == 0) {
        CHECK(e.op_context == &recv_ctx[1]);
        CHECK_EQ(e.flags, FI_RECV | FI_MSG);
        CHECK_EQ(e.len, 16);
        CHECK(memcmp(g_small.buf + 64, "after the write", 16) == 0);
    }
    CHECK_PATTERN(g_target.buf + 8192, 4096, 2);
    CHECK_PATTERN(g_target.buf, 8192, 1);
    REQUIRE_RET(fi_recv(s.ep, g_small.buf, 64, g_small.desc, 0, &recv_ctx[0]), 0);
    step_send(&p.c);
    /* Inject writes, then a message: the writes are in place when it comes
     * (on shm the later ones are copied into the region during the call). */
    if (CQ_EXPECT(s.cq, &e, 10000) == 0) {
        CHECK(e.op_context == &recv_ctx[0]);
        CHECK_EQ(e.len, 18);
        CHECK(memcmp(g_small.buf, "after the injects", 18) == 0);
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < 8; k++)
                CHECKF(g_target.buf[16384 + 8 * i + k] == 0x30 + i, "inject %d byte %d: 0x%x", i,
                       k, g_target.buf[16384 + 8 * i + k]);
    }
    step_send(&p.c);
    peer_end(&p, 10000);
    struct fi_cq_err_entry err;
    /* Nothing else: the peer's leaving may flush nothing here. */
    ssize_t n = cq_take(s.cq, &e, &err, 0);
    CHECK(n == -FI_EAGAIN || (n == -FI_EAVAIL && err.err == FI_ECANCELED));
    CHECK_RET(fi_close(&s.ep->fid), 0);
    s.ep = NULL;
    region_close(&g_target);
    region_close(&g_small);
    side_close(&s);
}

static void read_peer(struct chan *c)
{
    struct side s;
    struct remote r;
    REQUIRE(peer_connect(c, &s, NULL, 0, &r, sizeof r) == sizeof r);
    CHECK_EQ(r.len, READ_LEN);
    struct region l;
    region_reg(&s, &l, READ_LEN, FI_READ);
    int ctx;
    struct fi_cq_data_entry e;
    REQUIRE_RET(fi_read(s.ep, l.buf, READ_LEN, l.desc, 0, r.addr, r.key, &ctx), 0);
    if (CQ_EXPECT(s.cq, &e, 10000) == 0) {
        CHECK(e.op_context == &ctx);
        CHECK_EQ(e.flags, FI_RMA | FI_READ);
    }
    CHECK_PATTERN(l.buf, READ_LEN, 3);
    /* From the middle of the region, into the middle of ours. */
    memset(l.buf, 0, READ_LEN);
    REQUIRE_RET(fi_read(s.ep, l.buf + 100, 1000, l.desc, 0, r.addr + 5000, r.key, &ctx), 0);
    if (CQ_EXPECT(s.cq, &e, 10000) == 0)
        for (size_t i = 0; i < 1000; i++)
            if (l.buf[100 + i] != pattern(3, 5000 + i)) {
                CHECKF(0, "byte %zu of the middle read", i);
                break;
            }
    CHECK(l.buf[99] == 0 && l.buf[1100] == 0);
    /* Past the region's end: the target refuses, a CQ error here. */
    REQUIRE_RET(fi_read(s.ep, l.buf, 1000, l.desc, 0, r.addr + READ_LEN - 10, r.key, &ctx), 0);
    struct fi_cq_err_entry err;
    CHECK_RET(cq_take(s.cq, &e, &err, 10000), -FI_EAVAIL);
    CHECK_EQ(err.err, FI_EACCES);
    CHECK(err.op_context == &ctx);
    step_send(c);
    region_close(&l);
    side_close(&s);
}

/* fi_read of a region registered with FI_REMOTE_READ, whole and in part,
 * checked byte by byte; a read past its end completes with FI_EACCES. */
static void t_read(void)
{
    struct peer p;
    peer_start(&p, read_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, NULL, 0);
    side_domain(&s, req);
    region_reg(&s, &g_target, READ_LEN, FI_REMOTE_READ);
    fill(g_target.buf, READ_LEN, 3);
    side_endpoint(&s);
    struct remote r = {(uint64_t)(uintptr_t)g_target.buf, g_target.key, READ_LEN};
    REQUIRE_RET(fi_accept(s.ep, &r, sizeof r), 0);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    if (EQ_EXPECT(s.eq, FI_CONNECTED, buf, sizeof buf, 10000) < 0)
        h_finish();
    step_wait_reading(&p.c, s.cq);
    /* Reads leave the target's bytes as they were. */
    CHECK_PATTERN(g_target.buf, READ_LEN, 3);
    peer_end(&p, 10000);
    CHECK_RET(fi_close(&s.ep->fid), 0);
    s.ep = NULL;
    region_close(&g_target);
    side_close(&s);
}

/* Which RDMA operation the no-permission test tries. */
static int g_try_read;

static void no_permission_peer(struct chan *c)
{
    struct side s;
    struct remote r;
    REQUIRE(peer_connect(c, &s, NULL, 0, &r, sizeof r) == sizeof r);
    struct region l;
    region_reg(&s, &l, 4096, FI_READ | FI_WRITE);
    fill(l.buf, 4096, 4);
    int ctx;
    if (g_try_read)
        REQUIRE_RET(fi_read(s.ep, l.buf, 4096, l.desc, 0, r.addr, r.key, &ctx), 0);
    else
        REQUIRE_RET(fi_write(s.ep, l.buf, 4096, l.desc, 0, r.addr, r.key, &ctx), 0);
    struct fi_cq_data_entry e;
    struct fi_cq_err_entry err;
    CHECK_RET(cq_take(s.cq, &e, &err, 10000), -FI_EAVAIL);
    CHECK_EQ(err.err, FI_EACCES);
    CHECK(err.op_context == &ctx);
    CHECK(err.flags & (g_try_read ? FI_READ : FI_WRITE));
    char text[256] = "";
    fi_cq_strerror(s.cq, err.prov_errno, err.err_data, text, sizeof text);
    CHECKF(strstr(text, "RDMA protection") != NULL, "strerror: %s", text);
    /* A read that was refused brings no bytes. */
    if (g_try_read)
        CHECK_PATTERN(l.buf, 4096, 4);
    step_send(c);
    region_close(&l);
    side_close(&s);
}

/* An RDMA write (or read) of a region registered without FI_REMOTE_WRITE
 * (FI_REMOTE_READ) fails with a CQ error, FI_EACCES, and the target's bytes
 * stay as they were. uvia: the error breaks the connection, as in VIA. */
static void no_permission(int try_read)
{
    g_try_read = try_read;
    struct peer p;
    peer_start(&p, no_permission_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, NULL, 0);
    side_domain(&s, req);
    region_reg(&s, &g_target, 4096, try_read ? FI_REMOTE_WRITE : FI_REMOTE_READ);
    memset(g_target.buf, 0xa5, 4096);
    side_endpoint(&s);
    struct remote r = {(uint64_t)(uintptr_t)g_target.buf, g_target.key, 4096};
    REQUIRE_RET(fi_accept(s.ep, &r, sizeof r), 0);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    if (EQ_EXPECT(s.eq, FI_CONNECTED, buf, sizeof buf, 10000) < 0)
        h_finish();
    step_wait_reading(&p.c, s.cq);
    int same = 1;
    for (size_t i = 0; i < 4096; i++)
        same &= g_target.buf[i] == 0xa5;
    CHECKF(same, "the target's bytes changed");
    peer_end(&p, 10000);
    CHECK_RET(fi_close(&s.ep->fid), 0);
    s.ep = NULL;
    region_close(&g_target);
    side_close(&s);
}

static void t_write_without_permission(void)
{
    no_permission(0);
}

static void t_read_without_permission(void)
{
    no_permission(1);
}

/* ---- mr: registration ------------------------------------------------------- */

static void domain_only(struct side *s)
{
    side_open(s, FI_WAIT_UNSPEC);
    side_domain(s, s->info);
}

/* Access flags: the six of fi_mr(3) register; any other bit is -FI_EINVAL;
 * FI_RMA_EVENT (which needs counters) is -FI_EINVAL. */
static void t_access_flags(void)
{
    struct side s;
    domain_only(&s);
    static uint8_t buf[8192];
    const uint64_t ok[] = {0, FI_SEND, FI_RECV, FI_READ, FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE,
                           FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct fid_mr *mr = NULL;
        CHECK_RET(fi_mr_reg(s.domain, buf, sizeof buf, ok[i], 0, 0, 0, &mr, NULL), 0);
        if (mr)
            CHECK_RET(fi_close(&mr->fid), 0);
    }
    const uint64_t bad[] = {FI_TAGGED, FI_ATOMIC, 1ULL << 50, 1ULL << 63, FI_MSG | FI_SEND};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct fid_mr *mr = NULL;
        CHECKF(fi_mr_reg(s.domain, buf, sizeof buf, bad[i], 0, 0, 0, &mr, NULL) == -FI_EINVAL,
               "access 0x%llx registered", (unsigned long long)bad[i]);
        if (mr)
            fi_close(&mr->fid);
    }
    struct fid_mr *mr = NULL;
    CHECK_RET(fi_mr_reg(s.domain, buf, sizeof buf, FI_REMOTE_WRITE, 0, 0, FI_RMA_EVENT, &mr, NULL),
              -FI_EINVAL);
    side_close(&s);
}

/* uvia: a region has at least one byte, at an address that is not NULL;
 * one segment per region (mr_iov_limit 1). */
static void t_empty_and_null(void)
{
    struct side s;
    domain_only(&s);
    static uint8_t buf[4096];
    struct fid_mr *mr = NULL;
    CHECK_RET(fi_mr_reg(s.domain, buf, 0, FI_SEND, 0, 0, 0, &mr, NULL), -FI_EINVAL);
    CHECK_RET(fi_mr_reg(s.domain, NULL, 4096, FI_SEND, 0, 0, 0, &mr, NULL), -FI_EINVAL);
    CHECK_RET(fi_mr_reg(s.domain, NULL, 0, FI_SEND, 0, 0, 0, &mr, NULL), -FI_EINVAL);
    CHECK_RET(fi_mr_reg(s.domain, buf, sizeof buf, FI_SEND, 0, 0, 0, NULL, NULL), -FI_EINVAL);
    CHECK(mr == NULL);
    struct iovec two[2] = {{buf, 100}, {buf + 200, 100}};
    CHECK_RET(fi_mr_regv(s.domain, two, 2, FI_SEND, 0, 0, 0, &mr, NULL), -FI_EINVAL);
    CHECK_RET(fi_mr_regv(s.domain, NULL, 1, FI_SEND, 0, 0, 0, &mr, NULL), -FI_EINVAL);
    CHECK_RET(fi_mr_regattr(s.domain, NULL, 0, &mr), -FI_EINVAL);
    /* One segment through each entry. */
    CHECK_RET(fi_mr_regv(s.domain, two, 1, FI_SEND, 0, 0, 0, &mr, NULL), 0);
    if (mr)
        CHECK_RET(fi_close(&mr->fid), 0);
    mr = NULL;
    struct fi_mr_attr attr = {.mr_iov = two, .iov_count = 1, .access = FI_RECV};
    CHECK_RET(fi_mr_regattr(s.domain, &attr, 0, &mr), 0);
    if (mr)
        CHECK_RET(fi_close(&mr->fid), 0);
    side_close(&s);
}

/* uvia: FI_MR_PROV_KEY, so a requested key is ignored (fi_mr(3)): two
 * regions asking for one key both register, with keys of their own, and
 * every key fits mr_key_size (4 bytes), however large the request. */
static void t_requested_keys(void)
{
    struct side s;
    domain_only(&s);
    /* (An interface older than 1.5 says provider keys as FI_MR_BASIC.) */
    CHECK((s.info->domain_attr->mr_mode & FI_MR_PROV_KEY) ||
          (api_before_1_5() && s.info->domain_attr->mr_mode == FI_MR_BASIC));
    CHECK_EQ(s.info->domain_attr->mr_key_size, 4);
    static uint8_t buf[3][4096];
    const uint64_t asked[3] = {42, 42, UINT64_MAX};
    struct fid_mr *mr[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        CHECK_RET(fi_mr_reg(s.domain, buf[i], 4096, FI_REMOTE_WRITE, 0, asked[i], 0, &mr[i], NULL), 0);
        if (mr[i])
            CHECKF(fi_mr_key(mr[i]) <= UINT32_MAX, "key 0x%llx",
                   (unsigned long long)fi_mr_key(mr[i]));
    }
    if (mr[0] && mr[1])
        CHECK(fi_mr_key(mr[0]) != fi_mr_key(mr[1]));
    /* The same memory twice: two regions, two keys. */
    struct fid_mr *again = NULL;
    CHECK_RET(fi_mr_reg(s.domain, buf[0], 4096, FI_REMOTE_READ, 0, 0, 0, &again, NULL), 0);
    if (again && mr[0])
        CHECK(fi_mr_key(again) != fi_mr_key(mr[0]));
    if (again)
        CHECK_RET(fi_close(&again->fid), 0);
    /* A domain with a region open stays open. */
    CHECK_RET(fi_close(&s.domain->fid), -FI_EBUSY);
    for (int i = 0; i < 3; i++)
        if (mr[i])
            CHECK_RET(fi_close(&mr[i]->fid), 0);
    side_close(&s);
}

/* A send whose descriptor names a closed region is refused at the call
 * (uvia: -FI_EINVAL, nothing queued, the connection carries on); a remote
 * key wider than mr_key_size is -FI_EINVAL. */
static void t_closed_region_and_wide_key(void)
{
    struct side server, client;
    pair_open(&server, &client);
    struct region r, l;
    region_reg(&server, &r, 4096, FI_RECV | FI_REMOTE_WRITE);
    region_reg(&client, &l, 4096, FI_SEND | FI_WRITE);
    struct fid_mr *closed = NULL;
    REQUIRE_RET(fi_mr_reg(client.domain, l.buf, 4096, FI_SEND, 0, 0, 0, &closed, NULL), 0);
    void *stale = fi_mr_desc(closed);
    CHECK_RET(fi_close(&closed->fid), 0);
    CHECK_RET(fi_send(client.ep, l.buf, 64, stale, 0, NULL), -FI_EINVAL);
    struct fi_cq_data_entry e;
    CHECK_RET(fi_cq_read(client.cq, &e, 1), -FI_EAGAIN);
    /* Keys: 4 bytes. */
    uint64_t wide = (1ULL << 32) | r.key;
    CHECK_RET(fi_write(client.ep, l.buf, 64, l.desc, 0, (uintptr_t)r.buf, wide, NULL), -FI_EINVAL);
    CHECK_RET(fi_read(client.ep, l.buf, 64, l.desc, 0, (uintptr_t)r.buf, wide, NULL), -FI_EINVAL);
    CHECK_RET(fi_inject_write(client.ep, l.buf, 8, 0, (uintptr_t)r.buf, wide), -FI_EINVAL);
    /* The connection is intact. */
    int ctx;
    REQUIRE_RET(fi_recv(server.ep, r.buf, 4096, r.desc, 0, &ctx), 0);
    memcpy(l.buf, "still here", 11);
    REQUIRE_RET(fi_send(client.ep, l.buf, 11, l.desc, 0, NULL), 0);
    if (CQ_EXPECT(server.cq, &e, 10000) == 0) {
        CHECK(e.op_context == &ctx);
        CHECK(memcmp(r.buf, "still here", 11) == 0);
    }
    CQ_EXPECT(client.cq, &e, 10000);
    region_close(&r);
    region_close(&l);
    side_close(&client);
    side_close(&server);
}

/* ---- call: bad calls return negative codes --------------------------------- */

/* Posting before the endpoint is enabled, and before it is connected. */
static void t_not_enabled_or_connected(void)
{
    struct side s;
    domain_only(&s);
    struct region r;
    region_reg(&s, &r, 4096, FI_SEND | FI_RECV | FI_READ | FI_WRITE);
    REQUIRE_RET(fi_endpoint(s.domain, s.info, &s.ep, NULL), 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(9),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    /* Not enabled. */
    CHECK_RET(fi_send(s.ep, r.buf, 8, r.desc, 0, NULL), -FI_EOPBADSTATE);
    CHECK_RET(fi_recv(s.ep, r.buf, 8, r.desc, 0, NULL), -FI_EOPBADSTATE);
    CHECK_RET(fi_inject(s.ep, r.buf, 8, 0), -FI_EOPBADSTATE);
    CHECK_RET(fi_write(s.ep, r.buf, 8, r.desc, 0, 0, 0, NULL), -FI_EOPBADSTATE);
    CHECK_RET(fi_connect(s.ep, &to, NULL, 0), -FI_ENOEQ);
    /* Enabled with nothing bound, it could never connect or complete. */
    CHECK_RET(fi_enable(s.ep), -FI_ENOEQ);
    REQUIRE_RET(fi_ep_bind(s.ep, &s.eq->fid, 0), 0);
    CHECK_RET(fi_connect(s.ep, &to, NULL, 0), -FI_EOPBADSTATE);
    CHECK_RET(fi_enable(s.ep), -FI_ENOCQ);
    /* A CQ for neither queue, or for selective completion: refused. */
    CHECK_RET(fi_ep_bind(s.ep, &s.cq->fid, 0), -FI_EINVAL);
    REQUIRE_RET(fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV), 0);
    REQUIRE_RET(fi_enable(s.ep), 0);
    /* Enabled, not connected: receives may wait for a connection (as VIA
     * allows), everything else is refused. */
    CHECK_RET(fi_send(s.ep, r.buf, 8, r.desc, 0, NULL), -FI_EOPBADSTATE);
    CHECK_RET(fi_inject(s.ep, r.buf, 8, 0), -FI_EOPBADSTATE);
    CHECK_RET(fi_senddata(s.ep, r.buf, 8, r.desc, 1, 0, NULL), -FI_EOPBADSTATE);
    CHECK_RET(fi_write(s.ep, r.buf, 8, r.desc, 0, (uintptr_t)r.buf, r.key, NULL), -FI_EOPBADSTATE);
    CHECK_RET(fi_read(s.ep, r.buf, 8, r.desc, 0, (uintptr_t)r.buf, r.key, NULL), -FI_EOPBADSTATE);
    CHECK_RET(fi_recv(s.ep, r.buf, 8, r.desc, 0, NULL), 0);
    struct sockaddr_in peer;
    size_t len = sizeof peer;
    CHECK_RET(fi_getpeer(s.ep, &peer, &len), -FI_ENOTCONN);
    /* Binding after enable is too late. */
    CHECK_RET(fi_ep_bind(s.ep, &s.eq->fid, 0), -FI_EOPBADSTATE);

    /* uvia: an object with others open on it refuses to close, -FI_EBUSY. */
    CHECK_RET(fi_close(&s.domain->fid), -FI_EBUSY);
    CHECK_RET(fi_close(&s.cq->fid), -FI_EBUSY);
    CHECK_RET(fi_close(&s.eq->fid), -FI_EBUSY);
    CHECK_RET(fi_close(&s.fabric->fid), -FI_EBUSY);
    /* The endpoint closes with a receive posted (it is flushed). */
    CHECK_RET(fi_close(&s.ep->fid), 0);
    s.ep = NULL;
    CHECK_RET(fi_close(&s.domain->fid), -FI_EBUSY);
    region_close(&r);
    side_close(&s);
}

/* NULL where a buffer must be. uvia: a zero-byte message needs no buffer;
 * a NULL buffer with bytes is -FI_EINVAL (no region holds it). */
static void t_null_buffers(void)
{
    struct side server, client;
    pair_open(&server, &client);
    struct region r, l;
    region_reg(&server, &r, 4096, FI_RECV);
    region_reg(&client, &l, 4096, FI_SEND);
    CHECK_RET(fi_send(client.ep, NULL, 16, l.desc, 0, NULL), -FI_EINVAL);
    CHECK_RET(fi_send(client.ep, NULL, 16, NULL, 0, NULL), -FI_EINVAL);
    CHECK_RET(fi_recv(server.ep, NULL, 16, r.desc, 0, NULL), -FI_EINVAL);
    CHECK_RET(fi_inject(client.ep, NULL, 16, 0), -FI_EINVAL);
    CHECK_RET(fi_sendv(client.ep, NULL, NULL, 1, 0, NULL), -FI_EINVAL);
    CHECK_RET(fi_recvv(server.ep, NULL, NULL, 1, 0, NULL), -FI_EINVAL);
    /* A buffer for many messages is not offered: refused, not taken as one. */
    struct iovec one = {r.buf, 4096};
    struct fi_msg multi = {.msg_iov = &one, .desc = &r.desc, .iov_count = 1};
    CHECK_RET(fi_recvmsg(server.ep, &multi, FI_MULTI_RECV), -FI_EBADFLAGS);
    CHECK_RET(fi_sendmsg(client.ep, NULL, 0), -FI_EINVAL);
    CHECK_RET(fi_recvmsg(server.ep, NULL, 0), -FI_EINVAL);
    CHECK_RET(fi_writemsg(client.ep, NULL, 0), -FI_EINVAL);
    CHECK_RET(fi_readmsg(client.ep, NULL, 0), -FI_EINVAL);
    CHECK_RET(fi_connect(client.ep, NULL, NULL, 0), -FI_EINVAL);
    size_t len = 0;
    CHECK_RET(fi_getname(&client.ep->fid, NULL, &len), -FI_ETOOSMALL);
    CHECK_EQ(len, sizeof(struct sockaddr_in));
    CHECK_RET(fi_getname(&client.ep->fid, NULL, NULL), -FI_EINVAL);
    CHECK_RET(fi_cq_readerr(client.cq, NULL, 0), -FI_EINVAL);
    CHECK_RET(fi_eq_readerr(client.eq, NULL, 0), -FI_EINVAL);

    /* A zero-byte message, no buffer on either side. */
    int rctx, sctx;
    REQUIRE_RET(fi_recv(server.ep, NULL, 0, NULL, 0, &rctx), 0);
    REQUIRE_RET(fi_send(client.ep, NULL, 0, NULL, 0, &sctx), 0);
    struct fi_cq_data_entry e;
    if (CQ_EXPECT(server.cq, &e, 10000) == 0) {
        CHECK(e.op_context == &rctx);
        CHECK_EQ(e.len, 0);
    }
    if (CQ_EXPECT(client.cq, &e, 10000) == 0)
        CHECK(e.op_context == &sctx);
    region_close(&r);
    region_close(&l);
    side_close(&client);
    side_close(&server);
}

/* A message above max_msg_size, an inject above inject_size, a length that
 * does not fit 32 bits: -FI_EMSGSIZE, nothing queued. */
static void t_sizes_above_limits(void)
{
    struct side server, client;
    pair_open(&server, &client);
    size_t max = client.info->ep_attr->max_msg_size;
    size_t inject = client.info->tx_attr->inject_size;
    REQUIRE(max > 0 && max < ((size_t)1 << 32));
    /* Address space only: the call must refuse before touching a byte. */
    size_t span = max + 4096;
    uint8_t *big = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
    REQUIRE(big != MAP_FAILED);
    struct fid_mr *mr = NULL;
    REQUIRE_RET(fi_mr_reg(client.domain, big, span, FI_SEND | FI_WRITE, 0, 0, 0, &mr, NULL), 0);
    void *desc = fi_mr_desc(mr);
    CHECK_RET(fi_send(client.ep, big, max + 1, desc, 0, NULL), -FI_EMSGSIZE);
    CHECK_RET(fi_write(client.ep, big, max + 1, desc, 0, 0, 0, NULL), -FI_EMSGSIZE);
    CHECK_RET(fi_inject(client.ep, big, inject + 1, 0), -FI_EMSGSIZE);
    CHECK_RET(fi_inject_write(client.ep, big, inject + 1, 0, 0, 0), -FI_EMSGSIZE);
    CHECK_RET(fi_send(client.ep, big, ((size_t)1 << 32) + 8, desc, 0, NULL), -FI_EMSGSIZE);
    /* Injected entries whose lengths wrap past SIZE_MAX to a small sum. */
    struct iovec wrap[2] = {{big, SIZE_MAX}, {big, 1}};
    void *descs[2] = {desc, desc};
    struct fi_msg m = {.msg_iov = wrap, .desc = descs, .iov_count = 2};
    CHECK_RET(fi_sendmsg(client.ep, &m, FI_INJECT), -FI_EMSGSIZE);
    struct fi_rma_iov far = {.addr = 0, .len = 64, .key = 0};
    struct fi_msg_rma wm = {.msg_iov = wrap, .desc = descs, .iov_count = 2,
                            .rma_iov = &far, .rma_iov_count = 1};
    CHECK_RET(fi_writemsg(client.ep, &wm, FI_INJECT), -FI_EINVAL);
    /* More local bytes than the remote range named. */
    struct iovec local = {big, 128};
    struct fi_msg_rma over = {.msg_iov = &local, .desc = descs, .iov_count = 1,
                              .rma_iov = &far, .rma_iov_count = 1};
    CHECK_RET(fi_writemsg(client.ep, &over, 0), -FI_EINVAL);
    CHECK_RET(fi_readmsg(client.ep, &over, 0), -FI_EINVAL);
    struct fi_cq_data_entry e;
    CHECK_RET(fi_cq_read(client.cq, &e, 1), -FI_EAGAIN);
    CHECK_RET(fi_close(&mr->fid), 0);
    munmap(big, span);
    side_close(&client);
    side_close(&server);
}

/* One EQ and one CQ a direction (fi_endpoint(3)): a second bind of
 * either is refused, as is a CQ of another domain; the first stays bound
 * and everything closes. */
static void t_second_bind(void)
{
    struct side a, b;
    side_open(&a, FI_WAIT_UNSPEC);
    side_domain(&a, a.info);
    side_open(&b, FI_WAIT_UNSPEC);
    side_domain(&b, b.info);
    REQUIRE_RET(fi_endpoint(a.domain, a.info, &a.ep, NULL), 0);
    CHECK_RET(fi_ep_bind(a.ep, &a.eq->fid, 0), 0);
    CHECK_RET(fi_ep_bind(a.ep, &b.eq->fid, 0), -FI_EINVAL);
    CHECK_RET(fi_ep_bind(a.ep, &b.cq->fid, FI_TRANSMIT), -FI_EINVAL);
    CHECK_RET(fi_ep_bind(a.ep, &a.cq->fid, FI_TRANSMIT), 0);
    CHECK_RET(fi_ep_bind(a.ep, &a.cq->fid, FI_TRANSMIT | FI_RECV), -FI_EINVAL);
    CHECK_RET(fi_ep_bind(a.ep, &a.cq->fid, FI_RECV), 0);
    CHECK_RET(fi_enable(a.ep), 0);
    /* Nothing of b's was taken: all of it closes. */
    side_close(&b);
    side_close(&a);
}

/* The client of a listener that closed with its request unread: refused
 * (FI_ECONNREFUSED) when the listener closes, not left to time out. */
static void refused_peer(struct chan *c)
{
    struct sockaddr_in a;
    struct side s;
    listener_address(c, &a);
    side_connecting(&s, &a);
    step_send(c);
    expect_refused(&s);
    step_send(c);
    side_close(&s);
}

static void t_listener_closed_with_a_request(void)
{
    struct peer p;
    peer_start(&p, refused_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    step_wait(&p.c);
    /* The request is queued (peeked at), and never read. */
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    uint32_t ev = 0;
    ssize_t n = -FI_EAGAIN;
    for (long long end = now_ms() + 10000; n == -FI_EAGAIN && now_ms() < end;)
        n = fi_eq_read(s.eq, &ev, buf, sizeof buf, FI_PEEK);
    CHECK(n > 0 && ev == FI_CONNREQ);
    CHECK_RET(fi_close(&s.pep->fid), 0);
    s.pep = NULL;
    /* Nothing of the closed listener's stays queued. */
    CHECK_RET(fi_eq_read(s.eq, &ev, buf, sizeof buf, 0), -FI_EAGAIN);
    step_wait(&p.c);
    peer_end(&p, 10000);
    side_close(&s);
}

/* A request answered twice: the second answer is -FI_EINVAL, never a read
 * of the request the first freed. */
static void twice_peer(struct chan *c)
{
    struct sockaddr_in a;
    struct side s;
    listener_address(c, &a);
    side_connecting(&s, &a);
    step_wait(c);
    side_close(&s);
}

static void t_answered_twice(void)
{
    struct peer p;
    peer_start(&p, twice_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, NULL, 0);
    CHECK_RET(fi_reject(s.pep, req->handle, NULL, 0), 0);
    CHECK_RET(fi_reject(s.pep, req->handle, NULL, 0), -FI_EINVAL);
    /* Nor does a domain or endpoint opened for it find the request. */
    struct fid_domain *d = NULL;
    int r = fi_domain(s.fabric, req, &d, NULL);
    if (r == 0) {
        struct fid_ep *ep = NULL;
        if (fi_endpoint(d, req, &ep, NULL) == 0) {
            CHECK(fi_accept(ep, NULL, 0) < 0);
            CHECK_RET(fi_close(&ep->fid), 0);
        }
        CHECK_RET(fi_close(&d->fid), 0);
    }
    fi_freeinfo(req);
    step_send(&p.c);
    peer_end(&p, 10000);
    side_close(&s);
}

/* fi_cq_read with count 0 reads nothing (uvia: -FI_EAGAIN) and loses
 * nothing; NULL entries with a count are -FI_EINVAL, never a crash. */
static void t_cq_read_count_zero(void)
{
    struct side server, client;
    pair_open(&server, &client);
    struct region r, l;
    region_reg(&server, &r, 4096, FI_RECV);
    region_reg(&client, &l, 4096, FI_SEND);
    int ctx;
    struct fi_cq_data_entry e;
    REQUIRE_RET(fi_recv(server.ep, r.buf, 4096, r.desc, 0, &ctx), 0);
    REQUIRE_RET(fi_send(client.ep, l.buf, 32, l.desc, 0, NULL), 0);
    CQ_EXPECT(client.cq, &e, 10000);
    /* Give the message time to arrive, reading nothing. */
    for (long long end = now_ms() + 300; now_ms() < end;) {
        CHECK_RET(fi_cq_read(server.cq, &e, 0), -FI_EAGAIN);
        CHECK_RET(fi_cq_read(server.cq, NULL, 0), -FI_EAGAIN);
        sleep_ms(10);
    }
    CHECK_RET(fi_cq_sread(server.cq, &e, 0, NULL, 50), -FI_EAGAIN);
    CHECK_RET(fi_cq_read(server.cq, NULL, 1), -FI_EINVAL);
    CHECK_RET(fi_cq_sread(server.cq, NULL, 1, NULL, 50), -FI_EINVAL);
    /* The receive is still there. */
    if (CQ_EXPECT(server.cq, &e, 10000) == 0) {
        CHECK(e.op_context == &ctx);
        CHECK_EQ(e.len, 32);
    }
    region_close(&r);
    region_close(&l);
    side_close(&client);
    side_close(&server);
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* On a network domain, a polling read that comes right after one that
 * returned entries (within 100,000 counter ticks of its end, 20-100 us;
 * checked below only when it came within 40 us) takes only what has already
 * completed; the read after it polls the transport again. ofi_rxm reads
 * until the CQ is empty on the way from a message to its answer, and that
 * look, a receive call on udp, cost a third of a microsecond there. A read
 * that comes later polls, so a program that reads now and then finds what
 * waits. Nothing polls the server's endpoint but its reads here (no drive
 * thread). On shm every read looks at the ring. */
static void t_cq_read_after_entries(void)
{
    setenv("FI_UVIA_DRIVE_THREAD", "0", 1);
    int net = strcmp(g_domain, "shm") != 0;
    struct side server, client;
    pair_open(&server, &client);
    struct region r, l;
    region_reg(&server, &r, 4096, FI_RECV);
    region_reg(&client, &l, 4096, FI_SEND);
    int ctx[3];
    struct fi_cq_data_entry e;
    for (int i = 0; i < 3; i++)
        REQUIRE_RET(fi_recv(server.ep, r.buf + 64 * i, 64, r.desc, 0, &ctx[i]), 0);
    fill(l.buf, 64, 1);
    /* A send posted soon after the last one may wait for the client's next
     * CQ read (a burst leaves in one system call): each is followed by one. */
    int sent = 0;
    REQUIRE_RET(fi_send(client.ep, l.buf, 16, l.desc, 0, NULL), 0);
    sent += fi_cq_read(client.cq, &e, 1) == 1;
    long long began = 0;
    ssize_t n = -FI_EAGAIN;
    for (long long end = now_ms() + 10000; n == -FI_EAGAIN && now_ms() < end;) {
        began = now_ns();
        n = fi_cq_read(server.cq, &e, 1);
    }
    REQUIRE_RET(n, 1);
    CHECK(e.op_context == &ctx[0]);
    /* The second message is in the server's socket when the send returns
     * (loopback), and the read that follows at once skips its poll. */
    REQUIRE_RET(fi_send(client.ep, l.buf + 16, 16, l.desc, 0, NULL), 0);
    sent += fi_cq_read(client.cq, &e, 1) == 1;
    long long at = now_ns();
    n = fi_cq_read(server.cq, &e, 1);
    if (!net)
        CHECK_RET(n, 1);
    else if (at - began < 40000)
        CHECK_RET(n, -FI_EAGAIN);
    else
        h_note("the read came %lld ns after the last: too late to see it skip", at - began);
    if (n != 1) {
        /* The next read polls: the message is there. */
        CHECK_RET(fi_cq_read(server.cq, &e, 1), 1);
    }
    CHECK(e.op_context == &ctx[1]);
    CHECK_EQ(e.len, 16);
    CHECK(memcmp(r.buf + 64, l.buf + 16, 16) == 0);
    /* A read long after the one with entries polls: the third message is
     * taken by the first read that comes. */
    REQUIRE_RET(fi_send(client.ep, l.buf + 32, 16, l.desc, 0, NULL), 0);
    sent += fi_cq_read(client.cq, &e, 1) == 1;
    sleep_ms(20);
    CHECK_RET(fi_cq_read(server.cq, &e, 1), 1);
    CHECK(e.op_context == &ctx[2]);
    CHECK(memcmp(r.buf + 128, l.buf + 32, 16) == 0);
    /* The sends complete on the server's acks: its reads drive it. */
    for (long long end = now_ms() + 10000; sent < 3 && now_ms() < end;) {
        struct fi_cq_err_entry err;
        CHECK(cq_take(server.cq, &e, &err, 1) == -FI_EAGAIN);
        if (cq_take(client.cq, &e, &err, 1) == 1)
            sent++;
    }
    CHECK_EQ(sent, 3);
    region_close(&r);
    region_close(&l);
    side_close(&client);
    side_close(&server);
}

/* What the provider does not do is -FI_ENOSYS (or, for attributes it does
 * not offer, refused at open). */
static void t_unsupported(void)
{
    struct side s;
    domain_only(&s);
    side_endpoint(&s);
    static uint8_t buf[64];
    struct fi_av_attr ava = {.type = FI_AV_MAP};
    struct fid_av *av = NULL;
    CHECK_RET(fi_av_open(s.domain, &ava, &av, NULL), -FI_ENOSYS);
    struct fi_cntr_attr ca = {.events = FI_CNTR_EVENTS_COMP};
    struct fid_cntr *cntr = NULL;
    CHECK_RET(fi_cntr_open(s.domain, &ca, &cntr, NULL), -FI_ENOSYS);
    struct fi_poll_attr pa = {0};
    struct fid_poll *pollset = NULL;
    CHECK_RET(fi_poll_open(s.domain, &pa, &pollset), -FI_ENOSYS);
    struct fi_wait_attr wa = {.wait_obj = FI_WAIT_FD};
    struct fid_wait *waitset = NULL;
    CHECK_RET(fi_wait_open(s.fabric, &wa, &waitset), -FI_ENOSYS);
    struct fid_ep *sep = NULL;
    CHECK_RET(fi_scalable_ep(s.domain, s.info, &sep, NULL), -FI_ENOSYS);
    struct fid_ep *srx = NULL;
    CHECK_RET(fi_srx_context(s.domain, s.info->rx_attr, &srx, NULL), -FI_ENOSYS);
    CHECK_RET(fi_tsend(s.ep, buf, 8, NULL, 0, 7, NULL), -FI_ENOSYS);
    CHECK_RET(fi_trecv(s.ep, buf, 8, NULL, 0, 7, 0, NULL), -FI_ENOSYS);
    CHECK_RET(fi_tinject(s.ep, buf, 8, 0, 7), -FI_ENOSYS);
    CHECK_RET(fi_atomic(s.ep, buf, 1, NULL, 0, 0, 0, FI_UINT64, FI_SUM, NULL), -FI_ENOSYS);
    CHECK_RET(fi_cancel(&s.ep->fid, NULL), -FI_ENOSYS);
    CHECK_RET(fi_setname(&s.ep->fid, buf, 16), -FI_ENOSYS);
    /* A read that says where each entry came from: nowhere it can name. */
    fi_addr_t from = 0;
    struct fi_cq_data_entry e;
    CHECK_RET(fi_cq_readfrom(s.cq, &e, 1, &from), -FI_EAGAIN);
    /* Attributes it does not offer, at open. */
    struct fid_cq *cq = NULL;
    struct fi_cq_attr tagged = {.size = 16, .format = FI_CQ_FORMAT_TAGGED};
    CHECK_RET(fi_cq_open(s.domain, &tagged, &cq, NULL), -FI_ENOSYS);
    struct fi_cq_attr cond = {.size = 16, .format = FI_CQ_FORMAT_DATA,
                              .wait_obj = FI_WAIT_MUTEX_COND};
    CHECK_RET(fi_cq_open(s.domain, &cond, &cq, NULL), -FI_ENOSYS);
    struct fid_eq *eq = NULL;
    struct fi_eq_attr eqa = {.size = 16, .wait_obj = FI_WAIT_MUTEX_COND};
    CHECK_RET(fi_eq_open(s.fabric, &eqa, &eq, NULL), -FI_ENOSYS);
    /* A CQ without a wait object has no fd to hand out. */
    struct fi_cq_attr none = {.size = 16, .format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
    REQUIRE_RET(fi_cq_open(s.domain, &none, &cq, NULL), 0);
    int fd = -1;
    CHECK(fi_control(&cq->fid, FI_GETWAIT, &fd) < 0);
    /* Nor anybody asleep on it to signal. */
    CHECK_RET(fi_cq_signal(cq), -FI_ENOSYS);
    CHECK_RET(fi_close(&cq->fid), 0);
    side_close(&s);
}

/* ---- wait: blocking reads and wait objects ------------------------------- */

/* fi_cq_sread with nothing to read returns -FI_EAGAIN once its timeout
 * has passed (not before); timeout 0 looks once. */
static void t_cq_sread_timeout(void)
{
    struct side s;
    domain_only(&s);
    side_endpoint(&s);
    struct fi_cq_data_entry e;
    long long t0 = now_ms();
    CHECK_RET(fi_cq_sread(s.cq, &e, 1, NULL, 300), -FI_EAGAIN);
    long long took = now_ms() - t0;
    CHECKF(took >= 290 && took < 5000, "fi_cq_sread(300 ms) returned after %lld ms", took);
    CHECK_RET(fi_cq_sread(s.cq, &e, 1, NULL, 0), -FI_EAGAIN);
    side_close(&s);
}

/* A thread asleep in fi_cq_sread (timeout_ms -1: no timeout). */
struct sleeper {
    struct fid_cq *cq;
    int timeout_ms;
    struct fi_cq_data_entry e;
    ssize_t n;
    long long took;
};

static void *sleep_in_sread(void *arg)
{
    struct sleeper *z = arg;
    long long t0 = now_ms();
    z->n = fi_cq_sread(z->cq, &z->e, 1, NULL, z->timeout_ms);
    z->took = now_ms() - t0;
    return NULL;
}

/* fi_cq_signal wakes a thread asleep in fi_cq_sread with no timeout,
 * which returns -FI_EAGAIN having read nothing; a message that comes
 * after is still there for the next read. */
static void t_cq_signal(void)
{
    struct side server, client;
    pair_open(&server, &client);
    struct sleeper z = {.cq = server.cq, .timeout_ms = -1, .n = 1};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, sleep_in_sread, &z) == 0);
    sleep_ms(200);
    long long t0 = now_ms();
    CHECK_RET(fi_cq_signal(server.cq), 0);
    pthread_join(t, NULL);
    CHECK_RET(z.n, -FI_EAGAIN);
    CHECKF(now_ms() - t0 < 1000, "woke %lld ms after the signal", now_ms() - t0);
    CHECKF(z.took >= 190, "returned after %lld ms, before the signal", z.took);
    /* The signal is spent: a read after it waits for its timeout. */
    struct fi_cq_data_entry e;
    long long t1 = now_ms();
    CHECK_RET(fi_cq_sread(server.cq, &e, 1, NULL, 100), -FI_EAGAIN);
    CHECKF(now_ms() - t1 >= 90, "a later read returned after %lld ms", now_ms() - t1);
    struct region r, l;
    region_reg(&server, &r, 4096, FI_RECV);
    region_reg(&client, &l, 4096, FI_SEND);
    int ctx;
    REQUIRE_RET(fi_recv(server.ep, r.buf, 4096, r.desc, 0, &ctx), 0);
    REQUIRE_RET(fi_send(client.ep, l.buf, 32, l.desc, 0, NULL), 0);
    CQ_EXPECT(client.cq, &e, 10000);
    fi_addr_t from = 0;
    ssize_t n = -FI_EAGAIN;
    for (long long end = now_ms() + 10000; n == -FI_EAGAIN && now_ms() < end;)
        n = fi_cq_sreadfrom(server.cq, &e, 1, &from, NULL, 100);
    CHECK_RET(n, 1);
    CHECK(e.op_context == &ctx);
    CHECK(from == FI_ADDR_NOTAVAIL);
    region_close(&r);
    region_close(&l);
    side_close(&client);
    side_close(&server);
}

/* fi_eq_sread: -FI_EAGAIN after its timeout; an event written with
 * fi_eq_write comes back as written. */
static void t_eq_sread(void)
{
    struct side s;
    side_open(&s, FI_WAIT_UNSPEC);
    uint32_t ev = 0;
    uint8_t buf[64];
    long long t0 = now_ms();
    CHECK_RET(fi_eq_sread(s.eq, &ev, buf, sizeof buf, 300, 0), -FI_EAGAIN);
    long long took = now_ms() - t0;
    CHECKF(took >= 290 && took < 5000, "fi_eq_sread(300 ms) returned after %lld ms", took);
    CHECK_RET(fi_eq_write(s.eq, FI_NOTIFY, NULL, 8, 0), -FI_EINVAL);
    struct fi_eq_entry w = {.fid = &s.eq->fid, .context = buf, .data = 77};
    CHECK_RET(fi_eq_write(s.eq, FI_NOTIFY, &w, sizeof w, 0), sizeof w);
    struct fi_eq_entry got;
    memset(&got, 0, sizeof got);
    CHECK_RET(fi_eq_sread(s.eq, &ev, &got, sizeof got, 5000, 0), sizeof got);
    CHECK_EQ(ev, FI_NOTIFY);
    CHECK(got.context == buf);
    CHECK_EQ(got.data, 77);
    /* A buffer too small for the event leaves it queued. */
    CHECK_RET(fi_eq_write(s.eq, FI_NOTIFY, &w, sizeof w, 0), sizeof w);
    CHECK_RET(fi_eq_read(s.eq, &ev, buf, 4, 0), -FI_ETOOSMALL);
    CHECK_RET(fi_eq_read(s.eq, &ev, &got, sizeof got, FI_PEEK), sizeof got);
    CHECK_RET(fi_eq_read(s.eq, &ev, &got, sizeof got, 0), sizeof got);
    CHECK_RET(fi_eq_read(s.eq, &ev, &got, sizeof got, 0), -FI_EAGAIN);
    side_close(&s);
}

static int readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    while ((r = poll(&p, 1, ms)) < 0 && errno == EINTR)
        ;
    return r > 0 && (p.revents & POLLIN);
}

static void wait_fd_peer(struct chan *c)
{
    struct side s;
    peer_connect(c, &s, request_data, sizeof request_data, NULL, 0);
    step_wait(c);
    side_close(&s);
}

/* An EQ opened with FI_WAIT_FD hands out an fd (fi_control FI_GETWAIT)
 * that poll() reports readable while an event is queued, whether the
 * program wrote it or a peer's request brought it (no EQ read needed);
 * fi_trywait says whether the program may sleep on it. */
static void t_eq_wait_fd(void)
{
    struct peer p;
    peer_start(&p, wait_fd_peer);
    struct side s;
    side_open(&s, FI_WAIT_FD);
    enum fi_wait_obj kind = FI_WAIT_NONE;
    CHECK_RET(fi_control(&s.eq->fid, FI_GETWAITOBJ, &kind), 0);
    CHECK_EQ(kind, FI_WAIT_FD);
    int fd = -1;
    REQUIRE_RET(fi_control(&s.eq->fid, FI_GETWAIT, &fd), 0);
    REQUIRE(fd >= 0);
    struct fid *fids[1] = {&s.eq->fid};
    CHECK_RET(fi_trywait(s.fabric, fids, 1), 0);
    CHECK(!readable(fd, 0));

    struct fi_eq_entry w = {.fid = &s.eq->fid, .data = 5};
    CHECK_RET(fi_eq_write(s.eq, FI_NOTIFY, &w, sizeof w, 0), sizeof w);
    CHECK(readable(fd, 0));
    CHECK_RET(fi_trywait(s.fabric, fids, 1), -FI_EAGAIN);
    uint32_t ev;
    struct fi_eq_entry got;
    CHECK_RET(fi_eq_read(s.eq, &ev, &got, sizeof got, 0), sizeof got);
    CHECK(!readable(fd, 0));
    CHECK_RET(fi_trywait(s.fabric, fids, 1), 0);

    /* A request wakes the fd by itself. */
    struct sockaddr_in a;
    side_listen(&s, &a);
    REQUIRE(chan_send(&p.c, &a, sizeof a) == 0);
    CHECK_RET(fi_trywait(s.fabric, fids, 1), 0);
    CHECKF(readable(fd, 10000), "the fd stayed quiet for 10 s with a request on its way");
    struct fi_info *req = take_request(&s, request_data, sizeof request_data);
    /* FI_CONNECTED, queued by the accept, makes it readable again. */
    side_domain(&s, req);
    side_endpoint(&s);
    REQUIRE_RET(fi_accept(s.ep, NULL, 0), 0);
    CHECK(readable(fd, 1000));
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    EQ_EXPECT(s.eq, FI_CONNECTED, buf, sizeof buf, 1000);
    CHECK(!readable(fd, 0));
    step_send(&p.c);
    peer_end(&p, 10000);
    side_close(&s);

    /* An EQ without a wait object has no fd. */
    side_open(&s, FI_WAIT_NONE);
    fd = -1;
    CHECK(fi_control(&s.eq->fid, FI_GETWAIT, &fd) < 0);
    side_close(&s);
}

/* A connected pair for the CQ wait-fd tests: a 4 KiB receive region on
 * the server, a send region on the client, and the server CQ's fd. */
struct fd_pair {
    struct side server, client;
    struct region r, l;
    int fd;
};

static void fd_pair_open(struct fd_pair *p)
{
    pair_open(&p->server, &p->client);
    region_reg(&p->server, &p->r, 4096, FI_RECV);
    region_reg(&p->client, &p->l, 4096, FI_SEND);
    p->fd = -1;
    REQUIRE_RET(fi_control(&p->server.cq->fid, FI_GETWAIT, &p->fd), 0);
    REQUIRE(p->fd >= 0);
}

/* Waits for the client's send to complete, then closes the pair. */
static void fd_pair_close(struct fd_pair *p)
{
    struct fi_cq_data_entry e;
    CQ_EXPECT(p->client.cq, &e, 10000);
    region_close(&p->r);
    region_close(&p->l);
    side_close(&p->client);
    side_close(&p->server);
}

/* A CQ's fd (FI_GETWAIT on a CQ with a wait object): quiet after
 * fi_trywait says the program may sleep, readable once a peer's message
 * arrives, and the read then finds the receive. */
static void t_cq_wait_fd(void)
{
    struct fd_pair p;
    fd_pair_open(&p);
    int ctx;
    REQUIRE_RET(fi_recv(p.server.ep, p.r.buf, 4096, p.r.desc, 0, &ctx), 0);
    struct fid *fids[1] = {&p.server.cq->fid};
    /* fi_trywait(3): -FI_EAGAIN asks the program to read the CQ and try
     * again (on udp a frame of the handshake may still be arriving); the
     * reads find nothing, and the wait is allowed within a second. */
    int tw = fi_trywait(p.server.fabric, fids, 1);
    for (int i = 0; i < 1000 && tw == -FI_EAGAIN; i++) {
        struct fi_cq_data_entry none;
        CHECK_RET(fi_cq_read(p.server.cq, &none, 1), -FI_EAGAIN);
        sleep_ms(1);
        tw = fi_trywait(p.server.fabric, fids, 1);
    }
    CHECK_RET(tw, 0);
    CHECK(!readable(p.fd, 0));
    fill(p.l.buf, 100, 9);
    REQUIRE_RET(fi_send(p.client.ep, p.l.buf, 100, p.l.desc, 0, NULL), 0);
    CHECKF(readable(p.fd, 5000), "the fd stayed quiet for 5 s with a message on its way");
    struct fi_cq_data_entry e;
    if (CQ_EXPECT(p.server.cq, &e, 1000) == 0) {
        CHECK(e.op_context == &ctx);
        CHECK_EQ(e.len, 100);
        CHECK_PATTERN(p.r.buf, 100, 9);
    }
    fd_pair_close(&p);
}

/* A message that arrives before its receive is posted, as an event loop
 * meets it: the receive posted late, then fi_trywait and a sleep on the
 * CQ's fd. fi_trywait must not allow a sleep while the message waits for
 * the receive (on shm a receive is posted by the CQ's next read, and
 * fi_trywait is one); the fd then wakes the loop, and the read finds it. */
static void t_cq_wait_fd_late_recv(void)
{
    struct fd_pair p;
    fd_pair_open(&p);
    fill(p.l.buf, 100, 7);
    REQUIRE_RET(fi_send(p.client.ep, p.l.buf, 100, p.l.desc, 0, NULL), 0);
    sleep_ms(20);
    int ctx;
    REQUIRE_RET(fi_recv(p.server.ep, p.r.buf, 4096, p.r.desc, 0, &ctx), 0);
    struct fid *fids[1] = {&p.server.cq->fid};
    struct fi_cq_data_entry e;
    ssize_t n = -FI_EAGAIN;
    int slept_in_vain = 0;
    for (long long end = now_ms() + 5000; n == -FI_EAGAIN && now_ms() < end;) {
        /* The fd wakes the sleep within the second (on a network medium
         * the sender's retry brings the message again). */
        if (fi_trywait(p.server.fabric, fids, 1) == 0 && !readable(p.fd, 1000))
            slept_in_vain++;
        n = fi_cq_read(p.server.cq, &e, 1);
    }
    CHECKF(n == 1, "the message sent before its receive: fi_cq_read %s after 5 s", ret_name(n));
    CHECKF(slept_in_vain == 0, "fi_trywait allowed %d sleeps of a second with the message there",
           slept_in_vain);
    if (n == 1) {
        CHECK(e.op_context == &ctx);
        CHECK_EQ(e.len, 100);
        CHECK_PATTERN(p.r.buf, 100, 7);
    }
    fd_pair_close(&p);
}

/* A receive whose descriptor names no registration (its region closed)
 * fails: at once (-FI_EINVAL), or where receives are posted by the CQ's
 * next read (shm) as that read's error entry (FI_EACCES) with the
 * receive's context. Nothing else is lost: a good receive posted after it
 * takes the peer's message. */
static void t_recv_with_a_stale_desc(void)
{
    struct side server, client;
    pair_open(&server, &client);
    struct region stale, r, l;
    region_reg(&server, &stale, 4096, FI_RECV);
    region_reg(&server, &r, 4096, FI_RECV);
    region_reg(&client, &l, 4096, FI_SEND);
    void *stale_desc = stale.desc;
    region_close(&stale);
    int bad, good;
    struct fi_cq_data_entry e;
    ssize_t ret = fi_recv(server.ep, r.buf, 4096, stale_desc, 0, &bad);
    if (ret == 0) {
        struct fi_cq_err_entry err;
        CHECK_RET(cq_take(server.cq, &e, &err, 5000), -FI_EAVAIL);
        CHECK_EQ(err.err, FI_EACCES);
        CHECK(err.op_context == &bad);
    } else {
        CHECK_RET(ret, -FI_EINVAL);
    }
    REQUIRE_RET(fi_recv(server.ep, r.buf, 4096, r.desc, 0, &good), 0);
    fill(l.buf, 64, 5);
    REQUIRE_RET(fi_send(client.ep, l.buf, 64, l.desc, 0, NULL), 0);
    if (CQ_EXPECT(server.cq, &e, 5000) == 0) {
        CHECK(e.op_context == &good);
        CHECK_EQ(e.len, 64);
        CHECK_PATTERN(r.buf, 64, 5);
    }
    CQ_EXPECT(client.cq, &e, 10000);
    region_close(&r);
    region_close(&l);
    side_close(&client);
    side_close(&server);
}

/* A receive beyond the endpoint's receive queue size is refused with
 * -FI_EAGAIN, as a full queue refuses it (uvia: on shm too, where a receive
 * waits for the next CQ read before it reaches the VI, and after that read),
 * and the receives take no room from sends: the endpoint still sends, and
 * its first receive takes the peer's message. (ofi_rxm posts a fresh buffer
 * in place of one it keeps, twice for an unexpected rendezvous request, and
 * counts on this refusal; when receives could fill the room of sends too,
 * MPI over shm hung at 1 MiB.) */
static void t_recv_queue_full(void)
{
    struct side server, client;
    pair_open(&server, &client);
    size_t depth = server.info->rx_attr->size;
    REQUIRE(depth > 0 && depth <= 4096);
    struct region r, s, c;
    region_reg(&server, &r, 64, FI_RECV);
    region_reg(&server, &s, 64, FI_SEND);
    region_reg(&client, &c, 64, FI_SEND | FI_RECV);
    int ctx[2];
    size_t posted = 0;
    ssize_t ret;
    while (posted <= depth &&
           (ret = fi_recv(server.ep, r.buf, 64, r.desc, 0, &ctx[posted > 0])) == 0)
        posted++;
    CHECK_RET(ret, -FI_EAGAIN);
    CHECK_EQ(posted, depth);
    struct fi_cq_data_entry e;
    CHECK_RET(fi_cq_read(server.cq, &e, 1), -FI_EAGAIN);
    CHECK_RET(fi_recv(server.ep, r.buf, 64, r.desc, 0, NULL), -FI_EAGAIN);
    /* Sends go out with every receive slot taken. */
    REQUIRE_RET(fi_recv(client.ep, c.buf, 64, c.desc, 0, NULL), 0);
    fill(s.buf, 64, 7);
    REQUIRE_RET(fi_send(server.ep, s.buf, 64, s.desc, 0, NULL), 0);
    int got_send = 0, got_recv = 0;
    for (long long end = now_ms() + 10000; (!got_send || !got_recv) && now_ms() < end;) {
        struct fi_cq_err_entry err;
        if (cq_take(server.cq, &e, &err, 1) == 1)
            got_send = 1;
        if (cq_take(client.cq, &e, &err, 1) == 1 && (e.flags & FI_RECV)) {
            CHECK_EQ(e.len, 64);
            CHECK_PATTERN(c.buf, 64, 7);
            got_recv = 1;
        }
    }
    CHECKF(got_send && got_recv, "the send with a full receive queue: sent %d, received %d",
           got_send, got_recv);
    /* The client's message takes the server's first receive. */
    fill(c.buf, 64, 8);
    REQUIRE_RET(fi_send(client.ep, c.buf, 64, c.desc, 0, NULL), 0);
    if (CQ_EXPECT(server.cq, &e, 5000) == 0) {
        CHECK(e.op_context == &ctx[0]);
        CHECK_PATTERN(r.buf, 64, 8);
    }
    /* A receive taken back leaves room for one more. */
    CHECK_RET(fi_recv(server.ep, r.buf, 64, r.desc, 0, NULL), 0);
    CHECK_RET(fi_recv(server.ep, r.buf, 64, r.desc, 0, NULL), -FI_EAGAIN);
    CQ_EXPECT(client.cq, &e, 10000);
    region_close(&r);
    region_close(&s);
    region_close(&c);
    side_close(&client);
    side_close(&server);
}

static const size_t pp_sizes[] = {8, 4096, 65536, 1 << 20};
enum { PP_ROUNDS = 10, PP_MAX = 1 << 20 };

/* Takes completions with fi_cq_sread until the receive (and, with
 * want_send, the send) has completed; the receive's entry in *rx. */
static void sread_both(struct fid_cq *cq, int want_send, struct fi_cq_data_entry *rx)
{
    int got_recv = 0, got_send = !want_send;
    while (!got_recv || !got_send) {
        struct fi_cq_data_entry e;
        ssize_t n = fi_cq_sread(cq, &e, 1, NULL, 10000);
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            fi_cq_readerr(cq, &err, 0);
            h_fail(__FILE__, __LINE__, "completion error %s", ret_name(-err.err));
            h_finish();
        }
        if (n != 1) {
            h_fail(__FILE__, __LINE__, "fi_cq_sread: %s", ret_name(n));
            h_finish();
        }
        if (e.flags & FI_RECV) {
            got_recv = 1;
            *rx = e;
        } else {
            got_send = 1;
        }
    }
}

static void pingpong_peer(struct chan *c)
{
    struct side s;
    peer_connect(c, &s, NULL, 0, NULL, 0);
    struct region tx, rx;
    region_reg(&s, &tx, PP_MAX, FI_SEND);
    region_reg(&s, &rx, PP_MAX, FI_RECV);
    unsigned seed = 0;
    for (size_t k = 0; k < sizeof pp_sizes / sizeof pp_sizes[0]; k++)
        for (int i = 0; i < PP_ROUNDS; i++, seed++) {
            size_t n = pp_sizes[k];
            REQUIRE_RET(fi_recv(s.ep, rx.buf, PP_MAX, rx.desc, 0, NULL), 0);
            fill(tx.buf, n, seed);
            REQUIRE_RET(fi_send(s.ep, tx.buf, n, tx.desc, 0, NULL), 0);
            struct fi_cq_data_entry e;
            sread_both(s.cq, 1, &e);
            CHECK_EQ(e.len, n);
            /* The echo comes back with every byte one more. */
            for (size_t j = 0; j < n; j++)
                if (rx.buf[j] != (uint8_t)(pattern(seed, j) + 1)) {
                    CHECKF(0, "size %zu round %d: byte %zu", n, i, j);
                    break;
                }
        }
    step_wait(c);
    region_close(&tx);
    region_close(&rx);
    side_close(&s);
}

/* A ping-pong where both sides block in fi_cq_sread for every completion,
 * 8 B to 1 MiB, every byte checked both ways. */
static void t_pingpong_sread(void)
{
    struct peer p;
    peer_start(&p, pingpong_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, NULL, 0);
    side_domain(&s, req);
    region_reg(&s, &g_target, PP_MAX, FI_RECV | FI_SEND);
    side_endpoint(&s);
    REQUIRE_RET(fi_recv(s.ep, g_target.buf, PP_MAX, g_target.desc, 0, NULL), 0);
    REQUIRE_RET(fi_accept(s.ep, NULL, 0), 0);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    if (EQ_EXPECT(s.eq, FI_CONNECTED, buf, sizeof buf, 10000) < 0)
        h_finish();
    unsigned seed = 0;
    for (size_t k = 0; k < sizeof pp_sizes / sizeof pp_sizes[0]; k++)
        for (int i = 0; i < PP_ROUNDS; i++, seed++) {
            size_t n = pp_sizes[k];
            struct fi_cq_data_entry e;
            sread_both(s.cq, 0, &e);
            CHECK_EQ(e.len, n);
            for (size_t j = 0; j < n; j++) {
                if (g_target.buf[j] != pattern(seed, j)) {
                    CHECKF(0, "size %zu round %d: byte %zu", n, i, j);
                    break;
                }
                g_target.buf[j]++;
            }
            /* The next ping may come as soon as the pong leaves. */
            REQUIRE_RET(fi_send(s.ep, g_target.buf, n, g_target.desc, 0, NULL), 0);
            struct fi_cq_data_entry done;
            REQUIRE(fi_cq_sread(s.cq, &done, 1, NULL, 10000) == 1);
            CHECK(done.flags & FI_SEND);
            REQUIRE_RET(fi_recv(s.ep, g_target.buf, PP_MAX, g_target.desc, 0, NULL), 0);
        }
    step_send(&p.c);
    peer_end(&p, 15000);
    CHECK_RET(fi_close(&s.ep->fid), 0);
    s.ep = NULL;
    region_close(&g_target);
    side_close(&s);
}

/* A message that arrives before any receive is posted waits; a receive
 * posted by another thread while this one sleeps in fi_cq_sread takes it,
 * and the sleeper wakes with the completion (well before its timeout).
 * uvia: on shm a receive is queued for the CQ's next read, and one queued
 * while a thread sleeps in a blocking read is posted at once. */
enum { ASLEEP_LEN = 64, ASLEEP_ROUNDS = 20 };

static void asleep_peer(struct chan *c)
{
    struct side s;
    peer_connect(c, &s, NULL, 0, NULL, 0);
    struct region tx;
    region_reg(&s, &tx, ASLEEP_LEN, FI_SEND);
    for (unsigned seed = 1; seed <= ASLEEP_ROUNDS; seed++) {
        step_wait(c);
        fill(tx.buf, ASLEEP_LEN, seed);
        REQUIRE_RET(fi_send(s.ep, tx.buf, ASLEEP_LEN, tx.desc, 0, NULL), 0);
        struct fi_cq_data_entry e;
        if (CQ_EXPECT(s.cq, &e, 10000) != 0)
            h_finish();
    }
    step_wait(c);
    region_close(&tx);
    side_close(&s);
}

static void t_recv_posted_while_asleep(void)
{
    struct peer p;
    peer_start(&p, asleep_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    side_accept(&s, take_request(&s, NULL, 0), NULL, 0, NULL);
    region_reg(&s, &g_target, ASLEEP_LEN, FI_RECV);
    for (unsigned seed = 1; seed <= ASLEEP_ROUNDS; seed++) {
        /* The message is sent with no receive posted. */
        step_send(&p.c);
        struct sleeper z = {.cq = s.cq, .timeout_ms = 5000};
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, sleep_in_sread, &z) == 0);
        /* Long enough for the message to arrive and the reader to sleep;
         * rounds vary it so that some receives land as it goes to sleep. */
        usleep(seed % 4 == 0 ? 0 : 1000 * (seed % 4) * 10);
        memset(g_target.buf, 0, ASLEEP_LEN);
        REQUIRE_RET(fi_recv(s.ep, g_target.buf, ASLEEP_LEN, g_target.desc, 0, NULL), 0);
        REQUIRE(pthread_join(t, NULL) == 0);
        CHECKF(z.n == 1, "round %u: fi_cq_sread: %s", seed, ret_name(z.n));
        if (z.n != 1)
            break;
        CHECKF(z.e.flags & FI_RECV, "round %u: a receive's completion", seed);
        CHECKF(z.took < 3000, "round %u: woke after %lld ms", seed, z.took);
        CHECK_EQ(z.e.len, ASLEEP_LEN);
        CHECK_PATTERN(g_target.buf, ASLEEP_LEN, seed);
    }
    step_send(&p.c);
    peer_end(&p, 15000);
    CHECK_RET(fi_close(&s.ep->fid), 0);
    s.ep = NULL;
    region_close(&g_target);
    side_close(&s);
}

/* ---- mr: caller memory shared with the peer ----------------------------- */

/* uvia: on shm, the first send longer than 16 KiB from a registered region
 * (one the peer reads by reference) moves the whole pages of its private
 * anonymous buffer into shared memory at the same addresses (unless
 * FI_UVIA_SHARE_MR=0, or the process may not hold writes with a
 * userfaultfd), so the peer copies a large message straight out of them;
 * the partial pages at the edges are read as before. Registration alone
 * moves nothing. These rounds send a buffer that starts and ends inside a
 * page, through registration, fork, deregistration and free(), and check
 * every byte at the peer. */
enum { SHARE_LEN = (1 << 20) + 1000, SHARE_OFF = 100, SHARE_ROUNDS = 4 };

static void shared_pages_peer(struct chan *c)
{
    struct side s;
    peer_connect(c, &s, NULL, 0, NULL, 0);
    struct region rx;
    region_reg(&s, &rx, SHARE_LEN, FI_RECV);
    for (unsigned seed = 1; seed <= SHARE_ROUNDS; seed++) {
        memset(rx.buf, 0, SHARE_LEN);
        REQUIRE_RET(fi_recv(s.ep, rx.buf, SHARE_LEN, rx.desc, 0, NULL), 0);
        step_send(c);
        struct fi_cq_data_entry e;
        if (CQ_EXPECT(s.cq, &e, 10000) != 0)
            h_finish();
        CHECK_EQ(e.len, SHARE_LEN);
        CHECKF(e.flags & FI_RECV, "a receive's completion");
        CHECK_PATTERN(rx.buf, SHARE_LEN, seed);
    }
    step_wait(c);
    region_close(&rx);
    side_close(&s);
}

/* Sends the SHARE_LEN bytes at buf once the peer has posted its receive. */
static void share_send(struct side *s, struct peer *p, const uint8_t *buf, void *desc)
{
    step_wait(&p->c);
    REQUIRE_RET(fi_send(s->ep, buf, SHARE_LEN, desc, 0, NULL), 0);
    struct fi_cq_data_entry e;
    if (CQ_EXPECT(s->cq, &e, 10000) != 0)
        h_finish();
    CHECKF(e.flags & FI_SEND, "a send's completion");
}

static struct fid_mr *share_reg(struct side *s, uint8_t *buf)
{
    struct fid_mr *mr = NULL;
    REQUIRE_RET(fi_mr_reg(s->domain, buf, SHARE_LEN, FI_SEND, 0, 0, 0, &mr, NULL), 0);
    return mr;
}

/* Whether the page at addr is mapped from a registration's memfd. */
static int memfd_backed(const void *addr)
{
    FILE *f = fopen("/proc/self/maps", "r");
    REQUIRE(f != NULL);
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (unsigned long)addr >= lo &&
            (unsigned long)addr < hi) {
            found = strstr(line, "/memfd:uvia-mr") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

static void t_shared_pages(void)
{
    const char *share = getenv("FI_UVIA_SHARE_MR");
    int asked = strcmp(g_domain, "shm") == 0 && !(share && strcmp(share, "0") == 0);
    struct peer p;
    peer_start(&p, shared_pages_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    side_accept(&s, take_request(&s, NULL, 0), NULL, 0, NULL);

    /* Registration keeps the bytes where they were. */
    uint8_t *raw = malloc(SHARE_LEN + 2 * SHARE_OFF);
    REQUIRE(raw != NULL);
    uint8_t *buf = raw + SHARE_OFF;
    fill(buf, SHARE_LEN, 1);
    struct fid_mr *mr = share_reg(&s, buf);
    CHECK_PATTERN(buf, SHARE_LEN, 1);
    CHECKF(!memfd_backed(buf + SHARE_LEN / 2), "pages shared at registration");
    share_send(&s, &p, buf, fi_mr_desc(mr));
    CHECK_PATTERN(buf, SHARE_LEN, 1);
    int shared = memfd_backed(buf + SHARE_LEN / 2);
    CHECKF(shared == asked || (asked && geteuid() != 0),
           "pages shared after a send: %d, asked for: %d (shm, FI_UVIA_SHARE_MR not 0)", shared,
           asked);

    /* A child forked while the buffer is registered sees its bytes; the
     * parent's later writes are what the peer gets. uvia: with the pages
     * shared, the child shares them (sees the parent's writes), as memory
     * mapped MAP_SHARED does; without (FI_UVIA_SHARE_MR=0, or on udp)
     * it keeps its copy. */
    int go[2], seen[2];
    REQUIRE(pipe(go) == 0 && pipe(seen) == 0);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        char b;
        int ok = 1;
        for (size_t j = 0; j < SHARE_LEN; j++)
            ok &= buf[j] == pattern(1, j);
        if (write(seen[1], "c", 1) != 1 || read(go[0], &b, 1) != 1)
            _exit(3);
        size_t mid = SHARE_LEN / 2;
        ok &= buf[mid] == pattern(shared ? 2 : 1, mid);
        _exit(ok ? 0 : 1);
    }
    char b;
    CHECK(read(seen[0], &b, 1) == 1);
    fill(buf, SHARE_LEN, 2);
    share_send(&s, &p, buf, fi_mr_desc(mr));
    CHECK(write(go[1], "g", 1) == 1);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child saw other bytes (%d)",
           status);
    close(go[0]);
    close(go[1]);
    close(seen[0]);
    close(seen[1]);

    /* Deregistration leaves the bytes; the same buffer registers again. */
    CHECK_RET(fi_close(&mr->fid), 0);
    CHECK_PATTERN(buf, SHARE_LEN, 2);
    fill(buf, SHARE_LEN, 3);
    mr = share_reg(&s, buf);
    CHECK_PATTERN(buf, SHARE_LEN, 3);
    share_send(&s, &p, buf, fi_mr_desc(mr));
    CHECK_RET(fi_close(&mr->fid), 0);

    /* Freed and allocated again (likely at the same address). */
    free(raw);
    raw = malloc(SHARE_LEN + 2 * SHARE_OFF);
    REQUIRE(raw != NULL);
    buf = raw + SHARE_OFF;
    fill(buf, SHARE_LEN, 4);
    mr = share_reg(&s, buf);
    share_send(&s, &p, buf, fi_mr_desc(mr));
    CHECK_RET(fi_close(&mr->fid), 0);
    free(raw);

    step_send(&p.c);
    peer_end(&p, 15000);
    side_close(&s);
}

/* ---- fail: a peer that dies --------------------------------------------- */

enum { STREAM_LEN = 256 * 1024, STREAM_DEPTH = 8 };

static void killed_peer(struct chan *c)
{
    struct side s;
    peer_connect(c, &s, NULL, 0, NULL, 0);
    struct region rx;
    region_reg(&s, &rx, STREAM_LEN * STREAM_DEPTH, FI_RECV);
    for (int i = 0; i < STREAM_DEPTH; i++)
        REQUIRE_RET(fi_recv(s.ep, rx.buf + (size_t)i * STREAM_LEN, STREAM_LEN, rx.desc, 0,
                            rx.buf + (size_t)i * STREAM_LEN), 0);
    /* Receive until killed, telling the test once messages flow. */
    for (int got = 0;; got++) {
        struct fi_cq_data_entry e;
        if (CQ_EXPECT(s.cq, &e, 15000) != 0)
            h_finish();
        if (got == 20)
            step_send(c);
        REQUIRE_RET(fi_recv(s.ep, e.op_context, STREAM_LEN, rx.desc, 0, e.op_context), 0);
    }
}

/* A peer killed (SIGKILL) while this side streams to it: within a bounded
 * time the CQ reports errors for what was outstanding or the EQ reports
 * FI_SHUTDOWN, and nothing hangs (the endpoint and the domain close). */
static void t_peer_killed(void)
{
    struct peer p;
    peer_start(&p, killed_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    side_accept(&s, take_request(&s, NULL, 0), NULL, 0, NULL);
    region_reg(&s, &g_target, STREAM_LEN, FI_SEND);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    int outstanding = 0, sent = 0, errors = 0, shutdown = 0, post_failed = 0, killed = 0, said = 0;
    long long killed_at = 0, deadline = now_ms() + 15000;
    while (now_ms() < deadline) {
        while (!post_failed && outstanding < STREAM_DEPTH) {
            ssize_t r = fi_send(s.ep, g_target.buf, STREAM_LEN, g_target.desc, 0, NULL);
            if (r == -FI_EAGAIN)
                break;
            if (r != 0) {
                /* uvia: a failed connection refuses posts. */
                CHECKF(killed, "fi_send failed before the peer was killed: %s", ret_name(r));
                post_failed = 1;
                break;
            }
            outstanding++;
        }
        struct fi_cq_data_entry e;
        struct fi_cq_err_entry err;
        ssize_t n = cq_take(s.cq, &e, &err, 5);
        if (n == 1) {
            outstanding--;
            sent++;
        } else if (n == -FI_EAVAIL) {
            CHECKF(killed, "a completion error before the peer was killed: %s", ret_name(-err.err));
            if (err.err == FI_EIO && !said) {
                /* A transport error says why the connection failed. On
                 * the network domains the engine knows (the peer fell
                 * silent, or retransmissions ran out); shm learns only
                 * that the peer is gone. */
                char text[256];
                fi_cq_strerror(s.cq, err.prov_errno, err.err_data, text, sizeof text);
                h_note("the transport error says: %s", text);
                if (strcmp(g_domain, "shm") != 0)
                    CHECKF(strstr(text, "idle timeout") || strstr(text, "retransmissions ran out"),
                           "a transport error on %s without its reason: %s", g_domain, text);
                said = 1;
            }
            outstanding--;
            errors++;
        }
        uint32_t ev;
        ssize_t k = fi_eq_read(s.eq, &ev, buf, sizeof buf, 0);
        if (k >= 0 && ev == FI_SHUTDOWN) {
            CHECK(((struct fi_eq_cm_entry *)buf)->fid == &s.ep->fid);
            shutdown = 1;
        }
        if (!killed && sent > 0) {
            char b;
            if (chan_recv(&p.c, 0, &b, 1) == 1) {
                peer_kill(&p);
                killed = 1;
                killed_at = now_ms();
                h_note("killed the peer after %d messages", sent);
            }
        }
        /* Done when the failure is known and everything posted is back. */
        if (killed && (errors > 0 || shutdown) && outstanding == 0)
            break;
    }
    CHECKF(killed, "the peer never reported messages flowing (%d sent)", sent);
    CHECKF(errors > 0 || shutdown, "no CQ error and no FI_SHUTDOWN within %lld ms of the kill",
           now_ms() - killed_at);
    CHECKF(outstanding == 0, "%d sends never completed", outstanding);
    h_note("after the kill: %d errors, shutdown %d, posts refused %d, %lld ms", errors, shutdown,
           post_failed, now_ms() - killed_at);
    CHECK_RET(fi_close(&s.ep->fid), 0);
    s.ep = NULL;
    region_close(&g_target);
    side_close(&s);
}

/* ---- Completions outlive their endpoint ----------------------------------- */

enum { LEFT_MSGS = 4, LEFT_POSTED = 8, LEFT_LEN = 1024 };

/* The peer: sends LEFT_MSGS messages, waits for their completions, and
 * closes its endpoint. */
static void left_peer(struct chan *c)
{
    struct side s;
    peer_connect(c, &s, NULL, 0, NULL, 0);
    struct region tx;
    region_reg(&s, &tx, LEFT_LEN, FI_SEND);
    for (int i = 0; i < LEFT_MSGS; i++) {
        fill(tx.buf, LEFT_LEN, (unsigned)i);
        REQUIRE_RET(fi_send(s.ep, tx.buf, LEFT_LEN, tx.desc, 0, NULL), 0);
        struct fi_cq_data_entry e;
        if (CQ_EXPECT(s.cq, &e, 10000) != 0)
            h_finish();
    }
    region_close(&tx);
    side_close(&s);
    step_send(c);
}

static struct region g_left;

static void post_left(struct side *s)
{
    for (int i = 0; i < LEFT_POSTED; i++)
        REQUIRE_RET(fi_recv(s->ep, g_left.buf + (size_t)i * LEFT_LEN, LEFT_LEN, g_left.desc, 0,
                            (void *)(uintptr_t)(0x100 + i)), 0);
}

/* Messages that completed before their endpoint closed are still read
 * from the CQ after the close. The peer sends and leaves; this side, its
 * CQ unread, takes FI_SHUTDOWN from the EQ, closes the endpoint and only
 * then reads the CQ: every message is there, in order, with its bytes
 * (receives the departure flushed may follow, as FI_ECANCELED errors).
 * ofi_rxm closes a connection's endpoint when its peer shuts down and
 * then reads what the CQ holds of it: a peer's last message is lost
 * where the provider drops that. */
static void t_completions_outlive_their_endpoint(void)
{
    struct peer p;
    peer_start(&p, left_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    struct fi_info *req = take_request(&s, NULL, 0);
    side_domain(&s, req);
    region_reg(&s, &g_left, (size_t)LEFT_POSTED * LEFT_LEN, FI_RECV);
    side_endpoint(&s);
    post_left(&s);
    REQUIRE_RET(fi_accept(s.ep, NULL, 0), 0);
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 128];
    if (EQ_EXPECT(s.eq, FI_CONNECTED, buf, sizeof buf, 10000) < 0)
        h_finish();
    step_wait(&p.c);
    if (EQ_EXPECT(s.eq, FI_SHUTDOWN, buf, sizeof buf, 10000) < 0)
        h_finish();
    CHECK_RET(fi_close(&s.ep->fid), 0);
    s.ep = NULL;
    int got = 0, flushed = 0;
    for (;;) {
        struct fi_cq_data_entry e;
        struct fi_cq_err_entry err;
        ssize_t n = cq_take(s.cq, &e, &err, 200);
        if (n == -FI_EAGAIN)
            break;
        if (n == -FI_EAVAIL) {
            CHECKF(err.err == FI_ECANCELED, "an error entry other than a flush: %s",
                   ret_name(-err.err));
            flushed++;
            continue;
        }
        REQUIRE(n == 1);
        CHECKF(flushed == 0, "a message after a flushed receive");
        CHECK_EQ((uintptr_t)e.op_context, 0x100 + got);
        CHECK_EQ(e.len, LEFT_LEN);
        CHECK(e.flags & FI_RECV);
        if ((uintptr_t)e.op_context == (uintptr_t)(0x100 + got) && got < LEFT_MSGS)
            CHECK_PATTERN(g_left.buf + (size_t)got * LEFT_LEN, LEFT_LEN, (unsigned)got);
        got++;
    }
    h_note("read after the close: %d messages, %d flushed receives", got, flushed);
    CHECK_EQ(got, LEFT_MSGS);
    CHECKF(flushed <= LEFT_POSTED - LEFT_MSGS, "%d flushed receives", flushed);
    peer_end(&p, 5000);
    region_close(&g_left);
    side_close(&s);
}

/* ---- An endpoint closed while another thread reads its CQ ---------------- */

enum { CR_CYCLES = 8, CR_SLOTS = 32, CR_LEN = 4096, CR_DEPTH = 8 };

/* What the reading thread saw; the main thread checks it. */
struct close_reader {
    struct fid_cq *cq;
    _Atomic int stop;
    /* Endpoints closed so far (their fi_close returned). */
    _Atomic int closed;
    /* Receives completed in each cycle. */
    _Atomic int got[CR_CYCLES];
    /* Entries of an endpoint read by reads begun after its close. */
    _Atomic int after_close;
    _Atomic int bad_context, bad_entry, bad_data, errors, other_errors;
    uint8_t *bufs;
};

/* A receive's context names its cycle and slot. */
#define CR_CONTEXT(cycle, slot) ((void *)(uintptr_t)(0x10000u + (cycle) * CR_SLOTS + (slot)))

static void *close_reader_run(void *arg)
{
    struct close_reader *r = arg;
    while (!r->stop) {
        /* An entry of an endpoint whose close returned before this read
         * began is one the provider kept after the close. */
        int closed_before = r->closed;
        struct fi_cq_data_entry e[8];
        ssize_t n = fi_cq_read(r->cq, e, 8);
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            if (fi_cq_readerr(r->cq, &err, 0) == 1) {
                uintptr_t c = (uintptr_t)err.op_context - 0x10000u;
                if (err.err == FI_ECANCELED && c < CR_CYCLES * CR_SLOTS) {
                    /* A receive flushed when the peer left. */
                    r->errors++;
                } else {
                    r->other_errors++;
                }
            }
            continue;
        }
        for (ssize_t i = 0; i < n; i++) {
            uintptr_t c = (uintptr_t)e[i].op_context - 0x10000u;
            if (c >= CR_CYCLES * CR_SLOTS) {
                r->bad_context++;
                continue;
            }
            int cycle = (int)(c / CR_SLOTS);
            if (cycle < closed_before)
                r->after_close++;
            if (!(e[i].flags & FI_RECV) || e[i].len != CR_LEN) {
                r->bad_entry++;
                continue;
            }
            const uint8_t *b = r->bufs + c * CR_LEN;
            for (size_t k = 0; k < CR_LEN; k++)
                if (b[k] != pattern((unsigned)cycle, k)) {
                    r->bad_data++;
                    break;
                }
            r->got[cycle]++;
        }
    }
    return NULL;
}

/* The peer: for each cycle the test asks for, connects, streams CR_LEN
 * messages of the cycle's pattern until the test's close fails the
 * connection, and says so. */
static void close_reader_peer(struct chan *c)
{
    struct sockaddr_in a;
    listener_address(c, &a);
    struct side s;
    side_open(&s, FI_WAIT_UNSPEC);
    for (int cycle = 0; cycle < CR_CYCLES; cycle++) {
        step_wait(c);
        side_connect(&s, &a, NULL, 0, NULL, 0);
        struct region tx;
        region_reg(&s, &tx, CR_LEN, FI_SEND);
        fill(tx.buf, CR_LEN, (unsigned)cycle);
        int outstanding = 0, failed = 0;
        uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
        for (long long end = now_ms() + 20000; !failed || outstanding > 0;) {
            if (now_ms() > end) {
                h_fail(__FILE__, __LINE__, "cycle %d: the test's close failed nothing here in 20 s",
                       cycle);
                h_finish();
            }
            while (!failed && outstanding < CR_DEPTH) {
                ssize_t r = fi_send(s.ep, tx.buf, CR_LEN, tx.desc, 0, NULL);
                if (r == -FI_EAGAIN)
                    break;
                if (r != 0) {
                    failed = 1;
                    break;
                }
                outstanding++;
            }
            struct fi_cq_data_entry e;
            struct fi_cq_err_entry err;
            ssize_t n = cq_take(s.cq, &e, &err, 1);
            if (n == 1 || n == -FI_EAVAIL)
                outstanding--;
            if (n == -FI_EAVAIL)
                failed = 1;
            uint32_t ev;
            if (fi_eq_read(s.eq, &ev, buf, sizeof buf, 0) >= 0 && ev == FI_SHUTDOWN)
                failed = 1;
        }
        region_close(&tx);
        CHECK_RET(fi_close(&s.ep->fid), 0);
        CHECK_RET(fi_close(&s.cq->fid), 0);
        CHECK_RET(fi_close(&s.domain->fid), 0);
        s.ep = NULL;
        s.cq = NULL;
        s.domain = NULL;
        step_send(c);
    }
    side_close(&s);
}

/* An endpoint closed while another thread reads its CQ and its peer
 * streams to it, eight times over one CQ: every close returns 0, and
 * every entry the reader takes, before the close or after it (what had
 * completed stays in the CQ), is a receive of this test's with its
 * peer's bytes, or one flushed; nothing crashes or hangs. */
static void t_close_while_read(void)
{
    struct peer p;
    peer_start(&p, close_reader_peer);
    struct side s;
    serve(&s, &p, FI_WAIT_UNSPEC);
    static struct close_reader r;
    struct region rx = {0};
    pthread_t t;
    for (int cycle = 0; cycle < CR_CYCLES; cycle++) {
        step_send(&p.c);
        struct fi_info *req = take_request(&s, NULL, 0);
        if (cycle == 0) {
            /* The domain, the CQ and the reader outlive the endpoints. */
            side_domain(&s, req);
            region_reg(&s, &rx, (size_t)CR_CYCLES * CR_SLOTS * CR_LEN, FI_RECV);
            r.cq = s.cq;
            r.bufs = rx.buf;
            REQUIRE(pthread_create(&t, NULL, close_reader_run, &r) == 0);
        }
        /* side_endpoint() opens on s.info: the request's, then the first. */
        struct fi_info *first = s.info;
        s.info = req;
        side_endpoint(&s);
        s.info = first;
        if (cycle > 0)
            fi_freeinfo(req);
        for (int k = 0; k < CR_SLOTS; k++) {
            size_t slot = (size_t)cycle * CR_SLOTS + (size_t)k;
            REQUIRE_RET(fi_recv(s.ep, rx.buf + slot * CR_LEN, CR_LEN, rx.desc, 0,
                                CR_CONTEXT(cycle, k)), 0);
        }
        REQUIRE_RET(fi_accept(s.ep, NULL, 0), 0);
        uint8_t buf[sizeof(struct fi_eq_cm_entry) + 128];
        if (EQ_EXPECT(s.eq, FI_CONNECTED, buf, sizeof buf, 10000) < 0)
            h_finish();
        /* Close once messages flow: the rest of the peer's are in flight. */
        long long end = now_ms() + 10000;
        while (r.got[cycle] < CR_DEPTH && now_ms() < end)
            sleep_ms(0);
        CHECKF(r.got[cycle] >= CR_DEPTH, "cycle %d: %d messages in 10 s", cycle, r.got[cycle]);
        CHECK_RET(fi_close(&s.ep->fid), 0);
        s.ep = NULL;
        r.closed = cycle + 1;
        step_wait(&p.c);
    }
    r.stop = 1;
    pthread_join(t, NULL);
    int got = 0;
    for (int c = 0; c < CR_CYCLES; c++)
        got += r.got[c];
    h_note("received %d (%d read after their endpoint's close), flushed %d", got,
           (int)r.after_close, (int)r.errors);
    CHECK_EQ(r.bad_context, 0);
    CHECK_EQ(r.bad_entry, 0);
    CHECK_EQ(r.bad_data, 0);
    CHECK_EQ(r.other_errors, 0);
    peer_end(&p, 5000);
    region_close(&rx);
    side_close(&s);
}

/* ---- The runner ---------------------------------------------------------- */

static const struct test tests[] = {
    {"cm", "accept_with_private_data", t_accept_with_data, 0},
    {"cm", "reject_with_private_data", t_reject_with_data, 0},
    {"cm", "private_data_limits", t_private_data_limits, 0},
    {"cm", "listen_on_a_held_port", t_listen_on_a_held_port, 0},
    {"cm", "connect_to_a_closed_listener", t_connect_to_a_closed_listener, 0},
    {"cm", "shutdown_seen_by_eq_reads", t_shutdown_seen_by_eq_reads, 0},
    {"rma", "writedata_consumes_a_receive", t_writedata, 0},
    {"rma", "read", t_read, 0},
    {"rma", "write_without_remote_write", t_write_without_permission, 0},
    {"rma", "read_without_remote_read", t_read_without_permission, 0},
    {"mr", "access_flags", t_access_flags, 0},
    {"mr", "empty_and_null", t_empty_and_null, 0},
    {"mr", "requested_keys", t_requested_keys, 0},
    {"mr", "closed_region_and_wide_key", t_closed_region_and_wide_key, 0},
    {"mr", "shared_pages", t_shared_pages, 25},
    {"call", "not_enabled_or_connected", t_not_enabled_or_connected, 0},
    {"call", "null_buffers", t_null_buffers, 0},
    {"call", "sizes_above_limits", t_sizes_above_limits, 0},
    {"call", "second_bind", t_second_bind, 0},
    {"cm", "answered_twice", t_answered_twice, 0},
    {"cm", "listener_closed_with_a_request", t_listener_closed_with_a_request, 0},
    {"call", "cq_read_count_zero", t_cq_read_count_zero, 0},
    {"call", "cq_read_after_entries", t_cq_read_after_entries, 0},
    {"call", "unsupported", t_unsupported, 0},
    {"wait", "cq_sread_timeout", t_cq_sread_timeout, 0},
    {"wait", "cq_signal", t_cq_signal, 0},
    {"wait", "eq_sread", t_eq_sread, 0},
    {"wait", "eq_wait_fd", t_eq_wait_fd, 0},
    {"wait", "cq_wait_fd", t_cq_wait_fd, 0},
    {"wait", "cq_wait_fd_late_recv", t_cq_wait_fd_late_recv, 0},
    {"mr", "recv_with_a_stale_desc", t_recv_with_a_stale_desc, 0},
    {"queue", "recv_queue_full", t_recv_queue_full, 0},
    {"wait", "pingpong_sread", t_pingpong_sread, 25},
    {"wait", "recv_posted_while_asleep", t_recv_posted_while_asleep, 25},
    {"fail", "peer_killed_mid_transfer", t_peer_killed, 25},
    {"fail", "endpoint_closed_while_its_cq_is_read", t_close_while_read, 90},
    {"fail", "completions_outlive_their_endpoint", t_completions_outlive_their_endpoint, 0},
    {NULL, NULL, NULL, 0},
};

/* Runs one test in a process (and process group) of its own; 1 if it passed. */
static int run(const struct test *t)
{
    char name[128];
    snprintf(name, sizeof name, "%s/%s", t->area, t->name);
    fflush(stdout);
    fflush(stderr);
    long long t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0) {
        printf("FAIL %s: fork: %s\n", name, strerror(errno));
        return 0;
    }
    if (pid == 0) {
        setpgid(0, 0);
        g_test = t;
        alarm(t->limit ? t->limit : 20);
        t->fn();
        h_finish();
    }
    setpgid(pid, pid);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    /* Whatever the test left running goes with its group. */
    kill(-pid, SIGKILL);
    long long took = now_ms() - t0;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        printf("ok   %s (%lld ms)\n", name, took);
        return 1;
    }
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
        printf("FAIL %s: still running after %u s (watchdog)\n", name, t->limit ? t->limit : 20);
    else if (WIFSIGNALED(st))
        printf("FAIL %s: died of signal %d (%s)\n", name, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        printf("FAIL %s: %d failed checks (%lld ms)\n", name, WEXITSTATUS(st), took);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: fi_conformance [-v] [-l] [-t PATTERN] DOMAIN\n"
                    "  DOMAIN   the uvia domain to test: shm or udp\n"
                    "  -t       run the tests whose area/name matches the glob PATTERN\n"
                    "  -l       list the tests\n"
                    "  -v       say more about each test\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *pattern_arg = NULL;
    int list = 0, opt;
    while ((opt = getopt(argc, argv, "vlt:")) != -1) {
        switch (opt) {
        case 'v':
            g_verbose = 1;
            break;
        case 'l':
            list = 1;
            break;
        case 't':
            pattern_arg = optarg;
            break;
        default:
            usage();
        }
    }
    if (optind + 1 != argc && !list)
        usage();
    g_domain = optind < argc ? argv[optind] : "shm";
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* A peer that exits early must not kill the writer of a pipe. */
    signal(SIGPIPE, SIG_IGN);
    int passed = 0, failed = 0;
    for (const struct test *t = tests; t->name; t++) {
        char name[128];
        snprintf(name, sizeof name, "%s/%s", t->area, t->name);
        if (pattern_arg && fnmatch(pattern_arg, name, 0) != 0 && !strstr(name, pattern_arg))
            continue;
        if (list) {
            printf("%s\n", name);
            continue;
        }
        if (run(t))
            passed++;
        else
            failed++;
    }
    if (!list)
        printf("fi conformance %s: %d passed, %d failed\n", g_domain, passed, failed);
    return failed ? 1 : 0;
}
