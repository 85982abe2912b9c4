/*
 * Data transfer: send and receive over a connected pair at each level,
 * done/wait order, immediate data, the queue fence, several segments,
 * large messages, a pipelined stream, timeouts, VIP_NOT_DONE, descriptor
 * errors with the status bits of each, and posts in the wrong state.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Send and receive ---------------------------------------------------------- */

static void srv_send_recv(struct conn *x, void *arg)
{
    (void)arg;
    VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 5000);
    if (d) {
        CHECK(d == x->pre[0]);
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(d->CS.Length, 11);
        CHECK(memcmp(seg_buf(d, 0), "hello world", 11) == 0);
    }
    VIP_DESCRIPTOR *s = send_desc(&x->s, "pong!", 5, 0);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    VIP_DESCRIPTOR *got = SEND_WAIT(x->vi, 5000);
    CHECK(got == s);
    CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
}

static void t_send_recv(int level)
{
    require_level((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct pair_cfg cfg = {.level = (VIP_RELIABILITY_LEVEL)level, .srv_recvs = 1, .cli_recvs = 1,
                           .server = srv_send_recv};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    /* A posted receive is not done yet. */
    CHECK_EQ(x->pre[0]->CS.Status & VIP_STATUS_DONE, 0);
    VIP_DESCRIPTOR *s = send_desc(&x->s, "hello world", 11, 0);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    VIP_DESCRIPTOR *got = SEND_WAIT(x->vi, 5000);
    CHECK(got == s);
    CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
    VIP_DESCRIPTOR *r = RECV_WAIT(x->vi, 5000);
    if (r) {
        CHECK(r == x->pre[0]);
        CHECK_STATUS(r, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(r->CS.Length, 5);
        CHECK(memcmp(seg_buf(r, 0), "pong!", 5) == 0);
    }
    /* Both queues are empty again. */
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES a;
    VIP_BOOLEAN se = 0, re = 0;
    CHECK_RET(VipQueryVi(x->vi, &st, &a, &se, &re), VIP_SUCCESS);
    CHECK_EQ(se, VIP_TRUE);
    CHECK_EQ(re, VIP_TRUE);
    pair_close(&pr);
}

/* ---- Done and wait hand descriptors back in post order -------------------------- */

#define ORDER_N 8

static uint32_t order_len(int i)
{
    return (uint32_t)(i * 7 + 1);
}

/* Takes the next descriptor: by polling the done call when i is even, by
 * the wait call when odd. */
static VIP_DESCRIPTOR *take(VIP_VI_HANDLE vi, int recv, int i)
{
    VIP_DESCRIPTOR *d = NULL;
    if (i % 2 == 0) {
        long long end = now_ms() + 5000;
        VIP_RETURN r;
        while ((r = recv ? VipRecvDone(vi, &d) : VipSendDone(vi, &d)) == VIP_NOT_DONE && now_ms() < end)
            sleep_ms(1);
        CHECKF(r == VIP_SUCCESS, "%s (descriptor %d): %s", recv ? "VipRecvDone" : "VipSendDone", i,
               vip_ret_name(r));
        return r == VIP_SUCCESS ? d : NULL;
    }
    return recv ? RECV_WAIT(vi, 5000) : SEND_WAIT(vi, 5000);
}

static void srv_order(struct conn *x, void *arg)
{
    (void)arg;
    for (int i = 0; i < ORDER_N; i++) {
        VIP_DESCRIPTOR *d = take(x->vi, 1, i);
        CHECKF(d == x->pre[i], "receive %d came back as descriptor %p, posted as %p", i, (void *)d,
               (void *)x->pre[i]);
        if (!d)
            continue;
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(d->CS.Length, order_len(i));
        CHECKF(check_pattern(seg_buf(d, 0), order_len(i), (unsigned)i) < 0, "receive %d: wrong bytes", i);
    }
    VIP_DESCRIPTOR *d = NULL;
    CHECK_RET(VipRecvDone(x->vi, &d), VIP_NOT_DONE);
}

static void t_order(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.srv_recvs = ORDER_N, .recv_len = 128, .server = srv_order};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *s[ORDER_N];
    for (int i = 0; i < ORDER_N; i++) {
        s[i] = send_desc(&x->s, NULL, order_len(i), (unsigned)i);
        /* A queue fence on plain sends changes nothing of their order. */
        if (i == 3 || i == 6)
            s[i]->CS.Control |= VIP_CONTROL_QFENCE;
        CHECK_RET(VipPostSend(x->vi, s[i], x->s.mh), VIP_SUCCESS);
    }
    for (int i = 0; i < ORDER_N; i++) {
        VIP_DESCRIPTOR *d = take(x->vi, 0, i);
        CHECKF(d == s[i], "send %d came back as descriptor %p, posted as %p", i, (void *)d, (void *)s[i]);
        if (d)
            CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
    }
    VIP_DESCRIPTOR *d = NULL;
    CHECK_RET(VipSendDone(x->vi, &d), VIP_NOT_DONE);
    pair_close(&pr);
}

/* ---- Immediate data ------------------------------------------------------------------ */

static void srv_immediate(struct conn *x, void *arg)
{
    (void)arg;
    VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 5000);
    if (d) {
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 1);
        CHECK_EQ(d->CS.ImmediateData, 0xA5A5F00Du);
        CHECK_EQ(d->CS.Length, 16);
        CHECK(check_pattern(seg_buf(d, 0), 16, 1) < 0);
    }
    d = RECV_WAIT(x->vi, 5000);
    if (d) {
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(d->CS.Length, 16);
    }
    /* No data segment at all: only the immediate data. */
    d = RECV_WAIT(x->vi, 5000);
    if (d) {
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 1);
        CHECK_EQ(d->CS.ImmediateData, 0x12345678u);
        CHECK_EQ(d->CS.Length, 0);
    }
}

static void t_immediate(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.srv_recvs = 3, .recv_len = 64, .server = srv_immediate};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *a = send_desc(&x->s, NULL, 16, 1);
    a->CS.Control |= VIP_CONTROL_IMMEDIATE;
    a->CS.ImmediateData = 0xA5A5F00Du;
    VIP_DESCRIPTOR *b = send_desc(&x->s, NULL, 16, 2);
    b->CS.ImmediateData = 0x0badf00du; /* not marked immediate: not delivered */
    VIP_DESCRIPTOR *c = desc_new(&x->s, 0);
    c->CS.SegCount = 0;
    c->CS.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
    c->CS.ImmediateData = 0x12345678u;
    VIP_DESCRIPTOR *all[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        CHECK_RET(VipPostSend(x->vi, all[i], x->s.mh), VIP_SUCCESS);
        VIP_DESCRIPTOR *d = SEND_WAIT(x->vi, 5000);
        CHECK(d == all[i]);
        if (d)
            CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, -1);
    }
    pair_close(&pr);
}

/* ---- Several segments ------------------------------------------------------------------ */

struct multi {
    int max;
};

static void prep_multi(struct conn *x, void *arg)
{
    struct multi *m = arg;
    /* 350 bytes arrive in two buffers: 300 and 100. */
    VIP_DESCRIPTOR *d = desc_new(&x->s, 2);
    d->CS.SegCount = 2;
    set_local(d, 0, arena_take(&x->s, 300), x->s.mh, 300);
    set_local(d, 1, arena_take(&x->s, 100), x->s.mh, 100);
    REQUIRE_RET(VipPostRecv(x->vi, d, x->s.mh), VIP_SUCCESS);
    x->pre[x->npre++] = d;
    /* The most segments the NIC takes, 10 bytes each. */
    d = desc_new(&x->s, m->max);
    d->CS.SegCount = (VIP_UINT16)m->max;
    for (int i = 0; i < m->max; i++)
        set_local(d, i, arena_take(&x->s, 10), x->s.mh, 10);
    REQUIRE_RET(VipPostRecv(x->vi, d, x->s.mh), VIP_SUCCESS);
    x->pre[x->npre++] = d;
}

static void srv_multi(struct conn *x, void *arg)
{
    struct multi *m = arg;
    VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 5000);
    if (d) {
        CHECK(d == x->pre[0]);
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(d->CS.Length, 350);
        unsigned char all[350];
        memcpy(all, seg_buf(d, 0), 300);
        memcpy(all + 300, seg_buf(d, 1), 50);
        CHECKF(check_pattern(all, 350, 7) < 0, "gathered and scattered bytes differ at %ld",
               check_pattern(all, 350, 7));
        unsigned char *tail = seg_buf(d, 1);
        CHECKF(tail[50] == 0, "bytes past the message in the second buffer were written");
    }
    d = RECV_WAIT(x->vi, 5000);
    if (d) {
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK_EQ(d->CS.Length, (uint32_t)m->max * 10);
        int bad = -1;
        for (int i = 0; i < m->max && bad < 0; i++) {
            unsigned char want[10];
            fill_pattern(want, 10, 100u + (unsigned)i);
            if (memcmp(seg_buf(d, i), want, 10) != 0)
                bad = i;
        }
        CHECKF(bad < 0, "segment %d of %d holds the wrong bytes", bad, m->max);
    }
}

static void t_multi_segment(int arg)
{
    (void)arg;
    static struct multi m;
    m.max = (int)g_nic.MaxSegmentsPerDesc;
    if (m.max > 64)
        m.max = 64;
    struct pair pr;
    struct pair_cfg cfg = {.prepare = prep_multi, .server = srv_multi, .arg = &m};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    /* 100 + 200 + 50 bytes from two regions. */
    unsigned char all[350];
    fill_pattern(all, sizeof all, 7);
    VIP_MEM_HANDLE other;
    unsigned char *mid = region_new(&x->s, 4096, x->s.ptag, 0, 0, &other);
    unsigned char *first = arena_take(&x->s, 100), *last = arena_take(&x->s, 50);
    memcpy(first, all, 100);
    memcpy(mid, all + 100, 200);
    memcpy(last, all + 300, 50);
    VIP_DESCRIPTOR *d = desc_new(&x->s, 3);
    d->CS.SegCount = 3;
    set_local(d, 0, first, x->s.mh, 100);
    set_local(d, 1, mid, other, 200);
    set_local(d, 2, last, x->s.mh, 50);
    CHECK_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS);
    VIP_DESCRIPTOR *got = SEND_WAIT(x->vi, 5000);
    CHECK(got == d);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
    d = desc_new(&x->s, m.max);
    d->CS.SegCount = (VIP_UINT16)m.max;
    for (int i = 0; i < m.max; i++) {
        void *b = arena_take(&x->s, 10);
        fill_pattern(b, 10, 100u + (unsigned)i);
        set_local(d, i, b, x->s.mh, 10);
    }
    CHECK_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS);
    got = SEND_WAIT(x->vi, 5000);
    CHECK(got == d);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
    pair_close(&pr);
}

/* ---- Large messages and sizes around the providers' thresholds --------------------- */

static const uint32_t sizes[] = {1, 63, 64, 1000, 1472, 1500, 4096, 9000, 65536, 65537, 300000};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static uint32_t big_len(void)
{
    return g_nic.MaxTransferSize < (1u << 20) ? (uint32_t)g_nic.MaxTransferSize : (1u << 20);
}

static void prep_large(struct conn *x, void *arg)
{
    (void)arg;
    for (size_t i = 0; i < NSIZES; i++)
        if (sizes[i] <= big_len())
            conn_post_recv(x, sizes[i]);
    conn_post_recv(x, big_len());
}

static void srv_large(struct conn *x, void *arg)
{
    (void)arg;
    for (int i = 0; i < x->npre; i++) {
        VIP_DESCRIPTOR *d = RECV_WAIT(x->vi, 10000);
        if (!d)
            return;
        uint32_t want = desc_seg(d, 0)->Local.Length;
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECKF(d->CS.Length == want, "message %d: %u bytes received, %u sent", i, (unsigned)d->CS.Length,
               (unsigned)want);
        long bad = check_pattern(seg_buf(d, 0), want, 1000u + want);
        CHECKF(bad < 0, "message of %u bytes differs at byte %ld", (unsigned)want, bad);
    }
}

static void t_large(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.mtu = big_len(), .prepare = prep_large, .server = srv_large};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    for (size_t i = 0; i <= NSIZES; i++) {
        uint32_t n = i < NSIZES ? sizes[i] : big_len();
        if (i < NSIZES && n > big_len())
            continue;
        VIP_DESCRIPTOR *d = send_desc(&x->s, NULL, n, 1000u + n);
        CHECK_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS);
        VIP_DESCRIPTOR *got = SEND_WAIT(x->vi, 10000);
        CHECK(got == d);
        if (got)
            CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
    }
    pair_close(&pr);
}

/* ---- A pipelined stream both ways: the server echoes every message ----------------- */

#define STREAM_N 300
#define STREAM_W 16

static uint32_t stream_len(int i)
{
    return (uint32_t)(4 + (i * 37) % 2000);
}

static void stream_fill(void *buf, int i)
{
    uint32_t seq = (uint32_t)i;
    fill_pattern(buf, stream_len(i), (unsigned)i);
    memcpy(buf, &seq, 4);
}

static int stream_check(const VIP_DESCRIPTOR *d, int i)
{
    unsigned char want[2100];
    stream_fill(want, i);
    return d->CS.Length == stream_len(i) && memcmp(seg_buf((VIP_DESCRIPTOR *)d, 0), want, stream_len(i)) == 0;
}

static void repost(struct conn *x, VIP_DESCRIPTOR *d)
{
    d->CS.Status = 0;
    d->CS.Length = 0;
    CHECK_RET(VipPostRecv(x->vi, d, x->s.mh), VIP_SUCCESS);
}

/* A ring of W send descriptors of 2100 bytes; a slot is reused once its
 * previous send came back. */
struct sender {
    VIP_DESCRIPTOR *d[STREAM_W];
    int posted, taken;
};

static void sender_init(struct sender *s, struct conn *x)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < STREAM_W; i++)
        s->d[i] = send_desc(&x->s, NULL, 2100, 0);
}

static void sender_take(struct sender *s, struct conn *x, int block)
{
    while (s->taken < s->posted) {
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN r = block ? VipSendWait(x->vi, 5000, &d) : VipSendDone(x->vi, &d);
        if (r == VIP_NOT_DONE)
            return;
        CHECKF(r == VIP_SUCCESS, "taking send %d: %s", s->taken, vip_ret_name(r));
        if (r != VIP_SUCCESS)
            h_finish();
        CHECKF(d == s->d[s->taken % STREAM_W], "send %d came back out of order", s->taken);
        CHECK_STATUS(d, VIP_STATUS_OP_SEND, 0, 0);
        s->taken++;
        block = 0;
    }
}

static void sender_post(struct sender *s, struct conn *x, int i)
{
    if (s->posted - s->taken == STREAM_W)
        sender_take(s, x, 1);
    VIP_DESCRIPTOR *d = s->d[s->posted % STREAM_W];
    d->CS.Status = 0;
    stream_fill(seg_buf(d, 0), i);
    desc_seg(d, 0)->Local.Length = stream_len(i);
    REQUIRE_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS);
    s->posted++;
}

static void srv_stream(struct conn *x, void *arg)
{
    (void)arg;
    struct sender s;
    sender_init(&s, x);
    int bad = 0;
    for (int i = 0; i < STREAM_N; i++) {
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN r = VipRecvWait(x->vi, 5000, &d);
        if (r != VIP_SUCCESS) {
            CHECKF(0, "server: message %d: VipRecvWait returned %s", i, vip_ret_name(r));
            return;
        }
        if (!stream_check(d, i) && bad++ == 0)
            CHECKF(0, "server: message %d has the wrong length or bytes (%u bytes, status 0x%x)", i,
                   (unsigned)d->CS.Length, (unsigned)d->CS.Status);
        repost(x, d);
        sender_post(&s, x, i);
        sender_take(&s, x, 0);
    }
    sender_take(&s, x, 1);
    CHECKF(bad == 0, "server: %d of %d messages wrong", bad, STREAM_N);
}

static void t_stream(int level)
{
    require_level((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct pair_cfg cfg = {.level = (VIP_RELIABILITY_LEVEL)level, .srv_recvs = STREAM_W, .cli_recvs = STREAM_W,
                           .recv_len = 2100, .server = srv_stream};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    struct sender s;
    sender_init(&s, x);
    int echoed = 0, bad = 0;
    for (int i = 0; i < STREAM_N || echoed < STREAM_N;) {
        if (i < STREAM_N && i - echoed < STREAM_W) {
            sender_post(&s, x, i++);
            continue;
        }
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN r = VipRecvWait(x->vi, 5000, &d);
        if (r != VIP_SUCCESS) {
            CHECKF(0, "echo %d: VipRecvWait returned %s", echoed, vip_ret_name(r));
            break;
        }
        if (!stream_check(d, echoed) && bad++ == 0)
            CHECKF(0, "echo %d has the wrong length or bytes", echoed);
        echoed++;
        repost(x, d);
        sender_take(&s, x, 0);
    }
    sender_take(&s, x, 1);
    CHECKF(bad == 0, "%d of %d echoes wrong", bad, STREAM_N);
    CHECK_EQ(echoed, STREAM_N);
    pair_close(&pr);
}

/* ---- Posted sends leave without further calls ----------------------------------------- */

static void srv_post_and_sleep(struct conn *x, void *arg)
{
    (void)arg;
    VIP_DESCRIPTOR *s[3];
    for (int i = 0; i < 3; i++) {
        s[i] = send_desc(&x->s, NULL, 100, 60u + (unsigned)i);
        CHECK_RET(VipPostSend(x->vi, s[i], x->s.mh), VIP_SUCCESS);
    }
    /* Posting rang the doorbell: the program goes on with other work. */
    chan_send(x->c, T_DONE, NULL, 0);
    sleep_ms(3000);
    for (int i = 0; i < 3; i++) {
        VIP_DESCRIPTOR *d = SEND_WAIT(x->vi, 5000);
        CHECK(d == s[i]);
    }
}

static void t_posted_sends_leave(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.cli_recvs = 3, .recv_len = 128, .server = srv_post_and_sleep};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    long long t0 = now_ms();
    for (int i = 0; i < 3; i++) {
        VIP_DESCRIPTOR *d = NULL;
        long long left = 2500 - (now_ms() - t0);
        VIP_RETURN r = VipRecvWait(x->vi, (VIP_ULONG)(left > 0 ? left : 0), &d);
        CHECKF(r == VIP_SUCCESS,
               "message %d of 3 posted back to back did not arrive within 2.5 s while the sender made no further "
               "call: %s",
               i, vip_ret_name(r));
        if (r != VIP_SUCCESS)
            break;
        CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
        CHECK(d->CS.Length == 100 && check_pattern(seg_buf(d, 0), 100, 60u + (unsigned)i) < 0);
    }
    pair_close(&pr);
}

/* ---- Timeouts and VIP_NOT_DONE -------------------------------------------------------- */

static void srv_late(struct conn *x, void *arg)
{
    (void)arg;
    for (int i = 0; i < 2; i++) {
        if (chan_recv_pump(x->c, x->vi, 10000, NULL, 0) != T_GO)
            return;
        sleep_ms(300);
        VIP_DESCRIPTOR *s = send_desc(&x->s, "late", 4, 0);
        CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
        SEND_WAIT(x->vi, 5000);
    }
}

static void t_timeouts(int arg)
{
    (void)arg;
    struct pair pr;
    struct pair_cfg cfg = {.server = srv_late};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *d = NULL;
    long long t0 = now_ms();
    CHECK_RET(VipRecvWait(x->vi, 200, &d), VIP_TIMEOUT);
    long long ms = now_ms() - t0;
    CHECKF(ms >= 190 && ms < 5000, "a 200 ms wait on an empty queue took %lld ms", ms);
    /* A receive posted, nothing sent. */
    conn_post_recv(x, 64);
    t0 = now_ms();
    CHECK_RET(VipRecvWait(x->vi, 300, &d), VIP_TIMEOUT);
    ms = now_ms() - t0;
    CHECKF(ms >= 290 && ms < 5000, "a 300 ms wait took %lld ms", ms);
    t0 = now_ms();
    CHECK_RET(VipSendWait(x->vi, 100, &d), VIP_TIMEOUT);
    ms = now_ms() - t0;
    CHECKF(ms >= 90 && ms < 5000, "a 100 ms wait took %lld ms", ms);
    t0 = now_ms();
    CHECK_RET(VipRecvWait(x->vi, 0, &d), VIP_TIMEOUT);
    CHECKF(now_ms() - t0 < 200, "a wait of 0 ms took %lld ms", now_ms() - t0);
    /* Forever, both spellings: the message comes 300 ms later. */
    conn_post_recv(x, 64);
    static const VIP_ULONG forever[2] = {VIP_INFINITE, 0xFFFFFFFFUL};
    for (int i = 0; i < 2; i++) {
        chan_send(x->c, T_GO, NULL, 0);
        d = NULL;
        t0 = now_ms();
        VIP_RETURN r = VipRecvWait(x->vi, forever[i], &d);
        CHECKF(r == VIP_SUCCESS, "VipRecvWait(0x%lx): expected VIP_SUCCESS, got %s after %lld ms", forever[i],
               vip_ret_name(r), now_ms() - t0);
        CHECKF(now_ms() - t0 >= 250, "VipRecvWait(0x%lx) returned before the message was sent", forever[i]);
        if (r == VIP_SUCCESS && d) {
            CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
            CHECK_EQ(d->CS.Length, 4);
        }
    }
    pair_close(&pr);
}

static void t_not_done(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_DESCRIPTOR *d = NULL;
    CHECK_RET(VipRecvDone(vi, &d), VIP_NOT_DONE);
    CHECK_RET(VipSendDone(vi, &d), VIP_NOT_DONE);
    REQUIRE_RET(VipPostRecv(vi, recv_desc(&s, 64), s.mh), VIP_SUCCESS);
    CHECK_RET(VipRecvDone(vi, &d), VIP_NOT_DONE);
    CHECK_RET(VipRecvDone(vi, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSendDone(vi, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipRecvWait(vi, 10, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSendWait(vi, 10, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipRecvDone(NULL, &d), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSendWait(NULL, 10, &d), VIP_INVALID_PARAMETER);
    side_close(&s);
}

/* ---- Descriptor errors ------------------------------------------------------------------ */

#define SMALL_MTU 4096

static void t_descriptor_errors(int arg)
{
    (void)arg;
    struct pair pr;
    /* RDMA enabled, so that the malformed RDMA descriptors below are
     * refused for their form alone. */
    struct pair_cfg cfg = {.mtu = SMALL_MTU, .srv_recvs = 1, .recv_len = 64, .server = NULL, .rdma_write = 1,
                           .rdma_read = (g_nic.RDMAReadSupport & default_level()) != 0};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    struct side *s = &x->s;
    int max = (int)s->attrs.MaxSegmentsPerDesc;
    char *buf = arena_take(s, 8192);
    VIP_DESCRIPTOR *d;
    VIP_RETURN r;

    /* Too many segments. */
    d = desc_new(s, max + 1);
    d->CS.SegCount = (VIP_UINT16)(max + 1);
    for (int i = 0; i <= max; i++)
        set_local(d, i, buf, s->mh, 4);
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_FORMAT_ERROR);
    d->CS.Status = 0;
    CHECK_RET(VipPostRecv(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_FORMAT_ERROR);

    /* The reserved operation, and a reserved control bit. */
    d = send_desc(s, NULL, 8, 0);
    d->CS.Control = VIP_CONTROL_OP_RESERVED;
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_FORMAT_ERROR);
    d = send_desc(s, NULL, 8, 0);
    d->CS.Control = 0x0010;
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_FORMAT_ERROR);
    /* An RDMA write without its address segment. */
    d = desc_new(s, 0);
    d->CS.Control = VIP_CONTROL_OP_RDMAWRITE;
    d->CS.SegCount = 0;
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_FORMAT_ERROR);
    /* A receive with an RDMA operation. */
    d = recv_desc(s, 64);
    d->CS.Control = VIP_CONTROL_OP_RDMAWRITE;
    CHECK_RET(VipPostRecv(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_FORMAT_ERROR);

    /* Memory that is not registered: a region deregistered before. */
    VIP_MEM_HANDLE gone;
    char *old = region_new(s, 4096, s->ptag, 0, 0, &gone);
    REQUIRE_RET(VipDeregisterMem(s->nic, old, gone), VIP_SUCCESS);
    d = send_desc(s, NULL, 8, 0);
    set_local(d, 0, old, gone, 8);
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_PROTECTION_ERROR);
    d = recv_desc(s, 8);
    set_local(d, 0, old, gone, 8);
    CHECK_RET(VipPostRecv(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_PROTECTION_ERROR);
    /* Memory registered under another tag of this NIC. */
    VIP_PROTECTION_HANDLE p2;
    REQUIRE_RET(VipCreatePtag(s->nic, &p2), VIP_SUCCESS);
    VIP_MEM_HANDLE wrong;
    char *w = region_new(s, 4096, p2, 0, 0, &wrong);
    d = send_desc(s, NULL, 8, 0);
    set_local(d, 0, w, wrong, 8);
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_PROTECTION_ERROR);
    d = recv_desc(s, 8);
    set_local(d, 0, w, wrong, 8);
    CHECK_RET(VipPostRecv(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_PROTECTION_ERROR);
    /* A segment running past its region's end; the second of two. */
    d = desc_new(s, 2);
    d->CS.SegCount = 2;
    set_local(d, 0, buf, s->mh, 8);
    set_local(d, 1, s->arena + s->arena_len - 10, s->mh, 100);
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_PROTECTION_ERROR);
    /* Longer than the VI's MaxTransferSize: one segment, and two. */
    d = send_desc(s, NULL, SMALL_MTU + 1, 0);
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_LENGTH_ERROR);
    d = desc_new(s, 2);
    d->CS.SegCount = 2;
    set_local(d, 0, buf, s->mh, 3000);
    set_local(d, 1, buf + 3000, s->mh, 3000);
    CHECK_RET(VipPostSend(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_LENGTH_ERROR);
    d = recv_desc(s, SMALL_MTU + 1);
    CHECK_RET(VipPostRecv(x->vi, d, s->mh), VIP_DESCRIPTOR_ERROR);
    CHECK_REFUSED(d, VIP_STATUS_LENGTH_ERROR);

    /* Not a descriptor the call can take: misaligned, outside the region
     * of the handle given, NULL. */
    VIP_DESCRIPTOR *good = send_desc(s, NULL, 8, 0);
    char *raw = arena_take(s, 256);
    VIP_DESCRIPTOR *mis = (VIP_DESCRIPTOR *)(void *)(raw + 32);
    memcpy((void *)mis, good, sizeof(VIP_CONTROL_SEGMENT) + sizeof(VIP_DESCRIPTOR_SEGMENT));
    CHECK_RET(VipPostSend(x->vi, mis, s->mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipPostRecv(x->vi, mis, s->mh), VIP_INVALID_PARAMETER);
    VIP_MEM_HANDLE small;
    region_new(s, 128, s->ptag, 0, 0, &small);
    CHECK_RET(VipPostSend(x->vi, good, small), VIP_INVALID_PARAMETER);
    CHECK_RET(VipPostRecv(x->vi, recv_desc(s, 8), small), VIP_INVALID_PARAMETER);
    CHECK_RET(VipPostSend(x->vi, NULL, s->mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipPostRecv(x->vi, NULL, s->mh), VIP_INVALID_PARAMETER);

    /* Nothing was queued, and the VI still works. */
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES a;
    VIP_BOOLEAN se = 0, re = 0;
    CHECK_RET(VipQueryVi(x->vi, &st, &a, &se, &re), VIP_SUCCESS);
    CHECK_EQ(st, VIP_STATE_CONNECTED);
    CHECK_EQ(se, VIP_TRUE);
    CHECK_EQ(re, VIP_TRUE);
    VIP_DESCRIPTOR *got = NULL;
    CHECK_RET(VipSendDone(x->vi, &got), VIP_NOT_DONE);
    CHECK_RET(VipRecvDone(x->vi, &got), VIP_NOT_DONE);
    r = VipPostSend(x->vi, good, s->mh);
    CHECK_RET(r, VIP_SUCCESS);
    if (r == VIP_SUCCESS) {
        got = SEND_WAIT(x->vi, 5000);
        CHECK(got == good);
        if (got)
            CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
    }
    pair_close(&pr);
}

/* ---- Posts in the wrong state ---------------------------------------------------------- */

static void srv_disconnect_at_go(struct conn *x, void *arg)
{
    (void)arg;
    if (chan_recv_pump(x->c, x->vi, 10000, NULL, 0) == T_GO)
        CHECK_RET(VipDisconnect(x->vi), VIP_SUCCESS);
    chan_send(x->c, T_DONE, NULL, 0);
}

static void t_wrong_state(int arg)
{
    (void)arg;
    /* Idle: sends refused, receives taken. */
    struct pair pr;
    struct pair_cfg cfg = {.cli_recvs = 1, .server = srv_disconnect_at_go};
    VIP_DESCRIPTOR *got = NULL;
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    struct side *s = &x->s;
    VIP_VI_HANDLE idle = vi_new(s, default_level(), 0, 0, NULL, NULL);
    CHECK_RET(VipPostSend(idle, send_desc(s, "x", 1, 0), s->mh), VIP_INVALID_STATE);
    CHECK_RET(VipPostRecv(idle, recv_desc(s, 8), s->mh), VIP_SUCCESS);
    /* Error: the peer disconnected; every post refused. */
    chan_send(x->c, T_GO, NULL, 0);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    got = RECV_WAIT(x->vi, 5000);
    if (got) {
        CHECK(got == x->pre[0]);
        CHECK_STATUS(got, VIP_STATUS_OP_RECEIVE, VIP_STATUS_DESC_FLUSHED_ERROR, 0);
    }
    CHECK_STATE(x->vi, VIP_STATE_ERROR);
    CHECK_RET(VipPostSend(x->vi, send_desc(s, "x", 1, 0), s->mh), VIP_INVALID_STATE);
    CHECK_RET(VipPostRecv(x->vi, recv_desc(s, 8), s->mh), VIP_INVALID_STATE);
    /* Disconnected here too: idle again. */
    CHECK_RET(VipDisconnect(x->vi), VIP_SUCCESS);
    CHECK_STATE(x->vi, VIP_STATE_IDLE);
    CHECK_RET(VipPostSend(x->vi, send_desc(s, "x", 1, 0), s->mh), VIP_INVALID_STATE);
    CHECK_RET(VipPostRecv(x->vi, recv_desc(s, 8), s->mh), VIP_SUCCESS);
    pair_close(&pr);
}

static void t_queue_full(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_ULONG max = s.attrs.MaxDescriptorsPerQueue;
    if (max > (1u << 16))
        h_skip("MaxDescriptorsPerQueue %lu is more than the test fills", max);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    char *buf = arena_take(&s, 64);
    VIP_DESCRIPTOR *d = arena_take(&s, (max + 1) * 64);
    VIP_ULONG posted = 0;
    VIP_RETURN r = VIP_SUCCESS;
    for (; posted < max; posted++) {
        VIP_DESCRIPTOR *e = (VIP_DESCRIPTOR *)(void *)((char *)d + posted * 64);
        e->CS.SegCount = 1;
        set_local(e, 0, buf, s.mh, 64);
        if ((r = VipPostRecv(vi, e, s.mh)) != VIP_SUCCESS)
            break;
    }
    CHECKF(posted == max, "posted %lu receives of MaxDescriptorsPerQueue %lu; then %s", posted, max,
           vip_ret_name(r));
    VIP_DESCRIPTOR *e = (VIP_DESCRIPTOR *)(void *)((char *)d + max * 64);
    e->CS.SegCount = 1;
    set_local(e, 0, buf, s.mh, 64);
    CHECK_RET(VipPostRecv(vi, e, s.mh), VIP_ERROR_RESOURCE);
    side_close(&s);
}

#define L_UNREL VIP_SERVICE_UNRELIABLE
#define L_RD VIP_SERVICE_RELIABLE_DELIVERY
#define L_RR VIP_SERVICE_RELIABLE_RECEPTION

const struct test data_tests[] = {
    {"data", "send_recv/unreliable", t_send_recv, L_UNREL, 0},
    {"data", "send_recv/reliable_delivery", t_send_recv, L_RD, 0},
    {"data", "send_recv/reliable_reception", t_send_recv, L_RR, 0},
    {"data", "done_wait_post_order", t_order, 0, 0},
    {"data", "immediate_data", t_immediate, 0, 0},
    {"data", "multiple_segments", t_multi_segment, 0, 0},
    {"data", "message_sizes", t_large, 0, 0},
    {"data", "stream/reliable_delivery", t_stream, L_RD, 0},
    {"data", "stream/reliable_reception", t_stream, L_RR, 0},
    {"data", "posted_sends_leave_without_further_calls", t_posted_sends_leave, 0, 0},
    {"data", "timeouts", t_timeouts, 0, 0},
    {"data", "not_done", t_not_done, 0, 0},
    {"data", "descriptor_errors", t_descriptor_errors, 0, 0},
    {"data", "posts_in_wrong_state", t_wrong_state, 0, 0},
    {"data", "queue_full", t_queue_full, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
