/*
 * Hostile arguments: every VIPL function that takes a handle, called with
 * handles that were never handles (NULL, small numbers, an address in no
 * mapping, a pointer to garbage bytes, a handle of each other kind), and
 * with sound handles but each pointer argument NULL (and memory to
 * register that is not mapped, or runs 1 TiB past its buffer); each call
 * in a forked child, so that a crash is seen as one. Each must return an
 * error, never VIP_SUCCESS, never crash or hang.
 */
#include "common.h"

#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* What a child gets to call with. */
struct world {
    struct side *s;
    VIP_VI_HANDLE vi;
    VIP_CQ_HANDLE cq;
    void *bad;
};

static void notify_vi(VIP_PVOID c, VIP_NIC_HANDLE n, VIP_VI_HANDLE v, VIP_DESCRIPTOR *d)
{
    (void)c, (void)n, (void)v, (void)d;
}

static void notify_cq(VIP_PVOID c, VIP_NIC_HANDLE n, VIP_VI_HANDLE v, VIP_BOOLEAN r)
{
    (void)c, (void)n, (void)v, (void)r;
}

static void on_error(VIP_PVOID c, VIP_ERROR_DESCRIPTOR *e)
{
    (void)c, (void)e;
}

/* CQ_OR_NONE: a CQ, or NULL for none. */
enum kind { NIC, PTAG, VI, CQ, CONN, CQ_OR_NONE };

/* The kind of handle call `k` takes in the argument under test. */
static const enum kind wants[] = {
    NIC, NIC, NIC, NIC, NIC, PTAG, NIC, PTAG, NIC, NIC,   /* 0-9 */
    NIC, NIC, PTAG, CQ_OR_NONE, CQ_OR_NONE, VI, VI, VI, VI, VI, /* 10-19 */
    VI, VI, VI, VI, VI, VI, NIC, CQ, CQ, CQ,              /* 20-29 */
    CQ, CQ, NIC, CONN, CONN, VI, VI, VI, VI, VI,          /* 30-39 */
    NIC, NIC, NIC, NIC, NIC,                              /* 40-44 */
};
enum { NCALLS = sizeof wants / sizeof wants[0] };

/* Calls function number `k` with the bad handle in its handle argument
 * (the others sound); returns what it returned, or -1 past the last. */
static long call(int k, struct world *w)
{
    void *b = w->bad;
    VIP_NIC_HANDLE nic = w->s->nic;
    VIP_NIC_ATTRIBUTES na;
    VIP_VI_ATTRIBUTES va = vi_attrs(w->s, default_level());
    VIP_MEM_ATTRIBUTES ma = {.Ptag = w->s->ptag};
    VIP_MEM_HANDLE mh = 0;
    VIP_PROTECTION_HANDLE p = NULL;
    VIP_VI_HANDLE v = NULL;
    VIP_CQ_HANDLE c = NULL;
    VIP_CONN_HANDLE conn = NULL;
    VIP_VI_STATE st;
    VIP_BOOLEAN e1, e2;
    VIP_DESCRIPTOR *d = NULL;
    VIP_DESCRIPTOR *desc = (VIP_DESCRIPTOR *)arena_take(w->s, sizeof(VIP_DESCRIPTOR));
    char *buf = arena_take(w->s, 64);
    VIP_NET_ADDRESS *local = addr_room(), *remote = addr_room();
    char name[64];
    VIP_ULONG name_len = sizeof name;
    switch (k) {
    case 0: return VipCloseNic(b);
    case 1: return VipQueryNic(b, &na);
    case 2: return VipErrorCallback(b, NULL, on_error);
    case 3: return VipCreatePtag(b, &p);
    case 4: return VipDestroyPtag(b, w->s->ptag);
    case 5: return VipDestroyPtag(nic, b);
    case 6: return VipRegisterMem(b, buf, 64, &ma, &mh);
    case 7: ma.Ptag = b; return VipRegisterMem(nic, buf, 64, &ma, &mh);
    case 8: return VipDeregisterMem(b, w->s->arena, w->s->mh);
    case 9: return VipQueryMem(b, w->s->arena, w->s->mh, &ma);
    case 10: return VipSetMemAttributes(b, w->s->arena, w->s->mh, &ma);
    case 11: return VipCreateVi(b, &va, NULL, NULL, &v);
    case 12: va.Ptag = b; return VipCreateVi(nic, &va, NULL, NULL, &v);
    case 13: return VipCreateVi(nic, &va, b, NULL, &v);
    case 14: return VipCreateVi(nic, &va, NULL, b, &v);
    case 15: return VipDestroyVi(b);
    case 16: return VipQueryVi(b, &st, &va, &e1, &e2);
    case 17: return VipSetViAttributes(b, &va);
    case 18: return VipPostSend(b, desc, w->s->mh);
    case 19: return VipSendDone(b, &d);
    case 20: return VipSendWait(b, 0, &d);
    case 21: return VipSendNotify(b, NULL, notify_vi);
    case 22: return VipPostRecv(b, desc, w->s->mh);
    case 23: return VipRecvDone(b, &d);
    case 24: return VipRecvWait(b, 0, &d);
    case 25: return VipRecvNotify(b, NULL, notify_vi);
    case 26: return VipCreateCQ(b, 4, &c);
    case 27: return VipDestroyCQ(b);
    case 28: return VipResizeCQ(b, 8);
    case 29: return VipCQDone(b, &v, &e1);
    case 30: return VipCQWait(b, 0, &v, &e1);
    case 31: return VipCQNotify(b, NULL, notify_cq);
    case 32: return VipConnectWait(b, local, 0, remote, &va, &conn);
    case 33: return VipConnectAccept(b, w->vi);
    case 34: return VipConnectReject(b);
    case 35: return VipConnectRequest(b, local, remote, 0, &va);
    case 36: return VipDisconnect(b);
    case 37: return VipConnectPeerRequest(b, local, remote, 0);
    case 38: return VipConnectPeerDone(b, &va);
    case 39: return VipConnectPeerWait(b, &va);
    case 40: return VipNSInit(b, NULL);
    case 41: return VipNSGetHostByName(b, "localhost", remote, 0);
    case 42: return VipNSGetHostByAddr(b, remote, name, &name_len);
    case 43: return VipNSShutdown(b);
    case 44: return VipQuerySystemManagementInfo(b, VIP_SMI_AUTODISCOVERY, NULL);
    default: return -1;
    }
}

/* Calls function number `k` with sound handles and one pointer argument
 * NULL (or memory that cannot be registered); returns what it returned,
 * or -1 past the last. */
static long call_null(int k, struct world *w)
{
    VIP_NIC_HANDLE nic = w->s->nic;
    VIP_VI_HANDLE vi = w->vi;
    VIP_CQ_HANDLE cq = w->cq;
    VIP_NIC_ATTRIBUTES na;
    VIP_VI_ATTRIBUTES va = vi_attrs(w->s, default_level());
    VIP_MEM_ATTRIBUTES ma = {.Ptag = w->s->ptag};
    VIP_MEM_HANDLE mh = 0;
    VIP_PROTECTION_HANDLE p = NULL;
    VIP_VI_HANDLE v = NULL;
    VIP_CQ_HANDLE c = NULL;
    VIP_CONN_HANDLE conn = NULL;
    VIP_VI_STATE st;
    VIP_BOOLEAN e1, e2;
    char *buf = arena_take(w->s, 64);
    VIP_NET_ADDRESS *local = addr_room(), *remote = addr_room();
    char name[64];
    VIP_ULONG name_len = sizeof name;
    (void)na, (void)p, (void)c;
    switch (k) {
    case 0: return VipOpenNic(g_device, NULL);
    case 45: return VipOpenNic(NULL, (VIP_NIC_HANDLE *)buf);
    case 1: return VipQueryNic(nic, NULL);
    case 2: return VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, NULL);
    case 3: return VipCreatePtag(nic, NULL);
    case 4: return VipRegisterMem(nic, NULL, 64, &ma, &mh);
    case 5: return VipRegisterMem(nic, buf, 64, NULL, &mh);
    case 6: return VipRegisterMem(nic, buf, 64, &ma, NULL);
    case 7: return VipRegisterMem(nic, w->bad, 4096, &ma, &mh); /* unmapped */
    case 8: return VipRegisterMem(nic, buf, (VIP_ULONG)1 << 40, &ma, &mh);
    case 9: return VipQueryMem(nic, w->s->arena, w->s->mh, NULL);
    case 10: return VipSetMemAttributes(nic, w->s->arena, w->s->mh, NULL);
    case 11: return VipCreateVi(nic, NULL, NULL, NULL, &v);
    case 12: return VipCreateVi(nic, &va, NULL, NULL, NULL);
    case 13: return VipQueryVi(vi, NULL, &va, &e1, &e2);
    case 14: return VipQueryVi(vi, &st, NULL, &e1, &e2);
    case 15: return VipQueryVi(vi, &st, &va, NULL, &e2);
    case 16: return VipQueryVi(vi, &st, &va, &e1, NULL);
    case 17: return VipSetViAttributes(vi, NULL);
    case 18: return VipPostSend(vi, NULL, w->s->mh);
    case 19: return VipSendDone(vi, NULL);
    case 20: return VipSendWait(vi, 0, NULL);
    case 21: return VipPostRecv(vi, NULL, w->s->mh);
    case 22: return VipRecvDone(vi, NULL);
    case 23: return VipRecvWait(vi, 0, NULL);
    case 24: return VipCreateCQ(nic, 4, NULL);
    case 25: return VipCQDone(cq, NULL, &e1);
    case 26: return VipCQDone(cq, &v, NULL);
    case 27: return VipCQWait(cq, 0, NULL, &e1);
    case 28: return VipCQWait(cq, 0, &v, NULL);
    case 29: return VipConnectWait(nic, NULL, 0, remote, &va, &conn);
    case 30: return VipConnectWait(nic, local, 0, NULL, &va, &conn);
    case 31: return VipConnectWait(nic, local, 0, remote, NULL, &conn);
    case 32: return VipConnectWait(nic, local, 0, remote, &va, NULL);
    case 33: return VipConnectRequest(vi, NULL, remote, 0, &va);
    case 34: return VipConnectRequest(vi, local, NULL, 0, &va);
    case 35: return VipConnectRequest(vi, local, remote, 0, NULL);
    case 36: return VipConnectPeerRequest(vi, NULL, remote, 0);
    case 37: return VipConnectPeerRequest(vi, local, NULL, 0);
    case 38: return VipConnectPeerDone(vi, NULL);
    case 39: return VipConnectPeerWait(vi, NULL);
    case 40: return VipNSGetHostByName(nic, NULL, remote, 0);
    case 41: return VipNSGetHostByName(nic, "localhost", NULL, 0);
    case 42: return VipNSGetHostByAddr(nic, NULL, name, &name_len);
    case 43: return VipNSGetHostByAddr(nic, remote, NULL, &name_len);
    case 44: return VipNSGetHostByAddr(nic, remote, name, NULL);
    default: return -1;
    }
}
enum { NNULLS = 46 };

/* Runs `fn(k)` in a child; NULL if it returned an error, else what went wrong. */
static const char *in_child(long (*fn)(int, struct world *), int k, struct world *w, long *ret)
{
    int fd[2];
    if (pipe(fd) != 0)
        return "pipe";
    pid_t pid = fork();
    if (pid < 0)
        return "fork";
    if (pid == 0) {
        close(fd[0]);
        alarm(5);
        long r = fn(k, w);
        if (write(fd[1], &r, sizeof r) != sizeof r)
            _exit(3);
        _exit(0);
    }
    close(fd[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    ssize_t n = read(fd[0], ret, sizeof *ret);
    close(fd[0]);
    if (WIFSIGNALED(status))
        return WTERMSIG(status) == SIGALRM ? "hung (5 s)" : strsignal(WTERMSIG(status));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || n != sizeof *ret)
        return "exited without an answer";
    if (*ret == VIP_SUCCESS)
        return "returned VIP_SUCCESS";
    return NULL;
}

static void t_made_up_handles(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    struct world w = {.s = &s};
    REQUIRE_RET(VipCreateCQ(s.nic, 4, &w.cq), VIP_SUCCESS);
    w.vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    /* An address in no mapping, and bytes of garbage where a handle
     * would point. */
    long page = sysconf(_SC_PAGESIZE);
    void *gone = mmap(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(gone != MAP_FAILED);
    munmap(gone, page);
    static unsigned char garbage[256];
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (unsigned char)(i * 37 + 11);
    struct {
        const char *what;
        void *h;
        int kind; /* -1: never a handle */
    } bad[] = {
        {"NULL", NULL, -1},
        {"1", (void *)1, -1},
        {"0xdeadbeef", (void *)0xdeadbeef, -1},
        {"an unmapped address", gone, -1},
        {"a pointer to garbage", garbage, -1},
        {"the ptag", s.ptag, PTAG},
        {"the CQ", w.cq, CQ},
        {"the VI", w.vi, VI},
        {"the NIC", s.nic, NIC},
    };
    CHECK_EQ(call(NCALLS, &w), -1);
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        w.bad = bad[b].h;
        for (int k = 0; k < NCALLS; k++) {
            /* A handle of the kind the call wants is a sound call,
             * tested elsewhere (and one that needs the library's thread,
             * which a forked child has not). */
            int sound = bad[b].kind == (int)wants[k] ||
                        (wants[k] == CQ_OR_NONE && (bad[b].kind == CQ || bad[b].h == NULL));
            if (sound)
                continue;
            long ret = 0;
            const char *why = in_child(call, k, &w, &ret);
            CHECKF(why == NULL, "call %d with %s as its handle: %s (returned %ld)", k, bad[b].what,
                   why, ret);
        }
    }
    /* Sound handles, one pointer NULL (or memory that is not there). */
    w.bad = gone;
    CHECK_EQ(call_null(NNULLS, &w), -1);
    for (int k = 0; k < NNULLS; k++) {
        long ret = 0;
        const char *why = in_child(call_null, k, &w, &ret);
        CHECKF(why == NULL, "call %d with a NULL or unmapped pointer: %s (returned %ld)", k, why, ret);
    }
    /* Nothing the children did reached this process. */
    VIP_NIC_ATTRIBUTES a;
    CHECK_RET(VipQueryNic(s.nic, &a), VIP_SUCCESS);
    CHECK_RET(vi_destroy(&s, w.vi), VIP_SUCCESS);
    CHECK_RET(VipDestroyCQ(w.cq), VIP_SUCCESS);
    side_close(&s);
}

/* A descriptor still in a queue cannot be posted again, on either queue
 * of any VI; once handed back it can. */
static void t_posted_twice(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_VI_HANDLE other = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_DESCRIPTOR *d = recv_desc(&s, 64);
    REQUIRE_RET(VipPostRecv(vi, d, s.mh), VIP_SUCCESS);
    CHECK_RET(VipPostRecv(vi, d, s.mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipPostRecv(other, d, s.mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipPostSend(vi, d, s.mh), VIP_INVALID_PARAMETER);
    /* Still queued once: the destroy refuses a VI with work queued. */
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES va;
    VIP_BOOLEAN sq_empty, rq_empty;
    CHECK_RET(VipQueryVi(vi, &st, &va, &sq_empty, &rq_empty), VIP_SUCCESS);
    CHECK(!rq_empty);
    CHECK_RET(vi_destroy(&s, other), VIP_SUCCESS);
    side_close(&s);
}

const struct test hostile_tests[] = {
    {"hostile", "made_up_handles_and_null_pointers", t_made_up_handles, 0, 120},
    {"hostile", "posted_twice", t_posted_twice, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
