/*
 * NIC: opening by uvia provider names and by device names, bad names,
 * VipQueryNic, system management information, the error callback.
 */
#include "common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The LocalNicAddress of a NIC opened by name, as hex text ("" if it
 * failed), and its Name (if `nic_name` is not NULL). */
static VIP_RETURN open_named(const char *name, char out[HOST_TEXT], char nic_name[64])
{
    VIP_NIC_HANDLE nic = NULL;
    VIP_NIC_ATTRIBUTES a;
    memset(out, 0, HOST_TEXT);
    VIP_RETURN r = VipOpenNic(name, &nic);
    if (r != VIP_SUCCESS)
        return r;
    if (VipQueryNic(nic, &a) == VIP_SUCCESS && a.LocalNicAddress) {
        host_hex(a.LocalNicAddress, a.NicAddressLen, out);
        if (nic_name)
            memcpy(nic_name, a.Name, 64);
    }
    CHECK_RET(VipCloseNic(nic), VIP_SUCCESS);
    return r;
}

static VIP_RETURN open_address(const char *name, char out[HOST_TEXT])
{
    return open_named(name, out, NULL);
}

/* The hex of shm instance `inst`'s host address. */
static const char *shm_hex(const char *inst)
{
    static char out[4][HOST_TEXT];
    static int next;
    char *o = out[next++ % 4];
    host_expect_as("shm", inst, o);
    return o;
}

/* Device-name mappings only from what the test sets. */
static void clear_mappings(void)
{
    unsetenv("VIPL_DEVICES");
    setenv("VIPL_CONF", "/nonexistent/vipl.conf", 1);
}

/* 127.0.0.1 and a port that is not 0, as hex text. */
static int looks_like_udp(const char *a)
{
    return strlen(a) == 12 && strncmp(a, "7f000001", 8) == 0 && strcmp(a + 8, "0000") != 0;
}

static void t_open_close(int arg)
{
    (void)arg;
    VIP_NIC_HANDLE nic = NULL;
    REQUIRE_RET(VipOpenNic(g_device, &nic), VIP_SUCCESS);
    CHECK(nic != NULL);
    CHECK_RET(VipCloseNic(nic), VIP_SUCCESS);
    /* And again: closing released what the first open took. */
    nic = NULL;
    REQUIRE_RET(VipOpenNic(g_device, &nic), VIP_SUCCESS);
    CHECK(nic != NULL);
    CHECK_RET(VipCloseNic(nic), VIP_SUCCESS);
}

static void t_provider_names(int arg)
{
    (void)arg;
    char addr[HOST_TEXT], inst[32], shortname[8];
    clear_mappings();
    CHECK_RET(open_address("shm", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, shm_hex("0")) == 0, "\"shm\" opened %s, expected instance \"0\"", addr);
    short_instance('c', shortname);
    snprintf(inst, sizeof inst, "shm:%s", shortname);
    CHECK_RET(open_address(inst, addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, shm_hex(inst + 4)) == 0, "\"%s\" has address %s", inst, addr);
    /* An instance name longer than a host address's 6 bytes. */
    CHECK_RET(open_address("shm:seven77", addr), VIP_INVALID_PARAMETER);
    /* No name is a mistake, not a wish for a default device. */
    CHECK_RET(open_address(NULL, addr), VIP_INVALID_PARAMETER);
    CHECK_RET(open_address("udp", addr), VIP_SUCCESS);
    CHECKF(looks_like_udp(addr), "\"udp\" has address \"%s\", expected 127.0.0.1:<port>", addr);
    CHECK_RET(open_address("udp:127.0.0.1", addr), VIP_SUCCESS);
    CHECKF(looks_like_udp(addr), "\"udp:127.0.0.1\" has address \"%s\"", addr);
    /* Over IPv6 (where the host has it): 18 bytes, ::1 then the port. */
    VIP_RETURN r6 = open_address("udp:[::1]", addr);
    CHECKF(r6 == VIP_SUCCESS || r6 == VIP_ERROR_RESOURCE, "udp:[::1]: %s", vip_ret_name(r6));
    if (r6 == VIP_SUCCESS)
        CHECKF(strlen(addr) == 36 && strncmp(addr, "00000000000000000000000000000001", 32) == 0 &&
                   strcmp(addr + 32, "0000") != 0,
               "\"udp:[::1]\" has address %s, expected ::1 and a port in 18 bytes", addr);
}

/* The IPv4 addresses of the interfaces that are up and not loopback, one
 * per interface (its first), in interface index order; returns how many. */
static int up_interfaces(struct in_addr out[16], char names[16][IF_NAMESIZE])
{
    struct ifaddrs *all = NULL, *i;
    unsigned idx[16];
    int n = 0;
    if (getifaddrs(&all) != 0)
        return 0;
    for (i = all; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
            (i->ifa_flags & IFF_LOOPBACK))
            continue;
        unsigned x = if_nametoindex(i->ifa_name);
        int seen = 0;
        for (int k = 0; k < n; k++)
            seen |= idx[k] == x;
        if (seen || n == 16)
            continue;
        /* Insert in index order. */
        int at = n;
        while (at > 0 && idx[at - 1] > x) {
            idx[at] = idx[at - 1], out[at] = out[at - 1];
            memcpy(names[at], names[at - 1], IF_NAMESIZE);
            at--;
        }
        idx[at] = x;
        out[at] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        snprintf(names[at], IF_NAMESIZE, "%s", i->ifa_name);
        n++;
    }
    freeifaddrs(all);
    return n;
}

static void t_device_names(int arg)
{
    (void)arg;
    char addr[HOST_TEXT], map[256], want_a[8], want_b[8], want_c[8], name[64];
    clear_mappings();
    /* The defaults. */
    CHECK_RET(open_address("/dev/via_lo", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, shm_hex("0")) == 0, "/dev/via_lo opened %s, expected shm instance \"0\"", addr);
    /* /dev/via_ethN: udp on the N-th interface that is up, not loopback and
     * has an IPv4 address, at VIPL_PORT (a port of this test's own: the
     * default, 7100, may be taken on a shared machine). */
    struct in_addr ifs[16];
    char ifnames[16][IF_NAMESIZE];
    int nifs = up_interfaces(ifs, ifnames);
    char port[16], dev[32], text[64], want[HOST_TEXT];
    unsigned p = 20000 + (unsigned)getpid() % 20000;
    snprintf(port, sizeof port, "%u", p);
    setenv("VIPL_PORT", port, 1);
    for (int k = 0; k <= nifs && k < 3; k++) {
        snprintf(dev, sizeof dev, "/dev/via_eth%d", k);
        if (k == nifs) {
            CHECKF(open_address(dev, addr) == VIP_ERROR_RESOURCE, "%s opened, this host has %d such interfaces",
                   dev, nifs);
            continue;
        }
        snprintf(text, sizeof text, "%s:%u", inet_ntoa(ifs[k]), p);
        host_expect_as("udp", text, want);
        CHECK_RET(open_named(dev, addr, name), VIP_SUCCESS);
        CHECKF(strcmp(addr, want) == 0, "%s opened %s, expected %s (%s) on %s", dev, addr, want, text, ifnames[k]);
        /* Its Name is the device name it was opened by. */
        CHECKF(strcmp(name, dev) == 0, "%s: Name \"%s\"", dev, name);
    }
    setenv("VIPL_PORT", "http", 1);
    if (nifs > 0)
        CHECK_RET(open_address("/dev/via_eth0", addr), VIP_INVALID_PARAMETER);
    unsetenv("VIPL_PORT");

    /* VIPL_DEVICES, which also overrides a default. */
    short_instance('a', want_a);
    short_instance('b', want_b);
    snprintf(map, sizeof map, "/dev/via_x1=shm:%s;/dev/via_lo=shm:%s", want_a, want_b);
    setenv("VIPL_DEVICES", map, 1);
    CHECK_RET(open_named("/dev/via_x1", addr, name), VIP_SUCCESS);
    CHECKF(strcmp(addr, shm_hex(want_a)) == 0, "VIPL_DEVICES: /dev/via_x1 opened %s, expected \"%s\"", addr, want_a);
    CHECKF(strcmp(name, "/dev/via_x1") == 0, "/dev/via_x1: Name \"%s\"", name);
    CHECK_RET(open_address("/dev/via_lo", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, shm_hex(want_b)) == 0, "VIPL_DEVICES: /dev/via_lo opened %s, expected \"%s\"", addr, want_b);
    /* A provider name is its own Name. */
    CHECK_RET(open_named("udp:127.0.0.1", addr, name), VIP_SUCCESS);
    CHECKF(strcmp(name, "udp:127.0.0.1") == 0, "udp:127.0.0.1: Name \"%s\"", name);

    /* VIPL_CONF, below VIPL_DEVICES. */
    char path[256];
    char conf[512], wrong[8];
    short_instance('c', want_c);
    short_instance('w', wrong);
    snprintf(conf, sizeof conf,
             "# devices of this test\n"
             "/dev/via_x2   shm:%s\n"
             "\n"
             "/dev/via_x1 shm:%s   # VIPL_DEVICES names this one first\n",
             want_c, wrong);
    write_temp(conf, path);
    setenv("VIPL_CONF", path, 1);
    CHECK_RET(open_address("/dev/via_x2", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, shm_hex(want_c)) == 0, "VIPL_CONF: /dev/via_x2 opened %s, expected \"%s\"", addr, want_c);
    CHECK_RET(open_address("/dev/via_x1", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, shm_hex(want_a)) == 0, "VIPL_DEVICES before VIPL_CONF: /dev/via_x1 opened %s, expected \"%s\"",
           addr, want_a);
    unsetenv("VIPL_DEVICES");
    CHECK_RET(open_address("/dev/via_x1", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, shm_hex(wrong)) == 0, "VIPL_CONF: /dev/via_x1 opened %s, expected \"%s\"", addr, wrong);
}

static void t_bad_names(int arg)
{
    (void)arg;
    VIP_NIC_HANDLE nic = NULL;
    clear_mappings();
    static const char *const unknown[] = {"nosuch", "", "shm:", "shm:../x", "ib0", "/dev/via_nosuch", "/dev/via_ethx"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        VIP_RETURN r = VipOpenNic(unknown[i], &nic);
        CHECKF(r == VIP_INVALID_PARAMETER, "VipOpenNic(\"%s\"): expected VIP_INVALID_PARAMETER, got %s", unknown[i],
               vip_ret_name(r));
    }
    CHECK_RET(VipOpenNic(g_device, NULL), VIP_INVALID_PARAMETER);
    /* An unknown device's line says where device names are mapped. */
    struct capture c;
    capture_start(&c);
    VIP_RETURN r = VipOpenNic("/dev/via_nosuch", &nic);
    capture_end(&c);
    const char *err = c.buf;
    CHECK_EQ(r, VIP_INVALID_PARAMETER);
    CHECKF(strstr(err, "/dev/via_nosuch") && strstr(err, "VIPL_DEVICES") && strstr(err, "/nonexistent/vipl.conf"),
           "the line for an unknown device does not name it, VIPL_DEVICES and the configuration file: \"%s\"", err);
    CHECKF(strchr(err, '\n') == err + strlen(err) - 1, "expected one line: \"%s\"", err);
    /* Known providers that cannot start here. */
    CHECK_RET(VipOpenNic("xdp:uvianosuch0", &nic), VIP_ERROR_RESOURCE);
    CHECK_RET(VipOpenNic("udp:192.0.2.1", &nic), VIP_ERROR_RESOURCE);
}

static int text_within(const char *s, size_t n)
{
    return memchr(s, 0, n) != NULL;
}

static void t_query(int arg)
{
    (void)arg;
    VIP_NIC_HANDLE nic = NULL;
    VIP_NIC_ATTRIBUTES a;
    REQUIRE_RET(VipOpenNic(g_device, &nic), VIP_SUCCESS);
    memset(&a, 0xa5, sizeof a);
    REQUIRE_RET(VipQueryNic(nic, &a), VIP_SUCCESS);
    CHECKF(text_within(a.Name, sizeof a.Name) && a.Name[0], "Name is not a non-empty NUL-terminated string");
    /* M-VIA's 6 bytes, or 18 for udp over IPv6. */
    CHECKF(a.NicAddressLen == 6 || (a.NicAddressLen == 18 && strcmp(g_provider, "udp") == 0),
           "NicAddressLen %u", (unsigned)a.NicAddressLen);
    REQUIRE(a.LocalNicAddress != NULL);
    CHECK_EQ(a.MaxDiscriminatorLen, 32);
    CHECK(a.ReliabilityLevelSupport != 0);
    CHECKF((a.ReliabilityLevelSupport & ~7u) == 0, "ReliabilityLevelSupport 0x%x has unknown bits",
           (unsigned)a.ReliabilityLevelSupport);
    CHECKF((a.RDMAReadSupport & ~a.ReliabilityLevelSupport) == 0,
           "RDMAReadSupport 0x%x names levels the NIC does not offer (0x%x)", (unsigned)a.RDMAReadSupport,
           (unsigned)a.ReliabilityLevelSupport);
    CHECK(a.MaxSegmentsPerDesc >= 2);
    CHECK(a.MaxTransferSize > 0);
    CHECK(a.MaxDescriptorsPerQueue > 0);
    CHECK(a.MaxCQ > 0);
    CHECK(a.MaxCQEntries > 0);
    CHECK(a.MaxPtags > 0);
    CHECK(a.MaxVI > 0);
    CHECK(a.MaxRegisterRegions > 0);
    CHECK(a.MaxRegisterBytes > 0);
    CHECK(a.MaxRegisterBlockBytes > 0);
    CHECK(a.NativeMTU > 0);
    CHECK(a.ThreadSafe == VIP_TRUE || a.ThreadSafe == VIP_FALSE);
    /* The address is the provider's address, in the documented form. */
    char addr[HOST_TEXT], want[HOST_TEXT];
    host_hex(a.LocalNicAddress, a.NicAddressLen, addr);
    if (strcmp(g_provider, "udp") == 0 && a.NicAddressLen == 6)
        CHECKF(strcmp(addr + 8, "0000") != 0, "udp address %s has port 0", addr);
    if (strcmp(g_provider, "shm") == 0 && strncmp(g_device, "shm:", 4) == 0) {
        host_expect(g_device + 4, want);
        CHECKF(strcmp(addr, want) == 0, "shm address %s, expected the instance \"%s\"", addr, g_device + 4);
    }
    if (strcmp(g_provider, "shm") == 0)
        CHECKF(a.LocalNicAddress[0] != 0, "shm address %s has no instance name", addr);
    /* The same answer twice. */
    VIP_NIC_ATTRIBUTES b;
    REQUIRE_RET(VipQueryNic(nic, &b), VIP_SUCCESS);
    CHECK(memcmp(a.Name, b.Name, sizeof a.Name) == 0);
    CHECK(b.LocalNicAddress && memcmp(a.LocalNicAddress, b.LocalNicAddress, a.NicAddressLen) == 0);
    CHECK_RET(VipQueryNic(nic, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryNic(NULL, &b), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCloseNic(nic), VIP_SUCCESS);
}

static void t_bad_handles(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_CQ_HANDLE cq = NULL;
    REQUIRE_RET(VipCreateCQ(s.nic, 4, &cq), VIP_SUCCESS);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_NIC_ATTRIBUTES a;
    VIP_PROTECTION_HANDLE p;
    CHECK_RET(VipCloseNic(NULL), VIP_INVALID_PARAMETER);
    /* Handles of other kinds where a NIC is wanted. */
    CHECK_RET(VipQueryNic((VIP_NIC_HANDLE)vi, &a), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryNic((VIP_NIC_HANDLE)cq, &a), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCreatePtag((VIP_NIC_HANDLE)vi, &p), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCloseNic((VIP_NIC_HANDLE)cq), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCloseNic((VIP_NIC_HANDLE)vi), VIP_INVALID_PARAMETER);
    /* The NIC still works. */
    CHECK_RET(VipQueryNic(s.nic, &a), VIP_SUCCESS);
    CHECK_RET(vi_destroy(&s, vi), VIP_SUCCESS);
    CHECK_RET(VipDestroyCQ(cq), VIP_SUCCESS);
    side_close(&s);
}

/* ---- System management ------------------------------------------------------ */

static void t_sysman(int arg)
{
    (void)arg;
    static const char *const hosts =
        "# hosts of the autodiscovery test\n"
        "alpha  shm  0\n"
        "beta   shm  auto1\n"
        "gamma  udp  127.0.0.1:7001\n"
        "delta  udp  127.0.0.1:7002\n"
        "eps    xdp  02:00:00:00:00:01\n";
    char path[256];
    write_temp(hosts, path);
    setenv("VIPL_HOSTS", path, 1);
    struct side s;
    side_open(&s, NULL);
    CHECK_RET(VipNSInit(s.nic, path), VIP_SUCCESS);

    enum { N = 8 };
    VIP_NET_ADDRESS *room[N];
    for (int i = 0; i < N; i++)
        room[i] = addr_room();
    VIP_AUTODISCOVERY_LIST list = {.NumberOfHops = 0, .ADAddrArray = room, .NumAdAddrs = N};
    REQUIRE_RET(VipQuerySystemManagementInfo(s.nic, VIP_SMI_AUTODISCOVERY, &list), VIP_SUCCESS);
    const char *want[2] = {NULL, NULL};
    size_t nwant = 0;
    if (strcmp(g_provider, "shm") == 0) {
        want[0] = "0", want[1] = "auto1", nwant = 2;
    } else if (strcmp(g_provider, "udp") == 0) {
        want[0] = "127.0.0.1:7001", want[1] = "127.0.0.1:7002", nwant = 2;
    }
    if (nwant) {
        CHECK_EQ(list.NumAdAddrs, nwant);
    } else {
        CHECKF(list.NumAdAddrs <= 1, "xdp: %lu hosts found, the file has one xdp host", list.NumAdAddrs);
        want[0] = "02:00:00:00:00:01";
    }
    int seen[2] = {0, 0};
    for (VIP_ULONG i = 0; i < list.NumAdAddrs && i < N; i++) {
        VIP_NET_ADDRESS *a = room[i];
        CHECK_EQ(a->HostAddressLen, 6);
        char text[HOST_TEXT], w0[HOST_TEXT] = "", w1[HOST_TEXT] = "";
        host_hex(a->HostAddress, a->HostAddressLen, text);
        if (want[0])
            host_expect(want[0], w0);
        if (want[1])
            host_expect(want[1], w1);
        int k = want[0] && strcmp(text, w0) == 0 ? 0 : want[1] && strcmp(text, w1) == 0 ? 1 : -1;
        CHECKF(k >= 0, "autodiscovery returned \"%s\", not a %s host of the file", text, g_provider);
        if (k >= 0) {
            CHECKF(!seen[k], "autodiscovery returned \"%s\" twice", text);
            seen[k] = 1;
        }
    }
    /* Room for one: one filled. */
    if (nwant) {
        list.NumAdAddrs = 1;
        CHECK_RET(VipQuerySystemManagementInfo(s.nic, VIP_SMI_AUTODISCOVERY, &list), VIP_SUCCESS);
        CHECK_EQ(list.NumAdAddrs, 1);
    }
    list.NumAdAddrs = N;
    CHECK_RET(VipQuerySystemManagementInfo(s.nic, 99, &list), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQuerySystemManagementInfo(s.nic, VIP_SMI_AUTODISCOVERY, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQuerySystemManagementInfo(NULL, VIP_SMI_AUTODISCOVERY, &list), VIP_INVALID_PARAMETER);
    CHECK_RET(VipNSShutdown(s.nic), VIP_SUCCESS);
    side_close(&s);
}

/* ---- Error callback ---------------------------------------------------------- */

struct err_seen {
    atomic_int calls;
    pthread_t thread;
    VIP_ERROR_DESCRIPTOR last;
    void *ctx;
};

static void on_error(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    struct err_seen *s = ctx;
    if (e)
        s->last = *e;
    s->thread = pthread_self();
    s->ctx = ctx;
    atomic_fetch_add(&s->calls, 1);
}

static int wait_calls(atomic_int *n, int want, int ms)
{
    long long end = now_ms() + ms;
    while (atomic_load(n) < want && now_ms() < end)
        sleep_ms(2);
    return atomic_load(n);
}

/* A receive the library refuses: more segments than the NIC allows. */
static VIP_DESCRIPTOR *bad_recv(struct side *s)
{
    int n = (int)s->attrs.MaxSegmentsPerDesc + 1;
    VIP_DESCRIPTOR *d = desc_new(s, n);
    void *buf = arena_take(s, 64);
    d->CS.SegCount = (VIP_UINT16)n;
    for (int i = 0; i < n; i++)
        set_local(d, i, buf, s->mh, 4);
    return d;
}

static void t_error_callback(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    static struct err_seen seen;
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    CHECK_RET(VipErrorCallback(NULL, &seen, on_error), VIP_INVALID_PARAMETER);
    REQUIRE_RET(VipErrorCallback(s.nic, &seen, on_error), VIP_SUCCESS);
    VIP_DESCRIPTOR *d = bad_recv(&s);
    CHECK_RET(VipPostRecv(vi, d, s.mh), VIP_DESCRIPTOR_ERROR);
    CHECKF(wait_calls(&seen.calls, 1, 3000) == 1, "error handler called %d times for one refused post (3 s)",
           atomic_load(&seen.calls));
    if (atomic_load(&seen.calls) >= 1) {
        CHECK(seen.ctx == &seen);
        CHECK(!pthread_equal(seen.thread, pthread_self()));
        CHECK_EQ(seen.last.ErrorCode, VIP_ERROR_POST_DESC);
        CHECK_EQ(seen.last.ResourceCode, VIP_RESOURCE_DESCRIPTOR);
        CHECK(seen.last.NicHandle == s.nic);
        CHECK(seen.last.ViHandle == vi);
        CHECK(seen.last.DescriptorPtr == d);
        CHECK_EQ(seen.last.OpCode, VIP_CONTROL_OP_SENDRECV);
    }
    sleep_ms(200);
    CHECKF(atomic_load(&seen.calls) == 1, "error handler called %d times for one refused post",
           atomic_load(&seen.calls));

    /* Back to the default: a line on stderr for each, the handler not called. */
    CHECK_RET(VipErrorCallback(s.nic, NULL, NULL), VIP_SUCCESS);
    int pfd[2];
    REQUIRE(pipe2(pfd, O_NONBLOCK) == 0);
    fflush(stderr);
    int saved = dup(2);
    REQUIRE(saved >= 0 && dup2(pfd[1], 2) == 2);
    VIP_RETURN r = VipPostRecv(vi, bad_recv(&s), s.mh);
    char buf[4096];
    size_t got = 0;
    long long end = now_ms() + 2000;
    int seen_line = 0;
    while (now_ms() < end) {
        ssize_t k = read(pfd[0], buf + got, sizeof buf - 1 - got);
        if (k > 0)
            got += (size_t)k;
        if (!seen_line && got && memchr(buf, '\n', got)) {
            /* A little longer, to see a second line if one comes. */
            seen_line = 1;
            end = now_ms() + 200;
        }
        sleep_ms(5);
    }
    dup2(saved, 2);
    close(saved);
    close(pfd[0]);
    close(pfd[1]);
    buf[got] = 0;
    CHECK_RET(r, VIP_DESCRIPTOR_ERROR);
    int lines = 0;
    for (size_t i = 0; i < got; i++)
        lines += buf[i] == '\n';
    CHECKF(lines == 1, "default error handling wrote %d lines to stderr (expected 1): \"%s\"", lines, buf);
    CHECKF(atomic_load(&seen.calls) == 1, "a removed handler was called");
    CHECK_RET(VipErrorCallback(s.nic, &seen, on_error), VIP_SUCCESS);
    CHECK_RET(VipPostRecv(vi, bad_recv(&s), s.mh), VIP_DESCRIPTOR_ERROR);
    CHECKF(wait_calls(&seen.calls, 2, 3000) == 2, "a handler set again was not called");
    side_close(&s);
}

const struct test nic_tests[] = {
    {"nic", "open_close", t_open_close, 0, 0},
    {"nic", "provider_names", t_provider_names, 0, 0},
    {"nic", "device_names", t_device_names, 0, 0},
    {"nic", "bad_names", t_bad_names, 0, 0},
    {"nic", "query", t_query, 0, 0},
    {"nic", "wrong_kind_handles", t_bad_handles, 0, 0},
    {"nic", "system_management_info", t_sysman, 0, 0},
    {"nic", "error_callback", t_error_callback, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
