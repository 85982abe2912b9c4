/*
 * Connection management: accept (and the addresses and attributes each
 * side learns), reject (VIP_REJECT), nobody listening (VIP_NO_MATCH),
 * timeouts (VIP_TIMEOUT), disconnect (the peer's outstanding descriptors
 * flushed, reconnecting), the peer's death by kill -9 (VIP_STATE_ERROR,
 * descriptors completed with an error, the error callback), calls on a VI
 * that is not idle, reliability levels that differ, bad addresses, and
 * peer-to-peer connections (network providers; VIP_ERROR_NOT_SUPPORTED on
 * shm), a peer's address kept in a 40-byte buffer as VIA-era libraries
 * keep it, the line a request that nothing answers writes, and two
 * processes sharing one udp device.
 */
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct cm_arg {
    char disc[33], disc2[33];
    int flag;
};

static struct cm_arg A;

static void new_arg(void)
{
    memset(&A, 0, sizeof A);
    disc_new(A.disc);
    disc_new(A.disc2);
}

/* Waits for T_QUIT while keeping vi moving, then disconnects. */
static void linger(struct chan *c, VIP_VI_HANDLE vi)
{
    int tag = vi ? chan_recv_pump(c, vi, 15000, NULL, 0) : chan_recv(c, 15000, NULL, 0, NULL);
    CHECKF(tag == T_QUIT, "expected the test's T_QUIT, got %d", tag);
    if (vi)
        VipDisconnect(vi);
}

/* ---- Accept: what each side learns ------------------------------------------------- */

#define SRV_MTU 4444
#define CLI_MTU 3333

static void srv_accept_addrs(struct chan *c, void *arg)
{
    struct cm_arg *a = arg;
    struct side s;
    side_open_peer(&s);
    send_addr(c, &s);
    char client[HOST_TEXT];
    recv_addr(c, client);
    VIP_VI_ATTRIBUTES va = vi_attrs(&s, default_level());
    va.MaxTransferSize = SRV_MTU;
    VIP_VI_HANDLE vi = NULL;
    REQUIRE_RET(VipCreateVi(s.nic, &va, NULL, NULL, &vi), VIP_SUCCESS);
    s.vis[s.nvis++] = vi;
    VIP_NET_ADDRESS *local = addr_new(s.address, a->disc);
    VIP_NET_ADDRESS *remote = addr_room();
    memset(remote->HostAddress, 0x55, VIPL_HOST_ADDRESS_LEN + 64);
    size_t hostlen = s.attrs.NicAddressLen;
    VIP_VI_ATTRIBUTES ra;
    memset(&ra, 0, sizeof ra);
    VIP_CONN_HANDLE conn = NULL;
    REQUIRE_RET(VipConnectWait(s.nic, local, 10000, remote, &ra, &conn), VIP_SUCCESS);
    CHECK(conn != NULL);
    /* The client's address: its NIC's host address, then the discriminator. */
    CHECK_EQ(remote->HostAddressLen, hostlen);
    char host[HOST_TEXT];
    host_hex(remote->HostAddress, remote->HostAddressLen, host);
    CHECKF(strcmp(host, client) == 0, "the client's address is %s, it says %s", host, client);
    CHECK_EQ(remote->DiscriminatorLen, strlen(a->disc));
    CHECK(memcmp(remote->HostAddress + hostlen, a->disc, strlen(a->disc)) == 0);
    /* Nothing past the discriminator. */
    CHECK_EQ(remote->HostAddress[hostlen + strlen(a->disc)], 0x55);
    /* The client's VI attributes. */
    CHECK_EQ(ra.ReliabilityLevel, default_level());
    CHECK_EQ(ra.MaxTransferSize, CLI_MTU);
    CHECK_EQ(!!ra.EnableRdmaWrite, 1);
    CHECK_EQ(!!ra.EnableRdmaRead, 0);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    CHECK_RET(VipConnectAccept(conn, vi), VIP_SUCCESS);
    CHECK_STATE(vi, VIP_STATE_CONNECTED);
    chan_send(c, T_READY, NULL, 0);
    linger(c, vi);
    side_close(&s);
}

static void t_accept(int arg)
{
    (void)arg;
    new_arg();
    struct peer p;
    peer_start(&p, srv_accept_addrs, &A);
    struct side s;
    side_open(&s, NULL);
    char host[HOST_TEXT];
    recv_addr(&p.c, host);
    send_addr(&p.c, &s);
    VIP_VI_ATTRIBUTES va = vi_attrs(&s, default_level());
    va.MaxTransferSize = CLI_MTU;
    va.EnableRdmaWrite = VIP_TRUE;
    VIP_VI_HANDLE vi = NULL;
    REQUIRE_RET(VipCreateVi(s.nic, &va, NULL, NULL, &vi), VIP_SUCCESS);
    s.vis[s.nvis++] = vi;
    VIP_NET_ADDRESS *local = addr_new(s.address, A.disc), *remote = addr_new(host, A.disc);
    VIP_VI_ATTRIBUTES ra;
    memset(&ra, 0, sizeof ra);
    CHECK_RET(VipConnectRequest(vi, local, remote, 10000, &ra), VIP_SUCCESS);
    /* The server's VI attributes. */
    CHECK_EQ(ra.ReliabilityLevel, default_level());
    CHECK_EQ(ra.MaxTransferSize, SRV_MTU);
    CHECK_EQ(!!ra.EnableRdmaWrite, 0);
    CHECK_EQ(!!ra.EnableRdmaRead, 0);
    CHECK_STATE(vi, VIP_STATE_CONNECTED);
    CHAN_EXPECT(&p.c, 10000, T_READY, NULL, 0);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end_pumping(&p, vi, 15000);
    VipDisconnect(vi);
    side_close(&s);
}

/* ---- Reject ---------------------------------------------------------------------------- */

static void srv_reject_then_accept(struct chan *c, void *arg)
{
    struct cm_arg *a = arg;
    struct side s;
    side_open_peer(&s);
    send_addr(c, &s);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_NET_ADDRESS *local = addr_new(s.address, a->disc), *remote = addr_room();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    REQUIRE_RET(VipConnectWait(s.nic, local, 10000, remote, &ra, &conn), VIP_SUCCESS);
    CHECK_RET(VipConnectReject(conn), VIP_SUCCESS);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    chan_send(c, T_DONE, NULL, 0);
    /* The same client asks again: accepted this time. */
    REQUIRE_RET(VipConnectWait(s.nic, local, 10000, remote, &ra, &conn), VIP_SUCCESS);
    CHECK_RET(VipConnectAccept(conn, vi), VIP_SUCCESS);
    chan_send(c, T_READY, NULL, 0);
    linger(c, vi);
    side_close(&s);
}

static void t_reject(int arg)
{
    (void)arg;
    new_arg();
    struct peer p;
    peer_start(&p, srv_reject_then_accept, &A);
    struct side s;
    side_open(&s, NULL);
    char host[HOST_TEXT];
    recv_addr(&p.c, host);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_NET_ADDRESS *local = addr_new(s.address, A.disc), *remote = addr_new(host, A.disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_RET(VipConnectRequest(vi, local, remote, 10000, &ra), VIP_REJECT);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    CHAN_EXPECT(&p.c, 10000, T_DONE, NULL, 0);
    CHECK_RET(VipConnectRequest(vi, local, remote, 10000, &ra), VIP_SUCCESS);
    CHECK_STATE(vi, VIP_STATE_CONNECTED);
    CHAN_EXPECT(&p.c, 10000, T_READY, NULL, 0);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end_pumping(&p, vi, 15000);
    VipDisconnect(vi);
    side_close(&s);
}

/* ---- Nobody listening; timeouts -------------------------------------------------------- */

static void srv_listen_elsewhere(struct chan *c, void *arg)
{
    struct cm_arg *a = arg;
    struct side s;
    side_open_peer(&s);
    send_addr(c, &s);
    /* Listens on disc2; the test asks for disc. */
    VIP_NET_ADDRESS *local = addr_new(s.address, a->disc2), *remote = addr_room();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    long long t0 = now_ms();
    CHECK_RET(VipConnectWait(s.nic, local, 3000, remote, &ra, &conn), VIP_TIMEOUT);
    long long ms = now_ms() - t0;
    CHECKF(ms >= 2900 && ms < 8000, "a 3000 ms VipConnectWait took %lld ms", ms);
    linger(c, NULL);
    side_close(&s);
}

static void t_no_match(int arg)
{
    (void)arg;
    new_arg();
    struct peer p;
    peer_start(&p, srv_listen_elsewhere, &A);
    struct side s;
    side_open(&s, NULL);
    char host[HOST_TEXT];
    recv_addr(&p.c, host);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_NET_ADDRESS *local = addr_new(s.address, A.disc), *remote = addr_new(host, A.disc);
    VIP_VI_ATTRIBUTES ra;
    long long t0 = now_ms();
    CHECK_RET(VipConnectRequest(vi, local, remote, 500, &ra), VIP_NO_MATCH);
    long long ms = now_ms() - t0;
    CHECKF(ms < 5000, "VipConnectRequest with a 500 ms timeout took %lld ms", ms);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end(&p, 15000);
    side_close(&s);
}

static void srv_never_answers(struct chan *c, void *arg)
{
    struct cm_arg *a = arg;
    struct side s;
    side_open_peer(&s);
    send_addr(c, &s);
    VIP_NET_ADDRESS *local = addr_new(s.address, a->disc), *remote = addr_room();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    REQUIRE_RET(VipConnectWait(s.nic, local, 10000, remote, &ra, &conn), VIP_SUCCESS);
    /* Holds the request unanswered until the test has timed out. */
    CHAN_EXPECT(c, 15000, T_DONE, NULL, 0);
    VipConnectReject(conn);
    linger(c, NULL);
    side_close(&s);
}

static void t_timeouts(int arg)
{
    (void)arg;
    new_arg();
    struct peer p;
    peer_start(&p, srv_never_answers, &A);
    struct side s;
    side_open(&s, NULL);
    char host[HOST_TEXT];
    recv_addr(&p.c, host);
    /* Waiting for a client that never comes. */
    char lonely[33];
    disc_new(lonely);
    VIP_NET_ADDRESS *mine = addr_new(s.address, lonely), *room = addr_room();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    long long t0 = now_ms();
    CHECK_RET(VipConnectWait(s.nic, mine, 300, room, &ra, &conn), VIP_TIMEOUT);
    long long ms = now_ms() - t0;
    CHECKF(ms >= 290 && ms < 5000, "a 300 ms VipConnectWait took %lld ms", ms);
    /* A server that takes the request and never answers. */
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_NET_ADDRESS *local = addr_new(s.address, A.disc), *remote = addr_new(host, A.disc);
    t0 = now_ms();
    CHECK_RET(VipConnectRequest(vi, local, remote, 1000, &ra), VIP_TIMEOUT);
    ms = now_ms() - t0;
    CHECKF(ms >= 950 && ms < 5000, "a 1000 ms VipConnectRequest took %lld ms", ms);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    chan_send(&p.c, T_DONE, NULL, 0);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end(&p, 15000);
    side_close(&s);
}

/* ---- Disconnect ------------------------------------------------------------------------ */

static void srv_flushed(struct conn *x, void *arg)
{
    (void)arg;
    if (chan_recv_pump(x->c, x->vi, 10000, NULL, 0) != T_GO)
        return;
    /* The test disconnected: the receives outstanding here are flushed. */
    for (int i = 0; i < 3; i++) {
        VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 5000);
        CHECKF(d == x->pre[i], "flushed receive %d came back as %p, posted as %p", i, (void *)d, (void *)x->pre[i]);
        if (d)
            CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, VIP_STATUS_DESC_FLUSHED_ERROR, 0);
    }
    CHECK_STATE(x->vi, VIP_STATE_ERROR);
    CHECK_RET(VipDisconnect(x->vi), VIP_SUCCESS);
    CHECK_STATE(x->vi, VIP_STATE_IDLE);
    /* The same VI connects again. */
    VIP_DESCRIPTOR *r = conn_post_recv(x, 64);
    srv_accept(&x->s, x->vi, x->cfg->disc, 10000);
    chan_send(x->c, T_READY, NULL, 0);
    VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 5000);
    CHECK(d == r);
    if (d) {
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK(d->CS.Length == 5 && memcmp(seg_buf(d, 0), "again", 5) == 0);
    }
    chan_send(x->c, T_DONE, NULL, 0);
}

static void t_disconnect(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.srv_recvs = 3, .cli_recvs = 2, .recv_len = 64, .server = srv_flushed};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    CHECK_RET(VipDisconnect(x->vi), VIP_SUCCESS);
    CHECK_STATE(x->vi, VIP_STATE_IDLE);
    /* Flushed descriptors still on the queue: the VI cannot go yet. */
    CHECK_RET(VipDestroyVi(x->vi), VIP_INVALID_STATE);
    for (int i = 0; i < 2; i++) {
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN r = VipRecvDone(x->vi, &d);
        CHECKF(r == VIP_SUCCESS, "flushed receive %d: VipRecvDone returned %s", i, vip_ret_name(r));
        if (r == VIP_SUCCESS) {
            CHECK(d == x->pre[i]);
            CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, VIP_STATUS_DESC_FLUSHED_ERROR, 0);
        }
    }
    VIP_DESCRIPTOR *d = NULL;
    CHECK_RET(VipRecvDone(x->vi, &d), VIP_NOT_DONE);
    chan_send(x->c, T_GO, NULL, 0);
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES a;
    VIP_BOOLEAN se = 0, re = 0;
    CHECK_RET(VipQueryVi(x->vi, &st, &a, &se, &re), VIP_SUCCESS);
    CHECK_EQ(se, VIP_TRUE);
    CHECK_EQ(re, VIP_TRUE);
    /* Connect the same VI again once the server listens again. */
    {
        VIP_NET_ADDRESS *local = addr_new(x->s.address, pr.cfg.disc);
        VIP_NET_ADDRESS *remote = addr_new(pr.server_address, pr.cfg.disc);
        VIP_VI_ATTRIBUTES ra;
        CHECK_RET(VipConnectRequest(x->vi, local, remote, 10000, &ra), VIP_SUCCESS);
        free(local);
        free(remote);
    }
    CHAN_EXPECT(x->c, 10000, T_READY, NULL, 0);
    VIP_DESCRIPTOR *s = send_desc(&x->s, "again", 5, 0);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    d = SEND_WAIT(x->vi, 5000);
    if (d)
        CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    pair_close(&pr);
}

/* ---- The peer killed ---------------------------------------------------------------------- */

struct err_seen {
    atomic_int calls;
    pthread_t thread;
    VIP_ERROR_DESCRIPTOR e;
};

static void on_error(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    struct err_seen *s = ctx;
    if (atomic_load(&s->calls) == 0 && e) {
        s->e = *e;
        s->thread = pthread_self();
    }
    atomic_fetch_add(&s->calls, 1);
}

static void t_peer_killed(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.cli_recvs = 2, .recv_len = 64};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    static struct err_seen seen;
    REQUIRE_RET(VipErrorCallback(x->s.nic, &seen, on_error), VIP_SUCCESS);
    peer_kill(&pr.p);
    long long t0 = now_ms();
    for (int i = 0; i < 2; i++) {
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN r = VipRecvWait(x->vi, 15000, &d);
        CHECKF(r == VIP_SUCCESS, "receive %d outstanding when the peer was killed: VipRecvWait returned %s after %lld ms",
               i, vip_ret_name(r), now_ms() - t0);
        if (r != VIP_SUCCESS)
            break;
        CHECK(d == x->pre[i]);
        CHECKF((d->CS.Status & VIP_STATUS_DONE) && (d->CS.Status & VIP_STATUS_ERROR_MASK),
               "receive %d completed without an error bit (status 0x%x)", i, (unsigned)d->CS.Status);
    }
    CHECK_STATE(x->vi, VIP_STATE_ERROR);
    long long end = now_ms() + 3000;
    while (atomic_load(&seen.calls) == 0 && now_ms() < end)
        sleep_ms(5);
    CHECKF(atomic_load(&seen.calls) >= 1, "the error handler was not called when the VI went to the Error state");
    if (atomic_load(&seen.calls) >= 1) {
        CHECK_EQ(seen.e.ErrorCode, VIP_ERROR_CONN_LOST);
        CHECK_EQ(seen.e.ResourceCode, VIP_RESOURCE_VI);
        CHECK(seen.e.ViHandle == x->vi);
        CHECK(seen.e.NicHandle == x->s.nic);
        CHECK(!pthread_equal(seen.thread, pthread_self()));
    }
    CHECK_RET(VipPostSend(x->vi, send_desc(&x->s, "x", 1, 0), x->s.mh), VIP_INVALID_STATE);
    CHECK_RET(VipPostRecv(x->vi, recv_desc(&x->s, 8), x->s.mh), VIP_INVALID_STATE);
    CHECK_RET(VipDisconnect(x->vi), VIP_SUCCESS);
    CHECK_STATE(x->vi, VIP_STATE_IDLE);
    CHECK_RET(vi_destroy(&x->s, x->vi), VIP_SUCCESS);
    side_close(&x->s);
}

/* ---- Calls on a VI that is not idle ------------------------------------------------------- */

static void srv_second_request(struct conn *x, void *arg)
{
    (void)arg;
    VIP_NET_ADDRESS *local = addr_new(x->s.address, x->cfg->disc), *remote = addr_room();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    VIP_RETURN r = VipConnectWait(x->s.nic, local, 10000, remote, &ra, &conn);
    CHECK_RET(r, VIP_SUCCESS);
    if (r == VIP_SUCCESS) {
        CHECK_RET(VipConnectAccept(conn, x->vi), VIP_INVALID_STATE);
        VipConnectReject(conn);
    }
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    chan_send(x->c, T_DONE, NULL, 0);
}

static void t_not_idle(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.server = srv_second_request};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_NET_ADDRESS *local = addr_new(x->s.address, pr.cfg.disc), *remote = addr_new(pr.server_address, pr.cfg.disc);
    VIP_VI_ATTRIBUTES ra, a = vi_attrs(&x->s, default_level());
    CHECK_RET(VipConnectRequest(x->vi, local, remote, 2000, &ra), VIP_INVALID_STATE);
    CHECK_RET(VipSetViAttributes(x->vi, &a), VIP_INVALID_STATE);
    CHECK_RET(VipDestroyVi(x->vi), VIP_INVALID_STATE);
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    /* A second VI (of another NIC where the device opens twice: two
     * connections between one pair of NICs are another test's) asks the
     * server, which tries to accept it with the connected VI. */
    struct side s2;
    VIP_NIC_HANDLE probe = NULL;
    struct side *sv = &x->s;
    if (VipOpenNic(g_device, &probe) == VIP_SUCCESS) {
        VipCloseNic(probe);
        side_open(&s2, NULL);
        sv = &s2;
    }
    VIP_VI_HANDLE v2 = vi_new(sv, default_level(), 0, 0, NULL, NULL);
    VIP_NET_ADDRESS *local2 = addr_new(sv->address, pr.cfg.disc);
    CHECK_RET(VipConnectRequest(v2, local2, remote, 10000, &ra), VIP_REJECT);
    CHECK_STATE(v2, VIP_STATE_IDLE);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    CHECK_RET(vi_destroy(sv, v2), VIP_SUCCESS);
    if (sv != &x->s)
        side_close(sv);
    pair_close(&pr);
}

/* ---- Reliability levels that differ ---------------------------------------------------------- */

static void srv_level(struct chan *c, void *arg)
{
    struct cm_arg *a = arg;
    VIP_RELIABILITY_LEVEL lv[3];
    claimed_levels(lv);
    struct side s;
    side_open_peer(&s);
    send_addr(c, &s);
    VIP_VI_HANDLE vi = vi_new(&s, lv[0], 0, 0, NULL, NULL);
    VIP_NET_ADDRESS *local = addr_new(s.address, a->disc), *remote = addr_room();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    REQUIRE_RET(VipConnectWait(s.nic, local, 10000, remote, &ra, &conn), VIP_SUCCESS);
    CHECK_EQ(ra.ReliabilityLevel, lv[1]);
    CHECK_RET(VipConnectAccept(conn, vi), VIP_INVALID_RELIABILITY_LEVEL);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    linger(c, NULL);
    side_close(&s);
}

static void t_level_mismatch(int arg)
{
    (void)arg;
    VIP_RELIABILITY_LEVEL lv[3];
    if (claimed_levels(lv) < 2)
        h_skip("the NIC claims one reliability level (0x%x)", (unsigned)g_nic.ReliabilityLevelSupport);
    new_arg();
    struct peer p;
    peer_start(&p, srv_level, &A);
    struct side s;
    side_open(&s, NULL);
    char host[HOST_TEXT];
    recv_addr(&p.c, host);
    VIP_VI_HANDLE vi = vi_new(&s, lv[1], 0, 0, NULL, NULL);
    VIP_NET_ADDRESS *local = addr_new(s.address, A.disc), *remote = addr_new(host, A.disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_RET(VipConnectRequest(vi, local, remote, 10000, &ra), VIP_INVALID_RELIABILITY_LEVEL);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end(&p, 15000);
    side_close(&s);
}

/* ---- Bad addresses ---------------------------------------------------------------------------- */

static void t_bad_addresses(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    char disc[33];
    disc_new(disc);
    char longdisc[34];
    memset(longdisc, 'd', 33);
    longdisc[33] = 0;
    VIP_NET_ADDRESS *ok = addr_new(s.address, disc), *room = addr_room();
    VIP_NET_ADDRESS *toolong = addr_new(s.address, longdisc);
    /* Host addresses of lengths no NIC's addresses have: the text form of
     * old (48 bytes), one byte short of M-VIA's 6, the largest plus one. */
    char x48[48];
    memset(x48, 'x', sizeof x48);
    VIP_NET_ADDRESS *text48 = addr_raw(x48, sizeof x48, disc, strlen(disc));
    VIP_NET_ADDRESS *short5 = addr_raw(x48, 5, disc, strlen(disc));
    VIP_NET_ADDRESS *long19 = addr_raw(x48, VIPL_HOST_ADDRESS_LEN + 1, disc, strlen(disc));
    VIP_NET_ADDRESS *wrong[] = {text48, short5, long19};
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    CHECK_RET(VipConnectWait(s.nic, toolong, 100, room, &ra, &conn), VIP_INVALID_PARAMETER);
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        CHECK_RET(VipConnectWait(s.nic, wrong[i], 100, room, &ra, &conn), VIP_INVALID_PARAMETER);
        CHECK_RET(VipConnectRequest(vi, ok, wrong[i], 100, &ra), VIP_INVALID_PARAMETER);
        /* The local address of a request is checked as a wait's. */
        CHECK_RET(VipConnectRequest(vi, wrong[i], ok, 100, &ra), VIP_INVALID_PARAMETER);
    }
    CHECK_RET(VipConnectRequest(vi, toolong, ok, 100, &ra), VIP_INVALID_PARAMETER);
    CHECK_RET(VipConnectWait(s.nic, NULL, 100, room, &ra, &conn), VIP_INVALID_PARAMETER);
    CHECK_RET(VipConnectWait(s.nic, ok, 100, room, &ra, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipConnectWait(NULL, ok, 100, room, &ra, &conn), VIP_INVALID_PARAMETER);
    CHECK_RET(VipConnectRequest(vi, ok, toolong, 100, &ra), VIP_INVALID_PARAMETER);
    CHECK_RET(VipConnectRequest(vi, ok, NULL, 100, &ra), VIP_INVALID_PARAMETER);
    CHECK_RET(VipConnectRequest(NULL, ok, ok, 100, &ra), VIP_INVALID_PARAMETER);
    CHECK_RET(VipConnectAccept(NULL, vi), VIP_INVALID_PARAMETER);
    CHECK_RET(VipConnectReject(NULL), VIP_INVALID_PARAMETER);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    /* On shm, 6 bytes that are no instance name. */
    if (strcmp(g_provider, "shm") == 0) {
        VIP_NET_ADDRESS *slash = addr_raw("a/b\0\0\0", 6, disc, strlen(disc));
        CHECK_RET(VipConnectRequest(vi, ok, slash, 100, &ra), VIP_INVALID_PARAMETER);
        free(slash);
    }
    CHECK_STATE(vi, VIP_STATE_IDLE);
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++)
        free(wrong[i]);
    side_close(&s);
}

/* ---- Two connections between the same two NICs -------------------------------------------- */

static void srv_two(struct chan *c, void *arg)
{
    struct cm_arg *a = arg;
    struct side s;
    side_open_peer(&s);
    send_addr(c, &s);
    VIP_VI_HANDLE vi[2];
    VIP_DESCRIPTOR *r[2];
    for (int i = 0; i < 2; i++) {
        vi[i] = vi_new(&s, default_level(), 0, 0, NULL, NULL);
        r[i] = recv_desc(&s, 64);
        REQUIRE_RET(VipPostRecv(vi[i], r[i], s.mh), VIP_SUCCESS);
    }
    for (int i = 0; i < 2; i++) {
        VIP_NET_ADDRESS *local = addr_new(s.address, a->disc), *remote = addr_room();
        VIP_VI_ATTRIBUTES ra;
        VIP_CONN_HANDLE conn = NULL;
        VIP_RETURN ret = VipConnectWait(s.nic, local, 10000, remote, &ra, &conn);
        CHECKF(ret == VIP_SUCCESS, "VipConnectWait for connection %d: %s", i, vip_ret_name(ret));
        if (ret != VIP_SUCCESS)
            h_finish();
        CHECK_RET(VipConnectAccept(conn, vi[i]), VIP_SUCCESS);
    }
    for (int i = 0; i < 2; i++) {
        VIP_DESCRIPTOR *d = RECV_WAIT(vi[i], 5000);
        CHECK(d == r[i]);
        if (d)
            CHECK(d->CS.Length == 1 && *(char *)seg_buf(d, 0) == (char)('a' + i));
        char m = (char)('A' + i);
        CHECK_RET(VipPostSend(vi[i], send_desc(&s, &m, 1, 0), s.mh), VIP_SUCCESS);
    }
    for (int i = 0; i < 2; i++)
        SEND_WAIT(vi[i], 5000);
    chan_send(c, T_DONE, NULL, 0);
    if (chan_recv_pump(c, vi[0], 15000, NULL, 0) == T_QUIT)
        for (int i = 0; i < 2; i++)
            VipDisconnect(vi[i]);
    side_close(&s);
}

static void t_two_connections(int arg)
{
    (void)arg;
    new_arg();
    struct peer p;
    peer_start(&p, srv_two, &A);
    struct side s;
    side_open(&s, NULL);
    char host[HOST_TEXT];
    recv_addr(&p.c, host);
    VIP_VI_HANDLE vi[2];
    VIP_DESCRIPTOR *r[2];
    for (int i = 0; i < 2; i++) {
        vi[i] = vi_new(&s, default_level(), 0, 0, NULL, NULL);
        r[i] = recv_desc(&s, 64);
        REQUIRE_RET(VipPostRecv(vi[i], r[i], s.mh), VIP_SUCCESS);
        VIP_NET_ADDRESS *local = addr_new(s.address, A.disc), *remote = addr_new(host, A.disc);
        VIP_VI_ATTRIBUTES ra;
        VIP_RETURN ret = VipConnectRequest(vi[i], local, remote, 10000, &ra);
        CHECKF(ret == VIP_SUCCESS, "connection %d between the same two NICs: VipConnectRequest returned %s", i,
               vip_ret_name(ret));
        if (ret != VIP_SUCCESS)
            h_finish();
    }
    for (int i = 0; i < 2; i++) {
        char m = (char)('a' + i);
        CHECK_RET(VipPostSend(vi[i], send_desc(&s, &m, 1, 0), s.mh), VIP_SUCCESS);
    }
    for (int i = 0; i < 2; i++) {
        SEND_WAIT(vi[i], 5000);
        VIP_DESCRIPTOR *d = RECV_WAIT(vi[i], 5000);
        CHECK(d == r[i]);
        if (d)
            CHECK(d->CS.Length == 1 && *(char *)seg_buf(d, 0) == (char)('A' + i));
    }
    int tag = -1;
    for (long long end = now_ms() + 10000; tag < 0 && now_ms() < end;) {
        tag = chan_recv(&p.c, 1, NULL, 0, NULL);
        for (int i = 0; i < 2; i++) {
            VIP_DESCRIPTOR *none = NULL;
            VipSendDone(vi[i], &none);
        }
    }
    CHECK_EQ(tag, T_DONE);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end_pumping(&p, vi[0], 15000);
    side_close(&s);
}

/* ---- Peer to peer ---------------------------------------------------------------------------- */

struct p2p {
    char mine[33], theirs[33];
};

static void p2p_side(struct chan *c, const char *my_disc, const char *their_disc, int use_wait)
{
    struct side s;
    side_open(&s, h_is_peer() ? g_peer_device : NULL);
    send_addr(c, &s);
    char host[HOST_TEXT];
    recv_addr(c, host);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_DESCRIPTOR *r = recv_desc(&s, 64);
    REQUIRE_RET(VipPostRecv(vi, r, s.mh), VIP_SUCCESS);
    VIP_VI_ATTRIBUTES ra;
    memset(&ra, 0, sizeof ra);
    CHECK_RET(VipConnectPeerDone(vi, &ra), VIP_INVALID_STATE);
    VIP_NET_ADDRESS *local = addr_new(s.address, my_disc), *remote = addr_new(host, their_disc);
    long long t0 = now_ms();
    CHECK_RET(VipConnectPeerRequest(vi, local, remote, 10000), VIP_SUCCESS);
    CHECKF(now_ms() - t0 < 1000, "VipConnectPeerRequest took %lld ms; it returns at once", now_ms() - t0);
    if (use_wait) {
        CHECK_RET(VipConnectPeerWait(vi, &ra), VIP_SUCCESS);
    } else {
        VIP_RETURN ret;
        long long end = now_ms() + 10000;
        while ((ret = VipConnectPeerDone(vi, &ra)) == VIP_NOT_DONE && now_ms() < end)
            sleep_ms(1);
        CHECK_RET(ret, VIP_SUCCESS);
    }
    CHECK_EQ(ra.ReliabilityLevel, default_level());
    CHECK_STATE(vi, VIP_STATE_CONNECTED);
    /* Both have posted a receive before connecting: send one message each way. */
    VIP_DESCRIPTOR *sd = send_desc(&s, my_disc, (uint32_t)strlen(my_disc), 0);
    CHECK_RET(VipPostSend(vi, sd, s.mh), VIP_SUCCESS);
    VIP_DESCRIPTOR *d = RECV_WAIT(vi, 5000);
    CHECK(d == r);
    if (d) {
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK(d->CS.Length == strlen(their_disc) && memcmp(seg_buf(d, 0), their_disc, strlen(their_disc)) == 0);
    }
    d = SEND_WAIT(vi, 5000);
    if (d)
        CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
    /* Neither leaves before the other has its message. */
    chan_send(c, T_DONE, NULL, 0);
    int tag = chan_recv_pump(c, vi, 10000, NULL, 0);
    CHECK_EQ(tag, T_DONE);
    VipDisconnect(vi);
    side_close(&s);
}

static struct p2p P;

static void p2p_peer(struct chan *c, void *arg)
{
    (void)arg;
    p2p_side(c, P.theirs, P.mine, 1);
}

static void t_peer_to_peer(int arg)
{
    (void)arg;
    if (!is_network()) {
        struct side s;
        side_open(&s, NULL);
        VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
        char disc[33];
        disc_new(disc);
        VIP_NET_ADDRESS *a = addr_new(s.address, disc);
        CHECK_RET(VipConnectPeerRequest(vi, a, a, 1000), VIP_ERROR_NOT_SUPPORTED);
        CHECK_STATE(vi, VIP_STATE_IDLE);
        side_close(&s);
        return;
    }
    disc_new(P.mine);
    disc_new(P.theirs);
    struct peer p;
    peer_start(&p, p2p_peer, NULL);
    p2p_side(&p.c, P.mine, P.theirs, 0);
    peer_end(&p, 15000);
}

/* ---- An address in a 40-byte buffer ------------------------------------------------------- */

/* A peer as a VIA-era library keeps one: its VIP_NET_ADDRESS (host, then
 * discriminator) in 40 bytes sized for M-VIA's 6-byte MAC, and the VI
 * right after it. */
struct old_peer {
    unsigned char addr[40];
    VIP_VI_HANDLE vi;
};

static void srv_forty(struct chan *c, void *arg)
{
    struct cm_arg *a = arg;
    struct side s;
    side_open_peer(&s);
    send_addr(c, &s);
    struct old_peer pe;
    memset(pe.addr, 0, sizeof pe.addr);
    pe.vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_VI_HANDLE sentinel = pe.vi;
    VIP_DESCRIPTOR *r = recv_desc(&s, 64);
    REQUIRE_RET(VipPostRecv(pe.vi, r, s.mh), VIP_SUCCESS);
    VIP_NET_ADDRESS *local = addr_new(s.address, a->disc);
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    /* The client's address goes straight into the 40 bytes. */
    REQUIRE_RET(VipConnectWait(s.nic, local, 10000, (VIP_NET_ADDRESS *)pe.addr, &ra, &conn), VIP_SUCCESS);
    CHECKF(pe.vi == sentinel, "VipConnectWait wrote past the 40-byte address into the VI handle after it");
    CHECK_EQ(((VIP_NET_ADDRESS *)pe.addr)->HostAddressLen, s.attrs.NicAddressLen);
    REQUIRE_RET(VipConnectAccept(conn, pe.vi), VIP_SUCCESS);
    VIP_DESCRIPTOR *d = RECV_WAIT(pe.vi, 5000);
    if (d)
        CHECK(d->CS.Length == 5 && memcmp(seg_buf(d, 0), "forty", 5) == 0);
    free(local);
    linger(c, pe.vi);
    side_close(&s);
}

static void t_forty_bytes(int arg)
{
    (void)arg;
    new_arg();
    struct peer p;
    peer_start(&p, srv_forty, &A);
    struct side s;
    side_open(&s, NULL);
    if (s.attrs.NicAddressLen > 6)
        h_skip("the NIC's host addresses are %u bytes (udp over IPv6), more than M-VIA's 6",
               (unsigned)s.attrs.NicAddressLen);
    char host[HOST_TEXT], shown[64], text[256], path[256];
    recv_addr(&p.c, host);
    host_display(host, shown, sizeof shown);
    snprintf(text, sizeof text, "server %s %s\n", g_provider, shown);
    write_temp(text, path);
    REQUIRE_RET(VipNSInit(s.nic, path), VIP_SUCCESS);
    struct old_peer pe;
    memset(pe.addr, 0, sizeof pe.addr);
    pe.vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_VI_HANDLE sentinel = pe.vi;
    /* The name service writes the host into the 40 bytes; the program adds
     * the discriminator after it, as oldvia.c does. */
    VIP_NET_ADDRESS *remote = (VIP_NET_ADDRESS *)pe.addr;
    REQUIRE_RET(VipNSGetHostByName(s.nic, "server", remote, 0), VIP_SUCCESS);
    CHECKF(pe.vi == sentinel, "VipNSGetHostByName wrote past the 40-byte address into the VI handle after it");
    size_t dl = strlen(A.disc);
    REQUIRE(sizeof(VIP_NET_ADDRESS) - 1 + remote->HostAddressLen + dl <= sizeof pe.addr);
    remote->DiscriminatorLen = (VIP_UINT16)dl;
    memcpy(remote->HostAddress + remote->HostAddressLen, A.disc, dl);
    VIP_NET_ADDRESS *local = addr_new(s.address, A.disc);
    VIP_VI_ATTRIBUTES ra;
    CHECK_RET(VipConnectRequest(pe.vi, local, remote, 10000, &ra), VIP_SUCCESS);
    CHECKF(pe.vi == sentinel, "the VI handle after the 40-byte address changed");
    CHECK_STATE(pe.vi, VIP_STATE_CONNECTED);
    VIP_DESCRIPTOR *d = send_desc(&s, "forty", 5, 0);
    CHECK_RET(VipPostSend(pe.vi, d, s.mh), VIP_SUCCESS);
    SEND_WAIT(pe.vi, 5000);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end_pumping(&p, pe.vi, 15000);
    VipDisconnect(pe.vi);
    free(local);
    side_close(&s);
}

/* ---- A request that nothing answers ------------------------------------------------------- */

/* Runs VipConnectRequest with stderr going to a file; returns its code and
 * what was written (at most n - 1 bytes). */
static VIP_RETURN request_captured(VIP_VI_HANDLE vi, VIP_NET_ADDRESS *local, VIP_NET_ADDRESS *remote, int ms,
                                   char *out, size_t n)
{
    VIP_VI_ATTRIBUTES ra;
    struct capture c;
    capture_start(&c);
    VIP_RETURN r = VipConnectRequest(vi, local, remote, (VIP_ULONG)ms, &ra);
    capture_end(&c);
    snprintf(out, n, "%s", c.buf);
    return r;
}

static void t_unanswered(int arg)
{
    (void)arg;
    if (strcmp(g_provider, "shm") == 0)
        h_skip("on shm a request that finds no listener is VIP_NO_MATCH at once (cm/no_listener)");
    struct side s;
    side_open(&s, NULL);
    char disc[33], hex[HOST_TEXT], shown[64], err[1024];
    disc_new(disc);
    /* Somewhere that takes datagrams and never answers: a plain UDP
     * socket of this test on the NIC's IP address; on xdp an Ethernet
     * address nobody has. */
    int sock = -1;
    if (strcmp(g_provider, "udp") == 0) {
        if (s.attrs.NicAddressLen != 6)
            h_skip("the NIC is on IPv6; the test makes an IPv4 socket");
        struct sockaddr_in sa = {.sin_family = AF_INET};
        memcpy(&sa.sin_addr, s.attrs.LocalNicAddress, 4);
        socklen_t sl = sizeof sa;
        sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        REQUIRE(sock >= 0 && bind(sock, (struct sockaddr *)&sa, sizeof sa) == 0);
        REQUIRE(getsockname(sock, (struct sockaddr *)&sa, &sl) == 0);
        unsigned char b[6];
        memcpy(b, &sa.sin_addr, 4);
        memcpy(b + 4, &sa.sin_port, 2);
        host_hex(b, 6, hex);
    } else {
        host_expect("02:00:00:00:00:77", hex);
    }
    host_display(hex, shown, sizeof shown);
    VIP_NET_ADDRESS *local = addr_new(s.address, disc), *remote = addr_new(hex, disc);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_RETURN r = request_captured(vi, local, remote, 500, err, sizeof err);
    CHECK_EQ(r, VIP_TIMEOUT);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    /* One line, naming the address tried and the discriminator. */
    char *nl = strchr(err, '\n');
    CHECKF(nl && nl[1] == 0, "expected one line on stderr, got \"%s\"", err);
    char want[128];
    snprintf(want, sizeof want, "no listener answered at %s", shown);
    CHECKF(strstr(err, want) != NULL, "stderr \"%s\" does not say \"%s\"", err, want);
    CHECKF(strstr(err, disc) != NULL, "stderr \"%s\" does not name the discriminator %s", err, disc);
    if (sock >= 0)
        close(sock);
    free(local);
    free(remote);
    side_close(&s);
}

/* ---- Two processes on one device --------------------------------------------------------- */

struct shared_srv {
    const char *device;
    char disc[33];
    char tag;
};

static struct shared_srv SH[2];
static char shared_device[64];

/* A server process on the device: sends its NIC address, accepts one client
 * on its discriminator and answers the client's byte with its own tag. */
static void srv_shared(struct chan *c, void *arg)
{
    struct shared_srv *a = arg;
    struct side s;
    side_open(&s, a->device);
    send_addr(c, &s);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_DESCRIPTOR *r = recv_desc(&s, 64);
    REQUIRE_RET(VipPostRecv(vi, r, s.mh), VIP_SUCCESS);
    srv_accept(&s, vi, a->disc, 10000);
    VIP_DESCRIPTOR *d = RECV_WAIT(vi, 5000);
    CHECK(d == r);
    if (d)
        CHECKF(d->CS.Length == 1 && *(char *)seg_buf(d, 0) == a->tag - 'A' + 'a',
               "server %c heard another client's message", a->tag);
    CHECK_RET(VipPostSend(vi, send_desc(&s, &a->tag, 1, 0), s.mh), VIP_SUCCESS);
    SEND_WAIT(vi, 5000);
    linger(c, vi);
    side_close(&s);
}

/* A plain UDP socket on a free loopback port, and the udp device name of
 * that port in `out`. */
static int loopback_udp_socket(char out[64])
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    snprintf(out, 64, "udp:127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    return fd;
}

/* A loopback udp device name on a port free when chosen. */
static void free_udp_device(char out[64])
{
    close(loopback_udp_socket(out));
}

/* Two server processes open one device (M-VIA's one device per host) and
 * wait on different discriminators; a client reaches each through the one
 * host address. On udp, a port another program holds is not opened. */
static void t_shared_device(int arg)
{
    (void)arg;
    if (strcmp(g_provider, "xdp") == 0)
        h_skip("an xdp queue has one AF_XDP socket: a second open of it fails (docs/VIPL.md)");
    if (strcmp(g_provider, "udp") == 0)
        free_udp_device(shared_device);
    else
        snprintf(shared_device, sizeof shared_device, "%s", g_device);
    struct peer p[2];
    char host[2][HOST_TEXT];
    for (int i = 0; i < 2; i++) {
        SH[i].device = shared_device;
        disc_new(SH[i].disc);
        SH[i].tag = (char)('A' + i);
        /* The second opens the device once the first has it. */
        peer_start(&p[i], srv_shared, &SH[i]);
        recv_addr(&p[i].c, host[i]);
    }
    CHECKF(strcmp(host[0], host[1]) == 0, "both processes' NIC address is the device's: \"%s\", \"%s\"",
           host[0], host[1]);
    struct side s;
    side_open(&s, NULL);
    VIP_VI_HANDLE vi[2];
    VIP_DESCRIPTOR *r[2];
    /* The second server first: it may not listen yet, and is asked again. */
    for (int i = 1; i >= 0; i--) {
        vi[i] = vi_new(&s, default_level(), 0, 0, NULL, NULL);
        r[i] = recv_desc(&s, 64);
        REQUIRE_RET(VipPostRecv(vi[i], r[i], s.mh), VIP_SUCCESS);
        cli_connect(&s, vi[i], host[0], SH[i].disc, 10000);
        char m = (char)('a' + i);
        CHECK_RET(VipPostSend(vi[i], send_desc(&s, &m, 1, 0), s.mh), VIP_SUCCESS);
        SEND_WAIT(vi[i], 5000);
        VIP_DESCRIPTOR *d = RECV_WAIT(vi[i], 5000);
        CHECK(d == r[i]);
        if (d)
            CHECKF(d->CS.Length == 1 && *(char *)seg_buf(d, 0) == SH[i].tag,
                   "connection %d reached the server of another discriminator", i);
    }
    for (int i = 0; i < 2; i++) {
        chan_send(&p[i].c, T_QUIT, NULL, 0);
        peer_end_pumping(&p[i], vi[i], 15000);
    }
    side_close(&s);
    if (strcmp(g_provider, "udp") != 0)
        return;
    /* A port another program holds is not a device: the open fails. */
    char held[64];
    int fd = loopback_udp_socket(held);
    VIP_NIC_HANDLE nic = NULL;
    CHECK_RET(VipOpenNic(held, &nic), VIP_ERROR_RESOURCE);
    CHECK(nic == NULL);
    close(fd);
}

const struct test cm_tests[] = {
    {"cm", "accept_addresses_attributes", t_accept, 0, 0},
    {"cm", "reject", t_reject, 0, 0},
    {"cm", "no_listener", t_no_match, 0, 0},
    {"cm", "timeouts", t_timeouts, 0, 0},
    {"cm", "disconnect_flushes_and_reconnect", t_disconnect, 0, 0},
    {"cm", "peer_killed", t_peer_killed, 0, 40},
    {"cm", "calls_on_connected_vi", t_not_idle, 0, 0},
    {"cm", "two_connections_same_nics", t_two_connections, 0, 0},
    {"cm", "reliability_level_mismatch", t_level_mismatch, 0, 0},
    {"cm", "bad_addresses", t_bad_addresses, 0, 0},
    {"cm", "peer_to_peer", t_peer_to_peer, 0, 0},
    {"cm", "address_in_40_byte_buffer", t_forty_bytes, 0, 0},
    {"cm", "unanswered_request_says_where", t_unanswered, 0, 0},
    {"cm", "two_processes_share_a_device", t_shared_device, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
