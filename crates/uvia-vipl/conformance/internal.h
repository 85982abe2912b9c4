/*
 * Between the harness and the runner only.
 */
#ifndef CONFORMANCE_INTERNAL_H
#define CONFORMANCE_INTERNAL_H

#include "harness.h"

enum { ROLE_RUNNER, ROLE_TEST, ROLE_PEER };

/* What a test's process (or a peer) reports when it ends. */
struct result {
    int checks;
    int fails;
    int skipped;
    char reason[256];
};

extern struct result h_result;
extern int h_role;
extern int h_result_fd;

/* Seconds a test may take (its alarm). */
unsigned test_limit(const struct test *t);
void h_write(const char *s, size_t n);

#endif
