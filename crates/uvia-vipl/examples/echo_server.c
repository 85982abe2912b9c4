/*
 * echo_server.c: the VIA echo server of the ping-pong slides, over VIPL.
 *
 * It waits for one client on a discriminator, then sends every message it
 * receives back to it, until the client disconnects (or -n messages have
 * been echoed). The shape is the one the slides give:
 *
 *     open the NIC, create a VI
 *     allocate and register two descriptors and two message buffers
 *     post a receive before connecting
 *     VipConnectWait, VipConnectAccept
 *     loop: post a receive, wait for the oldest, send it back, wait for the send
 *     disconnect, deregister, destroy
 *
 * The descriptor that has just been echoed becomes the next posted receive,
 * so one receive is always waiting while a message is on its way back.
 *
 * Build:  cc -std=c11 -Wall -Wextra -O2 echo_server.c $(pkg-config --cflags --libs vipl)
 * Run:    ./echo_server [-d /dev/via_lo] [-D echo]   (then ./echo_client)
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vipl.h>

static const char *prog = "echo_server";

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

/* Prints a host address's bytes in hex: host addresses are binary
 * (M-VIA's 6 bytes: an IPv4 address and port on udp). */
static void print_host(const VIP_NET_ADDRESS *a)
{
    for (unsigned i = 0; i < a->HostAddressLen; i++)
        printf("%02x", a->HostAddress[i]);
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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "  Waits for one echo client and sends back every message it receives.\n"
            "  -d DEVICE   VIA device (default /dev/via_lo)\n"
            "  -h HOST     this server's host name, looked up with VipNSGetHostByName\n"
            "              (default: the NIC's own address)\n"
            "  -D DISC     discriminator clients connect to (default \"echo\")\n"
            "  -n COUNT    stop after COUNT messages (default 0: until the client leaves)\n"
            "  -s BYTES    largest message accepted (default 65536)\n"
            "  -t MS       how long to wait for a client, in ms (default: forever)\n"
            "  -q          quiet: do not print each message\n",
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
    unsigned long count = 0;
    unsigned long maxlen = 65536;
    VIP_ULONG wait_ms = VIP_INFINITE;
    int quiet = 0;
    int c;

    while ((c = getopt(argc, argv, "d:h:D:n:s:t:q")) != -1) {
        switch (c) {
        case 'd': device = optarg; break;
        case 'h': host = optarg; break;
        case 'D': disc = optarg; break;
        case 'n': count = parse_ulong(optarg, "-n"); break;
        case 's': maxlen = parse_ulong(optarg, "-s"); break;
        case 't': wait_ms = parse_ulong(optarg, "-t"); break;
        case 'q': quiet = 1; break;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    if (maxlen == 0 || maxlen > 0xffffffffUL) {
        fprintf(stderr, "%s: -s must be between 1 and 4294967295\n", prog);
        return 2;
    }

    /* ---- the NIC ---- */
    VIP_NIC_HANDLE nic;
    VIP_NIC_ATTRIBUTES nattr;
    CHECK(VipOpenNic((const VIP_CHAR *)device, &nic), device);
    CHECK(VipQueryNic(nic, &nattr), NULL);
    CHECK(VipNSInit(nic, NULL), NULL);
    if (maxlen > nattr.MaxTransferSize) {
        fprintf(stderr, "%s: -s %lu is above the NIC's largest transfer (%lu bytes)\n", prog,
                maxlen, (unsigned long)nattr.MaxTransferSize);
        return 1;
    }
    if (strlen(disc) > nattr.MaxDiscriminatorLen) {
        fprintf(stderr, "%s: discriminator \"%s\" is longer than the NIC's %u bytes\n", prog,
                disc, (unsigned)nattr.MaxDiscriminatorLen);
        return 1;
    }

    /* Our own address: the host, then the discriminator clients ask for. */
    VIP_NET_ADDRESS *local = new_address(nattr.NicAddressLen, disc);
    if (host) {
        CHECK(VipNSGetHostByName(nic, (VIP_CHAR *)host, local, 0), host);
        local->DiscriminatorLen = (VIP_UINT16)strlen(disc);
        memcpy(local->HostAddress + local->HostAddressLen, disc, strlen(disc));
    } else {
        memcpy(local->HostAddress, nattr.LocalNicAddress, nattr.NicAddressLen);
    }
    /* Room for the client's address (uvia: its discriminator is as long as ours). */
    VIP_NET_ADDRESS *remote = new_address(nattr.NicAddressLen, disc);

    /* ---- protection tag, VI ---- */
    VIP_PROTECTION_HANDLE ptag;
    CHECK(VipCreatePtag(nic, &ptag), NULL);

    VIP_VI_ATTRIBUTES vattr;
    memset(&vattr, 0, sizeof vattr);
    vattr.ReliabilityLevel = (nattr.ReliabilityLevelSupport & VIP_SERVICE_RELIABLE_DELIVERY)
                                 ? VIP_SERVICE_RELIABLE_DELIVERY
                                 : VIP_SERVICE_UNRELIABLE;
    vattr.MaxTransferSize = maxlen;
    vattr.QoS = NULL;
    vattr.Ptag = ptag;
    vattr.EnableRdmaWrite = VIP_FALSE;
    vattr.EnableRdmaRead = VIP_FALSE;
    VIP_VI_HANDLE vi;
    CHECK(VipCreateVi(nic, &vattr, NULL, NULL, &vi), NULL);

    /* ---- two descriptors and two message buffers, registered ---- */
    VIP_MEM_ATTRIBUTES mattr;
    memset(&mattr, 0, sizeof mattr);
    mattr.Ptag = ptag;
    mattr.EnableRdmaWrite = VIP_FALSE;
    mattr.EnableRdmaRead = VIP_FALSE;

    VIP_DESCRIPTOR *desc;
    size_t desc_bytes = 2 * sizeof(VIP_DESCRIPTOR);
    if (posix_memalign((void **)&desc, VIP_DESCRIPTOR_ALIGNMENT, desc_bytes)) {
        fprintf(stderr, "%s: cannot allocate descriptors\n", prog);
        return 1;
    }
    memset(desc, 0, desc_bytes);
    char *msg;
    size_t msg_bytes = 2 * (size_t)maxlen;
    if (posix_memalign((void **)&msg, 4096, msg_bytes)) {
        fprintf(stderr, "%s: cannot allocate %zu bytes of message buffers\n", prog, msg_bytes);
        return 1;
    }
    memset(msg, 0, msg_bytes);

    VIP_MEM_HANDLE desc_mh, msg_mh;
    CHECK(VipRegisterMem(nic, desc, desc_bytes, &mattr, &desc_mh), "descriptors");
    CHECK(VipRegisterMem(nic, msg, msg_bytes, &mattr, &msg_mh), "message buffers");

    char *buf[2] = {msg, msg + maxlen};
    fill_desc(&desc[0], buf[0], msg_mh, (VIP_UINT32)maxlen, 0);
    fill_desc(&desc[1], buf[1], msg_mh, (VIP_UINT32)maxlen, 0);

    /* A receive is posted before the connection exists, so the client's
     * first message always finds one. */
    CHECK(VipPostRecv(vi, &desc[0], desc_mh), "first receive");
    VIP_DESCRIPTOR *descp = &desc[1];

    /* ---- wait for the client ---- */
    if (!quiet) {
        printf("%s: waiting on %s, host ", prog, device);
        print_host(local);
        printf(", discriminator \"%s\"\n", disc);
        fflush(stdout);
    }
    VIP_CONN_HANDLE conn;
    VIP_VI_ATTRIBUTES rattr;
    CHECK(VipConnectWait(nic, local, wait_ms, remote, &rattr, &conn), "waiting for a client");
    CHECK(VipConnectAccept(conn, vi), NULL);
    if (!quiet) {
        printf("%s: client ", prog);
        print_host(remote);
        printf(" connected\n");
        fflush(stdout);
    }

    /* ---- echo ---- */
    unsigned long echoed = 0;
    int client_left = 0;
    char why[128];
    while (count == 0 || echoed < count) {
        /* Keep one receive waiting while this message goes back. */
        fill_desc(descp, descp->DS[0].Local.Data.Address, msg_mh, (VIP_UINT32)maxlen, 0);
        CHECK(VipPostRecv(vi, descp, desc_mh), NULL);
        CHECK(VipRecvWait(vi, VIP_INFINITE, &descp), NULL);
        if (descp->CS.Status & VIP_STATUS_ERROR_MASK) {
            if (descp->CS.Status & (VIP_STATUS_DESC_FLUSHED_ERROR | VIP_STATUS_TRANSPORT_ERROR)) {
                client_left = 1; /* the client disconnected (or went away) */
                break;
            }
            status_text(descp->CS.Status, why, sizeof why);
            fprintf(stderr, "%s: a receive completed with an error (status 0x%x: %s)\n", prog,
                    (unsigned)descp->CS.Status, why);
            return 1;
        }
        VIP_UINT32 len = descp->CS.Length;
        if (!quiet) {
            const char *p = descp->DS[0].Local.Data.Address;
            int shown = len > 60 ? 60 : (int)len;
            if (shown && p[shown - 1] == '\0')
                shown--;
            printf("%s: %u bytes: \"%.*s\"%s\n", prog, (unsigned)len, shown, p,
                   len > 60 ? "..." : "");
            fflush(stdout);
        }
        /* The same descriptor and buffer go back as a send of what came in. */
        fill_desc(descp, descp->DS[0].Local.Data.Address, msg_mh, len, 1);
        CHECK(VipPostSend(vi, descp, desc_mh), NULL);
        CHECK(VipSendWait(vi, VIP_INFINITE, &descp), NULL);
        if (descp->CS.Status & VIP_STATUS_ERROR_MASK) {
            status_text(descp->CS.Status, why, sizeof why);
            fprintf(stderr, "%s: a send completed with an error (status 0x%x: %s)\n", prog,
                    (unsigned)descp->CS.Status, why);
            return 1;
        }
        echoed++;
    }
    if (!quiet)
        printf("%s: %lu message%s echoed; %s\n", prog, echoed, echoed == 1 ? "" : "s",
               client_left ? "the client disconnected" : "done");

    /* ---- tear down: disconnect, take back what is still posted, free ---- */
    VIP_RETURN r = VipDisconnect(vi);
    if (r != VIP_SUCCESS && !(client_left && r == VIP_INVALID_STATE))
        die_vip("VipDisconnect(vi)", r, NULL);
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
