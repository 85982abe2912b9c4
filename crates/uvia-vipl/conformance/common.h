/*
 * Helpers the areas share: a side of a test (a NIC, a tag and a registered
 * arena for descriptors and buffers), descriptors, addresses, connections
 * between a test and its peer.
 */
#ifndef CONFORMANCE_COMMON_H
#define CONFORMANCE_COMMON_H

#include "harness.h"

/* Message tags between a test and its peer. */
enum {
    T_ADDR = 1, /* the sender's NIC address (hex text, HOST_TEXT) */
    T_READY,    /* set up; go on */
    T_GO,       /* do the next step */
    T_DONE,     /* finished the step */
    T_INFO,     /* data: a struct the test defines */
    T_QUIT,     /* stop */
    T_END,      /* end the current part */
    T_CHECK,    /* check something; data: a struct the test defines */
};

#define ARENA_LEN (4u << 20)

/* The suite carries a host address as the hex text of its bytes
 * ("7f0000011bbc" for 127.0.0.1 port 7100): strcmp compares two, printf
 * shows one, a channel carries one. HOST_TEXT is the room for one. */
#define HOST_TEXT (2 * VIPL_HOST_ADDRESS_LEN + 1)
/* Writes n host bytes as hex text. */
void host_hex(const void *bytes, size_t n, char out[HOST_TEXT]);
/* The bytes of hex text; returns how many (0 for text that is no hex). */
size_t host_unhex(const char *hex, unsigned char out[VIPL_HOST_ADDRESS_LEN]);
/* The hex text of the host address that `text`, written as g_provider
 * writes its addresses ("127.0.0.1:7001", "[::1]:7001",
 * "02:00:00:00:00:0a", an shm instance), has in vipl.h's binary form: the
 * suite's own reading of that form, to check the library's. Ends the test
 * if the text is none. */
void host_expect(const char *text, char out[HOST_TEXT]);
/* The same, as `provider` ("shm", "udp", "xdp") writes its addresses. */
void host_expect_as(const char *provider, const char *text, char out[HOST_TEXT]);
/* The text form of a host address given as hex (the reverse of
 * host_expect), for a hosts file. */
void host_display(const char *hex, char *out, size_t n);
/* An shm instance name of this process's own, at most 6 characters: the
 * letter, then the pid in base 36. */
void short_instance(char letter, char out[8]);

struct side {
    VIP_NIC_HANDLE nic;
    VIP_NIC_ATTRIBUTES attrs;
    char address[HOST_TEXT]; /* LocalNicAddress as hex text */
    VIP_PROTECTION_HANDLE ptag;
    /* Registered with ptag, RDMA disabled: descriptors and buffers. */
    char *arena;
    size_t arena_len, used;
    VIP_MEM_HANDLE mh;
    /* What side_close takes down (VIs and CQs made by vi_new and the pair
     * helpers, regions by region_new). */
    VIP_VI_HANDLE vis[16];
    VIP_CQ_HANDLE cqs[8];
    struct {
        void *addr;
        VIP_MEM_HANDLE mh;
    } regions[16];
    int nvis, ncqs, nregions;
};

/* Opens `device` (the device under test if NULL), creates a tag and
 * registers an arena; ends the test if any of it fails. */
void side_open(struct side *s, const char *device);
/* The peer's side: opens g_peer_device. */
void side_open_peer(struct side *s);
/* Disconnects and destroys what the side made, then closes the NIC
 * (best effort: a listener of the library goes with its NIC). */
void side_close(struct side *s);

/* 64-byte aligned, zeroed bytes of the arena. */
void *arena_take(struct side *s, size_t n);

/* Memory of its own, registered with the given tag and RDMA bits. */
void *region_new(struct side *s, size_t n, VIP_PROTECTION_HANDLE ptag, int rdma_write,
                 int rdma_read, VIP_MEM_HANDLE *mh);

/* The i-th segment of a descriptor (the address segment is 0 for RDMA). */
VIP_DESCRIPTOR_SEGMENT *desc_seg(VIP_DESCRIPTOR *d, int i);
/* A zeroed descriptor with room for nseg segments, in the arena. */
VIP_DESCRIPTOR *desc_new(struct side *s, int nseg);
void set_local(VIP_DESCRIPTOR *d, int i, void *addr, VIP_MEM_HANDLE h, uint32_t len);
void set_remote(VIP_DESCRIPTOR *d, int i, uint64_t addr, VIP_MEM_HANDLE h);
/* A one-segment send of a fresh arena buffer of len bytes filled from
 * data (or a pattern seeded by `seed` when data is NULL). */
VIP_DESCRIPTOR *send_desc(struct side *s, const void *data, uint32_t len, unsigned seed);
/* A one-segment receive of a fresh zeroed arena buffer of len bytes. */
VIP_DESCRIPTOR *recv_desc(struct side *s, uint32_t len);
/* The buffer of a descriptor's i-th segment. */
void *seg_buf(VIP_DESCRIPTOR *d, int i);
void fill_pattern(void *buf, size_t n, unsigned seed);
/* Index of the first byte that differs from the pattern, or -1. */
long check_pattern(const void *buf, size_t n, unsigned seed);

/* A VI's attributes as the suite creates them: one level, no RDMA,
 * MaxTransferSize min(NIC's, 1 MiB). */
VIP_VI_ATTRIBUTES vi_attrs(struct side *s, VIP_RELIABILITY_LEVEL level);
/* Creates a VI with those attributes and the RDMA bits; ends the test if
 * that fails. */
VIP_VI_HANDLE vi_new(struct side *s, VIP_RELIABILITY_LEVEL level, int rdma_write,
                     int rdma_read, VIP_CQ_HANDLE scq, VIP_CQ_HANDLE rcq);

/* VipDestroyVi, and side_close forgets the VI when it went. */
VIP_RETURN vi_destroy(struct side *s, VIP_VI_HANDLE vi);

/* A VIP_NET_ADDRESS (malloc'd): the bytes of the host's hex text, then
 * the discriminator's bytes. */
VIP_NET_ADDRESS *addr_new(const char *host, const char *disc);
VIP_NET_ADDRESS *addr_raw(const void *host, size_t hostlen, const void *disc, size_t disclen);
/* Room for an address the library writes. */
VIP_NET_ADDRESS *addr_room(void);
/* A discriminator unique to this run and call: "v<pid>.<n>". */
void disc_new(char out[33]);

/* The server's half of a connection: wait on disc, accept with vi. */
void srv_accept(struct side *s, VIP_VI_HANDLE vi, const char *disc, int ms);
/* The client's half: connect vi to disc at host. */
void cli_connect(struct side *s, VIP_VI_HANDLE vi, const char *host, const char *disc, int ms);
/* Sends this side's NIC address to the other process; receives it. */
void send_addr(struct chan *c, struct side *s);
void recv_addr(struct chan *c, char host[HOST_TEXT]);

/* The next completed descriptor of a queue within ms; checks SUCCESS and
 * returns NULL on anything else. */
#define RECV_WAIT(vi, ms) wait_one(__FILE__, __LINE__, (vi), (ms), 1)
#define SEND_WAIT(vi, ms) wait_one(__FILE__, __LINE__, (vi), (ms), 0)
VIP_DESCRIPTOR *wait_one(const char *file, int line, VIP_VI_HANDLE vi, int ms, int recv);

/* Drives the VI's progress for ms through VipSendDone on its (empty) send
 * queue, for a provider that moves only inside the program's calls. */
void pump(VIP_VI_HANDLE vi, int ms);
/* chan_recv that pumps the VI while it waits. */
int chan_recv_pump(struct chan *c, VIP_VI_HANDLE vi, int ms, void *buf, size_t max);
/* The VI's state (VIP_VI_STATE), or -1 if VipQueryVi failed. */
int vi_state(VIP_VI_HANDLE vi);
/* Polls the state until it is `want` or ms pass, pumping the VI if `drive`;
 * returns the last state seen. */
int wait_state(VIP_VI_HANDLE vi, VIP_VI_STATE want, int ms, int drive);

/* The levels the NIC claims, in order; returns how many. */
int claimed_levels(VIP_RELIABILITY_LEVEL out[3]);
const char *level_name(VIP_RELIABILITY_LEVEL l);
/* Skips the test unless the NIC claims level l. */
void require_level(VIP_RELIABILITY_LEVEL l);
/* A reliable level the NIC claims (0 if none). */
VIP_RELIABILITY_LEVEL any_reliable_level(void);
/* Reliable delivery if claimed, else the first level claimed. */
VIP_RELIABILITY_LEVEL default_level(void);
int is_network(void);

/* What the library writes to stderr between capture_start and capture_end
 * (capture_read takes what came so far), in buf. */
struct capture {
    int saved, rd, wr;
    char buf[8192];
    size_t got;
};
void capture_start(struct capture *c);
void capture_read(struct capture *c);
void capture_end(struct capture *c);

/* Writes text to a new temporary file; its path goes to path. */
void write_temp(const char *text, char path[256]);


/* ---- A connected pair: the test is the client, its peer the server --------- */

struct pair_cfg;

/* One end of a connected pair. */
struct conn {
    struct side s;
    VIP_VI_HANDLE vi;
    VIP_CQ_HANDLE scq, rcq;
    /* Receives posted before the connection was made, in order. */
    VIP_DESCRIPTOR *pre[64];
    int npre;
    struct chan *c;
    const struct pair_cfg *cfg;
};

struct pair_cfg {
    VIP_RELIABILITY_LEVEL level; /* 0: default_level() */
    int rdma_write, rdma_read;   /* the VIs' enable bits, both sides */
    int srv_no_rdma;             /* but the server's VI enables no RDMA */
    VIP_ULONG mtu;               /* 0: vi_attrs()'s */
    int srv_recvs, cli_recvs;    /* receives posted before connecting */
    uint32_t recv_len;           /* their size (0: 256) */
    int srv_cq, cli_cq;          /* bind both queues to one CQ */
    VIP_ULONG cq_entries;        /* its size (0: 64) */
    /* Before the server accepts (e.g. to post receives of its own). */
    void (*prepare)(struct conn *x, void *arg);
    /* The server's part, after it accepted; then it waits for T_QUIT. */
    void (*server)(struct conn *x, void *arg);
    void *arg;
    char disc[33]; /* set by pair_open */
};

struct pair {
    struct peer p;
    struct conn x;
    struct pair_cfg cfg;
    char server_address[HOST_TEXT];
};

/* Forks the server, connects to it; ends the test if that fails. Call
 * before this process opens a NIC. */
void pair_open(struct pair *pr, const struct pair_cfg *cfg);
/* Tells the server to finish, reaps it, disconnects and closes. */
void pair_close(struct pair *pr);
/* peer_end, keeping vi moving (VipSendDone) while the peer finishes. */
void peer_end_pumping(struct peer *p, VIP_VI_HANDLE vi, int ms);
/* Posts a receive of len bytes on x's VI and records it in x->pre. */
VIP_DESCRIPTOR *conn_post_recv(struct conn *x, uint32_t len);

/* A refused descriptor's status: DONE and exactly the error bits err. */
#define CHECK_REFUSED(desc, err) check_refused(__FILE__, __LINE__, #desc, (desc), (err))
void check_refused(const char *file, int line, const char *what, const VIP_DESCRIPTOR *d, uint32_t err);

#endif
