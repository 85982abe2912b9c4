/*
 * VIs: create with each level and with each bad attribute (and its error
 * code), query, set attributes, destroy rules, handles of the wrong kind.
 * (Rules that need a connected VI are in the cm area.)
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

static void check_attrs_equal(const char *file, int line, const VIP_VI_ATTRIBUTES *got,
                              const VIP_VI_ATTRIBUTES *want)
{
    h_count();
    if (got->ReliabilityLevel != want->ReliabilityLevel || got->MaxTransferSize != want->MaxTransferSize ||
        got->QoS != want->QoS || got->Ptag != want->Ptag || !!got->EnableRdmaWrite != !!want->EnableRdmaWrite ||
        !!got->EnableRdmaRead != !!want->EnableRdmaRead)
        h_fail(file, line,
               "VI attributes: expected level 0x%x, mtu %lu, qos %p, ptag %p, rdma w%d r%d; got level 0x%x, mtu %lu, "
               "qos %p, ptag %p, rdma w%d r%d",
               (unsigned)want->ReliabilityLevel, want->MaxTransferSize, want->QoS, want->Ptag,
               !!want->EnableRdmaWrite, !!want->EnableRdmaRead, (unsigned)got->ReliabilityLevel,
               got->MaxTransferSize, got->QoS, got->Ptag, !!got->EnableRdmaWrite, !!got->EnableRdmaRead);
}
#define CHECK_VI_ATTRS(got, want) check_attrs_equal(__FILE__, __LINE__, (got), (want))

static void t_create_query(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_RELIABILITY_LEVEL lv[3];
    int n = claimed_levels(lv);
    REQUIRE(n > 0);
    for (int i = 0; i < n; i++) {
        VIP_VI_ATTRIBUTES a = vi_attrs(&s, lv[i]), q;
        a.EnableRdmaWrite = VIP_TRUE;
        a.EnableRdmaRead = (s.attrs.RDMAReadSupport & lv[i]) ? VIP_TRUE : VIP_FALSE;
        a.MaxTransferSize = 4000 + (VIP_ULONG)i;
        VIP_VI_HANDLE vi = NULL;
        REQUIRE_RET(VipCreateVi(s.nic, &a, NULL, NULL, &vi), VIP_SUCCESS);
        CHECK(vi != NULL);
        VIP_VI_STATE st = (VIP_VI_STATE)-1;
        VIP_BOOLEAN se = -1, re = -1;
        memset(&q, 0, sizeof q);
        CHECK_RET(VipQueryVi(vi, &st, &q, &se, &re), VIP_SUCCESS);
        CHECK_EQ(st, VIP_STATE_IDLE);
        CHECK_VI_ATTRS(&q, &a);
        CHECK_EQ(se, VIP_TRUE);
        CHECK_EQ(re, VIP_TRUE);
        CHECK_RET(VipDestroyVi(vi), VIP_SUCCESS);
    }
    /* The largest transfer size the NIC allows is allowed. */
    VIP_VI_ATTRIBUTES a = vi_attrs(&s, lv[0]);
    a.MaxTransferSize = s.attrs.MaxTransferSize;
    VIP_VI_HANDLE vi = NULL;
    CHECK_RET(VipCreateVi(s.nic, &a, NULL, NULL, &vi), VIP_SUCCESS);
    if (vi)
        CHECK_RET(VipDestroyVi(vi), VIP_SUCCESS);
    side_close(&s);
}

static void t_bad_attributes(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_RELIABILITY_LEVEL lv[3];
    REQUIRE(claimed_levels(lv) > 0);
    VIP_VI_HANDLE vi = NULL;
    VIP_VI_ATTRIBUTES a;
#define TRY(field_change, want)                                                \
    do {                                                                       \
        a = vi_attrs(&s, lv[0]);                                               \
        field_change;                                                          \
        vi = NULL;                                                             \
        CHECK_RET(VipCreateVi(s.nic, &a, NULL, NULL, &vi), want);              \
    } while (0)
    TRY(a.ReliabilityLevel = 0, VIP_INVALID_RELIABILITY_LEVEL);
    TRY(a.ReliabilityLevel = VIP_SERVICE_UNRELIABLE | VIP_SERVICE_RELIABLE_DELIVERY, VIP_INVALID_RELIABILITY_LEVEL);
    TRY(a.ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY | VIP_SERVICE_RELIABLE_RECEPTION,
        VIP_INVALID_RELIABILITY_LEVEL);
    TRY(a.ReliabilityLevel = 0x08, VIP_INVALID_RELIABILITY_LEVEL);
    TRY(a.ReliabilityLevel = 0x100, VIP_INVALID_RELIABILITY_LEVEL);
    for (VIP_RELIABILITY_LEVEL l = 1; l <= 4; l <<= 1)
        if (!(s.attrs.ReliabilityLevelSupport & l))
            TRY(a.ReliabilityLevel = l, VIP_INVALID_RELIABILITY_LEVEL);
    TRY(a.MaxTransferSize = 0, VIP_INVALID_MTU);
    TRY(a.MaxTransferSize = s.attrs.MaxTransferSize + 1, VIP_INVALID_MTU);
    static int qos_token;
    TRY(a.QoS = &qos_token, VIP_INVALID_QOS);
    /* A destroyed tag, and one of another NIC. */
    VIP_PROTECTION_HANDLE gone = NULL;
    REQUIRE_RET(VipCreatePtag(s.nic, &gone), VIP_SUCCESS);
    REQUIRE_RET(VipDestroyPtag(s.nic, gone), VIP_SUCCESS);
    TRY(a.Ptag = gone, VIP_INVALID_PTAG);
    VIP_NIC_HANDLE other = NULL;
    REQUIRE_RET(VipOpenNic("shm", &other), VIP_SUCCESS);
    VIP_PROTECTION_HANDLE theirs = NULL;
    REQUIRE_RET(VipCreatePtag(other, &theirs), VIP_SUCCESS);
    TRY(a.Ptag = theirs, VIP_INVALID_PTAG);
    /* RDMA read at a level the NIC has none at. */
    for (VIP_RELIABILITY_LEVEL l = 1; l <= 4; l <<= 1)
        if ((s.attrs.ReliabilityLevelSupport & l) && !(s.attrs.RDMAReadSupport & l))
            TRY((a.ReliabilityLevel = l, a.EnableRdmaRead = VIP_TRUE), VIP_INVALID_RDMAREAD);
    /* Missing pointers. */
    a = vi_attrs(&s, lv[0]);
    CHECK_RET(VipCreateVi(s.nic, NULL, NULL, NULL, &vi), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCreateVi(s.nic, &a, NULL, NULL, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCreateVi(NULL, &a, NULL, NULL, &vi), VIP_INVALID_PARAMETER);
#undef TRY
    /* None of the refused VIs holds the tag. */
    CHECK_RET(VipDestroyPtag(other, theirs), VIP_SUCCESS);
    VIP_PROTECTION_HANDLE p = NULL;
    REQUIRE_RET(VipCreatePtag(s.nic, &p), VIP_SUCCESS);
    a = vi_attrs(&s, lv[0]);
    a.Ptag = p;
    a.MaxTransferSize = 0;
    CHECK_RET(VipCreateVi(s.nic, &a, NULL, NULL, &vi), VIP_INVALID_MTU);
    CHECK_RET(VipDestroyPtag(s.nic, p), VIP_SUCCESS);
    CHECK_RET(VipCloseNic(other), VIP_SUCCESS);
    side_close(&s);
}

static void t_query_errors(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES q;
    VIP_BOOLEAN se, re;
    CHECK_RET(VipQueryVi(NULL, &st, &q, &se, &re), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryVi(vi, NULL, &q, &se, &re), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryVi(vi, &st, NULL, &se, &re), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryVi(vi, &st, &q, NULL, &re), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryVi(vi, &st, &q, &se, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryVi(vi, &st, &q, &se, &re), VIP_SUCCESS);
    CHECK_RET(vi_destroy(&s, vi), VIP_SUCCESS);
    side_close(&s);
}

static void t_set_attributes(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_RELIABILITY_LEVEL lv[3];
    int n = claimed_levels(lv);
    VIP_VI_HANDLE vi = vi_new(&s, lv[0], 0, 0, NULL, NULL);
    VIP_VI_ATTRIBUTES a = vi_attrs(&s, lv[n - 1]), q;
    VIP_VI_STATE st;
    VIP_BOOLEAN se, re;
    VIP_PROTECTION_HANDLE p2 = NULL;
    REQUIRE_RET(VipCreatePtag(s.nic, &p2), VIP_SUCCESS);
    a.Ptag = p2;
    a.MaxTransferSize = 1234;
    a.EnableRdmaWrite = VIP_TRUE;
    CHECK_RET(VipSetViAttributes(vi, &a), VIP_SUCCESS);
    memset(&q, 0, sizeof q);
    CHECK_RET(VipQueryVi(vi, &st, &q, &se, &re), VIP_SUCCESS);
    CHECK_VI_ATTRS(&q, &a);
    /* The new tag is held by the VI. */
    CHECK_RET(VipDestroyPtag(s.nic, p2), VIP_ERROR_RESOURCE);
    /* Refused changes, each with its code; nothing changes. */
    VIP_VI_ATTRIBUTES b = a;
    b.MaxTransferSize = 0;
    CHECK_RET(VipSetViAttributes(vi, &b), VIP_INVALID_MTU);
    b = a;
    b.ReliabilityLevel = 0;
    CHECK_RET(VipSetViAttributes(vi, &b), VIP_INVALID_RELIABILITY_LEVEL);
    b = a;
    static int qos_token;
    b.QoS = &qos_token;
    CHECK_RET(VipSetViAttributes(vi, &b), VIP_INVALID_QOS);
    VIP_PROTECTION_HANDLE gone = NULL;
    REQUIRE_RET(VipCreatePtag(s.nic, &gone), VIP_SUCCESS);
    REQUIRE_RET(VipDestroyPtag(s.nic, gone), VIP_SUCCESS);
    b = a;
    b.Ptag = gone;
    CHECK_RET(VipSetViAttributes(vi, &b), VIP_INVALID_PTAG);
    for (VIP_RELIABILITY_LEVEL l = 1; l <= 4; l <<= 1)
        if ((s.attrs.ReliabilityLevelSupport & l) && !(s.attrs.RDMAReadSupport & l)) {
            b = a;
            b.ReliabilityLevel = l;
            b.EnableRdmaRead = VIP_TRUE;
            /* Taken anyway: put the VI back, so the check below is about
             * the other refusals only. */
            if (CHECK_RET(VipSetViAttributes(vi, &b), VIP_INVALID_RDMAREAD) == VIP_SUCCESS)
                VipSetViAttributes(vi, &a);
        }
    CHECK_RET(VipSetViAttributes(vi, NULL), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSetViAttributes(NULL, &a), VIP_INVALID_PARAMETER);
    memset(&q, 0, sizeof q);
    CHECK_RET(VipQueryVi(vi, &st, &q, &se, &re), VIP_SUCCESS);
    CHECK_VI_ATTRS(&q, &a);
    CHECK_RET(vi_destroy(&s, vi), VIP_SUCCESS);
    CHECK_RET(VipDestroyPtag(s.nic, p2), VIP_SUCCESS);
    side_close(&s);
}

static void t_destroy_with_descriptors(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    /* An idle VI takes receives; one holding a descriptor cannot go. */
    VIP_DESCRIPTOR *d = recv_desc(&s, 64);
    REQUIRE_RET(VipPostRecv(vi, d, s.mh), VIP_SUCCESS);
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES q;
    VIP_BOOLEAN se = -1, re = -1;
    CHECK_RET(VipQueryVi(vi, &st, &q, &se, &re), VIP_SUCCESS);
    CHECK_EQ(st, VIP_STATE_IDLE);
    CHECK_EQ(se, VIP_TRUE);
    CHECK_EQ(re, VIP_FALSE);
    CHECK_RET(VipDestroyVi(vi), VIP_INVALID_STATE);
    /* Still there, descriptor and all. */
    CHECK_RET(VipQueryVi(vi, &st, &q, &se, &re), VIP_SUCCESS);
    CHECK_EQ(re, VIP_FALSE);
    /* Not complete: nothing to take. */
    VIP_DESCRIPTOR *got = NULL;
    CHECK_RET(VipRecvDone(vi, &got), VIP_NOT_DONE);
    CHECK_RET(VipDestroyVi(NULL), VIP_INVALID_PARAMETER);
    side_close(&s);
}

static void t_wrong_kind(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_CQ_HANDLE cq = NULL;
    REQUIRE_RET(VipCreateCQ(s.nic, 4, &cq), VIP_SUCCESS);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES q = vi_attrs(&s, default_level());
    VIP_BOOLEAN se, re;
    VIP_DESCRIPTOR *d = recv_desc(&s, 64);
    VIP_DESCRIPTOR *got = NULL;
    VIP_BOOLEAN rq;
    VIP_VI_HANDLE v2;
    /* A NIC or a CQ where a VI is wanted, and the other way round. */
    CHECK_RET(VipQueryVi((VIP_VI_HANDLE)s.nic, &st, &q, &se, &re), VIP_INVALID_PARAMETER);
    CHECK_RET(VipQueryVi((VIP_VI_HANDLE)cq, &st, &q, &se, &re), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSetViAttributes((VIP_VI_HANDLE)cq, &q), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDestroyVi((VIP_VI_HANDLE)s.nic), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDestroyVi((VIP_VI_HANDLE)cq), VIP_INVALID_PARAMETER);
    CHECK_RET(VipPostRecv((VIP_VI_HANDLE)cq, d, s.mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipPostSend((VIP_VI_HANDLE)s.nic, d, s.mh), VIP_INVALID_PARAMETER);
    CHECK_RET(VipRecvDone((VIP_VI_HANDLE)cq, &got), VIP_INVALID_PARAMETER);
    CHECK_RET(VipSendWait((VIP_VI_HANDLE)s.nic, 10, &got), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDisconnect((VIP_VI_HANDLE)cq), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDestroyCQ((VIP_CQ_HANDLE)vi), VIP_INVALID_PARAMETER);
    CHECK_RET(VipDestroyCQ((VIP_CQ_HANDLE)s.nic), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCQDone((VIP_CQ_HANDLE)vi, &v2, &rq), VIP_INVALID_PARAMETER);
    CHECK_RET(VipResizeCQ((VIP_CQ_HANDLE)vi, 8), VIP_INVALID_PARAMETER);
    VIP_VI_HANDLE vi2 = NULL;
    CHECK_RET(VipCreateVi(s.nic, &q, (VIP_CQ_HANDLE)vi, NULL, &vi2), VIP_INVALID_PARAMETER);
    CHECK_RET(VipCreateVi(s.nic, &q, NULL, (VIP_CQ_HANDLE)s.nic, &vi2), VIP_INVALID_PARAMETER);
    /* Everything still works. */
    CHECK_RET(VipQueryVi(vi, &st, &q, &se, &re), VIP_SUCCESS);
    CHECK_RET(vi_destroy(&s, vi), VIP_SUCCESS);
    CHECK_RET(VipDestroyCQ(cq), VIP_SUCCESS);
    side_close(&s);
}

static void t_vi_table_full(int arg)
{
    (void)arg;
    struct side s;
    side_open(&s, NULL);
    VIP_ULONG max = s.attrs.MaxVI;
    if (max > 1024)
        h_skip("MaxVI %lu is more than the test fills", max);
    VIP_VI_HANDLE *v = calloc(max + 1, sizeof *v);
    REQUIRE(v != NULL);
    VIP_VI_ATTRIBUTES a = vi_attrs(&s, default_level());
    VIP_ULONG made = 0;
    VIP_RETURN r = VIP_SUCCESS;
    while (made < max && (r = VipCreateVi(s.nic, &a, NULL, NULL, &v[made])) == VIP_SUCCESS)
        made++;
    CHECKF(made == max, "created %lu VIs of MaxVI %lu; then %s", made, max, vip_ret_name(r));
    CHECK_RET(VipCreateVi(s.nic, &a, NULL, NULL, &v[made]), VIP_ERROR_RESOURCE);
    if (made) {
        CHECK_RET(VipDestroyVi(v[made - 1]), VIP_SUCCESS);
        CHECK_RET(VipCreateVi(s.nic, &a, NULL, NULL, &v[made - 1]), VIP_SUCCESS);
    }
    free(v);
    side_close(&s);
}

const struct test vi_tests[] = {
    {"vi", "create_query_each_level", t_create_query, 0, 0},
    {"vi", "bad_attributes", t_bad_attributes, 0, 0},
    {"vi", "query_errors", t_query_errors, 0, 0},
    {"vi", "set_attributes_idle", t_set_attributes, 0, 0},
    {"vi", "destroy_with_descriptors", t_destroy_with_descriptors, 0, 0},
    {"vi", "wrong_kind_handles", t_wrong_kind, 0, 0},
    {"vi", "vi_table_full", t_vi_table_full, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
