/* What an MPI library's tagged messages cost through a reliable-datagram
 * provider, without the cores: one thread drives two FI_EP_RDM endpoints
 * of one domain, as MPI asks for them (FI_TAGGED | FI_MSG, manual
 * progress, FI_THREAD_DOMAIN), through 8-byte tagged ping-pongs. Each
 * way posts a tagged receive, injects the message and reads the
 * receiver's CQ until the receive completes; each message carries its
 * round number, checked at the receiver.
 *
 * Run it once with few rounds and once with many under callgrind: the
 * difference over the extra rounds is the instructions of a round trip,
 * by library (the provider, the utility provider above it, libc). Run
 * plainly, it prints the time a round trip takes with both endpoints on
 * one core.
 *
 *     cc -std=c11 -O2 -g rdm_cost.c -lfabric -o rdm_cost
 *     FI_PROVIDER_PATH=DIR FI_UVIA_DOMAIN=shm ./rdm_cost 'uvia;ofi_rxm' 100000
 *     ./rdm_cost shm 100000
 */
#define _POSIX_C_SOURCE 200809L
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Round trips before the clock starts. */
#define WARMUP 1000
/* Empty CQ reads a message may take before the run gives up. */
#define PATIENCE 100000000L

static void fail(const char *what, long r) {
	fprintf(stderr, "rdm_cost: %s: %s (%ld)\n", what, fi_strerror((int)-r), r);
	exit(1);
}

#define CHECK(call) do { long r_ = (long)(call); if (r_) fail(#call, r_); } while (0)

struct side {
	struct fid_ep *ep;
	struct fid_cq *cq;
	fi_addr_t peer;
	char name[256];
	size_t namelen;
	uint64_t buf;
};

static struct fid_domain *domain;
static struct fid_av *av;
static struct fi_info *info;

static void open_side(struct side *s) {
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED, .size = 128 };
	CHECK(fi_endpoint(domain, info, &s->ep, NULL));
	CHECK(fi_cq_open(domain, &ca, &s->cq, NULL));
	CHECK(fi_ep_bind(s->ep, &av->fid, 0));
	CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_enable(s->ep));
	s->namelen = sizeof s->name;
	CHECK(fi_getname(&s->ep->fid, s->name, &s->namelen));
}

/* One read of `s`'s CQ: 1 for the receive's completion, 0 for nothing
 * or a send's. */
static int read_one(struct side *s) {
	struct fi_cq_tagged_entry e;
	ssize_t n = fi_cq_read(s->cq, &e, 1);
	if (n == -FI_EAGAIN || n == 0)
		return 0;
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry err = { 0 };
		fi_cq_readerr(s->cq, &err, 0);
		fail("a completion with an error", -err.err);
	}
	if (n < 0)
		fail("fi_cq_read", n);
	return (e.flags & FI_RECV) != 0;
}

static void one_way(struct side *from, struct side *to, uint64_t round, uint64_t tag) {
	ssize_t r;
	to->buf = ~round;
	CHECK(fi_trecv(to->ep, &to->buf, sizeof to->buf, NULL, to->peer, tag, 0, NULL));
	from->buf = round;
	long waited = 0;
	/* Both sides' progress while the provider has no room (the
	 * connection's first message sets it up). */
	while ((r = fi_tinject(from->ep, &from->buf, sizeof from->buf, from->peer, tag)) == -FI_EAGAIN) {
		read_one(from);
		if (read_one(to))
			fail("a receive completed before its message was sent", 0);
		if (++waited > PATIENCE)
			fail("fi_tinject found no room", r);
	}
	if (r)
		fail("fi_tinject", r);
	/* The receiver's reads, and the sender's (its connection may need
	 * them while the message goes). */
	for (waited = 0; !read_one(to); waited++) {
		read_one(from);
		if (waited > PATIENCE)
			fail("no message came", -FI_ETIMEDOUT);
	}
	if (to->buf != round) {
		fprintf(stderr, "rdm_cost: round %" PRIu64 " received %" PRIu64 "\n", round, to->buf);
		exit(1);
	}
}

int main(int argc, char **argv) {
	char *end = NULL;
	long rounds = argc == 3 ? strtol(argv[2], &end, 10) : 0;
	if (argc != 3 || !end || *end || rounds < 1) {
		fprintf(stderr, "usage: rdm_cost PROVIDER ROUNDS (ROUNDS >= 1)\n");
		return 2;
	}
	/* The last guard against a hang: far more than a run needs, even
	 * under callgrind (a round trip there takes some 50 us). */
	alarm(60 + (unsigned)(rounds / 1000 < 86400 ? rounds / 1000 : 86400));
	struct fi_info *hints = fi_allocinfo();
	if (!hints)
		fail("fi_allocinfo", -FI_ENOMEM);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_TAGGED | FI_MSG;
	hints->mode = FI_CONTEXT;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
	hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup(argv[1]);
	int r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints, &info);
	if (r)
		fail("fi_getinfo (is the provider on FI_PROVIDER_PATH?)", r);
	struct fid_fabric *fabric;
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	struct fi_av_attr aa = { .type = FI_AV_MAP };
	CHECK(fi_av_open(domain, &aa, &av, NULL));
	struct side a = { 0 }, b = { 0 };
	open_side(&a);
	open_side(&b);
	if (fi_av_insert(av, b.name, 1, &a.peer, 0, NULL) != 1 ||
	    fi_av_insert(av, a.name, 1, &b.peer, 0, NULL) != 1)
		fail("fi_av_insert", -FI_EINVAL);
	struct timespec t0 = { 0 }, t1;
	for (long i = 0; i < WARMUP + rounds; i++) {
		if (i == WARMUP)
			clock_gettime(CLOCK_MONOTONIC, &t0);
		one_way(&a, &b, (uint64_t)i, 7);
		one_way(&b, &a, (uint64_t)i, 9);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
	printf("%s: %ld round trips, %.1f ns a round trip\n", info->fabric_attr->prov_name,
	       rounds, ns / (double)rounds);
	CHECK(fi_close(&a.ep->fid));
	CHECK(fi_close(&b.ep->fid));
	CHECK(fi_close(&a.cq->fid));
	CHECK(fi_close(&b.cq->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&domain->fid));
	CHECK(fi_close(&fabric->fid));
	fi_freeinfo(info);
	fi_freeinfo(hints);
	return 0;
}
