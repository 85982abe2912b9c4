/*
 * RDMA write (every VIA NIC has it) and RDMA read (at the levels the NIC
 * names in RDMAReadSupport; skipped at others): data placed and fetched,
 * several local segments, immediate data consuming a receive, ordering
 * with a later send, the queue fence, and the target's protection checks
 * (region or VI without the enable bit, out of bounds, unknown handle);
 * and all of it against a target whose program sleeps.
 *
 * The server is the target: it registers region A (RDMA write and read
 * enabled, filled with pattern 55) and region B (nothing enabled, zero),
 * tells the test where they are, and checks its memory when asked.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define A_LEN 8192
#define B_LEN 4096
#define A_SEED 55

struct regions {
    uint64_t a, b;
    VIP_MEM_HANDLE ha, hb;
};

/* What the test asks the target to check. */
struct rcheck {
    int kind; /* CK_* */
    uint32_t off, len, seed, imm;
};

enum {
    CK_A_PATTERN = 1, /* A[off, off+len) holds pattern(seed) */
    CK_A_ORIGINAL,    /* A[off, off+len) still holds its pattern 55 */
    CK_B_ZERO,        /* B is untouched */
    CK_REMOTE_WRITE,  /* a receive completes for a remote write with imm; then CK_A_PATTERN */
    CK_SEND_THEN_A,   /* a send arrives; then CK_A_PATTERN (the write before it is visible) */
    CK_SEND_OVERWRITE /* a send arrives; then A is overwritten with pattern 66 */
};

struct target {
    unsigned char *a, *b;
    VIP_MEM_HANDLE ha, hb;
};

static struct target tg;

static void prep_target(struct conn *x, void *arg)
{
    (void)arg;
    tg.a = region_new(&x->s, A_LEN, x->s.ptag, 1, 1, &tg.ha);
    tg.b = region_new(&x->s, B_LEN, x->s.ptag, 0, 0, &tg.hb);
    fill_pattern(tg.a, A_LEN, A_SEED);
    for (int i = 0; i < 4; i++)
        conn_post_recv(x, 64);
}

static void check_a_original(uint32_t off, uint32_t len)
{
    unsigned char *want = malloc(A_LEN);
    REQUIRE(want != NULL);
    fill_pattern(want, A_LEN, A_SEED);
    CHECKF(memcmp(tg.a + off, want + off, len) == 0, "target: A[%u, +%u) changed", (unsigned)off, (unsigned)len);
    free(want);
}

static void srv_target(struct conn *x, void *arg)
{
    (void)arg;
    struct regions r = {.a = (uint64_t)(uintptr_t)tg.a, .b = (uint64_t)(uintptr_t)tg.b, .ha = tg.ha, .hb = tg.hb};
    chan_send(x->c, T_INFO, &r, sizeof r);
    for (;;) {
        struct rcheck ck;
        memset(&ck, 0, sizeof ck);
        int tag = chan_recv_pump(x->c, x->vi, 15000, &ck, sizeof ck);
        if (tag != T_CHECK) {
            CHECKF(tag == T_END, "target: expected a check or the end, got %d", tag);
            return;
        }
        VIP_DESCRIPTOR *d;
        switch (ck.kind) {
        case CK_REMOTE_WRITE:
            d = RECV_WAIT(x->vi, 5000);
            if (d) {
                CHECK_STATUS(d, VIP_STATUS_OP_REMOTE_RDMA_WRITE, 0, 1);
                CHECK_EQ(d->CS.ImmediateData, ck.imm);
                d->CS.Status = 0;
                CHECK_RET(VipPostRecv(x->vi, d, x->s.mh), VIP_SUCCESS);
            }
            CHECKF(check_pattern(tg.a + ck.off, ck.len, ck.seed) < 0,
                   "target: A[%u, +%u) does not hold the written bytes", (unsigned)ck.off, (unsigned)ck.len);
            break;
        case CK_SEND_THEN_A:
        case CK_SEND_OVERWRITE:
            d = RECV_WAIT(x->vi, 5000);
            if (d) {
                CHECK_STATUS(d, VIP_STATUS_OP_RECEIVE, 0, 0);
                d->CS.Status = 0;
                CHECK_RET(VipPostRecv(x->vi, d, x->s.mh), VIP_SUCCESS);
            }
            if (ck.kind == CK_SEND_OVERWRITE)
                fill_pattern(tg.a, A_LEN, 66);
            else
                CHECKF(check_pattern(tg.a + ck.off, ck.len, ck.seed) < 0,
                       "target: a send arrived before the RDMA write posted ahead of it was visible");
            break;
        case CK_A_PATTERN: {
            /* A write completes at the initiator when the level says; on
             * the unreliable level that may be before it is placed here. */
            long long end = now_ms() + 2000;
            while (check_pattern(tg.a + ck.off, ck.len, ck.seed) >= 0 && now_ms() < end)
                pump(x->vi, 2);
            CHECKF(check_pattern(tg.a + ck.off, ck.len, ck.seed) < 0,
                   "target: A[%u, +%u) does not hold the written bytes (first difference at %ld)", (unsigned)ck.off,
                   (unsigned)ck.len, check_pattern(tg.a + ck.off, ck.len, ck.seed));
            break;
        }
        case CK_A_ORIGINAL:
            check_a_original(ck.off, ck.len);
            break;
        case CK_B_ZERO: {
            int zero = 1;
            for (int i = 0; i < B_LEN; i++)
                zero &= tg.b[i] == 0;
            CHECKF(zero, "target: region B (no RDMA enabled) was written");
            break;
        }
        }
        chan_send(x->c, T_DONE, NULL, 0);
    }
}

/* Asks the target to check; waits for it. */
static void ask(struct conn *x, int kind, uint32_t off, uint32_t len, uint32_t seed, uint32_t imm)
{
    struct rcheck ck = {.kind = kind, .off = off, .len = len, .seed = seed, .imm = imm};
    chan_send(x->c, T_CHECK, &ck, sizeof ck);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
}

static void open_target(struct pair *pr, VIP_RELIABILITY_LEVEL level, int read, int srv_no_rdma, struct regions *r)
{
    struct pair_cfg cfg = {.level = level, .rdma_write = 1, .rdma_read = read, .srv_no_rdma = srv_no_rdma,
                           .prepare = prep_target, .server = srv_target};
    pair_open(pr, &cfg);
    memset(r, 0, sizeof *r);
    if (CHAN_EXPECT(pr->x.c, 10000, T_INFO, r, sizeof *r) != 0)
        h_finish();
}

static void close_target(struct pair *pr)
{
    chan_send(pr->x.c, T_END, NULL, 0);
    pair_close(pr);
}

/* An RDMA descriptor: the address segment, then the local segments. */
static VIP_DESCRIPTOR *rdma_desc(struct side *s, uint16_t op, uint64_t raddr, VIP_MEM_HANDLE rh, int nlocal)
{
    VIP_DESCRIPTOR *d = desc_new(s, 1 + nlocal);
    d->CS.Control = op;
    d->CS.SegCount = (VIP_UINT16)(1 + nlocal);
    set_remote(d, 0, raddr, rh);
    return d;
}

static VIP_DESCRIPTOR *post_and_wait(struct conn *x, VIP_DESCRIPTOR *d)
{
    if (CHECK_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS) != VIP_SUCCESS)
        return NULL;
    VIP_DESCRIPTOR *got = SEND_WAIT(x->vi, 5000);
    CHECK(got == d);
    return got;
}

static void require_read(VIP_RELIABILITY_LEVEL level)
{
    require_level(level);
    if (!(g_nic.RDMAReadSupport & level))
        h_skip("the NIC does not claim RDMA read at %s (RDMAReadSupport 0x%x)", level_name(level),
               (unsigned)g_nic.RDMAReadSupport);
}

/* ---- RDMA write ---------------------------------------------------------------------- */

static void t_write(int level)
{
    require_level((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct regions r;
    open_target(&pr, (VIP_RELIABILITY_LEVEL)level, 0, 0, &r);
    struct conn *x = &pr.x;
    /* One local segment. */
    VIP_DESCRIPTOR *d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAWRITE, r.a, r.ha, 1);
    void *src = arena_take(&x->s, 100);
    fill_pattern(src, 100, 11);
    set_local(d, 1, src, x->s.mh, 100);
    VIP_DESCRIPTOR *got = post_and_wait(x, d);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_WRITE, 0, 0);
    ask(x, CK_A_PATTERN, 0, 100, 11, 0);
    ask(x, CK_A_ORIGINAL, 100, A_LEN - 100, 0, 0);
    /* Two local segments gathered into one remote range, at an offset. */
    unsigned char all[120];
    fill_pattern(all, sizeof all, 12);
    unsigned char *p1 = arena_take(&x->s, 50), *p2 = arena_take(&x->s, 70);
    memcpy(p1, all, 50);
    memcpy(p2, all + 50, 70);
    d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAWRITE, r.a + 1000, r.ha, 2);
    set_local(d, 1, p1, x->s.mh, 50);
    set_local(d, 2, p2, x->s.mh, 70);
    got = post_and_wait(x, d);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_WRITE, 0, 0);
    ask(x, CK_A_PATTERN, 1000, 120, 12, 0);
    ask(x, CK_A_ORIGINAL, 1120, 1000, 0, 0);
    /* A larger write, into the end of the region. */
    void *big = arena_take(&x->s, 6000);
    fill_pattern(big, 6000, 13);
    d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAWRITE, r.a + A_LEN - 6000, r.ha, 1);
    set_local(d, 1, big, x->s.mh, 6000);
    got = post_and_wait(x, d);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_WRITE, 0, 0);
    ask(x, CK_A_PATTERN, A_LEN - 6000, 6000, 13, 0);
    ask(x, CK_B_ZERO, 0, 0, 0, 0);
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    close_target(&pr);
}

static void t_write_immediate(int arg)
{
    (void)arg;
    struct pair pr;
    struct regions r;
    open_target(&pr, default_level(), 0, 0, &r);
    struct conn *x = &pr.x;
    VIP_DESCRIPTOR *d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, r.a + 2000, r.ha, 1);
    d->CS.ImmediateData = 0xBEEF0042u;
    void *src = arena_take(&x->s, 64);
    fill_pattern(src, 64, 21);
    set_local(d, 1, src, x->s.mh, 64);
    VIP_DESCRIPTOR *got = post_and_wait(x, d);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_WRITE, 0, -1);
    ask(x, CK_REMOTE_WRITE, 2000, 64, 21, 0xBEEF0042u);
    /* Immediate data alone: no local segment. */
    d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, r.a, r.ha, 0);
    d->CS.ImmediateData = 7;
    got = post_and_wait(x, d);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_WRITE, 0, -1);
    ask(x, CK_REMOTE_WRITE, 0, 0, 0, 7);
    close_target(&pr);
}

static void t_write_then_send(int level)
{
    require_level((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct regions r;
    open_target(&pr, (VIP_RELIABILITY_LEVEL)level, 0, 0, &r);
    struct conn *x = &pr.x;
    /* Posted back to back: the send must not overtake the write. */
    VIP_DESCRIPTOR *w = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAWRITE, r.a + 512, r.ha, 1);
    void *src = arena_take(&x->s, 3000);
    fill_pattern(src, 3000, 31);
    set_local(w, 1, src, x->s.mh, 3000);
    VIP_DESCRIPTOR *s = send_desc(&x->s, "after", 5, 0);
    struct rcheck ck = {.kind = CK_SEND_THEN_A, .off = 512, .len = 3000, .seed = 31};
    chan_send(x->c, T_CHECK, &ck, sizeof ck);
    CHECK_RET(VipPostSend(x->vi, w, x->s.mh), VIP_SUCCESS);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    VIP_DESCRIPTOR *got = SEND_WAIT(x->vi, 5000);
    CHECK(got == w);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_WRITE, 0, 0);
    got = SEND_WAIT(x->vi, 5000);
    CHECK(got == s);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    close_target(&pr);
}

/* ---- RDMA read --------------------------------------------------------------------------- */

static void t_read(int level)
{
    require_read((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct regions r;
    open_target(&pr, (VIP_RELIABILITY_LEVEL)level, 1, 0, &r);
    struct conn *x = &pr.x;
    unsigned char *want = malloc(A_LEN);
    REQUIRE(want != NULL);
    fill_pattern(want, A_LEN, A_SEED);
    /* One local segment. */
    VIP_DESCRIPTOR *d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAREAD, r.a + 100, r.ha, 1);
    unsigned char *dst = arena_take(&x->s, 256);
    set_local(d, 1, dst, x->s.mh, 200);
    VIP_DESCRIPTOR *got = post_and_wait(x, d);
    if (got) {
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_READ, 0, 0);
        CHECKF(memcmp(dst, want + 100, 200) == 0, "RDMA read returned the wrong bytes");
        CHECKF(dst[200] == 0, "RDMA read wrote past its local segment");
    }
    /* Scattered into two local segments. */
    unsigned char *d1 = arena_take(&x->s, 64), *d2 = arena_take(&x->s, 200);
    d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAREAD, r.a + 4000, r.ha, 2);
    set_local(d, 1, d1, x->s.mh, 64);
    set_local(d, 2, d2, x->s.mh, 136);
    got = post_and_wait(x, d);
    if (got) {
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_READ, 0, 0);
        CHECKF(memcmp(d1, want + 4000, 64) == 0 && memcmp(d2, want + 4064, 136) == 0,
               "RDMA read scattered the wrong bytes");
    }
    /* The whole region. */
    unsigned char *all = arena_take(&x->s, A_LEN);
    d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAREAD, r.a, r.ha, 1);
    set_local(d, 1, all, x->s.mh, A_LEN);
    got = post_and_wait(x, d);
    if (got) {
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_READ, 0, 0);
        CHECKF(memcmp(all, want, A_LEN) == 0, "RDMA read of the whole region returned the wrong bytes");
    }
    /* Reading changed nothing there. */
    ask(x, CK_A_ORIGINAL, 0, A_LEN, 0, 0);
    CHECK_STATE(x->vi, VIP_STATE_CONNECTED);
    free(want);
    close_target(&pr);
}

/* A read, then a fenced send that makes the target overwrite what was
 * read: the read must see the bytes from before. */
static void t_fence(int level)
{
    require_read((VIP_RELIABILITY_LEVEL)level);
    struct pair pr;
    struct regions r;
    open_target(&pr, (VIP_RELIABILITY_LEVEL)level, 1, 0, &r);
    struct conn *x = &pr.x;
    struct rcheck ck = {.kind = CK_SEND_OVERWRITE};
    chan_send(x->c, T_CHECK, &ck, sizeof ck);
    VIP_DESCRIPTOR *rd = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAREAD, r.a, r.ha, 1);
    unsigned char *dst = arena_take(&x->s, A_LEN);
    set_local(rd, 1, dst, x->s.mh, A_LEN);
    VIP_DESCRIPTOR *s = send_desc(&x->s, "overwrite", 9, 0);
    s->CS.Control |= VIP_CONTROL_QFENCE;
    CHECK_RET(VipPostSend(x->vi, rd, x->s.mh), VIP_SUCCESS);
    CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
    VIP_DESCRIPTOR *got = SEND_WAIT(x->vi, 5000);
    CHECK(got == rd);
    if (got) {
        CHECK_STATUS(got, VIP_STATUS_OP_RDMA_READ, 0, 0);
        CHECKF(check_pattern(dst, A_LEN, A_SEED) < 0, "the read saw bytes the fenced send's receiver wrote later");
    }
    got = SEND_WAIT(x->vi, 5000);
    CHECK(got == s);
    if (got)
        CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    close_target(&pr);
}

/* ---- The target's protection checks ------------------------------------------------------ */

enum { BAD_REGION, BAD_BOUNDS, BAD_HANDLE, BAD_VI };

static void protection(int op, int bad)
{
    VIP_RELIABILITY_LEVEL level = default_level();
    if (op == VIP_CONTROL_OP_RDMAREAD) {
        static const VIP_RELIABILITY_LEVEL pref[3] = {VIP_SERVICE_RELIABLE_DELIVERY, VIP_SERVICE_RELIABLE_RECEPTION,
                                                      VIP_SERVICE_UNRELIABLE};
        level = 0;
        for (int i = 0; i < 3 && !level; i++)
            if (g_nic.RDMAReadSupport & pref[i])
                level = pref[i];
        if (!level)
            h_skip("the NIC claims no RDMA read (RDMAReadSupport 0x%x)", (unsigned)g_nic.RDMAReadSupport);
    }
    struct pair pr;
    struct regions r;
    open_target(&pr, level, op == VIP_CONTROL_OP_RDMAREAD, bad == BAD_VI, &r);
    struct conn *x = &pr.x;
    uint64_t addr = r.a;
    VIP_MEM_HANDLE h = r.ha;
    uint32_t len = 100;
    switch (bad) {
    case BAD_REGION:
        addr = r.b, h = r.hb;
        break;
    case BAD_BOUNDS:
        addr = r.a + A_LEN - 10;
        break;
    case BAD_HANDLE:
        h = r.ha ^ 0x5a5a0000u;
        break;
    }
    VIP_DESCRIPTOR *d = rdma_desc(&x->s, (uint16_t)op, addr, h, 1);
    void *buf = arena_take(&x->s, len);
    fill_pattern(buf, len, 41);
    set_local(d, 1, buf, x->s.mh, len);
    VIP_RETURN ret = VipPostSend(x->vi, d, x->s.mh);
    if (bad == BAD_VI && ret == VIP_DESCRIPTOR_ERROR) {
        /* The peer's VI attributes came with the connection: a provider may
         * know at the post that the descriptor cannot be carried out (vipl.h:
         * refused, with the reason's status bits). */
        CHECK_REFUSED(d, VIP_STATUS_RDMA_PROT_ERROR);
    } else {
        CHECKF(ret == VIP_SUCCESS,
               "posting an RDMA %s the target refuses: expected VIP_SUCCESS (the target checks)%s, got %s",
               op == VIP_CONTROL_OP_RDMAREAD ? "read" : "write",
               bad == BAD_VI ? " or VIP_DESCRIPTOR_ERROR with RDMA_PROT_ERROR" : "", vip_ret_name(ret));
    }
    if (ret == VIP_SUCCESS) {
        VIP_DESCRIPTOR *got = SEND_WAIT(x->vi, 5000);
        CHECK(got == d);
        if (got)
            CHECK_STATUS(got, op == VIP_CONTROL_OP_RDMAREAD ? VIP_STATUS_OP_RDMA_READ : VIP_STATUS_OP_RDMA_WRITE,
                         VIP_STATUS_RDMA_PROT_ERROR, 0);
    }
    /* Nothing was written there; nothing was read into here. */
    ask(x, CK_B_ZERO, 0, 0, 0, 0);
    ask(x, CK_A_ORIGINAL, 0, A_LEN, 0, 0);
    if (op == VIP_CONTROL_OP_RDMAREAD)
        CHECKF(check_pattern(buf, len, 41) < 0, "a refused RDMA read changed the local buffer");
    close_target(&pr);
}

static void t_write_prot(int bad)
{
    protection(VIP_CONTROL_OP_RDMAWRITE, bad);
}

static void t_read_prot(int bad)
{
    protection(VIP_CONTROL_OP_RDMAREAD, bad);
}

/* ---- A target that sleeps ------------------------------------------------------------- */

/*
 * VIA's RDMA is one-sided: the target's program need not call the library
 * for an RDMA write or read, or a send into a receive it posted, to
 * complete at the initiator. The target here posts its receives, tells
 * the test where its regions are, then sleeps in a blocking read of its
 * pipe to the test; it checks its memory and its receives after it wakes.
 *
 * Region S (RDMA write and read enabled):
 *   [0, 64K)        written by the test (pattern 71)
 *   [64K, 128K)     pattern 77, read by the test
 *   [128K, +100)    a small write (pattern 72)
 *   [150K, +4096)   a write with immediate data (pattern 73)
 * Receives: 40000 bytes (a send of pattern 74), 64 (8 bytes of 75), 64 (the
 * write with immediate data).
 */
#define S_LEN (192u << 10)
#define S_READ (64u << 10)
#define S_SMALL (128u << 10)
#define S_IMM (150u << 10)
#define SLEEP_IMM 0xC0FFEEu

struct sleeper {
    unsigned char *s, *b;
    VIP_MEM_HANDLE hs, hb;
};

static struct sleeper sl;

static void prep_sleeper(struct conn *x, void *arg)
{
    (void)arg;
    sl.s = region_new(&x->s, S_LEN, x->s.ptag, 1, 1, &sl.hs);
    sl.b = region_new(&x->s, B_LEN, x->s.ptag, 0, 0, &sl.hb);
    memset(sl.s, 0, S_LEN);
    fill_pattern(sl.s + S_READ, 64u << 10, 77);
    conn_post_recv(x, 40000);
    conn_post_recv(x, 64);
    conn_post_recv(x, 64);
}

static void srv_sleeper(struct conn *x, void *arg)
{
    int violation = arg != NULL;
    struct regions r = {.a = (uint64_t)(uintptr_t)sl.s, .b = (uint64_t)(uintptr_t)sl.b, .ha = sl.hs, .hb = sl.hb};
    chan_send(x->c, T_INFO, &r, sizeof r);
    /* Asleep: no call into the library until the test is done. */
    int tag = chan_recv(x->c, 20000, NULL, 0, NULL);
    CHECKF(tag == T_CHECK, "target: expected the test's wake-up, got %d", tag);
    int zero = 1;
    for (unsigned i = 0; i < B_LEN; i++)
        zero &= sl.b[i] == 0;
    CHECKF(zero, "target: region B (no RDMA enabled) was written");
    if (!violation) {
        CHECKF(check_pattern(sl.s, 64u << 10, 71) < 0, "target: the 64 KiB RDMA write is not in S");
        CHECKF(check_pattern(sl.s + S_READ, 64u << 10, 77) < 0, "target: the RDMA read changed S");
        CHECKF(check_pattern(sl.s + S_SMALL, 100, 72) < 0, "target: the small RDMA write is not in S");
        CHECKF(check_pattern(sl.s + S_IMM, 4096, 73) < 0, "target: the write with immediate data is not in S");
        /* Done while this process slept: taken at once, no wait. */
        static const uint32_t lens[3] = {40000, 8, 4096};
        for (int i = 0; i < 3; i++) {
            VIP_DESCRIPTOR *d = NULL;
            VIP_RETURN ret = VipRecvDone(x->vi, &d);
            CHECKF(ret == VIP_SUCCESS && d == x->pre[i],
                   "target: receive %d did not complete while the target slept: VipRecvDone returned %s", i,
                   vip_ret_name(ret));
            if (ret != VIP_SUCCESS || !d)
                continue;
            CHECK_STATUS(d, i == 2 ? VIP_STATUS_OP_REMOTE_RDMA_WRITE : VIP_STATUS_OP_RECEIVE, 0, i == 2 ? 1 : 0);
            CHECK_EQ(d->CS.Length, lens[i]);
            if (i == 2)
                CHECK_EQ(d->CS.ImmediateData, SLEEP_IMM);
            else
                CHECKF(check_pattern(seg_buf(d, 0), lens[i], 74 + (unsigned)i) < 0,
                       "target: receive %d holds the wrong bytes", i);
        }
    }
    chan_send(x->c, T_DONE, NULL, 0);
}

/* An RDMA descriptor of one local segment of len bytes, from the arena,
 * posted and waited for: it must complete while the target sleeps. */
static VIP_DESCRIPTOR *sleeper_rdma(struct conn *x, uint16_t op, uint64_t raddr, VIP_MEM_HANDLE rh, uint32_t len,
                                    unsigned seed, const char *what)
{
    VIP_DESCRIPTOR *d = rdma_desc(&x->s, op, raddr, rh, 1);
    unsigned char *buf = arena_take(&x->s, len);
    if (seed)
        fill_pattern(buf, len, seed);
    set_local(d, 1, buf, x->s.mh, len);
    if (CHECK_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS) != VIP_SUCCESS)
        return NULL;
    VIP_DESCRIPTOR *got = NULL;
    VIP_RETURN ret = VipSendWait(x->vi, 5000, &got);
    CHECKF(ret == VIP_SUCCESS && got == d, "%s to a sleeping target did not complete within 5 s: %s", what,
           vip_ret_name(ret));
    return ret == VIP_SUCCESS ? got : NULL;
}

static void t_sleeping_target(int violation)
{
    VIP_RELIABILITY_LEVEL level = default_level();
    int read = (g_nic.RDMAReadSupport & level) != 0;
    struct pair pr;
    struct pair_cfg cfg = {.level = level, .rdma_write = 1, .rdma_read = read, .prepare = prep_sleeper,
                           .server = srv_sleeper, .arg = violation ? &sl : NULL};
    pair_open(&pr, &cfg);
    struct conn *x = &pr.x;
    struct regions r;
    memset(&r, 0, sizeof r);
    if (CHAN_EXPECT(x->c, 10000, T_INFO, &r, sizeof r) != 0)
        h_finish();
    VIP_DESCRIPTOR *d;
    if (violation) {
        d = sleeper_rdma(x, VIP_CONTROL_OP_RDMAWRITE, r.b, r.hb, 100, 41, "an RDMA write to a forbidden region");
        if (d)
            CHECK_STATUS(d, VIP_STATUS_OP_RDMA_WRITE, VIP_STATUS_RDMA_PROT_ERROR, 0);
    } else {
        /* After a step that does not complete, the rest would only fail
         * for it again: the target is woken at once. */
        d = sleeper_rdma(x, VIP_CONTROL_OP_RDMAWRITE, r.a, r.ha, 64u << 10, 71, "a 64 KiB RDMA write");
        if (!d)
            goto wake;
        CHECK_STATUS(d, VIP_STATUS_OP_RDMA_WRITE, 0, 0);
        if (read) {
            d = sleeper_rdma(x, VIP_CONTROL_OP_RDMAREAD, r.a + S_READ, r.ha, 64u << 10, 0, "a 64 KiB RDMA read");
            if (!d)
                goto wake;
            CHECK_STATUS(d, VIP_STATUS_OP_RDMA_READ, 0, 0);
            CHECKF(check_pattern(seg_buf(d, 1), 64u << 10, 77) < 0, "the RDMA read returned the wrong bytes");
        }
        d = sleeper_rdma(x, VIP_CONTROL_OP_RDMAWRITE, r.a + S_SMALL, r.ha, 100, 72, "a 100-byte RDMA write");
        if (!d)
            goto wake;
        CHECK_STATUS(d, VIP_STATUS_OP_RDMA_WRITE, 0, 0);
        static const uint32_t lens[2] = {40000, 8};
        for (int i = 0; i < 2; i++) {
            VIP_DESCRIPTOR *s = send_desc(&x->s, NULL, lens[i], 74 + (unsigned)i);
            CHECK_RET(VipPostSend(x->vi, s, x->s.mh), VIP_SUCCESS);
            VIP_DESCRIPTOR *got = NULL;
            VIP_RETURN ret = VipSendWait(x->vi, 5000, &got);
            CHECKF(ret == VIP_SUCCESS && got == s,
                   "a %u-byte send into a receive the sleeping target posted did not complete within 5 s: %s",
                   (unsigned)lens[i], vip_ret_name(ret));
            if (ret != VIP_SUCCESS)
                goto wake;
            CHECK_STATUS(got, VIP_STATUS_OP_SEND, 0, 0);
        }
        d = rdma_desc(&x->s, VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, r.a + S_IMM, r.ha, 1);
        d->CS.ImmediateData = SLEEP_IMM;
        unsigned char *src = arena_take(&x->s, 4096);
        fill_pattern(src, 4096, 73);
        set_local(d, 1, src, x->s.mh, 4096);
        CHECK_RET(VipPostSend(x->vi, d, x->s.mh), VIP_SUCCESS);
        VIP_DESCRIPTOR *got = NULL;
        VIP_RETURN ret = VipSendWait(x->vi, 5000, &got);
        CHECKF(ret == VIP_SUCCESS && got == d,
               "an RDMA write with immediate data to a sleeping target did not complete within 5 s: %s",
               vip_ret_name(ret));
        if (ret == VIP_SUCCESS)
            CHECK_STATUS(got, VIP_STATUS_OP_RDMA_WRITE, 0, -1);
    }
wake:
    /* Wake the target; it checks what it holds. */
    chan_send(x->c, T_CHECK, NULL, 0);
    CHAN_EXPECT(x->c, 10000, T_DONE, NULL, 0);
    pair_close(&pr);
}

#define L_UNREL VIP_SERVICE_UNRELIABLE
#define L_RD VIP_SERVICE_RELIABLE_DELIVERY
#define L_RR VIP_SERVICE_RELIABLE_RECEPTION

const struct test rdma_tests[] = {
    {"rdma", "write/unreliable", t_write, L_UNREL, 0},
    {"rdma", "write/reliable_delivery", t_write, L_RD, 0},
    {"rdma", "write/reliable_reception", t_write, L_RR, 0},
    {"rdma", "write_immediate", t_write_immediate, 0, 0},
    {"rdma", "write_then_send/reliable_delivery", t_write_then_send, L_RD, 0},
    {"rdma", "write_then_send/reliable_reception", t_write_then_send, L_RR, 0},
    {"rdma", "write_protection/region_not_enabled", t_write_prot, BAD_REGION, 0},
    {"rdma", "write_protection/out_of_bounds", t_write_prot, BAD_BOUNDS, 0},
    {"rdma", "write_protection/unknown_handle", t_write_prot, BAD_HANDLE, 0},
    {"rdma", "write_protection/vi_not_enabled", t_write_prot, BAD_VI, 0},
    {"rdma", "read/unreliable", t_read, L_UNREL, 0},
    {"rdma", "read/reliable_delivery", t_read, L_RD, 0},
    {"rdma", "read/reliable_reception", t_read, L_RR, 0},
    {"rdma", "read_then_fenced_send/reliable_delivery", t_fence, L_RD, 0},
    {"rdma", "read_then_fenced_send/reliable_reception", t_fence, L_RR, 0},
    {"rdma", "read_protection/region_not_enabled", t_read_prot, BAD_REGION, 0},
    {"rdma", "read_protection/out_of_bounds", t_read_prot, BAD_BOUNDS, 0},
    {"rdma", "read_protection/unknown_handle", t_read_prot, BAD_HANDLE, 0},
    {"rdma", "read_protection/vi_not_enabled", t_read_prot, BAD_VI, 0},
    {"rdma", "sleeping_target/transfers", t_sleeping_target, 0, 0},
    {"rdma", "sleeping_target/protection_violation", t_sleeping_target, 1, 0},
    {NULL, NULL, NULL, 0, 0},
};
