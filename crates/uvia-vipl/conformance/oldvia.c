/*
 * oldvia: a VIA program in the style of the late 1990s, written against the
 * VIPL 1.0 interface only (no provider-specific names beyond the device).
 * The conformance runner compiles it with -Wall -Wextra -Werror, also as
 * C89, and runs it: a ping-pong between two processes over a device.
 *
 *     oldvia [-d device] [-h host] [-n count]
 *
 * The server's host name is looked up with the name service (VipNSInit
 * with NULL: the provider's default hosts file).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <vipl.h>

#define MSG_SIZE 1024
#define NDESC 4
#define TIMEOUT 5000

static VIP_NIC_HANDLE nic;
static VIP_NIC_ATTRIBUTES nic_attrs;
static VIP_PROTECTION_HANDLE ptag;
static VIP_MEM_HANDLE mem_handle;
static char *region;
static VIP_DESCRIPTOR *send_desc[NDESC], *recv_desc[NDESC];
static char *send_buf[NDESC], *recv_buf[NDESC];

static void die(const char *what, VIP_RETURN status)
{
    fprintf(stderr, "oldvia (pid %d): %s failed: %d\n", (int)getpid(), what, (int)status);
    exit(1);
}

static void setup(const char *device)
{
    VIP_RETURN status;
    VIP_MEM_ATTRIBUTES mem_attrs;
    size_t len;
    int i;

    status = VipOpenNic(device, &nic);
    if (status != VIP_SUCCESS)
        die("VipOpenNic", status);
    status = VipQueryNic(nic, &nic_attrs);
    if (status != VIP_SUCCESS)
        die("VipQueryNic", status);
    status = VipCreatePtag(nic, &ptag);
    if (status != VIP_SUCCESS)
        die("VipCreatePtag", status);

    /* Descriptors and buffers in one registered region. */
    len = 2 * NDESC * (sizeof(VIP_DESCRIPTOR) + MSG_SIZE) + 4096;
    region = malloc(len + VIP_DESCRIPTOR_ALIGNMENT);
    if (region == NULL)
        die("malloc", VIP_ERROR_RESOURCE);
    region = (char *)(((unsigned long)region + VIP_DESCRIPTOR_ALIGNMENT - 1) &
                      ~(unsigned long)(VIP_DESCRIPTOR_ALIGNMENT - 1));
    memset(region, 0, len);
    mem_attrs.Ptag = ptag;
    mem_attrs.EnableRdmaWrite = VIP_FALSE;
    mem_attrs.EnableRdmaRead = VIP_FALSE;
    status = VipRegisterMem(nic, region, len, &mem_attrs, &mem_handle);
    if (status != VIP_SUCCESS)
        die("VipRegisterMem", status);
    for (i = 0; i < NDESC; i++) {
        send_desc[i] = (VIP_DESCRIPTOR *)(region + (2 * i) * sizeof(VIP_DESCRIPTOR));
        recv_desc[i] = (VIP_DESCRIPTOR *)(region + (2 * i + 1) * sizeof(VIP_DESCRIPTOR));
        send_buf[i] = region + 2 * NDESC * sizeof(VIP_DESCRIPTOR) + (2 * i) * MSG_SIZE;
        recv_buf[i] = region + 2 * NDESC * sizeof(VIP_DESCRIPTOR) + (2 * i + 1) * MSG_SIZE;
    }
}

static VIP_VI_HANDLE make_vi(void)
{
    VIP_VI_ATTRIBUTES vi_attrs;
    VIP_VI_HANDLE vi;
    VIP_RETURN status;

    vi_attrs.ReliabilityLevel = VIP_SERVICE_RELIABLE_DELIVERY;
    vi_attrs.MaxTransferSize = MSG_SIZE;
    vi_attrs.QoS = 0;
    vi_attrs.Ptag = ptag;
    vi_attrs.EnableRdmaWrite = VIP_FALSE;
    vi_attrs.EnableRdmaRead = VIP_FALSE;
    status = VipCreateVi(nic, &vi_attrs, NULL, NULL, &vi);
    if (status != VIP_SUCCESS)
        die("VipCreateVi", status);
    return vi;
}

static void post_recv(VIP_VI_HANDLE vi, int i)
{
    VIP_DESCRIPTOR *d = recv_desc[i];
    VIP_RETURN status;

    d->CS.Control = VIP_CONTROL_OP_SENDRECV;
    d->CS.SegCount = 1;
    d->CS.Length = MSG_SIZE;
    d->CS.Status = 0;
    d->DS[0].Local.Data.Address = recv_buf[i];
    d->DS[0].Local.Handle = mem_handle;
    d->DS[0].Local.Length = MSG_SIZE;
    status = VipPostRecv(vi, d, mem_handle);
    if (status != VIP_SUCCESS)
        die("VipPostRecv", status);
}

static void send_msg(VIP_VI_HANDLE vi, int i, int seq)
{
    VIP_DESCRIPTOR *d = send_desc[i];
    VIP_DESCRIPTOR *done;
    VIP_RETURN status;

    sprintf(send_buf[i], "message %d from %d", seq, (int)getpid());
    d->CS.Control = VIP_CONTROL_OP_SENDRECV | VIP_CONTROL_IMMEDIATE;
    d->CS.ImmediateData = (VIP_UINT32)seq;
    d->CS.SegCount = 1;
    d->CS.Length = MSG_SIZE;
    d->CS.Status = 0;
    d->DS[0].Local.Data.Address = send_buf[i];
    d->DS[0].Local.Handle = mem_handle;
    d->DS[0].Local.Length = MSG_SIZE;
    status = VipPostSend(vi, d, mem_handle);
    if (status != VIP_SUCCESS)
        die("VipPostSend", status);
    status = VipSendWait(vi, TIMEOUT, &done);
    if (status != VIP_SUCCESS)
        die("VipSendWait", status);
    if (done != d || (done->CS.Status & VIP_STATUS_ERROR_MASK))
        die("send completion", VIP_DESCRIPTOR_ERROR);
}

static void recv_msg(VIP_VI_HANDLE vi, int i, int seq)
{
    VIP_DESCRIPTOR *done;
    VIP_RETURN status;

    status = VipRecvWait(vi, TIMEOUT, &done);
    if (status != VIP_SUCCESS)
        die("VipRecvWait", status);
    if (done != recv_desc[i] || (done->CS.Status & VIP_STATUS_ERROR_MASK) ||
        !(done->CS.Status & VIP_STATUS_IMMEDIATE) || done->CS.ImmediateData != (VIP_UINT32)seq ||
        done->CS.Length != MSG_SIZE)
        die("receive completion", VIP_DESCRIPTOR_ERROR);
}

static VIP_NET_ADDRESS *net_address(const char *host, const char *disc)
{
    VIP_NET_ADDRESS *addr;
    VIP_RETURN status;

    addr = malloc(sizeof(VIP_NET_ADDRESS) + nic_attrs.NicAddressLen + strlen(disc));
    if (addr == NULL)
        die("malloc", VIP_ERROR_RESOURCE);
    status = VipNSGetHostByName(nic, (VIP_CHAR *)host, addr, 0);
    if (status != VIP_SUCCESS)
        die("VipNSGetHostByName", status);
    addr->DiscriminatorLen = (VIP_UINT16)strlen(disc);
    memcpy(addr->HostAddress + addr->HostAddressLen, disc, strlen(disc));
    return addr;
}

int main(int argc, char **argv)
{
    const char *device = "/dev/via_lo";
    const char *host = "localhost";
    char disc[32];
    int count = 100, opt, i, is_server;
    pid_t child;
    VIP_VI_HANDLE vi;
    VIP_NET_ADDRESS *local, *remote;
    VIP_VI_ATTRIBUTES remote_attrs;
    VIP_CONN_HANDLE conn;
    VIP_RETURN status;
    int wstatus;

    while ((opt = getopt(argc, argv, "d:h:n:")) != -1) {
        switch (opt) {
        case 'd':
            device = optarg;
            break;
        case 'h':
            host = optarg;
            break;
        case 'n':
            count = atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: oldvia [-d device] [-h host] [-n count]\n");
            return 2;
        }
    }
    sprintf(disc, "oldvia%d", (int)getpid());
    fflush(stdout);
    child = fork();
    if (child < 0)
        die("fork", VIP_ERROR_RESOURCE);
    is_server = child != 0;
    alarm(60);

    setup(device);
    status = VipNSInit(nic, NULL);
    if (status != VIP_SUCCESS)
        die("VipNSInit", status);
    vi = make_vi();
    for (i = 0; i < NDESC; i++)
        post_recv(vi, i);
    local = net_address(host, disc);
    remote = net_address(host, disc);

    if (is_server) {
        /* The server's own address: its NIC's, with the discriminator. */
        memset(local->HostAddress, 0, local->HostAddressLen);
        memcpy(local->HostAddress, nic_attrs.LocalNicAddress, nic_attrs.NicAddressLen);
        memcpy(local->HostAddress + local->HostAddressLen, disc, strlen(disc));
        status = VipConnectWait(nic, local, TIMEOUT, remote, &remote_attrs, &conn);
        if (status != VIP_SUCCESS)
            die("VipConnectWait", status);
        status = VipConnectAccept(conn, vi);
        if (status != VIP_SUCCESS)
            die("VipConnectAccept", status);
        for (i = 0; i < count; i++) {
            recv_msg(vi, i % NDESC, i);
            post_recv(vi, i % NDESC);
            send_msg(vi, i % NDESC, i);
        }
    } else {
        memcpy(local->HostAddress, nic_attrs.LocalNicAddress, nic_attrs.NicAddressLen);
        status = VipConnectRequest(vi, local, remote, TIMEOUT, &remote_attrs);
        if (status != VIP_SUCCESS)
            die("VipConnectRequest", status);
        for (i = 0; i < count; i++) {
            send_msg(vi, i % NDESC, i);
            recv_msg(vi, i % NDESC, i);
            post_recv(vi, i % NDESC);
        }
    }
    /* Each side drains what is still posted, then leaves. */
    sleep(1);
    VipDisconnect(vi);
    for (i = 0; i < NDESC; i++) {
        VIP_DESCRIPTOR *d;
        VipRecvDone(vi, &d);
    }
    VipDestroyVi(vi);
    VipDeregisterMem(nic, region, mem_handle);
    VipDestroyPtag(nic, ptag);
    VipNSShutdown(nic);
    VipCloseNic(nic);
    if (!is_server)
        _exit(0);
    if (waitpid(child, &wstatus, 0) != child || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        fprintf(stderr, "oldvia: the client failed\n");
        return 1;
    }
    printf("oldvia %s: %d round trips of %d bytes\n", device, count, MSG_SIZE);
    return 0;
}
