/*
 * Internal errors: a panic inside the library, provoked by its test hook
 * UVIA_VIPL_TEST_PANIC (docs/VIPL.md), is VIP_ERROR_RESOURCE and one line
 * on stderr; the process carries on and the objects stay usable. The
 * variable is read at the library's first call, so each test sets it first.
 */
#include "common.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int count_lines(const char *text)
{
    int n = 0;
    for (; *text; text++)
        n += *text == '\n';
    return n;
}

/* The line for a panic in `fn`, at the start of a line of `text`. */
static int has_line(const char *text, const char *fn)
{
    char want[128];
    snprintf(want, sizeof want, "vipl: %s: internal error (panic): ", fn);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, want, strlen(want)) == 0)
            return 1;
    return 0;
}

static void t_panic_in_calls(int arg)
{
    (void)arg;
    setenv("UVIA_VIPL_TEST_PANIC", "VipQueryNic,VipPostSend", 1);
    struct capture c;
    capture_start(&c);

    /* VipQueryNic panics once: an error, then the NIC answers and closes. */
    VIP_NIC_HANDLE nic = NULL;
    VIP_NIC_ATTRIBUTES a;
    REQUIRE_RET(VipOpenNic(g_device, &nic), VIP_SUCCESS);
    CHECK_RET(VipQueryNic(nic, &a), VIP_ERROR_RESOURCE);
    CHECK_RET(VipQueryNic(nic, &a), VIP_SUCCESS);
    CHECK_RET(VipCloseNic(nic), VIP_SUCCESS);

    /* VipPostSend panics once: an error, then the VI answers as before
     * (not connected) and is destroyed. */
    struct side s;
    side_open(&s, NULL);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    VIP_DESCRIPTOR *d = send_desc(&s, NULL, 64, 1);
    CHECK_RET(VipPostSend(vi, d, s.mh), VIP_ERROR_RESOURCE);
    CHECK_RET(VipPostSend(vi, d, s.mh), VIP_INVALID_STATE);
    CHECK_STATE(vi, VIP_STATE_IDLE);
    CHECK_RET(vi_destroy(&s, vi), VIP_SUCCESS);
    side_close(&s);

    capture_end(&c);
    CHECKF(count_lines(c.buf) == 2, "two panics wrote %d lines to stderr (expected 2): \"%s\"", count_lines(c.buf),
           c.buf);
    CHECKF(has_line(c.buf, "VipQueryNic"), "no line for the panic in VipQueryNic: \"%s\"", c.buf);
    CHECKF(has_line(c.buf, "VipPostSend"), "no line for the panic in VipPostSend: \"%s\"", c.buf);
}

struct err_seen {
    atomic_int calls;
    VIP_ERROR_DESCRIPTOR last;
};

static void on_error(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    struct err_seen *s = ctx;
    if (e)
        s->last = *e;
    atomic_fetch_add(&s->calls, 1);
}

static void t_panic_in_library_thread(int arg)
{
    (void)arg;
    setenv("UVIA_VIPL_TEST_PANIC", "vipl-notify", 1);
    struct capture c;
    capture_start(&c);
    struct side s;
    side_open(&s, NULL);
    VIP_VI_HANDLE vi = vi_new(&s, default_level(), 0, 0, NULL, NULL);
    /* The error handler runs on the library thread, whose first round
     * panics (on a provider the library drives, it started at open). */
    static struct err_seen seen;
    REQUIRE_RET(VipErrorCallback(s.nic, &seen, on_error), VIP_SUCCESS);
    long long end = now_ms() + 3000;
    while (!has_line(c.buf, "vipl-notify") && now_ms() < end) {
        sleep_ms(5);
        capture_read(&c);
    }
    CHECKF(has_line(c.buf, "vipl-notify"), "no line for the panic in the library thread (3 s): \"%s\"", c.buf);

    /* The thread carries on: a refused post reaches the handler. */
    int n = (int)s.attrs.MaxSegmentsPerDesc + 1;
    VIP_DESCRIPTOR *d = desc_new(&s, n);
    void *buf = arena_take(&s, 64);
    d->CS.SegCount = (VIP_UINT16)n;
    for (int i = 0; i < n; i++)
        set_local(d, i, buf, s.mh, 4);
    CHECK_RET(VipPostRecv(vi, d, s.mh), VIP_DESCRIPTOR_ERROR);
    end = now_ms() + 3000;
    while (atomic_load(&seen.calls) < 1 && now_ms() < end)
        sleep_ms(2);
    CHECKF(atomic_load(&seen.calls) == 1, "error handler called %d times after the library thread's panic (3 s)",
           atomic_load(&seen.calls));
    CHECK_EQ(seen.last.ErrorCode, VIP_ERROR_POST_DESC);
    CHECK_RET(vi_destroy(&s, vi), VIP_SUCCESS);
    side_close(&s);
    capture_end(&c);
    CHECKF(count_lines(c.buf) == 1, "one panic wrote %d lines to stderr (expected 1): \"%s\"", count_lines(c.buf),
           c.buf);
}

const struct test internal_tests[] = {
    {"internal", "panic_in_calls", t_panic_in_calls, 0, 0},
    {"internal", "panic_in_library_thread", t_panic_in_library_thread, 0, 0},
    {NULL, NULL, NULL, 0, 0},
};
