/*
 * NIC: opening by uvia provider names and by device names, bad names,
 * VipQueryNic, system management information, the error callback.
 */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The LocalNicAddress of a NIC opened by name, as text ("" if it failed). */
static VIP_RETURN open_address(const char *name, char out[VIPL_HOST_ADDRESS_LEN + 1])
{
    VIP_NIC_HANDLE nic = NULL;
    VIP_NIC_ATTRIBUTES a;
    memset(out, 0, VIPL_HOST_ADDRESS_LEN + 1);
    VIP_RETURN r = VipOpenNic(name, &nic);
    if (r != VIP_SUCCESS)
        return r;
    if (VipQueryNic(nic, &a) == VIP_SUCCESS && a.LocalNicAddress)
        memcpy(out, a.LocalNicAddress, a.NicAddressLen < VIPL_HOST_ADDRESS_LEN ? a.NicAddressLen : VIPL_HOST_ADDRESS_LEN);
    CHECK_RET(VipCloseNic(nic), VIP_SUCCESS);
    return r;
}

/* Device-name mappings only from what the test sets. */
static void clear_mappings(void)
{
    unsetenv("VIPL_DEVICES");
    setenv("VIPL_CONF", "/nonexistent/vipl.conf", 1);
}

static int looks_like_udp(const char *a)
{
    const char *colon = strrchr(a, ':');
    return strncmp(a, "127.0.0.1:", 10) == 0 && colon && atoi(colon + 1) > 0;
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
    char addr[VIPL_HOST_ADDRESS_LEN + 1], inst[32];
    clear_mappings();
    CHECK_RET(open_address("shm", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, "0") == 0, "\"shm\" opened instance \"%s\", expected \"0\"", addr);
    snprintf(inst, sizeof inst, "shm:ci%d", (int)getpid());
    CHECK_RET(open_address(inst, addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, inst + 4) == 0, "\"%s\" has address \"%s\"", inst, addr);
    /* No name is a mistake, not a wish for a default device. */
    CHECK_RET(open_address(NULL, addr), VIP_INVALID_PARAMETER);
    CHECK_RET(open_address("udp", addr), VIP_SUCCESS);
    CHECKF(looks_like_udp(addr), "\"udp\" has address \"%s\", expected 127.0.0.1:<port>", addr);
    CHECK_RET(open_address("udp:127.0.0.1", addr), VIP_SUCCESS);
    CHECKF(looks_like_udp(addr), "\"udp:127.0.0.1\" has address \"%s\"", addr);
}

static void t_device_names(int arg)
{
    (void)arg;
    char addr[VIPL_HOST_ADDRESS_LEN + 1], map[256], want_a[32], want_b[32], want_c[32];
    clear_mappings();
    /* The defaults. */
    CHECK_RET(open_address("/dev/via_lo", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, "0") == 0, "/dev/via_lo opened \"%s\", expected shm instance \"0\"", addr);
    CHECK_RET(open_address("/dev/via_eth0", addr), VIP_SUCCESS);
    CHECKF(looks_like_udp(addr), "/dev/via_eth0 opened \"%s\", expected udp on 127.0.0.1", addr);
    CHECK_RET(open_address("/dev/via_eth1", addr), VIP_SUCCESS);
    CHECKF(looks_like_udp(addr), "/dev/via_eth1 opened \"%s\", expected udp on 127.0.0.1", addr);

    /* VIPL_DEVICES, which also overrides a default. */
    snprintf(want_a, sizeof want_a, "da%d", (int)getpid());
    snprintf(want_b, sizeof want_b, "db%d", (int)getpid());
    snprintf(map, sizeof map, "/dev/via_x1=shm:%s;/dev/via_lo=shm:%s", want_a, want_b);
    setenv("VIPL_DEVICES", map, 1);
    CHECK_RET(open_address("/dev/via_x1", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, want_a) == 0, "VIPL_DEVICES: /dev/via_x1 opened \"%s\", expected \"%s\"", addr, want_a);
    CHECK_RET(open_address("/dev/via_lo", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, want_b) == 0, "VIPL_DEVICES: /dev/via_lo opened \"%s\", expected \"%s\"", addr, want_b);

    /* VIPL_CONF, below VIPL_DEVICES. */
    char path[256], text[512];
    snprintf(want_c, sizeof want_c, "dc%d", (int)getpid());
    snprintf(text, sizeof text,
             "# devices of this test\n"
             "/dev/via_x2   shm:%s\n"
             "\n"
             "/dev/via_x1 shm:wrong%d   # VIPL_DEVICES names this one first\n",
             want_c, (int)getpid());
    write_temp(text, path);
    setenv("VIPL_CONF", path, 1);
    CHECK_RET(open_address("/dev/via_x2", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, want_c) == 0, "VIPL_CONF: /dev/via_x2 opened \"%s\", expected \"%s\"", addr, want_c);
    CHECK_RET(open_address("/dev/via_x1", addr), VIP_SUCCESS);
    CHECKF(strcmp(addr, want_a) == 0, "VIPL_DEVICES before VIPL_CONF: /dev/via_x1 opened \"%s\", expected \"%s\"", addr,
           want_a);
    unsetenv("VIPL_DEVICES");
    CHECK_RET(open_address("/dev/via_x1", addr), VIP_SUCCESS);
    snprintf(want_a, sizeof want_a, "wrong%d", (int)getpid());
    CHECKF(strcmp(addr, want_a) == 0, "VIPL_CONF: /dev/via_x1 opened \"%s\", expected \"%s\"", addr, want_a);
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
    CHECK_EQ(a.NicAddressLen, VIPL_HOST_ADDRESS_LEN);
    REQUIRE(a.LocalNicAddress != NULL);
    CHECKF(text_within((const char *)a.LocalNicAddress, a.NicAddressLen) && a.LocalNicAddress[0],
           "LocalNicAddress is not non-empty NUL-padded text");
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
    const char *addr = (const char *)a.LocalNicAddress;
    if (strcmp(g_provider, "udp") == 0)
        CHECKF(strchr(addr, ':') != NULL, "udp address \"%s\" is not ip:port", addr);
    if (strcmp(g_provider, "shm") == 0 && strncmp(g_device, "shm:", 4) == 0)
        CHECKF(strcmp(addr, g_device + 4) == 0, "shm address \"%s\", expected the instance \"%s\"", addr, g_device + 4);
    if (strcmp(g_provider, "xdp") == 0)
        CHECKF(strlen(addr) == 17 && addr[2] == ':', "xdp address \"%s\" is not a MAC", addr);
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
        CHECK_EQ(a->HostAddressLen, VIPL_HOST_ADDRESS_LEN);
        char text[VIPL_HOST_ADDRESS_LEN + 1] = {0};
        memcpy(text, a->HostAddress, VIPL_HOST_ADDRESS_LEN);
        int k = want[0] && strcmp(text, want[0]) == 0 ? 0 : want[1] && strcmp(text, want[1]) == 0 ? 1 : -1;
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
