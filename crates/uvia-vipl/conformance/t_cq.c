/*
 * Completion queues: sizes, resize, destroy rules, waits on a queue bound
 * to a CQ (VIP_INVALID_STATE), several VIs on one CQ with notices in
 * completion order, send and receive queues on one CQ, overflow, blocking
 * waits that a peer in another process wakes (no lost wake-up).
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void t_create_destroy(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_CQ_HANDLE cq = NULL;
    REQUIRE_RET(VipCreateCQ(s.nic, 16, &cq), VIP_SUCCESS);
    CHECK(cq != NULL);
    CHECK_RET(VipDestroyCQ(cq), VIP_SUCCESS);
    CHECK_RET(VipCreateCQ(s.nic, 0, &cq), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCreateCQ(s.nic, s.attrs.MaxCQEntries + 1, &cq), VIP_ERROR_RESOURCE);
    cq = NULL;
    CHECK_RET(VipCreateCQ(s.nic, s.attrs.MaxCQEntries, &cq), VIP_SUCCESS);
    if (cq)
        CHECK_RET(VipDestroyCQ(cq), VIP_SUCCESS);
    CHECK_RET(VipCreateCQ(s.nic, 16, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCreateCQ(NULL, 16, &cq), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDestroyCQ(NULL), VIP_INVALID_PARAMETER);
    side_close(&s);
}

static void t_cq_table_full(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_ULONG max = s.attrs.MaxCQ;
    if (max > 256)
        h_skip("MaxCQ %lu is more than the test fills", max);
    VIP_CQ_HANDLE *cq = calloc(max + 1, sizeof *cq);
    REQUIRE(cq != NULL);
    VIP_ULONG made = 0;
    VIP_RETURN r = VIP_SUCCESS;
    while (made < max && (r = VipCreateCQ(s.nic, 4, &cq[made])) == VIP_SUCCESS)
        made++;
    CHECKF(made == max, "created %lu CQs of MaxCQ %lu; then %s", made, max, vip_ret_name(r));
    CHECK_RET(VipCreateCQ(s.nic, 4, &cq[made]), VIP_ERROR_RESOURCE);
    for (VIP_ULONG i = 0; i < made; i++)
        VipDestroyCQ(cq[i]);
    free(cq);
    side_close(&s);
}

static void t_resize(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_CQ_HANDLE cq = NULL;
    REQUIRE_RET(VipCreateCQ(s.nic, 16, &cq), VIP_SUCCESS);
    CHECK_RET(VipResizeCQ(cq, 32), VIP_SUCCESS);
    CHECK_RET(VipResizeCQ(cq, 1), VIP_SUCCESS);
    CHECK_RET(VipResizeCQ(cq, 0), VIP_INVALID_PARAMETER);
    CHECK_RET(VipResizeCQ(cq, s.attrs.MaxCQEntries + 1), VIP_ERROR_RESOURCE);
    CHECK_RET(VipResizeCQ(cq, s.attrs.MaxCQEntries), VIP_SUCCESS);
    CHECK_RET(VipResizeCQ(NULL, 8), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDestroyCQ(cq), VIP_SUCCESS);
    side_close(&s);
}

static void t_destroy_rules(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_CQ_HANDLE a = NULL, b = NULL;
    REQUIRE_RET(VipCreateCQ(s.nic, 8, &a), VIP_SUCCESS);
    REQUIRE_RET(VipCreateCQ(s.nic, 8, &b), VIP_SUCCESS);
    VIP_VI_HANDLE v1 = vi_new(&s, default_level(), 0, 0, NULL, a);
    VIP_VI_HANDLE v2 = vi_new(&s, default_level(), 0, 0, b, NULL);
    CHECK_RET(VipDestroyCQ(a), VIP_INVALID_STATE);
    CHECK_RET(VipDestroyCQ(b), VIP_INVALID_STATE);
    CHECK_RET(vi_destroy(&s, v1), VIP_SUCCESS);
    CHECK_RET(VipDestroyCQ(a), VIP_SUCCESS);
    CHECK_RET(VipDestroyCQ(b), VIP_INVALID_STATE);
    CHECK_RET(vi_destroy(&s, v2), VIP_SUCCESS);
    CHECK_RET(VipDestroyCQ(b), VIP_SUCCESS);
    side_close(&s);
}

static void t_bound_waits(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_CQ_HANDLE cq = NULL;
    REQUIRE_RET(VipCreateCQ(s.nic, 8, &cq), VIP_SUCCESS);
    VIP_VI_HANDLE rv = vi_new(&s, default_level(), 0, 0, NULL, cq);
    VIP_VI_HANDLE sv = vi_new(&s, default_level(), 0, 0, cq, NULL);
    VIP_DESCRIPTOR *d = NULL;
    REQUIRE_RET(VipPostRecv(rv, recv_desc(&s, 64), s.mh), VIP_SUCCESS);
    CHECK_RET(VipRecvWait(rv, 100, &d), VIP_INVALID_STATE);
    CHECK_RET(VipSendWait(rv, 50, &d), VIP_TIMEOUT);
    CHECK_RET(VipSendWait(sv, 100, &d), VIP_INVALID_STATE);
    CHECK_RET(VipRecvWait(sv, 50, &d), VIP_TIMEOUT);
    /* The done calls stay allowed: they take what a CQ names. */
    CHECK_RET(VipRecvDone(rv, &d), VIP_NOT_DONE);
    CHECK_RET(VipSendDone(sv, &d), VIP_NOT_DONE);
    VIP_VI_HANDLE vi = NULL;
    VIP_BOOLEAN rq = -1;
    CHECK_RET(VipCQDone(cq, &vi, &rq), VIP_NOT_DONE);
    long long t0 = now_ms();
    CHECK_RET(VipCQWait(cq, 200, &vi, &rq), VIP_TIMEOUT);
    long long ms = now_ms() - t0;
    CHECKF(ms >= 190 && ms < 5000, "a 200 ms VipCQWait took %lld ms", ms);
    CHECK_RET(VipCQDone(cq, NULL, &rq), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCQDone(cq, &vi, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCQWait(cq, 10, NULL, &rq), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCQDone(NULL, &vi, &rq), VIP_INVALID_PARAMETER);
    side_close(&s);
}

/* ---- Several VIs on one CQ ------------------------------------------------------------- */

#define NV 3
/* Receives the test posts on each VI: one staged message, then 0..3 in
 * the batch, then 3 for the resize part. */
#define RECVS_PER_VI 7
static const int batch[NV] = {2, 1, 3};

struct several {
    char disc[NV][33];
};

static void srv_several(struct chan *c, void *arg)
{
    struct several *sv = arg;
    /* A NIC for each VI (the test's subject is its own CQ; connections
     * between one pair of NICs are the cm area's), or one for all where
     * the device opens once. */
    static struct side ss[NV];
    struct side *sp[NV];
    side_open_peer(&ss[0]);
    for (int i = 0; i < NV; i++) {
        VIP_NIC_HANDLE probe = NULL;
        if (i > 0 && VipOpenNic(g_peer_device, &probe) == VIP_SUCCESS) {
            VipCloseNic(probe);
            side_open_peer(&ss[i]);
            sp[i] = &ss[i];
        } else {
            sp[i] = &ss[0];
        }
        send_addr(c, sp[i]);
    }
    VIP_VI_HANDLE vi[NV];
    for (int i = 0; i < NV; i++) {
        vi[i] = vi_new(sp[i], default_level(), 0, 0, NULL, NULL);
        /* For the test's sends. */
        REQUIRE_RET(VipPostRecv(vi[i], recv_desc(sp[i], 64), sp[i]->mh), VIP_SUCCESS);
    }
    for (int i = 0; i < NV; i++)
        srv_accept(sp[i], vi[i], sv->disc[i], 10000);
    chan_send(c, T_READY, NULL, 0);
    int sent[NV] = {0, 0, 0}, taken[NV] = {0, 0, 0};
    for (;;) {
        int k[2] = {-1, 0};
        /* Waiting for the test's word, the server keeps its VIs moving and
         * takes its sends as they complete (a provider may move only
         * inside calls: the data area tests that on its own). */
        int tag = -1;
        for (long long end = now_ms() + 15000; tag < 0 && now_ms() < end;) {
            tag = chan_recv(c, 1, k, sizeof k, NULL);
            for (int i = 0; i < NV; i++) {
                VIP_DESCRIPTOR *d = NULL;
                if (VipSendDone(vi[i], &d) == VIP_SUCCESS) {
                    CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
                    taken[i]++;
                }
            }
        }
        if (tag != T_GO)
            break;
        /* Send k[1] messages on VI k[0]. */
        for (int n = 0; n < k[1]; n++) {
            char msg[32];
            snprintf(msg, sizeof msg, "vi %d msg %d", k[0], sent[k[0]]);
            VIP_DESCRIPTOR *d = send_desc(sp[k[0]], msg, (uint32_t)strlen(msg), 0);
            CHECK_RET(VipPostSend(vi[k[0]], d, sp[k[0]]->mh), VIP_SUCCESS);
            sent[k[0]]++;
        }
        h_note("posted %d on VI %d", k[1], k[0]);
        chan_send(c, T_DONE, NULL, 0);
    }
    for (int i = 0; i < NV; i++) {
        for (; taken[i] < sent[i]; taken[i]++) {
            VIP_DESCRIPTOR *d = SEND_WAIT(vi[i], 5000);
            if (d)
                CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
        }
        /* The test sent one message on VIs 1 and 0. */
        if (i < 2) {
            VIP_DESCRIPTOR *d = RECV_WAIT(vi[i], 5000);
            if (d)
                CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        }
    }
    chan_send(c, T_DONE, NULL, 0);
    if (chan_recv(c, 15000, NULL, 0, NULL) == T_QUIT)
        for (int i = 0; i < NV; i++)
            VipDisconnect(vi[i]);
    for (int i = 1; i < NV; i++)
        if (sp[i] != &ss[0])
            side_close(sp[i]);
    side_close(&ss[0]);
}

static void go(struct chan *c, int vi, int n)
{
    int k[2] = {vi, n};
    chan_send(c, T_GO, k, sizeof k);
    CHAN_EXPECT(c, 10000, T_DONE, NULL, 0);
}

static int index_of(VIP_VI_HANDLE *v, VIP_VI_HANDLE h)
{
    for (int i = 0; i < NV; i++)
        if (v[i] == h)
            return i;
    return -1;
}

/* Takes the descriptor a notice names and checks it is a receive of
 * message n on VI i. */
static void take_named(VIP_VI_HANDLE vi, int i, int n)
{
    VIP_DESCRIPTOR *d = NULL;
    VIP_RETURN r = VipRecvDone(vi, &d);
    CHECKF(r == VIP_SUCCESS, "VI %d: a CQ notice named its receive queue, but VipRecvDone returned %s", i,
           vip_ret_name(r));
    if (r != VIP_SUCCESS)
        return;
    char want[32];
    snprintf(want, sizeof want, "vi %d msg %d", i, n);
    CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
    CHECKF(d->CS.Length == strlen(want) && memcmp(seg_buf(d, 0), want, strlen(want)) == 0,
           "VI %d: expected \"%s\"", i, want);
}

static void t_several_vis(int arg)
{
    (void)arg;
    static struct several sv;
    for (int i = 0; i < NV; i++)
        disc_new(sv.disc[i]);
    struct peer p;
    peer_start(&p, srv_several, &sv);
    struct side s;
    side_open(&s, NULL);
    char host[NV][HOST_TEXT];
    for (int i = 0; i < NV; i++)
        recv_addr(&p.c, host[i]);
    VIP_CQ_HANDLE cq = NULL;
    REQUIRE_RET(VipCreateCQ(s.nic, 64, &cq), VIP_SUCCESS);
    VIP_VI_HANDLE vi[NV];
    for (int i = 0; i < NV; i++) {
        vi[i] = vi_new(&s, default_level(), 0, 0, cq, cq);
        for (int n = 0; n < RECVS_PER_VI; n++)
            REQUIRE_RET(VipPostRecv(vi[i], recv_desc(&s, 64), s.mh), VIP_SUCCESS);
    }
    for (int i = 0; i < NV; i++)
        cli_connect(&s, vi[i], host[i], sv.disc[i], 10000);
    CHAN_EXPECT(&p.c, 10000, T_READY, NULL, 0);
    VIP_VI_HANDLE got = NULL;
    VIP_BOOLEAN rq = -1;
    int count[NV] = {0, 0, 0};

    /* Staged: one message at a time, on VI 2, 0, 1. */
    static const int order[NV] = {2, 0, 1};
    for (int k = 0; k < NV; k++) {
        int i = order[k];
        go(&p.c, i, 1);
        got = NULL;
        rq = -1;
        VIP_RETURN r = VipCQWait(cq, 5000, &got, &rq);
        CHECKF(r == VIP_SUCCESS, "VipCQWait for VI %d's message: %s", i, vip_ret_name(r));
        if (r != VIP_SUCCESS)
            continue;
        h_note("staged notice: VI %d", index_of(vi, got));
        CHECKF(got == vi[i], "the notice names VI %d, expected VI %d", index_of(vi, got), i);
        CHECK_EQ(rq, VIP_TRUE);
        if (got == vi[i])
            take_named(vi[i], i, count[i]++);
    }
    VIP_RETURN r = VipCQDone(cq, &got, &rq);
    CHECK_RET(r, VIP_NOT_DONE);

    /* A batch: 2 on VI 0, 1 on VI 1, 3 on VI 2, all sent before any is taken. */
    for (int i = 0; i < NV; i++)
        go(&p.c, i, batch[i]);
    int notices = 0, seen[NV] = {0, 0, 0};
    for (; notices < 6; notices++) {
        got = NULL;
        r = VipCQWait(cq, 5000, &got, &rq);
        CHECKF(r == VIP_SUCCESS, "notice %d of the batch of 6: %s", notices, vip_ret_name(r));
        if (r != VIP_SUCCESS)
            break;
        int i = index_of(vi, got);
        h_note("batch notice %d: VI %d", notices, i);
        CHECKF(i >= 0, "a notice names VI handle %p, not one of the three", (void *)got);
        CHECK_EQ(rq, VIP_TRUE);
        if (i < 0)
            continue;
        seen[i]++;
        take_named(vi[i], i, count[i]++);
    }
    for (int i = 0; i < NV; i++)
        CHECKF(seen[i] == batch[i], "VI %d: %d notices, %d messages", i, seen[i], batch[i]);
    CHECK_RET(VipCQDone(cq, &got, &rq), VIP_NOT_DONE);
    for (int i = 0; i < NV; i++) {
        VIP_DESCRIPTOR *d = NULL;
        CHECK_RET(VipRecvDone(vi[i], &d), VIP_NOT_DONE);
    }

    /* Sends on the same CQ: notices for send queues. */
    VIP_DESCRIPTOR *sd[2] = {send_desc(&s, "to 1", 4, 0), send_desc(&s, "to 0", 4, 0)};
    CHECK_RET(VipPostSend(vi[1], sd[0], s.mh), VIP_SUCCESS);
    CHECK_RET(VipPostSend(vi[0], sd[1], s.mh), VIP_SUCCESS);
    int sends[NV] = {0, 0, 0};
    for (int n = 0; n < 2; n++) {
        r = VipCQWait(cq, 5000, &got, &rq);
        CHECKF(r == VIP_SUCCESS, "send notice %d: %s", n, vip_ret_name(r));
        if (r != VIP_SUCCESS)
            break;
        int i = index_of(vi, got);
        CHECKF(i == 0 || i == 1, "a send notice names VI %d", i);
        CHECK_EQ(rq, VIP_FALSE);
        if (i < 0)
            continue;
        sends[i]++;
        VIP_DESCRIPTOR *d = NULL;
        CHECK_RET(VipSendDone(vi[i], &d), VIP_SUCCESS);
        CHECK(d == sd[i == 1 ? 0 : 1]);
    }
    CHECK(sends[0] == 1 && sends[1] == 1);

    /* Three notices held: the CQ cannot shrink below them. */
    go(&p.c, 2, 3);
    long long end = now_ms() + 3000;
    VIP_DESCRIPTOR *none = NULL;
    for (;;) {
        /* Moves the VI without taking anything (its send queue is empty). */
        VipSendDone(vi[2], &none);
        VIP_RETURN rr = VipResizeCQ(cq, 2);
        if (rr == VIP_INVALID_PARAMETER || now_ms() > end) {
            CHECKF(rr == VIP_INVALID_PARAMETER, "resizing a CQ that holds 3 notices to 2: %s", vip_ret_name(rr));
            break;
        }
        CHECKF(rr == VIP_SUCCESS, "VipResizeCQ(2) while notices arrive: %s", vip_ret_name(rr));
        VipResizeCQ(cq, 64);
        sleep_ms(5);
    }
    CHECK_RET(VipResizeCQ(cq, 3), VIP_SUCCESS);
    for (int n = 0; n < 3; n++) {
        r = VipCQDone(cq, &got, &rq);
        CHECKF(r == VIP_SUCCESS, "held notice %d: %s", n, vip_ret_name(r));
        if (r == VIP_SUCCESS && got == vi[2])
            take_named(vi[2], 2, count[2]++);
    }
    CHECK_RET(VipCQDone(cq, &got, &rq), VIP_NOT_DONE);

    /* The server takes its completions; then everyone goes. */
    chan_send(&p.c, T_END, NULL, 0);
    int tag = -1;
    for (end = now_ms() + 20000; tag < 0 && now_ms() < end;) {
        tag = chan_recv(&p.c, 1, NULL, 0, NULL);
        for (int i = 0; i < NV; i++)
            VipSendDone(vi[i], &none);
    }
    CHECKF(tag == T_DONE, "the server did not finish (%d)", tag);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end(&p, 15000);
    side_close(&s);
}

/* ---- Overflow ------------------------------------------------------------------------------ */

static void srv_three(struct conn *x, void *arg)
{
    (void)arg;
    if (chan_recv_pump(x->c, x->vi, 10000, NULL, 0) != T_GO)
        return;
    for (int i = 0; i < 3; i++) {
        VIP_DESCRIPTOR *d = send_desc(&x->s, "over", 4, 0);
        CHECK_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS);
    }
    chan_send(x->c, T_DONE, NULL, 0);
    for (int i = 0; i < 3; i++)
        SEND_WAIT(x->vi, 5000);
}

static void t_overflow(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.cli_cq = 1, .cq_entries = 2, .cli_recvs = 3, .server = srv_three};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    chan_send(x->c, T_GO, NULL, 0);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    /* Let the three receives complete without taking any notice. */
    long long end = now_ms() + 1000;
    VIP_DESCRIPTOR *none = NULL;
    while (now_ms() < end) {
        VipSendDone(x->vi, &none);
        sleep_ms(2);
    }
    VIP_VI_HANDLE got;
    VIP_BOOLEAN rq;
    CHECK_RET(VipCQDone(x->scq, &got, &rq), VIP_ERROR_RESOURCE);
    CHECK_RET(VipCQWait(x->scq, 100, &got, &rq), VIP_ERROR_RESOURCE);
    /* The descriptors themselves are complete. */
    for (int i = 0; i < 3; i++) {
        VIP_DESCRIPTOR *d = NULL;
        CHECK_RET(VipRecvDone(x->vi, &d), VIP_SUCCESS);
    }
    pair_close(&pr);
}

/* ---- Blocking waits: the waker comes after the sleeper slept -------------------------------- */

/* Rounds of a ping-pong in which each side waits in VipCQWait (both queues
 * bound to one CQ, VIPL_WAIT_SPIN_US=0: it sleeps at once) and the other
 * side answers after a pause every other round, so that the message finds
 * the waiter asleep; the rounds in between answer at once (a message
 * racing the sleeper's arming). */
#define SLEEP_ROUNDS 120
#define SLEEP_PAUSE_MS 2

/* The next receive through the CQ: waits until a notice names the receive
 * queue of `vi`, taking back the sends it names meanwhile. NULL (with a
 * failed check) on anything else. */
static VIP_DESCRIPTOR *cq_next_recv(VIP_CQ_HANDLE cq, VIP_VI_HANDLE vi, uint32_t *sends_done)
{
    for (;;) {
        VIP_VI_HANDLE got = NULL;
        VIP_BOOLEAN rq = -1;
        VIP_RETURN r = VipCQWait(cq, 10000, &got, &rq);
        CHECKF(r == VIP_SUCCESS, "VipCQWait: %s", vip_ret_name(r));
        if (r != VIP_SUCCESS)
            return NULL;
        CHECKF(got == vi, "the notice names VI %p, not %p", got, vi);
        VIP_DESCRIPTOR *d = NULL;
        if (!rq) {
            CHECK_RET(VipSendDone(vi, &d), VIP_SUCCESS);
            if (d) {
                CHECK_EQ(d->CS.Status & VIP_STATUS_ERROR_MASK, 0);
                (*sends_done)++;
            }
            continue;
        }
        r = VipRecvDone(vi, &d);
        CHECKF(r == VIP_SUCCESS, "VipRecvDone after a receive notice: %s", vip_ret_name(r));
        return r == VIP_SUCCESS ? d : NULL;
    }
}

/* Takes the send completions still due, up to `sent`, through the CQ: a
 * send completes when the peer acknowledges it, which may come after its
 * answer (an ack carried by the answer is applied after the answer is
 * delivered). */
static void cq_last_sends(VIP_CQ_HANDLE cq, VIP_VI_HANDLE vi, uint32_t sent, uint32_t *sends_done)
{
    while (*sends_done < sent) {
        VIP_VI_HANDLE got = NULL;
        VIP_BOOLEAN rq = -1;
        VIP_RETURN r = VipCQWait(cq, 10000, &got, &rq);
        CHECKF(r == VIP_SUCCESS, "VipCQWait for the last sends: %s", vip_ret_name(r));
        if (r != VIP_SUCCESS)
            return;
        CHECKF(got == vi && !rq, "a notice after the last answer names %s",
               rq ? "a receive" : "another VI");
        VIP_DESCRIPTOR *d = NULL;
        CHECK_RET(VipSendDone(vi, &d), VIP_SUCCESS);
        if (!d)
            return;
        CHECK_EQ(d->CS.Status & VIP_STATUS_ERROR_MASK, 0);
        (*sends_done)++;
    }
}

/* Sends round number i (4 bytes) on vi. */
static void send_round(struct conn *x, uint32_t i)
{
    CHECK_RET(VipPostSend(x->vi, send_desc(&x->s, &i, sizeof i, 0), x->s.mh), VIP_SUCCESS);
}

/* The round number a receive carries, or -1 (with a failed check). */
static long round_of(VIP_DESCRIPTOR *d)
{
    if (!d)
        return -1;
    CHECK_EQ(d->CS.Status & VIP_STATUS_ERROR_MASK, 0);
    CHECK_EQ(d->CS.Length, 4);
    uint32_t v;
    memcpy(&v, seg_buf(d, 0), sizeof v);
    return (long)v;
}

static void srv_sleepy(struct conn *x, void *arg)
{
    (void)arg;
    uint32_t sends_done = 0;
    for (uint32_t i = 0; i < SLEEP_ROUNDS; i++) {
        VIP_DESCRIPTOR *d = cq_next_recv(x->scq, x->vi, &sends_done);
        long got = round_of(d);
        CHECKF(got == (long)i, "server: round %u carried %ld", i, got);
        if (got != (long)i)
            return;
        REQUIRE_RET(VipPostRecv(x->vi, recv_desc(&x->s, 64), x->s.mh), VIP_SUCCESS);
        if (i % 2)
            sleep_ms(SLEEP_PAUSE_MS);
        send_round(x, i);
    }
    cq_last_sends(x->scq, x->vi, SLEEP_ROUNDS, &sends_done);
}

static void t_wait_sleeps_and_wakes(int arg)
{
    (void)arg;
    /* Read by VipCreateCQ and VipCreateVi, in the test and in the server
     * it forks. */
    setenv("VIPL_WAIT_SPIN_US", "0", 1);
    struct pair pr;
    struct pair_cfg cfg = {.cli_cq = 1, .srv_cq = 1, .cli_recvs = 2, .srv_recvs = 2,
                           .server = srv_sleepy};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    uint32_t sends_done = 0, sent = 0;
    for (uint32_t i = 0; i < SLEEP_ROUNDS; i++) {
        if (i % 2 == 0)
            sleep_ms(SLEEP_PAUSE_MS);
        send_round(x, i);
        sent++;
        VIP_DESCRIPTOR *d = cq_next_recv(x->scq, x->vi, &sends_done);
        long got = round_of(d);
        CHECKF(got == (long)i, "client: the answer to round %u carried %ld", i, got);
        if (got != (long)i)
            break;
        REQUIRE_RET(VipPostRecv(x->vi, recv_desc(&x->s, 64), x->s.mh), VIP_SUCCESS);
    }
    cq_last_sends(x->scq, x->vi, sent, &sends_done);
    pair_close(&pr);
}

const struct test cq_tests[] = {
    {"cq", "create_destroy", t_create_destroy, 0, 0},
    {"cq", "cq_table_full", t_cq_table_full, 0, 0},
    {"cq", "resize", t_resize, 0, 0},
    {"cq", "destroy_with_vis_attached", t_destroy_rules, 0, 0},
    {"cq", "waits_on_bound_queues", t_bound_waits, 0, 0},
    {"cq", "several_vis_one_cq", t_several_vis, 0, 0},
    {"cq", "overflow", t_overflow, 0, 0},
    {"cq", "wait_sleeps_and_wakes", t_wait_sleeps_and_wakes, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
