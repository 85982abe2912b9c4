/*
 * vipl_conformance: the VIPL conformance suite's runner.
 *
 *     vipl_conformance [-v] [-l] [-t PATTERN] [--peer-device DEV]
 *                      [--peer-netns PATH] DEVICE
 *
 * Runs every test (or those whose "area/name" contains PATTERN) against
 * DEVICE, each in a process of its own, and ends with one summary line
 * and one indented line per skipped test with its reason. Exit status 0
 * only when no test failed.
 */
#include "harness.h"

#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"

const char *g_device;
const char *g_peer_device;
const char *g_peer_netns;
VIP_NIC_ATTRIBUTES g_nic;
char g_nic_address[VIPL_HOST_ADDRESS_LEN + 1];
const char *g_provider = "?";
const struct test *g_test;
int g_verbose;

#define DEFAULT_LIMIT 30

unsigned test_limit(const struct test *t)
{
    return t && t->limit ? t->limit : DEFAULT_LIMIT;
}

static const struct test *const areas[] = {
    nic_tests, ptag_tests, mem_tests,    vi_tests, data_tests, rdma_tests,
    rel_tests, cq_tests,   notify_tests, cm_tests, ns_tests, internal_tests,
    hostile_tests,
};
#define NAREAS (sizeof areas / sizeof areas[0])

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        h_write(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* ---- Which provider a device name opens (as docs/VIPL.md says) --------------- */

static const char *provider_of_name(const char *name)
{
    if (!name || strcmp(name, "shm") == 0 || strncmp(name, "shm:", 4) == 0)
        return "shm";
    if (strcmp(name, "udp") == 0 || strncmp(name, "udp:", 4) == 0)
        return "udp";
    if (strncmp(name, "xdp:", 4) == 0)
        return "xdp";
    return NULL;
}

static const char *resolve_provider(const char *dev)
{
    static char mapped[256];
    const char *p = provider_of_name(dev);
    if (p)
        return p;
    const char *env = getenv("VIPL_DEVICES");
    if (env) {
        char copy[1024];
        snprintf(copy, sizeof copy, "%s", env);
        char *save = NULL;
        for (char *e = strtok_r(copy, ";", &save); e; e = strtok_r(NULL, ";", &save)) {
            char *eq = strchr(e, '=');
            if (eq && (size_t)(eq - e) == strlen(dev) && strncmp(e, dev, strlen(dev)) == 0) {
                snprintf(mapped, sizeof mapped, "%s", eq + 1);
                return provider_of_name(mapped);
            }
        }
    }
    const char *conf = getenv("VIPL_CONF");
    FILE *f = fopen(conf ? conf : "/etc/vipl.conf", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            char *hash = strchr(line, '#');
            if (hash)
                *hash = 0;
            char d[256], prov[256];
            if (sscanf(line, "%255s %255s", d, prov) == 2 && strcmp(d, dev) == 0) {
                fclose(f);
                snprintf(mapped, sizeof mapped, "%s", prov);
                return provider_of_name(mapped);
            }
        }
        fclose(f);
    }
    if (strcmp(dev, "/dev/via_lo") == 0)
        return "shm";
    if (strncmp(dev, "/dev/via_eth", 12) == 0)
        return "udp";
    return NULL;
}

/* ---- Reading the device's attributes, in a process of its own -------------- */

struct probe {
    VIP_RETURN open, query;
    VIP_NIC_ATTRIBUTES attrs;
    char address[VIPL_HOST_ADDRESS_LEN + 1];
};

static int probe_device(void)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        alarm(20);
        struct probe p;
        memset(&p, 0, sizeof p);
        VIP_NIC_HANDLE nic = NULL;
        p.open = VipOpenNic(g_device, &nic);
        p.query = VIP_NOT_DONE;
        if (p.open == VIP_SUCCESS) {
            p.query = VipQueryNic(nic, &p.attrs);
            if (p.query == VIP_SUCCESS && p.attrs.LocalNicAddress) {
                size_t n = p.attrs.NicAddressLen;
                if (n > VIPL_HOST_ADDRESS_LEN)
                    n = VIPL_HOST_ADDRESS_LEN;
                memcpy(p.address, p.attrs.LocalNicAddress, n);
            }
            VipCloseNic(nic);
        }
        p.attrs.LocalNicAddress = NULL;
        ssize_t k = write(fd[1], &p, sizeof p);
        _exit(k == (ssize_t)sizeof p ? 0 : 1);
    }
    close(fd[1]);
    struct probe p;
    size_t got = 0;
    while (got < sizeof p) {
        ssize_t k = read(fd[0], (char *)&p + got, sizeof p - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    if (got != sizeof p) {
        out("vipl conformance: probing %s: the probe process died (status 0x%x)\n", g_device, st);
        return -1;
    }
    if (p.open != VIP_SUCCESS || p.query != VIP_SUCCESS) {
        out("vipl conformance: cannot use %s: VipOpenNic returned %s, VipQueryNic %s\n",
            g_device, vip_ret_name(p.open), vip_ret_name(p.query));
        return -1;
    }
    g_nic = p.attrs;
    memcpy(g_nic_address, p.address, sizeof g_nic_address);
    g_nic.LocalNicAddress = (const VIP_UINT8 *)g_nic_address;
    return 0;
}

/* ---- Running one test -------------------------------------------------------- */

struct area_count {
    int tests, checks, failed, skipped;
};

static void reap_orphans(void)
{
    /* Processes of a finished test that outlived it were re-parented here
     * (a child subreaper); they were killed with the test's group. */
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

/* Prints what a test wrote to stderr, indented (the last lines if many). */
static void show_stderr(FILE *f)
{
    enum { MAX_LINES = 30 };
    static char lines[MAX_LINES][300];
    int n = 0;
    char line[300];
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n')
            line[len - 1] = 0;
        snprintf(lines[n % MAX_LINES], sizeof lines[0], "%s", line);
        n++;
    }
    if (n == 0)
        return;
    if (n > MAX_LINES)
        out("    (stderr: %d lines, the last %d)\n", n, MAX_LINES);
    for (int i = n > MAX_LINES ? n - MAX_LINES : 0; i < n; i++)
        out("    stderr: %s\n", lines[i % MAX_LINES]);
}

/* Runs t; returns 0 passed, 1 failed, 2 skipped (reason in *r). */
static int run_test(const struct test *t, struct result *r)
{
    int fd[2];
    memset(r, 0, sizeof *r);
    if (pipe(fd) != 0) {
        out("FAIL %s/%s: pipe: %s\n", t->area, t->name, strerror(errno));
        return 1;
    }
    /* The test's stderr (the library's diagnostics among it) is kept
     * aside and shown when the test fails, or with -v. */
    FILE *err = tmpfile();
    long long t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0) {
        out("FAIL %s/%s: fork: %s\n", t->area, t->name, strerror(errno));
        return 1;
    }
    if (pid == 0) {
        close(fd[0]);
        if (err)
            dup2(fileno(err), 2);
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        h_role = ROLE_TEST;
        h_result_fd = fd[1];
        g_test = t;
        alarm(test_limit(t));
        t->fn(t->arg);
        h_finish();
    }
    setpgid(pid, pid);
    close(fd[1]);
    unsigned limit = test_limit(t) + 10;
    size_t got = 0;
    long long deadline = now_ms() + (long long)limit * 1000;
    while (got < sizeof *r) {
        long long left = deadline - now_ms();
        if (left <= 0)
            break;
        struct pollfd pfd = {.fd = fd[0], .events = POLLIN};
        int k = poll(&pfd, 1, (int)left);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        ssize_t n = read(fd[0], (char *)r + got, sizeof *r - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd[0]);
    int st = 0;
    pid_t w = 0;
    long long grace = now_ms() + 3000;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now_ms() < grace)
        sleep_ms(2);
    int hung = 0;
    if (w == 0) {
        hung = 1;
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    /* Anything left of the test's process group goes with it. */
    kill(-pid, SIGKILL);
    reap_orphans();
    long long ms = now_ms() - t0;
    int show = g_verbose || got != sizeof *r || r->fails;
    if (err && show)
        show_stderr(err);
    if (err)
        fclose(err);
    if (got != sizeof *r) {
        r->fails++;
        if (hung)
            out("FAIL %s/%s: no result after %u s; killed\n", t->area, t->name, limit);
        else if (WIFSIGNALED(st))
            out("FAIL %s/%s: the test's process was killed by signal %d%s\n", t->area, t->name,
                WTERMSIG(st),
                WTERMSIG(st) == SIGALRM ? " (its alarm: the test hung)" : "");
        else
            out("FAIL %s/%s: the test's process exited (status %d) without a result\n",
                t->area, t->name, WEXITSTATUS(st));
        return 1;
    }
    if (r->skipped) {
        if (g_verbose)
            out("skip %s/%s: %s\n", t->area, t->name, r->reason);
        return 2;
    }
    if (r->fails) {
        if (g_verbose)
            out("fail %s/%s (%d of %d checks failed, %lld ms)\n", t->area, t->name, r->fails,
                r->checks, ms);
        return 1;
    }
    if (g_verbose)
        out("ok   %s/%s (%d checks, %lld ms)\n", t->area, t->name, r->checks, ms);
    return 0;
}

static void usage(void)
{
    out("usage: vipl_conformance [-v] [-l] [-t PATTERN] [--peer-device DEV] "
        "[--peer-netns PATH] DEVICE\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *pattern = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0)
            g_verbose = 1;
        else if (strcmp(argv[i], "-l") == 0)
            list = 1;
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc)
            pattern = argv[++i];
        else if (strcmp(argv[i], "--peer-device") == 0 && i + 1 < argc)
            g_peer_device = argv[++i];
        else if (strcmp(argv[i], "--peer-netns") == 0 && i + 1 < argc)
            g_peer_netns = argv[++i];
        else if (argv[i][0] == '-')
            usage();
        else if (!g_device)
            g_device = argv[i];
        else
            usage();
    }
    if (list) {
        for (size_t a = 0; a < NAREAS; a++)
            for (const struct test *t = areas[a]; t->name; t++)
                out("%s/%s\n", t->area, t->name);
        return 0;
    }
    if (!g_device)
        usage();
    if (!g_peer_device)
        g_peer_device = g_device;
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    const char *prov = resolve_provider(g_device);
    if (prov)
        g_provider = prov;

    if (probe_device() != 0) {
        out("vipl conformance %s: 0 passed, 1 failed, 0 skipped\n", g_device);
        return 1;
    }
    if (g_verbose) {
        /* The address is binary (docs/VIPL.md): shown in hex. */
        char shown[2 * VIPL_HOST_ADDRESS_LEN + 1] = "";
        for (size_t i = 0; i < g_nic.NicAddressLen && i < VIPL_HOST_ADDRESS_LEN; i++)
            snprintf(shown + 2 * i, 3, "%02x", (unsigned char)g_nic_address[i]);
        out("device %s: provider %s, address %s, reliability levels 0x%x, RDMA read 0x%x\n",
            g_device, g_provider, shown, (unsigned)g_nic.ReliabilityLevelSupport,
            (unsigned)g_nic.RDMAReadSupport);
    }

    int passed = 0, failed = 0, skipped = 0;
    struct area_count counts[NAREAS];
    char(*reasons)[600] = calloc(512, sizeof *reasons);
    memset(counts, 0, sizeof counts);
    for (size_t a = 0; a < NAREAS; a++) {
        for (const struct test *t = areas[a]; t->name; t++) {
            char full[256];
            snprintf(full, sizeof full, "%s/%s", t->area, t->name);
            if (pattern && !strstr(full, pattern))
                continue;
            struct result r;
            int k = run_test(t, &r);
            counts[a].tests++;
            counts[a].checks += r.checks;
            if (k == 0) {
                passed++;
            } else if (k == 1) {
                failed++;
                counts[a].failed++;
            } else {
                if (reasons && skipped < 512)
                    snprintf(reasons[skipped], sizeof reasons[skipped], "%s: %s", full, r.reason);
                skipped++;
                counts[a].skipped++;
            }
        }
    }
    for (size_t a = 0; a < NAREAS; a++)
        if (counts[a].tests)
            out("  area %-12s %3d tests, %4d checks, %d failed, %d skipped\n", areas[a]->area,
                counts[a].tests, counts[a].checks, counts[a].failed, counts[a].skipped);
    out("vipl conformance %s: %d passed, %d failed, %d skipped\n", g_device, passed, failed,
        skipped);
    for (int i = 0; i < skipped && i < 512 && reasons; i++)
        out("    %s\n", reasons[i]);
    free(reasons);
    return failed ? 1 : 0;
}
