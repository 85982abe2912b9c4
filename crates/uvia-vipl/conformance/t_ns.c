/*
 * The name service: a temporary hosts file given to VipNSInit (or named
 * by VIPL_HOSTS); names by index, addresses back to names, unknown names
 * and addresses, comments, a name that is itself an address, a name
 * buffer too small, and a connection made to an address the service
 * returned.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char hosts_text[] = "# hosts of the name service test\n"
                                 "alpha    shm  0\n"
                                 "beta     shm  nsins1     # a trailing comment\n"
                                 "multi    shm  nsm1\n"
                                 "multi    shm  nsm2\n"
                                 "ualpha   udp  127.0.0.1:7001\n"
                                 "ubeta    udp  127.0.0.1:7002   # a trailing comment\n"
                                 "umulti   udp  127.0.0.1:7011\n"
                                 "umulti   udp  127.0.0.1:7012\n"
                                 "\n"
                                 "xalpha   xdp  02:00:00:00:00:0a\n"
                                 "xbeta    xdp  02:00:00:00:00:0b   # a trailing comment\n"
                                 "xmulti   xdp  02:00:00:00:00:1a\n"
                                 "xmulti   xdp  02:00:00:00:00:1b\n"
                                 "#hidden.invalid shm  nshid\n"
                                 "#hidden.invalid udp  127.0.0.1:7099\n"
                                 "#hidden.invalid xdp  02:00:00:00:00:99\n";

/* The names and addresses of the provider under test. */
struct names {
    const char *alpha, *alpha_addr, *beta, *beta_addr, *multi, *multi_addr[2], *self;
};

static const struct names *names_for_provider(void)
{
    static const struct names shm = {"alpha", "0", "beta", "nsins1", "multi", {"nsm1", "nsm2"}, "0"};
    static const struct names udp = {"ualpha", "127.0.0.1:7001", "ubeta", "127.0.0.1:7002",
                                     "umulti", {"127.0.0.1:7011", "127.0.0.1:7012"}, "127.0.0.1:7999"};
    static const struct names xdp = {"xalpha", "02:00:00:00:00:0a", "xbeta", "02:00:00:00:00:0b",
                                     "xmulti", {"02:00:00:00:00:1a", "02:00:00:00:00:1b"}, "02:00:00:00:00:77"};
    if (strcmp(g_provider, "udp") == 0)
        return &udp;
    if (strcmp(g_provider, "xdp") == 0)
        return &xdp;
    return &shm;
}

/* Looks name up (index i) and checks the host address written. */
static void check_lookup(const char *file, int line, VIP_NIC_HANDLE nic, const char *name, VIP_ULONG i,
                         const char *want)
{
    VIP_NET_ADDRESS *a = addr_room();
    /* The discriminator is the caller's: what is there stays. */
    a->DiscriminatorLen = 5;
    memset(a->HostAddress, 'D', VIPL_HOST_ADDRESS_LEN + 5);
    VIP_RETURN r = VipNSGetHostByName(nic, (VIP_CHAR *)name, a, i);
    char what[128];
    snprintf(what, sizeof what, "VipNSGetHostByName(\"%s\", index %lu)", name, i);
    check_ret(file, line, what, r, VIP_SUCCESS);
    if (r == VIP_SUCCESS) {
        char got[HOST_TEXT], hex[HOST_TEXT];
        size_t len = a->HostAddressLen <= VIPL_HOST_ADDRESS_LEN ? a->HostAddressLen : VIPL_HOST_ADDRESS_LEN;
        host_hex(a->HostAddress, len, got);
        host_expect(want, hex);
        h_count();
        if (strcmp(got, hex) != 0)
            h_fail(file, line, "\"%s\" #%lu: expected \"%s\" (%s), got %s (%u bytes)", name, i, want, hex, got,
                   (unsigned)a->HostAddressLen);
        int kept = a->DiscriminatorLen == 5;
        for (int k = 0; k < 5; k++)
            kept &= a->HostAddress[len + k] == 'D';
        h_count();
        if (!kept)
            h_fail(file, line, "\"%s\": the caller's discriminator was changed", name);
    }
    free(a);
}
#define CHECK_LOOKUP(nic, name, i, want) check_lookup(__FILE__, __LINE__, (nic), (name), (i), (want))

static VIP_RETURN lookup(VIP_NIC_HANDLE nic, const char *name, VIP_ULONG i)
{
    VIP_NET_ADDRESS *a = addr_room();
    VIP_RETURN r = VipNSGetHostByName(nic, (VIP_CHAR *)name, a, i);
    free(a);
    return r;
}

static void t_by_name(int arg)
{
    (void)arg;
    const struct names *n = names_for_provider();
    char path[256];
    write_temp(hosts_text, path);
    struct side s;
    side_open(&s, NULL);
    REQUIRE_RET(VipNSInit(s.nic, path), VIP_SUCCESS);
    CHECK_LOOKUP(s.nic, n->alpha, 0, n->alpha_addr);
    CHECK_LOOKUP(s.nic, n->beta, 0, n->beta_addr);
    CHECK_LOOKUP(s.nic, n->multi, 0, n->multi_addr[0]);
    CHECK_LOOKUP(s.nic, n->multi, 1, n->multi_addr[1]);
    CHECK_RET(lookup(s.nic, n->multi, 2), VIP_ERROR_NAMESERVICE);
    CHECK_RET(lookup(s.nic, n->alpha, 1), VIP_ERROR_NAMESERVICE);
    /* Not in the file, or only in a comment. */
    /* (.invalid names: the system's resolver, asked after the file, is
     * never asked for them, so the test sends no query anywhere.) */
    CHECK_RET(lookup(s.nic, "no-such-host.invalid", 0), VIP_ERROR_NAMESERVICE);
    CHECK_RET(lookup(s.nic, "hidden.invalid", 0), VIP_ERROR_NAMESERVICE);
    /* An address of the provider resolves to itself: on udp and xdp any in
     * its syntax, on shm the NIC's own instance ("0") and the listed ones
     * (any word is an instance name there, docs/VIPL.md). */
    CHECK_LOOKUP(s.nic, n->self, 0, n->self);
    CHECK_LOOKUP(s.nic, n->beta_addr, 0, n->beta_addr);
    /* On udp, a name the file lacks goes to the system's resolver:
     * localhost is this host at the default port (the NIC's own IP when
     * the NIC is not on loopback), 7100 or VIPL_PORT. */
    if (strcmp(g_provider, "udp") == 0 && s.attrs.NicAddressLen == 6) {
        char want[HOST_TEXT], got[HOST_TEXT];
        const char *ip = strncmp(s.address, "7f", 2) == 0 ? "7f000001" : s.address;
        unsetenv("VIPL_PORT");
        snprintf(want, sizeof want, "%.8s1bbc", ip);
        VIP_NET_ADDRESS *l = addr_room();
        CHECK_RET(VipNSGetHostByName(s.nic, "localhost", l, 0), VIP_SUCCESS);
        host_hex(l->HostAddress, l->HostAddressLen, got);
        CHECKF(strcmp(got, want) == 0, "localhost is %s, expected %s", got, want);
        setenv("VIPL_PORT", "7345", 1);
        snprintf(want, sizeof want, "%.8s1cb1", ip);
        CHECK_RET(VipNSGetHostByName(s.nic, "localhost", l, 0), VIP_SUCCESS);
        host_hex(l->HostAddress, l->HostAddressLen, got);
        CHECKF(strcmp(got, want) == 0, "localhost with VIPL_PORT=7345 is %s, expected %s", got, want);
        unsetenv("VIPL_PORT");
        /* A name with its port: 7001 is 0x1b59. */
        snprintf(want, sizeof want, "%.8s1b59", ip);
        CHECK_RET(VipNSGetHostByName(s.nic, "localhost:7001", l, 0), VIP_SUCCESS);
        host_hex(l->HostAddress, l->HostAddressLen, got);
        CHECKF(strcmp(got, want) == 0, "localhost:7001 is %s, expected %s", got, want);
        free(l);
    }
    VIP_NET_ADDRESS *a = addr_room();
    CHECK_RET(VipNSGetHostByName(s.nic, NULL, a, 0), VIP_INVALID_PARAMETER);
    CHECK_RET(VipNSGetHostByName(s.nic, (VIP_CHAR *)n->alpha, NULL, 0), VIP_INVALID_PARAMETER);
    CHECK_RET(VipNSGetHostByName(NULL, (VIP_CHAR *)n->alpha, a, 0), VIP_INVALID_PARAMETER);
    CHECK_RET(VipNSShutdown(s.nic), VIP_SUCCESS);
    side_close(&s);
}

static VIP_RETURN reverse(VIP_NIC_HANDLE nic, const char *addr, char *name, VIP_ULONG *len)
{
    char hex[HOST_TEXT];
    host_expect(addr, hex);
    VIP_NET_ADDRESS *a = addr_new(hex, NULL);
    VIP_RETURN r = VipNSGetHostByAddr(nic, a, (VIP_CHAR *)name, len);
    free(a);
    return r;
}

static void t_by_address(int arg)
{
    (void)arg;
    const struct names *n = names_for_provider();
    char path[256];
    write_temp(hosts_text, path);
    struct side s;
    side_open(&s, NULL);
    REQUIRE_RET(VipNSInit(s.nic, path), VIP_SUCCESS);
    char name[64];
    VIP_ULONG len = sizeof name;
    memset(name, 'Z', sizeof name);
    CHECK_RET(reverse(s.nic, n->beta_addr, name, &len), VIP_SUCCESS);
    CHECKF(memchr(name, 0, sizeof name) && strcmp(name, n->beta) == 0, "\"%s\" is called \"%.20s\", expected \"%s\"",
           n->beta_addr, name, n->beta);
    len = sizeof name;
    CHECK_RET(reverse(s.nic, n->multi_addr[1], name, &len), VIP_SUCCESS);
    CHECKF(strcmp(name, n->multi) == 0, "\"%s\" is called \"%.20s\", expected \"%s\"", n->multi_addr[1], name,
           n->multi);
    /* Too small: the size needed comes back (the name and its NUL). */
    len = 3;
    memset(name, 'Z', sizeof name);
    CHECK_RET(reverse(s.nic, n->alpha_addr, name, &len), VIP_ERROR_RESOURCE);
    CHECK_EQ(len, strlen(n->alpha) + 1);
    CHECKF(name[3] == 'Z', "a call refused for a small buffer wrote past it");
    VIP_ULONG need = len;
    CHECK_RET(reverse(s.nic, n->alpha_addr, name, &len), VIP_SUCCESS);
    CHECKF(strcmp(name, n->alpha) == 0, "with %lu bytes: \"%.20s\", expected \"%s\"", need, name, n->alpha);
    /* Unknown, and only in a comment. */
    len = sizeof name;
    static const char *const unknown[3] = {"nsnone", "127.0.0.1:7555", "02:00:00:00:00:55"};
    const char *u = strcmp(g_provider, "udp") == 0 ? unknown[1] : strcmp(g_provider, "xdp") == 0 ? unknown[2] : unknown[0];
    CHECK_RET(reverse(s.nic, u, name, &len), VIP_ERROR_NAMESERVICE);
    len = sizeof name;
    const char *hidden = strcmp(g_provider, "udp") == 0   ? "127.0.0.1:7099"
                         : strcmp(g_provider, "xdp") == 0 ? "02:00:00:00:00:99"
                                                          : "nshid";
    CHECK_RET(reverse(s.nic, hidden, name, &len), VIP_ERROR_NAMESERVICE);
    char alpha_hex[HOST_TEXT];
    host_expect(n->alpha_addr, alpha_hex);
    VIP_NET_ADDRESS *a = addr_new(alpha_hex, NULL);
    len = sizeof name;
    /* A length no host address of the NIC has. */
    VIP_NET_ADDRESS *five = addr_raw("abcde", 5, NULL, 0);
    CHECK_RET(VipNSGetHostByAddr(s.nic, five, name, &len), VIP_INVALID_PARAMETER);
    free(five);
    CHECK_RET(VipNSGetHostByAddr(s.nic, NULL, name, &len), VIP_INVALID_PARAMETER);
    CHECK_RET(VipNSGetHostByAddr(s.nic, a, NULL, &len), VIP_INVALID_PARAMETER);
    CHECK_RET(VipNSGetHostByAddr(s.nic, a, name, NULL), VIP_INVALID_PARAMETER);
    free(a);
    CHECK_RET(VipNSShutdown(s.nic), VIP_SUCCESS);
    side_close(&s);
}

static void t_env(int arg)
{
    (void)arg;
    const struct names *n = names_for_provider();
    char path[256], other[256];
    write_temp(hosts_text, path);
    write_temp("# no hosts here\n", other);
    setenv("VIPL_HOSTS", path, 1);
    struct side s;
    side_open(&s, NULL);
    /* NULL: the file VIPL_HOSTS names. */
    REQUIRE_RET(VipNSInit(s.nic, NULL), VIP_SUCCESS);
    CHECK_LOOKUP(s.nic, n->alpha, 0, n->alpha_addr);
    CHECK_RET(VipNSShutdown(s.nic), VIP_SUCCESS);
    /* A path given wins over VIPL_HOSTS. */
    REQUIRE_RET(VipNSInit(s.nic, other), VIP_SUCCESS);
    CHECK_RET(lookup(s.nic, n->alpha, 0), VIP_ERROR_NAMESERVICE);
    CHECK_RET(VipNSShutdown(s.nic), VIP_SUCCESS);
    side_close(&s);
}

/* ---- Connecting to a name ----------------------------------------------------------------- */

static char ns_disc[33];

/* What a name-service test's server waits on, and the message it expects. */
struct ns_srv {
    const char *disc;
    const char *text;
};

/* A server on the peer's device: sends its address, accepts one client on
 * its discriminator and checks the client's one message. */
static void srv_ns(struct chan *c, void *arg)
{
    const struct ns_srv *a = arg;
    struct side s;
    side_open_peer(&s);
    send_addr(c, &s);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_DESCRIPTOR *r = recv_desc(&s, 64);
    REQUIRE_RET(VipPostRecv(vi, r, s.mh), VIP_SUCCESS);
    srv_accept(&s, vi, a->disc, 10000);
    VIP_DESCRIPTOR *d = RECV_WAIT(vi, 5000);
    size_t n = strlen(a->text);
    if (d)
        CHECK(d->CS.Length == n && memcmp(seg_buf(d, 0), a->text, n) == 0);
    int tag = chan_recv_pump(c, vi, 15000, NULL, 0);
    CHECK_EQ(tag, T_QUIT);
    VipDisconnect(vi);
    side_close(&s);
}

static const struct ns_srv srv_named = {ns_disc, "named"};

static void t_connect_by_name(int arg)
{
    (void)arg;
    disc_new(ns_disc);
    struct peer p;
    peer_start(&p, srv_ns, (void *)&srv_named);
    struct side s;
    side_open(&s, NULL);
    char host[HOST_TEXT];
    recv_addr(&p.c, host);
    char text[256], path[256], shown[64];
    host_display(host, shown, sizeof shown);
    snprintf(text, sizeof text, "# the test's server\nserver %s %s\n", g_provider, shown);
    write_temp(text, path);
    REQUIRE_RET(VipNSInit(s.nic, path), VIP_SUCCESS);
    VIP_NET_ADDRESS *remote = addr_room();
    REQUIRE_RET(VipNSGetHostByName(s.nic, "server", remote, 0), VIP_SUCCESS);
    /* The caller adds the discriminator after the host address. */
    remote->DiscriminatorLen = (VIP_UINT16)strlen(ns_disc);
    memcpy(remote->HostAddress + remote->HostAddressLen, ns_disc, strlen(ns_disc));
    VIP_NET_ADDRESS *local = addr_new(s.address, ns_disc);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_VI_ATTRIBUTES ra;
    CHECK_RET(VipConnectRequest(vi, local, remote, 10000, &ra), VIP_SUCCESS);
    VIP_DESCRIPTOR *d = send_desc(&s, "named", 5, 0);
    CHECK_RET(VipPostSend(vi, d, s.mh), VIP_SUCCESS);
    SEND_WAIT(vi, 5000);
    /* And the server's address back to its name. */
    char name[32];
    VIP_ULONG len = sizeof name;
    CHECK_RET(VipNSGetHostByAddr(s.nic, remote, name, &len), VIP_SUCCESS);
    CHECKF(strcmp(name, "server") == 0, "the server's address is called \"%.20s\"", name);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end_pumping(&p, vi, 15000);
    VipDisconnect(vi);
    CHECK_RET(VipNSShutdown(s.nic), VIP_SUCCESS);
    side_close(&s);
}

/* ---- No configuration at all, between two test hosts ------------------------------------- */

static char ns_disc2[33];
static const struct ns_srv srv_zero = {ns_disc, "zero"}, srv_zero2 = {ns_disc2, "zero"};

/* Connects a VI of `s` to the server waiting on `disc` at `remote`'s host
 * and sends it "zero". */
static VIP_VI_HANDLE zero_connect(struct side *s, const VIP_NET_ADDRESS *remote, const char *disc)
{
    VIP_NET_ADDRESS *to = addr_room();
    memcpy(to, remote, sizeof *to + remote->HostAddressLen);
    to->DiscriminatorLen = (VIP_UINT16)strlen(disc);
    memcpy(to->HostAddress + to->HostAddressLen, disc, strlen(disc));
    VIP_NET_ADDRESS *local = addr_new(s->address, disc);
    VIP_VI_HANDLE vi = vi_new(s, default_level(), 0, 0, NULL, NULL);
    VIP_VI_ATTRIBUTES ra;
    CHECK_RET(VipConnectRequest(vi, local, to, 10000, &ra), VIP_SUCCESS);
    VIP_DESCRIPTOR *d = send_desc(s, "zero", 4, 0);
    CHECK_RET(VipPostSend(vi, d, s->mh), VIP_SUCCESS);
    SEND_WAIT(vi, 5000);
    free(local);
    free(to);
    return vi;
}

/* Both hosts open /dev/via_ethN (or an xdp device, whose host name the
 * neighbour table turns into a MAC address) with no VIPL_DEVICES, no
 * configuration file and no hosts file; the client finds the server by the
 * name the system's resolver knows it by (conformance/run gives each test
 * host an /etc/hosts of its own naming the other, and the name in
 * VIPL_CONFORMANCE_PEER_HOST). On /dev/via_ethN two server processes share
 * the second host's device, as M-VIA's did, and the client reaches each
 * through the one name. */
static void t_zero_config(int arg)
{
    (void)arg;
    const char *peer = getenv("VIPL_CONFORMANCE_PEER_HOST");
    if (!peer)
        h_skip("no second test host named in VIPL_CONFORMANCE_PEER_HOST (conformance/run makes one as root)");
    int eth = strncmp(g_device, "/dev/via_eth", 12) == 0;
    if (!eth && strcmp(g_provider, "xdp") != 0)
        h_skip("the device under test is %s, not /dev/via_ethN or xdp", g_device);
    unsetenv("VIPL_DEVICES");
    unsetenv("VIPL_PORT");
    setenv("VIPL_CONF", "/nonexistent/vipl.conf", 1);
    setenv("VIPL_HOSTS", "/nonexistent/vipl_hosts", 1);
    disc_new(ns_disc);
    disc_new(ns_disc2);
    struct peer p, p2;
    peer_start(&p, srv_ns, (void *)&srv_zero);
    if (eth)
        peer_start(&p2, srv_ns, (void *)&srv_zero2);
    struct side s;
    side_open(&s, NULL);
    CHECK_EQ(s.attrs.NicAddressLen, 6);
    /* /dev/via_ethN is at the well-known port: 7100 is 0x1bbc. */
    if (eth)
        CHECKF(strcmp(s.address + 8, "1bbc") == 0, "%s opened %s, not at port 7100", g_device, s.address);
    char host[HOST_TEXT], got[HOST_TEXT];
    recv_addr(&p.c, host);
    VIP_NET_ADDRESS *remote = addr_room();
    REQUIRE_RET(VipNSGetHostByName(s.nic, (VIP_CHAR *)peer, remote, 0), VIP_SUCCESS);
    host_hex(remote->HostAddress, remote->HostAddressLen, got);
    CHECKF(strcmp(got, host) == 0, "\"%s\" resolved to %s; the server is at %s", peer, got, host);
    VIP_VI_HANDLE vi = zero_connect(&s, remote, ns_disc);
    VIP_VI_HANDLE vi2 = NULL;
    if (eth) {
        char host2[HOST_TEXT];
        recv_addr(&p2.c, host2);
        CHECKF(strcmp(host2, host) == 0, "the second server's device is at %s, the first's at %s", host2,
               host);
        vi2 = zero_connect(&s, remote, ns_disc2);
    }
    /* And back: the server's address is called by its name. */
    char name[256];
    VIP_ULONG len = sizeof name;
    CHECK_RET(VipNSGetHostByAddr(s.nic, remote, name, &len), VIP_SUCCESS);
    CHECKF(strcmp(name, peer) == 0, "the server's address is called \"%.40s\", expected \"%s\"", name, peer);
    chan_send(&p.c, T_QUIT, NULL, 0);
    peer_end_pumping(&p, vi, 15000);
    VipDisconnect(vi);
    if (eth) {
        chan_send(&p2.c, T_QUIT, NULL, 0);
        peer_end_pumping(&p2, vi2, 15000);
        VipDisconnect(vi2);
    }
    free(remote);
    side_close(&s);
}

const struct test ns_tests[] = {
    {"ns", "by_name_and_index", t_by_name, 0, 0},
    {"ns", "by_address_small_buffer", t_by_address, 0, 0},
    {"ns", "hosts_from_environment", t_env, 0, 0},
    {"ns", "connect_by_name", t_connect_by_name, 0, 0},
    {"ns", "zero_config_two_hosts", t_zero_config, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
