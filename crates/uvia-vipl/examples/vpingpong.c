/*
 * vpingpong.c: one-way latency and bandwidth of a VIA provider, over VIPL.
 *
 * The ping-pong program of the source documents, rebuilt on the VIPL API: a
 * client sends a message, the server sends one of the same size back, and
 * half of each round trip is one sample of the one-way latency. For every
 * message size it prints the median and 99th percentile of those samples and
 * the bandwidth one message of that size achieves (size / median one-way).
 *
 *     vpingpong server [options]          the echoing side
 *     vpingpong client HOST [options]     the measuring side; HOST is looked
 *                                         up with VipNSGetHostByName
 *     vpingpong local [options]           both on this host: forks the server
 *
 * It measures what `uvia pingpong` measures, the same way, so that the two
 * can be compared: the same default sizes, round trips and warm-up; receives
 * kept posted ahead, all into one registered receive buffer; sends from one
 * registered send buffer, their completions taken back every 16 sends (off
 * the message's path) or when 64 are outstanding; a receiver that polls
 * VipRecvDone (--spin, the default), waits in VipRecvWait (--block), or (--cq)
 * has both queues bound to a CQ and waits in VipCQWait, then takes the
 * descriptor the notice names with VipRecvDone or VipSendDone; each
 * round trip timed on its own with the CPU's time stamp counter read between
 * load fences (on x86-64; elsewhere, and with --clock mono,
 * clock_gettime(CLOCK_MONOTONIC)); nearest-rank median and 99th percentile.
 * The server replies with its own buffer (bytes 0x3c); the client checks the
 * length of every reply and the bytes of the last.
 *
 * With --rdma-write the messages go the way VIA-era one-sided libraries move
 * them: each side RDMA-writes the message into the other's registered
 * receive buffer with immediate data, which completes one of the receives
 * the other keeps posted (VIP_STATUS_OP_REMOTE_RDMA_WRITE, the length in
 * CS.Length); the two learn each other's buffer from one send each after
 * connecting.
 *
 * Build:  cc -std=c11 -Wall -Wextra -O2 vpingpong.c $(pkg-config --cflags --libs vipl)
 * Run:    ./vpingpong local -s 8,1K,64K
 */
#define _GNU_SOURCE

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#define HAVE_TSC 1
#else
#define HAVE_TSC 0
#endif

#include <vipl.h>

#if defined(__GNUC__)
#define COLD __attribute__((cold, noinline))
#define NORETURN __attribute__((noreturn))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define COLD
#define NORETURN
#define ALWAYS_INLINE inline
#define UNLIKELY(x) (x)
#endif

static const char *prog = "vpingpong";

/* ---- what both sides agree on ------------------------------------------- */

#define MAX_SIZES 64
#define MAX_MESSAGE (64UL << 20)
/* Send completions are taken back every REAP_EVERY sends; at most SEND_DESCS
 * sends are outstanding; RECV_AHEAD receives stay posted. */
#define REAP_EVERY 16
#define SEND_DESCS 64
#define RECV_AHEAD 16
/* --cq: room for a notice of every descriptor the VI can hold. */
#define CQ_ENTRIES (SEND_DESCS + RECV_AHEAD)
/* What the server's replies carry. */
#define REPLY_BYTE 0x3c
/* Immediate data of the client's last message: the run is over. */
#define END_MARK 0x454e4421u
/* Waits that should never take this long (ms). */
#define WAIT_MS 30000

static const char *const DEFAULT_SIZES = "1,8,64,256,1K,4K,16K,64K,256K,1M";

struct opts {
    const char *device;
    const char *disc;
    size_t sizes[MAX_SIZES];
    int nsizes;
    unsigned long iters;  /* 0: by size, as uvia pingpong */
    long warmup;          /* -1: a tenth of the round trips, 10 to 10,000 */
    int block;            /* VipRecvWait instead of polling VipRecvDone */
    int rdma;             /* --rdma-write: RDMA write with immediate data */
    int cq;               /* both queues bound to a CQ, waits in VipCQWait */
    VIP_RELIABILITY_LEVEL reliability;
    int json;
    int tsc;              /* time with the time stamp counter */
    int pin;
    int cpu_self;         /* client/server mode: this process's core, -1 none */
    int cpu_client, cpu_server; /* local mode */
    VIP_ULONG connect_ms;
};

/* ---- errors --------------------------------------------------------------- */

static const char *vip_name(VIP_RETURN r)
{
    static const char *const names[] = {
        "VIP_SUCCESS", "VIP_NOT_DONE", "VIP_INVALID_PARAMETER", "VIP_ERROR_RESOURCE",
        "VIP_TIMEOUT", "VIP_REJECT", "VIP_INVALID_RELIABILITY_LEVEL", "VIP_INVALID_MTU",
        "VIP_INVALID_QOS", "VIP_INVALID_PTAG", "VIP_INVALID_RDMAREAD",
        "VIP_DESCRIPTOR_ERROR", "VIP_INVALID_STATE", "VIP_ERROR_NAMESERVICE",
        "VIP_NO_MATCH", "VIP_NOT_REACHABLE", "VIP_ERROR_NOT_SUPPORTED",
    };
    if ((unsigned)r < sizeof names / sizeof names[0])
        return names[r];
    return "(unknown VIP_RETURN)";
}

static const char *role = "client"; /* for messages: which side failed */

static COLD NORETURN void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s %s: ", prog, role);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static COLD NORETURN void die_vip(const char *call, VIP_RETURN r, const char *what)
{
    /* `call` may be the whole call as written: name the function only. */
    die("%.*s failed: %s (%d)%s%s", (int)strcspn(call, "("), call, vip_name(r), (int)r,
        what ? ": " : "", what ? what : "");
}

#define CHECK(call, what)                           \
    do {                                            \
        VIP_RETURN rc_ = (call);                    \
        if (UNLIKELY(rc_ != VIP_SUCCESS))           \
            die_vip(#call, rc_, (what));            \
    } while (0)

static COLD NORETURN void die_status(const char *what, VIP_UINT32 st)
{
    static const struct { VIP_UINT32 bit; const char *name; } bits[] = {
        {VIP_STATUS_FORMAT_ERROR, "format"},
        {VIP_STATUS_PROTECTION_ERROR, "protection"},
        {VIP_STATUS_LENGTH_ERROR, "length"},
        {VIP_STATUS_PARTIAL_ERROR, "partial"},
        {VIP_STATUS_DESC_FLUSHED_ERROR, "flushed: the connection is gone"},
        {VIP_STATUS_TRANSPORT_ERROR, "transport: the peer is gone"},
        {VIP_STATUS_RDMA_PROT_ERROR, "RDMA protection"},
        {VIP_STATUS_REMOTE_DESC_ERROR, "remote descriptor"},
    };
    char why[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
        if (st & bits[i].bit) {
            int w = snprintf(why + used, sizeof why - used, "%s%s", used ? ", " : "",
                             bits[i].name);
            if (w < 0 || (size_t)w >= sizeof why - used)
                break;
            used += (size_t)w;
        }
    }
    die("%s completed with an error (status 0x%x: %s)%s", what, (unsigned)st, why,
        (st & VIP_STATUS_LENGTH_ERROR) && !strcmp(role, "server")
            ? "; the client's messages are larger than this server's -s allows"
            : "");
}

/* ---- time ----------------------------------------------------------------- */

static double ns_per_tick = 1.0;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static ALWAYS_INLINE uint64_t ticks(const int tsc)
{
#if HAVE_TSC
    if (tsc) {
        /* Fenced on both sides: not hoisted above earlier work nor sunk
         * below later work. */
        _mm_lfence();
        uint64_t t = __rdtsc();
        _mm_lfence();
        return t;
    }
#else
    (void)tsc;
#endif
    return mono_ns();
}

/* The tick length, against CLOCK_MONOTONIC over about 50 ms. */
static void calibrate(int tsc)
{
    if (!tsc) {
        ns_per_tick = 1.0;
        return;
    }
    uint64_t n0 = mono_ns(), c0 = ticks(1), n1;
    do
        n1 = mono_ns();
    while (n1 - n0 < 50000000u);
    uint64_t c1 = ticks(1);
    n1 = mono_ns();
    ns_per_tick = (c1 > c0) ? (double)(n1 - n0) / (double)(c1 - c0) : 1.0;
}

/* ---- one side of a connection -------------------------------------------- */

struct ep {
    VIP_NIC_HANDLE nic;
    VIP_NIC_ATTRIBUTES na;
    VIP_PROTECTION_HANDLE ptag;
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *descs; /* SEND_DESCS sends, then RECV_AHEAD receives */
    VIP_MEM_HANDLE descs_mh;
    char *sbuf, *rbuf;
    VIP_MEM_HANDLE smh, rmh;
    size_t max;
    unsigned long posted, reaped; /* sends */
    VIP_DESCRIPTOR *current;      /* the last receive, posted again on the next */
    int block;
    VIP_NET_ADDRESS *local, *remote;
    /* --rdma-write: messages are RDMA writes into the peer's receive buffer. */
    int rdma;
    VIP_PVOID64 peer_rbuf;
    VIP_MEM_HANDLE peer_rmh;
    VIP_CQ_HANDLE cq;             /* --cq: the CQ both queues report to */
    unsigned long recv_ready;     /* --cq: receive notices not yet taken */
};

static ALWAYS_INLINE void fill_desc(VIP_DESCRIPTOR *d, void *buf, VIP_MEM_HANDLE h,
                                    VIP_UINT32 len, VIP_UINT32 send_len)
{
    d->CS.Next.AddressBits = 0;
    d->CS.NextHandle = 0;
    d->CS.SegCount = 1;
    d->CS.Control = VIP_CONTROL_OP_SENDRECV;
    d->CS.Reserved = 0;
    d->CS.ImmediateData = 0;
    d->CS.Length = send_len;
    d->CS.Status = 0;
    d->DS[0].Local.Data.Address = buf;
    d->DS[0].Local.Handle = h;
    d->DS[0].Local.Length = len;
}

static VIP_NET_ADDRESS *new_address(VIP_UINT16 hostlen, const char *disc)
{
    size_t dlen = strlen(disc);
    VIP_NET_ADDRESS *a = calloc(1, sizeof(VIP_NET_ADDRESS) + hostlen + dlen);
    if (!a)
        die("out of memory");
    a->HostAddressLen = hostlen;
    a->DiscriminatorLen = (VIP_UINT16)dlen;
    memcpy(a->HostAddress + hostlen, disc, dlen);
    return a;
}

static void set_disc(VIP_NET_ADDRESS *a, const char *disc)
{
    a->DiscriminatorLen = (VIP_UINT16)strlen(disc);
    memcpy(a->HostAddress + a->HostAddressLen, disc, strlen(disc));
}

static void *alloc_touched(size_t n, size_t align, int fill)
{
    void *p;
    if (posix_memalign(&p, align, n))
        die("cannot allocate %zu bytes", n);
    memset(p, fill, n); /* page faults stay out of the measurement */
    return p;
}

/* Opens the NIC, makes the VI, registers buffers and descriptors, and posts
 * the receives (before any connection, as VIA asks). */
static void ep_open(struct ep *e, const struct opts *o, size_t max)
{
    memset(e, 0, sizeof *e);
    e->max = max;
    e->block = o->block;
    e->rdma = o->rdma;
    CHECK(VipOpenNic((const VIP_CHAR *)o->device, &e->nic), o->device);
    CHECK(VipQueryNic(e->nic, &e->na), NULL);
    CHECK(VipNSInit(e->nic, NULL), NULL);
    if (max > e->na.MaxTransferSize)
        die("a %zu byte message is above the NIC's largest transfer (%lu bytes)", max,
            (unsigned long)e->na.MaxTransferSize);
    if (e->na.MaxDescriptorsPerQueue < SEND_DESCS + 1)
        die("the NIC's queues hold %lu descriptors; vpingpong needs %d",
            (unsigned long)e->na.MaxDescriptorsPerQueue, SEND_DESCS + 1);
    if (!(e->na.ReliabilityLevelSupport & o->reliability))
        die("the NIC on %s does not offer the reliability level asked for (offers 0x%x)",
            o->device, (unsigned)e->na.ReliabilityLevelSupport);
    if (strlen(o->disc) > e->na.MaxDiscriminatorLen)
        die("discriminator \"%s\" is longer than the NIC's %u bytes", o->disc,
            (unsigned)e->na.MaxDiscriminatorLen);
    CHECK(VipCreatePtag(e->nic, &e->ptag), NULL);

    VIP_VI_ATTRIBUTES va;
    memset(&va, 0, sizeof va);
    va.ReliabilityLevel = o->reliability;
    va.MaxTransferSize = max > (1UL << 20) ? max : (1UL << 20);
    if (va.MaxTransferSize > e->na.MaxTransferSize)
        va.MaxTransferSize = e->na.MaxTransferSize;
    va.QoS = NULL;
    va.Ptag = e->ptag;
    va.EnableRdmaWrite = o->rdma ? VIP_TRUE : VIP_FALSE;
    va.EnableRdmaRead = VIP_FALSE;
    if (o->cq)
        CHECK(VipCreateCQ(e->nic, CQ_ENTRIES, &e->cq), NULL);
    CHECK(VipCreateVi(e->nic, &va, e->cq, e->cq, &e->vi), NULL);

    VIP_MEM_ATTRIBUTES ma;
    memset(&ma, 0, sizeof ma);
    ma.Ptag = e->ptag;
    ma.EnableRdmaWrite = VIP_FALSE;
    ma.EnableRdmaRead = VIP_FALSE;
    size_t nd = SEND_DESCS + RECV_AHEAD;
    e->descs = alloc_touched(nd * sizeof(VIP_DESCRIPTOR), VIP_DESCRIPTOR_ALIGNMENT, 0);
    e->sbuf = alloc_touched(max, 4096, 0x5a);
    e->rbuf = alloc_touched(max, 4096, 0);
    CHECK(VipRegisterMem(e->nic, e->descs, nd * sizeof(VIP_DESCRIPTOR), &ma, &e->descs_mh),
          "descriptors");
    CHECK(VipRegisterMem(e->nic, e->sbuf, max, &ma, &e->smh), "send buffer");
    /* With --rdma-write the peer writes into the receive buffer. */
    ma.EnableRdmaWrite = o->rdma ? VIP_TRUE : VIP_FALSE;
    CHECK(VipRegisterMem(e->nic, e->rbuf, max, &ma, &e->rmh), "receive buffer");
    ma.EnableRdmaWrite = VIP_FALSE;

    /* Every receive points at the one receive buffer: messages are placed one
     * at a time, and the last one stays put until the next receive. */
    for (int i = 0; i < RECV_AHEAD; i++) {
        VIP_DESCRIPTOR *d = &e->descs[SEND_DESCS + i];
        fill_desc(d, e->rbuf, e->rmh, (VIP_UINT32)max, 0);
        CHECK(VipPostRecv(e->vi, d, e->descs_mh), "posting the receives");
    }
    e->local = new_address(e->na.NicAddressLen, o->disc);
    memcpy(e->local->HostAddress, e->na.LocalNicAddress, e->na.NicAddressLen);
    e->remote = new_address(e->na.NicAddressLen, o->disc);
}

/* ---- --cq: both queues bound to one CQ, as message-passing libraries do --- */

/* Takes one notice off the CQ, waiting for it in VipCQWait if `wait`: a
 * send's descriptor is taken back at once with VipSendDone (a library's
 * completion loop), a receive is counted for ep_recv, which takes its
 * descriptor with VipRecvDone. Returns 0 if `wait` is 0 and none was there. */
static ALWAYS_INLINE int cq_take(struct ep *e, int wait)
{
    VIP_VI_HANDLE vi;
    VIP_BOOLEAN recv;
    VIP_RETURN r;
    if (wait)
        r = VipCQWait(e->cq, WAIT_MS, &vi, &recv);
    else
        r = VipCQDone(e->cq, &vi, &recv);
    if (r == VIP_NOT_DONE && !wait)
        return 0;
    if (UNLIKELY(r != VIP_SUCCESS))
        die_vip(wait ? "VipCQWait" : "VipCQDone", r, NULL);
    if (UNLIKELY(vi != e->vi))
        die("a CQ notice names VI handle %p, not this side's %p", vi, e->vi);
    if (recv) {
        e->recv_ready++;
        return 1;
    }
    VIP_DESCRIPTOR *d;
    r = VipSendDone(vi, &d);
    if (UNLIKELY(r != VIP_SUCCESS))
        die_vip("VipSendDone", r, "after the CQ named the send queue");
    if (UNLIKELY(d->CS.Status & VIP_STATUS_ERROR_MASK))
        die_status("a send", d->CS.Status);
    e->reaped++;
    return 1;
}

/* ep_reap through the CQ: every notice there, or (wait) until a send is back. */
static ALWAYS_INLINE void cq_reap(struct ep *e, int wait)
{
    unsigned long before = e->reaped;
    if (wait) {
        while (e->reaped == before)
            cq_take(e, 1);
    } else {
        while (cq_take(e, 0))
            ;
    }
}

/* The next receive through the CQ: waits in VipCQWait until the CQ names
 * the receive queue, then takes the descriptor with VipRecvDone. */
static ALWAYS_INLINE VIP_DESCRIPTOR *cq_recv(struct ep *e)
{
    while (!e->recv_ready)
        cq_take(e, 1);
    e->recv_ready--;
    VIP_DESCRIPTOR *d;
    VIP_RETURN r = VipRecvDone(e->vi, &d);
    if (UNLIKELY(r != VIP_SUCCESS))
        die_vip("VipRecvDone", r, "after the CQ named the receive queue");
    return d;
}

/* Takes back completed sends: all that have completed, or (wait) one. */
static ALWAYS_INLINE void ep_reap(struct ep *e, int wait)
{
    if (e->cq) {
        cq_reap(e, wait);
        return;
    }
    for (;;) {
        VIP_DESCRIPTOR *d;
        VIP_RETURN r;
        if (wait && e->block)
            r = VipSendWait(e->vi, WAIT_MS, &d);
        else
            r = VipSendDone(e->vi, &d);
        if (r == VIP_SUCCESS) {
            if (UNLIKELY(d->CS.Status & VIP_STATUS_ERROR_MASK))
                die_status("a send", d->CS.Status);
            e->reaped++;
            if (wait)
                return;
        } else if (r == VIP_NOT_DONE) {
            if (!wait)
                return;
        } else {
            die_vip(wait && e->block ? "VipSendWait" : "VipSendDone", r, NULL);
        }
    }
}

static ALWAYS_INLINE void ep_send_imm(struct ep *e, size_t len, int imm, VIP_UINT32 data)
{
    while (UNLIKELY(e->posted - e->reaped >= SEND_DESCS))
        ep_reap(e, 1);
    VIP_DESCRIPTOR *d = &e->descs[e->posted % SEND_DESCS];
    fill_desc(d, e->sbuf, e->smh, (VIP_UINT32)len, (VIP_UINT32)len);
    if (imm) {
        d->CS.Control |= VIP_CONTROL_IMMEDIATE;
        d->CS.ImmediateData = data;
    }
    VIP_RETURN r = VipPostSend(e->vi, d, e->descs_mh);
    if (UNLIKELY(r != VIP_SUCCESS))
        die_vip("VipPostSend", r, NULL);
    e->posted++;
    /* Completions are taken back every few sends, off the message's path. */
    if (e->posted % REAP_EVERY == 0)
        ep_reap(e, 0);
}

/* --rdma-write: the message written into the peer's receive buffer, with
 * its length as immediate data (which completes one of the peer's receives). */
static ALWAYS_INLINE void ep_rdma_write(struct ep *e, size_t len)
{
    while (UNLIKELY(e->posted - e->reaped >= SEND_DESCS))
        ep_reap(e, 1);
    VIP_DESCRIPTOR *d = &e->descs[e->posted % SEND_DESCS];
    d->CS.Next.AddressBits = 0;
    d->CS.NextHandle = 0;
    d->CS.SegCount = 2;
    d->CS.Control = VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE;
    d->CS.Reserved = 0;
    d->CS.ImmediateData = (VIP_UINT32)len;
    d->CS.Length = (VIP_UINT32)len;
    d->CS.Status = 0;
    d->DS[0].Remote.Data = e->peer_rbuf;
    d->DS[0].Remote.Handle = e->peer_rmh;
    d->DS[0].Remote.Reserved = 0;
    d->DS[1].Local.Data.Address = e->sbuf;
    d->DS[1].Local.Handle = e->smh;
    d->DS[1].Local.Length = (VIP_UINT32)len;
    VIP_RETURN r = VipPostSend(e->vi, d, e->descs_mh);
    if (UNLIKELY(r != VIP_SUCCESS))
        die_vip("VipPostSend", r, "an RDMA write");
    e->posted++;
    if (e->posted % REAP_EVERY == 0)
        ep_reap(e, 0);
}

static ALWAYS_INLINE void ep_send(struct ep *e, size_t len)
{
    if (e->rdma)
        ep_rdma_write(e, len);
    else
        ep_send_imm(e, len, 0, 0);
}

/* The next message; its bytes are in rbuf until the next call. */
static ALWAYS_INLINE VIP_DESCRIPTOR *ep_recv(struct ep *e)
{
    VIP_DESCRIPTOR *d;
    VIP_RETURN r;
    if (e->current) {
        fill_desc(e->current, e->rbuf, e->rmh, (VIP_UINT32)e->max, 0);
        r = VipPostRecv(e->vi, e->current, e->descs_mh);
        if (UNLIKELY(r != VIP_SUCCESS))
            die_vip("VipPostRecv", r, NULL);
    }
    if (e->cq) {
        d = cq_recv(e);
    } else if (e->block) {
        r = VipRecvWait(e->vi, WAIT_MS, &d);
        if (UNLIKELY(r != VIP_SUCCESS))
            die_vip("VipRecvWait", r, NULL);
    } else {
        while ((r = VipRecvDone(e->vi, &d)) == VIP_NOT_DONE)
            ;
        if (UNLIKELY(r != VIP_SUCCESS))
            die_vip("VipRecvDone", r, NULL);
    }
    if (UNLIKELY(d->CS.Status & VIP_STATUS_ERROR_MASK))
        die_status("a receive", d->CS.Status);
    e->current = d;
    return d;
}

/* Waits until every send has completed. */
static void ep_flush(struct ep *e)
{
    while (e->posted != e->reaped)
        ep_reap(e, 1);
}

/* --rdma-write, after connecting: tells the peer where this side's receive
 * buffer is and learns where the peer's is, in one send each way (the
 * client's first). A plain send, whatever the mode. */
#define RDMA_INFO_MAGIC 0x414d4452u /* "RDMA" */
struct rdma_info {
    uint64_t addr;
    uint32_t handle, len, magic, pad;
};

static void ep_swap_rdma_info(struct ep *e, int client)
{
    struct rdma_info mine = {(uint64_t)(uintptr_t)e->rbuf, (uint32_t)e->rmh, (uint32_t)e->max,
                             RDMA_INFO_MAGIC, 0};
    struct rdma_info theirs;
    for (int step = 0; step < 2; step++) {
        if (step == !client) {
            memcpy(e->sbuf, &mine, sizeof mine);
            ep_send_imm(e, sizeof mine, 0, 0);
            ep_flush(e);
        } else {
            VIP_DESCRIPTOR *d = ep_recv(e);
            if (d->CS.Length != sizeof theirs || (d->CS.Status & VIP_STATUS_OP_MASK) != VIP_STATUS_OP_RECEIVE)
                die("the peer did not say where its receive buffer is (is it running with --rdma-write?)");
            memcpy(&theirs, e->rbuf, sizeof theirs);
            if (theirs.magic != RDMA_INFO_MAGIC)
                die("the peer did not say where its receive buffer is (is it running with --rdma-write?)");
        }
    }
    if (theirs.len < e->max)
        die("the peer's receive buffer holds %lu bytes, less than the %zu of the largest message",
            (unsigned long)theirs.len, e->max);
    e->peer_rbuf.AddressBits = theirs.addr;
    e->peer_rmh = (VIP_MEM_HANDLE)theirs.handle;
}

/* ep_close's drain with --cq, where the wait calls refuse a bound queue:
 * the done calls, and a pause in VipCQWait when neither had anything. */
static void cq_drain(struct ep *e, VIP_BOOLEAN sq_empty, VIP_BOOLEAN rq_empty)
{
    VIP_DESCRIPTOR *d;
    VIP_VI_HANDLE vi;
    VIP_BOOLEAN recv;
    int took = 0;
    if (!sq_empty)
        took |= VipSendDone(e->vi, &d) == VIP_SUCCESS;
    if (!rq_empty)
        took |= VipRecvDone(e->vi, &d) == VIP_SUCCESS;
    if (!took)
        (void)VipCQWait(e->cq, 10, &vi, &recv);
}

/* Disconnects (the peer may have done so already), takes back the flushed
 * receives, and frees everything. */
static void ep_close(struct ep *e)
{
    VIP_RETURN r = VipDisconnect(e->vi);
    if (r != VIP_SUCCESS && r != VIP_INVALID_STATE)
        die_vip("VipDisconnect", r, NULL);
    for (int tries = 0; tries < 1000; tries++) {
        VIP_VI_STATE st;
        VIP_VI_ATTRIBUTES a;
        VIP_BOOLEAN sq_empty, rq_empty;
        VIP_DESCRIPTOR *d;
        CHECK(VipQueryVi(e->vi, &st, &a, &sq_empty, &rq_empty), NULL);
        if (sq_empty && rq_empty)
            break;
        if (e->cq) {
            cq_drain(e, sq_empty, rq_empty);
            continue;
        }
        if (!sq_empty)
            (void)VipSendWait(e->vi, 10, &d);
        if (!rq_empty)
            (void)VipRecvWait(e->vi, 10, &d);
    }
    CHECK(VipDestroyVi(e->vi), NULL);
    if (e->cq)
        CHECK(VipDestroyCQ(e->cq), NULL);
    CHECK(VipDeregisterMem(e->nic, e->rbuf, e->rmh), "receive buffer");
    CHECK(VipDeregisterMem(e->nic, e->sbuf, e->smh), "send buffer");
    CHECK(VipDeregisterMem(e->nic, e->descs, e->descs_mh), "descriptors");
    CHECK(VipDestroyPtag(e->nic, e->ptag), NULL);
    CHECK(VipNSShutdown(e->nic), NULL);
    CHECK(VipCloseNic(e->nic), NULL);
    free(e->rbuf);
    free(e->sbuf);
    free(e->descs);
    free(e->local);
    free(e->remote);
}

/* A host address for display: its bytes in hex (host addresses are
 * binary, M-VIA's 6 bytes: an IPv4 address and port, a MAC, an instance). */
static const char *host_text(const VIP_NET_ADDRESS *a, char *out, size_t n)
{
    out[0] = 0;
    for (size_t i = 0; i < a->HostAddressLen && 2 * i + 3 <= n; i++)
        snprintf(out + 2 * i, 3, "%02x", a->HostAddress[i]);
    return out;
}

/* ---- server --------------------------------------------------------------- */

/* Accepts one client and sends back a message of the same size for every
 * message, until the client's end mark. `ready_fd` (if >= 0) gets the
 * server's host address (a 2-byte length, then the bytes) when the server
 * is about to wait for its client. */
static int serve(const struct opts *o, size_t max, int ready_fd, int announce)
{
    struct ep e;
    ep_open(&e, o, max);
    memset(e.sbuf, REPLY_BYTE, max);
    char host[2 * VIPL_HOST_ADDRESS_LEN + 1];
    if (announce) {
        fprintf(stderr, "%s server: waiting on %s, host %s, discriminator \"%s\"\n", prog,
                o->device, host_text(e.local, host, sizeof host), o->disc);
    }
    if (ready_fd >= 0) {
        unsigned char msg[2 + 1024];
        size_t n = e.local->HostAddressLen < 1024 ? e.local->HostAddressLen : 1024;
        msg[0] = (unsigned char)(n >> 8);
        msg[1] = (unsigned char)n;
        memcpy(msg + 2, e.local->HostAddress, n);
        if (write(ready_fd, msg, 2 + n) != (ssize_t)(2 + n))
            die("cannot tell the client that the server is ready: %s", strerror(errno));
        close(ready_fd);
    }
    VIP_CONN_HANDLE conn;
    VIP_VI_ATTRIBUTES ra;
    CHECK(VipConnectWait(e.nic, e.local, announce ? VIP_INFINITE : o->connect_ms, e.remote,
                         &ra, &conn),
          "waiting for the client");
    CHECK(VipConnectAccept(conn, e.vi), NULL);
    if (e.rdma) {
        ep_swap_rdma_info(&e, 0);
        memset(e.sbuf, REPLY_BYTE, max);
    }
    if (announce)
        fprintf(stderr, "%s server: client %s connected\n", prog,
                host_text(e.remote, host, sizeof host));

    unsigned long n = 0;
    for (;;) {
        VIP_DESCRIPTOR *d = ep_recv(&e);
        if (UNLIKELY(d->CS.Status & VIP_STATUS_IMMEDIATE) && d->CS.ImmediateData == END_MARK)
            break;
        ep_send(&e, d->CS.Length);
        n++;
    }
    ep_flush(&e);
    ep_close(&e);
    if (announce)
        fprintf(stderr, "%s server: %lu messages answered; the client is done\n", prog, n);
    return 0;
}

/* ---- client --------------------------------------------------------------- */

struct result {
    size_t size;
    unsigned long iters, warmup;
    double min, p50, p99, mean; /* one-way, ns */
    double mbps, msgs;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank, as uvia pingpong takes it. */
static double percentile(const double *sorted, size_t n, double p)
{
    if (!n)
        return 0;
    double r = (p / 100.0) * (double)n;
    size_t rank = (size_t)r;
    if ((double)rank < r)
        rank++;
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return sorted[rank - 1];
}

static unsigned long default_iters(size_t size)
{
    if (size <= 1024)
        return 100000;
    unsigned long n = (unsigned long)(100000.0 * 1024.0 / (double)size);
    return n < 500 ? 500 : n > 100000 ? 100000 : n;
}

static unsigned long default_warmup(unsigned long iters)
{
    unsigned long w = iters / 10;
    return w < 10 ? 10 : w > 10000 ? 10000 : w;
}

static COLD NORETURN void bad_length(size_t got, size_t want)
{
    die("received a %zu byte message where %zu bytes were expected", got, want);
}

/* The measured round trips, with the clock chosen at compile time. */
static ALWAYS_INLINE void timed(struct ep *e, size_t size, unsigned long iters, uint64_t *dt,
                                const int tsc)
{
    for (unsigned long k = 0; k < iters; k++) {
        uint64_t t0 = ticks(tsc);
        ep_send(e, size);
        VIP_DESCRIPTOR *d = ep_recv(e);
        uint64_t t1 = ticks(tsc);
        dt[k] = t1 - t0;
        if (UNLIKELY(d->CS.Length != size))
            bad_length(d->CS.Length, size);
    }
}

static void measure(struct ep *e, size_t size, unsigned long iters, unsigned long warm,
                    int tsc, struct result *out)
{
    for (size_t i = 0; i < size; i++)
        e->sbuf[i] = (char)i;
    for (unsigned long k = 0; k < warm; k++) {
        ep_send(e, size);
        VIP_DESCRIPTOR *d = ep_recv(e);
        if (UNLIKELY(d->CS.Length != size))
            bad_length(d->CS.Length, size);
    }
    uint64_t *dt = malloc(iters * sizeof *dt);
    double *ns = malloc(iters * sizeof *ns);
    if (!dt || !ns)
        die("cannot allocate room for %lu samples", iters);
    memset(dt, 0, iters * sizeof *dt);
    if (tsc)
        timed(e, size, iters, dt, 1);
    else
        timed(e, size, iters, dt, 0);
    if ((unsigned char)e->rbuf[0] != REPLY_BYTE || (unsigned char)e->rbuf[size - 1] != REPLY_BYTE)
        die("the last reply's bytes differ from what the server sent");
    ep_flush(e);

    double sum = 0;
    for (unsigned long k = 0; k < iters; k++) {
        ns[k] = (double)dt[k] * ns_per_tick / 2.0;
        sum += ns[k];
    }
    qsort(ns, iters, sizeof *ns, cmp_double);
    out->size = size;
    out->iters = iters;
    out->warmup = warm;
    out->min = ns[0];
    out->p50 = percentile(ns, iters, 50);
    out->p99 = percentile(ns, iters, 99);
    out->mean = sum / (double)iters;
    out->mbps = out->p50 > 0 ? (double)size / out->p50 * 1e3 : 0;
    out->msgs = out->mean > 0 ? 1e9 / out->mean : 0;
    free(dt);
    free(ns);
}

static const char *level_name(VIP_RELIABILITY_LEVEL l)
{
    switch (l) {
    case VIP_SERVICE_UNRELIABLE: return "unreliable";
    case VIP_SERVICE_RELIABLE_DELIVERY: return "delivery";
    case VIP_SERVICE_RELIABLE_RECEPTION: return "reception";
    default: return "?";
    }
}

/* How the run moves its messages and waits for them. */
static const char *mode_name(const struct opts *o)
{
    if (o->rdma)
        return o->cq ? "rdma-write cq" : o->block ? "rdma-write block" : "rdma-write spin";
    return o->cq ? "cq" : o->block ? "block" : "spin";
}

static const char *human(size_t n, char *out, size_t len)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0)
        snprintf(out, len, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(out, len, "%zu KiB", n >> 10);
    else
        snprintf(out, len, "%zu B", n);
    return out;
}

static void print_result(const struct opts *o, const struct result *r, int first)
{
    if (o->json) {
        printf("{\"program\":\"vpingpong\",\"device\":\"%s\",\"mode\":\"%s\","
               "\"reliability\":\"%s\",\"clock\":\"%s\",\"size\":%zu,\"iters\":%lu,"
               "\"warmup\":%lu,\"lat_ns\":{\"min\":%.3f,\"p50\":%.3f,\"p99\":%.3f,"
               "\"mean\":%.3f},\"mbytes_per_s\":%.3f,\"msgs_per_s\":%.1f}\n",
               o->device, mode_name(o), level_name(o->reliability),
               o->tsc ? "tsc" : "monotonic", r->size, r->iters, r->warmup, r->min, r->p50,
               r->p99, r->mean, r->mbps, r->msgs);
    } else {
        char h[32];
        if (first) {
            printf("vpingpong %s (%s, reliability %s): one-way latency, half a round trip\n",
                   o->device, mode_name(o), level_name(o->reliability));
            printf("%9s %8s %10s %10s %10s\n", "size", "iters", "p50 us", "p99 us", "MB/s");
        }
        printf("%9s %8lu %10.3f %10.3f %10.1f\n", human(r->size, h, sizeof h), r->iters,
               r->p50 / 1e3, r->p99 / 1e3, r->mbps);
    }
    fflush(stdout);
}

/* Connects to the server named `host` (looked up by the name service), or
 * else at host address `addr` (`alen` bytes), measures every size, and ends
 * the run. `retry` keeps trying while nobody listens yet (a server just
 * started). */
static int client(const struct opts *o, size_t max, const char *host, const unsigned char *addr,
                  size_t alen, int retry)
{
    struct ep e;
    ep_open(&e, o, max);
    if (host) {
        CHECK(VipNSGetHostByName(e.nic, (VIP_CHAR *)host, e.remote, 0), host);
        set_disc(e.remote, o->disc);
    } else {
        if (alen > e.na.NicAddressLen)
            die("the server's host address is %zu bytes, more than this NIC's %u", alen,
                (unsigned)e.na.NicAddressLen);
        memset(e.remote->HostAddress, 0, e.na.NicAddressLen);
        memcpy(e.remote->HostAddress, addr, alen);
    }
    calibrate(o->tsc);

    VIP_VI_ATTRIBUTES ra;
    uint64_t deadline = mono_ns() + (uint64_t)o->connect_ms * 1000000u;
    for (;;) {
        VIP_RETURN r = VipConnectRequest(e.vi, e.local, e.remote, o->connect_ms, &ra);
        if (r == VIP_SUCCESS)
            break;
        if (retry && r == VIP_NO_MATCH && mono_ns() < deadline) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        char h[2 * VIPL_HOST_ADDRESS_LEN + 1], what[160];
        snprintf(what, sizeof what, "server host %s, discriminator \"%s\"",
                 host_text(e.remote, h, sizeof h), o->disc);
        die_vip("VipConnectRequest", r, what);
    }
    if (e.rdma)
        ep_swap_rdma_info(&e, 1);

    for (int i = 0; i < o->nsizes; i++) {
        size_t size = o->sizes[i];
        unsigned long iters = o->iters ? o->iters : default_iters(size);
        unsigned long warm = o->warmup >= 0 ? (unsigned long)o->warmup : default_warmup(iters);
        struct result r;
        measure(&e, size, iters, warm, o->tsc, &r);
        print_result(o, &r, i == 0);
    }
    /* The end mark: one byte with immediate data; the server does not answer. */
    ep_send_imm(&e, 1, 1, END_MARK);
    ep_flush(&e);
    ep_close(&e);
    return 0;
}

/* ---- pinning, local mode --------------------------------------------------- */

static void pin(int core, const char *who)
{
    if (core < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "%s: warning: %s: cannot pin to core %d: %s; running unpinned\n", prog,
                who, core, strerror(errno));
}

static volatile pid_t server_pid = -1;
static volatile sig_atomic_t server_status = -1;

/* The server must outlive the measurement: if it dies first, the client
 * would wait for a reply that cannot come. */
static void on_child(int sig)
{
    (void)sig;
    int saved = errno, st;
    if (server_pid > 0 && waitpid(server_pid, &st, WNOHANG) == server_pid) {
        server_status = st;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            static const char msg[] = "vpingpong client: the server process stopped in the "
                                      "middle of the measurement\n";
            ssize_t w = write(2, msg, sizeof msg - 1);
            (void)w;
            _exit(1);
        }
    }
    errno = saved;
}

static int local(struct opts *o, size_t max)
{
    char disc[40];
    if (!o->disc) {
        snprintf(disc, sizeof disc, "vpingpong-%ld", (long)getpid());
        o->disc = disc;
    }
    int fds[2];
    if (pipe(fds) != 0)
        die("pipe: %s", strerror(errno));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);

    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        role = "server";
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* do not outlive the client */
        close(fds[0]);
        if (o->pin)
            pin(o->cpu_server, "server");
        exit(serve(o, max, fds[1], 0));
    }
    server_pid = pid;
    close(fds[1]);
    if (o->pin)
        pin(o->cpu_client, "client");
    /* Wait until the server is set up and says where it is (end of file:
     * it failed). */
    unsigned char msg[2 + 1024];
    size_t got = 0, want = 2;
    while (got < want) {
        struct pollfd p = {fds[0], POLLIN, 0};
        ssize_t n = poll(&p, 1, WAIT_MS) > 0 ? read(fds[0], msg + got, want - got) : 0;
        if (n <= 0) {
            kill(pid, SIGTERM);
            die("the server process did not get ready");
        }
        got += (size_t)n;
        if (got == 2)
            want = 2 + (((size_t)msg[0] << 8) | msg[1]);
    }
    close(fds[0]);
    int rc = client(o, max, NULL, msg + 2, want - 2, 1);
    /* The server leaves once it has seen the end mark. */
    for (int i = 0; i < 1000 && server_status == -1; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (server_status == -1) {
        kill(pid, SIGTERM);
        die("the server did not finish after the run");
    }
    return rc;
}

/* ---- options --------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: %s server [options]\n"
        "       %s client HOST [options]\n"
        "       %s local [options]\n"
        "\n"
        "One-way latency (half a round trip) and bandwidth of a VIA provider by\n"
        "message size. `local` runs both sides on this host (it forks the server).\n"
        "\n"
        "  -d, --device DEV     VIA device or provider (default shm)\n"
        "  -s, --sizes LIST     message sizes, comma-separated, K and M binary\n"
        "                       (default %s)\n"
        "  -n, --iters N        measured round trips per size (default 100,000 up\n"
        "                       to 1 KiB, fewer above, as uvia pingpong)\n"
        "  -w, --warmup N       untimed round trips first (default a tenth of -n,\n"
        "                       10 to 10,000)\n"
        "      --spin           poll VipRecvDone in a loop (default)\n"
        "      --block          wait in VipRecvWait (uvia's spins up to 20 us\n"
        "                       before it sleeps, unlike uvia pingpong --blocking)\n"
        "      --rdma-write     move each message as an RDMA write with immediate\n"
        "                       data into the peer's registered receive buffer\n"
        "                       (completing one of its posted receives), the server\n"
        "                       answering the same way; both sides need it\n"
        "      --cq             both queues bound to one CQ: wait in VipCQWait,\n"
        "                       take the named descriptor with VipRecvDone or\n"
        "                       VipSendDone, as message-passing libraries do\n"
        "                       (VipCQWait spins VIPL_WAIT_SPIN_US first, default\n"
        "                       20; 0 sleeps at once)\n"
        "      --cpu LIST       cores: client or server mode one core for this\n"
        "                       process; local mode CLIENT,SERVER (default 0,1)\n"
        "      --no-pin         do not pin\n"
        "  -r, --reliability L  unreliable, delivery (default) or reception\n"
        "  -D, --disc NAME      discriminator (default \"vpingpong\"; local mode a\n"
        "                       fresh one per run)\n"
        "  -t, --timeout MS     connection timeout (default 20000)\n"
        "      --clock C        tsc (default on x86-64) or mono (clock_gettime)\n"
        "  -j, --json           one JSON line per size instead of the table\n"
        "  -h, --help           this text\n"
        "\n"
        "The server's -s sets only its buffer: give it the client's largest size\n"
        "or more.\n",
        prog, prog, prog, DEFAULT_SIZES);
}

static COLD NORETURN void bad_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(try %s --help)\n", prog);
    exit(2);
}

static unsigned long parse_count(const char *s, const char *opt)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        bad_usage("%s wants a number", opt);
    return v;
}

/* 8, 1K, 64k, 1M, 1MiB: K and M are binary; 1 byte to 64 MiB. */
static size_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    if (!(*s >= '0' && *s <= '9'))
        bad_usage("bad size \"%s\": expected a number such as 8, 1K or 1M", s);
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        bad_usage("bad size \"%s\"", s);
    unsigned long long mult = 1;
    if (!strcasecmp(end, "") || !strcasecmp(end, "b"))
        mult = 1;
    else if (!strcasecmp(end, "k") || !strcasecmp(end, "kb") || !strcasecmp(end, "kib"))
        mult = 1ULL << 10;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mb") || !strcasecmp(end, "mib"))
        mult = 1ULL << 20;
    else
        bad_usage("bad size \"%s\": unknown suffix (use K or M, binary)", s);
    if (v == 0)
        bad_usage("size \"%s\" is zero: messages must be at least 1 byte", s);
    if (v > MAX_MESSAGE / mult)
        bad_usage("size \"%s\" is larger than the 64 MiB limit", s);
    return (size_t)(v * mult);
}

static void parse_sizes(struct opts *o, const char *list)
{
    char *copy = strdup(list), *save = NULL;
    if (!copy)
        die("out of memory");
    o->nsizes = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        size_t l = strlen(t);
        while (l && t[l - 1] == ' ')
            t[--l] = '\0';
        if (!*t)
            continue;
        if (o->nsizes == MAX_SIZES)
            bad_usage("%s: too many sizes", list);
        o->sizes[o->nsizes++] = parse_size(t);
    }
    free(copy);
    if (!o->nsizes)
        bad_usage("no sizes given in \"%s\"", list);
}

int main(int argc, char **argv)
{
    struct opts o;
    memset(&o, 0, sizeof o);
    o.device = "shm";
    o.disc = NULL;
    o.warmup = -1;
    o.reliability = VIP_SERVICE_RELIABLE_DELIVERY;
    o.tsc = HAVE_TSC;
    o.pin = 1;
    o.cpu_self = -1;
    o.cpu_client = 0;
    o.cpu_server = 1;
    o.connect_ms = 20000;
    const char *cpu = NULL;
    parse_sizes(&o, DEFAULT_SIZES);

    enum { OPT_SPIN = 256, OPT_BLOCK, OPT_CPU, OPT_NOPIN, OPT_CLOCK, OPT_RDMA_WRITE, OPT_CQ };
    static const struct option longs[] = {
        {"device", required_argument, 0, 'd'},
        {"sizes", required_argument, 0, 's'},
        {"iters", required_argument, 0, 'n'},
        {"warmup", required_argument, 0, 'w'},
        {"spin", no_argument, 0, OPT_SPIN},
        {"block", no_argument, 0, OPT_BLOCK},
        {"rdma-write", no_argument, 0, OPT_RDMA_WRITE},
        {"cq", no_argument, 0, OPT_CQ},
        {"cpu", required_argument, 0, OPT_CPU},
        {"no-pin", no_argument, 0, OPT_NOPIN},
        {"reliability", required_argument, 0, 'r'},
        {"disc", required_argument, 0, 'D'},
        {"timeout", required_argument, 0, 't'},
        {"clock", required_argument, 0, OPT_CLOCK},
        {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "d:s:n:w:r:D:t:jh", longs, NULL)) != -1) {
        switch (c) {
        case 'd': o.device = optarg; break;
        case 's': parse_sizes(&o, optarg); break;
        case 'n':
            o.iters = parse_count(optarg, "-n");
            if (!o.iters)
                bad_usage("%s: -n must be at least 1", optarg);
            break;
        case 'w': o.warmup = (long)parse_count(optarg, "-w"); break;
        /* The last of --spin, --block and --cq counts. */
        case OPT_SPIN: o.block = 0; o.cq = 0; break;
        case OPT_BLOCK: o.block = 1; o.cq = 0; break;
        case OPT_CQ: o.cq = 1; o.block = 0; break;
        case OPT_RDMA_WRITE: o.rdma = 1; break;
        case OPT_CPU: cpu = optarg; break;
        case OPT_NOPIN: o.pin = 0; break;
        case 'r':
            if (!strcmp(optarg, "unreliable"))
                o.reliability = VIP_SERVICE_UNRELIABLE;
            else if (!strcmp(optarg, "delivery"))
                o.reliability = VIP_SERVICE_RELIABLE_DELIVERY;
            else if (!strcmp(optarg, "reception"))
                o.reliability = VIP_SERVICE_RELIABLE_RECEPTION;
            else
                bad_usage("unknown reliability level \"%s\" (unreliable, delivery, reception)",
                          optarg);
            break;
        case 'D': o.disc = optarg; break;
        case 't': o.connect_ms = parse_count(optarg, "-t"); break;
        case OPT_CLOCK:
            if (!strcmp(optarg, "tsc")) {
                if (!HAVE_TSC)
                    bad_usage("--clock %s: no time stamp counter on this machine", optarg);
                o.tsc = 1;
            } else if (!strcmp(optarg, "mono") || !strcmp(optarg, "monotonic")) {
                o.tsc = 0;
            } else {
                bad_usage("unknown clock \"%s\" (tsc or mono)", optarg);
            }
            break;
        case 'j': o.json = 1; break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "(try %s --help)\n", prog); return 2;
        }
    }
    if (optind >= argc)
        bad_usage("%s", "say server, client HOST or local");
    const char *mode = argv[optind++];
    const char *host = NULL;
    if (!strcmp(mode, "client")) {
        if (optind >= argc)
            bad_usage("%s", "client wants the server's host name");
        host = argv[optind++];
    } else if (strcmp(mode, "server") && strcmp(mode, "local")) {
        bad_usage("unknown mode \"%s\" (server, client HOST or local)", mode);
    }
    if (optind < argc)
        bad_usage("unexpected argument \"%s\"", argv[optind]);

    if (cpu) {
        char *end;
        long a = strtol(cpu, &end, 10);
        if (end == cpu || a < 0 || a >= CPU_SETSIZE)
            bad_usage("bad --cpu \"%s\"", cpu);
        if (!strcmp(mode, "local")) {
            if (*end != ',')
                bad_usage("--cpu \"%s\": local mode wants CLIENT,SERVER", cpu);
            char *s = end + 1;
            long b = strtol(s, &end, 10);
            if (end == s || *end || b < 0 || b >= CPU_SETSIZE)
                bad_usage("bad --cpu \"%s\"", cpu);
            o.cpu_client = (int)a;
            o.cpu_server = (int)b;
        } else {
            if (*end)
                bad_usage("--cpu \"%s\": one core for this process", cpu);
            o.cpu_self = (int)a;
        }
    }

    size_t max = 8;
    for (int i = 0; i < o.nsizes; i++)
        if (o.sizes[i] > max)
            max = o.sizes[i];

    if (!strcmp(mode, "server")) {
        role = "server";
        if (!o.disc)
            o.disc = "vpingpong";
        if (o.pin)
            pin(o.cpu_self, "server");
        return serve(&o, max, -1, 1);
    }
    if (!strcmp(mode, "client")) {
        if (!o.disc)
            o.disc = "vpingpong";
        if (o.pin)
            pin(o.cpu_self, "client");
        return client(&o, max, host, NULL, 0, 0);
    }
    return local(&o, max);
}
