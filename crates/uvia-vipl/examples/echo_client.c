/*
 * echo_client.c: the VIA echo client of the ping-pong slides, over VIPL.
 *
 * It connects to echo_server, sends a message, waits for it to come back,
 * checks it, and repeats -n times. The shape is the one the slides give:
 *
 *     open the NIC, create a VI
 *     allocate and register three descriptors and three message buffers
 *     post a receive, then VipConnectRequest
 *     loop: send, wait for the send; post a receive, wait for the oldest
 *     disconnect, deregister, destroy
 *
 * Descriptor 0 sends; descriptors 1 and 2 take turns receiving, so that a
 * receive is already posted when the echo arrives.
 *
 * Build:  cc -std=c11 -Wall -Wextra -O2 echo_client.c $(pkg-config --cflags --libs vipl)
 * Run:    ./echo_client [-d /dev/via_lo] [-h server-host] [-D echo] [-m text] [-n count]
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <vipl.h>

static const char *prog = "echo_client";

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

/* Names the call that failed and what it returned, then exits. */
static void die_vip(const char *call, VIP_RETURN r, const char *what)
{
    /* `call` is the whole call as written: name the function only. */
    fprintf(stderr, "%s: %.*s failed: %s (%d)%s%s\n", prog, (int)strcspn(call, "("), call,
            vip_name(r), (int)r, what ? ": " : "", what ? what : "");
    exit(1);
}

#define CHECK(call, what)                           \
    do {                                            \
        VIP_RETURN rc_ = (call);                    \
        if (rc_ != VIP_SUCCESS)                     \
            die_vip(#call, rc_, (what));            \
    } while (0)

/* The error bits of a completed descriptor's status, in words. */
static void status_text(VIP_UINT32 st, char *out, size_t n)
{
    static const struct { VIP_UINT32 bit; const char *name; } bits[] = {
        {VIP_STATUS_FORMAT_ERROR, "format"},
        {VIP_STATUS_PROTECTION_ERROR, "protection"},
        {VIP_STATUS_LENGTH_ERROR, "length"},
        {VIP_STATUS_PARTIAL_ERROR, "partial"},
        {VIP_STATUS_DESC_FLUSHED_ERROR, "flushed"},
        {VIP_STATUS_TRANSPORT_ERROR, "transport"},
        {VIP_STATUS_RDMA_PROT_ERROR, "RDMA protection"},
        {VIP_STATUS_REMOTE_DESC_ERROR, "remote descriptor"},
    };
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
        if (st & bits[i].bit) {
            int w = snprintf(out + used, n - used, "%s%s", used ? ", " : "", bits[i].name);
            if (w < 0 || (size_t)w >= n - used)
                break;
            used += (size_t)w;
        }
    }
    if (!used)
        snprintf(out, n, "none");
}

static void check_completion(const VIP_DESCRIPTOR *d, const char *what)
{
    if (d->CS.Status & VIP_STATUS_ERROR_MASK) {
        char why[128];
        status_text(d->CS.Status, why, sizeof why);
        fprintf(stderr, "%s: %s completed with an error (status 0x%x: %s)\n", prog, what,
                (unsigned)d->CS.Status, why);
        exit(1);
    }
}

/* An address: host bytes (hostlen) followed by the discriminator. */
static VIP_NET_ADDRESS *new_address(VIP_UINT16 hostlen, const char *disc)
{
    size_t dlen = strlen(disc);
    VIP_NET_ADDRESS *a = calloc(1, sizeof(VIP_NET_ADDRESS) + hostlen + dlen);
    if (!a) {
        fprintf(stderr, "%s: out of memory\n", prog);
        exit(1);
    }
    a->HostAddressLen = hostlen;
    a->DiscriminatorLen = (VIP_UINT16)dlen;
    memcpy(a->HostAddress + hostlen, disc, dlen);
    return a;
}

/* Makes `d` a one-segment send or receive of `len` bytes of `buf`. */
static void fill_desc(VIP_DESCRIPTOR *d, void *buf, VIP_MEM_HANDLE h, VIP_UINT32 len,
                      int is_send)
{
    memset(&d->CS, 0, sizeof d->CS);
    d->CS.Control = VIP_CONTROL_OP_SENDRECV;
    d->CS.SegCount = 1;
    d->CS.Length = is_send ? len : 0;
    d->DS[0].Local.Data.Address = buf;
    d->DS[0].Local.Handle = h;
    d->DS[0].Local.Length = len;
}

/* After a disconnect every posted descriptor completes (flushed): take
 * them all back, so that the VI holds none when it is destroyed. */
static void take_back(VIP_VI_HANDLE vi)
{
    for (int tries = 0; tries < 200; tries++) {
        VIP_VI_STATE st;
        VIP_VI_ATTRIBUTES a;
        VIP_BOOLEAN sq_empty, rq_empty;
        VIP_DESCRIPTOR *d;
        if (VipQueryVi(vi, &st, &a, &sq_empty, &rq_empty) != VIP_SUCCESS)
            return;
        if (sq_empty && rq_empty)
            return;
        if (!sq_empty)
            (void)VipSendWait(vi, 10, &d);
        if (!rq_empty)
            (void)VipRecvWait(vi, 10, &d);
    }
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "  Sends a message to echo_server and checks that the same bytes come back.\n"
            "  -d DEVICE   VIA device (default /dev/via_lo)\n"
            "  -h HOST     the server's host name, looked up with VipNSGetHostByName\n"
            "              (default: this NIC's own address, a server on the same NIC)\n"
            "  -D DISC     the server's discriminator (default \"echo\")\n"
            "  -m TEXT     the message (default \"hello, VIA\")\n"
            "  -n COUNT    how many times to send it (default 1)\n"
            "  -t MS       connection timeout in ms (default 10000)\n"
            "  -q          quiet: print only the summary\n",
            prog);
}

static unsigned long parse_ulong(const char *s, const char *opt)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "%s: %s wants a number, not \"%s\"\n", prog, opt, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    const char *device = "/dev/via_lo";
    const char *host = NULL;
    const char *disc = "echo";
    const char *text = "hello, VIA";
    unsigned long count = 1;
    VIP_ULONG timeout_ms = 10000;
    int quiet = 0;
    int c;

    while ((c = getopt(argc, argv, "d:h:D:m:n:t:q")) != -1) {
        switch (c) {
        case 'd': device = optarg; break;
        case 'h': host = optarg; break;
        case 'D': disc = optarg; break;
        case 'm': text = optarg; break;
        case 'n': count = parse_ulong(optarg, "-n"); break;
        case 't': timeout_ms = parse_ulong(optarg, "-t"); break;
        case 'q': quiet = 1; break;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    size_t len = strlen(text);
    if (len == 0) {
        fprintf(stderr, "%s: the message must not be empty\n", prog);
        return 2;
    }

    /* ---- the NIC ---- */
    VIP_NIC_HANDLE nic;
    VIP_NIC_ATTRIBUTES nattr;
    CHECK(VipOpenNic((const VIP_CHAR *)device, &nic), device);
    CHECK(VipQueryNic(nic, &nattr), NULL);
    CHECK(VipNSInit(nic, NULL), NULL);
    if (len > nattr.MaxTransferSize) {
        fprintf(stderr, "%s: a %zu byte message is above the NIC's largest transfer (%lu)\n",
                prog, len, (unsigned long)nattr.MaxTransferSize);
        return 1;
    }
    if (strlen(disc) > nattr.MaxDiscriminatorLen) {
        fprintf(stderr, "%s: discriminator \"%s\" is longer than the NIC's %u bytes\n", prog,
                disc, (unsigned)nattr.MaxDiscriminatorLen);
        return 1;
    }

    /* Our address (this NIC) and the server's, found by its name. */
    VIP_NET_ADDRESS *local = new_address(nattr.NicAddressLen, disc);
    memcpy(local->HostAddress, nattr.LocalNicAddress, nattr.NicAddressLen);
    VIP_NET_ADDRESS *remote = new_address(nattr.NicAddressLen, disc);
    if (host) {
        CHECK(VipNSGetHostByName(nic, (VIP_CHAR *)host, remote, 0), host);
        /* The name service wrote the host part; the discriminator is ours to add. */
        remote->DiscriminatorLen = (VIP_UINT16)strlen(disc);
        memcpy(remote->HostAddress + remote->HostAddressLen, disc, strlen(disc));
    } else {
        memcpy(remote->HostAddress, nattr.LocalNicAddress, nattr.NicAddressLen);
    }

    /* ---- protection tag, VI ---- */
    VIP_PROTECTION_HANDLE ptag;
    CHECK(VipCreatePtag(nic, &ptag), NULL);

    VIP_VI_ATTRIBUTES vattr;
    memset(&vattr, 0, sizeof vattr);
    vattr.ReliabilityLevel = (nattr.ReliabilityLevelSupport & VIP_SERVICE_RELIABLE_DELIVERY)
                                 ? VIP_SERVICE_RELIABLE_DELIVERY
                                 : VIP_SERVICE_UNRELIABLE;
    vattr.MaxTransferSize = len;
    vattr.QoS = NULL;
    vattr.Ptag = ptag;
    vattr.EnableRdmaWrite = VIP_FALSE;
    vattr.EnableRdmaRead = VIP_FALSE;
    VIP_VI_HANDLE vi;
    CHECK(VipCreateVi(nic, &vattr, NULL, NULL, &vi), NULL);

    /* ---- three descriptors and three message buffers, registered ---- */
    VIP_MEM_ATTRIBUTES mattr;
    memset(&mattr, 0, sizeof mattr);
    mattr.Ptag = ptag;
    mattr.EnableRdmaWrite = VIP_FALSE;
    mattr.EnableRdmaRead = VIP_FALSE;

    VIP_DESCRIPTOR *desc;
    size_t desc_bytes = 3 * sizeof(VIP_DESCRIPTOR);
    if (posix_memalign((void **)&desc, VIP_DESCRIPTOR_ALIGNMENT, desc_bytes)) {
        fprintf(stderr, "%s: cannot allocate descriptors\n", prog);
        return 1;
    }
    memset(desc, 0, desc_bytes);
    char *msg;
    size_t msg_bytes = 3 * len;
    if (posix_memalign((void **)&msg, 64, msg_bytes)) {
        fprintf(stderr, "%s: cannot allocate message buffers\n", prog);
        return 1;
    }
    memset(msg, 0, msg_bytes);

    VIP_MEM_HANDLE desc_mh, msg_mh;
    CHECK(VipRegisterMem(nic, desc, desc_bytes, &mattr, &desc_mh), "descriptors");
    CHECK(VipRegisterMem(nic, msg, msg_bytes, &mattr, &msg_mh), "message buffers");

    /* desc[i] describes msg[i]: 0 sends, 1 and 2 receive. */
    for (int i = 0; i < 3; i++)
        fill_desc(&desc[i], msg + (size_t)i * len, msg_mh, (VIP_UINT32)len, i == 0);

    /* A receive is posted before connecting: the first echo finds it. */
    CHECK(VipPostRecv(vi, &desc[1], desc_mh), "first receive");
    VIP_DESCRIPTOR *descp = &desc[2];

    /* ---- connect ---- */
    VIP_VI_ATTRIBUTES rattr;
    {
        char who[160];
        snprintf(who, sizeof who, "server \"%s\", discriminator \"%s\"",
                 host ? host : "(this NIC)", disc);
        CHECK(VipConnectRequest(vi, local, remote, timeout_ms, &rattr), who);
    }
    if (!quiet) {
        printf("%s: connected to \"%s\" on %s\n", prog,
               host ? host : "this NIC", device);
        fflush(stdout);
    }

    /* ---- send, wait for the echo ---- */
    double total = 0, best = 0;
    for (unsigned long i = 0; i < count; i++) {
        VIP_DESCRIPTOR *d;
        double t0 = now_us();
        memcpy(msg, text, len); /* prepare msg[0] for sending */
        fill_desc(&desc[0], msg, msg_mh, (VIP_UINT32)len, 1);
        CHECK(VipPostSend(vi, &desc[0], desc_mh), NULL);
        CHECK(VipSendWait(vi, VIP_INFINITE, &d), NULL);
        check_completion(d, "the send");

        /* Post the spare receive, then take the oldest: the echo. */
        fill_desc(descp, descp->DS[0].Local.Data.Address, msg_mh, (VIP_UINT32)len, 0);
        CHECK(VipPostRecv(vi, descp, desc_mh), NULL);
        CHECK(VipRecvWait(vi, VIP_INFINITE, &descp), NULL);
        double dt = now_us() - t0;
        check_completion(descp, "the receive");

        const char *got = descp->DS[0].Local.Data.Address;
        if (descp->CS.Length != len || memcmp(got, text, len) != 0) {
            fprintf(stderr, "%s: echo %lu differs: sent %zu bytes \"%s\", got %u bytes \"%.*s\"\n",
                    prog, i + 1, len, text, (unsigned)descp->CS.Length,
                    (int)(descp->CS.Length < len ? descp->CS.Length : len), got);
            return 1;
        }
        if (!quiet)
            printf("%s: echo %lu: \"%.*s\" (%zu bytes) in %.1f us\n", prog, i + 1, (int)len,
                   got, len, dt);
        total += dt;
        if (i == 0 || dt < best)
            best = dt;
    }
    if (count)
        printf("%s: %lu echo%s of %zu bytes, round trip mean %.1f us, best %.1f us\n", prog,
               count, count == 1 ? "" : "es", len, total / (double)count, best);

    /* ---- tear down ---- */
    CHECK(VipDisconnect(vi), NULL);
    take_back(vi);
    CHECK(VipDestroyVi(vi), NULL);
    CHECK(VipDeregisterMem(nic, msg, msg_mh), "message buffers");
    CHECK(VipDeregisterMem(nic, desc, desc_mh), "descriptors");
    CHECK(VipDestroyPtag(nic, ptag), NULL);
    CHECK(VipNSShutdown(nic), NULL);
    CHECK(VipCloseNic(nic), NULL);
    free(msg);
    free(desc);
    free(local);
    free(remote);
    return 0;
}
