/* A minimal PMIx client for the gate tests: PMIx_Init, print the name, PMIx_Finalize. */
#include <pmix.h>
#include <stdio.h>

int main(void)
{
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 2;
    }
    printf("%s:%u\n", me.nspace, me.rank);
    fflush(stdout);
    rc = PMIx_Finalize(NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "PMIx_Finalize: %s\n", PMIx_Error_string(rc));
        return 3;
    }
    return 0;
}
