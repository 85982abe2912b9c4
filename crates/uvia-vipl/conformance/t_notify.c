/*
 * Notify callbacks: VipRecvNotify, VipSendNotify and VipCQNotify run the
 * handler on a thread of the library (not the caller's), with the right
 * context, NIC, VI and descriptor (or queue), once per request; the
 * descriptor (or CQ notice) is taken from its queue. While waiting, the
 * test's own thread makes no call into the library.
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

struct seen {
    atomic_int calls;
    pthread_t thread;
    void *ctx;
    VIP_NIC_HANDLE nic;
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *desc;
    uint32_t status, length;
    VIP_BOOLEAN recvq;
};

static void on_vi(VIP_PVOID ctx, VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, VIP_DESCRIPTOR *d)
{
    struct seen *s = ctx;
    if (atomic_load(&s->calls) == 0) {
        s->thread = pthread_self();
        s->ctx = ctx;
        s->nic = nic;
        s->vi = vi;
        s->desc = d;
        s->status = d ? d->CS.Status : 0;
        s->length = d ? d->CS.Length : 0;
    }
    atomic_fetch_add(&s->calls, 1);
}

static void on_cq(VIP_PVOID ctx, VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, VIP_BOOLEAN recvq)
{
    struct seen *s = ctx;
    if (atomic_load(&s->calls) == 0) {
        s->thread = pthread_self();
        s->ctx = ctx;
        s->nic = nic;
        s->vi = vi;
        s->recvq = recvq;
    }
    atomic_fetch_add(&s->calls, 1);
}

/* Waits (without calling the library) for the first call, then a little
 * longer to see a second one; returns the number of calls. */
static int wait_handler(struct seen *s, int ms)
{
    long long end = now_ms() + ms;
    while (atomic_load(&s->calls) == 0 && now_ms() < end)
        sleep_ms(2);
    if (atomic_load(&s->calls) > 0)
        sleep_ms(300);
    return atomic_load(&s->calls);
}

static void check_called_once(const char *file, int line, struct seen *s, int calls)
{
    h_count();
    if (calls != 1)
        h_fail(file, line, "the handler was called %d times for one request, expected once", calls);
    h_count();
    if (calls >= 1 && pthread_equal(s->thread, pthread_self()))
        h_fail(file, line, "the handler ran on the caller's thread, not a thread of the library");
    h_count();
    if (calls >= 1 && s->ctx != (void *)s)
        h_fail(file, line, "the handler got context %p, expected %p", s->ctx, (void *)s);
}
#define CHECK_CALLED_ONCE(s, calls) check_called_once(__FILE__, __LINE__, (s), (calls))

/* The server sends n messages when told to (T_GO with n), once. */
static void srv_sender(struct conn *x, void *arg)
{
    (void)arg;
    int n = 0;
    if (chan_recv_pump(x->c, x->vi, 15000, &n, sizeof n) == T_GO) {
        for (int i = 0; i < n; i++) {
            VIP_DESCRIPTOR *d = send_desc(&x->s, "notify me", 9, 0);
            CHECK_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS);
        }
        /* Told before the sends complete: the test makes its calls after this. */
        chan_send(x->c, T_DONE, NULL, 0);
        for (int i = 0; i < n; i++) {
            VIP_DESCRIPTOR *d = SEND_WAIT(x->vi, 5000);
            if (d)
                CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
        }
    }
}

static void tell(struct conn *x, int n)
{
    chan_send(x->c, T_GO, &n, sizeof n);
}

static void t_recv_notify(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.cli_recvs = 2, .recv_len = 64, .server = srv_sender};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    static struct seen s;
    CHECK_RET(VipRecvNotify(x->vi, &s, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipRecvNotify(NULL, &s, on_vi), VIP_INVALID_PARAMETER);
    REQUIRE_RET(VipRecvNotify(x->vi, &s, on_vi), VIP_SUCCESS);
    /* Two messages; the request is for one completion. */
    tell(x, 2);
    int calls = wait_handler(&s, 5000);
    CHECK_CALLED_ONCE(&s, calls);
    if (calls >= 1) {
        CHECK(s.nic == x->s.nic);
        CHECK(s.vi == x->vi);
        CHECK(s.desc == x->pre[0]);
        CHECKF((s.status & (VIP_STATUS_DONE | VIP_STATUS_ERROR_MASK | VIP_STATUS_OP_MASK)) ==
                   (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE),
               "the handler's descriptor has status 0x%x", (unsigned)s.status);
        CHECK_EQ(s.length, 9);
    }
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    /* The handler's descriptor was taken from the queue; the second is next. */
    VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 5000);
    CHECK(d == x->pre[1]);
    if (d)
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
    CHECK_EQ(atomic_load(&s.calls), calls);
    CHECK_RET(VipRecvDone(x->vi, &d), VIP_NOT_DONE);
    pair_close(&pr);
}

static void t_send_notify(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.srv_recvs = 2, .recv_len = 64};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    static struct seen a, b;
    CHECK_RET(VipSendNotify(x->vi, &a, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSendNotify(NULL, &a, on_vi), VIP_INVALID_PARAMETER);
    /* Asked for before the post. */
    REQUIRE_RET(VipSendNotify(x->vi, &a, on_vi), VIP_SUCCESS);
    VIP_DESCRIPTOR *s1 = send_desc(&x->s, "first", 5, 0);
    CHECK_RET(VipPostSend(x->vi, s1, x->s.mh), VIP_SUCCESS);
    int calls = wait_handler(&a, 5000);
    CHECK_CALLED_ONCE(&a, calls);
    if (calls >= 1) {
        CHECK(a.nic == x->s.nic);
        CHECK(a.vi == x->vi);
        CHECK(a.desc == s1);
        CHECKF((a.status & (VIP_STATUS_DONE | VIP_STATUS_ERROR_MASK | VIP_STATUS_OP_MASK)) ==
                   (VIP_STATUS_DONE | VIP_STATUS_OP_SEND),
               "the handler's descriptor has status 0x%x", (unsigned)a.status);
    }
    VIP_DESCRIPTOR *d = NULL;
    CHECK_RET(VipSendDone(x->vi, &d), VIP_NOT_DONE);
    /* Asked for after the send may have completed. */
    VIP_DESCRIPTOR *s2 = send_desc(&x->s, "second", 6, 0);
    CHECK_RET(VipPostSend(x->vi, s2, x->s.mh), VIP_SUCCESS);
    sleep_ms(200);
    REQUIRE_RET(VipSendNotify(x->vi, &b, on_vi), VIP_SUCCESS);
    calls = wait_handler(&b, 5000);
    CHECK_CALLED_ONCE(&b, calls);
    if (calls >= 1)
        CHECK(b.desc == s2);
    CHECK_EQ(atomic_load(&a.calls), 1);
    CHECK_RET(VipSendDone(x->vi, &d), VIP_NOT_DONE);
    pair_close(&pr);
}

static void t_cq_notify(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.cli_cq = 1, .cli_recvs = 2, .recv_len = 64, .server = srv_sender};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    static struct seen s;
    CHECK_RET(VipCQNotify(x->rcq, &s, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCQNotify(NULL, &s, on_cq), VIP_INVALID_PARAMETER);
    REQUIRE_RET(VipCQNotify(x->rcq, &s, on_cq), VIP_SUCCESS);
    tell(x, 2);
    int calls = wait_handler(&s, 5000);
    CHECK_CALLED_ONCE(&s, calls);
    if (calls >= 1) {
        CHECK(s.nic == x->s.nic);
        CHECK(s.vi == x->vi);
        CHECK_EQ(s.recvq, VIP_TRUE);
    }
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    /* The handler's notice was taken from the CQ: the next notice is the second message's. */
    VIP_DESCRIPTOR *d = NULL;
    CHECK_RET(VipRecvDone(x->vi, &d), VIP_SUCCESS);
    CHECK(d == x->pre[0]);
    VIP_VI_HANDLE vi = NULL;
    VIP_BOOLEAN rq = -1;
    CHECK_RET(VipCQWait(x->rcq, 5000, &vi, &rq), VIP_SUCCESS);
    CHECK(vi == x->vi);
    CHECK_EQ(rq, VIP_TRUE);
    CHECK_RET(VipRecvDone(x->vi, &d), VIP_SUCCESS);
    CHECK(d == x->pre[1]);
    CHECK_RET(VipCQDone(x->rcq, &vi, &rq), VIP_NOT_DONE);
    CHECK_EQ(atomic_load(&s.calls), calls);
    pair_close(&pr);
}

const struct test notify_tests[] = {
    {"notify", "recv_notify", t_recv_notify, 0, 0},
    {"notify", "send_notify", t_send_notify, 0, 0},
    {"notify", "cq_notify", t_cq_notify, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
