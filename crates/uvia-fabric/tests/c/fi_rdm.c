/* The provider's own reliable-datagram endpoints (FI_EP_RDM on shm), as
 * the MPI libraries use them: three endpoints of one process on one
 * domain and AV, each with its CQ (FI_CQ_FORMAT_TAGGED), driven by one
 * thread. Each test checks what libfabric's tagged-message semantics
 * promise: matching under ignore bits in the order messages were sent,
 * directed receives, truncation, cancel, peek and claim, remote CQ data,
 * inject, messages far larger than a link's ring, and bad input refused
 * with an error. Prints one line per test; exits 1 at the first failure.
 *
 *     cc -std=c11 -O2 fi_rdm.c -lfabric -o fi_rdm
 *     FI_PROVIDER_PATH=DIR ./fi_rdm
 */
#define _POSIX_C_SOURCE 200809L
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Empty CQ reads a wait may take before the test gives up. */
#define PATIENCE 50000000L

static const char *test = "setup";

static void fail(const char *what, long r) {
	fprintf(stderr, "fi_rdm: %s: %s: %s (%ld)\n", test, what, fi_strerror((int)-r), r);
	exit(1);
}

#define CHECK(call) do { long r_ = (long)(call); if (r_) fail(#call, r_); } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "fi_rdm: %s: expected %s (line %d)\n", test, #cond, __LINE__); exit(1); } } while (0)

#define NODES 3

struct node {
	struct fid_ep *ep;
	struct fid_cq *cq;
	fi_addr_t addr;
};

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_av *av;
static struct node n[NODES];

/* One read of every CQ but `who`'s with no room for an entry: their
 * endpoints' progress (a large send's rest is written there). */
static void others(int who) {
	for (int i = 0; i < NODES; i++)
		if (i != who && n[i].ep)
			(void)fi_cq_read(n[i].cq, NULL, 0);
}

/* The next entry of node `who`'s CQ: 0, or -FI_EAVAIL with `err` filled. */
static int next(int who, struct fi_cq_tagged_entry *e, struct fi_cq_err_entry *err) {
	for (long waited = 0; waited < PATIENCE; waited++) {
		ssize_t r = fi_cq_read(n[who].cq, e, 1);
		if (r == 1)
			return 0;
		if (r == -FI_EAVAIL) {
			memset(err, 0, sizeof *err);
			EXPECT(fi_cq_readerr(n[who].cq, err, 0) == 1);
			return -FI_EAVAIL;
		}
		if (r != -FI_EAGAIN)
			fail("fi_cq_read", r);
		others(who);
	}
	fail("no completion came", -FI_ETIMEDOUT);
	return 0;
}

/* Asserts that node `who`'s CQ stays empty over many reads. */
static void quiet(int who) {
	struct fi_cq_tagged_entry e;
	for (int i = 0; i < 10000; i++) {
		ssize_t r = fi_cq_read(n[who].cq, &e, 1);
		EXPECT(r == -FI_EAGAIN);
		others(who);
	}
}

static void tsend(int from, int to, const void *buf, size_t len, uint64_t tag) {
	ssize_t r;
	for (long waited = 0; (r = fi_tsend(n[from].ep, buf, len, NULL, n[to].addr, tag, NULL)) == -FI_EAGAIN; waited++) {
		others(from);
		EXPECT(waited < PATIENCE);
	}
	if (r)
		fail("fi_tsend", r);
}

/* Waits for the send completion of node `from` (contexts are NULL). */
static void sent(int from) {
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	EXPECT(next(from, &e, &err) == 0);
	EXPECT(e.flags & FI_SEND);
}

static void tagged_matching_follows_order_and_ignore_bits(void) {
	uint64_t out[3] = { 11, 22, 33 }, in[3] = { 0, 0, 0 };
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	/* Two unexpected (tags 0x105 and 0x205), then a receive of 0x100
	 * ignoring the low byte takes the first; one posted before the
	 * third (0x300) takes it. */
	tsend(0, 1, &out[0], 8, 0x105);
	tsend(0, 1, &out[1], 8, 0x205);
	sent(0);
	sent(0);
	CHECK(fi_trecv(n[1].ep, &in[2], 8, NULL, FI_ADDR_UNSPEC, 0x300, 0, &in[2]));
	quiet(1);
	CHECK(fi_trecv(n[1].ep, &in[0], 8, NULL, FI_ADDR_UNSPEC, 0x100, 0xff, &in[0]));
	EXPECT(next(1, &e, &err) == 0);
	EXPECT(e.op_context == &in[0] && e.tag == 0x105 && e.len == 8 && in[0] == 11);
	EXPECT((e.flags & (FI_RECV | FI_TAGGED)) == (FI_RECV | FI_TAGGED));
	tsend(0, 1, &out[2], 8, 0x300);
	sent(0);
	EXPECT(next(1, &e, &err) == 0);
	EXPECT(e.op_context == &in[2] && in[2] == 33);
	CHECK(fi_trecv(n[1].ep, &in[1], 8, NULL, FI_ADDR_UNSPEC, 0, ~0ULL, &in[1]));
	EXPECT(next(1, &e, &err) == 0);
	EXPECT(e.op_context == &in[1] && e.tag == 0x205 && in[1] == 22);
}

static void directed_receives_take_only_their_source(void) {
	uint64_t a = 1, b = 2, in = 0;
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	CHECK(fi_trecv(n[2].ep, &in, 8, NULL, n[1].addr, 7, 0, &in));
	tsend(0, 2, &a, 8, 7);
	sent(0);
	quiet(2);
	tsend(1, 2, &b, 8, 7);
	sent(1);
	EXPECT(next(2, &e, &err) == 0);
	EXPECT(e.op_context == &in && in == 2);
	/* Node 0's message waits for a receive that takes it. */
	CHECK(fi_trecv(n[2].ep, &in, 8, NULL, FI_ADDR_UNSPEC, 7, 0, &in));
	EXPECT(next(2, &e, &err) == 0);
	EXPECT(in == 1);
}

static void a_short_buffer_truncates_with_an_error(void) {
	char out[64], in[16];
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	memset(out, 'x', sizeof out);
	memset(in, 0, sizeof in);
	CHECK(fi_trecv(n[1].ep, in, sizeof in, NULL, FI_ADDR_UNSPEC, 9, 0, in));
	tsend(0, 1, out, sizeof out, 9);
	sent(0);
	EXPECT(next(1, &e, &err) == -FI_EAVAIL);
	EXPECT(err.err == FI_ETRUNC && err.op_context == in && err.olen == 48 && err.tag == 9);
	EXPECT(memcmp(in, out, sizeof in) == 0);
}

static void a_posted_receive_is_cancelled(void) {
	uint64_t in = 0;
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	CHECK(fi_trecv(n[1].ep, &in, 8, NULL, FI_ADDR_UNSPEC, 44, 0, &in));
	CHECK(fi_cancel(&n[1].ep->fid, &in));
	EXPECT(next(1, &e, &err) == -FI_EAVAIL);
	EXPECT(err.err == FI_ECANCELED && err.op_context == &in);
	ssize_t again = fi_cancel(&n[1].ep->fid, &in);
	if (again != -FI_ENOENT)
		fail("a second fi_cancel", again);
}

static void peek_finds_claims_and_reports_no_message(void) {
	uint64_t out = 77, in = 0;
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	struct fi_context ctx;
	struct iovec iov = { .iov_base = &in, .iov_len = 8 };
	struct fi_msg_tagged m = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC,
				   .tag = 55, .ignore = 0, .context = &ctx };
	CHECK(fi_trecvmsg(n[1].ep, &m, FI_PEEK | FI_COMPLETION));
	EXPECT(next(1, &e, &err) == -FI_EAVAIL);
	EXPECT(err.err == FI_ENOMSG && err.op_context == &ctx);
	tsend(0, 1, &out, 8, 55);
	sent(0);
	/* Peek until the message is there, claiming it. */
	for (;;) {
		CHECK(fi_trecvmsg(n[1].ep, &m, FI_PEEK | FI_CLAIM | FI_COMPLETION));
		int r = next(1, &e, &err);
		if (r == 0)
			break;
		EXPECT(err.err == FI_ENOMSG);
	}
	EXPECT(e.op_context == &ctx && e.len == 8 && e.tag == 55 && in == 0);
	/* Claimed: a plain receive of its tag does not take it. */
	uint64_t other = 0;
	CHECK(fi_trecv(n[1].ep, &other, 8, NULL, FI_ADDR_UNSPEC, 55, 0, &other));
	quiet(1);
	CHECK(fi_trecvmsg(n[1].ep, &m, FI_CLAIM | FI_COMPLETION));
	EXPECT(next(1, &e, &err) == 0);
	EXPECT(e.op_context == &ctx && in == 77);
	CHECK(fi_cancel(&n[1].ep->fid, &other));
	EXPECT(next(1, &e, &err) == -FI_EAVAIL && err.err == FI_ECANCELED);
}

static void remote_data_and_inject_arrive(void) {
	uint64_t out = 5, in[2] = { 0, 0 };
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	CHECK(fi_trecv(n[1].ep, &in[0], 8, NULL, FI_ADDR_UNSPEC, 1, 0, &in[0]));
	CHECK(fi_trecv(n[1].ep, &in[1], 8, NULL, FI_ADDR_UNSPEC, 2, 0, &in[1]));
	CHECK(fi_tsenddata(n[0].ep, &out, 8, NULL, 0xfeedULL, n[1].addr, 1, NULL));
	sent(0);
	/* An inject's buffer is the program's again when the call returns. */
	CHECK(fi_tinject(n[0].ep, &out, 8, n[1].addr, 2));
	out = 6;
	EXPECT(next(1, &e, &err) == 0);
	EXPECT(e.op_context == &in[0] && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 0xfeed);
	EXPECT(next(1, &e, &err) == 0);
	EXPECT(e.op_context == &in[1] && in[1] == 5 && !(e.flags & FI_REMOTE_CQ_DATA));
	/* And an inject leaves no entry at the sender. */
	quiet(0);
}

static void large_messages_arrive_whole_expected_or_not(void) {
	size_t len = 6u << 20;
	unsigned char *out = malloc(len), *in = malloc(len);
	EXPECT(out && in);
	for (size_t i = 0; i < len; i++)
		out[i] = (unsigned char)(i * 7 + i / 4096);
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry err;
	for (int expected = 1; expected >= 0; expected--) {
		memset(in, 0, len);
		if (expected)
			CHECK(fi_trecv(n[1].ep, in, len, NULL, FI_ADDR_UNSPEC, 3, 0, in));
		tsend(0, 1, out, len, 3);
		if (!expected) {
			/* The sender completes as the receiver's reads free the
			 * ring: wait for it, then post. */
			sent(0);
			CHECK(fi_trecv(n[1].ep, in, len, NULL, FI_ADDR_UNSPEC, 3, 0, in));
		}
		EXPECT(next(1, &e, &err) == 0);
		EXPECT(e.len == len && memcmp(in, out, len) == 0);
		if (expected)
			sent(0);
	}
	free(out);
	free(in);
}

static void bad_input_is_refused(void) {
	uint64_t x = 0;
	char junk[16];
	fi_addr_t a = 0;
	memset(junk, 0x5a, sizeof junk);
	/* Not a name: nothing inserted, the address marked unavailable. */
	EXPECT(fi_av_insert(av, junk, 1, &a, 0, NULL) == 0);
	EXPECT(a == FI_ADDR_NOTAVAIL);
	EXPECT(fi_tsend(n[0].ep, &x, 8, NULL, 1000, 1, NULL) == -FI_EINVAL);
	EXPECT(fi_tinject(n[0].ep, junk, info->tx_attr->inject_size + 1, n[1].addr, 1) == -FI_EMSGSIZE);
	EXPECT(fi_trecv(n[1].ep, NULL, 8, NULL, FI_ADDR_UNSPEC, 1, 0, NULL) == -FI_EINVAL);
	quiet(0);
	quiet(1);
}

static void a_closed_peer_makes_sends_fail_not_hang(void) {
	/* Node 2 goes; node 0's sends to it fill its link's ring and then
	 * fail, with no receiver left to free it. */
	CHECK(fi_close(&n[2].ep->fid));
	CHECK(fi_close(&n[2].cq->fid));
	n[2].ep = NULL;
	static char block[16384];
	ssize_t r = 0;
	long tries = 0;
	for (; tries < 10000000L; tries++) {
		r = fi_tinject(n[0].ep, block, 8192, n[2].addr, 1);
		if (r != 0 && r != -FI_EAGAIN)
			break;
		(void)fi_cq_read(n[0].cq, NULL, 0);
	}
	EXPECT(r == -FI_EHOSTUNREACH);
}

#define RUN(t) do { test = #t; t(); printf("fi_rdm: %s ok\n", #t); fflush(stdout); } while (0)

int main(int argc, char **argv) {
	(void)argv;
	if (argc != 1) {
		fprintf(stderr, "usage: fi_rdm (with FI_PROVIDER_PATH naming the provider's folder)\n");
		return 2;
	}
	alarm(120);
	struct fi_info *hints = fi_allocinfo();
	EXPECT(hints);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_TAGGED | FI_MSG | FI_DIRECTED_RECV;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->domain_attr->av_type = FI_AV_TABLE;
	hints->fabric_attr->prov_name = strdup("uvia");
	struct fi_info *list;
	CHECK(fi_getinfo(FI_VERSION(1, 5), NULL, NULL, 0, hints, &list));
	/* The provider's own entry, not ofi_rxm layered over its network
	 * domains (listed first unless FI_UVIA_DOMAIN=shm). */
	for (info = list; info && strcmp(info->fabric_attr->prov_name, "uvia"); info = info->next)
		;
	EXPECT(info);
	EXPECT(info->ep_attr->type == FI_EP_RDM && (info->caps & FI_DIRECTED_RECV));
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	CHECK(fi_av_open(domain, &aa, &av, NULL));
	for (int i = 0; i < NODES; i++) {
		struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_TAGGED };
		char name[64];
		size_t len = sizeof name;
		CHECK(fi_endpoint(domain, info, &n[i].ep, NULL));
		CHECK(fi_cq_open(domain, &ca, &n[i].cq, NULL));
		CHECK(fi_ep_bind(n[i].ep, &av->fid, 0));
		CHECK(fi_ep_bind(n[i].ep, &n[i].cq->fid, FI_TRANSMIT | FI_RECV));
		CHECK(fi_enable(n[i].ep));
		CHECK(fi_getname(&n[i].ep->fid, name, &len));
		EXPECT(fi_av_insert(av, name, 1, &n[i].addr, 0, NULL) == 1);
	}
	RUN(tagged_matching_follows_order_and_ignore_bits);
	RUN(directed_receives_take_only_their_source);
	RUN(a_short_buffer_truncates_with_an_error);
	RUN(a_posted_receive_is_cancelled);
	RUN(peek_finds_claims_and_reports_no_message);
	RUN(remote_data_and_inject_arrive);
	RUN(large_messages_arrive_whole_expected_or_not);
	RUN(bad_input_is_refused);
	RUN(a_closed_peer_makes_sends_fail_not_hang);
	for (int i = 0; i < NODES; i++) {
		if (n[i].ep) {
			CHECK(fi_close(&n[i].ep->fid));
			CHECK(fi_close(&n[i].cq->fid));
		}
	}
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&domain->fid));
	CHECK(fi_close(&fabric->fid));
	fi_freeinfo(list);
	fi_freeinfo(hints);
	printf("fi_rdm: all passed\n");
	return 0;
}
