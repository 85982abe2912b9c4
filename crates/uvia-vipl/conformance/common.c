/*
 * Helpers the areas share (see common.h).
 */
#include "common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void side_open(struct side *s, const char *device)
{
    memset(s, 0, sizeof *s);
    REQUIRE_RET(VipOpenNic(device ? device : g_device, &s->nic), VIP_SUCCESS);
    REQUIRE_RET(VipQueryNic(s->nic, &s->attrs), VIP_SUCCESS);
    if (s->attrs.LocalNicAddress) {
        size_t n = s->attrs.NicAddressLen;
        host_hex(s->attrs.LocalNicAddress, n < VIPL_HOST_ADDRESS_LEN ? n : VIPL_HOST_ADDRESS_LEN, s->address);
    }
    REQUIRE_RET(VipCreatePtag(s->nic, &s->ptag), VIP_SUCCESS);
    s->arena_len = ARENA_LEN;
    s->arena = aligned_alloc(4096, s->arena_len);
    REQUIRE(s->arena != NULL);
    memset(s->arena, 0, s->arena_len);
    VIP_MEM_ATTRIBUTES ma = {.Ptag = s->ptag, .EnableRdmaWrite = VIP_FALSE, .EnableRdmaRead = VIP_FALSE};
    REQUIRE_RET(VipRegisterMem(s->nic, s->arena, s->arena_len, &ma, &s->mh), VIP_SUCCESS);
}

void side_open_peer(struct side *s)
{
    side_open(s, g_peer_device);
}

void side_close(struct side *s)
{
    if (!s->nic)
        return;
    for (int i = 0; i < s->nvis; i++) {
        VIP_DESCRIPTOR *d;
        VipDisconnect(s->vis[i]);
        for (int k = 0; k < 100000 && VipRecvDone(s->vis[i], &d) == VIP_SUCCESS; k++)
            ;
        for (int k = 0; k < 100000 && VipSendDone(s->vis[i], &d) == VIP_SUCCESS; k++)
            ;
        VipDestroyVi(s->vis[i]);
    }
    for (int i = 0; i < s->ncqs; i++)
        VipDestroyCQ(s->cqs[i]);
    for (int i = 0; i < s->nregions; i++)
        VipDeregisterMem(s->nic, s->regions[i].addr, s->regions[i].mh);
    VipDeregisterMem(s->nic, s->arena, s->mh);
    VipDestroyPtag(s->nic, s->ptag);
    VipCloseNic(s->nic);
    s->nic = NULL;
    s->nvis = s->ncqs = s->nregions = 0;
}

static void track_vi(struct side *s, VIP_VI_HANDLE vi)
{
    if (s->nvis < 16)
        s->vis[s->nvis++] = vi;
}

VIP_RETURN vi_destroy(struct side *s, VIP_VI_HANDLE vi)
{
    VIP_RETURN r = VipDestroyVi(vi);
    if (r == VIP_SUCCESS)
        for (int i = 0; i < s->nvis; i++)
            if (s->vis[i] == vi)
                s->vis[i] = s->vis[--s->nvis];
    return r;
}

void *arena_take(struct side *s, size_t n)
{
    size_t at = (s->used + 63) & ~(size_t)63;
    if (at + n > s->arena_len) {
        h_fail(__FILE__, __LINE__, "the test's arena is full (%zu bytes asked)", n);
        h_finish();
    }
    s->used = at + n;
    memset(s->arena + at, 0, n);
    return s->arena + at;
}

void *region_new(struct side *s, size_t n, VIP_PROTECTION_HANDLE ptag, int rdma_write,
                 int rdma_read, VIP_MEM_HANDLE *mh)
{
    size_t len = (n + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(4096, len ? len : 4096);
    REQUIRE(p != NULL);
    memset(p, 0, len ? len : 4096);
    VIP_MEM_ATTRIBUTES ma = {.Ptag = ptag,
                             .EnableRdmaWrite = rdma_write ? VIP_TRUE : VIP_FALSE,
                             .EnableRdmaRead = rdma_read ? VIP_TRUE : VIP_FALSE};
    REQUIRE_RET(VipRegisterMem(s->nic, p, n, &ma, mh), VIP_SUCCESS);
    if (s->nregions < 16) {
        s->regions[s->nregions].addr = p;
        s->regions[s->nregions++].mh = *mh;
    }
    return p;
}

VIP_DESCRIPTOR_SEGMENT *desc_seg(VIP_DESCRIPTOR *d, int i)
{
    return (VIP_DESCRIPTOR_SEGMENT *)((char *)d + sizeof(VIP_CONTROL_SEGMENT)) + i;
}

VIP_DESCRIPTOR *desc_new(struct side *s, int nseg)
{
    size_t n = sizeof(VIP_CONTROL_SEGMENT) + (size_t)(nseg < 2 ? 2 : nseg) * sizeof(VIP_DESCRIPTOR_SEGMENT);
    return arena_take(s, n);
}

void set_local(VIP_DESCRIPTOR *d, int i, void *addr, VIP_MEM_HANDLE h, uint32_t len)
{
    VIP_DESCRIPTOR_SEGMENT *g = desc_seg(d, i);
    g->Local.Data.AddressBits = (VIP_UINT64)(uintptr_t)addr;
    g->Local.Handle = h;
    g->Local.Length = len;
}

void set_remote(VIP_DESCRIPTOR *d, int i, uint64_t addr, VIP_MEM_HANDLE h)
{
    VIP_DESCRIPTOR_SEGMENT *g = desc_seg(d, i);
    g->Remote.Data.AddressBits = addr;
    g->Remote.Handle = h;
    g->Remote.Reserved = 0;
}

void *seg_buf(VIP_DESCRIPTOR *d, int i)
{
    return (void *)(uintptr_t)desc_seg(d, i)->Local.Data.AddressBits;
}

void fill_pattern(void *buf, size_t n, unsigned seed)
{
    unsigned char *p = buf;
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 16);
    }
}

long check_pattern(const void *buf, size_t n, unsigned seed)
{
    const unsigned char *p = buf;
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        if (p[i] != (unsigned char)(x >> 16))
            return (long)i;
    }
    return -1;
}

VIP_DESCRIPTOR *send_desc(struct side *s, const void *data, uint32_t len, unsigned seed)
{
    VIP_DESCRIPTOR *d = desc_new(s, 1);
    void *buf = arena_take(s, len ? len : 1);
    if (data)
        memcpy(buf, data, len);
    else
        fill_pattern(buf, len, seed);
    d->CS.SegCount = 1;
    d->CS.Control = VIP_CONTROL_OP_SENDRECV;
    set_local(d, 0, buf, s->mh, len);
    return d;
}

VIP_DESCRIPTOR *recv_desc(struct side *s, uint32_t len)
{
    VIP_DESCRIPTOR *d = desc_new(s, 1);
    void *buf = arena_take(s, len ? len : 1);
    d->CS.SegCount = 1;
    d->CS.Control = VIP_CONTROL_OP_SENDRECV;
    set_local(d, 0, buf, s->mh, len);
    return d;
}

VIP_VI_ATTRIBUTES vi_attrs(struct side *s, VIP_RELIABILITY_LEVEL level)
{
    VIP_VI_ATTRIBUTES a;
    memset(&a, 0, sizeof a);
    a.ReliabilityLevel = level;
    a.MaxTransferSize = s->attrs.MaxTransferSize < (1u << 20) ? s->attrs.MaxTransferSize : (1u << 20);
    a.QoS = NULL;
    a.Ptag = s->ptag;
    a.EnableRdmaWrite = VIP_FALSE;
    a.EnableRdmaRead = VIP_FALSE;
    return a;
}

VIP_VI_HANDLE vi_new(struct side *s, VIP_RELIABILITY_LEVEL level, int rdma_write,
                     int rdma_read, VIP_CQ_HANDLE scq, VIP_CQ_HANDLE rcq)
{
    VIP_VI_ATTRIBUTES a = vi_attrs(s, level);
    a.EnableRdmaWrite = rdma_write ? VIP_TRUE : VIP_FALSE;
    a.EnableRdmaRead = rdma_read ? VIP_TRUE : VIP_FALSE;
    VIP_VI_HANDLE vi = NULL;
    REQUIRE_RET(VipCreateVi(s->nic, &a, scq, rcq, &vi), VIP_SUCCESS);
    track_vi(s, vi);
    return vi;
}

VIP_NET_ADDRESS *addr_raw(const void *host, size_t hostlen, const void *disc, size_t disclen)
{
    VIP_NET_ADDRESS *a = calloc(1, sizeof(VIP_NET_ADDRESS) + hostlen + disclen + 64);
    REQUIRE(a != NULL);
    a->HostAddressLen = (VIP_UINT16)hostlen;
    a->DiscriminatorLen = (VIP_UINT16)disclen;
    unsigned char *p = a->HostAddress;
    if (hostlen)
        memcpy(p, host, hostlen);
    if (disclen)
        memcpy(p + hostlen, disc, disclen);
    return a;
}

void host_hex(const void *bytes, size_t n, char out[HOST_TEXT])
{
    const unsigned char *b = bytes;
    out[0] = 0;
    for (size_t i = 0; i < n && i < VIPL_HOST_ADDRESS_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

size_t host_unhex(const char *hex, unsigned char out[VIPL_HOST_ADDRESS_LEN])
{
    size_t n = strlen(hex);
    if (n % 2 || n / 2 > VIPL_HOST_ADDRESS_LEN)
        return 0;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return 0;
        out[i] = (unsigned char)v;
    }
    return n / 2;
}

void host_expect(const char *text, char out[HOST_TEXT])
{
    host_expect_as(g_provider, text, out);
}

void host_expect_as(const char *provider, const char *text, char out[HOST_TEXT])
{
    unsigned char b[VIPL_HOST_ADDRESS_LEN];
    size_t n = 0;
    memset(b, 0, sizeof b);
    if (strcmp(provider, "shm") == 0) {
        n = 6;
        REQUIRE(strlen(text) >= 1 && strlen(text) <= n);
        memcpy(b, text, strlen(text));
    } else if (strcmp(provider, "xdp") == 0) {
        unsigned m[6];
        REQUIRE(sscanf(text, "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) == 6);
        for (n = 0; n < 6; n++)
            b[n] = (unsigned char)m[n];
    } else {
        char ip[64];
        const char *colon = strrchr(text, ':');
        REQUIRE(colon != NULL && (size_t)(colon - text) < sizeof ip);
        unsigned port = (unsigned)atoi(colon + 1);
        if (text[0] == '[') {
            snprintf(ip, sizeof ip, "%.*s", (int)(colon - text - 2), text + 1);
            REQUIRE(inet_pton(AF_INET6, ip, b) == 1);
            n = 16;
        } else {
            snprintf(ip, sizeof ip, "%.*s", (int)(colon - text), text);
            REQUIRE(inet_pton(AF_INET, ip, b) == 1);
            n = 4;
        }
        b[n++] = (unsigned char)(port >> 8);
        b[n++] = (unsigned char)port;
    }
    host_hex(b, n, out);
}

void host_display(const char *hex, char *out, size_t n)
{
    unsigned char b[VIPL_HOST_ADDRESS_LEN];
    size_t len = host_unhex(hex, b);
    char ip[INET6_ADDRSTRLEN];
    if (strcmp(g_provider, "shm") == 0)
        snprintf(out, n, "%.*s", (int)strnlen((const char *)b, len), (const char *)b);
    else if (strcmp(g_provider, "xdp") == 0 && len == 6)
        snprintf(out, n, "%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5]);
    else if (len == 6 && inet_ntop(AF_INET, b, ip, sizeof ip))
        snprintf(out, n, "%s:%u", ip, (unsigned)b[4] << 8 | b[5]);
    else if (len == 18 && inet_ntop(AF_INET6, b, ip, sizeof ip))
        snprintf(out, n, "[%s]:%u", ip, (unsigned)b[16] << 8 | b[17]);
    else
        snprintf(out, n, "?%s", hex);
}

void short_instance(char letter, char out[8])
{
    char digits[8];
    int k = 0;
    unsigned pid = (unsigned)getpid();
    do {
        digits[k++] = "0123456789abcdefghijklmnopqrstuvwxyz"[pid % 36];
        pid /= 36;
    } while (pid && k < 5);
    out[0] = letter;
    for (int i = 0; i < k; i++)
        out[1 + i] = digits[k - 1 - i];
    out[1 + k] = 0;
}

VIP_NET_ADDRESS *addr_new(const char *host, const char *disc)
{
    unsigned char h[VIPL_HOST_ADDRESS_LEN];
    size_t n = host_unhex(host, h);
    return addr_raw(h, n, disc, disc ? strlen(disc) : 0);
}

VIP_NET_ADDRESS *addr_room(void)
{
    VIP_NET_ADDRESS *a = calloc(1, sizeof(VIP_NET_ADDRESS) + VIPL_HOST_ADDRESS_LEN + 256);
    REQUIRE(a != NULL);
    return a;
}

void disc_new(char out[33])
{
    static unsigned n;
    snprintf(out, 33, "v%d.%u", (int)getpid(), ++n);
}

void srv_accept(struct side *s, VIP_VI_HANDLE vi, const char *disc, int ms)
{
    VIP_NET_ADDRESS *local = addr_new(s->address, disc);
    VIP_NET_ADDRESS *remote = addr_room();
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    REQUIRE_RET(VipConnectWait(s->nic, local, (VIP_ULONG)ms, remote, &ra, &conn), VIP_SUCCESS);
    REQUIRE_RET(VipConnectAccept(conn, vi), VIP_SUCCESS);
    free(local);
    free(remote);
}

void cli_connect(struct side *s, VIP_VI_HANDLE vi, const char *host, const char *disc, int ms)
{
    VIP_NET_ADDRESS *local = addr_new(s->address, disc);
    VIP_NET_ADDRESS *remote = addr_new(host, disc);
    VIP_VI_ATTRIBUTES ra;
    REQUIRE_RET(VipConnectRequest(vi, local, remote, (VIP_ULONG)ms, &ra), VIP_SUCCESS);
    free(local);
    free(remote);
}

void send_addr(struct chan *c, struct side *s)
{
    chan_send(c, T_ADDR, s->address, strlen(s->address) + 1);
}

void recv_addr(struct chan *c, char host[HOST_TEXT])
{
    memset(host, 0, HOST_TEXT);
    if (CHAN_EXPECT(c, 10000, T_ADDR, host, HOST_TEXT - 1) != 0)
        h_finish();
}

VIP_DESCRIPTOR *wait_one(const char *file, int line, VIP_VI_HANDLE vi, int ms, int recv)
{
    VIP_DESCRIPTOR *d = NULL;
    VIP_RETURN r = recv ? VipRecvWait(vi, (VIP_ULONG)ms, &d) : VipSendWait(vi, (VIP_ULONG)ms, &d);
    check_ret(file, line, recv ? "VipRecvWait" : "VipSendWait", r, VIP_SUCCESS);
    if (r != VIP_SUCCESS)
        return NULL;
    h_count();
    if (d == NULL)
        h_fail(file, line, "%s returned VIP_SUCCESS and a NULL descriptor",
               recv ? "VipRecvWait" : "VipSendWait");
    return d;
}

void pump(VIP_VI_HANDLE vi, int ms)
{
    long long end = now_ms() + ms;
    do {
        VIP_DESCRIPTOR *d = NULL;
        if (VipSendDone(vi, &d) == VIP_SUCCESS)
            h_fail(__FILE__, __LINE__, "pump: took a send descriptor the test did not expect");
        sleep_ms(1);
    } while (now_ms() < end);
}

int chan_recv_pump(struct chan *c, VIP_VI_HANDLE vi, int ms, void *buf, size_t max)
{
    long long end = now_ms() + ms;
    for (;;) {
        int tag = chan_recv(c, 1, buf, max, NULL);
        if (tag >= 0)
            return tag;
        if (now_ms() >= end)
            return -1;
        VIP_DESCRIPTOR *d = NULL;
        if (VipSendDone(vi, &d) == VIP_SUCCESS)
            h_fail(__FILE__, __LINE__, "pump: took a send descriptor the test did not expect");
    }
}

int vi_state(VIP_VI_HANDLE vi)
{
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES a;
    VIP_BOOLEAN se, re;
    if (VipQueryVi(vi, &st, &a, &se, &re) != VIP_SUCCESS)
        return -1;
    return (int)st;
}

int wait_state(VIP_VI_HANDLE vi, VIP_VI_STATE want, int ms, int drive)
{
    long long end = now_ms() + ms;
    int st;
    for (;;) {
        st = vi_state(vi);
        if (st == (int)want || now_ms() >= end)
            return st;
        if (drive)
            pump(vi, 2);
        else
            sleep_ms(2);
    }
}

int claimed_levels(VIP_RELIABILITY_LEVEL out[3])
{
    static const VIP_RELIABILITY_LEVEL all[3] = {VIP_SERVICE_UNRELIABLE, VIP_SERVICE_RELIABLE_DELIVERY,
                                                 VIP_SERVICE_RELIABLE_RECEPTION};
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (g_nic.ReliabilityLevelSupport & all[i])
            out[n++] = all[i];
    return n;
}

const char *level_name(VIP_RELIABILITY_LEVEL l)
{
    switch (l) {
    case VIP_SERVICE_UNRELIABLE:
        return "unreliable";
    case VIP_SERVICE_RELIABLE_DELIVERY:
        return "reliable delivery";
    case VIP_SERVICE_RELIABLE_RECEPTION:
        return "reliable reception";
    }
    return "?";
}

void require_level(VIP_RELIABILITY_LEVEL l)
{
    if (!(g_nic.ReliabilityLevelSupport & l))
        h_skip("the NIC does not claim %s (ReliabilityLevelSupport 0x%x)", level_name(l),
               (unsigned)g_nic.ReliabilityLevelSupport);
}

VIP_RELIABILITY_LEVEL any_reliable_level(void)
{
    if (g_nic.ReliabilityLevelSupport & VIP_SERVICE_RELIABLE_DELIVERY)
        return VIP_SERVICE_RELIABLE_DELIVERY;
    if (g_nic.ReliabilityLevelSupport & VIP_SERVICE_RELIABLE_RECEPTION)
        return VIP_SERVICE_RELIABLE_RECEPTION;
    return 0;
}

VIP_RELIABILITY_LEVEL default_level(void)
{
    VIP_RELIABILITY_LEVEL l[3];
    if (g_nic.ReliabilityLevelSupport & VIP_SERVICE_RELIABLE_DELIVERY)
        return VIP_SERVICE_RELIABLE_DELIVERY;
    return claimed_levels(l) ? l[0] : VIP_SERVICE_RELIABLE_DELIVERY;
}

int is_network(void)
{
    return strcmp(g_provider, "udp") == 0 || strcmp(g_provider, "xdp") == 0;
}

void capture_start(struct capture *c)
{
    int p[2];
    memset(c, 0, sizeof *c);
    REQUIRE(pipe2(p, O_NONBLOCK) == 0);
    c->rd = p[0];
    c->wr = p[1];
    fflush(stderr);
    c->saved = dup(2);
    REQUIRE(c->saved >= 0 && dup2(c->wr, 2) == 2);
}

void capture_read(struct capture *c)
{
    ssize_t k;
    while (c->got < sizeof c->buf - 1 && (k = read(c->rd, c->buf + c->got, sizeof c->buf - 1 - c->got)) > 0)
        c->got += (size_t)k;
    c->buf[c->got] = 0;
}

void capture_end(struct capture *c)
{
    capture_read(c);
    dup2(c->saved, 2);
    close(c->saved);
    close(c->rd);
    close(c->wr);
}

void write_temp(const char *text, char path[256])
{
    const char *dir = getenv("TMPDIR");
    snprintf(path, 256, "%s/vipl-conf-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    size_t n = strlen(text);
    REQUIRE(write(fd, text, n) == (ssize_t)n);
    close(fd);
    h_unlink_at_end(path);
}

/* ---- Connected pairs -------------------------------------------------------- */

VIP_DESCRIPTOR *conn_post_recv(struct conn *x, uint32_t len)
{
    VIP_DESCRIPTOR *d = recv_desc(&x->s, len);
    REQUIRE_RET(VipPostRecv(x->vi, d, x->s.mh), VIP_SUCCESS);
    if (x->npre < 64)
        x->pre[x->npre++] = d;
    return d;
}

static void conn_make(struct conn *x, const struct pair_cfg *cfg, int server)
{
    VIP_RELIABILITY_LEVEL level = cfg->level ? cfg->level : default_level();
    if (server ? cfg->srv_cq : cfg->cli_cq) {
        REQUIRE_RET(VipCreateCQ(x->s.nic, cfg->cq_entries ? cfg->cq_entries : 64, &x->scq), VIP_SUCCESS);
        x->rcq = x->scq;
        x->s.cqs[x->s.ncqs++] = x->scq;
    }
    VIP_VI_ATTRIBUTES a = vi_attrs(&x->s, level);
    if (cfg->mtu)
        a.MaxTransferSize = cfg->mtu;
    a.EnableRdmaWrite = cfg->rdma_write && !(server && cfg->srv_no_rdma) ? VIP_TRUE : VIP_FALSE;
    a.EnableRdmaRead = cfg->rdma_read && !(server && cfg->srv_no_rdma) ? VIP_TRUE : VIP_FALSE;
    REQUIRE_RET(VipCreateVi(x->s.nic, &a, x->scq, x->rcq, &x->vi), VIP_SUCCESS);
    track_vi(&x->s, x->vi);
    int n = server ? cfg->srv_recvs : cfg->cli_recvs;
    for (int i = 0; i < n; i++)
        conn_post_recv(x, cfg->recv_len ? cfg->recv_len : 256);
}

static void pair_server(struct chan *c, void *arg)
{
    const struct pair_cfg *cfg = arg;
    struct conn x;
    memset(&x, 0, sizeof x);
    x.c = c;
    x.cfg = cfg;
    side_open_peer(&x.s);
    send_addr(c, &x.s);
    conn_make(&x, cfg, 1);
    if (cfg->prepare)
        cfg->prepare(&x, cfg->arg);
    srv_accept(&x.s, x.vi, cfg->disc, 10000);
    chan_send(c, T_READY, NULL, 0);
    if (cfg->server)
        cfg->server(&x, cfg->arg);
    /* Stay connected (and moving) until the test is done with us. */
    int tag = chan_recv_pump(c, x.vi, 20000, NULL, 0);
    CHECKF(tag == T_QUIT, "server: expected the test's T_QUIT, got %d", tag);
    VipDisconnect(x.vi);
    side_close(&x.s);
}

void pair_open(struct pair *pr, const struct pair_cfg *cfg)
{
    memset(pr, 0, sizeof *pr);
    pr->cfg = *cfg;
    disc_new(pr->cfg.disc);
    peer_start(&pr->p, pair_server, &pr->cfg);
    struct conn *x = &pr->x;
    x->c = &pr->p.c;
    x->cfg = &pr->cfg;
    side_open(&x->s, NULL);
    recv_addr(x->c, pr->server_address);
    conn_make(x, &pr->cfg, 0);
    cli_connect(&x->s, x->vi, pr->server_address, pr->cfg.disc, 10000);
    if (CHAN_EXPECT(x->c, 10000, T_READY, NULL, 0) != 0)
        h_finish();
}

void pair_close(struct pair *pr)
{
    chan_send(&pr->p.c, T_QUIT, NULL, 0);
    peer_end_pumping(&pr->p, pr->x.vi, 15000);
    VipDisconnect(pr->x.vi);
    side_close(&pr->x.s);
}

void peer_end_pumping(struct peer *p, VIP_VI_HANDLE vi, int ms)
{
    /* Keep this side moving while the peer finishes (a provider may need
     * this side's calls to acknowledge the peer's last messages: the
     * reliability area tests that on its own). */
    long long end = now_ms() + ms;
    while (!p->done && now_ms() < end) {
        struct pollfd pfd = {.fd = p->result_fd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0)
            break;
        pump(vi, 2);
    }
    peer_end(p, ms);
}

void check_refused(const char *file, int line, const char *what, const VIP_DESCRIPTOR *d, uint32_t err)
{
    h_count();
    uint32_t st = d->CS.Status;
    if (!(st & VIP_STATUS_DONE) || (st & VIP_STATUS_ERROR_MASK) != err) {
        char g[256], w[256];
        h_fail(file, line, "status of refused %s: expected %s, got %s (0x%x)", what,
               bits_name(VIP_STATUS_DONE | err, w, sizeof w), status_name(st, g, sizeof g), (unsigned)st);
    }
}
