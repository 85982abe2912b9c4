/*
 * vipl.h: the VI Provider Library interface of the Virtual Interface
 * Architecture (VIPL 1.0), as provided by uvia.
 *
 * Written for uvia from the definitions of the VIA 1.0 specification, with
 * the descriptor layout that Linux VIA programs were built against (M-VIA's):
 * a 32-byte control segment followed by 16-byte segments, 64-byte aligned.
 * Programs link with -lvipl; `pkg-config --cflags --libs vipl` gives both.
 *
 * Where the specification leaves a choice to the provider, uvia's choice is
 * written next to the definition it concerns (look for "uvia:").
 */
#ifndef UVIA_VIPL_H
#define UVIA_VIPL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parameter direction markers, as the specification writes its prototypes. */
#ifndef IN
#define IN
#endif
#ifndef OUT
#define OUT
#endif

/* ---- Basic types -------------------------------------------------------- */

typedef void *VIP_PVOID;
typedef int VIP_BOOLEAN;
typedef char VIP_CHAR;
typedef unsigned char VIP_UCHAR;
typedef unsigned short VIP_USHORT;
typedef unsigned long VIP_ULONG;
typedef uint64_t VIP_UINT64;
typedef uint32_t VIP_UINT32;
typedef uint16_t VIP_UINT16;
typedef uint8_t VIP_UINT8;

#define VIP_TRUE (1)
#define VIP_FALSE (0)

/* Timeouts are in milliseconds; VIP_INFINITE waits forever.
 * uvia: 0xFFFFFFFF (the 32-bit value older programs pass) also means forever. */
#define VIP_INFINITE ((VIP_ULONG) ~0UL)

/* Quality of service: reserved by the specification; pass NULL. */
typedef VIP_PVOID VIP_QOS;

/* Opaque handles. */
typedef VIP_PVOID VIP_NIC_HANDLE;
typedef VIP_PVOID VIP_VI_HANDLE;
typedef VIP_PVOID VIP_PROTECTION_HANDLE;
typedef VIP_PVOID VIP_CONN_HANDLE;
typedef VIP_PVOID VIP_CQ_HANDLE;

/* A registered region's handle, as the NIC sees it. */
typedef VIP_UINT32 VIP_MEM_HANDLE;

/* ---- Return codes ------------------------------------------------------- */

typedef enum {
    VIP_SUCCESS = 0,
    VIP_NOT_DONE,
    VIP_INVALID_PARAMETER,
    VIP_ERROR_RESOURCE,
    VIP_TIMEOUT,
    VIP_REJECT,
    VIP_INVALID_RELIABILITY_LEVEL,
    VIP_INVALID_MTU,
    VIP_INVALID_QOS,
    VIP_INVALID_PTAG,
    VIP_INVALID_RDMAREAD,
    VIP_DESCRIPTOR_ERROR,
    VIP_INVALID_STATE,
    VIP_ERROR_NAMESERVICE,
    VIP_NO_MATCH,
    VIP_NOT_REACHABLE,
    VIP_ERROR_NOT_SUPPORTED
} VIP_RETURN;

/* ---- Network addresses -------------------------------------------------- */

/*
 * A VI endpoint's address: a host address (which NIC) and a discriminator
 * (which service on it), stored back to back in HostAddress[]: the host
 * address's HostAddressLen bytes, then DiscriminatorLen discriminator bytes.
 * Allocate sizeof(VIP_NET_ADDRESS) + NicAddressLen + discriminator length.
 *
 * uvia: a host address is binary and of M-VIA's size, the NIC's
 * NicAddressLen bytes: 6 for udp over IPv4 (the address's 4 bytes, then the
 * port's 2, network order), 18 for udp over IPv6 (16 + 2), 6 for xdp (the
 * interface's MAC), 6 for shm (the instance name, at most 6 characters,
 * NUL-padded). Another length is VIP_INVALID_PARAMETER. Text appears only
 * for display (VipNSGetHostByAddr, stderr). Discriminators are at most 32
 * bytes.
 */
typedef struct {
    VIP_UINT16 HostAddressLen;
    VIP_UINT16 DiscriminatorLen;
    VIP_UINT8 HostAddress[1];
} VIP_NET_ADDRESS;

/* uvia: the longest host address of any NIC (an IPv6 udp address). */
#define VIPL_HOST_ADDRESS_LEN 18

/* ---- Reliability levels (bit values) ------------------------------------ */

typedef VIP_USHORT VIP_RELIABILITY_LEVEL;

#define VIP_SERVICE_UNRELIABLE 0x01
#define VIP_SERVICE_RELIABLE_DELIVERY 0x02
#define VIP_SERVICE_RELIABLE_RECEPTION 0x04

/* ---- NIC attributes ----------------------------------------------------- */

typedef struct {
    VIP_CHAR Name[64];
    VIP_ULONG HardwareVersion;
    VIP_ULONG ProviderVersion;
    VIP_UINT16 NicAddressLen;
    const VIP_UINT8 *LocalNicAddress;
    VIP_BOOLEAN ThreadSafe;
    VIP_UINT16 MaxDiscriminatorLen;
    VIP_ULONG MaxRegisterBytes;
    VIP_ULONG MaxRegisterRegions;
    VIP_ULONG MaxRegisterBlockBytes;
    VIP_ULONG MaxVI;
    VIP_ULONG MaxDescriptorsPerQueue;
    VIP_ULONG MaxSegmentsPerDesc;
    VIP_ULONG MaxCQ;
    VIP_ULONG MaxCQEntries;
    VIP_ULONG MaxTransferSize;
    VIP_ULONG NativeMTU;
    VIP_ULONG MaxPtags;
    /* Bitwise OR of the VIP_SERVICE_* levels the NIC offers. */
    VIP_RELIABILITY_LEVEL ReliabilityLevelSupport;
    /* Levels at which RDMA read is offered (0: none). */
    VIP_RELIABILITY_LEVEL RDMAReadSupport;
} VIP_NIC_ATTRIBUTES;

/* ---- Descriptors -------------------------------------------------------- */

#define VIP_DESCRIPTOR_ALIGNMENT 64

/* A 64-bit address field, whatever the size of a pointer. */
typedef union {
    VIP_UINT64 AddressBits;
    VIP_PVOID Address;
} VIP_PVOID64;

/* The control segment (32 bytes). */
typedef struct {
    VIP_PVOID64 Next;           /* for the program's own lists */
    VIP_MEM_HANDLE NextHandle;
    VIP_UINT16 SegCount;        /* segments that follow, address segment included */
    VIP_UINT16 Control;         /* VIP_CONTROL_* */
    VIP_UINT32 Reserved;
    VIP_UINT32 ImmediateData;
    VIP_UINT32 Length;          /* bytes received, written on completion */
    VIP_UINT32 Status;          /* VIP_STATUS_*, written on completion */
} VIP_CONTROL_SEGMENT;

/* The address segment of an RDMA descriptor: the peer's memory (16 bytes). */
typedef struct {
    VIP_PVOID64 Data;
    VIP_MEM_HANDLE Handle;
    VIP_UINT32 Reserved;
} VIP_ADDRESS_SEGMENT;

/* A local data segment (16 bytes). */
typedef struct {
    VIP_PVOID64 Data;
    VIP_MEM_HANDLE Handle;
    VIP_UINT32 Length;
} VIP_DATA_SEGMENT;

typedef union {
    VIP_ADDRESS_SEGMENT Remote;
    VIP_DATA_SEGMENT Local;
} VIP_DESCRIPTOR_SEGMENT;

/*
 * A descriptor: the control segment, then SegCount segments. For an RDMA
 * write or read the first segment is the address segment. A descriptor
 * with more than two segments is allocated with room for them; it must lie
 * in registered memory, 64-byte aligned, and stay untouched while posted.
 */
typedef struct VIP_DESCRIPTOR {
    VIP_CONTROL_SEGMENT CS;
    VIP_DESCRIPTOR_SEGMENT DS[2];
}
#if defined(__GNUC__)
__attribute__((aligned(VIP_DESCRIPTOR_ALIGNMENT)))
#endif
VIP_DESCRIPTOR;

/* Control field. */
#define VIP_CONTROL_OP_SENDRECV 0x0000
#define VIP_CONTROL_OP_RDMAWRITE 0x0001
#define VIP_CONTROL_OP_RDMAREAD 0x0002
#define VIP_CONTROL_OP_RESERVED 0x0003
#define VIP_CONTROL_OP_MASK 0x0003
#define VIP_CONTROL_IMMEDIATE 0x0004
#define VIP_CONTROL_QFENCE 0x0008
#define VIP_CONTROL_RESERVED 0xFFF0

/* Status field. */
#define VIP_STATUS_DONE 0x00000001
#define VIP_STATUS_FORMAT_ERROR 0x00000002
#define VIP_STATUS_PROTECTION_ERROR 0x00000004
#define VIP_STATUS_LENGTH_ERROR 0x00000008
#define VIP_STATUS_PARTIAL_ERROR 0x00000010
#define VIP_STATUS_DESC_FLUSHED_ERROR 0x00000020
#define VIP_STATUS_TRANSPORT_ERROR 0x00000040
#define VIP_STATUS_RDMA_PROT_ERROR 0x00000080
#define VIP_STATUS_REMOTE_DESC_ERROR 0x00000100
#define VIP_STATUS_ERROR_MASK 0x000001FE
#define VIP_STATUS_OP_SEND 0x00000000
#define VIP_STATUS_OP_RECEIVE 0x00010000
#define VIP_STATUS_OP_RDMA_WRITE 0x00020000
#define VIP_STATUS_OP_REMOTE_RDMA_WRITE 0x00030000
#define VIP_STATUS_OP_RDMA_READ 0x00040000
#define VIP_STATUS_OP_MASK 0x00070000
#define VIP_STATUS_IMMEDIATE 0x00080000
#define VIP_STATUS_RESERVED 0xFFF0FE00

/* ---- VIs, memory --------------------------------------------------------- */

typedef enum {
    VIP_STATE_IDLE,
    VIP_STATE_CONNECTED,
    VIP_STATE_CONNECT_PENDING,
    VIP_STATE_ERROR
} VIP_VI_STATE;

typedef struct {
    VIP_RELIABILITY_LEVEL ReliabilityLevel; /* one VIP_SERVICE_* value */
    VIP_ULONG MaxTransferSize;
    VIP_QOS QoS;
    VIP_PROTECTION_HANDLE Ptag;
    VIP_BOOLEAN EnableRdmaWrite;
    VIP_BOOLEAN EnableRdmaRead;
} VIP_VI_ATTRIBUTES;

typedef struct {
    VIP_PROTECTION_HANDLE Ptag;
    VIP_BOOLEAN EnableRdmaWrite;
    VIP_BOOLEAN EnableRdmaRead;
} VIP_MEM_ATTRIBUTES;

/* ---- Asynchronous errors ------------------------------------------------- */

typedef enum {
    VIP_ERROR_POST_DESC,
    VIP_ERROR_CONN_LOST,
    VIP_ERROR_RECVQ_EMPTY,
    VIP_ERROR_VI_OVERRUN,
    VIP_ERROR_RDMAW_PROT,
    VIP_ERROR_RDMAW_DATA,
    VIP_ERROR_RDMAW_ABORT,
    VIP_ERROR_RDMAR_PROT,
    VIP_ERROR_COMP_PROT,
    VIP_ERROR_RDMA_TRANSPORT,
    VIP_ERROR_CATASTROPHIC
} VIP_ERROR_CODE;

typedef enum {
    VIP_RESOURCE_NIC,
    VIP_RESOURCE_VI,
    VIP_RESOURCE_CQ,
    VIP_RESOURCE_DESCRIPTOR
} VIP_RESOURCE_CODE;

typedef struct {
    VIP_NIC_HANDLE NicHandle;
    VIP_VI_HANDLE ViHandle;
    VIP_CQ_HANDLE CQHandle;
    VIP_DESCRIPTOR *DescriptorPtr;
    VIP_ULONG OpCode;           /* VIP_CONTROL_OP_* of the descriptor, if any */
    VIP_RESOURCE_CODE ResourceCode;
    VIP_ERROR_CODE ErrorCode;
} VIP_ERROR_DESCRIPTOR;

/* ---- System management --------------------------------------------------- */

#define VIP_SMI_AUTODISCOVERY ((VIP_ULONG)1)

/*
 * uvia: for VIP_SMI_AUTODISCOVERY, the caller sets NumAdAddrs to the number
 * of entries of ADAddrArray, each pointing at room for a VIP_NET_ADDRESS of
 * NicAddressLen host bytes; the call fills them with the hosts of the name
 * service file that this NIC's provider can reach, and sets NumAdAddrs to
 * how many it filled.
 */
typedef struct {
    VIP_ULONG NumberOfHops;
    VIP_NET_ADDRESS **ADAddrArray;
    VIP_ULONG NumAdAddrs;
} VIP_AUTODISCOVERY_LIST;

/* ---- Callbacks ------------------------------------------------------------
 * Notify handlers and the error handler run on a thread of the library, as
 * the specification says, never inside the program's own calls. A notify
 * request is for one completion: the handler receives the descriptor taken
 * from the queue (or, for a CQ, the VI and queue), once. */

typedef void (*VIP_VI_NOTIFY_HANDLER)(IN VIP_PVOID Context, IN VIP_NIC_HANDLE NicHandle,
                                      IN VIP_VI_HANDLE ViHandle,
                                      IN VIP_DESCRIPTOR *DescriptorPtr);
typedef void (*VIP_CQ_NOTIFY_HANDLER)(IN VIP_PVOID Context, IN VIP_NIC_HANDLE NicHandle,
                                      IN VIP_VI_HANDLE ViHandle, IN VIP_BOOLEAN RecvQueue);
typedef void (*VIP_ERROR_HANDLER)(IN VIP_PVOID Context, IN VIP_ERROR_DESCRIPTOR *ErrorDesc);

/* ---- NIC ------------------------------------------------------------------
 * uvia: DeviceName is a uvia provider name ("shm", "shm:<instance>", "udp",
 * "udp:<ip>[:<port>]", "xdp:<interface>") or a device name mapped to one by
 * the VIPL_DEVICES environment variable ("/dev/via_eth0=udp:10.0.0.1;...")
 * or the file named by VIPL_CONF (default /etc/vipl.conf; lines
 * "<device> <provider name>"). Without a mapping, /dev/via_lo opens "shm"
 * and /dev/via_ethN opens "udp". A NULL name is VIP_INVALID_PARAMETER. */

VIP_RETURN VipOpenNic(IN const VIP_CHAR *DeviceName, OUT VIP_NIC_HANDLE *NicHandle);
VIP_RETURN VipCloseNic(IN VIP_NIC_HANDLE NicHandle);
VIP_RETURN VipQueryNic(IN VIP_NIC_HANDLE NicHandle, OUT VIP_NIC_ATTRIBUTES *NicAttribs);
VIP_RETURN VipQuerySystemManagementInfo(IN VIP_NIC_HANDLE NicHandle, IN VIP_ULONG InfoType,
                                        OUT VIP_PVOID SysManInfo);
VIP_RETURN VipErrorCallback(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID Context,
                            IN VIP_ERROR_HANDLER Handler);

/* ---- Protection tags ------------------------------------------------------ */

VIP_RETURN VipCreatePtag(IN VIP_NIC_HANDLE NicHandle, OUT VIP_PROTECTION_HANDLE *Ptag);
VIP_RETURN VipDestroyPtag(IN VIP_NIC_HANDLE NicHandle, IN VIP_PROTECTION_HANDLE Ptag);

/* ---- Memory registration -------------------------------------------------- */

VIP_RETURN VipRegisterMem(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID VirtualAddress,
                          IN VIP_ULONG Length, IN VIP_MEM_ATTRIBUTES *MemAttribs,
                          OUT VIP_MEM_HANDLE *MemoryHandle);
VIP_RETURN VipDeregisterMem(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID VirtualAddress,
                            IN VIP_MEM_HANDLE MemoryHandle);
VIP_RETURN VipQueryMem(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID Address,
                       IN VIP_MEM_HANDLE MemHandle, OUT VIP_MEM_ATTRIBUTES *MemAttribs);
VIP_RETURN VipSetMemAttributes(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID Address,
                               IN VIP_MEM_HANDLE MemHandle, IN VIP_MEM_ATTRIBUTES *MemAttribs);

/* ---- VIs -------------------------------------------------------------------
 * uvia: each queue of a VI holds up to MaxDescriptorsPerQueue descriptors.
 * VipSendWait and VipRecvWait poll for VIPL_WAIT_SPIN_US microseconds (an
 * environment variable, default 20) before they sleep. */

VIP_RETURN VipCreateVi(IN VIP_NIC_HANDLE NicHandle, IN VIP_VI_ATTRIBUTES *ViAttribs,
                       IN VIP_CQ_HANDLE SendCQHandle, IN VIP_CQ_HANDLE RecvCQHandle,
                       OUT VIP_VI_HANDLE *ViHandle);
VIP_RETURN VipDestroyVi(IN VIP_VI_HANDLE ViHandle);
VIP_RETURN VipQueryVi(IN VIP_VI_HANDLE ViHandle, OUT VIP_VI_STATE *State,
                      OUT VIP_VI_ATTRIBUTES *ViAttribs, OUT VIP_BOOLEAN *ViSendQEmpty,
                      OUT VIP_BOOLEAN *ViRecvQEmpty);
VIP_RETURN VipSetViAttributes(IN VIP_VI_HANDLE ViHandle, IN VIP_VI_ATTRIBUTES *ViAttribs);

/* ---- Data transfer ---------------------------------------------------------
 * MemoryHandle names the registered region that holds the descriptor.
 * uvia: a descriptor that cannot be carried out (bad segment count or
 * operation, memory not registered with the VI's tag, too long) is not
 * queued: the post returns VIP_DESCRIPTOR_ERROR with the reason's
 * VIP_STATUS_* bits (and VIP_STATUS_DONE) written into CS.Status. A post on
 * a VI that is not connected (sends) or in the Error state returns
 * VIP_INVALID_STATE; a full queue VIP_ERROR_RESOURCE. Done and Wait hand
 * descriptors back in the order they were posted. */

VIP_RETURN VipPostSend(IN VIP_VI_HANDLE ViHandle, IN VIP_DESCRIPTOR *DescriptorPtr,
                       IN VIP_MEM_HANDLE MemoryHandle);
VIP_RETURN VipSendDone(IN VIP_VI_HANDLE ViHandle, OUT VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipSendWait(IN VIP_VI_HANDLE ViHandle, IN VIP_ULONG Timeout,
                       OUT VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipSendNotify(IN VIP_VI_HANDLE ViHandle, IN VIP_PVOID Context,
                         IN VIP_VI_NOTIFY_HANDLER Handler);
VIP_RETURN VipPostRecv(IN VIP_VI_HANDLE ViHandle, IN VIP_DESCRIPTOR *DescriptorPtr,
                       IN VIP_MEM_HANDLE MemoryHandle);
VIP_RETURN VipRecvDone(IN VIP_VI_HANDLE ViHandle, OUT VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipRecvWait(IN VIP_VI_HANDLE ViHandle, IN VIP_ULONG Timeout,
                       OUT VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipRecvNotify(IN VIP_VI_HANDLE ViHandle, IN VIP_PVOID Context,
                         IN VIP_VI_NOTIFY_HANDLER Handler);

/* ---- Completion queues -----------------------------------------------------
 * A CQ names the VI and queue that completed; take the descriptor with that
 * queue's Done call. A queue bound to a CQ cannot be waited on directly
 * (VipSendWait/VipRecvWait return VIP_INVALID_STATE). */

VIP_RETURN VipCreateCQ(IN VIP_NIC_HANDLE NicHandle, IN VIP_ULONG EntryCount,
                       OUT VIP_CQ_HANDLE *CQHandle);
VIP_RETURN VipDestroyCQ(IN VIP_CQ_HANDLE CQHandle);
VIP_RETURN VipResizeCQ(IN VIP_CQ_HANDLE CQHandle, IN VIP_ULONG EntryCount);
VIP_RETURN VipCQDone(IN VIP_CQ_HANDLE CQHandle, OUT VIP_VI_HANDLE *ViHandle,
                     OUT VIP_BOOLEAN *RecvQueue);
VIP_RETURN VipCQWait(IN VIP_CQ_HANDLE CQHandle, IN VIP_ULONG Timeout,
                     OUT VIP_VI_HANDLE *ViHandle, OUT VIP_BOOLEAN *RecvQueue);
VIP_RETURN VipCQNotify(IN VIP_CQ_HANDLE CQHandle, IN VIP_PVOID Context,
                       IN VIP_CQ_NOTIFY_HANDLER Handler);

/* ---- Connection management: client/server ----------------------------------
 * uvia: VipConnectWait writes the client's address into RemoteAddr: the
 * NIC's NicAddressLen host bytes, then the discriminator, which has the
 * length of LocalAddr's. */

VIP_RETURN VipConnectWait(IN VIP_NIC_HANDLE NicHandle, IN VIP_NET_ADDRESS *LocalAddr,
                          IN VIP_ULONG Timeout, OUT VIP_NET_ADDRESS *RemoteAddr,
                          OUT VIP_VI_ATTRIBUTES *RemoteViAttribs,
                          OUT VIP_CONN_HANDLE *ConnHandle);
VIP_RETURN VipConnectAccept(IN VIP_CONN_HANDLE ConnHandle, IN VIP_VI_HANDLE ViHandle);
VIP_RETURN VipConnectReject(IN VIP_CONN_HANDLE ConnHandle);
VIP_RETURN VipConnectRequest(IN VIP_VI_HANDLE ViHandle, IN VIP_NET_ADDRESS *LocalAddr,
                             IN VIP_NET_ADDRESS *RemoteAddr, IN VIP_ULONG Timeout,
                             OUT VIP_VI_ATTRIBUTES *RemoteViAttribs);
VIP_RETURN VipDisconnect(IN VIP_VI_HANDLE ViHandle);

/* ---- Connection management: peer to peer -----------------------------------
 * Both sides call VipConnectPeerRequest with their own and the other's
 * address; the call returns at once and the connection completes in the
 * background. uvia: offered by the network providers (udp, xdp); on shm it
 * returns VIP_ERROR_NOT_SUPPORTED. */

VIP_RETURN VipConnectPeerRequest(IN VIP_VI_HANDLE ViHandle, IN VIP_NET_ADDRESS *LocalAddr,
                                 IN VIP_NET_ADDRESS *RemoteAddr, IN VIP_ULONG Timeout);
VIP_RETURN VipConnectPeerDone(IN VIP_VI_HANDLE ViHandle, OUT VIP_VI_ATTRIBUTES *RemoteViAttribs);
VIP_RETURN VipConnectPeerWait(IN VIP_VI_HANDLE ViHandle, OUT VIP_VI_ATTRIBUTES *RemoteViAttribs);

/* ---- Name service ------------------------------------------------------------
 * uvia: names come from a hosts file: NSInitInfo, if not NULL, is its path
 * (a C string); otherwise the VIPL_HOSTS environment variable, else
 * /etc/vipl_hosts. Lines are "<name> <provider> <address>", for example
 * "node1 udp 10.0.0.1:7000" or "local shm 0"; '#' starts a comment. A name
 * that is itself an address of the NIC's provider resolves to itself ("ip:port"
 * on udp, the NIC's own instance on shm), as do "localhost" and this host's
 * name on shm. Names the file lacks go to the system's resolver (/etc/hosts,
 * DNS) on udp (the IP at port 7100 or VIPL_PORT; "localhost" is this host)
 * and xdp (the MAC the neighbour table holds for the name's IPv4 address).
 * VipNSGetHostByName writes HostAddressLen and the host address bytes (the
 * binary form above) and leaves the discriminator to the caller.
 * VipNSGetHostByAddr answers from the file, then from the resolver (udp
 * addresses at the default port; xdp MACs the neighbour table knows). */

VIP_RETURN VipNSInit(IN VIP_NIC_HANDLE NicHandle, IN VIP_PVOID NSInitInfo);
VIP_RETURN VipNSGetHostByName(IN VIP_NIC_HANDLE NicHandle, IN VIP_CHAR *Name,
                              OUT VIP_NET_ADDRESS *Address, IN VIP_ULONG NameIndex);
VIP_RETURN VipNSGetHostByAddr(IN VIP_NIC_HANDLE NicHandle, IN VIP_NET_ADDRESS *Address,
                              OUT VIP_CHAR *Name, IN OUT VIP_ULONG *NameLen);
VIP_RETURN VipNSShutdown(IN VIP_NIC_HANDLE NicHandle);

#ifdef __cplusplus
}
#endif

#endif /* UVIA_VIPL_H */
