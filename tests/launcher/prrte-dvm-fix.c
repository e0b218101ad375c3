/* Preloaded into the Open MPI 5.0.11 wheel's `prterun --dvm` (PRRTE 3.0.14) by
 * tests/launcher/session-bench.sh, so that jobs can be submitted to a running DVM at all.
 *
 * PRRTE 3.0's proxy path (prun_common) forwards signals through prte_ess_base_signals without
 * opening the ess framework that constructs that list, and dies of SIGSEGV appending to it
 * (openpmix/prrte#2364; fixed on master by #2308, "init the ess framework to have the signal
 * forwarding list initialized", never on the 3.0 branch). This shim makes the list a valid empty
 * one before the real prte_ess_base_setup_signals runs; nothing else changes.
 *
 * The list is a pmix_list_t of this build's layout: a 0x78-byte object header, then the sentinel
 * item (next at +0x78, prev at +0x80 within it), then the length; 0x110 bytes in all. Any other
 * size means another build, and the shim leaves it alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

int prte_ess_base_setup_signals(char *input)
{
    char *list = dlsym(RTLD_DEFAULT, "prte_ess_base_signals");
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (list && dladdr1(list, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size == 0x110) {
        char *sentinel = list + 0x78;
        void **next = (void **)(sentinel + 0x78), **prev = (void **)(sentinel + 0x80);
        if (*next == NULL) {
            *next = sentinel;
            *prev = sentinel;
        }
    } else {
        fprintf(stderr, "prrte-dvm-fix: prte_ess_base_signals is not the 3.0.14 layout; not touched\n");
    }
    int (*real)(char *) = (int (*)(char *))dlsym(RTLD_NEXT, "prte_ess_base_setup_signals");
    return real(input);
}
