/*
 * Protection tags: create and destroy, tags of another NIC, tags in use,
 * a full tag table.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

/* Another NIC than s's: the device again, or shm where the device cannot
 * be opened twice. */
static VIP_NIC_HANDLE other_nic(void)
{
    VIP_NIC_HANDLE nic = NULL;
    if (VipOpenNic(g_device, &nic) == VIP_SUCCESS)
        return nic;
    REQUIRE_RET(VipOpenNic("shm", &nic), VIP_SUCCESS);
    return nic;
}

static void t_create_destroy(int arg)
{
    (void)arg;
    VIP_NIC_HANDLE nic = NULL;
    REQUIRE_RET(VipOpenNic(g_device, &nic), VIP_SUCCESS);
    VIP_PROTECTION_HANDLE a = NULL, b = NULL;
    REQUIRE_RET(VipCreatePtag(nic, &a), VIP_SUCCESS);
    REQUIRE_RET(VipCreatePtag(nic, &b), VIP_SUCCESS);
    CHECK(a != NULL);
    CHECK(b != NULL);
    CHECK(a != b);
    CHECK_RET(VipDestroyPtag(nic, a), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(nic, b), VIP_SUCCESS);
    /* Destroyed: no longer a tag of this NIC. */
    CHECK_RET(VipDestroyPtag(nic, a), VIP_INVALID_PTAG);
    char buf[64];
    VIP_MEM_ATTRIBUTES ma = {.Ptag = a, .EnableRdmaWrite = VIP_FALSE, .EnableRdmaRead = VIP_FALSE};
    VIP_MEM_HANDLE mh;
    CHECK_RET(VipRegisterMem(nic, buf, sizeof buf, &ma, &mh), VIP_INVALID_PTAG);
    CHECK_RET(VipCreatePtag(nic, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCreatePtag(NULL, &a), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDestroyPtag(NULL, b), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCloseNic(nic), VIP_SUCCESS);
}

static void t_foreign(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_NIC_HANDLE other = other_nic();
    VIP_PROTECTION_HANDLE mine = s.ptag;
    CHECK_RET(VipDestroyPtag(other, mine), VIP_INVALID_PTAG);
    char *buf = arena_take(&s, 256);
    VIP_MEM_ATTRIBUTES ma = {.Ptag = mine, .EnableRdmaWrite = VIP_FALSE, .EnableRdmaRead = VIP_FALSE};
    VIP_MEM_HANDLE mh;
    CHECK_RET(VipRegisterMem(other, buf, 256, &ma, &mh), VIP_INVALID_PTAG);
    VIP_VI_ATTRIBUTES va = vi_attrs(&s, default_level());
    VIP_VI_HANDLE vi = NULL;
    CHECK_RET(VipCreateVi(other, &va, NULL, NULL, &vi), VIP_INVALID_PTAG);
    /* The other NIC's own tag is refused here. */
    VIP_PROTECTION_HANDLE theirs = NULL;
    REQUIRE_RET(VipCreatePtag(other, &theirs), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, theirs), VIP_INVALID_PTAG);
    va.Ptag = theirs;
    CHECK_RET(VipCreateVi(s.nic, &va, NULL, NULL, &vi), VIP_INVALID_PTAG);
    /* Both tags are still good where they belong. */
    CHECK_RET(VipDestroyPtag(other, theirs), VIP_SUCCESS);
    CHECK_RET(VipCloseNic(other), VIP_SUCCESS);
    side_close(&s);
}

static void t_in_use(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_PROTECTION_HANDLE p = NULL;
    REQUIRE_RET(VipCreatePtag(s.nic, &p), VIP_SUCCESS);
    char *buf = arena_take(&s, 4096);
    VIP_MEM_ATTRIBUTES ma = {.Ptag = p, .EnableRdmaWrite = VIP_FALSE, .EnableRdmaRead = VIP_FALSE};
    VIP_MEM_HANDLE mh;
    REQUIRE_RET(VipRegisterMem(s.nic, buf, 4096, &ma, &mh), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, p), VIP_ERROR_RESOURCE);
    CHECK_RET(VipDeregisterMem(s.nic, buf, mh), VIP_SUCCESS);
    /* Used by a VI. */
    VIP_VI_ATTRIBUTES va = vi_attrs(&s, default_level());
    va.Ptag = p;
    VIP_VI_HANDLE vi = NULL;
    REQUIRE_RET(VipCreateVi(s.nic, &va, NULL, NULL, &vi), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, p), VIP_ERROR_RESOURCE);
    CHECK_RET(VipDestroyVi(vi), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, p), VIP_SUCCESS);
    /* A region moved to another tag by VipSetMemAttributes frees the first. */
    VIP_PROTECTION_HANDLE q = NULL;
    REQUIRE_RET(VipCreatePtag(s.nic, &q), VIP_SUCCESS);
    REQUIRE_RET(VipCreatePtag(s.nic, &p), VIP_SUCCESS);
    ma.Ptag = p;
    REQUIRE_RET(VipRegisterMem(s.nic, buf, 4096, &ma, &mh), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, p), VIP_ERROR_RESOURCE);
    ma.Ptag = q;
    CHECK_RET(VipSetMemAttributes(s.nic, buf, mh, &ma), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, p), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, q), VIP_ERROR_RESOURCE);
    CHECK_RET(VipDeregisterMem(s.nic, buf, mh), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, q), VIP_SUCCESS);
    side_close(&s);
}

static void t_table_full(int arg)
{
    (void)arg;
    VIP_NIC_HANDLE nic = NULL;
    VIP_NIC_ATTRIBUTES a;
    REQUIRE_RET(VipOpenNic(g_device, &nic), VIP_SUCCESS);
    REQUIRE_RET(VipQueryNic(nic, &a), VIP_SUCCESS);
    if (a.MaxPtags > 65536)
        h_skip("MaxPtags %lu is more than the test fills", a.MaxPtags);
    VIP_PROTECTION_HANDLE *tags = calloc(a.MaxPtags + 1, sizeof *tags);
    REQUIRE(tags != NULL);
    VIP_ULONG made = 0;
    VIP_RETURN r = VIP_SUCCESS;
    while (made < a.MaxPtags && (r = VipCreatePtag(nic, &tags[made])) == VIP_SUCCESS)
        made++;
    CHECKF(made == a.MaxPtags, "created %lu tags of MaxPtags %lu; the next returned %s", made, a.MaxPtags,
           vip_ret_name(r));
    CHECK_RET(VipCreatePtag(nic, &tags[made]), VIP_ERROR_RESOURCE);
    if (made > 0) {
        CHECK_RET(VipDestroyPtag(nic, tags[made - 1]), VIP_SUCCESS);
        CHECK_RET(VipCreatePtag(nic, &tags[made - 1]), VIP_SUCCESS);
    }
    for (VIP_ULONG i = 0; i < made; i++)
        VipDestroyPtag(nic, tags[i]);
    free(tags);
    CHECK_RET(VipCloseNic(nic), VIP_SUCCESS);
}

const struct test ptag_tests[] = {
    {"ptag", "create_destroy", t_create_destroy, 0, 0},
    {"ptag", "other_nic", t_foreign, 0, 0},
    {"ptag", "in_use", t_in_use, 0, 0},
    {"ptag", "table_full", t_table_full, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
