/*
 * Reliability levels, each the NIC claims (VIA 1.0, "connection broken on
 * error": no for Unreliable, yes for Reliable Delivery and Reliable
 * Reception):
 *  - a message that finds no receive descriptor posted breaks a reliable
 *    connection (both VIs end in VIP_STATE_ERROR, outstanding descriptors
 *    complete with an error) and leaves an unreliable one connected;
 *  - a receive too small for the message completes with
 *    VIP_STATUS_LENGTH_ERROR, and breaks a reliable connection only;
 *  - a reliable send completes while the receiving program is busy
 *    elsewhere (the NIC, not the program, acknowledges), and a peer that
 *    makes no call for a while keeps its connection.
 * In-order, exactly-once delivery is the data area's stream test.
 *
 * uvia's shm provider differs on the first point, as docs/VIPL.md says: a
 * message that finds no receive descriptor waits in the ring until one is
 * posted, at every level (nothing is lost, nothing breaks); that is what is
 * tested there.
 */
#include "common.h"

#include <stdio.h>
#include <string.h>

static int reliable(VIP_RELIABILITY_LEVEL l)
{
    return l != VIP_SERVICE_UNRELIABLE;
}

/* ---- A message with no receive descriptor posted ----------------------------------- */

static void srv_no_descriptor(struct conn *x, void *arg)
{
    (void)arg;
    VIP_RELIABILITY_LEVEL level = x->cfg->level;
    /* The message is on its way; let it find no descriptor. */
    if (chan_recv_pump(x->c, x->vi, 10000, NULL, 0) != T_GO)
        return;
    if (reliable(level)) {
        int st = wait_state(x->vi, VIP_STATE_ERROR, 3000, 1);
        CHECKF(st == VIP_STATE_ERROR,
               "%s: a message that found no receive descriptor left the receiver's VI in %s, expected "
               "VIP_STATE_ERROR",
               level_name(level), st < 0 ? "(query failed)" : state_name((VIP_VI_STATE)st));
        CHECK_RET(VipPostRecv(x->vi, recv_desc(&x->s, 64), x->s.mh), VIP_INVALID_STATE);
        chan_send(x->c, T_DONE, NULL, 0);
        return;
    }
    pump(x->vi, 500);
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    VIP_DESCRIPTOR *d = conn_post_recv(x, 64);
    chan_send(x->c, T_READY, NULL, 0);
    VIP_DESCRIPTOR *got = RECV_WAIT(x->vi, 5000);
    CHECK(got == d);
    if (got) {
        CHECK_STATUS(got, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(got->CS.Length, 8);
    }
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    chan_send(x->c, T_DONE, NULL, 0);
}

/* shm holds the message until a receive is posted (docs/VIPL.md). */
static int holds_messages(void)
{
    return strcmp(g_provider, "shm") == 0;
}

static void srv_held(struct conn *x, void *arg)
{
    (void)arg;
    if (chan_recv_pump(x->c, x->vi, 10000, NULL, 0) != T_GO)
        return;
    pump(x->vi, 300);
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    VIP_DESCRIPTOR *d = conn_post_recv(x, 64);
    VIP_DESCRIPTOR *got = RECV_WAIT(x->vi, 5000);
    CHECK(got == d);
    if (got) {
        CHECK_STATUS(got, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(got->CS.Length, 8);
        CHECKF(memcmp(seg_buf(got, 0), "first!!!", 8) == 0, "the held message arrived changed");
    }
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    chan_send(x->c, T_DONE, NULL, 0);
}

static void t_no_descriptor_held(int level)
{
    struct pair pr;
    struct pair_cfg cfg = {.level = (VIP_RELIABILITY_LEVEL)level, .cli_recvs = 1, .server = srv_held};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *s = send_desc(&x->s, "first!!!", 8, 0);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    chan_send(x->c, T_GO, NULL, 0);
    VIP_DESCRIPTOR *d = SEND_WAIT(x->vi, 5000);
    CHECK(d == s);
    if (d)
        CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    pair_close(&pr);
}

static void t_no_descriptor(int level)
{
    require_level((VIP_RELIABILITY_LEVEL)level);
    if (holds_messages() && reliable((VIP_RELIABILITY_LEVEL)level)) {
        t_no_descriptor_held(level);
        return;
    }
    struct pair pr;
    struct pair_cfg cfg = {.level = (VIP_RELIABILITY_LEVEL)level, .cli_recvs = 1, .server = srv_no_descriptor};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *s = send_desc(&x->s, "first!!!", 8, 0);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    chan_send(x->c, T_GO, NULL, 0);
    if (reliable((VIP_RELIABILITY_LEVEL)level)) {
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN r = VipSendWait(x->vi, 5000, &d);
        CHECKF(r == VIP_SUCCESS, "the send's completion: %s", vip_ret_name(r));
        if (r == VIP_SUCCESS && level == VIP_SERVICE_RELIABLE_RECEPTION)
            CHECKF(d->CS.Status & VIP_STATUS_ERROR_MASK,
                   "reliable reception: the send that found no receive descriptor completed without an error "
                   "(status 0x%x)",
                   (unsigned)d->CS.Status);
        /* The connection is broken: the receive posted here completes in error. */
        d = NULL;
        r = VipRecvWait(x->vi, 5000, &d);
        CHECKF(r == VIP_SUCCESS, "the receive posted before the break: VipRecvWait returned %s", vip_ret_name(r));
        if (r == VIP_SUCCESS) {
            CHECK(d == x->pre[0]);
            CHECKF((d->CS.Status & VIP_STATUS_DONE) && (d->CS.Status & VIP_STATUS_ERROR_MASK),
                   "the receive completed without an error after the connection broke (status 0x%x)",
                   (unsigned)d->CS.Status);
        }
        CHECK_STATE(x->vi, VIP_STATE_ERROR);
        CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    } else {
        VIP_DESCRIPTOR *d = SEND_WAIT(x->vi, 5000);
        if (d)
            CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
        if (CHAN_EXPECT(x->c, 10000, T_READY, NULL, 0) == 0) {
            s = send_desc(&x->s, "second!!", 8, 0);
            CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
            d = SEND_WAIT(x->vi, 5000);
            if (d)
                CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
            CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
        }
        CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    }
    pair_close(&pr);
}

/* ---- A receive too small for the message ---------------------------------------------- */

static void prep_small(struct conn *x, void *arg)
{
    (void)arg;
    conn_post_recv(x, 16);
}

static void srv_small(struct conn *x, void *arg)
{
    (void)arg;
    VIP_RELIABILITY_LEVEL level = x->cfg->level;
    VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 5000);
    CHECK(d == x->pre[0]);
    if (d)
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, VIP_STATUS_LENGTH_ERROR, 0);
    if (reliable(level)) {
        int st = wait_state(x->vi, VIP_STATE_ERROR, 3000, 1);
        CHECKF(st == VIP_STATE_ERROR, "%s: after a length error the receiver's VI is %s, expected VIP_STATE_ERROR",
               level_name(level), st < 0 ? "(query failed)" : state_name((VIP_VI_STATE)st));
        chan_send(x->c, T_DONE, NULL, 0);
        return;
    }
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    VIP_DESCRIPTOR *next = conn_post_recv(x, 64);
    chan_send(x->c, T_READY, NULL, 0);
    d = RECV_WAIT(x->vi, 5000);
    CHECK(d == next);
    if (d) {
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(d->CS.Length, 8);
    }
    chan_send(x->c, T_DONE, NULL, 0);
}

static void t_too_small(int level)
{
    require_level((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct pair_cfg cfg = {.level = (VIP_RELIABILITY_LEVEL)level, .cli_recvs = 1, .prepare = prep_small,
                           .server = srv_small};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *s = send_desc(&x->s, NULL, 64, 3);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    VIP_DESCRIPTOR *d = NULL;
    VIP_RETURN r = VipSendWait(x->vi, 5000, &d);
    CHECKF(r == VIP_SUCCESS, "the send's completion: %s", vip_ret_name(r));
    if (reliable((VIP_RELIABILITY_LEVEL)level)) {
        if (r == VIP_SUCCESS && level == VIP_SERVICE_RELIABLE_RECEPTION)
            CHECKF(d->CS.Status & VIP_STATUS_ERROR_MASK,
                   "reliable reception: a send whose receive failed completed without an error (status 0x%x)",
                   (unsigned)d->CS.Status);
        d = NULL;
        r = VipRecvWait(x->vi, 5000, &d);
        CHECKF(r == VIP_SUCCESS, "the receive posted before the break: VipRecvWait returned %s", vip_ret_name(r));
        if (r == VIP_SUCCESS)
            CHECKF((d->CS.Status & VIP_STATUS_DONE) && (d->CS.Status & VIP_STATUS_ERROR_MASK),
                   "the receive completed without an error after the connection broke (status 0x%x)",
                   (unsigned)d->CS.Status);
        CHECK_STATE(x->vi, VIP_STATE_ERROR);
        CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    } else {
        if (r == VIP_SUCCESS)
            CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
        if (CHAN_EXPECT(x->c, 10000, T_READY, NULL, 0) == 0) {
            s = send_desc(&x->s, "fits now", 8, 0);
            CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
            d = SEND_WAIT(x->vi, 5000);
            if (d)
                CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
            CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
        }
        CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
        /* The receive posted here is still waiting, untouched. */
        CHECK_EQ(x->pre[0]->CS.Status & VIP_STATUS_DONE, 0);
    }
    pair_close(&pr);
}

/* ---- The receiving program busy elsewhere ---------------------------------------------- */

static void srv_busy(struct conn *x, void *arg)
{
    (void)arg;
    VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 5000);
    if (d)
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
    /* Computing: no call into the library for a while. */
    chan_send(x->c, T_DONE, NULL, 0);
    sleep_ms(3500);
    chan_send(x->c, T_DONE, NULL, 0);
}

static void t_busy_receiver(int level)
{
    require_level((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct pair_cfg cfg = {.level = (VIP_RELIABILITY_LEVEL)level, .srv_recvs = 1, .server = srv_busy};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *s = send_desc(&x->s, NULL, 100, 5);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    /* The data is in the receiver's buffer and its descriptor complete:
     * the send completes, without the receiver making another call. */
    VIP_DESCRIPTOR *d = NULL;
    long long t0 = now_ms();
    VIP_RETURN r = VipSendWait(x->vi, 3000, &d);
    CHECKF(r == VIP_SUCCESS,
           "%s: the send whose data the receiver took did not complete while the receiver made no calls: "
           "VipSendWait returned %s after %lld ms",
           level_name((VIP_RELIABILITY_LEVEL)level), vip_ret_name(r), now_ms() - t0);
    if (r == VIP_SUCCESS)
        CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    /* Whatever became of it, the send is taken before the pair closes. */
    if (r != VIP_SUCCESS)
        VipSendWait(x->vi, 8000, &d);
    pair_close(&pr);
}

static void srv_idle(struct conn *x, void *arg)
{
    (void)arg;
    /* No call into the library for 7 s, then a message. */
    sleep_ms(7000);
    VIP_DESCRIPTOR *s = send_desc(&x->s, "awake", 5, 0);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    VIP_DESCRIPTOR *d = SEND_WAIT(x->vi, 5000);
    if (d)
        CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
}

static void t_idle_peer(int level)
{
    require_level((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct pair_cfg cfg = {.level = (VIP_RELIABILITY_LEVEL)level, .cli_recvs = 1, .server = srv_idle};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *d = NULL;
    VIP_RETURN r = VipRecvWait(x->vi, 12000, &d);
    CHECKF(r == VIP_SUCCESS, "waiting for the message of a peer that was idle for 7 s: %s", vip_ret_name(r));
    if (r == VIP_SUCCESS) {
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(d->CS.Length, 5);
    }
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    pair_close(&pr);
}

#define L_UNREL VIP_SERVICE_UNRELIABLE
#define L_RD VIP_SERVICE_RELIABLE_DELIVERY
#define L_RR VIP_SERVICE_RELIABLE_RECEPTION

const struct test rel_tests[] = {
    {"reliability", "no_receive_posted/unreliable", t_no_descriptor, L_UNREL, 0},
    {"reliability", "no_receive_posted/reliable_delivery", t_no_descriptor, L_RD, 0},
    {"reliability", "no_receive_posted/reliable_reception", t_no_descriptor, L_RR, 0},
    {"reliability", "receive_too_small/unreliable", t_too_small, L_UNREL, 0},
    {"reliability", "receive_too_small/reliable_delivery", t_too_small, L_RD, 0},
    {"reliability", "receive_too_small/reliable_reception", t_too_small, L_RR, 0},
    {"reliability", "send_completes_while_receiver_busy/reliable_delivery", t_busy_receiver, L_RD, 0},
    {"reliability", "send_completes_while_receiver_busy/reliable_reception", t_busy_receiver, L_RR, 0},
    {"reliability", "idle_peer_keeps_connection/unreliable", t_idle_peer, L_UNREL, 40},
    {"reliability", "idle_peer_keeps_connection/reliable_delivery", t_idle_peer, L_RD, 40},
    {"reliability", "idle_peer_keeps_connection/reliable_reception", t_idle_peer, L_RR, 40},
    {NULL, NULL, NULL, 0, 0},
};
