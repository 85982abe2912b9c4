/*
 * Memory: VipRegisterMem, VipDeregisterMem, VipQueryMem and
 * VipSetMemAttributes, with every error docs/VIPL.md lists for them.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

static VIP_MEM_ATTRIBUTES mattrs(VIP_PROTECTION_HANDLE p, int w, int r)
{
    VIP_MEM_ATTRIBUTES a = {.Ptag = p, .EnableRdmaWrite = w ? VIP_TRUE : VIP_FALSE, .EnableRdmaRead = r ? VIP_TRUE : VIP_FALSE};
    return a;
}

#define CHECK_MEM_ATTRS(got, p, w, r)                                          \
    do {                                                                       \
        CHECK((got).Ptag == (p));                                              \
        CHECK_EQ(!!(got).EnableRdmaWrite, !!(w));                              \
        CHECK_EQ(!!(got).EnableRdmaRead, !!(r));                               \
    } while (0)

static void t_register(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    size_t len = 3 * 4096 + 100;
    char *buf = malloc(len);
    REQUIRE(buf != NULL);
    for (int w = 0; w < 2; w++)
        for (int r = 0; r < 2; r++) {
            VIP_MEM_ATTRIBUTES ma = mattrs(s.ptag, w, r), q;
            VIP_MEM_HANDLE mh = 0;
            REQUIRE_RET(VipRegisterMem(s.nic, buf + 1, len - 1, &ma, &mh), VIP_SUCCESS);
            memset(&q, 0, sizeof q);
            CHECK_RET(VipQueryMem(s.nic, buf + 1, mh, &q), VIP_SUCCESS);
            CHECK_MEM_ATTRS(q, s.ptag, w, r);
            /* Any address inside the region names it. */
            memset(&q, 0, sizeof q);
            CHECK_RET(VipQueryMem(s.nic, buf + len - 1, mh, &q), VIP_SUCCESS);
            CHECK_MEM_ATTRS(q, s.ptag, w, r);
            CHECK_RET(VipDeregisterMem(s.nic, buf + 1, mh), VIP_SUCCESS);
            /* Gone. */
            CHECK_RET(VipQueryMem(s.nic, buf + 1, mh, &q), VIP_INVALID_PARAMETER);
            CHECK_RET(VipDeregisterMem(s.nic, buf + 1, mh), VIP_INVALID_PARAMETER);
        }
    free(buf);
    side_close(&s);
}

static void t_register_errors(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    char *buf = arena_take(&s, 4096);
    VIP_MEM_ATTRIBUTES ma = mattrs(s.ptag, 0, 0);
    VIP_MEM_HANDLE mh;
    CHECK_RET(VipRegisterMem(s.nic, buf, 0, &ma, &mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipRegisterMem(s.nic, NULL, 4096, &ma, &mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipRegisterMem(s.nic, buf, 4096, NULL, &mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipRegisterMem(s.nic, buf, 4096, &ma, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipRegisterMem(NULL, buf, 4096, &ma, &mh), VIP_INVALID_PARAMETER);
    /* A tag destroyed before, and one of another NIC. */
    VIP_PROTECTION_HANDLE gone = NULL;
    REQUIRE_RET(VipCreatePtag(s.nic, &gone), VIP_SUCCESS);
    REQUIRE_RET(VipDestroyPtag(s.nic, gone), VIP_SUCCESS);
    ma.Ptag = gone;
    CHECK_RET(VipRegisterMem(s.nic, buf, 4096, &ma, &mh), VIP_INVALID_PTAG);
    VIP_NIC_HANDLE other = NULL;
    REQUIRE_RET(VipOpenNic("shm", &other), VIP_SUCCESS);
    VIP_PROTECTION_HANDLE theirs = NULL;
    REQUIRE_RET(VipCreatePtag(other, &theirs), VIP_SUCCESS);
    ma.Ptag = theirs;
    CHECK_RET(VipRegisterMem(s.nic, buf, 4096, &ma, &mh), VIP_INVALID_PTAG);
    /* Nothing above was registered: the tag can go. */
    CHECK_RET(VipDestroyPtag(other, theirs), VIP_SUCCESS);
    CHECK_RET(VipCloseNic(other), VIP_SUCCESS);
    side_close(&s);
}

static void t_query_errors(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    char *buf = arena_take(&s, 8192);
    VIP_MEM_ATTRIBUTES ma = mattrs(s.ptag, 1, 0), q;
    VIP_MEM_HANDLE mh;
    REQUIRE_RET(VipRegisterMem(s.nic, buf + 4096, 1024, &ma, &mh), VIP_SUCCESS);
    CHECK_RET(VipQueryMem(s.nic, buf + 4096 + 512, mh, &q), VIP_SUCCESS);
    /* Outside the region: before it, just past its end. */
    CHECK_RET(VipQueryMem(s.nic, buf + 4095, mh, &q), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryMem(s.nic, buf + 4096 + 1024, mh, &q), VIP_INVALID_PARAMETER);
    /* A handle that names nothing. */
    CHECK_RET(VipQueryMem(s.nic, buf + 4096, mh ^ 0x5a5a0000u, &q), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryMem(s.nic, buf + 4096, mh, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryMem(NULL, buf + 4096, mh, &q), VIP_INVALID_PARAMETER);
    /* The region is untouched by the refusals. */
    memset(&q, 0, sizeof q);
    CHECK_RET(VipQueryMem(s.nic, buf + 4096, mh, &q), VIP_SUCCESS);
    CHECK_MEM_ATTRS(q, s.ptag, 1, 0);
    CHECK_RET(VipDeregisterMem(s.nic, buf + 4096, mh), VIP_SUCCESS);
    side_close(&s);
}

static void t_set_attributes(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    char *buf = arena_take(&s, 4096);
    VIP_MEM_ATTRIBUTES ma = mattrs(s.ptag, 0, 0), q;
    VIP_MEM_HANDLE mh;
    REQUIRE_RET(VipRegisterMem(s.nic, buf, 4096, &ma, &mh), VIP_SUCCESS);
    ma = mattrs(s.ptag, 1, 1);
    CHECK_RET(VipSetMemAttributes(s.nic, buf, mh, &ma), VIP_SUCCESS);
    memset(&q, 0, sizeof q);
    CHECK_RET(VipQueryMem(s.nic, buf, mh, &q), VIP_SUCCESS);
    CHECK_MEM_ATTRS(q, s.ptag, 1, 1);
    VIP_PROTECTION_HANDLE p2 = NULL;
    REQUIRE_RET(VipCreatePtag(s.nic, &p2), VIP_SUCCESS);
    ma = mattrs(p2, 0, 1);
    CHECK_RET(VipSetMemAttributes(s.nic, buf + 100, mh, &ma), VIP_SUCCESS);
    memset(&q, 0, sizeof q);
    CHECK_RET(VipQueryMem(s.nic, buf, mh, &q), VIP_SUCCESS);
    CHECK_MEM_ATTRS(q, p2, 0, 1);
    /* Refused changes leave the region as it was. */
    VIP_NIC_HANDLE other = NULL;
    REQUIRE_RET(VipOpenNic("shm", &other), VIP_SUCCESS);
    VIP_PROTECTION_HANDLE theirs = NULL;
    REQUIRE_RET(VipCreatePtag(other, &theirs), VIP_SUCCESS);
    ma = mattrs(theirs, 1, 1);
    CHECK_RET(VipSetMemAttributes(s.nic, buf, mh, &ma), VIP_INVALID_PTAG);
    ma = mattrs(s.ptag, 1, 1);
    CHECK_RET(VipSetMemAttributes(s.nic, buf + 4096, mh, &ma), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSetMemAttributes(s.nic, buf, mh ^ 0x5a5a0000u, &ma), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSetMemAttributes(s.nic, buf, mh, NULL), VIP_INVALID_PARAMETER);
    memset(&q, 0, sizeof q);
    CHECK_RET(VipQueryMem(s.nic, buf, mh, &q), VIP_SUCCESS);
    CHECK_MEM_ATTRS(q, p2, 0, 1);
    CHECK_RET(VipDeregisterMem(s.nic, buf, mh), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, p2), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(other, theirs), VIP_SUCCESS);
    CHECK_RET(VipCloseNic(other), VIP_SUCCESS);
    side_close(&s);
}

static void t_deregister_errors(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    char *buf = arena_take(&s, 8192);
    VIP_MEM_ATTRIBUTES ma = mattrs(s.ptag, 0, 0), q;
    VIP_MEM_HANDLE mh;
    REQUIRE_RET(VipRegisterMem(s.nic, buf + 4096, 1024, &ma, &mh), VIP_SUCCESS);
    CHECK_RET(VipDeregisterMem(s.nic, buf, mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDeregisterMem(s.nic, buf + 4096, mh ^ 0x5a5a0000u), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDeregisterMem(NULL, buf + 4096, mh), VIP_INVALID_PARAMETER);
    /* Still registered after the refusals. */
    CHECK_RET(VipQueryMem(s.nic, buf + 4096, mh, &q), VIP_SUCCESS);
    CHECK_RET(VipDeregisterMem(s.nic, buf + 4096, mh), VIP_SUCCESS);
    side_close(&s);
}

static void t_twice(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    char *buf = arena_take(&s, 4096);
    VIP_MEM_ATTRIBUTES ma = mattrs(s.ptag, 0, 0), q;
    VIP_MEM_HANDLE a, b;
    REQUIRE_RET(VipRegisterMem(s.nic, buf, 4096, &ma, &a), VIP_SUCCESS);
    ma.EnableRdmaWrite = VIP_TRUE;
    REQUIRE_RET(VipRegisterMem(s.nic, buf + 1024, 1024, &ma, &b), VIP_SUCCESS);
    CHECK(a != b);
    /* Each keeps its own attributes; one going leaves the other. */
    CHECK_RET(VipQueryMem(s.nic, buf + 1024, a, &q), VIP_SUCCESS);
    CHECK_MEM_ATTRS(q, s.ptag, 0, 0);
    CHECK_RET(VipQueryMem(s.nic, buf + 1024, b, &q), VIP_SUCCESS);
    CHECK_MEM_ATTRS(q, s.ptag, 1, 0);
    CHECK_RET(VipDeregisterMem(s.nic, buf, a), VIP_SUCCESS);
    CHECK_RET(VipQueryMem(s.nic, buf + 1024, b, &q), VIP_SUCCESS);
    CHECK_RET(VipDeregisterMem(s.nic, buf + 1024, b), VIP_SUCCESS);
    side_close(&s);
}

static void t_table_full(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_ULONG max = s.attrs.MaxRegisterRegions;
    if (max > (1u << 18))
        h_skip("MaxRegisterRegions %lu is more than the test fills", max);
    char *buf = arena_take(&s, 4096);
    VIP_MEM_HANDLE *h = calloc(max + 1, sizeof *h);
    REQUIRE(h != NULL);
    VIP_MEM_ATTRIBUTES ma = mattrs(s.ptag, 0, 0);
    /* The arena holds one region already. */
    VIP_ULONG made = 0;
    VIP_RETURN r = VIP_SUCCESS;
    while (made + 1 < max && (r = VipRegisterMem(s.nic, buf + (made % 4000), 64, &ma, &h[made])) == VIP_SUCCESS)
        made++;
    CHECKF(made + 1 == max, "registered %lu regions besides the arena, of MaxRegisterRegions %lu; then %s", made, max,
           vip_ret_name(r));
    CHECK_RET(VipRegisterMem(s.nic, buf, 64, &ma, &h[made]), VIP_ERROR_RESOURCE);
    if (made > 0) {
        CHECK_RET(VipDeregisterMem(s.nic, buf + ((made - 1) % 4000), h[made - 1]), VIP_SUCCESS);
        CHECK_RET(VipRegisterMem(s.nic, buf, 64, &ma, &h[made - 1]), VIP_SUCCESS);
    }
    free(h);
    side_close(&s);
}

const struct test mem_tests[] = {
    {"memory", "register_query_deregister", t_register, 0, 0},
    {"memory", "register_errors", t_register_errors, 0, 0},
    {"memory", "query_errors", t_query_errors, 0, 0},
    {"memory", "set_attributes", t_set_attributes, 0, 0},
    {"memory", "deregister_errors", t_deregister_errors, 0, 0},
    {"memory", "same_memory_twice", t_twice, 0, 0},
    {"memory", "region_table_full", t_table_full, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
